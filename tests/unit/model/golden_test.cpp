// The C++ model against PyTorch: logits, loss, every gradient and three AdamW steps, from
// tests/reference/make_golden.py (run by CTest as the `golden` fixture).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/model/autocast.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"
#include "tributary/optim/adamw.h"
#include "tributary/runtime/run_config.h"

using namespace tributary;

namespace {

fs::path golden_dir() {
  const char* env = std::getenv("TRIBUTARY_GOLDEN_DIR");
  return env ? fs::path(env) : fs::path(TRIBUTARY_BINARY_DIR) / "golden";
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  auto diff = (got - want).abs();
  auto bound = atol + rtol * want.abs();
  auto worst = (diff - bound).max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": max |diff| " << diff.max().item<double>() << " (max |want| "
                        << want.abs().max().item<double>() << ")";
}

// A variant's golden files: its config, the weights every model of a test starts from, and the token batch. One
// thread, as the goldens were computed.
struct Variant {
  RunConfig config;
  safetensors::File weights;
  torch::Tensor inputs, targets;

  explicit Variant(const fs::path& dir)
      : config(RunConfig::from_toml(read_file(dir / "config.toml"), (dir / "config.toml").string())),
        weights(safetensors::File::load(dir / "weights.safetensors")) {
    torch::set_num_threads(1);
    const auto tokens = to_torch(safetensors::File::load(dir / "golden.safetensors").at("tokens"));
    const int64_t T = tokens.size(1) - 1;
    inputs = tokens.narrow(1, 0, T);
    targets = tokens.narrow(1, 1, T);
  }
  std::unique_ptr<Transformer> model() const {
    auto m = std::make_unique<Transformer>(config.model);
    load_parameters(*m, weights);
    return m;
  }
};

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesPyTorch) {
  fs::path dir = golden_dir() / GetParam();
  ASSERT_TRUE(fs::exists(dir / "golden.safetensors")) << "run tests/reference/make_golden.py (ctest does) for " << dir;
  const Variant variant(dir);
  const auto &inputs = variant.inputs, &targets = variant.targets;
  auto owned = variant.model();
  Transformer& model = *owned;
  auto golden = safetensors::File::load(dir / "golden.safetensors");

  auto logits = model.forward(inputs);
  expect_close(logits, to_torch(golden.at("logits")), 1e-4, 1e-5, "logits");
  auto loss = Transformer::loss(logits, targets);
  expect_close(loss.reshape({1}), to_torch(golden.at("loss")), 1e-5, 1e-6, "loss");
  loss.backward();
  int checked = 0;
  for (const auto& item : model.named_parameters()) {
    expect_close(item.value().grad(), to_torch(golden.at("grad." + item.key())), 1e-3, 1e-5, "grad " + item.key());
    ++checked;
  }
  EXPECT_EQ(static_cast<int>(golden.tensors().size()), 2 * checked + 3) << "every parameter checked";

  // Three AdamW steps from the same weights. Adam normalises each coordinate, so rounding-level gradient
  // differences of near-zero coordinates move by up to ~lr; the exact optimizer check is AdamWMatchesPyTorch.
  load_parameters(model, variant.weights);
  AdamW opt(named_parameters_of(model), {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    Transformer::loss(model.forward(inputs), targets).backward();
    opt.step(1e-2);
  }
  for (const auto& item : model.named_parameters())
    expect_close(item.value(), to_torch(golden.at("after." + item.key())), 1e-3, 2e-3, "after AdamW " + item.key());
}

// train.precision = bf16 (model/autocast.h) against PyTorch's own autocast of the same step (its independent reference
// model): the logits carry bf16's rounding, closer to PyTorch's bf16 logits than our fp32 logits are, and loss and
// gradients agree within bf16's precision (the two models round at different places).
TEST_P(Golden, Bf16AutocastMatchesPyTorchsAutocast) {
  fs::path dir = golden_dir() / GetParam();
  ASSERT_TRUE(fs::exists(dir / "golden_bf16.safetensors")) << "run tests/reference/make_golden.py for " << dir;
  const Variant variant(dir);
  const auto &inputs = variant.inputs, &targets = variant.targets;
  auto owned = variant.model(), fp32_owned = variant.model();  // the second: the same step in fp32
  Transformer &model = *owned, &fp32_model = *fp32_owned;
  auto golden = safetensors::File::load(dir / "golden_bf16.safetensors");
  const auto want = to_torch(golden.at("logits"));

  const torch::Tensor fp32_logits = fp32_model.forward(inputs);
  Transformer::loss(fp32_logits, targets).backward();
  torch::Tensor logits;
  {
    const Autocast autocast(true, torch::kCPU);
    logits = model.forward(inputs);
  }
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16) << "the forward pass ran under autocast";
  logits = logits.to(torch::kFloat32);
  const auto rel = [&](const torch::Tensor& got) {
    return (got - want).norm().item<double>() / want.norm().item<double>();
  };
  const double ours = rel(logits), fp32 = rel(fp32_logits);
  EXPECT_LT(ours, 0.02) << "bf16 logits off PyTorch's autocast by " << ours << " (relative); fp32's by " << fp32;
  EXPECT_LT(ours, fp32) << "closer to PyTorch's bf16 logits than fp32 logits are";
  auto loss = Transformer::loss(logits, targets);
  expect_close(loss.reshape({1}), to_torch(golden.at("loss")), 1e-2, 1e-3, "bf16 loss");
  loss.backward();
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU)) << "the guard restored autocast";
  // Every gradient within bf16's reach of PyTorch's, and all of them together closer than fp32's gradients are.
  const auto fp32_grads = fp32_model.named_parameters();
  double ours_sq = 0, fp32_sq = 0;
  for (const auto& item : model.named_parameters()) {
    const auto& grad = item.value().grad();
    const auto reference = to_torch(golden.at("grad." + item.key()));
    EXPECT_EQ(grad.scalar_type(), torch::kFloat32) << item.key() << ": master gradients stay fp32";
    const double off = (grad - reference).norm().item<double>() / (reference.norm().item<double>() + 1e-12);
    EXPECT_LT(off, 0.15) << "grad " << item.key();
    ours_sq += (grad - reference).pow(2).sum().item<double>();
    fp32_sq += (fp32_grads[item.key()].grad() - reference).pow(2).sum().item<double>();
  }
  EXPECT_LT(ours_sq, fp32_sq) << "bf16 gradients closer to PyTorch's bf16 gradients than fp32's";
  std::printf("bf16 vs PyTorch autocast: logits %.4f (fp32 %.4f) relative; gradients %.4g (fp32 %.4g) squared\n", ours,
              fp32, ours_sq, fp32_sq);
}

// Both of AdamW's paths: float32 on the CPU takes the one-pass kernel; float64 takes the composite ATen ops, which
// non-CPU tensors take (compared in float32, the precision PyTorch's golden was computed in).
TEST(GoldenAdamW, MatchesPyTorchOnFixedGradients) {
  auto golden = safetensors::File::load(golden_dir() / "adamw" / "golden.safetensors");
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const std::string path = dtype == torch::kFloat32 ? "one pass" : "composite";
    auto matrix = to_torch(golden.at("matrix")).to(dtype).set_requires_grad(true);
    auto vector = to_torch(golden.at("vector")).to(dtype).set_requires_grad(true);
    AdamW opt({{"matrix", matrix}, {"vector", vector}},
              {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
    for (int i = 0; i < 3; ++i) {
      matrix.mutable_grad() = to_torch(golden.at("grad" + std::to_string(i) + ".matrix")).to(dtype);
      vector.mutable_grad() = to_torch(golden.at("grad" + std::to_string(i) + ".vector")).to(dtype);
      opt.step(1e-2);
    }
    expect_close(matrix.to(torch::kFloat32), to_torch(golden.at("after.matrix")), 1e-6, 1e-7,
                 "matrix (weight decay), " + path);
    expect_close(vector.to(torch::kFloat32), to_torch(golden.at("after.vector")), 1e-6, 1e-7,
                 "vector (no weight decay), " + path);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Golden, ::testing::Values("swiglu_rope_tied", "gelu_learned_untied"));

}  // namespace
