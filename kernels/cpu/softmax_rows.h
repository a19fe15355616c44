// Row-softmax building blocks shared by the softmax kernels.
#pragma once
#include <cmath>
#include <cstdint>

// The whole row at once: read into buf (n values), exponentiate, write.
static inline void softmax_row_whole(const float* __restrict x, float* __restrict y, int64_t n,
                                     float* __restrict buf) {
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

// One pass over the row in chunks of `block`: the max, and 1 / the sum of
// exp(x - max), with the sum rescaled whenever the max grows.
static inline void softmax_row_stats(const float* __restrict x, int64_t n, int64_t block, float* max_out,
                                     float* inv_sum_out) {
  float m = -INFINITY, s = 0.f;
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t jb = n - j0 < block ? n - j0 : block;
    float cm = -INFINITY;
    for (int64_t j = 0; j < jb; ++j) cm = x[j0 + j] > cm ? x[j0 + j] : cm;
    const float nm = cm > m ? cm : m;
    float cs = 0.f;
    for (int64_t j = 0; j < jb; ++j) cs += std::exp(x[j0 + j] - nm);
    s = s * std::exp(m - nm) + cs;
    m = nm;
  }
  *max_out = m;
  *inv_sum_out = 1.f / s;
}

static inline void softmax_row_write(const float* __restrict x, float* __restrict y, int64_t n, float m, float inv) {
  for (int64_t j = 0; j < n; ++j) y[j] = std::exp(x[j] - m) * inv;
}
