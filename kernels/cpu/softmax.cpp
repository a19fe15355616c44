// Row softmax for kiln's cpu backend, in two variants chosen by the WHOLE param.
#include <cmath>

static void softmax_row_whole(const float* __restrict x, float* __restrict y, int64_t n) {
  alignas(64) float buf[16384];
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    buf[j] = x[j];
    m = buf[j] > m ? buf[j] : m;
  }
  float s = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    buf[j] = std::exp(buf[j] - m);
    s += buf[j];
  }
  const float inv = 1.f / s;
  for (int64_t j = 0; j < n; ++j) y[j] = buf[j] * inv;
}

static void softmax_row_chunked(const float* __restrict x, float* __restrict y, int64_t n) {
  // Pass 1: running max and sum over chunks of BLOCK, rescaling the sum when the max grows.
  float m = -INFINITY, s = 0.f;
  for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
    const int64_t jb = n - j0 < BLOCK ? n - j0 : BLOCK;
    float cm = -INFINITY;
    for (int64_t j = 0; j < jb; ++j) cm = x[j0 + j] > cm ? x[j0 + j] : cm;
    const float nm = cm > m ? cm : m;
    float cs = 0.f;
    for (int64_t j = 0; j < jb; ++j) cs += std::exp(x[j0 + j] - nm);
    s = s * std::exp(m - nm) + cs;
    m = nm;
  }
  // Pass 2: write.
  const float inv = 1.f / s;
  for (int64_t j = 0; j < n; ++j) y[j] = std::exp(x[j] - m) * inv;
}

void softmax(kiln::program_id pid, const float* X, float* Y, int64_t M, int64_t N) {
  const int64_t r0 = pid.x * ROWS;
  const int64_t r1 = r0 + ROWS < M ? r0 + ROWS : M;
  for (int64_t r = r0; r < r1; ++r) {
#if WHOLE
    softmax_row_whole(X + r * N, Y + r * N, N);
#else
    softmax_row_chunked(X + r * N, Y + r * N, N);
#endif
  }
}
