// Decode attention over a KV cache on the tensor cores (flash-decoding with mma.sync):
// the first launch of a split, writing the same partial rows as attn_part (attn_decode.cu),
// combined by its attn_combine. Layouts as in attn_decode.cu:
//   q [T, HQ, 128]; k_cache, v_cache [CAP, HKV, 128]; token i (position S + i) sees keys
//   0 .. S+i; query head hq reads KV head hq / (HQ / HKV).
// Block (h, c): KV head h, keys [c CHUNK, (c+1) CHUNK). Its R = T G rows (G = HQ / HKV
// query heads a KV head; R <= 16) are one m16 tile: row r is token r / G of query head
// h G + r % G, held as A fragments by every warp (TR = 0; with TR = 1, R <= 8 rows are the
// B fragments of the products transposed, attn_split_warp_tr below). Warp w streams its own slice of the
// chunk (KW keys) in tiles of BN keys through its own two shared buffers (cp.async, the
// next tile in flight while this one is used): scores on the tensor cores, the causal
// edge masked, an online softmax in registers, P . V on the tensor cores. The warps'
// rows are then merged through shared memory into the split's partial rows (fp32: the
// output divided by its sum l, the max m in log2 units, l), as attn_part writes them:
//   part[((c T + i) HQ + hq) 130 + {0..127, 128, 129}].
// Params: NW warps a block, BN keys a tile, TR 1 for the products transposed (R <= 8; below),
// TR 2 for the same products with K and V loaded straight into registers as mma fragments
// (no shared buffers: attn_split_warp_rg below).
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

#ifndef TR
#define TR 0
#endif
#ifndef RB
#define RB 2
#endif

#if TR
// movmatrix: the transpose of an 8 x 8 matrix of b16 held as one register a lane (lane g t
// holds row g, columns 2t, 2t + 1); sm_75 and newer.
__device__ __forceinline__ unsigned as_trans8(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// What TR = 1 and 2 share: the scores S^T of a tile in s[n] (16-key group n: {key 16n + g:
// rows 2t, 2t+1}, {key 16n + g + 8: rows 2t, 2t+1}, lane (g, t)), O^T in acc (rows 2t, 2t + 1
// in columns 0, 1 and 2, 3), and each lane's running max and sum of its rows 2t, 2t + 1.
// The last key of the warp's slice [w0, w1) row r sees, as a place in the slice (-1: none).
__device__ __forceinline__ int ap_tr_last(int r, long long R, long long G, long long S, long long w0, long long w1) {
  if (r >= R) return -1;
  const long long last = S + r / G;
  return static_cast<int>(max(min(last, w1 - 1) - w0, -1LL));
}
// One tile's online softmax step: keys past a row's last (lim0, lim1: rows 2t, 2t + 1; jb the
// tile's key g as a place in the slice) masked to -inf, the scores scaled, the rows' max reduced
// over g (lanes xor 4, 8, 16), s turned into probabilities, and sum and acc rescaled to the new max.
// VOTE: acc is rescaled only where a lane's max moved (a warp vote); TR = 2 rescales always, as
// the vote's branch costs it 22-26 registers a thread (ptxas), which it spends on tiles in flight.
template <int NG, bool VOTE>
__device__ __forceinline__ void ap_tr_softmax(float (&s)[NG][4], float (&acc)[8][4], float (&mx)[2], float (&sum)[2],
                                              int jb, int lim0, int lim1) {
  const float scale = 1.4426950408889634f * rsqrtf(128.f);  // log2(e) / sqrt(d)
  float tmax[2] = {-AP_INF, -AP_INF};
#pragma unroll
  for (int n = 0; n < NG; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = jb + 16 * n + (e >> 1) * 8;
      const bool vis = j <= ((e & 1) ? lim1 : lim0);
      s[n][e] = vis ? s[n][e] * scale : -AP_INF;
      tmax[e & 1] = fmaxf(tmax[e & 1], s[n][e]);
    }
  float corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 4));
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 8));
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 16));
    const float mnew = fmaxf(mx[r], tmax[r]);
    const float base = mnew == -AP_INF ? 0.f : mnew;  // a row with no key yet subtracts 0
    corr[r] = mnew == -AP_INF ? 1.f : exp2f(mx[r] - base);
    mx[r] = mnew;
    tmax[r] = base;
  }
  float tsum[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NG; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[n][e] - tmax[e & 1]);
      s[n][e] = p;
      tsum[e & 1] += p;
    }
  sum[0] = sum[0] * corr[0] + tsum[0];
  sum[1] = sum[1] * corr[1] + tsum[1];
  if (!VOTE || __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[j][0] *= corr[0], acc[j][1] *= corr[1];
      acc[j][2] *= corr[0], acc[j][3] *= corr[1];
    }
  }
}
// The rows' sums reduced over g: every lane of a row then holds the warp's.
__device__ __forceinline__ void ap_tr_sum_rows(float (&sum)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 4);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 8);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 16);
  }
}

#endif

#if TR == 1
// TR = 1, for R = T G <= 8 rows (decode: one token, up to 8 query heads a KV head): the
// products transposed, so the rows fill the mma's n8 side instead of a quarter of its m16:
//   S^T (16 keys x 8 rows) = K (16 keys x 128 dims, A from ldmatrix) . Q^T (B fragments)
//   O^T (128 dims x 8 rows) += V^T (A from ldmatrix.trans) . P^T (B: S^T's accumulator as
//                              bf16, transposed in registers by movmatrix)
// Half the mma and half the softmax of TR = 0 a key, and half its registers for the outputs
// and Q (32 + 16 instead of 64 + 32). Lane (g, t) holds keys g, g + 8 of a 16-key group and
// rows 2t, 2t + 1 of the scores, and dims 16 j + g (+ 8), rows 2t, 2t + 1 of the outputs; a
// row's max and sum are reduced over g (lanes xor 4, 8, 16). Same loads, buffers and causal
// rule as TR = 0; on return acc, mx and sum are the warp's (sum reduced over the warp).
__device__ __forceinline__ void attn_split_warp_tr(float (&acc)[8][4], float (&mx)[2], float (&sum)[2],
                                                   const __nv_bfloat16* __restrict__ q,
                                                   const __nv_bfloat16* __restrict__ kc,
                                                   const __nv_bfloat16* __restrict__ vc, unsigned char* smem,
                                                   long long S, long long HQ, long long HKV, long long h,
                                                   long long G, long long R, long long w0, long long w1, int tiles,
                                                   int lane, int warp) {
  const unsigned sq = ap_smem(smem);                        // Q: 8 rows (16 reserved)
  const unsigned sw = sq + 16 * 256 + warp * 4 * BN * 256;  // this warp's K0, K1, V0, V1
  for (int i = threadIdx.x; i < 8 * 16; i += NW * 32) {
    const int r = i >> 4, ch = i & 15;
    const bool ok = r < R;
    const long long src = ok ? ((r / G) * HQ + h * G + r % G) * 128 + ch * 8 : 0;
    ap_cp16(sq + ap_off(r, ch), q + src, ok);
  }
  ap_commit();
  // A tile: lane l copies chunk l % 16 of rows l / 16, l / 16 + 2, ... of the tile (its first
  // row's address advanced by whole rows); rows past the slice zero-filled.
  const int nw = static_cast<int>(w1 - w0), lr = lane >> 4, lch = lane & 15;
  const long long rs = HKV * 128;
  const long long first = ((w0 + lr) * HKV + h) * 128 + lch * 8;
  auto load = [&](int t, int b) {
    const int r0 = t * BN;
    const long long at = first + static_cast<long long>(r0) * rs;
#pragma unroll
    for (int it = 0; it < BN / 2; ++it) {
      const int r = lr + 2 * it;
      const bool ok = r0 + r < nw;
      const long long src = ok ? at + 2 * it * rs : 0;
      ap_cp16(sw + b * BN * 256 + ap_off(r, lch), kc + src, ok);
      ap_cp16(sw + (2 + b) * BN * 256 + ap_off(r, lch), vc + src, ok);
    }
    ap_commit();
  };
  if (tiles > 0) load(0, 0);
  ap_wait_all();  // Q (and the first tile)
  __syncthreads();
  // Q^T as B fragments: k16 step kk is {row g: dims 16 kk + 2t, +1}, {dims 16 kk + 8 + 2t, +1}.
  unsigned qf[8][2];
#pragma unroll
  for (int kk = 0; kk < 8; kk += 2)
    ap_ldsm4(sq + ap_off(lane & 7, 2 * kk + (lane >> 3)), qf[kk][0], qf[kk][1], qf[kk + 1][0], qf[kk + 1][1]);

  const int g = lane >> 2, t = lane & 3;
  const int lim0 = ap_tr_last(2 * t, R, G, S, w0, w1), lim1 = ap_tr_last(2 * t + 1, R, G, S, w0, w1);
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  mx[0] = mx[1] = -AP_INF;
  sum[0] = sum[1] = 0.f;
  constexpr int NG = BN / 16;  // 16-key groups a tile

  for (int ti = 0; ti < tiles; ++ti) {
    if (ti + 1 < tiles) {
      load(ti + 1, (ti + 1) & 1);
      ap_wait_one();
    } else {
      ap_wait_all();
    }
    __syncwarp();
    const unsigned kt = sw + (ti & 1) * BN * 256, vt = sw + (2 + (ti & 1)) * BN * 256;
    float s[NG][4];
#pragma unroll
    for (int n = 0; n < NG; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        unsigned a[4];
        ap_ldsm4(kt + ap_off(n * 16 + (lane & 15), 2 * kk + (lane >> 4)), a[0], a[1], a[2], a[3]);
        ap_mma(s[n], a, qf[kk][0], qf[kk][1]);
      }
    }
    // s[n] masked, turned into probabilities; acc, mx and sum to the tile's new max.
    ap_tr_softmax<NG, true>(s, acc, mx, sum, ti * BN + g, lim0, lim1);
    // P^T as B fragments: {key 16n + g: rows 2t, 2t+1} transposed is {row g: keys 16n + 2t, +1}.
#pragma unroll
    for (int n = 0; n < NG; ++n) {
      const unsigned b0 = as_trans8(ap_pack(s[n][0], s[n][1])), b1 = as_trans8(ap_pack(s[n][2], s[n][3]));
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        unsigned a[4];
        ap_ldsm4t(vt + ap_off(n * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * j + ((lane >> 3) & 1)), a[0], a[1], a[2],
                  a[3]);
        ap_mma(acc[j], a, b0, b1);
      }
    }
    __syncwarp();  // every lane's ldmatrix of this tile's buffers is done before they refill
  }
  ap_tr_sum_rows(sum);
}
#endif

#if TR == 2
// One 16-byte load from global memory, not kept in L1 (the cache is read once); zero where !ok.
__device__ __forceinline__ uint4 ap_ldg16(const __nv_bfloat16* p, bool ok) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (ok)
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned ap_word(const uint4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// TR = 2: the products of TR = 1 (S^T = K . Q^T, O^T += V^T . P^T, R <= 8 rows on the n8
// side) with K and V loaded from global memory straight into registers, as the mma's
// fragments, instead of through shared buffers: the warps an SM are then bounded by registers,
// not by shared memory, and more of the cache is in flight (a plain reader of these rows
// streams at ~98% of the copy bandwidth with 16 warps an SM, where the shared buffers allowed 8).
// A dot product's order over the dims is free, and so is the order of the output's dims, so
// each lane's loads are whole 16-byte pieces of rows:
//   lane (g, t) loads, of each 16-key group, keys g and g + 8 at dims 32 i + 8 t .. + 7
//   (i = 0..3): a row's 64 contiguous bytes a load, over its four lanes t.
//   K as A fragments: k16 step j = 2 i + h takes 32-bit words 2h, 2h + 1 of load i; its k
//   indices 2t + e and 2t + 8 + e are dims 32 i + 8 t + 4 h + e and + 2 + e, so Q^T's B
//   fragments are Q's row g at those dims (loaded the same way).
//   V^T as A fragments: word w of load i (keys g, or g + 8) is one 8 x 8 block of V (keys by
//   dims 32 i + 8 t + 2 w + {0, 1}); movmatrix transposes it to (dim, two keys) pairs, and
//   m16 tile 2 i + p is blocks w = 2p (m rows 0..7) and 2p + 1 (8..15), keys g and g + 8 its
//   two k halves. m row g of block w is dim 32 i + 8 (g / 2) + 2 w + g % 2.
// RB = 2: the next tile's loads are issued before this tile is used (two tiles in registers);
// RB = 1: one tile (fewer registers, more warps an SM).
// On return acc, mx and sum are as attn_split_warp_tr leaves them, but acc's dims are in the
// order above (the caller writes them by ap_rg_dim).
__device__ __forceinline__ int ap_rg_dim(int m, int e, int g) {
  const int i = m >> 1, w = 2 * (m & 1) + (e >> 1);
  return 32 * i + 8 * (g >> 1) + 2 * w + (g & 1);
}
__device__ __forceinline__ void attn_split_warp_rg(float (&acc)[8][4], float (&mx)[2], float (&sum)[2],
                                                   const __nv_bfloat16* __restrict__ q,
                                                   const __nv_bfloat16* __restrict__ kc,
                                                   const __nv_bfloat16* __restrict__ vc, long long S, long long HQ,
                                                   long long HKV, long long h, long long G, long long R, long long w0,
                                                   long long w1, int tiles, int lane) {
  constexpr int NG = BN / 16;  // 16-key groups a tile
  const int g = lane >> 2, t = lane & 3;
  unsigned qf[8][2];
  {
    const bool ok = g < R;
    const __nv_bfloat16* qr = q + (ok ? ((g / G) * HQ + h * G + g % G) * 128 : 0) + t * 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = ap_ldg16(qr + 32 * i, ok);
      qf[2 * i][0] = v.x, qf[2 * i][1] = v.y, qf[2 * i + 1][0] = v.z, qf[2 * i + 1][1] = v.w;
    }
  }
  // Tile ti's keys into k and v (keys past the slice not read: zero, so that V's NaN-free).
  auto load = [&](int ti, uint4 (&k)[NG][2][4], uint4 (&v)[NG][2][4]) {
#pragma unroll
    for (int n = 0; n < NG; ++n)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const long long r = w0 + static_cast<long long>(ti) * BN + 16 * n + g + 8 * hf;
        const bool ok = r < w1;
        const long long off = (ok ? r * HKV + h : 0) * 128 + t * 8;
#pragma unroll
        for (int i = 0; i < 4; ++i) k[n][hf][i] = ap_ldg16(kc + off + 32 * i, ok);
      }
#pragma unroll
    for (int n = 0; n < NG; ++n)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const long long r = w0 + static_cast<long long>(ti) * BN + 16 * n + g + 8 * hf;
        const bool ok = r < w1;
        const long long off = (ok ? r * HKV + h : 0) * 128 + t * 8;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[n][hf][i] = ap_ldg16(vc + off + 32 * i, ok);
      }
  };
  const int lim0 = ap_tr_last(2 * t, R, G, S, w0, w1), lim1 = ap_tr_last(2 * t + 1, R, G, S, w0, w1);
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  mx[0] = mx[1] = -AP_INF;
  sum[0] = sum[1] = 0.f;

  auto use = [&](const uint4 (&ck)[NG][2][4], const uint4 (&cv)[NG][2][4], int ti) {
    float s[NG][4];
#pragma unroll
    for (int n = 0; n < NG; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = j >> 1, hh = j & 1;
        const unsigned a[4] = {ap_word(ck[n][0][i], 2 * hh), ap_word(ck[n][1][i], 2 * hh),
                               ap_word(ck[n][0][i], 2 * hh + 1), ap_word(ck[n][1][i], 2 * hh + 1)};
        ap_mma(s[n], a, qf[j][0], qf[j][1]);
      }
    }
    // s[n] masked, turned into probabilities; acc, mx and sum to the tile's new max.
    ap_tr_softmax<NG, false>(s, acc, mx, sum, ti * BN + g, lim0, lim1);
#pragma unroll
    for (int n = 0; n < NG; ++n) {
      // P^T as B fragments: {key 16n + g: rows 2t, 2t+1} transposed is {row g: keys 16n + 2t, +1}.
      const unsigned b0 = as_trans8(ap_pack(s[n][0], s[n][1])), b1 = as_trans8(ap_pack(s[n][2], s[n][3]));
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const int i = m >> 1, p = m & 1;
        const unsigned a[4] = {as_trans8(ap_word(cv[n][0][i], 2 * p)), as_trans8(ap_word(cv[n][0][i], 2 * p + 1)),
                               as_trans8(ap_word(cv[n][1][i], 2 * p)), as_trans8(ap_word(cv[n][1][i], 2 * p + 1))};
        ap_mma(acc[m], a, b0, b1);
      }
    }
  };
#if RB == 1
  // One tile in registers: its loads, then its use (more warps fit an SM).
  for (int ti = 0; ti < tiles; ++ti) {
    uint4 ck[NG][2][4], cv[NG][2][4];
    load(ti, ck, cv);
    use(ck, cv, ti);
  }
#else
  // Two: the next tile's loads issued before this one is used.
  uint4 ck[NG][2][4], cv[NG][2][4];
  load(0, ck, cv);
  for (int ti = 0; ti < tiles; ++ti) {
    uint4 nk[NG][2][4], nv[NG][2][4];
    load(ti + 1, nk, nv);  // past the last tile nothing is read
    use(ck, cv, ti);
#pragma unroll
    for (int n = 0; n < NG; ++n)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int i = 0; i < 4; ++i) ck[n][hf][i] = nk[n][hf][i], cv[n][hf][i] = nv[n][hf][i];
  }
#endif
  ap_tr_sum_rows(sum);
}
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

#if TR == 1
  float acc[8][4], mx[2], sum[2];  // the warp's O^T (128 dims x 8 rows), and rows 2t, 2t+1's max and sum
  attn_split_warp_tr(acc, mx, sum, q, kc, vc, smem, S, HQ, HKV, h, G, R, w0, w1, tiles, lane, warp);
#elif TR == 2
  float acc[8][4], mx[2], sum[2];  // as TR = 1, the dims in ap_rg_dim's order
  attn_split_warp_rg(acc, mx, sum, q, kc, vc, S, HQ, HKV, h, G, R, w0, w1, tiles, lane);
#else
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
#endif
  // The warps' rows merged: each warp's (acc, m, l) to shared memory (over its buffers).
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem + 16 * 256);  // [NW][16][130]
#ifdef CL
  __shared__ float blk[16 * 130];  // the block's merged rows, read by the cluster
#endif
#if !TR
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
#else
  // O^T's accumulator: dims 16 j + g (+ 8), rows 2 t, 2 t + 1; every lane of a row holds its max
  // and sum, so the lanes with g = 0 write them.
  float* mine = red + warp * 16 * 130;
  {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#if TR == 2
        const int d = ap_rg_dim(j, e, g);
#else
        const int d = 16 * j + g + (e >> 1) * 8;
#endif
        mine[(2 * t + (e & 1)) * 130 + d] = acc[j][e];
      }
    if (g == 0) {
      mine[(2 * t) * 130 + 128] = mx[0], mine[(2 * t) * 130 + 129] = sum[0];
      mine[(2 * t + 1) * 130 + 128] = mx[1], mine[(2 * t + 1) * 130 + 129] = sum[1];
    }
  }
#endif
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
