// The inner loops of the fused kernels (the attention's, SwiGLU's), single-threaded (the caller parallelizes over
// heads or rows), compiled for AVX2 + FMA on x86-64.
//
// Why not the BLAS and libm: OpenBLAS reaches about a third of this machine's sgemm peak on products whose inner
// dimension is a head's 64, and it threads each call, so a kernel that splits its work over heads needs a multiply
// that stays on its thread; and scalar std::exp over the T^2 / 2 attention scores costs more than the products
// (over SwiGLU's gate, it made the fused SwiGLU slower than ATen's vectorized silu).
//
// The file is compiled with -mavx2 -mfma (CMakeLists.txt) while the rest of the build targets baseline x86-64 so the
// binaries run anywhere: call these only where simd_kernels_supported() is true, which is itself compiled for the
// baseline so no AVX instruction can run before the check.
#pragma once

#include <cstdint>

namespace tributary {

bool simd_kernels_supported();

inline constexpr int64_t kSmallGemmColumns = 16;  // small_gemm's n must be a multiple of this

//   C[m x n] = sum_k A(r, k) B[k, 0:n]     with A(r, k) = a[r * a_row + k * a_col]
// A is read element by element (any strides, so a transposed operand costs nothing); B and C are row-major with
// leading dimensions ldb and ldc; n must be a multiple of kSmallGemmColumns (callers pad). The sum over k runs in
// order 0..k-1 for every element whatever m and n are, so results do not depend on how a caller tiles its work.
void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                int64_t ldb, float* c, int64_t ldc);

// Causal softmax in place on `rows` rows (leading dimension ld) of a block: row i sees its first `first_seen + i`
// columns; the rest of the row up to `width` becomes 0.
void causal_softmax_rows(float* s, int64_t rows, int64_t ld, int64_t width, int64_t first_seen);

// Its backward in place: g (dP) becomes dS_j = P_j (g_j - sum_k g_k P_k) on the visible columns, 0 up to width.
void causal_softmax_backward_rows(float* g, const float* p, int64_t rows, int64_t ld, int64_t width,
                                  int64_t first_seen);

// SwiGLU on `rows` rows of h = [a | b] (2F floats each): y = a sigmoid(a) b (F floats per row).
void swiglu_rows(const float* h, float* y, int64_t rows, int64_t F);

// Its backward: g (dL/dy, F per row) gives gh = [g b sigma (1 + a (1 - sigma)) | g a sigma] (2F per row).
void swiglu_backward_rows(const float* h, const float* g, float* gh, int64_t rows, int64_t F);

}  // namespace tributary
