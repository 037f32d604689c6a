#include "tributary/comm/sealed_store.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

namespace tributary::comm {
namespace {

constexpr char kMagic[4] = {'T', 'S', 'v', '1'};
constexpr size_t kNonce = 12, kTag = 16, kOverhead = sizeof(kMagic) + kNonce + kTag;
constexpr const char* kLabel = "tributary run secret v1\n";

using Cipher = std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)>;

Cipher new_cipher() {
  Cipher c(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
  if (!c) throw Error("OpenSSL could not make a cipher context (out of memory?)");
  return c;
}

int as_int(size_t n) {
  if (n > size_t(1) << 30) throw Error(fmt::format("a store value of {} bytes is more than the store carries", n));
  return static_cast<int>(n);
}

// A value that does not open (a stranger's, or another run's) counts as absent: a stranger can do with it what
// deleting the key does, which the store lets anyone do anyway, and no more.
class SealedStore : public c10d::Store {
 public:
  SealedStore(c10::intrusive_ptr<c10d::Store> inner, const RunKey& key) : inner_(std::move(inner)), key_(key) {}

  c10::intrusive_ptr<c10d::Store> clone() override {
    auto inner = inner_->clone();  // a new connection: it proves the key as the first one did
    prove_run_key(*inner, key_);
    return c10::make_intrusive<SealedStore>(inner, key_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(key, seal(key_, key, value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    while (true) {  // the sealed bytes differ from write to write (a fresh nonce): compare what they hold
      const Current now = current(key);
      const bool absent = !now.value;
      if (absent ? !expected.empty() : *now.value != expected) return absent ? expected : *now.value;
      const auto sealed = seal(key_, key, desired);
      if (inner_->compareSet(key, now.raw, sealed) == sealed) return desired;
    }
  }
  std::vector<uint8_t> get(const std::string& key) override {
    // A stranger's value may stand where ours is coming: wait for ours until the store's deadline.
    const auto deadline = std::chrono::steady_clock::now() + inner_->getTimeout();
    while (true) {
      const auto raw = inner_->get(key);
      if (auto opened = open_sealed(key_, key, raw)) return *opened;
      if (std::chrono::steady_clock::now() > deadline)
        throw NetworkError(fmt::format(
            "the value of store key '{}' is not sealed with this run's secret: a stranger wrote it, or a machine of "
            "the run has another secret (every machine must use the same --secret-file, or none). Refused",
            key));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    while (true) {  // compare-and-set: another adder between the read and the swap makes this one read again
      const Current now = current(key);
      const int64_t value = now.value ? parse(key, std::string(now.value->begin(), now.value->end())) : 0;
      const std::string next = std::to_string(value + delta);
      const auto sealed = seal(key_, key, std::vector<uint8_t>(next.begin(), next.end()));
      if (inner_->compareSet(key, now.raw, sealed) == sealed) return value + delta;
    }
  }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys)
      if (!current(key).value) return false;
    return true;
  }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  const std::chrono::milliseconds& getTimeout() const noexcept override { return inner_->getTimeout(); }
  void setTimeout(const std::chrono::milliseconds& timeout) override { inner_->setTimeout(timeout); }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    while (true) {
      const Current now = current(key);
      std::vector<uint8_t> text = now.value.value_or(std::vector<uint8_t>{});
      text.insert(text.end(), value.begin(), value.end());
      const auto sealed = seal(key_, key, text);
      if (inner_->compareSet(key, now.raw, sealed) == sealed) return;
    }
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& key : keys) out.push_back(get(key));
    return out;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    for (size_t i = 0; i < keys.size() && i < values.size(); ++i) set(keys[i], values[i]);
  }
  bool hasExtendedApi() const override { return true; }

 private:
  struct Current {
    std::vector<uint8_t> raw;                   // the bytes there (empty: no key), for compare-and-set
    std::optional<std::vector<uint8_t>> value;  // what they hold when sealed with the run's key
  };
  // One atomic read that neither blocks nor creates the key: a compare-and-set whose expectation (one 0xff byte, never
  // a sealed value) c10d's stores answer with the value there, or with the expectation itself when there is none.
  Current current(const std::string& key) {
    static const std::vector<uint8_t> kNone = {0xff};
    Current now;
    auto raw = inner_->compareSet(key, kNone, kNone);
    if (raw == kNone) return now;
    now.raw = std::move(raw);
    now.value = open_sealed(key_, key, now.raw);
    return now;
  }
  static int64_t parse(const std::string& key, const std::string& text) {
    try {
      size_t used = 0;
      const int64_t value = std::stoll(text, &used);
      if (used == text.size()) return value;
    } catch (const std::exception&) {
    }
    throw NetworkError(fmt::format("store key '{}' holds '{}', not a counter", key, text));
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  RunKey key_;
};

RunKey key_from_hex(const std::string& hex, const std::string& origin) {
  RunKey key{};
  if (hex.size() != 2 * key.size())
    fail("{} must be {} hex digits (what launch gives its workers); it has {} characters", origin, 2 * key.size(),
         hex.size());
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned value = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &value) != 1 || !std::isxdigit(hex[2 * i]) ||
        !std::isxdigit(hex[2 * i + 1]))
      fail("{} must be {} hex digits; '{}' at {} is not", origin, 2 * key.size(), hex.substr(2 * i, 2), 2 * i);
    key[i] = static_cast<uint8_t>(value);
  }
  return key;
}

}  // namespace

RunKey run_key_of_secret(const std::string& secret, const std::string& origin) {
  if (secret.size() < 16)
    fail("{} holds {} bytes: a run secret needs at least 16 (e.g. head -c 32 /dev/urandom > FILE)", origin,
         secret.size());
  const std::string material = kLabel + secret;
  RunKey key{};
  unsigned int len = 0;
  if (EVP_Digest(material.data(), material.size(), key.data(), &len, EVP_sha256(), nullptr) != 1 || len != key.size())
    throw Error("OpenSSL could not hash the run secret");
  return key;
}

RunKey run_key_of_file(const std::string& path, const std::string& origin) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > 4096)
    fail("{} is not a regular file of at most 4 KiB; give the run's secret file", origin);
  return run_key_of_secret(read_file(path), origin);
}

RunKey random_run_key() {
  RunKey key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1)
    throw Error("OpenSSL could not draw random bytes for the run secret");
  return key;
}

std::string run_key_hex(const RunKey& key) {
  std::string out;
  for (uint8_t b : key) out += fmt::format("{:02x}", b);
  return out;
}

std::optional<RunKey> run_key_from_environment() {
  if (const char* hex = std::getenv("TRIBUTARY_RUN_SECRET"); hex && *hex)
    return key_from_hex(hex, "TRIBUTARY_RUN_SECRET");
  if (const char* file = std::getenv("TRIBUTARY_SECRET_FILE"); file && *file)
    return run_key_of_file(file, fmt::format("TRIBUTARY_SECRET_FILE = '{}'", file));
  return std::nullopt;
}

std::vector<uint8_t> seal(const RunKey& run_key, const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> out(kOverhead + value.size());
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  uint8_t* nonce = out.data() + sizeof(kMagic);
  if (RAND_bytes(nonce, static_cast<int>(kNonce)) != 1) throw Error("OpenSSL could not draw a nonce");
  Cipher c = new_cipher();
  int len = 0;
  uint8_t* body = nonce + kNonce;
  if (EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_IVLEN, int(kNonce), nullptr) != 1 ||
      EVP_EncryptInit_ex(c.get(), nullptr, nullptr, run_key.data(), nonce) != 1 ||
      EVP_EncryptUpdate(c.get(), nullptr, &len, reinterpret_cast<const uint8_t*>(key.data()), as_int(key.size())) !=
          1 ||
      (!value.empty() && EVP_EncryptUpdate(c.get(), body, &len, value.data(), as_int(value.size())) != 1) ||
      EVP_EncryptFinal_ex(c.get(), body + value.size(), &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, int(kTag), body + value.size()) != 1)
    throw Error(fmt::format("OpenSSL could not seal the value of store key '{}'", key));
  return out;
}

std::optional<std::vector<uint8_t>> open_sealed(const RunKey& run_key, const std::string& key,
                                                const std::vector<uint8_t>& sealed) {
  if (sealed.size() < kOverhead || std::memcmp(sealed.data(), kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  const uint8_t* nonce = sealed.data() + sizeof(kMagic);
  const uint8_t* body = nonce + kNonce;
  const size_t n = sealed.size() - kOverhead;
  std::vector<uint8_t> out(n);
  std::array<uint8_t, kTag> tag{};
  std::memcpy(tag.data(), body + n, kTag);
  Cipher c = new_cipher();
  int len = 0;
  if (EVP_DecryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_IVLEN, int(kNonce), nullptr) != 1 ||
      EVP_DecryptInit_ex(c.get(), nullptr, nullptr, run_key.data(), nonce) != 1 ||
      EVP_DecryptUpdate(c.get(), nullptr, &len, reinterpret_cast<const uint8_t*>(key.data()), as_int(key.size())) !=
          1 ||
      (n > 0 && EVP_DecryptUpdate(c.get(), out.data(), &len, body, as_int(n)) != 1) ||
      EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_TAG, int(kTag), tag.data()) != 1)
    return std::nullopt;
  std::array<uint8_t, 16> rest{};
  if (EVP_DecryptFinal_ex(c.get(), rest.data(), &len) != 1) return std::nullopt;  // the tag does not match
  return out;
}

c10::intrusive_ptr<c10d::Store> sealed_store(c10::intrusive_ptr<c10d::Store> inner, const RunKey& key) {
  return c10::make_intrusive<SealedStore>(std::move(inner), key);
}

std::string store_nonce() {
  std::string nonce(32, '\0');
  if (RAND_bytes(reinterpret_cast<uint8_t*>(nonce.data()), static_cast<int>(nonce.size())) != 1)
    throw Error("OpenSSL could not draw the store's nonce");
  return nonce;
}

std::string store_proof(const RunKey& key, const std::string& nonce) {
  const std::string message = "tributary store proof v1:" + nonce;  // labelled: no other HMAC of this key collides
  std::string mac(EVP_MAX_MD_SIZE, '\0');
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const uint8_t*>(message.data()),
            message.size(), reinterpret_cast<uint8_t*>(mac.data()), &len))
    throw Error("OpenSSL could not compute the store proof");
  mac.resize(len);
  return mac;
}

bool store_proof_holds(const RunKey& key, const std::string& nonce, const std::string& proof) {
  const std::string want = store_proof(key, nonce);
  return proof.size() == want.size() && CRYPTO_memcmp(proof.data(), want.data(), want.size()) == 0;
}

bool prove_run_key(c10d::Store& raw, const RunKey& key) {
  if (!raw.check({kStoreChallengeKey})) return false;  // not our server: it would make a get of the nonce wait
  const auto nonce = raw.get(kStoreChallengeKey);
  const std::string proof = store_proof(key, std::string(nonce.begin(), nonce.end()));
  raw.set(kStoreProofKey, std::vector<uint8_t>(proof.begin(), proof.end()));
  try {
    raw.check({kStoreChallengeKey});  // a round trip: a server that refused the proof has closed the connection
  } catch (const std::exception&) {
    throw SecretRefused(
        "the run's store refused this process's run secret: it was started with another one (TRIBUTARY_RUN_SECRET "
        "or TRIBUTARY_SECRET_FILE must give the run's own secret, the same file on every machine)");
  }
  return true;
}

}  // namespace tributary::comm
