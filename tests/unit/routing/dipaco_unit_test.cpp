// DiPaCo building blocks without processes: the path grid, path assembly, per-module averaging, k-means.
#include <gtest/gtest.h>

#include "support/error_of.h"

#include "tributary/artifacts/modules.h"
#include "tributary/core/error.h"
#include "tributary/model/path_grid.h"
#include "tributary/optim/module_outer.h"
#include "tributary/optim/outer.h"
#include "tributary/routing/kmeans.h"
#include "tributary/routing/router.h"

using namespace tributary;
using test_support::error_of;

namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 50;
  m.num_layers = 4;
  m.num_levels = 2;
  m.width = 32;
  m.num_heads = 4;
  m.context = 16;
  return m;
}

}  // namespace

TEST(PathGrid, PathsAreMixedRadixAndModulesAreShared) {
  PathGrid g = PathGrid::parse("2x3", 2, false, "dipaco.modules");
  EXPECT_EQ(g.num_paths(), 6);
  EXPECT_EQ(g.path_modules(4), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(g.path_id({1, 2}), 5);
  EXPECT_EQ(g.modules().size(), 1u + 2 + 3);
  EXPECT_EQ(g.paths_through("level0.module1"), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(g.paths_through("level1.module2"), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(g.paths_through("stem").size(), 6u);
  EXPECT_EQ(g.module_of_param("levels.1.modules.2.blocks.0.mlp.fc.weight", 5), "level1.module2");
  EXPECT_EQ(g.module_of_param("embed_tok.weight", 5), "stem");
  PathGrid priv(std::vector<int64_t>{2, 2}, true);
  EXPECT_EQ(priv.module_of_param("final_norm.weight", 3), "stem.path3");
  EXPECT_EQ(priv.paths_through("stem.path3"), (std::vector<int64_t>{3}));
}

TEST(PathGrid, BadLayoutsAreRefusedNamingTheKey) {
  const std::string levels = error_of([] { PathGrid::parse("2x2x2", 2, false, "dipaco.modules"); });
  EXPECT_NE(levels.find("dipaco.modules"), std::string::npos) << levels;
  EXPECT_NE(levels.find("model.num_levels = 2"), std::string::npos) << levels;
  EXPECT_NE(error_of([] { PathGrid::parse("2xa", 2, false, "k"); }).find("'2xa'"), std::string::npos);
  PathGrid g = PathGrid::parse("2x2", 2, false, "k");
  EXPECT_NE(error_of([&] { g.path_modules(4); }).find("paths 0..3"), std::string::npos);
}

TEST(PathAssembly, APathEqualsTheDenseModelBuiltFromItsModules) {
  const ModelConfig m = tiny_model();
  PathGrid grid = PathGrid::parse("2x2", 2, false, "k");
  ModuleSet modules = initial_modules(m, grid, 7, "");
  // Make every module different, so a wrong module would show.
  torch::manual_seed(3);
  for (auto& [id, tensors] : modules)
    for (auto& [name, t] : tensors) t = t + 0.05 * torch::randn_like(t);
  DipacoRun run;
  run.config.model = m;
  run.grid = grid;
  run.modules = modules;
  auto tokens = torch::randint(0, m.vocab_size, {2, 12}, torch::kInt64);
  for (int64_t p = 0; p < grid.num_paths(); ++p) {
    Transformer routed(m, grid.path_modules(p));
    load_path(routed, grid, modules, p);
    auto dense = assemble_dense(run, p);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(routed.forward(tokens), dense->forward(tokens))) << "path " << p;
  }
  // Paths that differ in a module give different outputs.
  Transformer a(m, grid.path_modules(0)), b(m, grid.path_modules(1));
  load_path(a, grid, modules, 0);
  load_path(b, grid, modules, 1);
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(torch::allclose(a.forward(tokens), b.forward(tokens)));
}

TEST(ModuleOuter, WeightedRescaledAverageMatchesHandComputation) {
  // Module shared by two paths: deltas 1 and 4 (weights 1 and 3) -> mean 3.25, times sqrt(2).
  ModuleAccumulator acc;
  acc.add(1.0, {torch::tensor({1.0f, 2.0f})});
  acc.add(3.0, {torch::tensor({4.0f, -2.0f})});
  auto d = finalize(acc.sum, acc.weight, acc.paths, "multiply");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NEAR(d[0][0].item<double>(), 3.25 * std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(d[0][1].item<double>(), (2.0 - 6.0) / 4.0 * std::sqrt(2.0), 1e-6);
  auto div = finalize(acc.sum, acc.weight, acc.paths, "divide");
  EXPECT_NEAR(div[0][0].item<double>(), 3.25 / std::sqrt(2.0), 1e-6);
  EXPECT_TRUE(finalize(acc.sum, 0, 0, "none").empty());
  EXPECT_THROW(norm_rescale_factor("sideways", 2), Error);
  // Then one Nesterov step (lr 0.7, mu 0.9) from theta = 10: buf = Delta, theta -= 0.7 (Delta + 0.9 Delta).
  NamedTensors theta{{"w", torch::tensor({10.0f, 10.0f})}};
  OuterOptimizer outer(theta, {0.7, 0.9});
  outer.apply(d);
  EXPECT_NEAR(outer.global()[0].second[0].item<double>(), 10.0 - 0.7 * 1.9 * 3.25 * std::sqrt(2.0), 1e-5);
}

TEST(KMeans, DeterministicForASeedAndBalancedWhenAsked) {
  torch::manual_seed(0);
  // Three blobs of unequal size.
  auto x = torch::cat({torch::randn({300, 4}) + 5, torch::randn({60, 4}) - 5, torch::randn({40, 4})});
  auto a = kmeans(x, {.k = 3, .seed = 11});
  auto b = kmeans(x, {.k = 3, .seed = 11});
  EXPECT_TRUE(torch::equal(a.centroids, b.centroids));
  EXPECT_TRUE(torch::equal(a.assignment, b.assignment));
  auto balanced = kmeans(x, {.k = 3, .seed = 11, .balanced = true, .slack = 0.1});
  auto counts = torch::bincount(balanced.assignment, {}, 3);
  EXPECT_LE(counts.max().item<int64_t>(), static_cast<int64_t>(std::ceil(400.0 / 3 * 1.1)));
  EXPECT_EQ(balanced.assignment.min().item<int64_t>(), 0);
}

TEST(Router, ProductRouterScoresPathsAsSumsOverLevels) {
  Router r;
  r.method = "product";
  r.modules_per_level = {2, 2};
  r.context = 16;
  r.mean = torch::zeros({4});
  r.std = torch::ones({4});
  // Level 0 sees columns {0, 2}, level 1 columns {1, 3}.
  r.centroids = {torch::tensor({{0.0f, 0.0f}, {10.0f, 10.0f}}), torch::tensor({{0.0f, 0.0f}, {-10.0f, -10.0f}})};
  auto f = torch::tensor({{10.0f, -10.0f, 10.0f, -10.0f}, {0.0f, 0.0f, 0.0f, 0.0f}, {10.0f, 0.0f, 10.0f, 0.0f}});
  auto routes = r.route(f, 1).select(1, 0);
  EXPECT_EQ(routes[0].item<int64_t>(), 3);  // (1, 1)
  EXPECT_EQ(routes[1].item<int64_t>(), 0);  // (0, 0)
  EXPECT_EQ(routes[2].item<int64_t>(), 2);  // (1, 0)
  auto file = fs::temp_directory_path() / "trib_router_test.safetensors";
  r.save(file);
  auto back = Router::load(file);
  EXPECT_TRUE(torch::equal(back.route(f, 2), r.route(f, 2)));
}
