#include "tributary/comm/link_lanes.h"

#include "tributary/core/error.h"

namespace tributary::comm {
namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

LinkLanes::LinkLanes(LinkModel model, int self, SendNow send_now)
    : model_(std::move(model)), self_(self), send_now_(std::move(send_now)) {
  TRIB_CHECK(self_ >= 0 && self_ < model_.num_ranks, "rank {} outside a link model of {} ranks", self_,
             model_.num_ranks);
}

LinkLanes::~LinkLanes() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& [dst, lane] : lanes_)
    if (lane.thread.joinable()) lane.thread.join();
}

LinkLanes::TimePoint LinkLanes::post(const torch::Tensor& tensor, int dst, int tag, const std::string& what) {
  rethrow_failure();
  TRIB_CHECK(dst >= 0 && dst < model_.num_ranks && dst != self_, "emulated send to rank {} of {}", dst,
             model_.num_ranks);
  const double bytes = double(tensor.numel()) * double(tensor.element_size());
  auto copy = tensor.detach().to(torch::kCPU).clone().contiguous();
  TimePoint left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Lane& lane = lanes_[dst];
    const auto now = std::chrono::steady_clock::now();
    left = std::max(now, lane.link_free) + seconds(bytes / model_.bandwidth(self_, dst));
    lane.link_free = left;
    lane.queue.push_back({left + seconds(model_.latency(self_, dst)), std::move(copy), tag, what});
    if (!lane.thread.joinable()) lane.thread = std::thread([this, dst] { deliver(dst); });
  }
  changed_.notify_all();
  return left;
}

void LinkLanes::rethrow_failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
}

void LinkLanes::deliver(int dst) {
  std::unique_lock<std::mutex> lock(mutex_);
  Lane& lane = lanes_[dst];
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !lane.queue.empty(); });
    if (stopping_) return;
    const TimePoint arrive = lane.queue.front().arrive;
    // Messages on one lane arrive in order (link_free only grows), so the front is always the next one due.
    if (changed_.wait_until(lock, arrive, [&] { return stopping_; })) return;
    Message m = std::move(lane.queue.front());
    lane.queue.pop_front();
    if (failure_) continue;  // the link is dead: later messages are dropped, post() reports the first failure
    lock.unlock();
    std::exception_ptr error;
    try {
      send_now_(m.tensor, dst, m.tag, m.what);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !failure_) failure_ = error;
  }
}

}  // namespace tributary::comm
