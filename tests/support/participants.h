// Participants with identities for tests of signed messages (comm/signed_messages.h): participant i's key pair,
// published as runtime/rendezvous.h would, and signers that speak as anyone (a forger claims another's id).
#pragma once

#include <memory>
#include <vector>

#include "tributary/comm/signed_messages.h"

namespace test_support {

struct Participants {
  explicit Participants(int n) {
    for (int i = 0; i < n; ++i)
      identities.push_back(std::make_shared<tributary::comm::Identity>(tributary::comm::Identity::generate()));
  }
  std::shared_ptr<tributary::comm::MessageSigner> signer(int id) const { return as(id, id); }
  // Participant `who` signing with its own key while it claims to be participant `claimed`.
  std::shared_ptr<tributary::comm::MessageSigner> as(int who, int claimed) const {
    return std::make_shared<tributary::comm::MessageSigner>(
        identities[size_t(who)], claimed, [this](int id) { return identities[size_t(id)]->public_hex(); });
  }
  std::vector<std::shared_ptr<tributary::comm::Identity>> identities;
};

}  // namespace test_support
