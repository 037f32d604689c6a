#include "tributary/model/fused_ops.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>

#include "tributary/core/error.h"
#include "tributary/model/simd_kernels.h"

namespace tributary {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

namespace {

std::atomic<bool> g_fused_enabled{true};

// Splits [0, n) into one chunk per thread (at most n) so reductions add partial sums in a fixed order: results
// are bit-identical for a given thread count, which resume-determinism relies on.
template <typename F>
void parallel_chunks(int64_t n, F&& body) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) body(c, n * c / chunks, n * (c + 1) / chunks);
  });
}

int64_t num_chunks(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads())); }

// ---------------------------------------------------------------------------------------------------- RMSNorm
struct RMSNormFn : public torch::autograd::Function<RMSNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& w_in, double eps) {
    auto x = x_in.contiguous();
    auto w = w_in.contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    auto y = torch::empty_like(x);
    auto inv = torch::empty({rows}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* ip = inv.data_ptr<float>();
    const float feps = static_cast<float>(eps);
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* __restrict xr = xp + r * C;
        float* __restrict yr = yp + r * C;
        float ss = 0;
        for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
        const float s = 1.0f / std::sqrt(ss / static_cast<float>(C) + feps);
        ip[r] = s;
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s * wp[c];
      }
    });
    ctx->save_for_backward({x, w, inv});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], w = saved[1], inv = saved[2];
    auto g = grads[0].contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    auto gx = torch::empty_like(x);
    const int64_t chunks = num_chunks(rows);
    auto gw_partial = torch::zeros({chunks, C}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* ip = inv.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* gxp = gx.data_ptr<float>();
    float* gwp = gw_partial.data_ptr<float>();
    // y = x * s * w with s = (mean(x^2) + eps)^-1/2:
    //   dL/dw_c = sum_r g_rc x_rc s_r;  dL/dx_rc = s_r (g_rc w_c - x_rc s_r^2 mean_k(g_rk w_k x_rk))
    parallel_chunks(rows, [&](int64_t chunk, int64_t r0, int64_t r1) {
      float* __restrict gw = gwp + chunk * C;
      for (int64_t r = r0; r < r1; ++r) {
        const float* __restrict xr = xp + r * C;
        const float* __restrict gr = gp + r * C;
        float* __restrict gxr = gxp + r * C;
        const float s = ip[r];
        float dot = 0;
        for (int64_t c = 0; c < C; ++c) {
          dot += gr[c] * wp[c] * xr[c];
          gw[c] += gr[c] * xr[c] * s;
        }
        const float k = s * s * dot / static_cast<float>(C);
        for (int64_t c = 0; c < C; ++c) gxr[c] = s * (gr[c] * wp[c] - xr[c] * k);
      }
    });
    return {gx, gw_partial.sum(0), torch::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------------- SwiGLU
inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

struct SwiGLUFn : public torch::autograd::Function<SwiGLUFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h_in) {
    auto h = h_in.contiguous();
    const int64_t F2 = h.size(-1), F = F2 / 2, rows = h.numel() / F2;
    auto out_sizes = h.sizes().vec();
    out_sizes.back() = F;
    auto y = torch::empty(out_sizes, h.options());
    const float* hp = h.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const bool simd = simd_kernels_supported();
    at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
      if (simd) return swiglu_rows(hp + r0 * F2, yp + r0 * F, r1 - r0, F);
      for (int64_t r = r0; r < r1; ++r) {
        const float* __restrict a = hp + r * F2;
        const float* __restrict b = a + F;
        float* __restrict yr = yp + r * F;
        for (int64_t i = 0; i < F; ++i) yr[i] = a[i] * sigmoid(a[i]) * b[i];
      }
    });
    ctx->save_for_backward({h});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto h = ctx->get_saved_variables()[0];
    auto g = grads[0].contiguous();
    const int64_t F2 = h.size(-1), F = F2 / 2, rows = h.numel() / F2;
    auto gh = torch::empty_like(h);
    const float* hp = h.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* ghp = gh.data_ptr<float>();
    // y = silu(a) b:  dy/da = b sigma(a) (1 + a (1 - sigma(a))),  dy/db = silu(a)
    const bool simd = simd_kernels_supported();
    at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
      if (simd) return swiglu_backward_rows(hp + r0 * F2, gp + r0 * F, ghp + r0 * F2, r1 - r0, F);
      for (int64_t r = r0; r < r1; ++r) {
        const float* __restrict a = hp + r * F2;
        const float* __restrict b = a + F;
        const float* __restrict gr = gp + r * F;
        float* __restrict ga = ghp + r * F2;
        float* __restrict gb = ga + F;
        for (int64_t i = 0; i < F; ++i) {
          const float sg = sigmoid(a[i]);
          gb[i] = gr[i] * a[i] * sg;
          ga[i] = gr[i] * b[i] * sg * (1.0f + a[i] * (1.0f - sg));
        }
      }
    });
    return {gh};
  }
};

// ---------------------------------------------------------------------------------------------------- heads + RoPE
// Copies one head vector of length D, rotating it when cos is given: out = x*cos + rotate_half(x)*sin.
inline void rope_forward(const float* __restrict x, float* __restrict out, const float* __restrict cs,
                         const float* __restrict sn, int64_t D) {
  const int64_t half = D / 2;
  if (!cs) {
    for (int64_t i = 0; i < D; ++i) out[i] = x[i];
    return;
  }
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cs[i] - x[i + half] * sn[i];
  for (int64_t i = half; i < D; ++i) out[i] = x[i] * cs[i] + x[i - half] * sn[i];
}

// Transpose of rope_forward: gx_j = g_j cos_j + (j < D/2 ? g_{j+D/2} sin_{j+D/2} : -g_{j-D/2} sin_{j-D/2}).
inline void rope_backward(const float* __restrict g, float* __restrict gx, const float* __restrict cs,
                          const float* __restrict sn, int64_t D) {
  const int64_t half = D / 2;
  if (!cs) {
    for (int64_t i = 0; i < D; ++i) gx[i] = g[i];
    return;
  }
  for (int64_t j = 0; j < half; ++j) gx[j] = g[j] * cs[j] + g[j + half] * sn[j + half];
  for (int64_t j = half; j < D; ++j) gx[j] = g[j] * cs[j] - g[j - half] * sn[j - half];
}

struct SplitHeadsRopeFn : public torch::autograd::Function<SplitHeadsRopeFn> {
  // A row of qkv is [q: H heads | k: KV heads | v: KV heads] of D values each (KV < H: grouped-query attention).
  // cos/sin: (T, D), or empty tensors (numel 0) for no rotation. Autograd Functions need defined tensor arguments.
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& qkv_in, int64_t H, int64_t KV,
                             const torch::Tensor& cos, const torch::Tensor& sin, double q_scale) {
    auto qkv = qkv_in.contiguous();
    const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2), D = W / (H + 2 * KV);
    const int64_t heads[3] = {H, KV, KV}, offset[3] = {0, H * D, (H + KV) * D};
    auto opts = qkv.options();
    tensor_list out = {torch::empty({B * H, T, D}, opts), torch::empty({B * KV, T, D}, opts),
                       torch::empty({B * KV, T, D}, opts)};
    auto cosc = cos.contiguous();
    auto sinc = sin.contiguous();
    const float qs = static_cast<float>(q_scale);
    const float* src = qkv.data_ptr<float>();
    const float* cp = cosc.numel() > 0 ? cosc.data_ptr<float>() : nullptr;
    const float* sp = sinc.numel() > 0 ? sinc.data_ptr<float>() : nullptr;
    float* dst[3] = {out[0].data_ptr<float>(), out[1].data_ptr<float>(), out[2].data_ptr<float>()};
    at::parallel_for(0, B * T, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / T, t = i % T;
        const float* row = src + i * W;
        for (int64_t part = 0; part < 3; ++part) {
          const bool rotate = part < 2 && cp;
          for (int64_t h = 0; h < heads[part]; ++h) {
            float* o = dst[part] + ((b * heads[part] + h) * T + t) * D;
            rope_forward(row + offset[part] + h * D, o, rotate ? cp + t * D : nullptr, rotate ? sp + t * D : nullptr,
                         D);
            if (part == 0 && qs != 1.0f)
              for (int64_t d = 0; d < D; ++d) o[d] *= qs;
          }
        }
      }
    });
    ctx->save_for_backward({cosc, sinc});
    ctx->saved_data["B"] = B;
    ctx->saved_data["T"] = T;
    ctx->saved_data["H"] = H;
    ctx->saved_data["KV"] = KV;
    ctx->saved_data["D"] = D;
    ctx->saved_data["q_scale"] = q_scale;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    auto cos = saved[0], sin = saved[1];
    const int64_t B = ctx->saved_data["B"].toInt(), T = ctx->saved_data["T"].toInt(), H = ctx->saved_data["H"].toInt();
    const int64_t KV = ctx->saved_data["KV"].toInt(), D = ctx->saved_data["D"].toInt(), W = (H + 2 * KV) * D;
    const int64_t heads[3] = {H, KV, KV}, offset[3] = {0, H * D, (H + KV) * D};
    const float qs = static_cast<float>(ctx->saved_data["q_scale"].toDouble());
    torch::Tensor g[3];
    for (int p = 0; p < 3; ++p)
      if (grads[p].defined()) g[p] = grads[p].contiguous();
    auto gqkv = torch::zeros({B, T, W}, g[0].defined() ? g[0].options() : g[2].options());
    const float* cp = cos.numel() > 0 ? cos.data_ptr<float>() : nullptr;
    const float* sp = sin.numel() > 0 ? sin.data_ptr<float>() : nullptr;
    const float* gp[3] = {g[0].defined() ? g[0].data_ptr<float>() : nullptr,
                          g[1].defined() ? g[1].data_ptr<float>() : nullptr,
                          g[2].defined() ? g[2].data_ptr<float>() : nullptr};
    float* dst = gqkv.data_ptr<float>();
    at::parallel_for(0, B * T, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / T, t = i % T;
        float* row = dst + i * W;
        for (int64_t part = 0; part < 3; ++part) {
          if (!gp[part]) continue;
          const bool rotate = part < 2 && cp;
          for (int64_t h = 0; h < heads[part]; ++h) {
            const float* gi = gp[part] + ((b * heads[part] + h) * T + t) * D;
            float* o = row + offset[part] + h * D;
            rope_backward(gi, o, rotate ? cp + t * D : nullptr, rotate ? sp + t * D : nullptr, D);
            if (part == 0 && qs != 1.0f)
              for (int64_t d = 0; d < D; ++d) o[d] *= qs;
          }
        }
      }
    });
    return {gqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------------- causal softmax
// Row i of each (T, T) score matrix attends to columns j <= i. Masked entries are never read and are written as 0,
// which saves the mask pass and half of the exp work of softmax(scores + mask).
struct CausalSoftmaxFn : public torch::autograd::Function<CausalSoftmaxFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& s_in) {
    auto s = s_in.contiguous();
    const int64_t T = s.size(-1), rows = s.numel() / T, Tq = s.size(-2);
    auto y = torch::empty_like(s);
    const float* sp = s.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = (r % Tq) + 1 + (T - Tq);  // visible columns of this query row
        const float* __restrict sr = sp + r * T;
        float* __restrict yr = yp + r * T;
        float m = sr[0];
        for (int64_t j = 1; j < n; ++j) m = std::max(m, sr[j]);
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          yr[j] = std::exp(sr[j] - m);
          sum += yr[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
        for (int64_t j = n; j < T; ++j) yr[j] = 0.0f;
      }
    });
    ctx->save_for_backward({y});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto y = ctx->get_saved_variables()[0];
    auto g = grads[0].contiguous();
    const int64_t T = y.size(-1), rows = y.numel() / T, Tq = y.size(-2);
    auto gs = torch::empty_like(y);
    const float* yp = y.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* gsp = gs.data_ptr<float>();
    // d softmax: gs_j = y_j (g_j - sum_k g_k y_k) over the visible columns; masked columns get 0.
    at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = (r % Tq) + 1 + (T - Tq);
        const float* __restrict yr = yp + r * T;
        const float* __restrict gr = gp + r * T;
        float* __restrict out = gsp + r * T;
        float dot = 0;
        for (int64_t j = 0; j < n; ++j) dot += gr[j] * yr[j];
        for (int64_t j = 0; j < n; ++j) out[j] = yr[j] * (gr[j] - dot);
        for (int64_t j = n; j < T; ++j) out[j] = 0.0f;
      }
    });
    return {gs};
  }
};

}  // namespace

bool fused_kernels_apply(const torch::Tensor& t) {
  return g_fused_enabled.load() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
}

void set_fused_kernels_enabled(bool enabled) { g_fused_enabled = enabled; }

bool fused_kernels_enabled() { return g_fused_enabled.load(); }

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (fused_kernels_apply(x) && fused_kernels_apply(weight)) return RMSNormFn::apply(x, weight, eps);
  // On a GPU ATen's own (one fused kernel each way where the LibTorch has it, PyTorch >= 2.8).
  if (x.is_cuda() && fused_kernels_enabled()) return at::rms_norm(x, {x.size(-1)}, weight, eps);
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

torch::Tensor swiglu(const torch::Tensor& h) {
  if (fused_kernels_apply(h)) return SwiGLUFn::apply(h);
  auto parts = h.chunk(2, -1);
  return torch::silu(parts[0]) * parts[1];
}

torch::Tensor causal_softmax(const torch::Tensor& scores) {
  if (fused_kernels_apply(scores)) return CausalSoftmaxFn::apply(scores);
  const int64_t Tq = scores.size(-2), T = scores.size(-1);
  auto visible = torch::ones({Tq, T}, scores.options().dtype(torch::kBool)).tril(T - Tq);
  return torch::softmax(scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity()), -1);
}

std::array<torch::Tensor, 3> split_heads_rope(const torch::Tensor& qkv, int64_t num_heads, const torch::Tensor& cos,
                                              const torch::Tensor& sin, double q_scale, int64_t num_kv_heads) {
  const int64_t H = num_heads, KV = num_kv_heads > 0 ? num_kv_heads : H;
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (H + 2 * KV);
  TRIB_CHECK(qkv.size(2) == (H + 2 * KV) * D,
             "split_heads_rope: qkv width {} is not (H + 2 KV) * D with H = {}, KV = {}", qkv.size(2), H, KV);
  if (fused_kernels_apply(qkv)) {
    auto none = torch::empty({0}, qkv.options());
    torch::Tensor c = cos.defined() ? cos.narrow(0, 0, T) : none, s = sin.defined() ? sin.narrow(0, 0, T) : none;
    auto out = SplitHeadsRopeFn::apply(qkv, H, KV, c, s, q_scale);
    return {out[0], out[1], out[2]};
  }
  auto parts = qkv.split({H * D, KV * D, KV * D}, -1);
  auto heads = [&](const torch::Tensor& x, int64_t n) { return x.view({B, T, n, D}).transpose(1, 2); };  // (B, n, T, D)
  auto q = heads(parts[0], H), k = heads(parts[1], KV), v = heads(parts[2], KV);
  if (cos.defined()) {
    auto c = cos.narrow(0, 0, T), s = sin.narrow(0, 0, T);
    auto rotate = [&](const torch::Tensor& x) {
      auto x1 = x.narrow(-1, 0, D / 2), x2 = x.narrow(-1, D / 2, D / 2);
      return x * c + torch::cat({-x2, x1}, -1) * s;
    };
    q = rotate(q);
    k = rotate(k);
  }
  if (q_scale != 1.0) q = q * q_scale;
  return {q.reshape({B * H, T, D}), k.reshape({B * KV, T, D}), v.reshape({B * KV, T, D})};
}

}  // namespace tributary
