#include "tributary/optim/adversary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "tributary/core/error.h"

namespace tributary {

namespace {

bool same_shapes(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].sizes() != b[i].sizes()) return false;
  return true;
}

}  // namespace

const std::vector<std::string>& Adversary::kinds() {
  static const std::vector<std::string> k = {"nan",   "scaled", "scale100", "sign_flip", "noise",
                                             "zeros", "replay", "stale",    "copy",      "poison"};
  return k;
}

Adversary::Adversary(std::string kind, uint64_t seed)
    : kind_(std::move(kind)), gen_(at::detail::createCPUGenerator(seed * 2654435761u + 97)) {
  if (std::find(kinds().begin(), kinds().end(), kind_) == kinds().end())
    fail("adversary '{}' is not a kind: use one of {}", kind_, fmt::join(kinds(), ", "));
}

void Adversary::corrupt(std::vector<torch::Tensor>& update, int stream) {
  torch::NoGradGuard no_grad;
  if (kind_ == "nan" || kind_ == "scaled" || kind_ == "scale100") {
    for (auto& t : update) t.mul_(100.0);
    if (kind_ == "nan") update.front().view(-1)[0] = NAN;
  } else if (kind_ == "sign_flip") {
    for (auto& t : update) t.neg_();
  } else if (kind_ == "zeros") {
    for (auto& t : update) t.zero_();
  } else if (kind_ == "noise") {
    for (auto& t : update) {
      const double norm = t.to(torch::kFloat64).norm().item<double>();
      auto g = at::randn(t.sizes(), gen_, t.options());
      const double gn = g.to(torch::kFloat64).norm().item<double>();
      t.copy_(gn > 0 ? g * (norm / gn) : g);
    }
  } else if (kind_ == "replay" || kind_ == "stale") {
    // replay sends again what it sent two exchanges before; stale sends its honest update of two exchanges before,
    // which nobody has seen (a delayed update, not a repeated one).
    auto& mine = own_[stream];
    if (!mine.empty() && !same_shapes(mine.front(), update)) mine.clear();  // another exchange on this stream
    std::vector<torch::Tensor> kept;  // stale: the honest update before it is replaced; replay: what it sends
    if (kind_ == "stale")
      for (const auto& t : update) kept.push_back(t.clone());
    if (mine.size() >= 2)
      for (size_t i = 0; i < update.size(); ++i) update[i].copy_(mine.front()[i]);
    if (kind_ == "replay")
      for (const auto& t : update) kept.push_back(t.clone());
    mine.push_back(std::move(kept));
    while (mine.size() > 2) mine.pop_front();
  } else if (kind_ == "copy") {
    const auto it = seen_.find(stream);
    int64_t numel = 0;
    for (const auto& t : update) numel += t.numel();
    // Nothing seen yet, or only another exchange's (a warm-up's gradients): this one goes out honest.
    if (it == seen_.end() || it->second.numel() != numel) return;
    int64_t offset = 0;
    for (auto& t : update) {
      t.copy_(it->second.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  // poison: the update is honest; its data was not (the loader shuffles this replica's windows)
}

}  // namespace tributary
