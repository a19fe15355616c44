// Two row-softmax kernels for the softmax_multi multi-kernel.
#include <cmath>

void softmax_rowwise(kiln::program_id pid, const float* X, float* Y, int64_t M, int64_t N) {
  alignas(64) static thread_local float buf[16384];
  const int64_t r1 = (pid.x + 1) * ROWS < M ? (pid.x + 1) * ROWS : M;
  for (int64_t r = pid.x * ROWS; r < r1; ++r) {
    const float* x = X + r * N;
    float m = -INFINITY;
    for (int64_t j = 0; j < N; ++j) {
      buf[j] = x[j];
      m = buf[j] > m ? buf[j] : m;
    }
    float s = 0.f;
    for (int64_t j = 0; j < N; ++j) {
      buf[j] = std::exp(buf[j] - m);
      s += buf[j];
    }
    const float inv = 1.f / s;
    for (int64_t j = 0; j < N; ++j) Y[r * N + j] = buf[j] * inv;
  }
}

#ifdef BLOCK
void softmax_twopass(kiln::program_id pid, const float* X, float* Y, float* stats, int64_t M, int64_t N) {
  const int64_t r0 = pid.x * ROWS, r1 = r0 + ROWS < M ? r0 + ROWS : M;
  for (int64_t r = r0; r < r1; ++r) {  // pass 1: running max and sum, per chunk
    const float* x = X + r * N;
    float m = -INFINITY, s = 0.f;
    for (int64_t j0 = 0; j0 < N; j0 += BLOCK) {
      const int64_t jb = N - j0 < BLOCK ? N - j0 : BLOCK;
      float cm = -INFINITY;
      for (int64_t j = 0; j < jb; ++j) cm = x[j0 + j] > cm ? x[j0 + j] : cm;
      const float nm = cm > m ? cm : m;
      float cs = 0.f;
      for (int64_t j = 0; j < jb; ++j) cs += std::exp(x[j0 + j] - nm);
      s = s * std::exp(m - nm) + cs;
      m = nm;
    }
    stats[2 * r] = m;
    stats[2 * r + 1] = 1.f / s;
  }
  for (int64_t r = r0; r < r1; ++r) {  // pass 2: write
    const float m = stats[2 * r], inv = stats[2 * r + 1];
    for (int64_t j = 0; j < N; ++j) Y[r * N + j] = std::exp(X[r * N + j] - m) * inv;
  }
}
#endif
