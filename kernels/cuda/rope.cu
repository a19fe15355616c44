// RoPE and the KV cache write of a decoder layer, bf16 (fp32 math).
// qkv [T, (HQ + 2 HKV) 128]: each row the query heads, then the key heads,
// then the value heads (one GEMM's output). Token t is at position S + t;
// dimensions d and d + 64 of a head turn by the angle pos * theta^(-d / 64)
// (rotate-half), the angle reduced modulo 2 pi in double before its sine and
// cosine are taken in float (an fp32 angle past a few thousand radians loses
// the digits that matter). q gets the turned queries; rows S + t of the
// caches [CAP, HKV, 128] get the turned keys and the values.
// Block (t, b): token t, heads b HB .. b HB + HB - 1 of the row (query, key, then value
// heads); thread i the dimensions i and i + 64 of each. The angle depends on the position and
// i alone, so a thread takes its sine and cosine once for its HB heads (the double-precision
// angle is most of a head's work). Param HB: heads a block.
// With V = 1 a thread moves 16 bytes at a time: thread 8 hh + k takes dims 8k .. 8k + 7 and
// their partners 64 + 8k .. 64 + 8k + 7 of heads j0 + hh, j0 + hh + 8, ... (HB a multiple of
// 8); the 64 angles are worked out once a block as before (thread i the angle of dim i) and
// shared through shared memory, and a thread's first loads are issued before them, so the
// angle's latency hides the loads'. The arithmetic is V = 0's, element for element.
#include <cuda_bf16.h>

#ifndef HB
#define HB 8
#endif
#ifndef V
#define V 0
#endif

// The sine and cosine of dimension i's angle at position pos: pos * theta^(-i / 64) in double,
// reduced to [-pi, pi] there, then taken in float.
__device__ __forceinline__ void rope_angle(long long pos, int i, float theta, float& s, float& c) {
  double a = static_cast<double>(pos) * exp2(log2(static_cast<double>(theta)) * (-i / 64.0));
  a -= rint(a * 0.15915494309189535) * 6.283185307179586;  // to [-pi, pi]
  sincosf(static_cast<float>(a), &s, &c);
}

extern "C" __global__ void __launch_bounds__(64) rope_cache(const __nv_bfloat16* __restrict__ qkv,
                                                           __nv_bfloat16* __restrict__ q, __nv_bfloat16* kc,
                                                           __nv_bfloat16* vc, long long T, long long S_arg, long long CAP,
                                                           long long HQ, long long HKV, float theta) {
  (void)CAP;
  const long long S = kiln_cell(S_arg);  // a program's cell holds it where the launch is sized for its bucket
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now
  kiln_wait_prior();  // ... and this one reads only once the kernel before it has ended
  const long long t = blockIdx.x, heads = HQ + 2 * HKV, j0 = static_cast<long long>(blockIdx.y) * HB;
  const int i = threadIdx.x;
  if (t >= T || j0 >= heads) return;
  const long long j1 = j0 + HB < heads ? j0 + HB : heads;
  const __nv_bfloat16* row = qkv + t * heads * 128;
#if V == 1
  static_assert(HB % 8 == 0, "V = 1: eight heads a round of the block's 64 threads");
  __shared__ float sn[64], cs[64];
  const int k = i & 7;
  long long j = j0 + (i >> 3);
  uint4 a = make_uint4(0, 0, 0, 0), b = a;  // dims 8k .. 8k + 7 and 64 + 8k .. 64 + 8k + 7 of head j
  if (j < j1) {
    a = *reinterpret_cast<const uint4*>(row + j * 128 + 8 * k);
    b = *reinterpret_cast<const uint4*>(row + j * 128 + 64 + 8 * k);
  }
  if (j0 < HQ + HKV) rope_angle(S + t, i, theta, sn[i], cs[i]);  // some head of the block turns
  __syncthreads();
  float s8[8] = {}, c8[8] = {};
  if (j0 < HQ + HKV)
#pragma unroll
    for (int e = 0; e < 8; ++e) s8[e] = sn[8 * k + e], c8[e] = cs[8 * k + e];
  for (; j < j1; j += 8) {
    uint4 na = a, nb = b;  // the next round's loads, in flight while this round computes
    if (j + 8 < j1) {
      na = *reinterpret_cast<const uint4*>(row + (j + 8) * 128 + 8 * k);
      nb = *reinterpret_cast<const uint4*>(row + (j + 8) * 128 + 64 + 8 * k);
    }
    if (j >= HQ + HKV) {  // a value head: copied
      __nv_bfloat16* out = vc + ((S + t) * HKV + (j - HQ - HKV)) * 128;
      *reinterpret_cast<uint4*>(out + 8 * k) = a;
      *reinterpret_cast<uint4*>(out + 64 + 8 * k) = b;
    } else {
      __nv_bfloat16* out = j < HQ ? q + (t * HQ + j) * 128 : kc + ((S + t) * HKV + (j - HQ)) * 128;
      const __nv_bfloat16* x0 = reinterpret_cast<const __nv_bfloat16*>(&a);
      const __nv_bfloat16* x1 = reinterpret_cast<const __nv_bfloat16*>(&b);
      uint4 oa, ob;
      __nv_bfloat16* y0 = reinterpret_cast<__nv_bfloat16*>(&oa);
      __nv_bfloat16* y1 = reinterpret_cast<__nv_bfloat16*>(&ob);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float f0 = __bfloat162float(x0[e]), f1 = __bfloat162float(x1[e]);
        y0[e] = __float2bfloat16(f0 * c8[e] - f1 * s8[e]);
        y1[e] = __float2bfloat16(f1 * c8[e] + f0 * s8[e]);
      }
      *reinterpret_cast<uint4*>(out + 8 * k) = oa;
      *reinterpret_cast<uint4*>(out + 64 + 8 * k) = ob;
    }
    a = na;
    b = nb;
  }
#else
  float s = 0.f, c = 1.f;
  if (j0 < HQ + HKV) rope_angle(S + t, i, theta, s, c);  // some head of the block turns
#pragma unroll 4
  for (long long j = j0; j < j1; ++j) {
    const __nv_bfloat16* in = row + j * 128;
    if (j >= HQ + HKV) {  // a value head: copied
      __nv_bfloat16* out = vc + ((S + t) * HKV + (j - HQ - HKV)) * 128;
      out[i] = in[i];
      out[i + 64] = in[i + 64];
      continue;
    }
    const float x0 = __bfloat162float(in[i]), x1 = __bfloat162float(in[i + 64]);
    __nv_bfloat16* out = j < HQ ? q + (t * HQ + j) * 128 : kc + ((S + t) * HKV + (j - HQ)) * 128;
    out[i] = __float2bfloat16(x0 * c - x1 * s);
    out[i + 64] = __float2bfloat16(x1 * c + x0 * s);
  }
#endif
}
