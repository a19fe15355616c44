// RMS norm over rows, bf16 in and out, fp32 arithmetic:
// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * g.
// A block of NT threads per row; each thread reads VEC elements at a time
// (16-byte loads where VEC = 8); the sum of squares is reduced in registers,
// across the warp with shuffles, then across warps in shared memory.
// With RR > 0 (VEC = 8, H <= NT 8 RR) a thread holds its RR 16-byte pieces of the row, and of
// g, in registers: every load of the row is in flight at once, and the row is read once, not
// once for the sum and again for the output (the loop form's loads wait on each other, one
// round trip a piece).
#include <cuda_bf16.h>

#ifndef RR
#define RR 0
#endif

// A 16-byte piece of a row (8 bf16): its squares added to ss; and the piece normalised by inv
// and scaled by g's piece w, rounded to bf16. Shared by the loop and the register forms.
__device__ __forceinline__ void rms_add_squares(const uint4& v, float& ss) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(p[i]);
    ss += f.x * f.x + f.y * f.y;
  }
}
__device__ __forceinline__ uint4 rms_scale(const uint4& v, const uint4& w, float inv) {
  uint4 o;
  const __nv_bfloat162* pv = reinterpret_cast<const __nv_bfloat162*>(&v);
  const __nv_bfloat162* pw = reinterpret_cast<const __nv_bfloat162*>(&w);
  __nv_bfloat162* po = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 a = __bfloat1622float2(pv[i]), b = __bfloat1622float2(pw[i]);
    po[i] = __floats2bfloat162_rn(a.x * inv * b.x, a.y * inv * b.y);
  }
  return o;
}

extern "C" __global__ void __launch_bounds__(NT) rmsnorm(const __nv_bfloat16* __restrict__ x,
                                                         const __nv_bfloat16* __restrict__ g,
                                                         __nv_bfloat16* __restrict__ y, long long T, long long H,
                                                         float eps) {
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now
  kiln_wait_prior();  // ... and this one reads only once the kernel before it has ended
  const long long t = blockIdx.x;
  if (t >= T) return;
  const __nv_bfloat16* xr = x + t * H;
  __nv_bfloat16* yr = y + t * H;
#if RR > 0
  static_assert(VEC == 8, "RR: the row held in registers in 16-byte pieces (VEC = 8)");
  uint4 xv[RR], gv[RR];
#pragma unroll
  for (int r = 0; r < RR; ++r) {
    const long long h = (threadIdx.x + static_cast<long long>(r) * NT) * 8;
    xv[r] = h < H ? *reinterpret_cast<const uint4*>(xr + h) : make_uint4(0, 0, 0, 0);
    gv[r] = h < H ? *reinterpret_cast<const uint4*>(g + h) : make_uint4(0, 0, 0, 0);
  }
  float ss = 0.f;
#pragma unroll
  for (int r = 0; r < RR; ++r) rms_add_squares(xv[r], ss);
#else
  float ss = 0.f;
  if (VEC == 8) {
    for (long long h = threadIdx.x * 8; h < H; h += NT * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(xr + h);
      rms_add_squares(v, ss);
    }
  } else {
    for (long long h = threadIdx.x; h < H; h += NT) {
      float f = __bfloat162float(xr[h]);
      ss += f * f;
    }
  }
#endif
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float part[NT / 32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) total += part[w];
  const float inv = rsqrtf(total / static_cast<float>(H) + eps);
#if RR > 0
#pragma unroll
  for (int r = 0; r < RR; ++r) {
    const long long h = (threadIdx.x + static_cast<long long>(r) * NT) * 8;
    if (h >= H) break;
    *reinterpret_cast<uint4*>(yr + h) = rms_scale(xv[r], gv[r], inv);
  }
#else
  if (VEC == 8) {
    for (long long h = threadIdx.x * 8; h < H; h += NT * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(xr + h), w = *reinterpret_cast<const uint4*>(g + h);
      *reinterpret_cast<uint4*>(yr + h) = rms_scale(v, w, inv);
    }
  } else {
    for (long long h = threadIdx.x; h < H; h += NT)
      yr[h] = __float2bfloat16(__bfloat162float(xr[h]) * inv * __bfloat162float(g[h]));
  }
#endif
}
