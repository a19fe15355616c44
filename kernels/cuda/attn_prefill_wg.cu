// Prefill attention over a KV cache on Hopper's warpgroup tensor cores (wgmma, bf16 in, fp32
// accumulate; sm_90a only), grouped-query, causal with the past offset S. Layouts as in
// attn_prefill.cu:
//   q [T, HQ, 128]: T new tokens at positions S .. S+T-1;
//   k_cache, v_cache [CAP, HKV, 128]: rows 0 .. S+T-1 hold the keys and values;
//   token i sees keys 0 .. S+i (the new tokens see the whole cache); query head hq reads
//   KV head hq / (HQ / HKV), the cache never copied.
// Block (hq, m): 128 query tokens of a query head. Warpgroup 0 is the producer: one thread
// loads the block's Q tile once and then the K and V tiles of BN keys into a ring of STAGES
// stages with TMA (tensor maps kiln encodes: q as [T, HQ 128], each cache as [CAP, HKV 128],
// boxes of 64 columns, SWIZZLE_128B; K and V of a stage on barriers of their own, so the
// scores start before V has landed). Warpgroups 1 and 2 are the consumers, 64 query rows
// each. For each tile a consumer computes S = Q K^T (m64 n BN k16 wgmmas, both operands in
// shared memory, K-major), masks the causal edge, keeps each row's running base and sum
// (online softmax in base 2), turns the probabilities into bf16 A fragments in registers
// (wgmma's accumulator layout is its A layout, as for mma.sync) and adds P V (m64 n128 k16
// wgmmas, A from registers, V's tile N-major through the transpose bit), then frees the
// stage. The two consumers run independently, so one's softmax overlaps the other's
// wgmmas. The output is staged in the consumer's own rows of the Q tile and stored with
// 16-byte stores. Blocks run the heaviest query tiles (the last, seeing the most keys)
// first.
//
// The masking of the causal edge runs only in a tile that crosses a warp's edge (most tiles
// see every key), and the producer thread sleeps in its waits for a free stage instead of
// polling: bench/gpu/results/issue27-prefill-wg/run4-masked: 13-14% less time at T = 4096-16384.
// A row's base moves only where its max grew by more than 8 (base 2), so O is rarely
// rescaled: 1.0-7.5% less time in 13 of 15 configs and points, 0.2-0.6% more in two
// (run6-lazy-tree). (Tried and not kept: the next tile's scores issued behind P V, 6-33%
// slower, run3b-ahead-tree; tree-shaped max and sum reductions, faster in 4 of 30 pairs,
// run6-lazy-tree; the softmax beside P V again, 13-39% slower, run5-iw. ptxas serialized the
// wgmmas of both forms that keep two wgmma groups open, advisories C7515 and C7513, which
// `kiln compile` now shows.)
//
// Keys past S + T (a cache's rows not yet written: they may hold anything, NaN included)
// never reach the output: their scores are masked to -inf, and the V rows of the last
// tile past S + T are zeroed in shared memory before P V (0 times a NaN is a NaN).
//
// Params: BN keys a tile (64 or 128), STAGES tiles in the ring (2 to 4, as shared memory allows).
#include <cuda_bf16.h>

#include "attn_mma.cuh"   // ap_pack, AP_INF
#include "wgmma_ptx.cuh"

#ifndef BN
#define BN 128
#endif
#ifndef STAGES
#define STAGES 2
#endif
static_assert(BN == 64 || BN == 128, "BN: 64 or 128 keys a tile");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES: 2 to 4");

namespace {

constexpr int kBM = 128;                         // query rows a block: two consumers of 64
constexpr int kQBytes = kBM * 256;               // the Q tile: two boxes of [128 rows x 64 dims]
constexpr int kTileBytes = BN * 256;             // a K (or V) tile: two boxes of [BN keys x 64 dims]
constexpr int kStageBytes = 2 * kTileBytes;      // K, then V

// Three warpgroups, one block an SM: 168 registers a thread at launch; the producer gives
// its share to the consumers (24 + 2 x 240 = 3 x 168).
__device__ __forceinline__ void aw_regs_producer() { asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n"); }
__device__ __forceinline__ void aw_regs_consumer() { asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n"); }

// S[64 x BN] = A . B, A (Q) and B (K) K-major in shared memory; scale-d = sc.
#if BN == 128
WG_MMA_SS(aw_mma_ss, 128, 8, 64, 65, 66, "bf16", "0")
#else
WG_MMA_SS(aw_mma_ss, 64, 4, 32, 33, 34, "bf16", "0")
#endif
// O[64 x 128] += A . B, A (P) four bf16x2 registers a thread, B (V) N-major in shared memory.
__device__ __forceinline__ void aw_mma_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_R8
               "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
               : WG_O8
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// 2^x, approximate (MUFU.EX2; -inf gives +0)
__device__ __forceinline__ float aw_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Byte offset of row r's 16-byte chunk c (of 8) in a 128-byte-row box, SWIZZLE_128B (the box
// 1024-byte aligned): chunk c ^ (r % 8).
__device__ __forceinline__ unsigned aw_swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1)
    attn_prefill_wg(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kc,
                    const __nv_bfloat16* __restrict__ vc, __nv_bfloat16* __restrict__ o, long long T, long long S_arg,
                    long long CAP, long long HQ, long long HKV, const __grid_constant__ wg_tmap tmQ,
                    const __grid_constant__ wg_tmap tmK, const __grid_constant__ wg_tmap tmV) {
  (void)q, (void)kc, (void)vc, (void)CAP;
  const long long S = kiln_cell(S_arg);  // a program's cell holds it where the launch is sized for its bucket
  extern __shared__ unsigned char aw_smem[];
  // q_full, then k_full[STAGES], v_full[STAGES], empty[STAGES]
  __shared__ __align__(8) unsigned long long aw_bars[1 + 3 * STAGES];
  const unsigned sbase = (wg_smem_u32(aw_smem) + 1023u) & ~1023u;  // the spec's `shared` has 1 KiB to spare
  const unsigned sq = sbase, ring = sbase + kQBytes;
  const unsigned q_full = wg_smem_u32(aw_bars), k_full0 = q_full + 8, v_full0 = k_full0 + 8 * STAGES,
                 empty0 = v_full0 + 8 * STAGES;
  const int tid = threadIdx.x, wg = tid >> 7;
  // Blocks start x fastest: every head's last query tile (the most keys) first.
  const long long m0 = (static_cast<long long>(gridDim.y) - 1 - blockIdx.y) * kBM;
  const long long hq = blockIdx.x, h = hq / (HQ / HKV);
  const long long rows_end = m0 + kBM < T ? m0 + kBM : T;
  const long long n_keys = S + T;                                   // keys with data
  const int tiles = static_cast<int>((S + rows_end + BN - 1) / BN);  // the keys the block's last row sees

  if (tid == 0) {
    wg_mbar_init(q_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      wg_mbar_init(k_full0 + 8 * s, 1);  // the producer's expect_tx; TMA completes the bytes
      wg_mbar_init(v_full0 + 8 * s, 1);
      wg_mbar_init(empty0 + 8 * s, 2);  // one arrival a consumer
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ================= producer: one thread issues the TMA copies =================
    aw_regs_producer();
    if (tid == 0) {
      wg_tma_prefetch(&tmQ);
      wg_tma_prefetch(&tmK);
      wg_tma_prefetch(&tmV);
      const int qc = static_cast<int>(hq * 128), kcol = static_cast<int>(h * 128);
      wg_mbar_expect_tx(q_full, kQBytes);
      wg_tma_load(sq, &tmQ, q_full, qc, static_cast<int>(m0));
      wg_tma_load(sq + kQBytes / 2, &tmQ, q_full, qc + 64, static_cast<int>(m0));
      for (int j = 0; j < tiles; ++j) {
        const int s = j % STAGES;
        // both consumers are done with it (the thread sleeps in the wait rather than spin: its
        // polls took issue slots from the consumers' warps of its SM sub-partition)
        if (j >= STAGES) wg_mbar_wait_sleep(empty0 + 8 * s, ((j / STAGES) - 1) & 1);
        const unsigned dk = ring + s * kStageBytes, dv = dk + kTileBytes;
        const int row = j * BN;
        wg_mbar_expect_tx(k_full0 + 8 * s, kTileBytes);
        wg_tma_load(dk, &tmK, k_full0 + 8 * s, kcol, row);
        wg_tma_load(dk + kTileBytes / 2, &tmK, k_full0 + 8 * s, kcol + 64, row);
        wg_mbar_expect_tx(v_full0 + 8 * s, kTileBytes);
        wg_tma_load(dv, &tmV, v_full0 + 8 * s, kcol, row);
        wg_tma_load(dv + kTileBytes / 2, &tmV, v_full0 + 8 * s, kcol + 64, row);
      }
    }
    return;
  }

  // ================= consumers: 64 query rows each =================
  aw_regs_consumer();
  const int cw = wg - 1, t = tid & 127, warp = t >> 5, lane = t & 31, g = lane >> 2, tq = lane & 3;
  const long long first = m0 + cw * 64;                // the consumer's first row
  const long long row_lo = first + warp * 16 + g;  // the thread's rows: row_lo and row_lo + 8
  const float scale = 1.4426950408889634f * rsqrtf(128.f);  // log2(e) / sqrt(d)
  // The tiles a row of this consumer sees (key 0 is seen by every row; none where its rows
  // are all past T); the block's later tiles are only released.
  const int mine = first >= T ? 0 : min(tiles, static_cast<int>((S + first + 63) / BN) + 1);
  float acc[64];  // O: rows g, g + 8 of the warp's 16, dims 8 j + 2 tq + {0, 1} (acc[4 j + e])
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  // a row's base (a max of its unscaled scores, moved lazily) and sum
  float mx[2] = {-AP_INF, -AP_INF}, sum[2] = {0.f, 0.f};

  // This consumer's 128 threads (named barrier 1 or 2; immediate ids, so ptxas reserves only those).
  auto consumer_bar = [&] {
    if (cw == 0)
      wg_named_bar<1, 128>();
    else
      wg_named_bar<2, 128>();
  };
  auto stage_of = [&](int j, unsigned& ph) {
    ph = static_cast<unsigned>(j / STAGES) & 1u;
    return j % STAGES;
  };
  // S = Q K^T of tile j's stage s into sc (issued and committed, not waited for).
  const unsigned long long dq = wg_desc(sq + cw * 64 * 128, 16, 1024);  // this consumer's rows of Q
  auto issue_s = [&](int s, float(&sc)[BN / 2]) {
    const unsigned long long dk = wg_desc(ring + s * kStageBytes, 16, 1024);
    wg_mma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const unsigned long long da = wg_desc_plus(dq, (kk >> 2) * (kQBytes / 2) + (kk & 3) * 32);
      const unsigned long long db = wg_desc_plus(dk, (kk >> 2) * (kTileBytes / 2) + (kk & 3) * 32);
      aw_mma_ss(sc, da, db, kk);
    }
    wg_mma_commit();
  };
  // Once tile j's V has landed: the block's last tile's V rows past the keys with data are
  // zeroed (both consumers write the same zeros; each fences its own writes before its
  // wgmmas read them).
  auto v_ready = [&](int j) {
    unsigned ph;
    const int s = stage_of(j, ph);
    wg_mbar_wait(v_full0 + 8 * s, ph);
    const long long past = static_cast<long long>(j) * BN + BN - n_keys;
    if (past > 0) {
      unsigned char* const sv = aw_smem + (ring + s * kStageBytes + kTileBytes - wg_smem_u32(aw_smem));
      const int r0 = static_cast<int>(BN - past);
      for (int i = t; i < static_cast<int>(past) * 16; i += 128) {
        const int r = r0 + (i >> 4), c = i & 15;
        *reinterpret_cast<uint4*>(sv + (c >> 3) * (kTileBytes / 2) + r * 128 + (c & 7) * 16) = make_uint4(0, 0, 0, 0);
      }
      wg_fence_proxy_async();
      consumer_bar();
    }
  };
  // O += P V of tile j's stage s (issued and committed).
  auto issue_pv = [&](int s, const unsigned(&pa)[BN / 16][4]) {
    const unsigned long long dv = wg_desc(ring + s * kStageBytes + kTileBytes, kTileBytes / 2, 1024);
    wg_mma_fence();
    // V's tile N-major: 16 keys of k16 step kk at +2048 bytes, the second 64 dims a box on
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      aw_mma_rs(acc, pa[kk], wg_desc_plus(dv, kk * 2048));
    wg_mma_commit();
  };
  // The online softmax of tile j's scores: the causal edge masked (key k visible to row r iff
  // k <= S + r), the rows' base and sum updated, the probabilities as bf16 A fragments in pa
  // (k16 step kk is the scores' n8 tiles 2 kk and 2 kk + 1), and corr, the factor O's rows
  // are to be rescaled by.
  auto softmax = [&](int j, float(&sc)[BN / 2], unsigned(&pa)[BN / 16][4], float(&corr)[2]) {
    const long long key0 = static_cast<long long>(j) * BN;
    // Only a tile that crosses the warp's causal edge is masked, in a pass of its own with
    // 32-bit compares of the key's column in the tile against the row's last visible one
    // (S + row - key0: -CAP < . < BN + 16 in such a tile); interleaved with the max, the masking was
    // predicated into every tile.
    if (key0 + BN - 1 > S + first + warp * 16) {
      const int lim_lo = static_cast<int>(S + row_lo - key0), lim_hi = lim_lo + 8;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (8 * n + 2 * tq + (e & 1) > ((e & 2) ? lim_hi : lim_lo)) sc[4 * n + e] = -AP_INF;
    }
    float tmax[2] = {-AP_INF, -AP_INF};
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) tmax[e >> 1] = fmaxf(tmax[e >> 1], sc[4 * n + e]);
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      // The row's base (mx) moves only where the tile's max passes it by more than 8 in base 2
      // (or the row had none): the probabilities stay at most 2^8, and O is rarely rescaled.
      const float mnew = tmax[r] * scale > mx[r] * scale + 8.f ? tmax[r] : mx[r];
      base[r] = mnew == -AP_INF ? 0.f : mnew * scale;  // a row with no key yet subtracts 0
      // 1 where the base did not move (exactly: ex2.approx of an FMA's rounding would miss it), 0
      // where the row had no key yet (its O and sum are 0)
      corr[r] = mnew == mx[r] ? 1.f : aw_exp2(mx[r] * scale - base[r]);
      mx[r] = mnew;
    }
    float tsum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = aw_exp2(fmaf(sc[4 * n + e], scale, -base[e >> 1]));
        sc[4 * n + e] = p;
        tsum[e >> 1] += p;
      }
    sum[0] = sum[0] * corr[0] + tsum[0];
    sum[1] = sum[1] * corr[1] + tsum[1];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = ap_pack(sc[8 * kk], sc[8 * kk + 1]);
      pa[kk][1] = ap_pack(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = ap_pack(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = ap_pack(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };
  auto rescale = [&](const float(&corr)[2]) {
    if (!__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;  // no row's base moved
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      acc[4 * i] *= corr[0], acc[4 * i + 1] *= corr[0];
      acc[4 * i + 2] *= corr[1], acc[4 * i + 3] *= corr[1];
    }
  };
  auto done = [&](int s) {
    if (t == 0) wg_mbar_arrive(empty0 + 8 * s);  // this consumer is done with the stage
  };
  wg_mbar_wait(q_full, 0);

  for (int j = 0; j < mine; ++j) {
    unsigned ph;
    const int s = stage_of(j, ph);
    float sc[BN / 2];
    float corr[2];
    unsigned pa[BN / 16][4];
    wg_mbar_wait(k_full0 + 8 * s, ph);
    issue_s(s, sc);
    v_ready(j);
    wg_mma_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wg_fence_reg(sc[i]);
    softmax(j, sc, pa, corr);
    rescale(corr);
    issue_pv(s, pa);
    wg_mma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) wg_fence_reg(acc[i]);
    done(s);
  }
  // The block's tiles no row of this consumer sees: released once filled.
  for (int j = mine; j < tiles; ++j) {
    unsigned ph;
    const int s = stage_of(j, ph);
    wg_mbar_wait(k_full0 + 8 * s, ph);
    wg_mbar_wait(v_full0 + 8 * s, ph);
    done(s);
  }

  // The output: each row divided by its sum, bf16, staged in this consumer's rows of the Q tile
  // (which only it reads), then 16-byte stores of whole rows.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    sum[r] = sum[r] > 0.f ? 1.f / sum[r] : 0.f;
  }
  unsigned char* const stage = aw_smem + (sq - wg_smem_u32(aw_smem));
  const int lr = cw * 64 + warp * 16 + g;  // the tile's row of row_lo
#pragma unroll
  for (int jn = 0; jn < 16; ++jn) {
    const int box = jn >> 3, c = jn & 7;  // dims 8 jn .. 8 jn + 7: box dims / 64, chunk (dims % 64) / 8
    *reinterpret_cast<unsigned*>(stage + box * (kQBytes / 2) + aw_swz(lr, c) + 4 * tq) =
        ap_pack(acc[4 * jn] * sum[0], acc[4 * jn + 1] * sum[0]);
    *reinterpret_cast<unsigned*>(stage + box * (kQBytes / 2) + aw_swz(lr + 8, c) + 4 * tq) =
        ap_pack(acc[4 * jn + 2] * sum[1], acc[4 * jn + 3] * sum[1]);
  }
  consumer_bar();
  for (int i = t; i < 64 * 16; i += 128) {
    const int r = cw * 64 + (i >> 4), c = i & 15;
    const long long row = m0 + r;
    if (row >= T) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + (c >> 3) * (kQBytes / 2) + aw_swz(r, c & 7));
    *reinterpret_cast<uint4*>(o + (row * HQ + hq) * 128 + c * 8) = v;
  }
}
