// Prefill attention over a KV cache on the tensor cores (flash attention with
// mma.sync m16n8k16, bf16 in, fp32 accumulate), grouped-query, causal with the
// past offset S:
//   q [T, HQ, 128]: T new tokens at positions S .. S+T-1;
//   k_cache, v_cache [CAP, HKV, 128]: rows 0 .. S+T-1 hold the keys and values;
//   token i sees keys 0 .. S+i (aligned bottom-right: the new tokens see the whole
//   cache); query head hq reads KV head hq / (HQ / HKV), the cache never copied.
// Block (hq, m): BM query tokens of one query head, NW = BM / 16 warps of 16 rows
// each. The block walks the keys its last row sees in tiles of BN, K and V tiles
// double-buffered in shared memory through cp.async (the next tile loads while this
// one is used); each warp computes its 16 x BN scores (Q fragments held in
// registers), masks the causal edge, keeps a running max and sum per row (online
// softmax, in base 2), turns the scores into bf16 A fragments in registers (the
// accumulator layout of two n8 tiles is the A layout of one k16 step) and adds
// P . V into its 16 x 128 fp32 output. Shared rows are 256 bytes, their 16-byte
// chunks XOR-swizzled by the row (ldmatrix reads 8 rows at one chunk: no bank
// conflicts). Blocks run the heaviest query tiles (the last, seeing the most keys)
// first.
#include "attn_mma.cuh"


#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif

namespace {

constexpr int kD = 128;
constexpr int kNW = BM / 16;

// Rows [row0, row0 + rows) of a [*, stride]-strided bf16 tensor's 128-wide slice
// into a swizzled tile; rows at or past `valid` are zero-filled.
__device__ __forceinline__ void ap_load_tile(unsigned tile, const __nv_bfloat16* base, long long row0, int rows,
                                             long long valid, long long stride) {
  for (int i = threadIdx.x; i < rows * 16; i += kNW * 32) {
    const int r = i >> 4, c = i & 15;
    const long long g = row0 + r;
    const bool ok = g < valid;
    ap_cp16(tile + ap_off(r, c), base + (ok ? g : 0) * stride + c * 8, ok);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kNW * 32)
    attn_prefill(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ kc,
                 const __nv_bfloat16* __restrict__ vc, __nv_bfloat16* __restrict__ o, long long T, long long S_arg,
                 long long CAP, long long HQ, long long HKV) {
  (void)CAP;
  const long long S = kiln_cell(S_arg);  // a program's cell holds it where the launch is sized for its bucket
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Blocks start x fastest: every head's last query tile (the most keys) first.
  const long long m0 = (static_cast<long long>(gridDim.y) - 1 - blockIdx.y) * BM;
  const long long hq = blockIdx.x, h = hq / (HQ / HKV);
  const long long rows_end = m0 + BM < T ? m0 + BM : T;
  const long long keys = S + rows_end;  // the keys the block's last row sees
  const int tiles = static_cast<int>((keys + BN - 1) / BN);

  const unsigned sq = ap_smem(smem);
  // K tile of buffer b at sk + b BN 256, V tile at sv + b BN 256 (arithmetic: an indexed array would go to local memory)
  const unsigned sk = sq + BM * 256, sv = sk + 2 * BN * 256;

  // Q's rows (token t at q[(t HQ + hq) 128]) and the first K and V tiles.
  ap_load_tile(sq, q + hq * kD, m0, BM, T, HQ * kD);
  ap_load_tile(sk, kc + h * kD, 0, BN, keys, HKV * kD);
  ap_load_tile(sv, vc + h * kD, 0, BN, keys, HKV * kD);
  ap_commit();

  // Per thread: rows r = lane / 4 and r + 8 of the warp's 16; output dims 8 j + 2 (lane % 4) + {0, 1}.
  const long long row_lo = m0 + warp * 16 + (lane >> 2), row_hi = row_lo + 8;
  const long long warp_last = m0 + warp * 16 + 15;
  float acc[kD / 8][4];
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float mx[2] = {-AP_INF, -AP_INF}, sum[2] = {0.f, 0.f};
  const float scale = 1.4426950408889634f * rsqrtf(static_cast<float>(kD));  // log2(e) / sqrt(d)
  unsigned qf[kD / 16][4];

  for (int t = 0; t < tiles; ++t) {
    ap_wait_all();
    __syncthreads();  // tile t is in; every warp is done with tile t - 1's buffers
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        ap_ldsm4(sq + ap_off(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)), qf[kk][0], qf[kk][1], qf[kk][2],
                 qf[kk][3]);
    }
    if (t + 1 < tiles) {
      ap_load_tile(sk + ((t + 1) & 1) * BN * 256, kc + h * kD, static_cast<long long>(t + 1) * BN, BN, keys, HKV * kD);
      ap_load_tile(sv + ((t + 1) & 1) * BN * 256, vc + h * kD, static_cast<long long>(t + 1) * BN, BN, keys, HKV * kD);
      ap_commit();
    }
    const long long k0 = static_cast<long long>(t) * BN;
    if (k0 > S + warp_last) continue;  // no row of this warp sees a key of the tile
    const unsigned kt = sk + (t & 1) * BN * 256, vt = sv + (t & 1) * BN * 256;

    // Scores: 16 rows x BN keys, BN / 8 n8 tiles; scaled to base 2, the causal edge masked
    // (key j visible to row i iff j <= S + i).
    float s[BN / 8][4];
    ap_scores<BN>(s, qf, kt, lane);
    const bool edge = k0 + BN - 1 > S + m0 + warp * 16;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * scale;
        if (edge) {
          const long long j = k0 + n * 8 + 2 * (lane & 3) + (e & 1);
          if (j > S + (e < 2 ? row_lo : row_hi)) v = -AP_INF;
        }
        s[n][e] = v;
      }
    ap_softmax_step<BN>(s, mx, sum, acc);
    ap_pv<BN>(acc, s, vt, lane);
  }
  ap_wait_all();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    sum[r] = 1.f / sum[r];
  }
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    const int d = j * 8 + 2 * (lane & 3);
    if (row_lo < T)
      *reinterpret_cast<__nv_bfloat162*>(o + (row_lo * HQ + hq) * kD + d) =
          __floats2bfloat162_rn(acc[j][0] * sum[0], acc[j][1] * sum[0]);
    if (row_hi < T)
      *reinterpret_cast<__nv_bfloat162*>(o + (row_hi * HQ + hq) * kD + d) =
          __floats2bfloat162_rn(acc[j][2] * sum[1], acc[j][3] * sum[1]);
  }
}
