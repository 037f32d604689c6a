#include "tributary/routing/router.h"

#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/model/tensor_io.h"
#include "tributary/routing/kmeans.h"
#include "tributary/routing/units.h"

namespace tributary {

int64_t Router::num_paths() const {
  int64_t p = 1;
  for (int64_t k : modules_per_level) p *= k;
  return p;
}

torch::Tensor product_slice(int64_t width, int64_t levels, int64_t level) {
  return torch::arange(level, width, levels, torch::kInt64);
}

torch::Tensor Router::standardise(const torch::Tensor& features) const {
  if (features.size(1) != mean.size(0))
    fail("routing features have width {} but the router was fitted on width {}: route with the same feature model",
         features.size(1), mean.size(0));
  auto z = (features.to(torch::kFloat32) - mean) / std;
  return rotation.defined() ? z.mm(rotation) : z;
}

torch::Tensor Router::scores(const torch::Tensor& features) const {
  torch::NoGradGuard no_grad;
  auto z = standardise(features);
  if (method == "kmeans") return -squared_distances(z, centroids.at(0));
  if (method == "product") {
    const int64_t L = static_cast<int64_t>(modules_per_level.size());
    PathGrid grid(modules_per_level, false);
    auto out = torch::zeros({z.size(0), num_paths()}, torch::kFloat32);
    for (int64_t l = 0; l < L; ++l) {
      auto d = squared_distances(z.index_select(1, product_slice(z.size(1), L, l)), centroids.at(l));
      std::vector<int64_t> module_of_path;
      for (int64_t p = 0; p < num_paths(); ++p) module_of_path.push_back(grid.path_modules(p)[l]);
      out -= d.index_select(1, torch::tensor(module_of_path));
    }
    return out;
  }
  if (method == "discriminative") return z.mm(weight.t()) + bias;
  fail("unknown router method '{}'", method);
}

torch::Tensor Router::route(const torch::Tensor& features, int64_t top) const {
  top = std::min(top, num_paths());
  return std::get<1>(scores(features).topk(top, 1, true, true));
}

void Router::save(const fs::path& file) const {
  NamedTensors t{{"mean", mean}, {"std", std}};
  if (rotation.defined()) t.emplace_back("rotation", rotation);
  for (size_t l = 0; l < centroids.size(); ++l) t.emplace_back(fmt::format("centroids.{}", l), centroids[l]);
  if (weight.defined()) {
    t.emplace_back("weight", weight);
    t.emplace_back("bias", bias);
  }
  PathGrid grid(modules_per_level, false);
  write_file_atomic(file, tensors_to_safetensors(t, {{"method", method},
                                                     {"modules", grid.describe()},
                                                     {"context", std::to_string(context)},
                                                     {"format", "tributary-router"}}));
}

Router Router::load(const fs::path& file) {
  auto f = safetensors::File::load(file);
  const auto& meta = f.metadata();
  auto get = [&](const std::string& key) {
    auto it = meta.find(key);
    if (it == meta.end())
      fail("'{}' is not a Tributary router (metadata '{}' missing); write one with `tributary route`", file.string(),
           key);
    return it->second;
  };
  if (get("format") != "tributary-router") fail("'{}' is not a Tributary router", file.string());
  Router r;
  r.method = get("method");
  r.context = std::stoll(get("context"));
  const std::string modules = get("modules");
  r.modules_per_level =
      PathGrid::parse(modules, std::count(modules.begin(), modules.end(), 'x') + 1, false, file.string() + " modules")
          .modules_per_level();
  r.mean = to_torch(f.at("mean"));
  r.std = to_torch(f.at("std"));
  if (f.contains("rotation")) r.rotation = to_torch(f.at("rotation"));
  for (size_t l = 0; f.contains(fmt::format("centroids.{}", l)); ++l)
    r.centroids.push_back(to_torch(f.at(fmt::format("centroids.{}", l))));
  if (f.contains("weight")) {
    r.weight = to_torch(f.at("weight"));
    r.bias = to_torch(f.at("bias"));
  }
  if ((r.method == "discriminative") != r.weight.defined() || (r.method != "discriminative" && r.centroids.empty()))
    fail("router '{}' (method {}) lacks its parameters; re-run `tributary route`", file.string(), r.method);
  return r;
}

torch::Tensor routing_features(Transformer& model, const torch::Tensor& units, const torch::Device& device,
                               int64_t batch, Progress* progress) {
  torch::NoGradGuard no_grad;
  // Shorter inputs (a short prompt) use what they have.
  const int64_t prefix = std::min<int64_t>(kRoutingPrefix, units.size(1));
  if (prefix < 1) fail("routing needs at least one token");
  const bool was_training = model.is_training();
  model.eval();
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < units.size(0); i += batch) {
    auto chunk = units.narrow(0, i, std::min(batch, units.size(0) - i)).narrow(1, 0, prefix).to(device);
    out.push_back(model.hidden(chunk).mean(1).to(torch::kCPU, torch::kFloat32));
    if (progress) progress->advance(chunk.size(0));
  }
  if (was_training) model.train();
  if (out.empty()) return torch::zeros({0, model.config().width});
  return torch::cat(out, 0);
}

}  // namespace tributary
