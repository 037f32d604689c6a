#include "tributary/runtime/ft/faults.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tributary/core/error.h"
#include "tributary/core/number_list.h"
#include "tributary/optim/adversary.h"

namespace tributary {
namespace {

// The whole, non-negative numbers of variable `name` ("2", or a list "0,1"); empty when it is not set.
std::vector<int64_t> numbers_of(const char* name) {
  const char* value = std::getenv(name);
  std::vector<int64_t> out;
  if (!value) return out;
  for (double n : parse_number_list(value, name, "whole numbers >= 0, e.g. 0,2")) {
    if (n < 0 || n != double(int64_t(n))) fail("{} = '{}': {} is not a whole number >= 0", name, value, n);
    out.push_back(int64_t(n));
  }
  return out;
}

int64_t number_of(const char* name) {
  const auto n = numbers_of(name);
  if (n.size() > 1) fail("{} = '{}': give one number", name, std::getenv(name));
  return n.empty() ? -1 : n.front();
}

}  // namespace

FaultPlan fault_plan_from_environment() {
  FaultPlan plan;
  for (int64_t rank : numbers_of("TRIBUTARY_FAIL_RANK")) plan.ranks.push_back(int(rank));
  if (!plan.ranks.empty()) {
    plan.at_step = number_of("TRIBUTARY_FAIL_STEP");
    plan.at_exchange = number_of("TRIBUTARY_FAIL_EXCHANGE");
    plan.at_checkpoint = number_of("TRIBUTARY_FAIL_CHECKPOINT");
    plan.in_checkpoint = number_of("TRIBUTARY_FAIL_IN_CHECKPOINT");
  }
  if (const char* mode = std::getenv("TRIBUTARY_FAIL_MODE")) {
    const std::string m = mode;
    if (m == "kill")
      plan.mode = FaultPlan::Mode::kKill;
    else if (m == "error")
      plan.mode = FaultPlan::Mode::kError;
    else if (m == "stop")
      plan.mode = FaultPlan::Mode::kStop;
    else if (m == "term")
      plan.mode = FaultPlan::Mode::kTerm;
    else
      fail("TRIBUTARY_FAIL_MODE='{}' is not a fault: use kill, error, stop or term", m);
  }
  const char* how = std::getenv("TRIBUTARY_BAD_UPDATE");
  if (std::getenv("TRIBUTARY_BAD_UPDATE_RANK") && how) {
    plan.adversary = how;
    if (plan.adversary != "nan" && plan.adversary != "scale100")
      fail("TRIBUTARY_BAD_UPDATE='{}' is not an injected fault: use nan or scale100", plan.adversary);
    plan.adversary_rank = int(number_of("TRIBUTARY_BAD_UPDATE_RANK"));
  }
  return plan;
}

void parse_adversary(const std::string& flag, FaultPlan& plan) {
  const auto colon = flag.find(':');
  const std::string kinds =
      fmt::format("{} (docs/distributed.md, \"Peers that may lie\")", fmt::join(Adversary::kinds(), ", "));
  int rank = -1;
  try {
    size_t used = 0;
    if (colon != std::string::npos) rank = std::stoi(flag.substr(0, colon), &used);
    if (colon == std::string::npos || used != colon || rank < 0) rank = -1;
  } catch (const std::exception&) {
    rank = -1;
  }
  if (rank < 0) fail("--adversary '{}': give RANK:KIND, e.g. 1:sign_flip; KIND is one of {}", flag, kinds);
  const std::string kind = flag.substr(colon + 1);
  if (std::find(Adversary::kinds().begin(), Adversary::kinds().end(), kind) == Adversary::kinds().end())
    fail("--adversary '{}': '{}' is not a kind; use one of {}", flag, kind, kinds);
  plan.adversary_rank = rank;
  plan.adversary = kind;
}

bool Faults::mine() const { return std::find(plan_.ranks.begin(), plan_.ranks.end(), rank_) != plan_.ranks.end(); }

void Faults::after_step(int64_t step) const {
  if (plan_.at_step != step || !mine()) return;
  if (plan_.mode == FaultPlan::Mode::kError)
    fail("rank {}: injected failure at step {} (TRIBUTARY_FAIL_MODE=error)", rank_, step);
  ::raise(plan_.mode == FaultPlan::Mode::kStop ? SIGSTOP : plan_.mode == FaultPlan::Mode::kTerm ? SIGTERM : SIGKILL);
}

void Faults::before_checkpoint(int64_t step) const {
  if (plan_.at_checkpoint == step && mine()) ::raise(SIGKILL);
}

void Faults::inside_checkpoint(int64_t step) const {
  if (plan_.in_checkpoint == step && mine()) ::raise(SIGKILL);
}

void Faults::in_exchange(int64_t round) const {
  if (plan_.at_exchange != round || !mine()) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::raise(SIGKILL);
}

}  // namespace tributary
