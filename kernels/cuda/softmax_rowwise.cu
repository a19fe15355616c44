// Row softmax, one block of BLOCK threads per row: the block reduces the
// row's max, then its sum of exponentials, then writes the row.
#include "block_reduce.cuh"

extern "C" __global__ void softmax_rowwise(const float* __restrict__ x, float* __restrict__ y, long long M,
                                           long long N) {
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  if (row >= M) return;
  const float* xr = x + row * N;
  float* yr = y + row * N;
  float m = NEG_INF;
  for (long long j = threadIdx.x; j < N; j += BLOCK) m = fmaxf(m, xr[j]);
  m = block_reduce<BLOCK, true>(m, scratch);
  float s = 0.f;
  for (long long j = threadIdx.x; j < N; j += BLOCK) s += expf(xr[j] - m);
  s = block_reduce<BLOCK, false>(s, scratch);
  const float inv = 1.f / s;
  for (long long j = threadIdx.x; j < N; j += BLOCK) yr[j] = expf(xr[j] - m) * inv;
}
