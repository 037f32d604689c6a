#include "tributary/optim/robust_aggregate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tributary/core/error.h"

namespace tributary {

namespace {

constexpr int64_t kSample = 1024;  // coordinates a fingerprint keeps

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Coordinates [a, a + len) of every update, sorted coordinate by coordinate: row k holds the k-th smallest. A few
// updates (a round's participants) are sorted by an odd-even transposition network of element-wise min/max — n
// passes over the rows, no index bookkeeping: 8x faster than torch's sort along the participants at 5 — and many by
// that sort.
std::vector<torch::Tensor> sorted_rows(const std::vector<torch::Tensor>& xs, int64_t a, int64_t len) {
  const size_t n = xs.size();
  std::vector<torch::Tensor> rows;
  if (n > 12) {
    std::vector<torch::Tensor> parts;
    for (const auto& x : xs) parts.push_back(x.narrow(0, a, len));
    const auto sorted = std::get<0>(torch::stack(parts).sort(0));
    for (size_t k = 0; k < n; ++k) rows.push_back(sorted[int64_t(k)]);
    return rows;
  }
  for (const auto& x : xs) rows.push_back(x.narrow(0, a, len).clone());
  auto low = torch::empty({len}, torch::kFloat32);
  for (size_t pass = 0; pass < n; ++pass)
    for (size_t k = pass % 2; k + 1 < n; k += 2) {
      torch::minimum_out(low, rows[k], rows[k + 1]);
      torch::maximum_out(rows[k + 1], rows[k], rows[k + 1]);
      std::swap(rows[k], low);
    }
  return rows;
}

// The coordinate-wise rules, a chunk of coordinates at a time.
torch::Tensor coordinate_wise(const std::vector<torch::Tensor>& xs, const AggregateOptions& o) {
  const int64_t n = int64_t(xs.size()), numel = xs.front().numel();
  auto out = torch::empty({numel}, torch::kFloat32);
  int64_t trim = o.rule == "trimmed_mean" ? int64_t(std::floor(o.trim_fraction * double(n))) : 0;
  if (2 * trim >= n) trim = (n - 1) / 2;
  for (int64_t a = 0; a < numel; a += o.chunk) {
    const int64_t len = std::min(o.chunk, numel - a);
    const std::vector<torch::Tensor> sorted = sorted_rows(xs, a, len);
    torch::Tensor value;
    if (o.rule == "median") {
      value = n % 2 ? sorted[size_t(n / 2)] : (sorted[size_t(n / 2 - 1)] + sorted[size_t(n / 2)]) * 0.5;
    } else {
      value = sorted[size_t(trim)].clone();
      for (int64_t k = trim + 1; k < n - trim; ++k) value.add_(sorted[size_t(k)]);
      value.div_(double(n - 2 * trim));
    }
    out.narrow(0, a, len).copy_(value);
  }
  return out;
}

torch::Tensor centered_clip(const std::vector<torch::Tensor>& xs, const AggregateOptions& o) {
  AggregateOptions median = o;
  median.rule = "median";
  auto v = coordinate_wise(xs, median);
  double tau = o.clip_radius;
  if (tau <= 0) {
    std::vector<double> distances;
    for (const auto& x : xs) distances.push_back(RobustAggregate::norm_of(x - v));
    tau = median_of(distances);
  }
  if (tau <= 0) return v;  // at least half the updates equal the median: it is the answer
  for (int l = 0; l < o.clip_iterations; ++l) {
    auto step = torch::zeros_like(v);
    for (const auto& x : xs) {  // in participant order: the same sum on every rank
      auto d = x - v;
      const double dn = RobustAggregate::norm_of(d);
      step.add_(d, dn > tau ? tau / dn : 1.0);
    }
    v.add_(step, 1.0 / double(xs.size()));
  }
  return v;
}

}  // namespace

RobustAggregate::RobustAggregate(AggregateOptions options) : options_(std::move(options)) {
  const auto& r = options_.rule;
  TRIB_CHECK(r == "mean" || r == "trimmed_mean" || r == "median" || r == "centered_clip",
             "(the config checks dist.aggregate)");
}

double RobustAggregate::norm_of(const torch::Tensor& x) {
  const auto c = x.to(torch::kFloat32).contiguous();
  const float* p = c.data_ptr<float>();
  double s = 0;
  for (int64_t i = 0, n = c.numel(); i < n; ++i) s += double(p[i]) * double(p[i]);
  return std::sqrt(s);
}

double RobustAggregate::dot_of(const torch::Tensor& x, const torch::Tensor& y) {
  const auto a = x.to(torch::kFloat32).contiguous(), b = y.to(torch::kFloat32).contiguous();
  const float *p = a.data_ptr<float>(), *q = b.data_ptr<float>();
  double s = 0;
  for (int64_t i = 0, n = a.numel(); i < n; ++i) s += double(p[i]) * double(q[i]);
  return s;
}

torch::Tensor RobustAggregate::apply_rule(const std::vector<torch::Tensor>& accepted, const AggregateOptions& o) {
  TRIB_CHECK(!accepted.empty(), "(a rule needs one update at least)");
  if (accepted.size() == 1) return accepted.front().clone();
  if (o.rule == "mean") {
    auto sum = accepted.front().clone();
    for (size_t i = 1; i < accepted.size(); ++i) sum.add_(accepted[i]);
    return sum.div_(double(accepted.size()));
  }
  if (o.rule == "centered_clip") return centered_clip(accepted, o);
  return coordinate_wise(accepted, o);
}

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
  out.value = accepted.empty() ? torch::zeros({numel}, torch::kFloat32) : apply_rule(accepted, options_);
  score_and_evict(updates, ids, out);
  for (auto& f : now) seen_.push_back(std::move(f));
  ++round_;
  while (!seen_.empty() && seen_.front().round < round_ - options_.memory) seen_.pop_front();
  return out;
}

}  // namespace tributary
