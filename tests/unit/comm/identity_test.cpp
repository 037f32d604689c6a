// Participants' identities (comm/identity.h): a signature verifies only with its signer's key, over the same place
// and bytes; the key pair file is made once, private, and read back as the same identity; the admission list names
// its bad lines; and the robust exchange (comm::Exchange::gather, ranks as threads on Gloo) leaves out an update
// signed by another identity than its rank's published one.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <fstream>

#include "support/thread_ranks.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/identity.h"
#include "tributary/core/error.h"

using namespace tributary;
namespace fs = std::filesystem;

TEST(Identity, ASignatureVerifiesOnlyWithItsSignersKeyPlaceAndBytes) {
  const auto a = comm::Identity::generate(), b = comm::Identity::generate();
  const std::string data = "pseudo-gradient bytes";
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  const auto sig = a.sign("group0|3|1>-1", bytes, data.size());
  EXPECT_TRUE(comm::Identity::verify(a.public_hex(), "group0|3|1>-1", bytes, data.size(), sig.data()));
  EXPECT_FALSE(comm::Identity::verify(b.public_hex(), "group0|3|1>-1", bytes, data.size(), sig.data()))
      << "another participant's key";
  EXPECT_FALSE(comm::Identity::verify(a.public_hex(), "group0|4|1>-1", bytes, data.size(), sig.data()))
      << "replayed into another exchange";
  std::string changed = data;
  changed[0] ^= 1;
  EXPECT_FALSE(comm::Identity::verify(a.public_hex(), "group0|3|1>-1", reinterpret_cast<const uint8_t*>(changed.data()),
                                      changed.size(), sig.data()));
  EXPECT_FALSE(comm::Identity::verify("not hex", "group0|3|1>-1", bytes, data.size(), sig.data()));
}

TEST(Identity, TheFileIsMadeOncePrivateAndReadBack) {
  const fs::path dir = fs::temp_directory_path() / ("identity_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "run.secret.identity-0";
  const auto made = comm::Identity::load_or_create(file);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(comm::Identity::load_or_create(file).public_hex(), made.public_hex());
  ::chmod(file.c_str(), 0644);
  EXPECT_THROW(comm::Identity::load_or_create(file), Error) << "a private key others can read";
  std::ofstream(dir / "junk") << "not a key";
  ::chmod((dir / "junk").c_str(), 0600);
  try {
    comm::Identity::load_or_create(dir / "junk");
    ADD_FAILURE() << "junk read as a key";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not an Ed25519 private key"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "admitted") << "# the run's participants\n" << made.public_hex() << "  # alice\n\nxyz\n";
  try {
    comm::read_admission_list(dir / "admitted");
    ADD_FAILURE() << "a bad line passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 4: 'xyz' is not a public key"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "admitted2") << made.public_hex() << "\n";
  EXPECT_EQ(comm::read_admission_list(dir / "admitted2"), std::vector<std::string>{made.public_hex()});
  fs::remove_all(dir);
}

TEST(Identity, AnUpdateSignedByAnotherThanItsRanksIdentityIsLeftOut) {
  // Rank 2's published key is not the one its process signs with (a holder of the run's secret speaking as rank 2):
  // ranks 0 and 1 leave its update out; everyone else's arrives.
  std::vector<std::shared_ptr<const comm::Identity>> ids;
  for (int r = 0; r < 3; ++r) ids.push_back(std::make_shared<const comm::Identity>(comm::Identity::generate()));
  const auto published_for_2 = comm::Identity::generate().public_hex();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::vector<torch::Tensor>> got(3), values(3);
  test_support::run_threads(3, [&](int r) {
    comm::Group group(store, r, 3);
    comm::Exchange exchange(
        group, comm::ExchangeOptions{.codec = "int8", .identity = ids[size_t(r)], .public_key_of = [&](int peer) {
                                       return peer == 2 ? published_for_2 : ids[size_t(peer)]->public_hex();
                                     }});
    got[size_t(r)] = exchange.gather(torch::full({100}, float(r + 1)));
    // A loss scorer's evaluations: fp64, not through the int8 codec, signed the same way.
    values[size_t(r)] = exchange.gather_values(torch::tensor({r + 0.1, 1.0 / 3.0}, torch::kFloat64));
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(values[size_t(r)].size(), 3u);
    for (int from = 0; from < 2; ++from)
      EXPECT_TRUE(
          torch::equal(values[size_t(r)][size_t(from)], torch::tensor({from + 0.1, 1.0 / 3.0}, torch::kFloat64)))
          << "rank " << r << " got rank " << from << "'s values changed: " << values[size_t(r)][size_t(from)];
    EXPECT_FALSE(values[size_t(r)][2].defined()) << "rank " << r << " took rank 2's forged values";
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), 3u);
    EXPECT_TRUE(got[size_t(r)][0].defined() && got[size_t(r)][1].defined());
    EXPECT_FALSE(got[size_t(r)][2].defined()) << "rank " << r << " took rank 2's forged update";
    EXPECT_NEAR(got[size_t(r)][1].mean().item<double>(), 2.0, 0.05);
  }
  EXPECT_TRUE(got[2][2].defined()) << "its own update is its own";
}
