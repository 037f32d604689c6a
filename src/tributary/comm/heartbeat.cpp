#include "tributary/comm/heartbeat.h"

namespace tributary::comm {

Heartbeat::Heartbeat(Store store, const std::string& key_prefix, int id, std::chrono::milliseconds interval)
    : store_(std::move(store)), key_(key_prefix + "hb/" + std::to_string(id)), interval_(interval) {
  store_.add(key_, 1);
  thread_ = std::thread([this] {
    const auto slice = std::min(interval_, std::chrono::milliseconds(50));
    while (!stop_) {
      for (auto slept = std::chrono::milliseconds(0); slept < interval_ && !stop_; slept += slice)
        std::this_thread::sleep_for(slice);
      try {
        store_.add(key_, 1);
      } catch (const std::exception&) {
        return;  // the store is gone: the main thread will find out on its next call
      }
    }
  });
}

Heartbeat::~Heartbeat() {
  stop_ = true;
  thread_.join();
}

double Liveness::silence_s(int id) {
  if (id == self_) return 0;
  const auto now = std::chrono::steady_clock::now();
  const int64_t value = store_.add(prefix_ + "hb/" + std::to_string(id), 0);
  auto [it, fresh] = beats_.try_emplace(id);
  if (fresh || value != it->second.value) {
    it->second.value = value;
    it->second.changed = now;
    return 0;
  }
  return std::chrono::duration<double>(now - it->second.changed).count();
}

std::vector<int> Liveness::dead_among(const std::vector<int>& ids) {
  std::vector<int> out;
  for (int id : ids)
    if (dead(id)) out.push_back(id);
  return out;
}

}  // namespace tributary::comm
