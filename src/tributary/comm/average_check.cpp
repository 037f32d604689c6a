#include "tributary/comm/average_check.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tributary/core/error.h"

namespace tributary::comm {

namespace {

constexpr int64_t kChunk = 1 << 20;  // elements projected at a time: the float64 copies stay small

// The round's seed: an HMAC of the run's key, so only the run's members can draw the vector.
uint64_t round_seed(const RunKey& key, const std::string& round) {
  const std::string message = "tributary average check v1:" + round;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const uint8_t*>(message.data()),
            message.size(), mac, &len))
    throw Error("OpenSSL could not derive the average check's seed");
  uint64_t seed = 0;
  std::memcpy(&seed, mac, sizeof(seed));
  return seed;
}

std::string encode(double value) { return fmt::format("{:a}", value); }  // hexadecimal: exact

}  // namespace

std::optional<double> AverageCheck::tolerance_of(const std::string& codec, int ranks) {
  // Rounding per element is at most the format's unit roundoff per addition or re-encoding, and there are fewer than
  // `ranks` of them on a ring; 16x that covers the projection's own float64 sum and leaves no false alarm.
  double unit = 0;
  if (codec == "fp32") unit = std::ldexp(1.0, -24);
  if (codec == "fp16") unit = std::ldexp(1.0, -11);
  if (codec == "bf16") unit = std::ldexp(1.0, -8);
  if (unit == 0) return std::nullopt;
  return 16 * unit * std::max(ranks, 1);
}

AverageCheck::AverageCheck(const RunKey& key, double tolerance, std::chrono::milliseconds timeout)
    : key_(key), tolerance_(tolerance), timeout_(timeout) {}

double AverageCheck::project(const std::vector<torch::Tensor>& tensors, const std::string& round) const {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(round_seed(key_, round));
  double sum = 0;
  for (const auto& t : tensors) {
    const auto flat = t.detach().reshape({-1});
    for (int64_t at = 0; at < flat.numel(); at += kChunk) {
      const int64_t n = std::min(kChunk, flat.numel() - at);
      const auto signs = at::randint(0, 2, {n}, generator, torch::kFloat64).mul_(2).sub_(1);
      sum += torch::dot(flat.narrow(0, at, n).to(torch::kCPU, torch::kFloat64), signs).item<double>();
    }
  }
  return sum;
}

std::vector<std::string> AverageCheck::gather(Group& group, const std::string& what, const std::string& round,
                                              const std::function<bool()>& abandon) const {
  std::vector<std::string> keys;
  for (int r = 0; r < group.size(); ++r)
    keys.push_back(fmt::format("{}/avgcheck/{}/{}/{}", group.prefix(), round, what, r));
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  try {
    while (!group.store().check(keys)) {
      if (abandon && abandon()) throw NetworkError(fmt::format("average check of round {}: a member is gone", round));
      if (std::chrono::steady_clock::now() > deadline)
        throw NetworkError(fmt::format("average check of round {}: the others' projections did not arrive within {} s",
                                       round, timeout_.count() / 1000));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::vector<std::string> values;
    for (const auto& key : keys) {
      const auto bytes = group.store().get(key);
      values.emplace_back(bytes.begin(), bytes.end());
    }
    return values;
  } catch (const NetworkError&) {
    throw;
  } catch (const std::exception& e) {  // the store refused or lost the values: a failed round, not a bug
    throw NetworkError(fmt::format("average check of round {}: {}", round, e.what()));
  }
}

void AverageCheck::before(Group& group, const std::vector<torch::Tensor>& sent, const std::string& round,
                          const std::function<bool()>& abandon) {
  double squares = 0;
  for (const auto& t : sent) squares += t.detach().to(torch::kFloat64).pow(2).sum().item<double>();
  const std::string mine = fmt::format("{} {}", encode(project(sent, round)), encode(std::sqrt(squares)));
  group.store().set(fmt::format("{}/avgcheck/{}/sent/{}", group.prefix(), round, group.rank()),
                    std::vector<uint8_t>(mine.begin(), mine.end()));
}

void AverageCheck::after(Group& group, const std::vector<torch::Tensor>& received, double scale,
                         const std::string& round, const std::function<bool()>& abandon) {
  const std::string mine = encode(project(received, round));
  group.store().set(fmt::format("{}/avgcheck/{}/got/{}", group.prefix(), round, group.rank()),
                    std::vector<uint8_t>(mine.begin(), mine.end()));
  const auto sent = gather(group, "sent", round, abandon);  // "projection norm" per rank
  // Every rank has published this round's contribution, so each has finished the last round's check: its keys go.
  if (!last_keys_.empty())
    for (const auto& key : last_keys_) group.store().deleteKey(key);
  last_keys_ = {fmt::format("{}/avgcheck/{}/sent/{}", group.prefix(), round, group.rank()),
                fmt::format("{}/avgcheck/{}/got/{}", group.prefix(), round, group.rank())};
  const auto got = gather(group, "got", round, abandon);
  double expected = 0, norms = 0;
  for (const auto& text : sent) {
    char* end = nullptr;
    expected += std::strtod(text.c_str(), &end);
    norms += std::strtod(end, nullptr);
  }
  expected *= scale;
  const double allowed = tolerance_ * std::abs(scale) * norms + 1e-30;
  std::vector<int> off;
  double worst = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    const double departure = std::abs(std::strtod(got[r].c_str(), nullptr) - expected);
    if (!(departure <= allowed)) {  // NaN too
      off.push_back(static_cast<int>(r));
      worst = std::max(worst, departure);
    }
  }
  if (off.empty()) return;
  throw NetworkError(fmt::format(
      "the average of round {} is not the average of what the ranks sent: rank(s) {} received a result {:.3g} away "
      "from it (rounding allows {:.3g}). The traffic between the ranks was changed in flight: someone on the path "
      "between them. The round is not applied; keep the run's links private (docs/distributed.md, threat model)",
      round, fmt::join(off, ", "), worst, allowed));
}

}  // namespace tributary::comm
