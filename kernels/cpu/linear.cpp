// A linear layer on the cpu backend, C = epilogue(A . B^T) in fp32: A is M x K, the
// weight B N x K (as a linear layer stores it), C M x N. The family
// kernels/cpu/linear.toml: each member is one GEMM problem, and kiln compiles this
// file with its defines (GEMM_DTYPE, GEMM_LAYOUT, GEMM_EPILOGUE, set to kiln's named
// constants; docs/families.md). The epilogue runs on the fp32 sums:
//   GEMM_EPI_NONE       C = A.B^T
//   GEMM_EPI_BIAS       C = A.B^T + bias[n]
//   GEMM_EPI_RESIDUAL   C = A.B^T + R[m,n]
//   GEMM_EPI_SILU       C = silu(A.B^T)
//   GEMM_EPI_GELU       C = gelu(A.B^T), the erf form
//   GEMM_EPI_BIAS_GELU  C = gelu(A.B^T + bias[n])
//   GEMM_EPI_GATED      C = silu(A.Bg^T) * (A.Bu^T), two weights, one pass over A
// With the RMSNorm prologue (GEMM_RMSNORM 1), A's rows are first divided by their root mean
// square (+ eps) and multiplied by the gain g[K], into a row of scratch, then multiplied.
// A program instance computes a BM x BN tile: 8-wide vectors over K, 4 columns at a
// time in registers.
#include <cmath>
#include <cstring>
#include <vector>

#if !defined(GEMM_DTYPE) || !defined(GEMM_EPILOGUE) || !defined(GEMM_RMSNORM)
#error "linear.cpp: compile it as a member of kernels/cpu/linear.toml (linear.toml:f32_nt), which defines its problem"
#endif
#if GEMM_DTYPE != GEMM_DTYPE_F32 || GEMM_LAYOUT != GEMM_LAYOUT_NT
#error "linear.cpp: fp32 and a weight stored N x K (nt) only"
#endif
#define GATED (GEMM_EPILOGUE == GEMM_EPI_GATED)
#define HAS_BIAS (GEMM_EPILOGUE == GEMM_EPI_BIAS || GEMM_EPILOGUE == GEMM_EPI_BIAS_GELU)
#define HAS_GELU (GEMM_EPILOGUE == GEMM_EPI_GELU || GEMM_EPILOGUE == GEMM_EPI_BIAS_GELU)

namespace {
typedef float v8 __attribute__((vector_size(32)));
inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float hsum(v8 v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}
// out[c] = sum_k a[k] * w[c * K + k] for c < nc (nc <= 4).
inline void dot4(const float* a, const float* w, int64_t K, int nc, float* out) {
  v8 acc[4] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const v8 va = load8(a + k);
    for (int c = 0; c < 4; ++c)
      if (c < nc) acc[c] += va * load8(w + c * K + k);
  }
  for (int c = 0; c < nc; ++c) {
    float s = hsum(acc[c]);
    for (int64_t kk = k; kk < K; ++kk) s += a[kk] * w[c * K + kk];
    out[c] = s;
  }
}
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
}  // namespace

// The arguments are the problem's, in its order: A[, g], B (gated: Bg, Bu), C, then bias or R, then M, N, K[, eps].
void linear(kiln::program_id pid, const float* A,
#if GEMM_RMSNORM
            const float* g,
#endif
#if GATED
            const float* B, const float* Bu,
#else
            const float* B,
#endif
            float* C,
#if HAS_BIAS
            const float* bias,
#elif GEMM_EPILOGUE == GEMM_EPI_RESIDUAL
            const float* R,
#endif
            int64_t M, int64_t N, int64_t K
#if GEMM_RMSNORM
            , float eps
#endif
) {
  const int64_t m0 = pid.y * BM, n0 = pid.x * BN;
#if GEMM_RMSNORM
  thread_local std::vector<float> normed;  // row m of A through the norm
  normed.resize(static_cast<size_t>(K));
#endif
  for (int64_t m = m0; m < m0 + BM && m < M; ++m) {
#if GEMM_RMSNORM
    float ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += A[m * K + k] * A[m * K + k];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(K) + eps);
    for (int64_t k = 0; k < K; ++k) normed[static_cast<size_t>(k)] = A[m * K + k] * r * g[k];
    const float* a = normed.data();
#else
    const float* a = A + m * K;
#endif
    for (int64_t n = n0; n < n0 + BN && n < N; n += 4) {
      const int nc = static_cast<int>(N - n < 4 ? N - n : 4);
      float s[4];
      dot4(a, B + n * K, K, nc, s);
#if GATED
      float u[4];
      dot4(a, Bu + n * K, K, nc, u);
#endif
      for (int c = 0; c < nc; ++c) {
        float v = s[c];
#if HAS_BIAS
        v += bias[n + c];
#elif GEMM_EPILOGUE == GEMM_EPI_RESIDUAL
        v += R[m * N + n + c];
#endif
#if GATED
        v = silu(v) * u[c];
#elif GEMM_EPILOGUE == GEMM_EPI_SILU
        v = silu(v);
#elif HAS_GELU
        v = gelu(v);
#endif
        C[m * N + n + c] = v;
      }
    }
  }
}
