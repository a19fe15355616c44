// Decode attention over a KV cache (flash-decoding), bf16 in and out, fp32 math; the
// algorithm of kernels/cpu/attention.cpp (its comment has the layouts):
//   q [T, HQ, 128]; k_cache, v_cache [CAP, HKV, 128]; token i (position S + i) sees keys
//   0 .. S+i; query head hq reads KV head hq / (HQ / HKV).
// attn_part: block (h, c) takes keys [c CHUNK, (c+1) CHUNK) of KV head h for its R = T G
//   rows (G = HQ / HKV query heads a KV head), RB rows at a time. Each half-warp streams
//   keys, UNROLL at a time (their loads in flight together), 16 bytes a lane, and keeps an
//   online softmax (max m, sum l, 8 dims of the output a lane) a row. The half-warps' rows
//   are then merged through shared memory and written as the split's partial rows (fp32:
//   the output over the chunk's keys divided by its own sum, m, l; a row that sees none of
//   them: 0, -inf, 0): part[((c T + i) HQ + hq) 130 + ...]. Divided, its elements are
//   bounded by the values whatever the chunk's length, so configs that round differently
//   are compared at the output's scale, not at the chunk's sum's.
// attn_combine: block r (a token and query head), a thread a dim: the splits' rows
//   weighted by their sums rescaled to the largest m, summed, and divided by the weights' sum.
// Params: NW warps a block, RB rows a pass (registers: 18 a row a lane), UNROLL keys a
// half-warp has in flight.
#include <cuda_bf16.h>

#define AD_D 128
#define AD_NEG_INF __int_as_float(0xff800000)

// The sum over the 16 lanes of a half-warp (both halves at once).
__device__ __forceinline__ float ad_half_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ void ad_load8(const __nv_bfloat16* p, float (&f)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    f[2 * i] = a.x, f[2 * i + 1] = a.y;
  }
}

#ifdef NW  // attn_part_bf16.toml's params (attn_combine_bf16.toml compiles this file without them)
// A half-warp is a unit: lane li of it holds dims 8 li .. 8 li + 7, so a key's 256 bytes are
// one 16-byte load a lane and a row's score a sum over 16 lanes. Warp w takes the keys
// base .. base + 2 UNROLL - 1 (half h those of parity h) for base = j0 + 2 UNROLL w, stepping
// by 2 UNROLL NW: its loop and its shuffles are the same for both halves, and a key a half
// must not see (past the chunk, or causal) only adds nothing.
extern "C" __global__ void __launch_bounds__(NW * 32)
    attn_part(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kc,
              const __nv_bfloat16* __restrict__ vc, float* __restrict__ part, long long T, long long S_arg, long long CAP,
              long long HQ, long long HKV, long long CHUNK) {
  (void)CAP;
  const long long S = kiln_cell(S_arg);  // a program's cell holds it where the grid is sized for its bucket
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now
  kiln_wait_prior();  // ... and this one reads only once the kernel before it has ended
  if (static_cast<long long>(blockIdx.y) * CHUNK >= S + T) return;  // a split past the keys (a grid sized for more)
  constexpr int NU = 2 * NW, KPW = 2 * UNROLL;  // units a block, keys a warp an iteration
  __shared__ float sm[NU][RB][AD_D + 2];
  const int h = blockIdx.x, w = threadIdx.x >> 5, half = (threadIdx.x >> 4) & 1, li = threadIdx.x & 15;
  const int unit = 2 * w + half;
  const long long c = blockIdx.y, G = HQ / HKV, R = T * G;
  const long long j0 = c * CHUNK, j1 = min(j0 + CHUNK, S + T);
  const float scale = 1.4426950408889634f / sqrtf(static_cast<float>(AD_D));  // scores in log2 units
  for (long long r0 = 0; r0 < R; r0 += RB) {
    float qv[RB][8], acc[RB][8], m[RB], sum[RB];
    long long last[RB];  // the last key row r sees
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      const long long rr = r0 + r, i = rr / G, hq = h * G + rr % G;
      last[r] = rr < R ? S + i : -1;
      if (rr < R) {
        ad_load8(q + (i * HQ + hq) * AD_D + 8 * li, qv[r]);
      } else {
#pragma unroll
        for (int d = 0; d < 8; ++d) qv[r][d] = 0.f;
      }
#pragma unroll
      for (int d = 0; d < 8; ++d) qv[r][d] *= scale, acc[r][d] = 0.f;
      m[r] = AD_NEG_INF;
      sum[r] = 0.f;
    }
    for (long long base = j0 + static_cast<long long>(KPW) * w; base < j1; base += static_cast<long long>(KPW) * NW) {
      float kf[UNROLL][8], vf[UNROLL][8];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const long long j = base + 2 * u + half;
        if (j < j1) {
          ad_load8(kc + (j * HKV + h) * AD_D + 8 * li, kf[u]);
          ad_load8(vc + (j * HKV + h) * AD_D + 8 * li, vf[u]);
        } else {
#pragma unroll
          for (int d = 0; d < 8; ++d) kf[u][d] = vf[u][d] = 0.f;
        }
      }
      // A row's UNROLL scores first (independent sums), then one rescale for all of them.
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        float sc[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          float d0 = 0.f;
#pragma unroll
          for (int d = 0; d < 8; ++d) d0 += qv[r][d] * kf[u][d];
          sc[u] = d0;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) sc[u] = ad_half_sum(sc[u]);
        float mx = m[r];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const long long j = base + 2 * u + half;
          if (!(j < j1 && j <= last[r])) sc[u] = AD_NEG_INF;  // past the chunk, or causal
          mx = fmaxf(mx, sc[u]);
        }
        // mref: the new max, or 0 where the row has seen no key yet (then every term is 0)
        const float mref = mx == AD_NEG_INF ? 0.f : mx;
        const float a = exp2f(m[r] - mref);
        sum[r] *= a;
#pragma unroll
        for (int d = 0; d < 8; ++d) acc[r][d] *= a;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const float p = exp2f(sc[u] - mref);  // 0 for a key the row does not see
          sum[r] += p;
#pragma unroll
          for (int d = 0; d < 8; ++d) acc[r][d] += p * vf[u][d];
        }
        m[r] = mx;
      }
    }
    // Merge the units' rows: each writes its own, then thread t merges (row, dim) pairs.
#pragma unroll
    for (int r = 0; r < RB; ++r) {
#pragma unroll
      for (int d = 0; d < 8; ++d) sm[unit][r][8 * li + d] = acc[r][d];
      if (li == 0) sm[unit][r][AD_D] = m[r], sm[unit][r][AD_D + 1] = sum[r];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < RB * (AD_D + 2); e += NW * 32) {
      const int r = e / (AD_D + 2), d = e % (AD_D + 2);
      const long long rr = r0 + r;
      if (rr >= R) continue;
      float M = AD_NEG_INF;
      for (int uu = 0; uu < NU; ++uu) M = fmaxf(M, sm[uu][r][AD_D]);
      float v = 0.f, L = 0.f;
      if (d == AD_D) {
        v = M;
      } else {
        for (int uu = 0; uu < NU; ++uu) {
          const float mu = sm[uu][r][AD_D];
          if (mu == AD_NEG_INF) continue;
          const float a = exp2f(mu - M);
          v += sm[uu][r][d] * a;
          L += sm[uu][r][AD_D + 1] * a;
        }
        if (d < AD_D) v = L > 0.f ? v / L : 0.f;  // the output divided by the chunk's sum; l as it is
      }
      const long long i = rr / G, hq = h * G + rr % G;
      part[((c * T + i) * HQ + hq) * (AD_D + 2) + d] = v;
    }
    __syncthreads();
  }
}
#endif

// attn_combine keeps a group of up to AD_D splits' (m, l) in shared memory at a time; each
// thread then loads its dim of the group's rows 8 at a time (independent loads in flight
// together: the part rows are in L2, a few hundred ns away, and a split at a time would wait
// that long for each), rescales them to the running max and adds them up.
extern "C" __global__ void __launch_bounds__(AD_D)
    attn_combine(const float* __restrict__ part, __nv_bfloat16* __restrict__ o, long long T, long long S_arg, long long HQ,
                 long long CHUNK) {
  __shared__ float sm_m[AD_D], sm_l[AD_D], sm_red[AD_D / 32];
  const long long S = kiln_cell(S_arg);  // the splits the keys make, where the part's grid was sized for more
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now
  kiln_wait_prior();  // ... and this one reads only once the kernel before it has ended
  const long long r = blockIdx.x, splits = (S + T + CHUNK - 1) / CHUNK, rows = T * HQ;
  const int d = threadIdx.x, lane = d & 31, warp = d >> 5;
  float M = AD_NEG_INF, den = 0.f, acc = 0.f;  // over the groups so far: max, sum, output
  for (long long c0 = 0; c0 < splits; c0 += AD_D) {
    const int n = static_cast<int>(splits - c0 < AD_D ? splits - c0 : AD_D);
    float mc = AD_NEG_INF, lc = 0.f;
    if (d < n) {
      const float* p = part + ((c0 + d) * rows + r) * (AD_D + 2);
      mc = p[AD_D];
      lc = p[AD_D + 1];
    }
    float gm = mc;  // the group's max
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o2));
    __syncthreads();  // the last group's shared values are read
    sm_m[d] = mc;
    sm_l[d] = lc;
    if (lane == 0) sm_red[warp] = gm;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < AD_D / 32; ++w) gm = fmaxf(gm, sm_red[w]);
    const float Mn = fmaxf(M, gm);
    if (Mn == AD_NEG_INF) continue;  // no key seen yet by this row
    const float a = M == AD_NEG_INF ? 0.f : exp2f(M - Mn);
    den *= a;
    acc *= a;
    for (int j0 = 0; j0 < n; j0 += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        v[u] = j0 + u < n ? part[((c0 + j0 + u) * rows + r) * (AD_D + 2) + d] : 0.f;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (j0 + u >= n) break;
        const float m = sm_m[j0 + u];
        // a split's row divided by its sum is weighted by that sum (a split no key of which the row sees adds nothing)
        const float wgt = m == AD_NEG_INF ? 0.f : sm_l[j0 + u] * exp2f(m - Mn);
        den += wgt;
        acc += v[u] * wgt;
      }
    }
    M = Mn;
  }
  o[r * AD_D + d] = __float2bfloat16_rn(acc / den);
}
