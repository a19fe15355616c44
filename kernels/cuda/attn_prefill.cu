// Prefill attention over a KV cache on the tensor cores (flash attention with
// mma.sync m16n8k16, bf16 in, fp32 accumulate), grouped-query, causal with the
// past offset S:
//   q [T, HQ, 128]: T new tokens at positions S .. S+T-1;
//   k_cache, v_cache [CAP, HKV, 128]: rows 0 .. S+T-1 hold the keys and values;
//   token i sees keys 0 .. S+i (aligned bottom-right: the new tokens see the whole
//   cache); query head hq reads KV head hq / (HQ / HKV), the cache never copied.
// Block (m, hq): BM query tokens of one query head, NW = BM / 16 warps of 16 rows
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
#include <cuda_bf16.h>


#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif

namespace {

constexpr int kD = 128;
constexpr int kNW = BM / 16;
#define AP_INF __int_as_float(0x7f800000)

__device__ __forceinline__ unsigned ap_smem(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Byte offset of 16-byte chunk c (0..15) of row r in a swizzled tile of 256-byte rows.
__device__ __forceinline__ unsigned ap_off(int r, int c) { return r * 256 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void ap_cp16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void ap_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void ap_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ap_ldsm4(unsigned addr, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
__device__ __forceinline__ void ap_ldsm4t(unsigned addr, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
__device__ __forceinline__ void ap_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned ap_pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

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
                 const __nv_bfloat16* __restrict__ vc, __nv_bfloat16* __restrict__ o, long long T, long long S,
                 long long CAP, long long HQ, long long HKV) {
  (void)CAP;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long m0 = (static_cast<long long>(gridDim.x) - 1 - blockIdx.x) * BM;  // heaviest tiles first
  const long long hq = blockIdx.y, h = hq / (HQ / HKV);
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

    // Scores: 16 rows x BN keys, BN / 8 n8 tiles.
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int n = 0; n < BN / 8; n += 2) {
        unsigned b0, b1, b2, b3;
        ap_ldsm4(kt + ap_off(n * 8 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)), b0, b1, b2, b3);
        ap_mma(s[n], qf[kk], b0, b1);
        ap_mma(s[n + 1], qf[kk], b2, b3);
      }
    // Scale to base 2; mask the causal edge (key j visible to row i iff j <= S + i).
    const bool edge = k0 + BN - 1 > S + m0 + warp * 16;
    float tmax[2] = {-AP_INF, -AP_INF};
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
        tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      const float mnew = fmaxf(mx[r], tmax[r]);
      // A row that has seen no key yet (its max still -inf) subtracts 0, not -inf.
      const float base = mnew == -AP_INF ? 0.f : mnew;
      corr[r] = exp2f(mx[r] - base);
      mx[r] = mnew;
      tmax[r] = base;
    }
    float tsum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] - tmax[e >> 1]);
        s[n][e] = p;
        tsum[e >> 1] += p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) sum[r] = sum[r] * corr[r] + tsum[r];  // quad-partial; reduced at the end
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      acc[j][0] *= corr[0], acc[j][1] *= corr[0];
      acc[j][2] *= corr[1], acc[j][3] *= corr[1];
    }
    // O += P . V: k16 steps over the tile's keys, n8 tiles over the 128 dims.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned a[4] = {ap_pack(s[2 * kk][0], s[2 * kk][1]), ap_pack(s[2 * kk][2], s[2 * kk][3]),
                             ap_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), ap_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int j = 0; j < kD / 8; j += 2) {
        unsigned b0, b1, b2, b3;
        ap_ldsm4t(vt + ap_off(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), j + (lane >> 4)), b0, b1, b2, b3);
        ap_mma(acc[j], a, b0, b1);
        ap_mma(acc[j + 1], a, b2, b3);
      }
    }
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
