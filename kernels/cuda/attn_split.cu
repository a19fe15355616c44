// Decode attention over a KV cache on the tensor cores (flash-decoding with mma.sync):
// the first launch of a split, writing the same partial rows as attn_part (attn_decode.cu),
// combined by its attn_combine. Layouts as in attn_decode.cu:
//   q [T, HQ, 128]; k_cache, v_cache [CAP, HKV, 128]; token i (position S + i) sees keys
//   0 .. S+i; query head hq reads KV head hq / (HQ / HKV).
// Block (h, c): KV head h, keys [c CHUNK, (c+1) CHUNK). Its R = T G rows (G = HQ / HKV
// query heads a KV head; R <= 16) are one m16 tile: row r is token r / G of query head
// h G + r % G, held as A fragments by every warp. Warp w streams its own slice of the
// chunk (KW keys) in tiles of BN keys through its own two shared buffers (cp.async, the
// next tile in flight while this one is used): scores on the tensor cores, the causal
// edge masked, an online softmax in registers, P . V on the tensor cores. The warps'
// rows are then merged through shared memory into the split's partial rows (fp32: the
// output divided by its sum l, the max m in log2 units, l), as attn_part writes them:
//   part[((c T + i) HQ + hq) 130 + {0..127, 128, 129}].
// Params: NW warps a block, BN keys a tile.
//
// With CL (attn_split_cluster_bf16.toml) the kernel is the whole attention in one launch: the
// CL splits of a KV head are one thread-block cluster (grid HKV x CL, CHUNK = cdiv(S + T, CL)),
// each block keeps its partial rows in its shared memory, and after a cluster barrier each
// block combines its share of the (row, dim) outputs from all CL blocks' rows through
// distributed shared memory, as attn_combine does from the scratch rows, and writes o in bf16.
// Its grid does not depend on S. It is launched to overlap the kernel before it (pdl).
#include "attn_mma.cuh"
#ifdef CL
#include "ptx_cluster.cuh"
static_assert(CL >= 1 && CL <= 16, "CL: 1 to 16 blocks a cluster (more than 8 is not portable: kiln allows it at load)");
#define AS_CLUSTER __cluster_dims__(1, CL, 1)
#else
#define AS_CLUSTER
#endif

#ifndef NW
#define NW 4
#endif
#ifndef BN
#define BN 32
#endif

extern "C" __global__ void AS_CLUSTER __launch_bounds__(NW * 32)
    attn_split(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kc,
               const __nv_bfloat16* __restrict__ vc,
#ifdef CL
               __nv_bfloat16* __restrict__ o, long long T, long long S_arg, long long CAP, long long HQ,
               long long HKV) {
#else
               float* __restrict__ part, long long T, long long S_arg, long long CAP, long long HQ, long long HKV,
               long long CHUNK) {
#endif
  (void)CAP;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long h = blockIdx.x, c = blockIdx.y, G = HQ / HKV, R = T * G;
  const long long S = kiln_cell(S_arg);  // a program's cell holds it where the grid is sized for its bucket
  const long long n_keys = S + T;
#ifdef CL
  const long long CHUNK = (n_keys + CL - 1) / CL;
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now (this grid is one wave)
  kiln_wait_prior();  // ... and this one reads only once the kernel before it has ended
  // (No early return for a split past the keys: every block of a cluster reaches its barriers;
  // such a block has no tiles and its rows say so, m = -inf and l = 0.)
#else
  if (c * CHUNK >= n_keys) return;  // a split past the keys (a grid sized for more)
#endif
  const long long j_end = min((c + 1) * CHUNK, n_keys);
  // The warp's slice: KW keys, a whole number of tiles.
  const long long KW = (CHUNK + NW * BN - 1) / (NW * BN) * BN;
  const long long w0 = c * CHUNK + warp * KW, w1 = min(w0 + KW, j_end);
  const int tiles = w1 > w0 ? static_cast<int>((w1 - w0 + BN - 1) / BN) : 0;

  const unsigned sq = ap_smem(smem);                  // Q: 16 rows
  const unsigned sw = sq + 16 * 256 + warp * 4 * BN * 256;  // this warp's K0, K1, V0, V1
  // Q's rows: row r at q[((r / G) HQ + h G + r % G) 128]; rows past R zero.
  for (int i = threadIdx.x; i < 16 * 16; i += NW * 32) {
    const int r = i >> 4, ch = i & 15;
    const bool ok = r < R;
    const long long src = ok ? ((r / G) * HQ + h * G + r % G) * 128 + ch * 8 : 0;
    ap_cp16(sq + ap_off(r, ch), q + src, ok);
  }
  ap_commit();
  // A tile of the warp's keys into its buffer b (keys past the slice zero-filled).
  auto load = [&](int t, int b) {
    const long long k0 = w0 + static_cast<long long>(t) * BN;
#pragma unroll
    for (int i = lane; i < BN * 16; i += 32) {
      const int r = i >> 4, ch = i & 15;
      const long long j = k0 + r;
      const bool ok = j < w1;
      const long long src = (ok ? j : 0) * HKV * 128 + h * 128 + ch * 8;
      ap_cp16(sw + b * BN * 256 + ap_off(r, ch), kc + src, ok);
      ap_cp16(sw + (2 + b) * BN * 256 + ap_off(r, ch), vc + src, ok);
    }
    ap_commit();
  };
  if (tiles > 0) load(0, 0);
  ap_wait_all();  // Q (and the first tile)
  __syncthreads();
  unsigned qf[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) ap_ldsm4(sq + ap_off(lane & 15, kk * 2 + (lane >> 4)), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);

  // Per thread: rows lo = lane / 4 and hi = lo + 8; the last key each sees (token r / G).
  const int lo = lane >> 2, hi = lo + 8;
  const long long last_lo = lo < R ? S + lo / G : -1, last_hi = hi < R ? S + hi / G : -1;
  float acc[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float mx[2] = {-AP_INF, -AP_INF}, sum[2] = {0.f, 0.f};
  const float scale = 1.4426950408889634f * rsqrtf(128.f);  // log2(e) / sqrt(d)

  for (int t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) {
      load(t + 1, (t + 1) & 1);  // its buffer was last read by tile t - 1, done (the warp is in step)
      ap_wait_one();
    } else {
      ap_wait_all();
    }
    __syncwarp();
    const long long k0 = w0 + static_cast<long long>(t) * BN;
    float s[BN / 8][4];
    ap_scores<BN>(s, qf, sw + (t & 1) * BN * 256, lane);
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long j = k0 + n * 8 + 2 * (lane & 3) + (e & 1);
        const bool vis = j < w1 && j <= (e < 2 ? last_lo : last_hi);
        s[n][e] = vis ? s[n][e] * scale : -AP_INF;
      }
    ap_softmax_step<BN>(s, mx, sum, acc);
    ap_pv<BN>(acc, s, sw + (2 + (t & 1)) * BN * 256, lane);
    __syncwarp();  // every lane's ldmatrix of this tile's buffers is done before they refill
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
  }
  // The warps' rows merged: each warp's (acc, m, l) to shared memory (over its buffers).
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem + 16 * 256);  // [NW][16][130]
#ifdef CL
  __shared__ float blk[16 * 130];  // the block's merged rows, read by the cluster
#endif
  float* mine = red + warp * 16 * 130;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int d = j * 8 + 2 * (lane & 3);
    mine[lo * 130 + d] = acc[j][0], mine[lo * 130 + d + 1] = acc[j][1];
    mine[hi * 130 + d] = acc[j][2], mine[hi * 130 + d + 1] = acc[j][3];
  }
  if ((lane & 3) == 0) {
    mine[lo * 130 + 128] = mx[0], mine[lo * 130 + 129] = sum[0];
    mine[hi * 130 + 128] = mx[1], mine[hi * 130 + 129] = sum[1];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R * 130; i += NW * 32) {
    const int r = i / 130, d = i % 130;
    float M = -AP_INF;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, red[(w * 16 + r) * 130 + 128]);
    float v, L = 0.f;
    if (d == 128) {
      v = M;
    } else {
      v = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        const float mw = red[(w * 16 + r) * 130 + 128];
        if (mw == -AP_INF) continue;
        const float a = exp2f(mw - M);
        v += red[(w * 16 + r) * 130 + d] * a;
        L += red[(w * 16 + r) * 130 + 129] * a;
      }
    }
#ifdef CL
    blk[r * 130 + d] = v;  // kept undivided: the cluster's combine below weighs the rows by m alone
#else
    if (d < 128) v = L > 0.f ? v / L : 0.f;  // divided by the chunk's sum, as attn_part's rows
    const long long tok = r / G, hq = h * G + r % G;
    part[((c * T + tok) * HQ + hq) * 130 + d] = v;
#endif
  }
#ifdef CL
  // The cluster's rows combined: output i = (row, dim) of this KV head is finished by rank
  // i % CL, from the CL blocks' rows rescaled to their largest m (a block no key of which the
  // row sees adds nothing; rank 0's chunk holds key 0, which every row sees).
  ptx_cluster_sync();
  const unsigned rank = ptx_cluster_rank(), at = ap_smem(blk);
  for (long long i = rank + static_cast<long long>(threadIdx.x) * CL; i < R * 128; i += static_cast<long long>(NW) * 32 * CL) {
    const int r = static_cast<int>(i >> 7), d = static_cast<int>(i & 127);
    float mq[CL], M = -AP_INF;
#pragma unroll
    for (int qq = 0; qq < CL; ++qq) {
      mq[qq] = ptx_ld_cluster_f32(ptx_map_rank(at + (r * 130 + 128) * 4, qq));
      M = fmaxf(M, mq[qq]);
    }
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int qq = 0; qq < CL; ++qq) {
      if (mq[qq] == -AP_INF) continue;
      const float wgt = exp2f(mq[qq] - M);
      num += ptx_ld_cluster_f32(ptx_map_rank(at + (r * 130 + d) * 4, qq)) * wgt;
      den += ptx_ld_cluster_f32(ptx_map_rank(at + (r * 130 + 129) * 4, qq)) * wgt;
    }
    const long long tok = r / G, hq = h * G + r % G;
    o[(tok * HQ + hq) * 128 + d] = __float2bfloat16_rn(num / den);
  }
  ptx_cluster_sync();  // each block's rows stay until every block of the cluster has read them
#endif
}
