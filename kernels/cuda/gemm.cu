// bf16 / fp16 GEMM on the tensor cores (mma.sync m16n8k16, fp32 accumulate):
//   C[M,N] = epilogue(A[M,K] . B)          A, C row-major; any M, N, K
// The family kernels/cuda/gemm.toml: a member is one GEMM problem, whose defines
// (gemm_problem.cuh) choose, at compile time:
//   the layout of B   GEMM_LAYOUT_NT: B is N x K row-major (a linear layer's weight), C = A . B^T;
//                     GEMM_LAYOUT_NN: B is K x N row-major, C = A . B
//   the element type  GEMM_DTYPE_BF16 or GEMM_DTYPE_F16 (A, B, C, bias, R all of it)
//   the epilogue, on the fp32 accumulators before the single rounding to the element type:
//     GEMM_EPI_NONE       C = A.B
//     GEMM_EPI_BIAS       C = A.B + bias[n]
//     GEMM_EPI_RESIDUAL   C = A.B + R[m,n]                (R: M x N)
//     GEMM_EPI_SILU       C = silu(A.B)                   silu(x) = x / (1 + exp(-x))
//     GEMM_EPI_GELU       C = gelu(A.B)                   the erf form: 0.5 x (1 + erf(x / sqrt 2)), erf to 1.5e-7
//     GEMM_EPI_BIAS_GELU  C = gelu(A.B + bias[n])         (erf form)
//     GEMM_EPI_GATED      C = silu(A.Bg) * (A.Bu)         two weights, same layout as B, one pass over A
// Entry `gemm`, its arguments the problem's (GEMM_PARAMS): A, B (or Bg, Bu), C[, bias | R], M, N, K.
// R may be the same buffer as C (in place) when SPLIT == 1: every R element of a tile is
// read before the barrier that precedes the stores of that tile. (Not with SPLIT > 1.)
//
// Params (the spec's config space; all #defined by kiln):
//   BM, BN, BK   block tile; BK in {32, 64}, BN in {64, 128, 256}, BM a multiple of 16
//   WM, WN       warp tile (WM % 16 == 0, WN % 16 == 0); (BM/WM)*(BN/WN) warps a block
//   STAGES       cp.async pipeline depth, 2..5
//   SPLIT        split-K over blockIdx.z (1, 2, 4, 8), any epilogue. The SPLIT blocks of a
//                tile form one thread-block cluster (__cluster_dims__(1, 1, SPLIT)); their
//                fp32 partial tiles are summed through distributed shared memory, in fp32 and
//                in a fixed order, before the epilogue: no workspace, no zeroed C, no atomics,
//                deterministic, and as exact as SPLIT == 1 (needs BM*BN*4*NB bytes of shared
//                memory, see the spec's `shared`).
//   GROUP_M      raster swizzle: consecutive blocks walk GROUP_M tile-rows of C before the
//                next tile-column, so the A and B tiles they share stay in L2
//   VEC          8: 16-byte cp.async loads and 16-byte stores; the call must have 16-byte
//                aligned A, B, C (and R), K % 8 == 0 and N % 8 == 0 (the spec's constraint).
//                1: any shape and alignment: guarded scalar loads, stored to shared memory
//                by the threads themselves (same pipeline, no cp.async), scalar stores.
//
// Design. A block computes a BM x BN tile of C; each warp a WM x WN part of it as
// (WM/16) x (WN/8) m16n8 fragments. Tiles of A (BM x BK) and B are staged in a ring of
// STAGES shared-memory buffers filled by cp.async (16-byte copies, zero-filled beyond
// the matrices' edges: src-size 0), STAGES-1 tiles ahead of the one being multiplied.
// Shared tiles are stored in 16-byte chunks with an XOR swizzle (see swz) so that both
// the cp.async writes and the ldmatrix reads are bank-conflict free, with no padding.
// Fragments come from ldmatrix.x4 (A and an nt B tile: plain; an nn B tile, stored
// k-major: .trans). The epilogue applies the bias/residual/activation on the fp32
// accumulators, rounds to the element type, stages the tile through shared memory (swizzled again)
// and writes C with 16-byte stores (VEC 8) or guarded scalar stores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(WM) || !defined(WN) || !defined(STAGES) || \
    !defined(SPLIT) || !defined(GROUP_M) || !defined(VEC)
#error "gemm.cu: the params BM BN BK WM WN STAGES SPLIT GROUP_M VEC must be defined"
#endif

#include "gemm_problem.cuh"  // the member's problem: element type, epilogue, parameters
#include "gemm_common.cuh"  // PTX wrappers, tile order, split-K finish; the epilogues' math

#define GEMM_NWN (BN / WN)                   // warps along N
#define GEMM_NT ((BM / WM) * (BN / WN) * 32)  // threads
#define GEMM_MI (WM / 16)                    // m16 fragments a warp
#define GEMM_NI (WN / 8)                     // n8 fragments a warp
#define GEMM_NB GEMM_WEIGHTS
#define GEMM_A_ELEMS (BM * BK)
#define GEMM_B_ELEMS (BN * BK)
#define GEMM_STAGE_ELEMS (GEMM_A_ELEMS + GEMM_NB * GEMM_B_ELEMS)
// Launch bounds. With the block size alone, ptxas picks a register count at an occupancy
// boundary and may accept a few bytes of spills to reach it; it did so (4 to 32 bytes) for
// gated and VEC 1 configs, so those also say "1 block an SM is enough", which
// lets ptxas use what it needs (up to 255). For the others the block size alone gave the
// faster code (the 8-warp 128 x 128 tile: 126 registers and 2 blocks an SM, 370 TFLOP/s,
// against 155 registers, 1 block, 277 TFLOP/s with the ", 1") and no spills in any config.
#if GEMM_GATED || VEC == 1
#define GEMM_LAUNCH_BOUNDS __launch_bounds__(GEMM_NT, 1)
#else
#define GEMM_LAUNCH_BOUNDS __launch_bounds__(GEMM_NT)
#endif
#if SPLIT > 1
#define GEMM_CLUSTER __cluster_dims__(1, 1, SPLIT)  // the SPLIT K-slices of a tile: one cluster
#else
#define GEMM_CLUSTER
#endif

static_assert(!GEMM_RMSNORM, "gemm.cu has no RMSNorm prologue: a family member of it cannot be a *_rmsnorm problem");
static_assert(BK == 32 || BK == 64, "BK must be 32 or 64");
static_assert(BN % 64 == 0, "BN must be a multiple of 64 (the k-major B tile and the C staging swizzle)");
static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "inconsistent warp tiling");
static_assert(STAGES >= 2 && STAGES <= 5, "STAGES in 2..5");
static_assert(SPLIT == 1 || SPLIT == 2 || SPLIT == 4 || SPLIT == 8, "SPLIT in {1, 2, 4, 8}");
static_assert(BM % SPLIT == 0, "each block of a split-K cluster finishes BM / SPLIT rows");
static_assert(VEC == 1 || VEC == 8, "VEC is 1 or 8");
static_assert(GROUP_M >= 1, "GROUP_M >= 1");

// Element offset of 16-byte chunk `chunk` of row `row` in a tile of CPR chunks a row.
// Rows of 8+ chunks: the chunk index's low 3 bits are XORed with row % 8, so the 8
// rows an ldmatrix phase reads at one logical chunk (rows r0..r0+7, r0 % 8 == 0) hit 8
// different 16-byte bank groups. Rows of 4 chunks (64 bytes; two rows a 128-byte line):
// XOR with (row / 2) % 4, the line index, which does the same. Eight consecutive chunks
// (one 128-byte line, as cp.async writes them) are permuted within their line: also
// conflict free.
template <int CPR>
__device__ __forceinline__ int gemm_swz(int row, int chunk) {
  static_assert(CPR == 4 || CPR % 8 == 0, "4 or a multiple of 8 chunks a row");
  if (CPR == 4) return (row * CPR + (chunk ^ ((row >> 1) & 3))) * 8;
  return (row * CPR + (chunk ^ (row & 7))) * 8;
}

__device__ __forceinline__ void gemm_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gemm_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void gemm_ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void gemm_ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D += A . B for one m16n8k16 fragment: a[4] (row-major A), b[2] (column-major B),
// d[4]: d0, d1 at (row lane/4, cols 2*(lane%4) + 0, 1), d2, d3 at row lane/4 + 8.
__device__ __forceinline__ void gemm_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." GEMM_MMA_TYPE "." GEMM_MMA_TYPE
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void gemm_st_shared16(unsigned addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Global -> shared, one ROWS x (CPR*8) tile: element (r, c) of the tile is
// g[(row0 + r) * ld + col0 + c], zero where row0 + r >= rmax or col0 + c >= cmax.
// Thread tid copies chunk column tid % CPR of rows tid / CPR + j * (NT / CPR).
template <int ROWS, int CPR>
__device__ __forceinline__ void gemm_load_tile(unsigned s_tile, const gemm_t* __restrict__ g,
                                               long long ld, long long row0, long long rmax, long long col0,
                                               long long cmax, int tid) {
  static_assert(GEMM_NT % CPR == 0, "threads a multiple of the chunks a row");
  constexpr int RSTEP = GEMM_NT / CPR;
  constexpr int ITERS = (ROWS + RSTEP - 1) / RSTEP;
  const int c = tid % CPR;
  const long long gc = col0 + c * 8;
#pragma unroll
  for (int j = 0; j < ITERS; ++j) {
    const int r = tid / CPR + j * RSTEP;
    if (ROWS % RSTEP == 0 || r < ROWS) {
      const long long gr = row0 + r;
      const int off = gemm_swz<CPR>(r, c);
#if VEC == 8
      const bool valid = gr < rmax && gc < cmax;  // whole chunks: cmax % 8 == 0 here
      ptx_cp_async16(s_tile + off * 2, valid ? g + gr * ld + gc : g, valid);
#else
      const unsigned short* gs = reinterpret_cast<const unsigned short*>(g);
      unsigned short h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = gr < rmax && gc + e < cmax ? gs[gr * ld + gc + e] : (unsigned short)0;
      gemm_st_shared16(s_tile + off * 2, make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16,
                                                    h[4] | (unsigned)h[5] << 16, h[6] | (unsigned)h[7] << 16));
#endif
    }
  }
}



extern "C" __global__ void GEMM_CLUSTER GEMM_LAUNCH_BOUNDS gemm(GEMM_PARAMS) {
  extern __shared__ __align__(1024) unsigned char gemm_smem[];
  gemm_t* const sm = reinterpret_cast<gemm_t*>(gemm_smem);
  (void)sm;  // unused where SPLIT > 1
  const unsigned sm_u32 = static_cast<unsigned>(__cvta_generic_to_shared(gemm_smem));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / GEMM_NWN, warp_n = warp % GEMM_NWN;

  long long bm, bn;  // this block's tile
  gemm_tile_of(blockIdx.x, M, N, bm, bn);

  // This block's part of K: whole BK tiles.
  const GemmKSlice kslice = gemm_k_slice(K, BK);
  const long long kbeg = kslice.beg;
  const int ktiles = kslice.tiles;

  // Stage s: A tile at sm + s * STAGE_ELEMS, then the B tile(s).
  auto load_stage = [&](int s, long long k0) {
    const int base = s * GEMM_STAGE_ELEMS;
    gemm_load_tile<BM, BK / 8>(sm_u32 + base * 2, A, K, bm, M, k0, K, tid);
#pragma unroll
    for (int j = 0; j < GEMM_NB; ++j) {
      const int bb = base + GEMM_A_ELEMS + j * GEMM_B_ELEMS;
#if GEMM_GATED
      const gemm_t* Bj = j == 0 ? B0 : B1;
#else
      const gemm_t* Bj = B0;
#endif
#if GEMM_B_NT
      gemm_load_tile<BN, BK / 8>(sm_u32 + bb * 2, Bj, K, bn, N, k0, K, tid);  // [BN][BK]
#else
      gemm_load_tile<BK, BN / 8>(sm_u32 + bb * 2, Bj, N, k0, K, bn, N, tid);  // [BK][BN]
#endif
    }
  };

  float acc[GEMM_NB][GEMM_MI][GEMM_NI][4];
#pragma unroll
  for (int j = 0; j < GEMM_NB; ++j)
#pragma unroll
    for (int mi = 0; mi < GEMM_MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < GEMM_NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][mi][ni][e] = 0.f;

  // Per-lane parts of the ldmatrix addresses. Every row an ldmatrix reads is
  // (a multiple of 8) + (lane % 8), so the swizzle's XOR term is a function of the lane.
  // A (and an nt B tile): lanes 0-15 give rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at
  // k 8-15: matrices a0 (rows 0-7, k 0-7), a1 (rows 8-15, k 0-7), a2 (rows 0-7, k 8-15),
  // a3 (rows 8-15, k 8-15), the m16n8k16 A fragment.
  const int a_row = warp_m * WM + (lane & 15);
  const int a_chk = lane >> 4;
#if GEMM_B_NT
  // B as [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
  // = b0, b1 of n-fragment 2p, then b0, b1 of fragment 2p+1.
  const int b_row = warp_n * WN + ((lane >> 4) << 3) + (lane & 7);
  const int b_chk = (lane >> 3) & 1;
#else
  // B as [k][n], transposed by ldmatrix.trans: matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
  // (k 0-7, n 8-15), (k 8-15, n 8-15) = b0, b1 of fragment 2p, b0, b1 of fragment 2p+1.
  const int b_row = (((lane >> 3) & 1) << 3) + (lane & 7);
  const int b_chk = warp_n * (WN / 8) + (lane >> 4);
#endif

  auto compute = [&](int s) {
    const unsigned sa = sm_u32 + s * GEMM_STAGE_ELEMS * 2;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned af[GEMM_MI][4];
#pragma unroll
      for (int mi = 0; mi < GEMM_MI; ++mi)
        gemm_ldsm_x4(af[mi], sa + gemm_swz<BK / 8>(a_row + mi * 16, kk * 2 + a_chk) * 2);
#pragma unroll
      for (int j = 0; j < GEMM_NB; ++j) {
        const unsigned sb = sa + (GEMM_A_ELEMS + j * GEMM_B_ELEMS) * 2;
        unsigned bf[GEMM_NI / 2][4];
#pragma unroll
        for (int p = 0; p < GEMM_NI / 2; ++p) {
#if GEMM_B_NT
          gemm_ldsm_x4(bf[p], sb + gemm_swz<BK / 8>(b_row + p * 16, kk * 2 + b_chk) * 2);
#else
          gemm_ldsm_x4_trans(bf[p], sb + gemm_swz<BN / 8>(kk * 16 + b_row, b_chk + p * 2) * 2);
#endif
        }
#pragma unroll
        for (int mi = 0; mi < GEMM_MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < GEMM_NI; ++ni)
            gemm_mma(acc[j][mi][ni], af[mi], bf[ni / 2][(ni & 1) * 2], bf[ni / 2][(ni & 1) * 2 + 1]);
      }
    }
  };

  // The pipeline. Before iteration kt, tiles kt .. kt+STAGES-2 have been issued (one
  // commit group each, empty groups past the end keep the count). wait_group(STAGES-2)
  // leaves at most STAGES-2 groups in flight, so tile kt has landed for this thread; the
  // barrier makes it visible to all, and also tells that every warp is done with
  // iteration kt-1's buffer, which the prefetch of tile kt+STAGES-1 then overwrites.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, kbeg + static_cast<long long>(s) * BK);
    gemm_cp_commit();
  }
  int rd = 0, wr = STAGES - 1;  // stage to read (tile kt), stage to write (tile kt+STAGES-1)
  for (int kt = 0; kt < ktiles; ++kt) {
    gemm_cp_wait<STAGES - 2>();
    __syncthreads();
    if (kt + STAGES - 1 < ktiles) load_stage(wr, kbeg + static_cast<long long>(kt + STAGES - 1) * BK);
    gemm_cp_commit();
    compute(rd);
    rd = rd + 1 == STAGES ? 0 : rd + 1;
    wr = wr + 1 == STAGES ? 0 : wr + 1;
  }
  gemm_cp_wait<0>();
  __syncthreads();  // the pipeline's buffers are free: the epilogue reuses them

#if SPLIT == 1
  // Epilogue on the accumulators: fragment (mi, ni) holds rows lr, lr + 8 and columns
  // lc, lc + 1 of the block tile. Applied, rounded to the element type, staged in shared memory.
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mi = 0; mi < GEMM_MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < GEMM_NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int lr = warp_m * WM + mi * 16 + g + h * 8;  // row in the block tile
        const int lc = warp_n * WN + ni * 8 + t4 * 2;      // column in the block tile
        const long long gr = bm + lr, gc = bn + lc;
        (void)gr;
        (void)gc;
        float v0 = acc[0][mi][ni][2 * h], v1 = acc[0][mi][ni][2 * h + 1];
#if GEMM_HAS_BIAS
        if (gc < N) v0 += epi_to_f(bias[gc]);
        if (gc + 1 < N) v1 += epi_to_f(bias[gc + 1]);
#elif GEMM_HAS_R
        if (gr < M) {
          if (VEC == 8 && gc + 1 < N) {  // N % 8 == 0, R 16-byte aligned: a 4-byte aligned pair
            const gemm_t2 r = *reinterpret_cast<const gemm_t2*>(R + gr * N + gc);
            v0 += epi_to_f(r.x);
            v1 += epi_to_f(r.y);
          } else {
            if (gc < N) v0 += epi_to_f(R[gr * N + gc]);
            if (gc + 1 < N) v1 += epi_to_f(R[gr * N + gc + 1]);
          }
        }
#endif
#if GEMM_EPILOGUE == GEMM_EPI_SILU
        v0 = epi_silu(v0);
        v1 = epi_silu(v1);
#elif GEMM_HAS_GELU
        v0 = epi_gelu(v0);
        v1 = epi_gelu(v1);
#elif GEMM_GATED
        v0 = epi_silu(v0) * acc[1][mi][ni][2 * h];
        v1 = epi_silu(v1) * acc[1][mi][ni][2 * h + 1];
#endif
        // Stage as [BM][BN], swizzled by 16-byte chunk: the 8 rows one store
        // instruction covers fall in 8 different chunks (bank groups).
        *reinterpret_cast<gemm_t2*>(sm + gemm_swz<BN / 8>(lr, lc / 8) + (lc & 7)) = epi_pack(v0, v1);
      }
  __syncthreads();
  // The staged tile to C, a 16-byte chunk (8 columns of a row) at a time.
  constexpr int CPR = BN / 8;
#pragma unroll 4
  for (int i = tid; i < BM * CPR; i += GEMM_NT) {
    const int r = i / CPR, c = i % CPR;
    const long long gr = bm + r, gc = bn + c * 8;
    if (gr >= M) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(sm + gemm_swz<CPR>(r, c));
    if (VEC == 8) {
      if (gc < N) ptx_st_global16(C + gr * N + gc, v);  // N % 8 == 0: whole chunks
    } else {
      const unsigned short* e = reinterpret_cast<const unsigned short*>(&v);
      unsigned short* cs = reinterpret_cast<unsigned short*>(C + gr * N + gc);
#pragma unroll
      for (int q = 0; q < 8; ++q)
        if (gc + q < N) cs[q] = e[q];
    }
  }
#else
  // Split K: the SPLIT blocks of this tile are one cluster (blockIdx.z = rank). Each
  // writes its fp32 partial tile(s) to its own shared memory; after a cluster barrier,
  // rank q sums rows [q*BM/SPLIT, (q+1)*BM/SPLIT) over all SPLIT blocks' shared memory
  // (distributed shared memory, in rank order: deterministic), applies the epilogue and
  // stores; a last cluster barrier keeps every block's shared memory alive until read.
  const int g = lane >> 2, t4 = lane & 3;
  float* const sf = reinterpret_cast<float*>(gemm_smem);
#pragma unroll
  for (int j = 0; j < GEMM_NB; ++j)
#pragma unroll
    for (int mi = 0; mi < GEMM_MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < GEMM_NI; ++ni)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = warp_m * WM + mi * 16 + g + h * 8, lc = warp_n * WN + ni * 8 + t4 * 2;
          *reinterpret_cast<float2*>(sf + j * BM * BN + gemm_fswz(lr, lc)) =
              make_float2(acc[j][mi][ni][2 * h], acc[j][mi][ni][2 * h + 1]);
        }
  ptx_cluster_sync();
#if GEMM_HAS_BIAS
  const gemm_t* const extra = bias;
#elif GEMM_HAS_R
  const gemm_t* const extra = R;
#else
  const gemm_t* const extra = nullptr;
#endif
  gemm_split_finish<GEMM_NB>(sm_u32, tid, GEMM_NT, bm, bn, M, N, C, extra, VEC == 8);
  ptx_cluster_sync();
#endif
}
