// Dot products of the rows of A (M x K) with the rows of weights (N x K),
// as a linear layer stores them: a BM x BN tile of outputs per program
// instance, 8-wide vectors over K and 4 columns at a time in registers.
// Shared by linear_gated.cpp and linear_residual.cpp.
#pragma once
#include <cstring>

namespace kiln_linear {
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
// out[c] = sum_k a[k] * w[c * ldw + k] for c < nc (nc <= 4).
inline void dot4(const float* a, const float* w, int64_t ldw, int64_t K, int nc, float* out) {
  v8 acc[4] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const v8 va = load8(a + k);
    for (int c = 0; c < 4; ++c)
      if (c < nc) acc[c] += va * load8(w + c * ldw + k);
  }
  for (int c = 0; c < nc; ++c) {
    float s = hsum(acc[c]);
    for (int64_t kk = k; kk < K; ++kk) s += a[kk] * w[c * ldw + kk];
    out[c] = s;
  }
}
}  // namespace kiln_linear
