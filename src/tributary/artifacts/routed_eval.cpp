#include "tributary/artifacts/routed_eval.h"

#include "tributary/artifacts/modules.h"
#include "tributary/artifacts/routes.h"
#include "tributary/data/dataset.h"
#include "tributary/model/eval.h"
#include "tributary/routing/router.h"
#include "tributary/routing/units.h"

namespace tributary {

RoutedEval evaluate_routed(const fs::path& run_dir, bool early_stopped, int64_t max_units, const torch::Device& device,
                           int64_t reroute_every) {
  DipacoRun run = load_dipaco_run(run_dir);
  Routes routes = load_routes(run.config.dipaco.routes, device);
  Dataset source = Dataset::open(routes.info.data);
  Units val = cut_units(source, "val", run.config.model.context);
  if (max_units > 0 && val.size() > max_units) val.tokens = val.tokens.narrow(0, 0, max_units);
  auto features = routing_features(*routes.feature_model, val.tokens, device);
  auto path_of = routes.router.route(features, 1).select(1, 0);
  const int64_t P = run.grid.num_paths();
  RoutedEval out;
  out.units_per_path.assign(size_t(P), 0);
  out.loss_per_path.assign(size_t(P), 0.0);
  if (reroute_every > 0) {
    // Every path scores every unit once; each token then takes the loss of the path its chunk was routed to.
    const int64_t T = val.tokens.size(1) - 1;
    std::vector<torch::Tensor> losses;  // P x (N, T + 1 - prefix)
    for (int64_t p = 0; p < P; ++p) {
      auto model = assemble_dense(run, p, early_stopped);
      model->to(device);
      losses.push_back(per_token_loss(*model, val.tokens, kRoutingPrefix, device));
    }
    auto all = torch::stack(losses, 0);  // (P, N, T')
    auto choice = torch::empty({val.size(), T + 1 - kRoutingPrefix}, torch::kInt64);
    for (int64_t b = kRoutingPrefix; b <= T; b += reroute_every) {
      const int64_t len = std::min(reroute_every, T + 1 - b);
      auto window = val.tokens.narrow(1, b - kRoutingPrefix, kRoutingPrefix);
      auto path = b == kRoutingPrefix
                      ? path_of
                      : routes.router.route(routing_features(*routes.feature_model, window, device), 1).select(1, 0);
      choice.narrow(1, b - kRoutingPrefix, len).copy_(path.unsqueeze(1).expand({-1, len}));
    }
    auto picked = all.gather(0, choice.unsqueeze(0)).squeeze(0);
    for (int64_t p = 0; p < P; ++p) {
      auto mine = choice == p;
      out.units_per_path[size_t(p)] = mine.sum().item<int64_t>();
      if (out.units_per_path[size_t(p)] > 0)
        out.loss_per_path[size_t(p)] = picked.masked_select(mine).mean().item<double>();
    }
    out.num_tokens = picked.numel();
    out.loss = picked.to(torch::kFloat64).mean().item<double>();
    return out;
  }
  double total = 0;
  for (int64_t p = 0; p < P; ++p) {
    auto idx = (path_of == p).nonzero().select(1, 0);
    out.units_per_path[size_t(p)] = idx.size(0);
    if (idx.size(0) == 0) continue;
    auto model = assemble_dense(run, p, early_stopped);
    model->to(device);
    auto r = evaluate_units(*model, val.tokens.index_select(0, idx), kRoutingPrefix, device);
    out.loss_per_path[size_t(p)] = r.mean();
    total += r.loss_sum;
    out.num_tokens += r.num_tokens;
  }
  out.loss = out.num_tokens > 0 ? total / double(out.num_tokens) : 0.0;
  return out;
}

}  // namespace tributary
