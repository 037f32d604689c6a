#include "tributary/comm/exit_reports.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fmt/format.h>

#include <thread>
#include <vector>

#include "tributary/comm/store.h"

namespace tributary::comm {
namespace {

const std::string kCount = "ft/exits";
std::string entry_key(int64_t n) { return fmt::format("ft/exit/{}", n); }

}  // namespace

void report_exit(Store& store, int rank, const std::string& how) {
  const int64_t n = store.add(kCount, 1);
  store.set(entry_key(n), fmt::format("rank {} {}", rank, how));
}

ExitWatch::ExitWatch(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  try {
    seen_ = store_->add(kCount, 0);
  } catch (const std::exception&) {
    store_.reset();  // no store to read: the failure, if any, says so itself
  }
}

ExitWatch::ExitWatch() = default;
ExitWatch::ExitWatch(const Store& store) : ExitWatch(store.handle()) {}
ExitWatch::ExitWatch(const ExitWatch&) = default;
ExitWatch& ExitWatch::operator=(const ExitWatch&) = default;
ExitWatch::ExitWatch(ExitWatch&&) noexcept = default;
ExitWatch& ExitWatch::operator=(ExitWatch&&) noexcept = default;
ExitWatch::~ExitWatch() = default;

std::string ExitWatch::reported(std::chrono::milliseconds wait) const {
  if (!store_) return "";
  const auto until = std::chrono::steady_clock::now() + wait;
  try {
    int64_t count = store_->add(kCount, 0);
    while (count <= seen_ && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      count = store_->add(kCount, 0);
    }
    std::string out;
    for (int64_t n = seen_ + 1; n <= count; ++n) {
      // The count moves before the entry is written: give the entry the rest of the wait.
      while (!store_->check({entry_key(n)}) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!store_->check({entry_key(n)})) continue;
      const std::vector<uint8_t> bytes = store_->get(entry_key(n));
      out += (out.empty() ? "" : "; ") + std::string(bytes.begin(), bytes.end());
    }
    return out.empty() ? out : out + (count - seen_ > 1 ? ", as their launch reported" : ", as its launch reported");
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace tributary::comm
