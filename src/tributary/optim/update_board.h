// Where asynchronous DiLoCo's replicas and its merger meet (dist.algorithm = async_diloco; runtime/sync/async_sync.h):
// the run's store (comm::Store, the TCPStore that `tributary launch` hosts, sealed with the run's secret), used as a
// blackboard so that nobody waits for anybody:
//   updates   a replica posts each round's pseudo-gradient (encoded with dist.compression: fp32, fp16, bf16, int8
//             with one scale per tensor, or fp4 as comm::Codec packs it) with what it represents (the global version it
//             started from, its tokens) and goes on training; the merger reads the posts when it likes.
//   versions  the merger publishes each merged global model (fp32) and its outer state (Nesterov momentum) as version
//             v, with its step from version v - 1 encoded like the updates, and commits it by writing commit/{v} once
//             (Store::set_once): of two mergers that both think they lead (one was frozen and came back) one commit
//             wins, the other's blobs are never read. The merger's own version v is v - 1 minus the decoded step, so
//             a replica holding v - 1 fetches the step (int8: a quarter of the fp32 model) and lands on the same bits;
//             one further behind, or joining, fetches the whole version.
// Why not Gloo point to point: a process group is formed by all its members together and must be re-formed by all of
// them after a death, which is a barrier, the one thing asynchronous rounds remove; the store is already every
// process's peer, outlives any of them and carries DiPaCo's module values the same way (runtime/dipaco/
// module_depot.h). With an emulated WAN (dist.wan) a post or a fetch waits the modelled time of the link between the
// replica and the merger. Keys of merged updates and of versions three behind are deleted: the store holds values
// in memory.
//
// Keys (under "async/"): up/{r}/count, up/{r}/{n} (safetensors; metadata: base, tokens, replica), commit/{v} (JSON),
// version (the newest committed, a counter), g/{v}/{m}, m/{v}/{m} and s/{v}/{m} (merger m's parameters, momenta and
// step from v - 1), merger/{t}
// (who holds merging term t), hb/{r} (heartbeats).
//
// With identities (comm/signed_messages.h) a post is signed by its replica (bound to its key: the replica and its
// number), a version's commit and blobs by the merger its commit names, and a term's claim by its claimant: a post
// in another replica's name is refused naming the replica, a blob in the merger's name counts as gone, and a forged
// commit or claim that won its key moves the agreement to the key's next slot.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tributary/comm/link_model.h"
#include "tributary/comm/signed_messages.h"
#include "tributary/comm/store.h"
#include "tributary/model/tensor_io.h"

namespace tributary {

// One posted pseudo-gradient as the merger reads it. `error` (why, in words that follow "refused update N of replica
// R:") is set, and `delta` empty, when its bytes do not parse or its signature fails: the merger refuses it.
struct PostedUpdate {
  int replica = 0;
  int64_t number = 0;        // the replica's count of its posts, from 0
  int64_t base_version = 0;  // the global version it trained from
  int64_t tokens = 0;        // the tokens it represents
  NamedTensors delta;        // fp32, in the model's order
  std::string error;
};

// A committed version: who merged it and what it holds (JSON: merger, term, tokens, consumed, merged, late, done).
struct CommittedVersion {
  int64_t version = 0;
  nlohmann::json meta;
};

// Size: one public method per kind of key the board holds — a replica's posts, the merging terms, the versions'
// commits and blobs — for the writer and the reader of each, plus its byte counts.
class UpdateBoard {
 public:
  inline static const std::string kPrefix = "async/";

  // `codec`: what updates travel as, one that core/update_codecs.h's travels_alone accepts (Error naming
  // dist.compression otherwise).
  // `link`: the emulated links between the ranks, if any; `self`: this process's rank. `signer`: signs what this
  // process writes and checks what it reads (null: unsigned).
  UpdateBoard(comm::Store store, std::string codec, std::optional<comm::LinkModel> link, int self,
              std::shared_ptr<comm::MessageSigner> signer = nullptr);

  // A replica: posts `delta` (names and shapes of the model's parameters) and returns its number. `merger`: the rank
  // whose link the emulated transfer takes (-1: none known).
  int64_t post(const NamedTensors& delta, int64_t base_version, int64_t tokens, int merger);
  int64_t posted(int replica);                   // how many updates `replica` posted so far
  int merger_now();                              // the rank that holds the newest merging term (-1: none yet)
  std::optional<int> term_holder(int64_t term);  // who claimed merging term `term` first (none: nobody yet)
  int claim_term(int64_t term);                  // claims it for this process: who holds it now
  // Tensors come back in the model's order (`names`: its parameters'); a post with others is refused (error).
  PostedUpdate read(int replica, int64_t number, const std::vector<std::string>& names);
  void forget(int replica, int64_t number);

  // The newest committed version (0: none yet).
  int64_t latest();
  std::optional<CommittedVersion> commit_of(int64_t version);
  // What `tensors` become once encoded and decoded (the merger rounds its step to what the replicas will read).
  NamedTensors as_received(const NamedTensors& tensors) const;
  // The merger: publishes version `version`'s parameters, momenta and `step` (from the version before, as_received:
  // empty for the first) and commits them; false when another merger committed that version first (its own blobs
  // are removed).
  bool publish(int64_t version, int merger, const NamedTensors& params, const NamedTensors& momenta,
               const NamedTensors& step, nlohmann::json meta);
  // A version's parameters (fp32, the names published) and, for a merger that takes over, its momenta; empty when
  // the version was deleted meanwhile (ask for the newest). `self`'s emulated link is the one from its merger.
  NamedTensors fetch_params(const CommittedVersion& version, const std::vector<std::string>& names);
  NamedTensors fetch_momenta(const CommittedVersion& version);  // by name ("<param>.outer_momentum")
  NamedTensors fetch_step(const CommittedVersion& version, const std::vector<std::string>& names);  // empty: none
  void forget_version(const CommittedVersion& version);

  comm::Store& store() { return store_; }
  double bytes_posted() const { return bytes_posted_; }
  double bytes_fetched() const { return bytes_fetched_; }

 private:
  void wait_link(int from, int to, size_t bytes, double already_s) const;
  void put(const std::string& key, const std::string& bytes);  // signed
  // The bytes at `key` when `author` signed them (none: absent, or refused).
  std::optional<std::string> take(const std::string& key, int author);

  comm::Store store_;
  std::string codec_;
  std::optional<comm::LinkModel> link_;
  int self_;
  std::shared_ptr<comm::MessageSigner> signer_;
  int64_t term_ = -1;  // merger_now()'s newest term seen
  double bytes_posted_ = 0, bytes_fetched_ = 0;
};

}  // namespace tributary
