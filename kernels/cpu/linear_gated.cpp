// The gated up-projection of an MLP: C = silu(A . Bg^T) * (A . Bu^T), fp32;
// A is M x K, the weights N x K (as a linear layer stores them), C M x N.
#include <cmath>

#include "linear_nt.h"

void linear_gated(kiln::program_id pid, const float* A, const float* Bg, const float* Bu, float* C, int64_t M,
                  int64_t N, int64_t K) {
  const int64_t m0 = pid.y * BM, n0 = pid.x * BN;
  for (int64_t m = m0; m < m0 + BM && m < M; ++m)
    for (int64_t n = n0; n < n0 + BN && n < N; n += 4) {
      const int nc = static_cast<int>(N - n < 4 ? N - n : 4);
      float g[4], u[4];
      kiln_linear::dot4(A + m * K, Bg + n * K, K, K, nc, g);
      kiln_linear::dot4(A + m * K, Bu + n * K, K, K, nc, u);
      for (int c = 0; c < nc; ++c) C[m * N + n + c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
    }
}
