#include "tributary/optim/adversary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "tributary/core/error.h"

namespace tributary {

const std::vector<std::string>& Adversary::kinds() {
  static const std::vector<std::string> k = {"nan",   "scaled", "scale100", "sign_flip", "noise",
                                             "zeros", "replay", "copy",     "poison"};
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
  } else if (kind_ == "replay") {
    auto& mine = own_[stream];
    std::vector<torch::Tensor> honest;
    for (const auto& t : update) honest.push_back(t.clone());
    if (mine.size() >= 2)
      for (size_t i = 0; i < update.size(); ++i) update[i].copy_(mine.front()[i]);
    mine.push_back(std::move(honest));
    while (mine.size() > 2) mine.pop_front();
  } else if (kind_ == "copy") {
    const auto it = seen_.find(stream);
    if (it == seen_.end()) return;  // nothing seen yet: the first exchange goes out honest
    int64_t offset = 0;
    for (auto& t : update) {
      t.copy_(it->second.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  // poison: the update is honest; its data was not (the loader shuffles this replica's windows)
}

}  // namespace tributary
