// A MAC on every message our own collectives put on the wire (issue 46). Gloo's pairs are unauthenticated: a stranger
// on the path between two sites could change a pseudo-gradient in flight. Where the bytes travel unchanged from one
// rank to another — the quantised ring's hops (int8, fp4, fp16, bf16, terngrad), the top-k and SparseLoCo payloads
// every rank all-gathers — the sender appends an HMAC-SHA256 of the message under the run's key (OpenSSL), bound to
// the message's place (the group, the exchange's message number, sender and receiver) so that no tag verifies another
// message, and the receiver checks it before it decodes a byte. Gloo's own fp32 all-reduce sums in flight, so its
// bytes cannot carry a sender's tag: comm/average_check.h checks its result instead.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store.h"

struct evp_mac_st;  // OpenSSL's EVP_MAC

namespace tributary::comm {

// The key of this invocation's wire MACs: the run's key bound to a nonce that the first rank to ask draws and every
// rank reads from the run's (sealed) store. A message recorded in an earlier invocation of the same run — before a
// --resume, or before launch started the run again (a new attempt: a new nonce) — verifies under no later one.
RunKey invocation_key(Store& store, const RunKey& run_key);
// The same from the run's secret (run_key_from_environment); none without a secret.
std::optional<RunKey> invocation_key(Store& store);

class WireMac {
 public:
  static constexpr int64_t kBytes = 32;  // appended to every message

  explicit WireMac(const RunKey& key);

  // `message` (uint8) with the tag of (`place`, its bytes) appended.
  torch::Tensor seal(const torch::Tensor& message, const std::string& place) const;
  // The message of `sealed` without its tag; throws NetworkError naming `what` when the tag is not the one the run's
  // key gives (`place`, the message).
  torch::Tensor open(const torch::Tensor& sealed, const std::string& place, const std::string& what) const;
  // The tag (hex) of `tensors`' bytes, in order, at `place`: for state that travels over Gloo while its tag travels
  // through the sealed store (a heal's parameters and optimizer state).
  std::string tag_hex(const std::vector<torch::Tensor>& tensors, const std::string& place) const;

 private:
  std::array<uint8_t, kBytes> tag(const std::string& place,
                                  const std::vector<std::pair<const uint8_t*, size_t>>& parts) const;

  RunKey key_;
  std::shared_ptr<evp_mac_st> hmac_;  // fetched once: a fetch looks the algorithm up in OpenSSL's providers
};

}  // namespace tributary::comm
