// What dist.aggregate and its keys ask of the receivers of the replicas' updates: the merge rule
// (optim/merge_rule.h) and the checks, scores and eviction around it (optim/robust_aggregate.h).
#pragma once

#include <cstdint>
#include <string>

namespace tributary {

struct AggregateOptions {
  std::string rule = "mean";  // mean | trimmed_mean | median | centered_clip
  double trim_fraction = 0.2;
  double norm_factor = 0;    // dist.reject_norm_factor; 0: no norm test
  double clip_radius = 0;    // centered_clip's tau; 0: the median distance to the coordinate-wise median
  int clip_iterations = 3;   // centered_clip's L
  int memory = 4;            // exchanges of earlier updates a replay or copy is compared with; 0: none
  int64_t chunk = 1 << 20;   // coordinates sorted at once (bounds the memory of the rules)
  int evict_after = 0;       // exchanges in a row refused or below min_score that evict a participant; 0: never
  double min_score = 0;      // the lowest score that counts: a cosine with the aggregate, or a loss rating
  bool loss_scores = false;  // scores are ratings of the loss improvements handed to combine(), not cosines

  // Anything but the plain mean without a norm test needs the updates themselves (DistConfig::judges_updates).
  bool judges_updates() const { return rule != "mean" || norm_factor > 0; }
};

}  // namespace tributary
