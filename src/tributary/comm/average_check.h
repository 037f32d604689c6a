// Whether the average a collective delivered is the average of what the ranks put in (issue 46). Gloo's pairs are
// unauthenticated: a stranger on the path between two sites could change a pseudo-gradient in flight, and every
// replica would apply the changed average. The check: each rank projects what it sends on a random +-1 vector that
// only the run's members can draw (seeded by an HMAC of the run's key and the round), and after the collective projects
// what it received; both projections (and the contributions' norms) go through the store, sealed with the run's key,
// so the stranger can neither read nor forge them. Every rank then checks every rank's result against the scaled sum of
// the contributions, and all reach the same verdict. A projection is linear, so it commutes with the sum: a change of
// the traffic moves a result's projection by about the change's norm (a stranger who cannot draw the vector cannot
// aim it at zero), while the collective's own rounding moves it by the codec's precision times the contributions'
// norms — the tolerance. Covers the linear averages: fp32 (Gloo's all-reduce) and the fp16 / bf16 rings. The other
// codecs' rounding (int8, fp4, terngrad) or selection (top-k, SparseLoCo, PowerSGD) is too coarse or not linear: they
// are not checked (docs/distributed.md, threat model).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tributary/comm/group.h"
#include "tributary/comm/sealed_store.h"

namespace tributary::comm {

class AverageCheck {
 public:
  // The relative precision of `codec`'s average over `ranks` ranks, or none when the codec is not checked.
  static std::optional<double> tolerance_of(const std::string& codec, int ranks);

  // `tolerance`: how far a result's projection may depart from the expected one, relative to the sum of the
  // contributions' norms. `timeout`: how long a rank waits for the others' projections.
  AverageCheck(const RunKey& key, double tolerance, std::chrono::milliseconds timeout);

  // Collective over `group`, around one average of the round `round` (a name every rank gives alike and no earlier
  // check of this group used): before() with what this rank sends, after() with what it received, which must be
  // `scale` x the sum of what was sent. after() throws NetworkError when any rank's result fails the check, on every
  // rank alike. `abandon` (may be empty) ends a wait for a member that died.
  void before(Group& group, const std::vector<torch::Tensor>& sent, const std::string& round,
              const std::function<bool()>& abandon);
  void after(Group& group, const std::vector<torch::Tensor>& received, double scale, const std::string& round,
             const std::function<bool()>& abandon);

  // The projection of `tensors` (flattened in order) on the round's vector: public for tests.
  double project(const std::vector<torch::Tensor>& tensors, const std::string& round) const;

 private:
  std::vector<std::string> gather(Group& group, const std::string& what, const std::string& round,
                                  const std::function<bool()>& abandon) const;

  RunKey key_;
  double tolerance_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> last_keys_;  // this rank's keys of the last round, deleted once no rank reads them
};

}  // namespace tributary::comm
