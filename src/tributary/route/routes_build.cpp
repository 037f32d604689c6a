#include "tributary/route/routes_build.h"

#include <cmath>

#include "tributary/artifacts/checkpoint.h"
#include "tributary/artifacts/inference.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/core/rng.h"
#include "tributary/data/dataset.h"
#include "tributary/routing/kmeans.h"

namespace tributary {
namespace {

// Per-id counts of a token stream (for the unigram baseline of a path's shard).
std::vector<double> token_counts(const std::vector<uint32_t>& tokens, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 0.0);
  for (uint32_t t : tokens) counts[t] += 1;
  return counts;
}

}  // namespace

Confusion confusion_table(const std::vector<uint32_t>& domain, const torch::Tensor& path_of_unit, int64_t num_paths,
                          int64_t num_domains) {
  Confusion table(static_cast<size_t>(num_domains), std::vector<int64_t>(static_cast<size_t>(num_paths), 0));
  auto p = path_of_unit.contiguous();
  const auto path = p.accessor<int64_t, 1>();
  for (size_t i = 0; i < domain.size(); ++i) table[domain[i]][size_t(path[int64_t(i)])] += 1;
  return table;
}

double purity(const Confusion& table) {
  if (table.empty()) return 0;
  int64_t total = 0, majority = 0;
  for (size_t q = 0; q < table.front().size(); ++q) {
    int64_t best = 0;
    for (const auto& row : table) {
      best = std::max(best, row[q]);
      total += row[q];
    }
    majority += best;
  }
  return total > 0 ? double(majority) / double(total) : 0.0;
}

namespace {

// One path's routed shard as a dataset directory (the source's tokenizer and metadata, its own splits and unigram
// statistics). Returns its line of the report.
nlohmann::json write_path_dataset(const fs::path& dir, int64_t p, int64_t row, const Dataset& dataset,
                                  const nlohmann::json& source_meta, const Shard& train, const Shard& val) {
  const double bpt_train = dataset.bytes_per_token("train"), bpt_val = dataset.bytes_per_token("val");
  fs::create_directories(dir);
  train.write(dir / "train-00000.bin", dataset.vocab_size() - 1);
  val.write(dir / "val-00000.bin", dataset.vocab_size() - 1);
  const auto [entropy, cross] =
      unigram_bits(token_counts(train.tokens, dataset.vocab_size()), token_counts(val.tokens, dataset.vocab_size()));
  nlohmann::json meta = source_meta;
  auto split = [&](const Shard& shard, const char* file, double bpt) {
    return nlohmann::json{{"shards", {file}},
                          {"num_tokens", shard.tokens.size()},
                          {"num_docs", shard.docs.size()},
                          {"num_bytes", static_cast<int64_t>(std::llround(double(shard.tokens.size()) * bpt))}};
  };
  meta["splits"] = {{"train", split(train, "train-00000.bin", bpt_train)},
                    {"val", split(val, "val-00000.bin", bpt_val)}};
  meta["unigram"] = {{"train_entropy_bits", entropy}, {"val_cross_entropy_bits", cross}};
  meta["routed"] = {{"path", p}, {"unit_tokens", row}};
  for (const auto& file : tokenizer_files(dataset.dir(), dataset.tokenizer_kind()))
    fs::copy_file(file, dir / file.filename());
  write_file_atomic(dir / "dataset.json", meta.dump(2) + "\n");
  return {{"path", p},
          {"train_units", train.docs.size()},
          {"val_units", val.docs.size()},
          {"train_tokens", train.tokens.size()}};
}

}  // namespace

nlohmann::json write_routes(const fs::path& out, const Router& router, const fs::path& features_dir,
                            const Dataset& dataset, const Units& train, const torch::Tensor& routes_train,
                            const Units& val, const torch::Tensor& routes_val, nlohmann::json info, bool overwrite) {
  if (fs::exists(out) && !overwrite)
    fail("'{}' already exists: pass --overwrite to replace it, or choose another --out", out.string());
  const int64_t P = router.num_paths();
  const int64_t D = static_cast<int64_t>(dataset.domains().size());
  const int64_t row = router.context + 1;
  fs::path tmp = out;
  tmp += ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp / "features");
  // The feature model travels with the router: inference routes with exactly the model the shards were cut with.
  for (const auto& e : fs::directory_iterator(features_dir))
    if (e.is_regular_file()) fs::copy_file(e.path(), tmp / "features" / e.path().filename());
  router.save(tmp / "router.safetensors");

  auto source_meta = nlohmann::json::parse(read_file(dataset.dir() / "dataset.json"));
  std::vector<std::vector<uint32_t>> train_tokens(P), val_tokens(P);
  std::vector<std::vector<ShardDoc>> train_docs(P), val_docs(P);
  // Each unit's tokens go to the shards of the paths it was routed to.
  auto scatter = [&](const Units& units, const torch::Tensor& routes, std::vector<std::vector<uint32_t>>& tokens,
                     std::vector<std::vector<ShardDoc>>& docs) {
    auto ids = units.tokens.contiguous();
    auto r = routes.contiguous();
    const auto to = r.accessor<int64_t, 2>();
    for (int64_t i = 0; i < units.size(); ++i) {
      const int64_t* src = ids.data_ptr<int64_t>() + i * row;
      for (int64_t j = 0; j < r.size(1); ++j) {
        const int64_t p = to[i][j];
        docs[p].push_back({tokens[p].size(), static_cast<uint32_t>(row), units.domain[size_t(i)]});
        tokens[p].insert(tokens[p].end(), src, src + row);
      }
    }
  };
  scatter(train, routes_train, train_tokens, train_docs);
  scatter(val, routes_val, val_tokens, val_docs);
  nlohmann::json paths = nlohmann::json::array();
  for (int64_t p = 0; p < P; ++p)
    paths.push_back(write_path_dataset(tmp / fmt::format("path-{}", p), p, row, dataset, source_meta,
                                       {train_tokens[p], train_docs[p]}, {val_tokens[p], val_docs[p]}));

  // Report: how paths line up with the corpus's source domains (top-1 assignment).
  const Confusion confusion = confusion_table(train.domain, routes_train.select(1, 0), P, D);
  nlohmann::json report = {{"method", router.method},
                           {"modules", PathGrid(router.modules_per_level, false).describe()},
                           {"paths", paths},
                           {"domains", dataset.domains()},
                           {"confusion_train", confusion},
                           {"purity_train", purity(confusion)},
                           {"purity_val", purity(confusion_table(val.domain, routes_val.select(1, 0), P, D))}};
  write_file_atomic(tmp / "report.json", report.dump(2) + "\n");
  info["method"] = router.method;
  info["modules"] = report["modules"];
  info["context"] = router.context;
  info["data"] = fs::absolute(dataset.dir()).string();
  info["format"] = "tributary-routes";
  write_file_atomic(tmp / "route.json", info.dump(2) + "\n");  // last: marks the directory complete
  if (fs::exists(out)) fs::remove_all(out);
  rename_durable(tmp, out);
  return report;
}

nlohmann::json build_routes(const RouteOptions& o) {
  const torch::Device device = parse_device(o.device);
  auto ckpt = load_checkpoint(o.model);  // verifies the manifest before anything is routed
  auto feature = load_model(ckpt.dir.string(), device);
  Dataset dataset = Dataset::open(o.data);
  if (feature.config.model.vocab_size < dataset.vocab_size())
    fail(
        "feature model '{}' has a vocabulary of {} ids but dataset '{}' uses {}: route with a model trained on this "
        "tokenizer",
        ckpt.dir.string(), feature.config.model.vocab_size, o.data, dataset.vocab_size());
  const int64_t context = o.context > 0 ? o.context : feature.config.model.context;
  if (context < kRoutingPrefix)
    fail("--context {} is shorter than the {}-token routing prefix", context, kRoutingPrefix);
  std::string modules = o.modules;
  const int64_t levels = std::count(modules.begin(), modules.end(), 'x') + 1;
  PathGrid grid = PathGrid::parse(modules, levels, false, "--modules");
  if (o.method != "kmeans" && o.method != "product")
    fail(
        "--method '{}': choose kmeans or product (discriminative routing re-shards a trained DiPaCo run: "
        "`tributary route --discriminative RUN`)",
        o.method);
  if (o.overlap < 1 || o.overlap > grid.num_paths())
    fail("--overlap {} must be between 1 and the number of paths ({})", o.overlap, grid.num_paths());

  Units train = cut_units(dataset, "train", context), val = cut_units(dataset, "val", context);
  log::info("route: {} train units and {} val units of {} tokens; features from '{}'", train.size(), val.size(),
            context + 1, ckpt.dir.string());
  Progress progress("route: routing features", train.size() + val.size(), "units");
  auto f_train = routing_features(*feature.model, train.tokens, device, 128, &progress);
  auto f_val = routing_features(*feature.model, val.tokens, device, 128, &progress);
  progress.done();

  Router router;
  router.method = o.method;
  router.modules_per_level = grid.modules_per_level();
  router.context = context;
  router.mean = f_train.mean(0);
  router.std = f_train.std(0).clamp_min(1e-6);
  {
    auto s = (f_train - router.mean) / router.std;
    auto cov = s.t().mm(s) / double(std::max<int64_t>(1, s.size(0) - 1));
    auto [values, vectors] = torch::linalg_eigh(cov.to(torch::kFloat64), "L");
    router.rotation = vectors.flip({1}).to(torch::kFloat32).contiguous();  // largest variance first
  }
  auto z = router.standardise(f_train);
  // Fit on a deterministic subsample (all units are routed afterwards).
  torch::Tensor fit = z;
  if (z.size(0) > o.fit_units) {
    auto perm = permutation(static_cast<uint64_t>(z.size(0)), o.seed + 99);
    std::vector<int64_t> idx(perm.begin(), perm.begin() + o.fit_units);
    fit = z.index_select(0, torch::tensor(idx));
  }
  if (o.method == "kmeans") {
    router.centroids.push_back(
        kmeans(fit, {.k = grid.num_paths(), .iterations = o.iterations, .seed = o.seed, .balanced = o.balanced})
            .centroids);
  } else {
    for (int64_t l = 0; l < levels; ++l)
      router.centroids.push_back(
          kmeans(fit.index_select(1, product_slice(z.size(1), levels, l)), {.k = grid.modules_per_level()[l],
                                                                            .iterations = o.iterations,
                                                                            .seed = o.seed + uint64_t(l),
                                                                            .balanced = o.balanced})
              .centroids);
  }
  auto routes_train = router.route(f_train, o.overlap);
  auto routes_val = router.route(f_val, 1);
  nlohmann::json info = {{"feature_model", fs::absolute(ckpt.dir).string()},
                         {"overlap", o.overlap},
                         {"seed", o.seed},
                         {"balanced", o.balanced}};
  auto report = write_routes(o.out, router, ckpt.dir, dataset, train, routes_train, val, routes_val, info, o.overwrite);
  log::info("route: {} {} router, purity {:.3f} (train) / {:.3f} (val); wrote '{}'", o.method, grid.describe(),
            report["purity_train"].get<double>(), report["purity_val"].get<double>(), o.out.string());
  return report;
}

}  // namespace tributary
