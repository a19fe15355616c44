// Y (R x Kp) = X (R x K) with the columns K..Kp-1 zero, bf16: an aligned copy
// of a matrix whose rows are not, for a GEMM that needs 16-byte rows. Each
// thread writes 8 elements of Y with one 16-byte store (Kp % 8 == 0 and Y
// 16-byte aligned: the spec's constraint) and reads X 2 bytes at a time.
#include <cuda_bf16.h>

extern "C" __global__ void __launch_bounds__(NT) pad_rows(const __nv_bfloat16* __restrict__ X,
                                                          __nv_bfloat16* __restrict__ Y, long long R, long long K,
                                                          long long Kp) {
  const long long chunks = Kp / 8;
  const long long idx = static_cast<long long>(blockIdx.x) * NT + threadIdx.x;
  if (idx >= R * chunks) return;
  const long long r = idx / chunks, c = idx % chunks * 8;
  const __nv_bfloat16* x = X + r * K;
  __align__(16) __nv_bfloat16 v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = c + k < K ? x[c + k] : __float2bfloat16_rn(0.f);
  *reinterpret_cast<uint4*>(Y + r * Kp + c) = *reinterpret_cast<const uint4*>(v);
}
