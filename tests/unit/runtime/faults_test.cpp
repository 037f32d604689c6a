// Faults injected on purpose (runtime/ft/faults.h): the plan the environment describes, refused by name when
// malformed, and a rank's fault firing at its step only.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support/error_of.h"
#include "tributary/runtime/ft/faults.h"

using namespace tributary;
using tributary::test_support::error_of;

namespace {

// Sets the variables for one test and removes every fault variable afterwards.
struct Environment {
  explicit Environment(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  ~Environment() {
    for (const char* k : {"TRIBUTARY_FAIL_RANK", "TRIBUTARY_FAIL_STEP", "TRIBUTARY_FAIL_EXCHANGE",
                          "TRIBUTARY_FAIL_MODE", "TRIBUTARY_BAD_UPDATE_RANK", "TRIBUTARY_BAD_UPDATE"})
      ::unsetenv(k);
  }
};

}  // namespace

TEST(Faults, NoVariablesNoFaults) {
  Environment env({});
  const FaultPlan plan = fault_plan_from_environment();
  EXPECT_TRUE(plan.ranks.empty());
  EXPECT_EQ(plan.at_step, -1);
  EXPECT_EQ(Faults(plan, 0).adversary(), "");
}

TEST(Faults, TheEnvironmentDescribesThePlan) {
  Environment env({{"TRIBUTARY_FAIL_RANK", "0,2"},
                   {"TRIBUTARY_FAIL_STEP", "6"},
                   {"TRIBUTARY_FAIL_MODE", "error"},
                   {"TRIBUTARY_BAD_UPDATE_RANK", "1"},
                   {"TRIBUTARY_BAD_UPDATE", "nan"}});
  const FaultPlan plan = fault_plan_from_environment();
  EXPECT_EQ(plan.ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.at_step, 6);
  EXPECT_EQ(plan.at_exchange, -1);
  EXPECT_EQ(Faults(plan, 1).adversary(), "nan");
  EXPECT_EQ(Faults(plan, 0).adversary(), "");
  // mode error: rank 2 refuses at step 6, not before; rank 1 never
  EXPECT_NO_THROW(Faults(plan, 2).after_step(5));
  EXPECT_NE(error_of([&] { Faults(plan, 2).after_step(6); }).find("injected failure at step 6"), std::string::npos);
  EXPECT_NO_THROW(Faults(plan, 1).after_step(6));
}

TEST(Faults, MalformedVariablesAreRefusedByName) {
  {
    Environment env({{"TRIBUTARY_FAIL_RANK", "one"}});
    EXPECT_NE(error_of([] { fault_plan_from_environment(); }).find("TRIBUTARY_FAIL_RANK"), std::string::npos);
  }
  {
    Environment env({{"TRIBUTARY_FAIL_RANK", "1"}, {"TRIBUTARY_FAIL_STEP", "-3"}});
    EXPECT_NE(error_of([] { fault_plan_from_environment(); }).find("TRIBUTARY_FAIL_STEP"), std::string::npos);
  }
  {
    Environment env({{"TRIBUTARY_FAIL_MODE", "explode"}});
    EXPECT_NE(error_of([] { fault_plan_from_environment(); }).find("use kill, error, stop or term"), std::string::npos);
  }
  {
    Environment env({{"TRIBUTARY_BAD_UPDATE_RANK", "0"}, {"TRIBUTARY_BAD_UPDATE", "inf"}});
    EXPECT_NE(error_of([] { fault_plan_from_environment(); }).find("use nan or scale100"), std::string::npos);
  }
}
