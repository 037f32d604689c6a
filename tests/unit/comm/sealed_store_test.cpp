// The run's secret on the store (comm/sealed_store.h): what a stranger without it reads and what it can write.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <string>
#include <thread>

#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store.h"
#include "tributary/core/error.h"

using namespace tributary;
using namespace tributary::comm;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

TEST(SealedStore, AValueOpensOnlyWithTheRunsKeyAndUnderItsOwnName) {
  const RunKey key = run_key_of_secret("sixteen bytes or more", "test");
  const auto sealed = seal(key, "config/0", bytes("[model]\nwidth = 64\n"));
  EXPECT_EQ(text(*open_sealed(key, "config/0", sealed)), "[model]\nwidth = 64\n");
  EXPECT_EQ(text(sealed).find("[model]"), std::string::npos) << "ciphertext, not the configuration";
  EXPECT_FALSE(open_sealed(random_run_key(), "config/0", sealed)) << "another run's key";
  EXPECT_FALSE(open_sealed(key, "config/1", sealed)) << "moved to another key";
  for (size_t i = 0; i < sealed.size(); i += 7) {
    auto tampered = sealed;
    tampered[i] ^= 1;
    EXPECT_FALSE(open_sealed(key, "config/0", tampered)) << "byte " << i;
  }
  EXPECT_FALSE(open_sealed(key, "config/0", bytes("1")));
  EXPECT_NE(seal(key, "k", bytes("v")), seal(key, "k", bytes("v"))) << "a fresh nonce each time";
  EXPECT_THROW(run_key_of_secret("short", "test"), Error);
  EXPECT_EQ(run_key_hex(run_key_of_secret("sixteen bytes or more", "x")).size(), 64u);
}

TEST(SealedStore, AStrangersValuesCountAsAbsentAndItsCountersCannotEvict) {
  auto raw = c10::make_intrusive<c10d::HashStore>();
  raw->setTimeout(std::chrono::milliseconds(300));
  const RunKey key = random_run_key();
  auto store = sealed_store(raw, key);
  store->set("config/0", bytes("[model]"));
  EXPECT_EQ(text(store->get("config/0")), "[model]");
  EXPECT_EQ(text(raw->get("config/0")).find("[model]"), std::string::npos) << "the store holds ciphertext";
  // Counters: sealed too; a stranger's add on ours fails on the server's side (not a number) or, where the key was
  // not there yet, writes a value that counts as absent.
  EXPECT_EQ(store->add("ft/lost", 1), 1);
  EXPECT_EQ(store->add("ft/lost", 2), 3);
  EXPECT_ANY_THROW(raw->add("ft/lost", 1));  // HashStore, like TCPStore's server, cannot add to sealed bytes
  EXPECT_EQ(store->add("ft/lost", 0), 3);
  raw->add("ft/lost/1", 1);  // the eviction of issue 46: a death report for a live worker
  EXPECT_EQ(store->add("ft/lost/1", 0), 0) << "a forged count is no count";
  EXPECT_FALSE(store->check({"ft/exit/0"}));
  raw->set("ft/exit/0", bytes("rank 1 was killed by signal 9"));
  EXPECT_FALSE(store->check({"ft/exit/0"})) << "a forged report is not there";
  EXPECT_THROW(store->get("ft/exit/0"), NetworkError) << "and waiting for a real one ends at the deadline";
  // Set-once: a forged value does not win the decision.
  raw->set("lead", bytes("stranger"));
  EXPECT_EQ(text(store->compareSet("lead", {}, bytes("rank 0"))), "rank 0");
  EXPECT_EQ(text(store->compareSet("lead", {}, bytes("rank 1"))), "rank 0");
  store->append("log", bytes("a"));
  store->append("log", bytes("b"));
  EXPECT_EQ(text(store->get("log")), "ab");
  // A real value that comes after a forged one is read.
  raw->set("late", bytes("forged"));
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store->set("late", bytes("ours"));
  });
  EXPECT_EQ(text(store->get("late")), "ours");
  writer.join();
}

TEST(SealedStore, ConcurrentAddsAllCount) {
  auto raw = c10::make_intrusive<c10d::HashStore>();
  const RunKey key = random_run_key();
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t)
    adders.emplace_back([&] {
      auto store = sealed_store(raw, key);
      for (int i = 0; i < 50; ++i) store->add("n", 1);
    });
  for (auto& t : adders) t.join();
  EXPECT_EQ(sealed_store(raw, key)->add("n", 0), 200);
}

TEST(SealedStore, TheSecretComesFromTheEnvironment) {
  ::unsetenv("TRIBUTARY_SECRET_FILE");
  ::setenv("TRIBUTARY_RUN_SECRET", "zz", 1);
  EXPECT_THROW(run_key_from_environment(), Error);
  const RunKey key = random_run_key();
  ::setenv("TRIBUTARY_RUN_SECRET", run_key_hex(key).c_str(), 1);
  EXPECT_EQ(*run_key_from_environment(), key);
  ::unsetenv("TRIBUTARY_RUN_SECRET");
  EXPECT_FALSE(run_key_from_environment());
}
