#include "tributary/model/causal_attention.h"

#include <ATen/Parallel.h>

#include "tributary/core/error.h"
#include "tributary/model/fused_ops.h"
#include "tributary/model/simd_kernels.h"

namespace tributary {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

namespace {

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// x (T, D) -> out (D, ld) with columns >= T zero: the transposed operand small_gemm reads row-wise.
void transpose_padded(const float* x, int64_t T, int64_t D, int64_t ld, float* out) {
  for (int64_t d = 0; d < D; ++d) {
    float* o = out + d * ld;
    for (int64_t t = 0; t < T; ++t) o[t] = x[t * D + d];
    for (int64_t t = T; t < ld; ++t) o[t] = 0.0f;
  }
}

// One head's geometry. Probabilities (and, in the backward, dS) are kept as a (T x L) matrix, L = T rounded up to the
// kernel's width, of which only the lower triangle is computed: query block b (rows [r0, r0 + rows)) writes the
// columns [0, width), width = its last visible key rounded up to 16; the softmax zeroes what the block cannot see.
// Everything later reads only there: a key block starting at j0 (a multiple of 16) is read by query rows >= j0, whose
// blocks wrote at least j0 + 16 columns.
struct Head {
  int64_t T, D, L, height;
  int64_t width(int64_t r0, int64_t rows) const { return round_up(r0 + rows, kSmallGemmColumns); }
};

// y = softmax(mask(q k^T)) v for one head, probabilities into p (T x L).
void head_forward(const Head& h, const float* q, const float* k, const float* v, float* kt, float* p, float* y) {
  transpose_padded(k, h.T, h.D, h.L, kt);
  for (int64_t r0 = 0; r0 < h.T; r0 += h.height) {
    const int64_t rows = std::min(h.height, h.T - r0), w = h.width(r0, rows);
    float* pb = p + r0 * h.L;
    small_gemm(rows, w, h.D, q + r0 * h.D, h.D, 1, kt, h.L, pb, h.L);  // S = Q_b K^T
    causal_softmax_rows(pb, rows, h.L, w, r0 + 1);
    small_gemm(rows, h.D, r0 + rows, pb, h.L, 1, v, h.D, y + r0 * h.D, h.D);  // Y_b = P_b V
  }
}

// One head's backward. dS for all rows first, then dK and dV per key block over every query row that sees it, so
// each product runs over a long inner dimension and nothing accumulates across calls.
void head_backward(const Head& h, const float* q, const float* k, const float* v, const float* p, const float* dy,
                   float* vt, float* ds, float* dq, float* dk, float* dv) {
  const int64_t T = h.T, D = h.D, L = h.L;
  transpose_padded(v, T, D, L, vt);
  for (int64_t r0 = 0; r0 < T; r0 += h.height) {
    const int64_t rows = std::min(h.height, T - r0), w = h.width(r0, rows);
    small_gemm(rows, w, D, dy + r0 * D, D, 1, vt, L, ds + r0 * L, L);           // dP = dY_b V^T
    causal_softmax_backward_rows(ds + r0 * L, p + r0 * L, rows, L, w, r0 + 1);  // dS
    small_gemm(rows, D, r0 + rows, ds + r0 * L, L, 1, k, D, dq + r0 * D, D);    // dQ_b = dS_b K
  }
  for (int64_t j0 = 0; j0 < T; j0 += kSmallGemmColumns) {
    const int64_t keys = std::min(kSmallGemmColumns, T - j0), seen_by = T - j0;           // query rows j0..T-1 see them
    small_gemm(keys, D, seen_by, p + j0 * L + j0, 1, L, dy + j0 * D, D, dv + j0 * D, D);  // dV_j = P^T dY
    small_gemm(keys, D, seen_by, ds + j0 * L + j0, 1, L, q + j0 * D, D, dk + j0 * D, D);  // dK_j = dS^T Q
  }
}

struct CausalAttentionFn : public torch::autograd::Function<CausalAttentionFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, int64_t height) {
    auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const int64_t N = q.size(0), T = q.size(1), D = q.size(2);
    const Head h{T, D, round_up(T, kSmallGemmColumns), height};
    auto y = torch::empty_like(q);
    auto p = torch::empty({N, T, h.L}, q.options());
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *pp = p.data_ptr<float>();
    at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {  // heads are independent: any split, same bits
      std::vector<float> kt(D * h.L);
      for (int64_t n = n0; n < n1; ++n)
        head_forward(h, qp + n * T * D, kp + n * T * D, vp + n * T * D, kt.data(), pp + n * T * h.L, yp + n * T * D);
    });
    ctx->save_for_backward({q, k, v, p});
    ctx->saved_data["height"] = height;
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &p = saved[3];
    const int64_t N = q.size(0), T = q.size(1), D = q.size(2);
    const Head h{T, D, p.size(2), ctx->saved_data["height"].toInt()};
    auto dy = grads[0].contiguous();
    auto dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>(),
                *pp = p.data_ptr<float>(), *gp = dy.data_ptr<float>();
    float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
    at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
      std::vector<float> vt(D * h.L), ds(T * h.L);
      for (int64_t n = n0; n < n1; ++n) {
        const int64_t o = n * T * D;
        head_backward(h, qp + o, kp + o, vp + o, pp + n * T * h.L, gp + o, vt.data(), ds.data(), dqp + o, dkp + o,
                      dvp + o);
      }
    });
    return {dq, dk, dv, torch::Tensor()};
  }
};

}  // namespace

bool simd_kernels_supported() {  // here, not in simd_kernels.cpp: this file is compiled for the baseline ISA
#if defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return true;
#endif
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t block) {
  TRIB_CHECK(q.dim() == 3 && q.sizes() == k.sizes() && q.sizes() == v.sizes(),
             "causal_attention: q, k, v must share one (N, T, D) shape");
  const bool fused = fused_kernels_apply(q) && fused_kernels_apply(k) && fused_kernels_apply(v) &&
                     q.size(2) % kSmallGemmColumns == 0 && simd_kernels_supported();
  // PyTorch's fused (flash / memory-efficient) attention, which skips the masked half too: on a GPU, and on the CPU
  // for long sequences, where it beats the kernel below (header). q already carries the scale; (1, N, T, D) is the
  // 4-d layout the flash kernel takes.
  const bool on_gpu = q.is_cuda() && fused_kernels_enabled();
  if (on_gpu || (fused && q.size(1) >= kCpuSdpaFromLength)) {
    return at::scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), {}, 0.0,
                                            /*is_causal=*/true, /*scale=*/1.0)
        .squeeze(0);
  }
  if (fused) {
    TRIB_CHECK(block >= 0 && block % kSmallGemmColumns == 0, "causal_attention: block {} is not a multiple of {}",
               block, kSmallGemmColumns);
    return CausalAttentionFn::apply(q, k, v, block > 0 ? block : kCausalAttentionBlock);
  }
  return torch::bmm(causal_softmax(torch::bmm(q, k.transpose(1, 2))), v);
}

torch::Tensor grouped_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       int64_t batch) {
  if (k.size(0) == q.size(0)) return causal_attention(q, k, v);
  const int64_t B = batch, H = q.size(0) / B, KV = k.size(0) / B, T = q.size(1), D = q.size(2);
  TRIB_CHECK(B > 0 && H * B == q.size(0) && KV * B == k.size(0) && KV > 0 && H % KV == 0 && k.sizes() == v.sizes(),
             "grouped_causal_attention: q {} and k {} are not batch {} x H and x KV heads with KV dividing H",
             c10::str(q.sizes()), c10::str(k.sizes()), batch);
  if (q.is_cuda() && fused_kernels_enabled()) {
    return at::scaled_dot_product_attention(q.view({B, H, T, D}), k.view({B, KV, T, D}), v.view({B, KV, T, D}), {}, 0.0,
                                            /*is_causal=*/true, /*scale=*/1.0, /*enable_gqa=*/true)
        .reshape({B * H, T, D});
  }
  const auto repeat = [&](const torch::Tensor& t) {
    return t.view({B, KV, 1, T, D}).expand({B, KV, H / KV, T, D}).reshape({B * H, T, D});
  };
  return causal_attention(q, repeat(k), repeat(v));
}

}  // namespace tributary
