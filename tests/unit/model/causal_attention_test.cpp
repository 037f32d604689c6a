// The lower-triangle attention kernel against the composite formula (float64, the reference semantics): values and
// gradients of q, k, v; bit-identical repeats and thread counts; the shapes it hands back to the composite path.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <torch/cuda.h>

#include <tuple>

#include "tributary/model/causal_attention.h"
#include "tributary/model/fused_ops.h"
#include "tributary/model/simd_kernels.h"

using namespace tributary;

namespace {

struct Result {
  torch::Tensor y, dq, dk, dv;
};

Result run(const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0, const torch::Tensor& dy,
           int64_t block = 0) {
  auto q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
       v = v0.clone().set_requires_grad(true);
  auto y = causal_attention(q, k, v, block);
  y.backward(dy.to(y.scalar_type()));
  return {y.detach(), q.grad(), k.grad(), v.grad()};
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  const double diff = (got.to(torch::kFloat64) - want).abs().max().item<double>();
  EXPECT_LT(diff, 2e-5 * scale) << what;
}

void check_against_reference(int64_t N, int64_t T, int64_t D, int64_t block) {
  torch::manual_seed(T * 131 + D);
  auto q = torch::randn({N, T, D}) * 0.5, k = torch::randn({N, T, D}), v = torch::randn({N, T, D});
  auto dy = torch::randn({N, T, D});
  auto got = run(q, k, v, dy, block);
  auto want = run(q.to(torch::kFloat64), k.to(torch::kFloat64), v.to(torch::kFloat64), dy.to(torch::kFloat64));
  const std::string what = fmt::format("N {} T {} D {} block {}", N, T, D, block);
  expect_close(got.y, want.y, what + " y");
  expect_close(got.dq, want.dq, what + " dq");
  expect_close(got.dk, want.dk, what + " dk");
  expect_close(got.dv, want.dv, what + " dv");
}

}  // namespace

TEST(CausalAttention, MatchesTheCompositeFormula) {
  if (!simd_kernels_supported()) GTEST_SKIP() << "this CPU has no AVX2 + FMA: only the composite path runs";
  check_against_reference(3, 40, 16, 0);    // T not a multiple of the kernel's 16 columns
  check_against_reference(2, 64, 64, 16);   // one query block per 16 rows
  check_against_reference(2, 100, 32, 48);  // a last block shorter than the others
  check_against_reference(1, 1, 64, 0);     // one token: the softmax of a single score
  check_against_reference(2, 33, 48, 32);
}

TEST(CausalAttention, LongSequencesTakeLibTorchsAttentionWithTheSameResult) {
  if (!simd_kernels_supported()) GTEST_SKIP() << "this CPU has no AVX2 + FMA: only the composite path runs";
  check_against_reference(1, kCpuSdpaFromLength, 64, 0);
  auto q = torch::randn({1, kCpuSdpaFromLength, 64}).set_requires_grad(true), k = torch::randn_like(q),
       v = torch::randn_like(q);
  EXPECT_EQ(causal_attention(q, k, v).grad_fn()->name().find("CausalAttention"), std::string::npos);
  auto shorter = q.narrow(1, 0, kCpuSdpaFromLength - 16);
  EXPECT_NE(causal_attention(shorter, k.narrow(1, 0, kCpuSdpaFromLength - 16), v.narrow(1, 0, kCpuSdpaFromLength - 16))
                .grad_fn()
                ->name()
                .find("CausalAttention"),
            std::string::npos);
}

TEST(CausalAttention, LargeScoresStayFinite) {  // the softmax subtracts the row max: no overflow in exp
  if (!simd_kernels_supported()) GTEST_SKIP() << "no AVX2 + FMA";
  torch::manual_seed(3);
  auto q = torch::randn({2, 48, 16}) * 30, k = torch::randn({2, 48, 16}) * 30, v = torch::randn({2, 48, 16});
  auto dy = torch::randn({2, 48, 16});
  auto got = run(q, k, v, dy);
  auto want = run(q.to(torch::kFloat64), k.to(torch::kFloat64), v.to(torch::kFloat64), dy.to(torch::kFloat64));
  ASSERT_TRUE(torch::isfinite(got.y).all().item<bool>());
  expect_close(got.y, want.y, "y");
  expect_close(got.dv, want.dv, "dv");
}

TEST(CausalAttention, BitIdenticalAcrossRepeatsAndThreadCounts) {
  if (!simd_kernels_supported()) GTEST_SKIP() << "no AVX2 + FMA";
  torch::manual_seed(5);
  auto q = torch::randn({6, 80, 64}), k = torch::randn({6, 80, 64}), v = torch::randn({6, 80, 64});
  auto dy = torch::randn({6, 80, 64});
  const int threads = at::get_num_threads();
  auto a = run(q, k, v, dy);
  at::set_num_threads(1);
  auto b = run(q, k, v, dy);
  at::set_num_threads(threads);
  auto c = run(q, k, v, dy);
  for (const auto* r : {&b, &c}) {  // heads are split over threads whole: the split cannot change a bit
    EXPECT_TRUE(torch::equal(a.y, r->y));
    EXPECT_TRUE(torch::equal(a.dq, r->dq));
    EXPECT_TRUE(torch::equal(a.dk, r->dk));
    EXPECT_TRUE(torch::equal(a.dv, r->dv));
  }
}

TEST(CausalAttention, FusedPathIsTakenAndOtherShapesFallBack) {
  torch::manual_seed(7);
  auto q = torch::randn({2, 24, 8}), k = torch::randn({2, 24, 8}), v = torch::randn({2, 24, 8});
  auto dy = torch::randn({2, 24, 8});
  // Head dim 8 is not a multiple of 16: the composite path, still correct.
  auto got = run(q, k, v, dy);
  auto want = run(q.to(torch::kFloat64), k.to(torch::kFloat64), v.to(torch::kFloat64), dy.to(torch::kFloat64));
  expect_close(got.y, want.y, "head dim 8 y");
  expect_close(got.dk, want.dk, "head dim 8 dk");
  if (!simd_kernels_supported()) return;
  // The fused path keeps its probabilities as one saved tensor; the composite graph has bmm nodes instead.
  auto q16 = torch::randn({2, 24, 16}).set_requires_grad(true), k16 = torch::randn({2, 24, 16}),
       v16 = torch::randn({2, 24, 16});
  EXPECT_NE(causal_attention(q16, k16, v16).grad_fn()->name().find("CausalAttention"), std::string::npos);
  set_fused_kernels_enabled(false);
  EXPECT_EQ(causal_attention(q16, k16, v16).grad_fn()->name().find("CausalAttention"), std::string::npos);
  set_fused_kernels_enabled(true);
}

// On a GPU causal_attention is LibTorch's SDPA (flash / memory-efficient): the same values and gradients as the
// composite formula in float64.
TEST(CausalAttention, OnTheGpuSdpaMatchesTheCompositeFormula) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (a CPU build of LibTorch, or no GPU)";
  torch::manual_seed(7);
  for (const auto& [N, T, D] : {std::tuple{4, 100, 64}, std::tuple{2, 256, 32}}) {
    auto q = torch::randn({N, T, D}) * 0.5, k = torch::randn({N, T, D}), v = torch::randn({N, T, D});
    auto dy = torch::randn({N, T, D});
    auto got = run(q.cuda(), k.cuda(), v.cuda(), dy.cuda());
    auto want = run(q.to(torch::kFloat64), k.to(torch::kFloat64), v.to(torch::kFloat64), dy.to(torch::kFloat64));
    const std::string what = fmt::format("GPU N {} T {} D {}", N, T, D);
    expect_close(got.y.cpu(), want.y, what + " y");
    expect_close(got.dq.cpu(), want.dq, what + " dq");
    expect_close(got.dk.cpu(), want.dk, what + " dk");
    expect_close(got.dv.cpu(), want.dv, what + " dv");
  }
}

// Grouped-query attention: query head h of a sequence reads key/value head h / (H / KV) of that sequence, and the
// gradient of a shared head sums over its group. The reference gathers each query head's k/v head by index and runs
// the composite formula in float64; the CPU repeats the heads, a GPU reads them in place (SDPA's enable_gqa).
TEST(CausalAttention, GroupedQueryHeadsReadTheirGroupsKeyValueHead) {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA);
  const int64_t B = 2, H = 6, KV = 2, T = 40, D = 32;
  torch::manual_seed(11);
  auto q0 = torch::randn({B * H, T, D}) * 0.5, k0 = torch::randn({B * KV, T, D}), v0 = torch::randn({B * KV, T, D});
  auto dy = torch::randn({B * H, T, D});
  std::vector<int64_t> source;  // the k/v row each query row reads
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) source.push_back(b * KV + h / (H / KV));
  const auto index = torch::tensor(source);
  auto qr = q0.to(torch::kFloat64).set_requires_grad(true), kr = k0.to(torch::kFloat64).set_requires_grad(true),
       vr = v0.to(torch::kFloat64).set_requires_grad(true);
  causal_attention(qr, kr.index_select(0, index), vr.index_select(0, index)).backward(dy.to(torch::kFloat64));
  for (const auto& device : devices) {
    // Fresh leaves per device (to(kCPU) would hand back q0 itself, and then the GPU's copy would be no leaf).
    const auto leaf = [&](const torch::Tensor& t) { return t.detach().to(device).set_requires_grad(true); };
    auto q = leaf(q0), k = leaf(k0), v = leaf(v0);
    auto y = grouped_causal_attention(q, k, v, B);
    y.backward(dy.to(device));
    const std::string what = "GQA on " + device.str();
    auto yr = causal_attention(qr.detach(), kr.detach().index_select(0, index), vr.detach().index_select(0, index));
    expect_close(y.detach().cpu(), yr, what + " y");
    expect_close(q.grad().cpu(), qr.grad(), what + " dq");
    expect_close(k.grad().cpu(), kr.grad(), what + " dk (summed over the group)");
    expect_close(v.grad().cpu(), vr.grad(), what + " dv (summed over the group)");
  }
}
