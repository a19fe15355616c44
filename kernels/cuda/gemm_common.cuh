// What the GEMM families (gemm.cu: mma.sync, gemm_wgmma.cu: wgmma, gemm_decode.cu)
// share: PTX wrappers for cp.async and 16-byte stores (clusters: ptx_cluster.cuh); for the
// two tile families, the grouped tile order and the split-K finish through distributed
// shared memory. The epilogues' element math is in gemm_epilogue.cuh (included).
// Uses the member's problem (gemm_problem.cuh) and, for the tile families, the params
// BM, BN, GROUP_M and SPLIT of the file that includes it.
#pragma once
#include "gemm_epilogue.cuh"
#include "ptx_cluster.cuh"  // thread-block clusters: rank, barrier, distributed shared memory

// ---- PTX wrappers ----
__device__ __forceinline__ void ptx_cp_async16(unsigned dst, const void* src, bool valid) {
  // src-size 0: nothing is read and the 16 bytes are zero-filled.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// 16-byte stores through PTX: a uint4 assignment may be split into four 4-byte stores.
__device__ __forceinline__ void ptx_st_global16(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
#if defined(BM) && defined(BN)
// The grouped raster of a rows x cols grid of tiles: item pid is at row `r`, column `c`;
// items walk GROUP_M rows down a column, then the next column (neighbours share B columns
// and, within a group, A rows in L2).
__device__ __forceinline__ void gemm_raster(long long pid, long long rows, long long cols, long long& r, long long& c) {
  const long long group = static_cast<long long>(GROUP_M) * cols;
  const long long first_m = pid / group * GROUP_M;
  const long long group_m = rows - first_m < GROUP_M ? rows - first_m : GROUP_M;
  r = first_m + (pid % group) % group_m;
  c = (pid % group) / group_m;
}
// Which tile block `pid` computes, in that raster.
__device__ __forceinline__ void gemm_tile_of(long long pid, long long M, long long N, long long& bm, long long& bn) {
  long long r, c;
  gemm_raster(pid, (M + BM - 1) / BM, (N + BN - 1) / BN, r, c);
  bm = r * BM;
  bn = c * BN;
}

// This block's part of K (blockIdx.z of SPLIT slices), in whole `bk`-deep tiles: [beg, end)
// and its tile count. No block exits early on an empty slice: every block of a split
// cluster must reach its barriers (an empty slice adds zeros).
struct GemmKSlice {
  long long beg, end;
  int tiles;
};
__device__ __forceinline__ GemmKSlice gemm_k_slice(long long K, int bk) {
  const long long chunk = ((K + SPLIT - 1) / SPLIT + bk - 1) / bk * bk;
  GemmKSlice s;
  s.beg = static_cast<long long>(blockIdx.z) * chunk;
  s.end = s.beg + chunk < K ? s.beg + chunk : K;
  s.tiles = s.beg < s.end ? static_cast<int>((s.end - s.beg + bk - 1) / bk) : 0;
  return s;
}

// Float offset of element (row, col) in an fp32 [BM][BN] tile, swizzled by 16-byte
// chunk (4 floats): conflict-free 16-byte reads along a row, and fragment writes
// (8 rows x 4 float2) spread over the banks.
__device__ __forceinline__ int gemm_fswz(int row, int col) {
  return (row * (BN / 4) + ((col >> 2) ^ (row & 7))) * 4 + (col & 3);
}

#if SPLIT > 1
// The split-K finish, after every block of the cluster wrote its fp32 partial tile(s)
// ([NB][BM][BN], gemm_fswz order, at shared address `tiles`) and passed a cluster
// barrier: the block of rank q sums rows [q BM / SPLIT, (q + 1) BM / SPLIT) over the
// SPLIT blocks in rank order (deterministic), applies the epilogue (`extra`: the bias
// or R, else unused), rounds to the element type and stores 8 columns at a
// time (16-byte stores where `vec`). Threads first, first + stride, ... share the work.
template <int NB>
__device__ __forceinline__ void gemm_split_finish(unsigned tiles, int first, int stride, long long bm, long long bn,
                                                  long long M, long long N, gemm_t* C, const gemm_t* extra, bool vec) {
  const unsigned rank = ptx_cluster_rank();
  constexpr int ROWS = BM / SPLIT, CPR = BN / 8;  // rows this block finishes; 8-column chunks a row
  for (int i = first; i < ROWS * CPR; i += stride) {
    const int r = static_cast<int>(rank) * ROWS + i / CPR, c = (i % CPR) * 8;
    const long long gr = bm + r, gc = bn + c;
    if (gr >= M || gc >= N) continue;
    float v[NB][8];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j][e] = 0.f;
      const unsigned lo = tiles + (j * BM * BN + gemm_fswz(r, c)) * 4, hi = tiles + (j * BM * BN + gemm_fswz(r, c + 4)) * 4;
#pragma unroll
      for (int q = 0; q < SPLIT; ++q) {
        const float4 x = ptx_ld_cluster_f4(ptx_map_rank(lo, q)), y = ptx_ld_cluster_f4(ptx_map_rank(hi, q));
        v[j][0] += x.x, v[j][1] += x.y, v[j][2] += x.z, v[j][3] += x.w;
        v[j][4] += y.x, v[j][5] += y.y, v[j][6] += y.z, v[j][7] += y.w;
      }
    }
    unsigned short out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float x = v[0][e];
      const bool in = gc + e < N;
      (void)in;
      (void)extra;
#if GEMM_HAS_BIAS
      if (in) x += epi_to_f(extra[gc + e]);
#elif GEMM_HAS_R
      if (in) x += epi_to_f(extra[gr * N + gc + e]);
#endif
#if GEMM_EPILOGUE == GEMM_EPI_SILU
      x = epi_silu(x);
#elif GEMM_HAS_GELU
      x = epi_gelu(x);
#elif GEMM_GATED
      x = epi_silu(x) * v[NB - 1][e];
#endif
      const gemm_t y = epi_from_f(x);
      out[e] = *reinterpret_cast<const unsigned short*>(&y);
    }
    if (vec) {
      ptx_st_global16(C + gr * N + gc, make_uint4(out[0] | (unsigned)out[1] << 16, out[2] | (unsigned)out[3] << 16,
                                                  out[4] | (unsigned)out[5] << 16, out[6] | (unsigned)out[7] << 16));
    } else {
      unsigned short* cs = reinterpret_cast<unsigned short*>(C + gr * N + gc);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (gc + e < N) cs[e] = out[e];
    }
  }
}
#endif  // SPLIT > 1
#endif  // BM && BN
