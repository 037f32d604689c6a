// Point-to-point messages on emulated WAN links (GroupOptions::link): a message posted at time t to rank dst is
// modelled on the directed link (self, dst) as a queue. Its bytes start when the link is free (a second message waits
// for the first), take bytes / bandwidth to leave, and arrive `latency` later; only then is it handed to the real
// send, so the receiver sees it at the modelled arrival time. One lane (thread) per destination keeps the order.
//
// What the sender sees: post() copies the tensor (the caller's buffer is free at once) and returns the moment its
// last byte leaves; Group::send's wait() sleeps until then, as a blocking send on a link of that bandwidth would.
// A real send that fails (the peer died) is kept and thrown by every later post() and wait(), naming the message.
// Not modelled: TCP dynamics, loss, links shared with collectives of other groups (each group's links are its own).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tributary/comm/link_model.h"

namespace tributary::comm {

class LinkLanes {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // The real send: blocks until the bytes are delivered or throws NetworkError at the group's deadline.
  using SendNow = std::function<void(torch::Tensor& tensor, int dst, int tag, const std::string& what)>;

  LinkLanes(LinkModel model, int self, SendNow send_now);
  ~LinkLanes();  // drops undelivered messages (only an aborting run has any) and joins the lanes
  LinkLanes(const LinkLanes&) = delete;
  LinkLanes& operator=(const LinkLanes&) = delete;

  // Queues a copy of `tensor` for dst; returns when its last byte leaves this rank (the link queue's time).
  TimePoint post(const torch::Tensor& tensor, int dst, int tag, const std::string& what);
  void rethrow_failure();  // the first failed delivery, if any
  const LinkModel& model() const { return model_; }

 private:
  struct Message {
    TimePoint arrive;
    torch::Tensor tensor;
    int tag;
    std::string what;
  };
  struct Lane {
    std::deque<Message> queue;
    TimePoint link_free{};
    std::thread thread;
  };
  void deliver(int dst);

  LinkModel model_;
  int self_;
  SendNow send_now_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int, Lane> lanes_;
  std::exception_ptr failure_;
  bool stopping_ = false;
};

}  // namespace tributary::comm
