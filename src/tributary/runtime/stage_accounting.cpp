#include "tributary/runtime/stage_accounting.h"

#include <sys/resource.h>

namespace tributary {

pipeline::PipelineStats StageAccounting::after_step() {
  const pipeline::PipelineStats s = take_();
  total_.activation_bytes += s.activation_bytes;
  total_.gradient_bytes += s.gradient_bytes;
  total_.compute_s += s.compute_s;
  total_.blocked_s += s.blocked_s;
  total_.activation_cache_bytes = s.activation_cache_bytes;
  sync_bytes_ += double(s.data_parallel_bytes);
  rusage usage{};  // training's peak (model, optimizer, stashed activations)
  getrusage(RUSAGE_SELF, &usage);
  peak_rss_mb_ = double(usage.ru_maxrss) / 1024.0;
  return s;
}

nlohmann::json StageAccounting::gather(PipelineSync& pipelines, double train_seconds) const {
  const auto& s = total_;
  const auto all =
      pipelines.gather_stages({s.compute_s, s.blocked_s, double(s.activation_bytes), double(s.gradient_bytes),
                               train_seconds, sync_bytes_, peak_rss_mb_, double(s.activation_cache_bytes)});
  auto stages = nlohmann::json::array();
  for (const auto& v : all)
    stages.push_back({{"compute_s", v[0]},
                      {"blocked_s", v[1]},
                      {"bubble", v[4] > 0 ? 1.0 - v[0] / v[4] : 0.0},
                      {"activation_bytes", v[2]},
                      {"gradient_bytes", v[3]},
                      {"sync_bytes", v[5]},
                      {"peak_rss_mb", v[6]},
                      {"activation_cache_bytes", v[7]}});
  return stages;
}

}  // namespace tributary
