#include "tributary/comm/wire_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>

#include <cstring>

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary::comm {

RunKey invocation_key(Store& store, const RunKey& run_key) {
  const std::string nonce = store.set_once("wire/invocation", run_key_hex(random_run_key()));
  const std::string message = "tributary invocation v1|" + nonce;  // labelled: no other HMAC of this key collides
  RunKey out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), run_key.data(), static_cast<int>(run_key.size()),
            reinterpret_cast<const uint8_t*>(message.data()), message.size(), out.data(), &len) ||
      len != out.size())
    throw Error("OpenSSL could not derive the invocation's key");
  return out;
}

std::optional<RunKey> invocation_key(Store& store) {
  const auto run_key = run_key_from_environment();
  if (!run_key) return std::nullopt;
  return invocation_key(store, *run_key);
}

WireMac::WireMac(const RunKey& key) : key_(key), hmac_(EVP_MAC_fetch(nullptr, "HMAC", nullptr), EVP_MAC_free) {
  if (!hmac_) throw Error("OpenSSL has no HMAC: the run's messages cannot be signed");
}

std::array<uint8_t, WireMac::kBytes> WireMac::tag(const std::string& place,
                                                  const std::vector<std::pair<const uint8_t*, size_t>>& parts) const {
  // HMAC(key, "tributary wire v1" | len(place) | place | message): the length keeps place and message apart.
  const std::string head = fmt::format("tributary wire v1|{}|{}|", place.size(), place);
  std::array<uint8_t, kBytes> out{};
  size_t len = 0;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac_.get());
  bool ok = ctx && EVP_MAC_init(ctx, key_.data(), key_.size(), params) == 1 &&
            EVP_MAC_update(ctx, reinterpret_cast<const uint8_t*>(head.data()), head.size()) == 1;
  for (const auto& [data, n] : parts) ok = ok && EVP_MAC_update(ctx, data, n) == 1;
  ok = ok && EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == kBytes;
  EVP_MAC_CTX_free(ctx);
  if (!ok) throw Error("OpenSSL could not compute a message's MAC");
  return out;
}

torch::Tensor WireMac::seal(const torch::Tensor& message, const std::string& place) const {
  const auto bytes = message.contiguous();
  auto sealed = torch::empty({bytes.numel() + kBytes}, torch::kUInt8);
  sealed.narrow(0, 0, bytes.numel()).copy_(bytes);
  const auto t = tag(place, {{bytes.data_ptr<uint8_t>(), static_cast<size_t>(bytes.numel())}});
  std::memcpy(sealed.data_ptr<uint8_t>() + bytes.numel(), t.data(), kBytes);
  return sealed;
}

torch::Tensor WireMac::open(const torch::Tensor& sealed, const std::string& place, const std::string& what) const {
  const int64_t n = sealed.numel() - kBytes;
  if (n < 0)
    throw NetworkError(fmt::format("{}: {} bytes arrived, less than a MAC: changed in flight", what, sealed.numel()));
  const auto bytes = sealed.contiguous();
  const auto want = tag(place, {{bytes.data_ptr<uint8_t>(), static_cast<size_t>(n)}});
  if (CRYPTO_memcmp(want.data(), bytes.data_ptr<uint8_t>() + n, kBytes) != 0)
    throw NetworkError(fmt::format(
        "{}: the message does not carry the run's MAC: it was changed in flight (someone on the path between the "
        "ranks) or sent by a process without the run's secret. Nothing of it is applied; keep the run's links "
        "private (docs/distributed.md, threat model)",
        what));
  return bytes.narrow(0, 0, n);
}

std::string WireMac::tag_hex(const std::vector<torch::Tensor>& tensors, const std::string& place) const {
  std::vector<torch::Tensor> held;  // on the CPU, contiguous, alive until hashed
  std::vector<std::pair<const uint8_t*, size_t>> parts;
  for (const auto& t : tensors) {
    held.push_back(t.detach().to(torch::kCPU).contiguous());
    parts.emplace_back(static_cast<const uint8_t*>(held.back().data_ptr()), held.back().nbytes());
  }
  std::string out;
  for (uint8_t b : tag(place, parts)) out += fmt::format("{:02x}", b);
  return out;
}

}  // namespace tributary::comm
