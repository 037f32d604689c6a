#include "tributary/route/discriminative.h"

#include "tributary/artifacts/inference.h"
#include "tributary/artifacts/modules.h"
#include "tributary/artifacts/routes.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/route/routes_build.h"
#include "tributary/routing/router.h"
#include "tributary/routing/units.h"

namespace tributary {

nlohmann::json build_discriminative_routes(const DiscriminativeOptions& o) {
  const torch::Device device = parse_device(o.device);
  DipacoRun run = load_dipaco_run(o.run);
  Routes routes = load_routes(run.config.dipaco.routes, device);
  Dataset source = Dataset::open(routes.info.data);
  const int64_t T = run.config.model.context, P = run.grid.num_paths();
  Units train = cut_units(source, "train", T), val = cut_units(source, "val", T);
  // Router split: a deterministic sample of training units, kept out of the new training shards.
  std::vector<int64_t> router_idx, train_idx;
  for (int64_t i = 0; i < train.size(); ++i)
    (static_cast<int64_t>((uint64_t(i) * 2654435761ULL + o.seed) % 1000) < o.router_permille ? router_idx : train_idx)
        .push_back(i);
  if (static_cast<int64_t>(router_idx.size()) < 4 * P)
    fail("the router split has {} units for {} paths; raise --router-permille", router_idx.size(), P);
  auto router_units = train.tokens.index_select(0, torch::tensor(router_idx));
  std::vector<torch::Tensor> losses;
  for (int64_t p = 0; p < P; ++p) {
    auto model = assemble_dense(run, p);
    model->to(device);
    losses.push_back(per_token_loss(*model, router_units, kRoutingPrefix, device).mean(1));
  }
  auto labels = torch::stack(losses, 1).argmin(1);  // (N_r)
  log::info("discriminative routing: {} router units scored by {} paths", router_idx.size(), P);

  Router router = routes.router;
  router.method = "discriminative";
  router.centroids.clear();
  const auto router_features = routing_features(*routes.feature_model, router_units, device);
  auto z = router.standardise(router_features);
  torch::manual_seed(o.seed);
  auto W = torch::zeros({P, z.size(1)}, torch::requires_grad());
  auto b = torch::zeros({P}, torch::requires_grad());
  torch::optim::Adam adam({W, b}, torch::optim::AdamOptions(0.05).weight_decay(1e-3));
  for (int64_t e = 0; e < o.epochs; ++e) {
    adam.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(z.mm(W.t()) + b, labels);
    loss.backward();
    adam.step();
  }
  router.weight = W.detach().clone();
  router.bias = b.detach().clone();
  // Balance: nudge the bias until every path's share of the training units is near 1/P.
  Units kept{train.tokens.index_select(0, torch::tensor(train_idx)), {}};
  for (int64_t i : train_idx) kept.domain.push_back(train.domain[size_t(i)]);
  auto f_train = routing_features(*routes.feature_model, kept.tokens, device);
  auto z_train = router.standardise(f_train);
  for (int it = 0; it < 200; ++it) {
    auto pick = (z_train.mm(router.weight.t()) + router.bias).argmax(1);
    auto share = torch::bincount(pick, {}, P).to(torch::kFloat32) / double(pick.size(0));
    router.bias += 0.5 * torch::log((1.0 / double(P)) / share.clamp_min(1e-3));
    if ((share - 1.0 / double(P)).abs().max().item<double>() < 0.25 / double(P)) break;
  }
  const double accuracy =
      (router.scores(router_features).argmax(1) == labels).to(torch::kFloat32).mean().item<double>();
  auto routes_train = router.route(f_train, o.overlap);
  auto routes_val = router.route(routing_features(*routes.feature_model, val.tokens, device), 1);
  nlohmann::json info = routes.info.raw;
  info["discriminative_from"] = fs::absolute(o.run).string();
  info["router_units"] = router_idx.size();
  info["router_accuracy"] = accuracy;
  info["overlap"] = o.overlap;
  auto report = write_routes(o.out, router, routes.dir / "features", source, kept, routes_train, val, routes_val, info,
                             o.overwrite);
  log::info("discriminative router: accuracy {:.3f} on its split; purity {:.3f} (train) / {:.3f} (val); wrote '{}'",
            accuracy, report["purity_train"].get<double>(), report["purity_val"].get<double>(), o.out.string());
  return report;
}

}  // namespace tributary
