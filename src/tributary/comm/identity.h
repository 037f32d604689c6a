// A participant's own identity: an Ed25519 key pair (OpenSSL) that says who sent a message, where the run's secret
// (comm/sealed_store.h) only says that someone of the run did. Every participant holding the secret can seal any
// value; only the holder of a private key can sign as that participant.
//
// The key pair lives in a file of its own (PEM, PKCS#8, mode 0600), made on first use: TRIBUTARY_IDENTITY_FILE,
// "identity-<rank>" in TRIBUTARY_IDENTITY_DIR (a single machine's launch keeps its workers' there, so a restarted
// worker is the same participant), or beside the run's secret file ("<secret file>.identity-<rank>"). Its public key
// (64 hex digits) is what the run's admission list (dist.admission: a file of public keys, one per line) names, and
// what a rank publishes at the rendezvous (runtime/rendezvous.h). Signatures are 64 bytes over a message's place (its
// exchange, tag and sender) and its bytes: one participant cannot speak as another, nor a message be moved to another
// exchange.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tributary::comm {

class Identity {
 public:
  static constexpr size_t kSignatureBytes = 64;
  using Signature = std::array<uint8_t, kSignatureBytes>;

  // The key pair in `path`, made there on first use (its folder must exist). An Error naming the file when it is not
  // a private Ed25519 key, or readable by others than its owner.
  static Identity load_or_create(const std::filesystem::path& path);
  static Identity generate();  // a key pair in memory (tests)
  // This process's identity file from its environment (above), for `rank`; none without TRIBUTARY_IDENTITY_FILE,
  // TRIBUTARY_IDENTITY_DIR or TRIBUTARY_SECRET_FILE.
  static std::optional<std::filesystem::path> path_from_environment(int rank);

  const std::string& public_hex() const { return public_hex_; }  // 64 hex digits
  Signature sign(const std::string& place, const uint8_t* data, size_t size) const;
  // Whether `signature` is `public_hex`'s over (place, data); false for a malformed key.
  static bool verify(const std::string& public_hex, const std::string& place, const uint8_t* data, size_t size,
                     const uint8_t* signature);
  // The same for text (a store value): the signature as 128 hex digits.
  std::string sign_text(const std::string& place, const std::string& text) const;
  static bool verify_text(const std::string& public_hex, const std::string& place, const std::string& text,
                          const std::string& signature_hex);

 private:
  struct Key;
  explicit Identity(std::shared_ptr<Key> key);
  std::shared_ptr<Key> key_;
  std::string public_hex_;
};

// The admission list (dist.admission): the public keys in `path`, one per line (64 hex digits; '#' starts a comment).
// An Error naming the file and line for anything else.
std::vector<std::string> read_admission_list(const std::filesystem::path& path);

}  // namespace tributary::comm
