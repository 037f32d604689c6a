// Path-local DiPaCo's reduction (dipaco.path_local; the paper's data flow; an OwnerReducer, optim/owner_reducer.h): a
// worker sends the pseudo-gradient sums of the modules its paths touched this round, and only those, each to the
// module's owner over point-to-point messages; the owner adds them to its own, takes the module's outer step (the
// outer loop's) on its master copy, and nobody else learns the result until it fetches the module
// (runtime/dipaco/module_depot.h). What a worker sends is
// its paths' modules minus the ones it owns, encoded once by `codec` (the owner decodes; nothing is re-encoded on the
// way, unlike a ring). Which worker touched which module is agreed first by an all-gather of one byte per module.
// Sums are added in group-rank order, so the result does not depend on which worker owns a module.
// With `feedback` (SparseLoCo, optim/module_feedback.h) a message is the packed top-k of every chunk of the modules'
// sums plus this worker's error feedback; the owner decodes it (its own sums never travel and are exact).
#pragma once

#include <functional>
#include <string>

#include "tributary/comm/codec.h"
#include "tributary/comm/group.h"
#include "tributary/comm/wire_mac.h"
#include "tributary/core/error.h"
#include "tributary/optim/module_feedback.h"
#include "tributary/optim/owner_reducer.h"

namespace tributary {

// The round's agreement (DiPaCo's worker asks the task queue for a verdict): called once every message of this worker
// has arrived, or its exchange failed. It returns whether to apply: false when a worker died during the exchange.
// Nothing is applied before it answers (a message can arrive while its sender dies before sending the rest), so
// either every survivor applies the round or none does and the round's exchange runs again.
using ExchangeGate = std::function<bool()>;

// The gate said no: nothing was applied and this worker's error feedback is as before the round.
class ExchangeAborted : public NetworkError {
 public:
  explicit ExchangeAborted(const std::string& message) : NetworkError(message) {}
};

struct OwnerUploadBytes {
  double sent = 0, recv = 0;  // pseudo-gradient payloads (encoded) and their weights: what the round's upload costs
  double control = 0;         // the touched-module mask this worker contributed to the all-gather
};

class OwnerUpload : public OwnerReducer {
 public:
  // `codec`: on the wire (stateless codecs only), unless `feedback` (sparse payloads, error feedback committed once the
  // round's messages went out); all outlive the upload.
  // `gate`: none = apply once this worker's messages arrived (a failure throws the NetworkError).
  // `mac` (the run's key; may be null): every message — the touched-module masks, each payload and its weights —
  // carries a tag bound to `place` (the round's: no two rounds share one), checked before anything is decoded.
  OwnerUpload(comm::Group& group, const comm::Codec& codec, ModuleFeedback* feedback = nullptr,
              ExchangeGate gate = nullptr, const comm::WireMac* mac = nullptr, std::string place = {})
      : group_(group),
        codec_(codec),
        feedback_(feedback),
        gate_(std::move(gate)),
        mac_(mac),
        place_(std::move(place)) {}
  // One round's upload and the owners' outer steps. A module no path touched keeps its parameters.
  void reduce(const OwnedRound& round) override;
  const OwnerUploadBytes& bytes() const { return bytes_; }  // of the last reduce()

 private:
  struct Message;  // what one sender ships to one owner (module_owners.cpp)
  std::vector<std::vector<bool>> who_touched(const OwnedRound& r);
  double post_send(const OwnedRound& r, int owner, Message& m, std::vector<comm::PendingCollective>& pending);
  double post_recv(const OwnedRound& r, int worker, Message& m, std::vector<comm::PendingCollective>& pending);
  void step_owned(const OwnedRound& r, size_t module, const std::vector<std::vector<bool>>& touched,
                  std::vector<Message>& recvs);
  torch::Tensor sealed(const torch::Tensor& bytes, const std::string& what, int from, int to) const;
  torch::Tensor opened(const torch::Tensor& bytes, const std::string& what, int from, int to) const;

  comm::Group& group_;
  const comm::Codec& codec_;
  ModuleFeedback* feedback_;
  ExchangeGate gate_;
  const comm::WireMac* mac_;
  std::string place_;
  OwnerUploadBytes bytes_;
};

}  // namespace tributary
