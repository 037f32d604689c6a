#include "tributary/runtime/ft/faults.h"

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"

namespace tributary {
namespace {

int64_t number_of(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return -1;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || n < 0) fail("{}='{}' is not a step or round number", name, value);
  return n;
}

}  // namespace

FaultPlan fault_plan_from_environment() {
  FaultPlan plan;
  if (const char* ranks = std::getenv("TRIBUTARY_FAIL_RANK")) {
    for (const auto& r : split_list(ranks)) {
      char* end = nullptr;
      const long n = std::strtol(r.c_str(), &end, 10);
      if (r.empty() || *end != '\0' || n < 0) fail("TRIBUTARY_FAIL_RANK='{}' is not a list of ranks", ranks);
      plan.ranks.push_back(int(n));
    }
    plan.at_step = number_of("TRIBUTARY_FAIL_STEP");
    plan.at_exchange = number_of("TRIBUTARY_FAIL_EXCHANGE");
  }
  if (const char* mode = std::getenv("TRIBUTARY_FAIL_MODE")) {
    const std::string m = mode;
    if (m == "kill") plan.mode = FaultPlan::Mode::kKill;
    else if (m == "error") plan.mode = FaultPlan::Mode::kError;
    else if (m == "stop") plan.mode = FaultPlan::Mode::kStop;
    else fail("TRIBUTARY_FAIL_MODE='{}' is not a fault: use kill, error or stop", m);
  }
  const char* bad_rank = std::getenv("TRIBUTARY_BAD_UPDATE_RANK");
  const char* how = std::getenv("TRIBUTARY_BAD_UPDATE");
  if (bad_rank && how) {
    plan.bad_update = how;
    if (plan.bad_update != "nan" && plan.bad_update != "scale100")
      fail("TRIBUTARY_BAD_UPDATE='{}' is not an injected fault: use nan or scale100", plan.bad_update);
    plan.bad_update_rank = std::atoi(bad_rank);
  }
  return plan;
}

bool Faults::mine() const {
  return std::find(plan_.ranks.begin(), plan_.ranks.end(), rank_) != plan_.ranks.end();
}

void Faults::after_step(int64_t step) const {
  if (plan_.at_step != step || !mine()) return;
  if (plan_.mode == FaultPlan::Mode::kError)
    fail("rank {}: injected failure at step {} (TRIBUTARY_FAIL_MODE=error)", rank_, step);
  ::raise(plan_.mode == FaultPlan::Mode::kStop ? SIGSTOP : SIGKILL);
}

void Faults::in_exchange(int64_t round) const {
  if (plan_.at_exchange != round || !mine()) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::raise(SIGKILL);
}

}  // namespace tributary
