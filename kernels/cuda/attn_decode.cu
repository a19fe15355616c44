// Decode attention over a KV cache (flash-decoding), bf16 in and out, fp32 math; the
// algorithm of kernels/cpu/attention.cpp (its comment has the layouts):
//   q [T, HQ, 128]; k_cache, v_cache [CAP, HKV, 128]; token i (position S + i) sees keys
//   0 .. S+i; query head hq reads KV head hq / (HQ / HKV).
// attn_part: block (h, c) takes keys [c CHUNK, (c+1) CHUNK) of KV head h for its R = T G
//   rows (G = HQ / HKV query heads a KV head), RB rows at a time. Warp w takes keys
//   w, w + NW, ... of the chunk, UNROLL at a time (their loads in flight together): lane l
//   holds dims 4l .. 4l+3, so a key's 256 bytes are one coalesced load; a row's score is
//   a warp sum; each warp keeps an online softmax (max m, sum l, 4 dims of the output) a
//   row. The warps' rows are then merged through shared memory and written as the split's
//   partial rows (fp32: the output unnormalised, m, l): part[((c T + i) HQ + hq) 130 + ...].
// attn_combine: block r (a token and query head), a thread a dim: the splits' rows
//   rescaled to the largest m, summed, and divided by their sum.
// Params: NW warps a block, RB rows a pass (registers: 10 a row a lane), UNROLL keys a warp
// has in flight.
#include <cuda_bf16.h>

#define AD_D 128
#define AD_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float ad_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ void ad_load4(const __nv_bfloat16* p, float (&f)[4]) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

#ifdef NW  // attn_part_bf16.toml's params (attn_combine_bf16.toml compiles this file without them)
extern "C" __global__ void __launch_bounds__(NW * 32)
    attn_part(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kc,
              const __nv_bfloat16* __restrict__ vc, float* __restrict__ part, long long T, long long S, long long CAP,
              long long HQ, long long HKV, long long CHUNK) {
  (void)CAP;
  __shared__ float sm[NW][RB][AD_D + 2];
  const int h = blockIdx.x, w = threadIdx.x >> 5, l = threadIdx.x & 31;
  const long long c = blockIdx.y, G = HQ / HKV, R = T * G;
  const long long j0 = c * CHUNK, j1 = min(j0 + CHUNK, S + T);
  const float scale = 1.4426950408889634f / sqrtf(static_cast<float>(AD_D));  // scores in log2 units
  for (long long r0 = 0; r0 < R; r0 += RB) {
    float qv[RB][4], acc[RB][4], m[RB], sum[RB];
    long long last[RB];  // the last key row r sees
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      const long long rr = r0 + r, i = rr / G, hq = h * G + rr % G;
      last[r] = rr < R ? S + i : -1;
      if (rr < R) {
        ad_load4(q + (i * HQ + hq) * AD_D + 4 * l, qv[r]);
      } else {
        qv[r][0] = qv[r][1] = qv[r][2] = qv[r][3] = 0.f;
      }
#pragma unroll
      for (int d = 0; d < 4; ++d) qv[r][d] *= scale, acc[r][d] = 0.f;
      m[r] = AD_NEG_INF;
      sum[r] = 0.f;
    }
    for (long long jb = j0 + w; jb < j1; jb += NW * UNROLL) {
      float kf[UNROLL][4], vf[UNROLL][4];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const long long j = jb + static_cast<long long>(u) * NW;
        if (j < j1) {
          ad_load4(kc + (j * HKV + h) * AD_D + 4 * l, kf[u]);
          ad_load4(vc + (j * HKV + h) * AD_D + 4 * l, vf[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const long long j = jb + static_cast<long long>(u) * NW;
        if (j >= j1) break;
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          if (j > last[r]) continue;  // causal (and rows past R): the same for the whole warp
          const float s = ad_warp_sum(qv[r][0] * kf[u][0] + qv[r][1] * kf[u][1] + qv[r][2] * kf[u][2] +
                                      qv[r][3] * kf[u][3]);
          const float mn = fmaxf(m[r], s), a = exp2f(m[r] - mn), p = exp2f(s - mn);
          sum[r] = sum[r] * a + p;
#pragma unroll
          for (int d = 0; d < 4; ++d) acc[r][d] = acc[r][d] * a + p * vf[u][d];
          m[r] = mn;
        }
      }
    }
    // Merge the warps' rows: each writes its own, then thread t merges (row, dim) pairs.
#pragma unroll
    for (int r = 0; r < RB; ++r) {
#pragma unroll
      for (int d = 0; d < 4; ++d) sm[w][r][4 * l + d] = acc[r][d];
      if (l == 0) sm[w][r][AD_D] = m[r], sm[w][r][AD_D + 1] = sum[r];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < RB * (AD_D + 2); e += NW * 32) {
      const int r = e / (AD_D + 2), d = e % (AD_D + 2);
      const long long rr = r0 + r;
      if (rr >= R) continue;
      float M = AD_NEG_INF;
      for (int ww = 0; ww < NW; ++ww) M = fmaxf(M, sm[ww][r][AD_D]);
      float v = 0.f;
      if (d == AD_D) {
        v = M;
      } else {
        for (int ww = 0; ww < NW; ++ww) {
          const float mw = sm[ww][r][AD_D];
          if (mw != AD_NEG_INF) v += sm[ww][r][d] * exp2f(mw - M);
        }
      }
      const long long i = rr / G, hq = h * G + rr % G;
      part[((c * T + i) * HQ + hq) * (AD_D + 2) + d] = v;
    }
    __syncthreads();
  }
}

#endif

extern "C" __global__ void __launch_bounds__(AD_D)
    attn_combine(const float* __restrict__ part, __nv_bfloat16* __restrict__ o, long long T, long long S, long long HQ,
                 long long CHUNK) {
  const long long r = blockIdx.x, splits = (S + T + CHUNK - 1) / CHUNK, rows = T * HQ;
  const int d = threadIdx.x;
  float M = AD_NEG_INF;
  for (long long c = 0; c < splits; ++c) M = fmaxf(M, part[(c * rows + r) * (AD_D + 2) + AD_D]);
  float den = 0.f, acc = 0.f;
  for (long long c = 0; c < splits; ++c) {
    const float* p = part + (c * rows + r) * (AD_D + 2);
    const float mc = p[AD_D];
    if (mc == AD_NEG_INF) continue;  // no key of this split is visible to the row
    const float wgt = exp2f(mc - M);
    den += p[AD_D + 1] * wgt;
    acc += p[d] * wgt;
  }
  o[r * AD_D + d] = __float2bfloat16_rn(acc / den);
}
