#include "tributary/comm/identity.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "tributary/core/error.h"

namespace tributary::comm {

namespace fs = std::filesystem;

struct Identity::Key {
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

namespace {

std::string hex(const uint8_t* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

template <size_t N>
std::optional<std::array<uint8_t, N>> unhex(const std::string& s) {
  if (s.size() != 2 * N) return std::nullopt;
  std::array<uint8_t, N> out{};
  for (size_t i = 0; i < N; ++i) {
    int v = 0;
    for (char c : {s[2 * i], s[2 * i + 1]}) {
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + d;
    }
    out[i] = uint8_t(v);
  }
  return out;
}

// "tributary identity v1" | len(place) | place | data: the length keeps place and data apart.
std::vector<uint8_t> message(const std::string& place, const uint8_t* data, size_t size) {
  const std::string head = "tributary identity v1|" + std::to_string(place.size()) + "|" + place + "|";
  std::vector<uint8_t> out(head.begin(), head.end());
  out.insert(out.end(), data, data + size);
  return out;
}

}  // namespace

Identity::Identity(std::shared_ptr<Key> key) : key_(std::move(key)) {
  std::array<uint8_t, 32> raw{};
  size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(key_->pkey, raw.data(), &len) != 1 || len != raw.size())
    throw Error("OpenSSL could not read an identity's public key");
  public_hex_ = hex(raw.data(), raw.size());
}

Identity Identity::generate() {
  auto key = std::make_shared<Key>();
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  const bool ok = ctx && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key->pkey) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok) throw Error("OpenSSL could not make an Ed25519 key pair for this participant's identity");
  return Identity(std::move(key));
}

Identity Identity::load_or_create(const fs::path& path) {
  if (!fs::exists(path)) {
    Identity made = generate();
    const fs::path partial = path.string() + ".partial";
    const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail("cannot create the identity file '{}' (its folder must exist and be writable)", path.string());
    FILE* f = ::fdopen(fd, "w");
    const bool ok = f && PEM_write_PrivateKey(f, made.key_->pkey, nullptr, nullptr, 0, nullptr, nullptr) == 1 &&
                    std::fflush(f) == 0 && ::fsync(fd) == 0;
    if (f) std::fclose(f);
    if (!ok) fail("cannot write the identity file '{}'", partial.string());
    std::error_code ec;
    fs::rename(partial, path, ec);  // whole or not at all; a racing process of the same rank keeps the first
    if (ec) fail("cannot write the identity file '{}': {}", path.string(), ec.message());
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    fail(
        "the identity file '{}' can be read by others (mode {:o}): it holds this participant's private key; "
        "chmod 600 it",
        path.string(), st.st_mode & 0777);
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) fail("cannot read the identity file '{}'", path.string());
  auto key = std::make_shared<Key>();
  key->pkey = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (!key->pkey || EVP_PKEY_get_id(key->pkey) != EVP_PKEY_ED25519)
    fail("the identity file '{}' is not an Ed25519 private key (PEM): move it away and a new identity is made",
         path.string());
  return Identity(std::move(key));
}

std::optional<fs::path> Identity::path_from_environment(int rank) {
  if (const char* file = std::getenv("TRIBUTARY_IDENTITY_FILE"); file && *file) return fs::path(file);
  if (const char* dir = std::getenv("TRIBUTARY_IDENTITY_DIR"); dir && *dir)
    return fs::path(dir) / ("identity-" + std::to_string(rank));
  if (const char* secret = std::getenv("TRIBUTARY_SECRET_FILE"); secret && *secret)
    return fs::path(std::string(secret) + ".identity-" + std::to_string(rank));
  return std::nullopt;
}

Identity::Signature Identity::sign(const std::string& place, const uint8_t* data, size_t size) const {
  const auto m = message(place, data, size);
  Signature out{};
  size_t len = out.size();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx && EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key_->pkey) == 1 &&
                  EVP_DigestSign(ctx, out.data(), &len, m.data(), m.size()) == 1 && len == out.size();
  EVP_MD_CTX_free(ctx);
  if (!ok) throw Error("OpenSSL could not sign a message with this participant's identity");
  return out;
}

bool Identity::verify(const std::string& public_hex, const std::string& place, const uint8_t* data, size_t size,
                      const uint8_t* signature) {
  const auto raw = unhex<32>(public_hex);
  if (!raw) return false;
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw->data(), raw->size());
  if (!pkey) return false;
  const auto m = message(place, data, size);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, pkey) == 1 &&
                  EVP_DigestVerify(ctx, signature, kSignatureBytes, m.data(), m.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(pkey);
  return ok;
}

std::string Identity::sign_text(const std::string& place, const std::string& text) const {
  const Signature signature = sign(place, reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return hex(signature.data(), signature.size());
}

bool Identity::verify_text(const std::string& public_hex, const std::string& place, const std::string& text,
                           const std::string& signature_hex) {
  const auto signature = unhex<kSignatureBytes>(signature_hex);
  return signature &&
         verify(public_hex, place, reinterpret_cast<const uint8_t*>(text.data()), text.size(), signature->data());
}

std::vector<std::string> read_admission_list(const fs::path& path) {
  std::ifstream in(path);
  if (!in)
    fail("dist.admission = '{}': cannot read the admission list (a file of public keys, one per line)", path.string());
  std::vector<std::string> keys;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const auto first = line.find_first_not_of(" \t\r"), last = line.find_last_not_of(" \t\r");
    if (first == std::string::npos) continue;
    line = line.substr(first, last - first + 1);
    if (!unhex<32>(line))
      fail(
          "dist.admission = '{}', line {}: '{}' is not a public key (64 hex digits, as `tributary identity` "
          "prints)",
          path.string(), number, line);
    for (auto& c : line) c = char(std::tolower(static_cast<unsigned char>(c)));
    keys.push_back(line);
  }
  if (keys.empty()) fail("dist.admission = '{}' names no public key: nobody could join", path.string());
  return keys;
}

}  // namespace tributary::comm
