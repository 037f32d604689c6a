#include "cli/commands.h"
#include "tributary/core/log.h"
#include "tributary/perf/flops.h"
#include "tributary/route/discriminative.h"
#include "tributary/route/routes_build.h"

namespace tributary::cli {

void add_route(CLI::App& app) {
  auto o = std::make_shared<RouteOptions>();
  auto d = std::make_shared<DiscriminativeOptions>();
  auto discriminative = std::make_shared<std::string>();
  auto threads = std::make_shared<int64_t>(0);
  auto* cmd = app.add_subcommand("route", "DiPaCo: route a dataset's units to paths and write one shard per path");
  cmd->add_option("--model", o->model, "dense checkpoint (or run directory) whose hidden states are the features");
  cmd->add_option("--data", o->data, "dataset directory");
  cmd->add_option("--modules", o->modules, "grid, e.g. 2x2 or 4x4 (one factor per level)");
  cmd->add_option("--method", o->method, "kmeans or product")->check(CLI::IsMember({"kmeans", "product"}));
  cmd->add_flag("--balanced,!--unbalanced", o->balanced, "size-balanced k-means (default on)");
  cmd->add_option("--overlap", o->overlap, "each training unit goes to its top-k paths (evaluation: always 1)");
  cmd->add_option("--seed", o->seed, "k-means seed");
  cmd->add_option("--iterations", o->iterations, "k-means iterations");
  cmd->add_option("--context", o->context, "unit length - 1 (default: the feature model's context)");
  cmd->add_option("--fit-units", o->fit_units, "fit k-means on at most this many units");
  cmd->add_option("--discriminative", *discriminative,
                  "a trained DiPaCo run: learn a logistic-regression router from its paths' losses and re-shard");
  cmd->add_option("--router-permille", d->router_permille, "discriminative: training units per thousand scored");
  cmd->add_option("--out", o->out, "output routes directory")->required();
  cmd->add_flag("--overwrite", o->overwrite, "replace --out if it exists");
  cmd->add_option("--device", o->device, "torch device");
  cmd->add_option("--threads", *threads, "intra-op threads (0: all cores)");
  cmd->callback([o, d, discriminative, threads]() {
    configure_threads(*threads);
    if (!discriminative->empty()) {
      d->run = *discriminative;
      d->out = o->out;
      d->overwrite = o->overwrite;
      d->overlap = o->overlap;
      d->device = o->device;
      d->seed = o->seed;
      build_discriminative_routes(*d);
      return;
    }
    if (o->model.empty() || o->data.empty())
      throw CLI::ValidationError("route", "--model and --data are required (or --discriminative RUN)");
    build_routes(*o);
  });
}

}  // namespace tributary::cli
