// The narrow group interface every algorithm uses (comm/ owns every byte that leaves a process). Implemented on
// LibTorch's c10d: a Store for rendezvous (TCPStore in real runs, HashStore/FileStore in tests) and
// ProcessGroupGloo for CPU collectives. Contracts:
//  - every rank calls the same collectives in the same order;
//  - every call has a deadline (GroupOptions::collective_timeout); a failed or timed-out collective throws
//    NetworkError naming the operation and this rank, never hangs;
//  - reform(prefix) builds a fresh process group under a new store prefix (for fault tolerance: survivors re-form
//    without touching the algorithms).
// Timeouts: c10d's defaults (300 s store, 30 min process group) are sized for data centers. Ours are named here and
// configurable; each layer waits longer than the one below it (store < collective < launcher).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tributary/comm/exit_reports.h"
#include "tributary/comm/link_model.h"
#include "tributary/comm/store.h"

namespace c10d {
class Store;
class Work;
class ProcessGroupGloo;  // held as itself: a ProcessGroup in LibTorch 1.x, a Backend in 2.x
}  // namespace c10d

namespace tributary::comm {

// One collective: an outer round of a 1B model over a 100 Mbit/s link takes minutes.
constexpr std::chrono::seconds kDefaultCollectiveTimeout{1800};

struct GroupOptions {
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  // The address Gloo listens on. Empty: GLOO_SOCKET_IFNAME's interfaces (comma-separated, as torch reads it) when
  // set, else the store's local_address() (the route to the master; loopback for local runs), else 127.0.0.1.
  std::string host;
  // Emulated WAN links between the group's ranks (group rank order): point-to-point messages are delivered at the
  // modelled time (link_lanes.h) and collectives take the modelled time on top of the real one (LinkModel::
  // allreduce_s; exchange.h says what a ring models). send_recv is not padded: Exchange models its rings itself
  // (ExchangeOptions::link).
  std::optional<LinkModel> link;
  // While the group first forms: true once it cannot (a member is known dead), so that the wait for the members'
  // arrival ends then instead of at the collective deadline (as set_abandon does for a reform). Empty: no such wait.
  std::function<bool()> abandon_forming;
};

// A collective in flight (Group::all_reduce_sum_async). wait() returns when it completed, or throws NetworkError
// naming the group once the collective deadline passes.
class PendingCollective {
 public:
  // `then` runs after the work completed (emulated link time; the wait of an emulated send, whose work is null).
  PendingCollective(c10::intrusive_ptr<c10d::Work> work, std::string what, std::chrono::milliseconds timeout,
                    std::function<void()> then = {}, ExitWatch exits = {});
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();
  void wait();

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::function<void()> then_;
  ExitWatch exits_;  // names the peer whose exit broke the work
};

class LinkLanes;

// Size: one public method per collective and point-to-point operation the layers above use, each with its deadline.
class Group {
 public:
  Group(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, GroupOptions options = {},
        std::string prefix = "group0");
  Group(const Store& store, int rank, int world_size, GroupOptions options = {}, std::string prefix = "group0");
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return world_size_; }
  const std::string& prefix() const { return prefix_; }
  c10d::Store& store() { return *store_; }

  void all_reduce_sum(std::vector<torch::Tensor>& tensors);            // in place, CPU tensors
  PendingCollective all_reduce_sum_async(torch::Tensor& tensor);       // in place once wait() returns
  void broadcast(std::vector<torch::Tensor>& tensors, int root);       // in place
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);  // same shape and dtype on every rank
  void barrier();
  // Sends `out` to rank dst and receives `in` from rank src concurrently (one ring step); tags must match.
  void send_recv(torch::Tensor& out, int dst, torch::Tensor& in, int src, int tag);
  // Point-to-point (pipeline stages), asynchronous: the send or receive starts now; wait() holds the group's deadline
  // and names `what` (peer, kind, micro-batch) when it fails. Contiguous CPU tensors; a send's tensor must stay
  // untouched and a receive's unread until wait() returns. Tags: non-negative int32, unique per (peer, message).
  PendingCollective send(torch::Tensor& tensor, int dst, int tag, const std::string& what);
  PendingCollective recv(torch::Tensor& tensor, int src, int tag, const std::string& what);
  void reform(const std::string& prefix);
  // Fault tolerance: while set, a collective (all_reduce_sum, broadcast, all_gather, barrier) waits in slices and is
  // abandoned with a NetworkError as soon as `abandon()` says it cannot succeed (a member died), instead of at the
  // collective deadline. The abandoned process group is leaked at the next reform (its threads may still wait on
  // the dead peer; destroying it would wait with them). The codecs' ring hops (send_recv) are abandoned the same way
  // (their Gloo operations aborted, not timed out: a Gloo send or receive whose wait times out closes its pair);
  // the pipelines' point-to-point waits (send, recv) keep the collective deadline.
  // A reform while set first waits, the same way, until every rank of the new group arrived (a store key each):
  // Gloo's own rendezvous waits for a missing peer until the collective deadline (30 min by default), so a member
  // killed as the group formed held the others that long.
  void set_abandon(std::function<bool()> abandon) { abandon_ = std::move(abandon); }
  // Survivors of a failure re-form with a new membership: this process becomes `rank` of `world_size`; `link` is
  // the emulated links among the new members (GroupOptions::link's subset), when the group emulates them.
  void reform(const std::string& prefix, int rank, int world_size, std::optional<LinkModel> link = std::nullopt);

 private:
  template <typename Start>
  PendingCollective point_to_point(const std::string& what, Start&& start);
  // Waits for `work` until the collective deadline (from `start`), or in slices while set_abandon is set, throwing
  // NetworkError once abandon() says the round cannot succeed.
  void await(c10d::Work& work, const std::string& what, std::chrono::steady_clock::time_point start);
  template <typename MakeWork>
  void run(const char* what, MakeWork&& make_work, double modelled_s = 0);
  void pad(double modelled_s) const;  // sleeps the emulated links' time of a collective (none without a link model)
  void await_ranks(const std::string& prefix);  // set_abandon's wait for the new group's ranks (reform)

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, world_size_;
  GroupOptions options_;
  std::string prefix_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::unique_ptr<LinkLanes> lanes_;  // emulated point-to-point (options_.link); destroyed before pg_
  std::function<bool()> abandon_;
  bool abandoned_ = false;  // a collective of pg_ was abandoned: leak pg_ at the next reform
  std::vector<c10::intrusive_ptr<c10d::Work>> aborted_;  // abandoned ring hops, kept with the leaked group
  ExitWatch exits_;  // the exits reported since this group formed (its failures name the rank)
};

}  // namespace tributary::comm
