// Row softmax, one warp per row, WARPS rows per block: for short rows, where
// a block per row would leave most of its threads idle.
#include "block_reduce.cuh"

extern "C" __global__ void softmax_warp(const float* __restrict__ x, float* __restrict__ y, long long M, long long N) {
  const long long row = static_cast<long long>(blockIdx.x) * WARPS + (threadIdx.x >> 5);
  if (row >= M) return;
  const int lane = threadIdx.x & 31;
  const float* xr = x + row * N;
  float* yr = y + row * N;
  float m = NEG_INF;
  for (long long j = lane; j < N; j += 32) m = fmaxf(m, xr[j]);
  m = warp_max(m);
  float s = 0.f;
  for (long long j = lane; j < N; j += 32) s += expf(xr[j] - m);
  s = warp_sum(s);
  const float inv = 1.f / s;
  for (long long j = lane; j < N; j += 32) yr[j] = expf(xr[j] - m) * inv;
}
