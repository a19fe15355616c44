// C = R + A . B^T, fp32; A is M x K, B N x K (as a linear layer stores it),
// R and C M x N: the down-projection of an MLP with its residual added.
#include "linear_nt.h"

void linear_residual(kiln::program_id pid, const float* A, const float* B, float* C, const float* R, int64_t M,
                     int64_t N, int64_t K) {
  const int64_t m0 = pid.y * BM, n0 = pid.x * BN;
  for (int64_t m = m0; m < m0 + BM && m < M; ++m)
    for (int64_t n = n0; n < n0 + BN && n < N; n += 4) {
      const int nc = static_cast<int>(N - n < 4 ? N - n : 4);
      float s[4];
      kiln_linear::dot4(A + m * K, B + n * K, K, K, nc, s);
      for (int c = 0; c < nc; ++c) C[m * N + n + c] = R[m * N + n + c] + s[c];
    }
}
