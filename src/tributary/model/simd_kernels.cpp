#include "tributary/model/simd_kernels.h"

#include <algorithm>

namespace tributary {

namespace {

// 8 floats: one AVX2 register (GCC's vector extension; this file is compiled with -mavx2 -mfma). Unaligned and
// allowed to alias the floats it is loaded from.
typedef float v8 __attribute__((vector_size(32), aligned(4), may_alias));

#define TRIB_INLINE inline __attribute__((always_inline))

// R rows x V vectors of C held in registers across the whole k loop: 6 x 2 = 12 accumulators, plus 2 loads of B and
// a broadcast, fit AVX2's 16 registers (the shape OpenBLAS's Haswell kernel uses too).
template <int R, int V>
TRIB_INLINE void tile(int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
                      int64_t ldc) {
  v8 s[R][V] = {};
  for (int64_t p = 0; p < k; ++p) {
    v8 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = *reinterpret_cast<const v8*>(b + p * ldb + 8 * v);
    for (int r = 0; r < R; ++r) {
      const float x = a[r * a_row + p * a_col];
      for (int v = 0; v < V; ++v) s[r][v] += x * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) *reinterpret_cast<v8*>(c + r * ldc + 8 * v) = s[r][v];
}

template <int R>
TRIB_INLINE void row_block(int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                           int64_t ldb, float* c, int64_t ldc) {
  for (int64_t c0 = 0; c0 < n; c0 += 16) tile<R, 2>(k, a, a_row, a_col, b + c0, ldb, c + c0, ldc);
}

typedef int32_t v8i __attribute__((vector_size(32)));

// exp on 8 lanes (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, 2^n from the exponent bits), accurate to
// about float precision (the tests hold the whole attention to 2e-5 of float64). Arguments below -87.3 (the softmax
// feeds x <= 0) return 0 rather than a denormal.
TRIB_INLINE v8 exp8(v8 x) {
  const auto underflow = x < -87.3f;
  x = underflow ? v8{} - 87.3f : x;
  x = x > 88.3f ? v8{} + 88.3f : x;
  v8 fx = x * 1.44269504088896341f + 0.5f;
  v8i n = __builtin_convertvector(fx, v8i);  // truncates toward 0
  v8 fn = __builtin_convertvector(n, v8);
  n = fn > fx ? n - 1 : n;  // floor
  fn = __builtin_convertvector(n, v8);
  x = x - fn * 0.693359375f - fn * -2.12194440e-4f;
  v8 y = x * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * x * x + x + 1.0f;
  const v8i bits = (n + 127) << 23;
  const v8 out = y * reinterpret_cast<const v8&>(bits);
  return underflow ? v8{} : out;
}

TRIB_INLINE float lane_sum(v8 v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

TRIB_INLINE float lane_max(v8 v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, v[i]);
  return m;
}

// sigmoid on 8 lanes through exp8; a lane past exp8's range saturates to 0 or 1 as std::exp's would.
TRIB_INLINE v8 sigmoid8(v8 a) { return 1.0f / (1.0f + exp8(v8{} - a)); }

// Applies body(i, n) to each full vector of [0, F) and to the tail zero-padded into one vector, so every element goes
// through the same arithmetic wherever it sits in the row.
template <typename Body>
TRIB_INLINE void for_each_vector(int64_t F, Body&& body) {
  const int64_t full = F / 8 * 8;
  for (int64_t i = 0; i < full; i += 8) body(i, 8);
  if (full < F) body(full, F - full);
}

TRIB_INLINE v8 load(const float* p, int64_t n) {
  if (n == 8) return *reinterpret_cast<const v8*>(p);
  v8 v{};
  for (int64_t j = 0; j < n; ++j) v[j] = p[j];
  return v;
}

TRIB_INLINE void store(float* p, v8 v, int64_t n) {
  if (n == 8) {
    *reinterpret_cast<v8*>(p) = v;
    return;
  }
  for (int64_t j = 0; j < n; ++j) p[j] = v[j];
}

}  // namespace

void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                int64_t ldb, float* c, int64_t ldc) {
  for (int64_t r0 = 0; r0 < m; r0 += 6) {
    const float* ar = a + r0 * a_row;
    float* cr = c + r0 * ldc;
    switch (std::min<int64_t>(6, m - r0)) {
      case 6:
        row_block<6>(n, k, ar, a_row, a_col, b, ldb, cr, ldc);
        break;
      case 5:
        row_block<5>(n, k, ar, a_row, a_col, b, ldb, cr, ldc);
        break;
      case 4:
        row_block<4>(n, k, ar, a_row, a_col, b, ldb, cr, ldc);
        break;
      case 3:
        row_block<3>(n, k, ar, a_row, a_col, b, ldb, cr, ldc);
        break;
      case 2:
        row_block<2>(n, k, ar, a_row, a_col, b, ldb, cr, ldc);
        break;
      default:
        row_block<1>(n, k, ar, a_row, a_col, b, ldb, cr, ldc);
        break;
    }
  }
}

void causal_softmax_rows(float* s, int64_t rows, int64_t ld, int64_t width, int64_t first_seen) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    const int64_t seen = first_seen + i, full = seen / 8 * 8;
    v8 mv = v8{} + row[0];
    for (int64_t j = 0; j < full; j += 8) {
      const v8 x = *reinterpret_cast<const v8*>(row + j);
      mv = x > mv ? x : mv;
    }
    float m = lane_max(mv);
    for (int64_t j = full; j < seen; ++j) m = std::max(m, row[j]);
    v8 sv{};
    for (int64_t j = 0; j < full; j += 8) {
      const v8 e = exp8(*reinterpret_cast<const v8*>(row + j) - m);
      *reinterpret_cast<v8*>(row + j) = e;
      sv += e;
    }
    float sum = lane_sum(sv);
    if (full < seen) {  // the tail through the same exp, on a zero-padded vector
      v8 t{};
      for (int64_t j = full; j < seen; ++j) t[j - full] = row[j] - m;
      const v8 e = exp8(t);
      for (int64_t j = full; j < seen; ++j) sum += (row[j] = e[j - full]);
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < seen; ++j) row[j] *= inv;
    for (int64_t j = seen; j < width; ++j) row[j] = 0.0f;
  }
}

void causal_softmax_backward_rows(float* g, const float* p, int64_t rows, int64_t ld, int64_t width,
                                  int64_t first_seen) {
  for (int64_t i = 0; i < rows; ++i) {
    float* gr = g + i * ld;
    const float* pr = p + i * ld;
    const int64_t seen = first_seen + i, full = seen / 8 * 8;
    v8 dv{};
    for (int64_t j = 0; j < full; j += 8)
      dv += *reinterpret_cast<const v8*>(gr + j) * *reinterpret_cast<const v8*>(pr + j);
    float dot = lane_sum(dv);
    for (int64_t j = full; j < seen; ++j) dot += gr[j] * pr[j];
    for (int64_t j = 0; j < seen; ++j) gr[j] = pr[j] * (gr[j] - dot);
    for (int64_t j = seen; j < width; ++j) gr[j] = 0.0f;
  }
}

void swiglu_rows(const float* h, float* y, int64_t rows, int64_t F) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = h + r * 2 * F;
    const float* b = a + F;
    float* yr = y + r * F;
    for_each_vector(F, [&](int64_t i, int64_t n) {
      const v8 av = load(a + i, n);
      store(yr + i, av * sigmoid8(av) * load(b + i, n), n);
    });
  }
}

void swiglu_backward_rows(const float* h, const float* g, float* gh, int64_t rows, int64_t F) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = h + r * 2 * F;
    const float* b = a + F;
    const float* gr = g + r * F;
    float* ga = gh + r * 2 * F;
    float* gb = ga + F;
    for_each_vector(F, [&](int64_t i, int64_t n) {
      const v8 av = load(a + i, n), gv = load(gr + i, n), sg = sigmoid8(av);
      store(gb + i, gv * av * sg, n);
      store(ga + i, gv * load(b + i, n) * sg * (1.0f + av * (1.0f - sg)), n);
    });
  }
}

}  // namespace tributary
