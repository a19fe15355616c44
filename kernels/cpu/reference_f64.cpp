// Plain kernels in double, for programs' references (kiln run --check,
// docs/program.md): each written the obvious way, so that a reference
// built from them repeats none of the tuned kernels' tricks (fusion, tiles,
// reduced precision). One source, several entries: each spec names its own.
#include <cmath>

// Each spec sets its own entry's parameter; the others' take these values.
#ifndef COLS
#define COLS 8
#endif
#ifndef BLOCK
#define BLOCK 4096
#endif

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * g, a row a program instance.
void ref_rmsnorm(kiln::program_id pid, const double* x, const double* g, double* y, int64_t T, int64_t H, double eps) {
  const int64_t t = pid.x;
  if (t >= T) return;
  double ss = 0;
  for (int64_t h = 0; h < H; ++h) ss += x[t * H + h] * x[t * H + h];
  const double inv = 1 / std::sqrt(ss / static_cast<double>(H) + eps);
  for (int64_t h = 0; h < H; ++h) y[t * H + h] = x[t * H + h] * inv * g[h];
}

// C = A . B^T (A: M x K, B: N x K, as a linear layer stores its weights):
// COLS columns of C for every row a program instance, so B is read once.
void ref_linear_nt(kiln::program_id pid, const double* A, const double* B, double* C, int64_t M, int64_t N,
                   int64_t K) {
  for (int64_t n = pid.x * COLS; n < (pid.x + 1) * COLS && n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      // Four partial sums (the compiler may not reorder one sum of doubles):
      // a plain dot product that runs at a few GFLOP/s, not one at a time.
      double s[4] = {0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 4 <= K; k += 4)
        for (int j = 0; j < 4; ++j) s[j] += A[m * K + k + j] * B[n * K + k + j];
      for (; k < K; ++k) s[0] += A[m * K + k] * B[n * K + k];
      C[m * N + n] = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

// h = silu(a) * b, elementwise.
void ref_silu_mul(kiln::program_id pid, const double* a, const double* b, double* h, int64_t n) {
  for (int64_t i = pid.x * BLOCK; i < (pid.x + 1) * BLOCK && i < n; ++i) h[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
}

// y = a + b, elementwise.
void ref_add(kiln::program_id pid, const double* a, const double* b, double* y, int64_t n) {
  for (int64_t i = pid.x * BLOCK; i < (pid.x + 1) * BLOCK && i < n; ++i) y[i] = a[i] + b[i];
}
