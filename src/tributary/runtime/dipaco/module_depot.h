// Where path-local DiPaCo workers (dipaco.path_local) get what they do not hold: the run's store (comm::Store, the
// TCPStore that `tributary launch` hosts), not a shared filesystem and not every worker's memory.
//   modules      after each round every owner publishes its modules' new values, encoded with dipaco.fetch_codec
//                (fp32 exact; fp16/bf16 halve the download); a worker fetches the modules of the path it claims,
//                trains, and drops them. The owner trains from the same decoded values as everyone (its master copy
//                stays exact), so every worker starts a path from identical parameters.
//   path state   a path's inner AdamW state and its early-stopping copy follow the path from worker to worker: put
//                here (dipaco.path_state = store), or a note of who holds it and the bytes on request (holder).
// A module's bytes go owner -> store host -> worker: the store host is a hub whose link carries every download (the
// upload goes point to point, optim/module_owners.h). With an emulated WAN (dist.wan) a fetch waits the modelled
// time of the link from the module's owner. Keys of finished rounds are deleted: the store holds values in memory.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tributary/comm/link_model.h"
#include "tributary/comm/store.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

struct DepotBytes {
  double published = 0, fetched = 0;    // module values, encoded
  double state_put = 0, state_got = 0;  // path state (AdamW, early-stopping copies)
  double fetch_s = 0;                   // waiting for fetches, emulated link time included
};

class ModuleDepot {
 public:
  // `fetch_codec`: fp32 | fp16 | bf16. `timeout`: how long a fetch waits for its owner to publish.
  ModuleDepot(comm::Store store, std::string fetch_codec, std::chrono::milliseconds timeout);

  // The owner: module `id` as every path of round `round` starts from it. Returns the values as fetched (decoded).
  NamedTensors publish(int64_t round, const std::string& id, const NamedTensors& values);
  // Everyone: module `id` of round `round` (its tensors in the order `names`), published by group rank `owner`
  // (`self`: this worker's group rank, for the emulated link), fp32.
  NamedTensors fetch(int64_t round, const std::string& id, const std::vector<std::string>& names, int owner, int self);
  void forget(int64_t round, const std::string& id);  // nobody fetches this round's value any more
  void set_link(std::optional<comm::LinkModel> link) { link_ = std::move(link); }

  // Path state: opaque bytes under `key` (a safetensors blob, a number), or nothing.
  void put(const std::string& key, const std::string& bytes);
  std::optional<std::string> get(const std::string& key);
  void remove(const std::string& key);
  // Path state kept by the worker that made it (state_server.h): `what` from worker `holder`, or nothing.
  std::optional<std::string> ask(int holder, const std::string& what, std::chrono::milliseconds timeout);

  DepotBytes take_bytes();  // since the last call

 private:
  comm::Store store_;
  std::string codec_;
  std::chrono::milliseconds timeout_;
  std::optional<comm::LinkModel> link_;
  DepotBytes bytes_;
};

}  // namespace tributary
