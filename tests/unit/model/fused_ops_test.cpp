// The fused CPU kernels against their composite ATen reference: values and gradients (float32 fused vs float64
// composite, so the reference is the more exact one).
#include <gtest/gtest.h>

#include "tributary/model/fused_ops.h"

using namespace tributary;

namespace {

// Runs f on float32 leaves (fused path) and on float64 copies (composite path), backpropagates the same random
// cotangents, and compares outputs and input gradients.
void compare(const std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>& f,
             const std::vector<torch::Tensor>& inputs, const std::string& what) {
  std::vector<torch::Tensor> a, b;
  for (const auto& x : inputs) {
    a.push_back(x.clone().set_requires_grad(true));
    b.push_back(x.to(torch::kFloat64).set_requires_grad(true));
  }
  auto ya = f(a), yb = f(b);
  ASSERT_EQ(ya.size(), yb.size());
  torch::Tensor la = torch::zeros({}), lb = torch::zeros({}, torch::kFloat64);
  for (size_t i = 0; i < ya.size(); ++i) {
    ASSERT_TRUE(fused_kernels_apply(ya[i])) << what;
    EXPECT_TRUE(torch::allclose(ya[i].to(torch::kFloat64), yb[i], 1e-5, 1e-5)) << what << " output " << i;
    auto cot = torch::randn_like(yb[i]);
    la = la + (ya[i] * cot.to(torch::kFloat32)).sum();
    lb = lb + (yb[i] * cot).sum();
  }
  la.backward();
  lb.backward();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!b[i].grad().defined()) continue;
    auto diff = (a[i].grad().to(torch::kFloat64) - b[i].grad()).abs().max().item<double>();
    EXPECT_LT(diff, 1e-4 * std::max(1.0, b[i].grad().abs().max().item<double>())) << what << " grad of input " << i;
  }
}

}  // namespace

TEST(FusedOps, RMSNorm) {
  torch::manual_seed(0);
  compare([](const auto& in) { return std::vector<torch::Tensor>{rms_norm(in[0], in[1], 1e-5)}; },
          {torch::randn({3, 5, 40}), torch::rand({40}) + 0.5}, "rms_norm");
}

TEST(FusedOps, SwiGLU) {
  torch::manual_seed(1);
  auto f = [](const auto& in) { return std::vector<torch::Tensor>{swiglu(in[0])}; };
  compare(f, {torch::randn({4, 7, 2 * 24}) * 3}, "swiglu");
  compare(f, {torch::randn({3, 5, 2 * 13}) * 3}, "swiglu, a width with a partial vector");
  // where exp saturates: a gate of +-100 gives silu(a) = a or 0 exactly
  compare(f, {torch::cat({torch::full({2, 9}, 100.0), torch::full({2, 9}, -100.0), torch::randn({2, 18})}, -1)},
          "swiglu, saturated gates");
}

TEST(FusedOps, SplitHeadsWithAndWithoutRope) {
  torch::manual_seed(2);
  const int64_t B = 2, T = 6, H = 3, D = 8;
  auto angles = torch::rand({T + 2, D / 2}) * 6;
  auto full = torch::cat({angles, angles}, -1);
  auto cos = full.cos(), sin = full.sin();
  compare(
      [&](const auto& in) {
        auto c = cos.to(in[0].scalar_type()), s = sin.to(in[0].scalar_type());
        auto out = split_heads_rope(in[0], H, c, s);
        return std::vector<torch::Tensor>{out[0], out[1], out[2]};
      },
      {torch::randn({B, T, 3 * H * D})}, "split_heads_rope");
  compare(
      [&](const auto& in) {
        auto out = split_heads_rope(in[0], H, torch::Tensor(), torch::Tensor());
        return std::vector<torch::Tensor>{out[0], out[1], out[2]};
      },
      {torch::randn({B, T, 3 * H * D})}, "split_heads");
}

TEST(FusedOps, SplitHeadsGroupedQuery) {
  // 4 query heads over 2 key/value heads: qkv rows are [q: 4 D | k: 2 D | v: 2 D].
  torch::manual_seed(5);
  const int64_t B = 2, T = 5, H = 4, KV = 2, D = 8;
  auto angles = torch::rand({T, D / 2}) * 6;
  auto full = torch::cat({angles, angles}, -1);
  auto cos = full.cos(), sin = full.sin();
  compare(
      [&](const auto& in) {
        auto c = cos.to(in[0].scalar_type()), s = sin.to(in[0].scalar_type());
        auto out = split_heads_rope(in[0], H, c, s, 0.5, KV);
        EXPECT_EQ(out[0].sizes().vec(), (std::vector<int64_t>{B * H, T, D}));
        EXPECT_EQ(out[1].sizes().vec(), (std::vector<int64_t>{B * KV, T, D}));
        return std::vector<torch::Tensor>{out[0], out[1], out[2]};
      },
      {torch::randn({B, T, (H + 2 * KV) * D})}, "split_heads_rope grouped");
}

TEST(FusedOps, CausalSoftmax) {
  torch::manual_seed(3);
  compare([](const auto& in) { return std::vector<torch::Tensor>{causal_softmax(in[0])}; },
          {torch::randn({3, 9, 9}) * 4}, "causal_softmax");
  compare([](const auto& in) { return std::vector<torch::Tensor>{causal_softmax(in[0])}; },
          {torch::randn({2, 4, 9}) * 4}, "causal_softmax with fewer queries than keys");
}

TEST(FusedOps, ScaledQuery) {
  torch::manual_seed(4);
  compare(
      [](const auto& in) {
        auto out = split_heads_rope(in[0], 2, torch::Tensor(), torch::Tensor(), 0.125);
        return std::vector<torch::Tensor>{out[0], out[1], out[2]};
      },
      {torch::randn({2, 5, 3 * 16})}, "split_heads with q scale");
}
