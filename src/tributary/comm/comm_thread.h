// One communication thread per process, running jobs in FIFO order: every rank then issues the same collectives in
// the same order even when exchanges overlap training (DDP's buckets during backward, Streaming DiLoCo's fragments).
// It also accounts the time the training thread spent blocked waiting for it (comm_s in the metrics).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "tributary/core/clock.h"

namespace tributary::comm {

class CommThread {
 public:
  CommThread();
  ~CommThread();  // finishes the queued jobs, then joins
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Runs `job` after every job queued before it; the future rethrows the job's exception (NetworkError, Error).
  template <typename T>
  std::future<T> enqueue(std::function<T()> job) {
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(job));
    auto result = task->get_future();
    push([task] { (*task)(); });
    return result;
  }
  // Enqueue and wait; the wait counts as blocked time.
  template <typename T>
  T run(std::function<T()> job) {
    return wait(enqueue<T>(std::move(job)));
  }
  // Waits for a result of this thread, counting the wait as blocked time.
  template <typename T>
  T wait(std::future<T> result) {
    const auto start = Clock::now();
    T value = result.get();
    const double waited = seconds_since(start);
    blocked_s_ += waited;
    blocked_total_s_ += waited;
    return value;
  }
  double blocked_total_s() const { return blocked_total_s_; }  // since the start; never reset
  double take_blocked_s() {
    const double s = blocked_s_;
    blocked_s_ = 0;
    return s;
  }

 private:
  void push(std::function<void()> job);

  double blocked_s_ = 0, blocked_total_s_ = 0;  // touched by the training thread only
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tributary::comm
