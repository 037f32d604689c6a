#include "tributary/comm/group.h"
#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store.h"
#include "tributary/comm/store_deadline.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <future>
#include <thread>

#include "tributary/comm/link_lanes.h"
#include "tributary/core/error.h"
#include "tributary/core/number_list.h"

namespace tributary::comm {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Says whether the collective failed early (a peer exited or closed its connection: the peer's own log says why;
// which peer, when its launch reported the exit) or ran into its deadline (a peer is stopped, hung or unreachable),
// instead of "failed or timed out after 1800 s".
std::string failure(const std::string& what, SteadyClock::time_point start, std::chrono::milliseconds deadline,
                    const std::exception& e, const ExitWatch& exits) {
  const double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const double limit = deadline.count() / 1000.0;
  const std::string cause = error_text(e);
  if (took >= 0.99 * limit)
    return fmt::format(
        "{} timed out after {:.0f} s (dist.collective_timeout_s): a peer is stopped, hung or unreachable: "
        "{}",
        what, took, cause);
  // Under launch the exit is reported within its 0.1 s poll of the workers; elsewhere nobody reports it.
  const std::string reported = exits.reported(std::getenv("TRIBUTARY_LAUNCHED") ? std::chrono::milliseconds(1000)
                                                                                : std::chrono::milliseconds(0));
  if (!reported.empty())
    return fmt::format("{} failed after {:.1f} s because {}; its own log says why. {}", what, took, reported, cause);
  return fmt::format("{} failed after {:.1f} s (a peer exited or lost its connection; its own log says why): {}", what,
                     took, cause);
}

}  // namespace

Group::Group(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, GroupOptions options, std::string prefix)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), options_(std::move(options)) {
  abandon_ = options_.abandon_forming;
  try {
    reform(prefix);
  } catch (...) {
    abandon_ = {};
    throw;
  }
  abandon_ = {};
}

void Group::pad(double modelled_s) const {
  if (options_.link && modelled_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(modelled_s));
}

namespace {
GroupOptions with_host(GroupOptions options, const Store& store) {
  if (options.host.empty()) options.host = store.local_address();
  return options;
}

// GLOO_SOCKET_IFNAME=eth1,eth2 (torch's variable): one device per interface; else one bound to `host`.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const std::string& host) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  for (const std::string& name : split_list(ifnames ? ifnames : "")) {
    if (name.empty()) continue;
    try {
      devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    } catch (const std::exception& e) {
      throw NetworkError(
          fmt::format("GLOO_SOCKET_IFNAME names the interface '{}', which Gloo cannot use: {}; name an "
                      "interface of this machine (ip -brief address)",
                      name, error_text(e)));
    }
  }
  if (devices.empty())
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host.empty() ? "127.0.0.1" : host));
  return devices;
}
}  // namespace

Group::Group(const Store& store, int rank, int world_size, GroupOptions options, std::string prefix)
    : Group(store.handle(), rank, world_size, with_host(std::move(options), store), std::move(prefix)) {}

Group::~Group() = default;

void Group::reform(const std::string& prefix, int rank, int world_size, std::optional<LinkModel> link) {
  rank_ = rank;
  world_size_ = world_size;
  if (link) options_.link = std::move(link);
  reform(prefix);
}

void Group::reform(const std::string& prefix) {
  await_ranks(prefix);
  prefix_ = prefix;
  lanes_.reset();
  if (abandoned_ && pg_) (void)pg_.release();  // its worker threads may wait on a dead peer until the deadline
  abandoned_ = false;
  exits_ = world_size_ > 1 ? ExitWatch(store_) : ExitWatch();
  if (options_.link) {
    if (options_.link->num_ranks != world_size_)
      throw Error(fmt::format("group '{}': emulated links describe {} ranks but the group has {}", prefix,
                              options_.link->num_ranks, world_size_));
    lanes_ = std::make_unique<LinkLanes>(*options_.link, rank_,
                                         [this](torch::Tensor& t, int dst, int tag, const std::string& what) {
                                           std::vector<torch::Tensor> one = {t};
                                           point_to_point(what, [&] { return pg_->send(one, dst, tag); }).wait();
                                         });
  }
  auto pg_options = c10d::ProcessGroupGloo::Options::create(options_.collective_timeout);
  pg_options->devices = gloo_devices(options_.host);
  pg_options->threads = 2;
  try {
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>(prefix, store_), rank_,
                                                      world_size_, pg_options);
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("rank {}: could not form the process group '{}' of {} ranks: {}", rank_, prefix,
                                   world_size_, error_text(e)));
  }
}

void Group::await_ranks(const std::string& prefix) {
  if (!abandon_ || world_size_ == 1) return;
  const std::string here = prefix + "/arrived/";
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(here + std::to_string(r));
  const auto start = SteadyClock::now();
  try {
    store_->set(keys[static_cast<size_t>(rank_)], std::vector<uint8_t>{1});
    while (!store_->check(keys)) {
      const double waited = std::chrono::duration<double>(SteadyClock::now() - start).count();
      if (abandon_())
        throw NetworkError(
            fmt::format("rank {}: forming group '{}' of {} ranks abandoned after {:.1f} s: a member "
                        "died before it arrived",
                        rank_, prefix, world_size_, waited));
      if (SteadyClock::now() - start > options_.collective_timeout)
        throw NetworkError(
            fmt::format("rank {}: forming group '{}' of {} ranks timed out after {:.0f} s "
                        "(dist.collective_timeout_s): a member never arrived",
                        rank_, prefix, world_size_, waited));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const NetworkError&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("rank {}: forming group '{}': the store failed: {}", rank_, prefix, error_text(e)));
  }
}

void Group::await(c10d::Work& work, const std::string& what, SteadyClock::time_point start) {
  if (!abandon_) {
    work.wait(options_.collective_timeout);
    return;
  }
  // In slices: a timed-out slice of a work that has not completed is not a failure (Work::wait throws on both).
  // A work may complete between the slice's timeout and the look at it: waiting once more then gives its own
  // outcome (returns, or throws its error) — rethrowing the timeout failed sound rounds under load.
  constexpr auto kSlice = std::chrono::milliseconds(100);
  for (;;) {
    try {
      work.wait(kSlice);
      return;
    } catch (const std::exception&) {
      if (work.isCompleted()) {
        work.wait(kSlice);
        return;
      }
    }
    if (SteadyClock::now() - start > options_.collective_timeout) work.wait(std::chrono::milliseconds(1));
    if (abandon_()) {
      abandoned_ = true;
      throw NetworkError(
          fmt::format("rank {}: {} in group '{}' abandoned after {:.1f} s: a member of the group "
                      "died or failed this round",
                      rank_, what, prefix_, std::chrono::duration<double>(SteadyClock::now() - start).count()));
    }
  }
}

template <typename MakeWork>
void Group::run(const char* what, MakeWork&& make_work, double modelled_s) {
  const auto start = SteadyClock::now();
  try {
    auto work = make_work();
    await(*work, what, start);
  } catch (const NetworkError&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(failure(fmt::format("rank {}: {} in group '{}'", rank_, what, prefix_), start,
                               options_.collective_timeout, e, exits_));
  }
  // After the real collective (which ends once the last rank arrived): every rank then spends the modelled time.
  pad(modelled_s);
}

namespace {
double bytes_of(const torch::Tensor& t) { return double(t.numel()) * double(t.element_size()); }
}  // namespace

void Group::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  if (world_size_ == 1) return;
  for (auto& t : tensors) {
    std::vector<torch::Tensor> one = {t};
    run(
        "all_reduce", [&] { return pg_->allreduce(one); },
        options_.link ? options_.link->allreduce_s(bytes_of(t)) : 0.0);
  }
}

PendingCollective::PendingCollective(c10::intrusive_ptr<c10d::Work> work, std::string what,
                                     std::chrono::milliseconds timeout, std::function<void()> then, ExitWatch exits)
    : work_(std::move(work)),
      what_(std::move(what)),
      timeout_(timeout),
      then_(std::move(then)),
      exits_(std::move(exits)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

void PendingCollective::wait() {
  if (work_) {
    const auto start = SteadyClock::now();
    try {
      work_->wait(timeout_);
    } catch (const std::exception& e) {
      throw NetworkError(failure(what_, start, timeout_, e, exits_));
    }
    work_.reset();
  }
  if (then_) std::exchange(then_, {})();
}

PendingCollective Group::all_reduce_sum_async(torch::Tensor& tensor) {
  const std::string what = fmt::format("rank {}: all_reduce in group '{}'", rank_, prefix_);
  if (world_size_ == 1) return PendingCollective({}, what, options_.collective_timeout);
  std::vector<torch::Tensor> one = {tensor};
  try {
    const double modelled = options_.link ? options_.link->allreduce_s(bytes_of(tensor)) : 0.0;
    return PendingCollective(
        pg_->allreduce(one), what, options_.collective_timeout, [this, modelled] { pad(modelled); }, exits_);
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("{} could not start: {}", what, error_text(e)));
  }
}

void Group::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  if (world_size_ == 1 || tensors.empty()) return;
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  // One message per run of tensors of one dtype, not one per tensor: a per-tensor broadcast pays the links' latency
  // once per tensor (seconds for a model's ~100 tensors on 100 ms links), as a real ring would.
  for (size_t begin = 0; begin < tensors.size();) {
    size_t end = begin + 1;
    while (end < tensors.size() && tensors[end].scalar_type() == tensors[begin].scalar_type()) ++end;
    const bool alone = end - begin == 1 && tensors[begin].is_contiguous();  // broadcast in place
    std::vector<torch::Tensor> flat;
    for (size_t i = begin; i < end && !alone; ++i) flat.push_back(tensors[i].reshape(-1));
    std::vector<torch::Tensor> one = {alone ? tensors[begin] : torch::cat(flat)};
    // Modelled as a ring pass of the payload (N-1 hops), the shape of a chain broadcast without pipelining.
    run(
        "broadcast", [&] { return pg_->broadcast(one, opts); },
        options_.link ? options_.link->ring_allgather_s(bytes_of(one[0])) : 0.0);
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      const int64_t n = tensors[i].numel();
      if (!alone) tensors[i].copy_(one[0].narrow(0, offset, n).view_as(tensors[i]));
      offset += n;
    }
    begin = end;
  }
}

std::vector<torch::Tensor> Group::all_gather(const torch::Tensor& tensor) {
  if (world_size_ == 1) return {tensor.clone()};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < world_size_; ++r) out[0].push_back(torch::empty_like(tensor));
  std::vector<torch::Tensor> in = {tensor.contiguous()};
  run(
      "all_gather", [&] { return pg_->allgather(out, in); },
      options_.link ? options_.link->allgather_s(bytes_of(tensor)) : 0.0);
  return out[0];
}

void Group::send_recv(torch::Tensor& out, int dst, torch::Tensor& in, int src, int tag) {
  std::vector<torch::Tensor> o = {out}, i = {in};
  const auto start = SteadyClock::now();
  try {
    auto sent = pg_->send(o, dst, tag);
    auto received = pg_->recv(i, src, tag);
    if (!abandon_) {
      received->wait(options_.collective_timeout);
      sent->wait(options_.collective_timeout);
      return;
    }
    // Not in slices like a collective: a Gloo send or receive whose wait times out closes its pair, so a hop that is
    // merely slow would fail the round. A helper thread waits with the deadline instead, and this one watches
    // abandon(): once it says the round cannot succeed (a member died or froze), both operations are aborted, which
    // wakes the helper without touching the pair, and the hop is abandoned like a collective.
    std::promise<void> hop;
    std::future<void> done = hop.get_future();
    std::thread waiter([&] {
      try {
        received->wait(options_.collective_timeout);
        sent->wait(options_.collective_timeout);
        hop.set_value();
      } catch (...) {
        hop.set_exception(std::current_exception());
      }
    });
    while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (!abandon_()) continue;
      received->abort();
      sent->abort();
      waiter.join();
      abandoned_ = true;
      aborted_.push_back(received);  // Gloo may still hold their buffers: they live as long as the leaked group
      aborted_.push_back(sent);
      throw NetworkError(fmt::format(
          "rank {}: ring step (send to {}, receive from {}) in group '{}' abandoned after {:.1f} s: a member of "
          "the group died or failed this round",
          rank_, dst, src, prefix_, std::chrono::duration<double>(SteadyClock::now() - start).count()));
    }
    waiter.join();
    done.get();
  } catch (const NetworkError&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(
        failure(fmt::format("rank {}: ring step (send to {}, receive from {}) in group '{}'", rank_, dst, src, prefix_),
                start, options_.collective_timeout, e, exits_));
  }
}

template <typename Start>
PendingCollective Group::point_to_point(const std::string& what, Start&& start) {
  try {
    return PendingCollective(start(), what, options_.collective_timeout, {}, exits_);
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("{} could not start: {}", what, error_text(e)));
  }
}

PendingCollective Group::send(torch::Tensor& tensor, int dst, int tag, const std::string& what) {
  const std::string full = fmt::format("rank {}: {} (to rank {} of group '{}')", rank_, what, dst, prefix_);
  if (lanes_) {  // delivered by the lane at the modelled arrival; the sender waits until its bytes have left
    const auto left = lanes_->post(tensor, dst, tag, full);
    return PendingCollective({}, full, options_.collective_timeout, [this, left] {
      std::this_thread::sleep_until(left);
      lanes_->rethrow_failure();
    });
  }
  std::vector<torch::Tensor> one = {tensor};
  return point_to_point(full, [&] { return pg_->send(one, dst, tag); });
}

PendingCollective Group::recv(torch::Tensor& tensor, int src, int tag, const std::string& what) {
  std::vector<torch::Tensor> one = {tensor};
  return point_to_point(fmt::format("rank {}: {} (from rank {} of group '{}')", rank_, what, src, prefix_),
                        [&] { return pg_->recv(one, src, tag); });
}

void Group::barrier() {
  if (world_size_ == 1) return;
  run("barrier", [&] { return pg_->barrier(); }, options_.link ? options_.link->allreduce_s(0) : 0.0);
}

}  // namespace tributary::comm
