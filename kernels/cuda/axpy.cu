// out = alpha * x + y, elementwise. VEC values per thread (16-byte loads
// when VEC == 4 and every pointer is 16-byte aligned; scalar loads
// otherwise), BLOCK threads per block.
extern "C" __global__ void axpy(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out,
                                float alpha, long long n) {
  const long long i0 = (static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x) * VEC;
  if (i0 >= n) return;
  if (VEC == 4 && i0 + 3 < n &&
      ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y) |
        reinterpret_cast<unsigned long long>(out)) & 15) == 0) {
    const float4 a = *reinterpret_cast<const float4*>(x + i0);
    const float4 b = *reinterpret_cast<const float4*>(y + i0);
    *reinterpret_cast<float4*>(out + i0) =
        make_float4(alpha * a.x + b.x, alpha * a.y + b.y, alpha * a.z + b.z, alpha * a.w + b.w);
    return;
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k)
    if (i0 + k < n) out[i0 + k] = alpha * x[i0 + k] + y[i0 + k];
}
