#include "tributary/optim/robust_aggregate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tributary/core/error.h"

namespace tributary {

namespace {

constexpr int64_t kSample = 1024;  // coordinates a fingerprint keeps

}  // namespace

RobustAggregate::RobustAggregate(AggregateOptions options)
    : options_(std::move(options)), rule_(make_merge_rule(options_)) {}

std::string RobustAggregate::seen_before(const torch::Tensor& sample, int64_t numel, double norm) const {
  const double own = std::sqrt(sample.pow(2).sum().item<double>());
  if (own == 0) return "";
  for (const auto& f : seen_) {
    if (f.numel != numel || std::abs(f.norm - norm) > 0.01 * std::max(f.norm, norm)) continue;
    const double theirs = std::sqrt(f.sample.pow(2).sum().item<double>());
    if (theirs == 0) continue;
    const double cosine = (sample * f.sample).sum().item<double>() / (own * theirs);
    if (cosine >= 0.9999)
      return fmt::format("the same values as participant {}'s update of {} round(s) before (a replay or a copy)", f.id,
                         round_ - f.round);  // exchanges, which are rounds unless streamed in fragments
  }
  return "";
}

void RobustAggregate::score_and_evict(const std::vector<torch::Tensor>& updates, const std::vector<int>& ids,
                                      Aggregated& out) {
  const double value_norm = norm_of(out.value);
  size_t next_refusal = 0;
  for (size_t i = 0; i < updates.size(); ++i) {
    const bool refused = next_refusal < out.refused.size() && out.refused[next_refusal].participant == int(i);
    if (refused) ++next_refusal;
    double score = -1, cosine = -1;
    if (!refused) {  // -1 under either score: what the report and the benchmarks count as refused
      const double denominator = out.norms[i] * value_norm;
      cosine = denominator > 0 ? dot_of(updates[i], out.value) / denominator : 0.0;
      const auto rating = ratings_.find(ids[i]);
      score = !options_.loss_scores ? cosine : rating == ratings_.end() ? 1.0 : rating->second;
    }
    out.scores.push_back(score);
    if (options_.evict_after <= 0 || evicted_.count(ids[i])) continue;
    int& strikes = strikes_[ids[i]];
    const bool low = refused || score < options_.min_score || cosine < options_.min_score;
    strikes = low ? strikes + 1 : 0;
    if (strikes < options_.evict_after) continue;
    const char* measure = options_.loss_scores
                              ? "rated by the loss it brings on a probe batch, or agreeing less than that with the "
                                "aggregate (cosine)"
                              : "agreeing less than that (cosine with the aggregate)";
    evicted_[ids[i]] =
        fmt::format("evicted at exchange {}: refused or scoring below {} ({}) in {} exchanges in a row, the last {}",
                    round_ + 1, options_.min_score, measure, strikes,
                    refused          ? out.refused[next_refusal - 1].reason
                    : score < cosine ? fmt::format("rated {:.3f}", score)
                                     : fmt::format("at a cosine of {:.3f}", cosine));
    out.evicted.push_back(ids[i]);
  }
}

// What one exchange says of an update: its improvement against the round's median, clipped to [-1, 2] (one lucky batch
// does not buy many bad rounds, one unlucky one costs an honest update a quarter of its rating at most). An update
// that does not help at all (Gaussian noise: a sliver either way) drifts towards 0 slowly; its cosine with the
// aggregate, which counts towards eviction too (score_and_evict), is what finds it soon.
double RobustAggregate::target_of(double improvement, double median) {
  return std::clamp(improvement / median, -1.0, 2.0);
}

std::vector<std::string> RobustAggregate::rate(const std::vector<double>& improvements, const std::vector<int>& ids) {
  std::vector<double> measured;
  for (size_t i = 0; i < ids.size(); ++i)
    if (std::isfinite(improvements[i]) && !evicted_.count(ids[i])) measured.push_back(improvements[i]);
  std::sort(measured.begin(), measured.end());
  // The upper median: of two updates, an honest one that lowers the loss is the yardstick of one that raises it.
  const double median = measured.empty() ? 0 : measured[measured.size() / 2];
  std::vector<std::string> why(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (evicted_.count(ids[i])) continue;
    const auto rating = ratings_.try_emplace(ids[i], 1.0).first;
    if (median > 0 && std::isfinite(improvements[i]))  // otherwise the round's batch says nothing of anyone
      rating->second = 0.75 * rating->second + 0.25 * target_of(improvements[i], median);
    if (rating->second < options_.min_score)
      why[i] = fmt::format(
          "a loss rating of {:.2f} below dist.min_score = {} (on this exchange's probe batch it lowered the loss by "
          "{:+.4g}, the round's median {:+.4g})",
          rating->second, options_.min_score, improvements[i], median);
  }
  return why;
}

Aggregated RobustAggregate::combine(const std::vector<torch::Tensor>& updates, const std::vector<int>& ids,
                                    const std::vector<double>* improvements) {
  TRIB_CHECK(!updates.empty() && updates.size() == ids.size(), "(one id per update)");
  TRIB_CHECK(!improvements || improvements->size() == ids.size(), "(one improvement per update)");
  int64_t numel = -1;
  for (const auto& u : updates)
    if (u.defined()) numel = u.numel();
  TRIB_CHECK(numel >= 0, "(this participant's own update is always there)");
  Aggregated out;
  std::vector<bool> finite(updates.size());
  for (size_t i = 0; i < updates.size(); ++i) {
    TRIB_CHECK(!updates[i].defined() || updates[i].numel() == numel, "(the exchange gathers updates of one length)");
    out.norms.push_back(updates[i].defined() ? norm_of(updates[i]) : NAN);
    finite[i] = std::isfinite(out.norms.back());
  }
  std::vector<double> finite_norms;
  for (size_t i = 0; i < updates.size(); ++i)
    if (finite[i]) finite_norms.push_back(out.norms[i]);
  // The lower median: with two updates the larger is judged against the smaller (a x100 one among two is caught).
  std::sort(finite_norms.begin(), finite_norms.end());
  const double median = finite_norms.empty() ? 0 : finite_norms[(finite_norms.size() - 1) / 2];
  torch::Tensor& sample_index = sample_index_[numel];
  if (options_.memory > 0 && !sample_index.defined()) {
    auto gen = at::detail::createCPUGenerator(uint64_t(numel) * 7919 + 17);
    sample_index = at::randperm(numel, gen, torch::kInt64).narrow(0, 0, std::min(kSample, numel));
  }
  const std::vector<std::string> low_rated =
      options_.loss_scores && improvements ? rate(*improvements, ids) : std::vector<std::string>(ids.size());
  std::vector<torch::Tensor> accepted;
  std::vector<Fingerprint> now;
  for (size_t i = 0; i < updates.size(); ++i) {
    const double norm = out.norms[i];
    std::string why;
    if (const auto e = evicted_.find(ids[i]); e != evicted_.end()) {
      why = e->second;
    } else if (!updates[i].defined()) {
      why = "not signed by its participant's identity";
    } else if (!finite[i]) {
      why = "non-finite values";
    } else if (options_.norm_factor > 0 && median > 0 && norm > options_.norm_factor * median) {
      why = fmt::format("norm {:.4g} above {} x the round's median {:.4g}", norm, options_.norm_factor, median);
    } else if (options_.norm_factor > 0 && median > 0 && norm < median / options_.norm_factor) {
      why = fmt::format("norm {:.4g} below the round's median {:.4g} / {} (an update that does not train)", norm,
                        median, options_.norm_factor);
    }
    if (finite[i] && options_.memory > 0) {
      Fingerprint f{.id = ids[i],
                    .round = round_,
                    .numel = numel,
                    .sample = updates[i].index_select(0, sample_index).to(torch::kFloat64),
                    .norm = norm};
      if (why.empty()) why = seen_before(f.sample, numel, norm);
      now.push_back(std::move(f));
    }
    if (why.empty()) why = low_rated[i];
    if (why.empty())
      accepted.push_back(updates[i]);
    else
      out.refused.push_back({int(i), why});
  }
  out.accepted = int64_t(accepted.size());
  out.value = accepted.empty() ? torch::zeros({numel}, torch::kFloat32) : rule_->merge(accepted);
  score_and_evict(updates, ids, out);
  for (auto& f : now) seen_.push_back(std::move(f));
  ++round_;
  while (!seen_.empty() && seen_.front().round < round_ - options_.memory) seen_.pop_front();
  return out;
}

}  // namespace tributary
