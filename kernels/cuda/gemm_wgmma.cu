// bf16 / fp16 GEMM on Hopper's warpgroup tensor-core instructions (wgmma.mma_async,
// fp32 accumulate), sm_90a only:
//   C[M,N] = epilogue(A[M,K] . B)          A, C row-major; any M, N; K % 8 == 0
// The family kernels/cuda/gemm_wgmma.toml: a member is one GEMM problem, whose defines
// (gemm_problem.cuh) choose the layout of B (GEMM_LAYOUT_NT: N x K row-major, a linear layer's
// weight, C = A . B^T, the main case; GEMM_LAYOUT_NN: K x N row-major, C = A . B, needs
// N % 8 == 0), the element type (GEMM_DTYPE_BF16, GEMM_DTYPE_F16) and the epilogue, with the same
// math as gemm.cu's (none, bias, residual, silu, gelu, bias_gelu, gated; R may be C
// itself, in place). Entry `gemm`, the problem's arguments (GEMM_PARAMS).
// Requirements of a call (the spec's constraints): A and B (Bg, Bu) 16-byte aligned,
// K % 8 == 0 (16-byte cp.async chunks; the K tail inside the last 64-wide tile is
// zero-filled), and for nn also N % 8 == 0. C, R and bias have no alignment or shape
// requirement: the kernel checks at run time whether C can take 16-byte stores (N % 8 == 0
// and C 16-byte aligned) and R 16-byte loads, and falls back to 2-byte accesses.
// Measured on an H100 (GEMM_WGMMA_NOTES.md): the default 128 x 256 tile runs 4096^3 at
// about 0.97 of cuBLAS (cublasGemmEx, bf16).
//
// Params (the spec's config space; all #defined by kiln):
//   BM       block tile rows: 64 (one consumer warpgroup), 128 or 256 (two; each owns
//            BM/2 rows, as one or two m64 wgmma row blocks)
//   BN       block tile columns: 64, 128 or 256 (the TMA kernel without split K also takes 96,
//            160 and 224, where a shape's tiles fill the device's waves better so). The
//            consumer's wgmma is n = min(NB * BN, 256) wide (NB = 2 gated: the Bg and Bu tiles
//            sit side by side in shared memory and one n = 2*BN instruction multiplies both)
//   STAGES   depth of the shared-memory ring of BK = 64 deep A/B tiles, 2..8
//   SPLIT    split K over a cluster of SPLIT blocks (1, 2, 4, 8) that add their fp32
//            partial tiles through distributed shared memory, as gemm.cu does
//   GROUP_M  block raster: consecutive blocks walk GROUP_M tile-rows down a tile-column
//   MINB     blocks an SM the registers are planned for (__launch_bounds__(threads, MINB)):
//            1, or 2 for BM = 64 only (see the register note below)
//
// Design. A block is 1 producer warpgroup + NC = (BM == 64 ? 1 : 2) consumer warpgroups.
//   - Producer (warpgroup 0, registers cut by setmaxnreg where NC = 2): for each k-tile,
//     waits on the stage's `empty` mbarrier, then copies the A tile (BM x 64) and the B
//     tile(s) into the stage with cp.async.cg 16-byte copies (src-size 0 beyond M, N or K:
//     zero fill), written directly in the 128-byte-swizzled layout the wgmma descriptors
//     describe, and ends with cp.async.mbarrier.arrive.noinc on the stage's `full`
//     mbarrier (128 arrivals: one a producer thread, each fired when that thread's copies
//     have landed). (WG_TMA = 1, the TMA family: TMA copies instead; see its entry below.)
//   - Consumers (registers raised by setmaxnreg): wait on `full`, fence.proxy.async (the
//     copies were generic-proxy writes; wgmma reads through the async proxy), then
//     wgmma.fence, 4 k16 steps of m64nNk16 per m64 row block, commit_group, and
//     wait_group(1): the previous k-tile's wgmmas are then complete, and one thread of the
//     warpgroup arrives on that stage's `empty` mbarrier (NC arrivals a phase).
//   - Shared layouts (each stage 1024-byte aligned; tiles start on 1024-byte boundaries):
//       A, and an nt B (K-major): row r of the tile is 128 bytes (64 k), its 16-byte
//       chunk c stored at chunk c ^ (r % 8): the SWIZZLE_128B K-major canonical layout;
//       descriptor SBO = 1024 (8-row core groups), k16 step = +32 bytes of start address.
//       an nn B (MN-major, wgmma's transpose-B bit): BN/64 atoms of [64 k][64 n],
//       8 KiB each; k row k of an atom is 128 bytes (64 n), chunk c at c ^ (k % 8);
//       descriptor LBO = 8192 (next 64 n), SBO = 1024 (next 8 k), k16 step = +2048 bytes.
//   - Epilogue (SPLIT = 1): the consumers synchronise (named barrier), then each warpgroup
//     applies bias/activation on its fp32 accumulators, rounds to the element type, stages its BM/NC x BN
//     slab in shared memory (16-byte chunks XOR-swizzled by row, wg_swz) and writes it with
//     16-byte stores (or 2-byte ones where C cannot take them). The residual stages the slab in
//     fp32 instead and adds R in the store phase (16-byte coalesced reads of R, prefetched
//     into registers before the staging), then rounds once. SPLIT > 1: the
//     fp32 partial tiles go to shared memory, a cluster barrier, rank q sums rows
//     [q*BM/SPLIT, (q+1)*BM/SPLIT) over the cluster (fixed order: deterministic), applies
//     the epilogue and stores; a second cluster barrier keeps the shared memory alive.
// Compile-time options (not params): GEMM_WGMMA_NO_PROXY_FENCE drops the consumer's
// fence.proxy.async; GEMM_WGMMA_WAIT_LIMIT makes an mbarrier wait trap after that many
// polls (a debugging aid against hangs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(BM) || !defined(BN) || !defined(STAGES) || !defined(SPLIT) || !defined(GROUP_M) || !defined(MINB)
#error "gemm_wgmma.cu: the params BM BN STAGES SPLIT GROUP_M MINB must be defined"
#endif

#include "gemm_problem.cuh"  // the member's problem: element type, epilogue, parameters
#include "gemm_common.cuh"  // PTX wrappers, tile order, split-K finish; the epilogues' math
#include "wgmma_ptx.cuh"    // mbarriers, fences, wgmma descriptors and operand lists, TMA loads
#if GEMM_B_NT
#define WG_TRANS_B "0"  // B K-major
#else
#define WG_TRANS_B "1"  // B N-major (transposed)
#endif

#ifndef WG_TMA
#define WG_TMA 0  // 1: the TMA kernel (kernels/cuda/gemm_tma.toml), persistent, tiles loaded by TMA
#endif
#define WG_BK 64                                   // k per stage: one 128-byte swizzle row
#define WG_NB GEMM_WEIGHTS
#ifndef PINGPONG
#define PINGPONG 0  // the TMA kernel's param: 1, two consumer warpgroups take alternate tiles
#endif
#define WG_NC (PINGPONG || BM > 64 ? 2 : 1)        // consumer warpgroups
#define WG_ROWS (PINGPONG ? BM : BM / WG_NC)       // rows a consumer warpgroup owns: 64 or 128
// a consumer's epilogue staging, bytes (WG_EPI_N columns at a time: at most 128 in the TMA kernel)
#define WG_SLAB (WG_ROWS * (WG_TMA && BN > 128 ? 128 : BN) * (GEMM_HAS_R ? 4 : 2))
#define WG_MI (WG_ROWS / 64)                       // m64 row blocks a consumer
#define WG_NTOT (WG_NB * BN)                       // accumulator columns a consumer
#define WG_NI (WG_NTOT < 256 ? WG_NTOT : 256)      // n of one wgmma
#define WG_NSUB (WG_NTOT / WG_NI)                  // wgmmas across the columns
#define WG_NT ((WG_NC + 1) * 128)                  // threads
#define WG_A_BYTES (BM * 128)
#define WG_B_BYTES (WG_NTOT * 128)
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)
// Registers. With two consumer warpgroups (384 threads, 1 block an SM: 168 registers a
// thread at launch) setmaxnreg moves registers from the producer (40) to the consumers
// (232); the counts add up to exactly the launch total (3 x 168 = 40 + 2 x 232). ptxas
// compiles the consumer code to 232 registers, but every wgmma must also fit the entry
// count: with 2 blocks an SM (80 at launch) even an n128 wgmma (64 accumulators) failed
// to compile ("Insufficient registers (80)"), so MINB = 2 is only for one consumer
// warpgroup (BM = 64, 256 threads, 128 registers, no setmaxnreg).
#if WG_NC == 2
static_assert(!GEMM_RMSNORM, "gemm_wgmma.cu has no RMSNorm prologue: a family member of it cannot be a *_rmsnorm problem");
static_assert(MINB == 1, "two consumer warpgroups: 1 block an SM");
#define WG_REGS_PRODUCER 40
#define WG_REGS_CONSUMER 232
#endif
#if SPLIT > 1
#define WG_CLUSTER __cluster_dims__(1, 1, SPLIT)
#else
#define WG_CLUSTER
#endif

static_assert(BM == 64 || BM == 128 || BM == 256, "BM in {64, 128, 256}");
static_assert((BN % 64 == 0 || (WG_TMA && SPLIT == 1 && (BN == 96 || BN == 160 || BN == 224))) && BN <= 256,
              "BN a multiple of 64 (or 96, 160, 224 in the TMA kernel without split K), at most 256");
static_assert(WG_NTOT % WG_NI == 0 && WG_NI % 32 == 0, "whole wgmmas across the columns");
static_assert(WG_MI * WG_NTOT / 2 <= 128, "at most 128 fp32 accumulators a consumer thread");
static_assert(STAGES >= 2 && STAGES <= 8, "STAGES in 2..8");
static_assert(SPLIT == 1 || SPLIT == 2 || SPLIT == 4 || SPLIT == 8, "SPLIT in {1, 2, 4, 8}");
static_assert(BM % SPLIT == 0, "each block of a split-K cluster finishes BM / SPLIT rows");
static_assert(GROUP_M >= 1, "GROUP_M >= 1");
static_assert(MINB == 1 || MINB == 2, "MINB is 1 or 2");
static_assert(!PINGPONG || (WG_TMA && BM <= 128), "ping-pong: the TMA kernel, a consumer's tile at most 128 rows");

// ---- PTX wrappers (the generic ones are in wgmma_ptx.cuh) ----
#if WG_NC == 2
__device__ __forceinline__ void wg_regs_producer() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WG_REGS_PRODUCER));
}
__device__ __forceinline__ void wg_regs_consumer() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WG_REGS_CONSUMER));
}
#endif

// The wgmma instructions, one an n (wgmma_ptx.cuh's WG_MMA_SS for the member's element type and
// B's layout). scale-d = sc: 0 for the first k16 step (D = A.B: the accumulators need no
// zeroing; a zeroing made ptxas serialise the wgmmas of the BN = 64 configs, warning C7515),
// then 1 (D += A.B). wg_mma_nN: D[64 x N] += A (descriptor) . B (descriptor), N / 2 fp32
// accumulators a thread. N, its groups of 8 accumulators (N / 16), and the operand numbers of
// da, db and sc:
#define WG_MMA_DEF(N, G, DA, DB, SC) WG_MMA_SS(wg_mma_n##N, N, G, DA, DB, SC, GEMM_MMA_TYPE, WG_TRANS_B)
WG_MMA_DEF(64, 4, 32, 33, 34)
WG_MMA_DEF(96, 6, 48, 49, 50)
WG_MMA_DEF(128, 8, 64, 65, 66)
WG_MMA_DEF(160, 10, 80, 81, 82)
WG_MMA_DEF(192, 12, 96, 97, 98)
WG_MMA_DEF(224, 14, 112, 113, 114)
WG_MMA_DEF(256, 16, 128, 129, 130)

__device__ __forceinline__ void wg_mma(float (&d)[WG_NI / 2], unsigned long long da, unsigned long long db, int sc) {
#if WG_NI == 64
  wg_mma_n64(d, da, db, sc);
#elif WG_NI == 96
  wg_mma_n96(d, da, db, sc);
#elif WG_NI == 128
  wg_mma_n128(d, da, db, sc);
#elif WG_NI == 160
  wg_mma_n160(d, da, db, sc);
#elif WG_NI == 192
  wg_mma_n192(d, da, db, sc);
#elif WG_NI == 224
  wg_mma_n224(d, da, db, sc);
#else
  wg_mma_n256(d, da, db, sc);
#endif
}

// ---- shared/global accesses, clusters ----
__device__ __forceinline__ void wg_st_shared32(unsigned addr, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void wg_st_shared_f2(unsigned addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1,%2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ float4 wg_ld_shared_f4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 wg_ld_shared16(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

// Element offset of 16-byte chunk `chunk` of row `row` in a staged tile of CPR chunks a
// row (CPR even): the chunk index's low 3 bits XORed with row % 8 (CPR % 8 == 0), so the 8
// rows a fragment store covers hit 8 different bank groups; for the tile widths that are not
// a multiple of 64 (CPR % 8 != 0) the low 2 bits with row % 4, or the low bit with row % 2,
// so a chunk stays in its row (2-way conflicts on the staging stores).
template <int CPR>
__device__ __forceinline__ int wg_swz(int row, int chunk) {
  static_assert(CPR % 2 == 0, "an even number of chunks a row");
  constexpr int X = CPR % 8 == 0 ? 7 : CPR % 4 == 0 ? 3 : 1;
  return (row * CPR + (chunk ^ (row & X))) * 8;
}


// The epilogue's operand: the bias, R, or none.
#if GEMM_HAS_BIAS
#define WG_EXTRA bias
#elif GEMM_HAS_R
#define WG_EXTRA R
#else
#define WG_EXTRA nullptr
#endif

#if SPLIT == 1
// Columns an epilogue stages at a time: the whole tile's, but at most 128 in the TMA kernel,
// whose slabs take shared memory beside the ring (a 128 x 256 tile then keeps 4 stages): there
// a tile wider than 128 in two passes of 128 (BN = 256) or of half the tile (160, 192, 224).
#define WG_EPI_N (WG_TMA && BN > 128 ? (BN % 128 == 0 ? 128 : BN / 2) : BN)
// Float offset of (row, col) in an fp32 slab of W columns: 16-byte chunks XORed by row % 8.
template <int W>
__device__ __forceinline__ int wg_fswz(int row, int col) {
  static_assert(W % 32 == 0, "whole groups of 8 chunks a row: the XOR keeps a chunk in its row");
  return (row * (W / 4) + ((col >> 2) ^ (row & 7))) * 4 + (col & 3);
}
// The epilogue of consumer warpgroup cw (thread t of it): its WG_ROWS x BN block of C at
// (row0, bn), from its accumulators to C, staged WG_EPI_N columns at a time through its slab
// at stg (WG_SLAB bytes; the bias or R is `extra`). kAgain: the slab is staged again for
// another tile, so the warpgroup waits until all of it has been read.
template <bool kAgain>
__device__ __forceinline__ void wg_store_tile(float (&acc)[WG_MI][WG_NSUB][WG_NI / 2], unsigned stg, int cw, int t,
                                              long long row0, long long bn, long long M, long long N, gemm_t* C,
                                              const gemm_t* extra) {
  // Accumulator layout (wgmma m64nN, f32): thread t = 32 w + l of the warpgroup holds, for
  // each 8 columns i, d[4i], d[4i+1] at row 16 w + l/4, columns 8i + 2(l%4) + {0, 1}, and
  // d[4i+2], d[4i+3] at row 16 w + l/4 + 8.
  const int w = t >> 5, l = t & 31, g = l >> 2, t4 = l & 3;
  const bool c_vec = N % 8 == 0 && (reinterpret_cast<unsigned long long>(C) & 15) == 0;
  constexpr int EN = WG_EPI_N;               // columns a pass
  constexpr int CCH = EN / 8;                // 8-column chunks a row of a pass
  auto bar = [&] {
    if (cw == 0)
      wg_named_bar<2, 128>();
    else
      wg_named_bar<3, 128>();
  };
#pragma unroll
  for (int c0 = 0; c0 < BN; c0 += EN) {
    if (c0 > 0) bar();  // the last pass's slab has been read
#if GEMM_HAS_R
    const gemm_t* const R = extra;
    // Residual: the fp32 sums are staged unrounded and R is read in the store phase, 16
    // coalesced bytes a thread (prefetched into registers before the staging, so its
    // latency hides behind it): C = round(acc + R), one rounding, and no 4-byte reads of R
    // in the fragment layout (those cost the epilogue 25% of the kernel's time at 4096^3).
    // In place (R == C) is safe: a thread reads the R chunks it later writes, and no other.
    constexpr int PER = WG_ROWS * CCH / 128;  // chunks a thread
    static_assert(WG_TMA || STAGES * WG_STAGE_BYTES >= BM * BN * 4, "the fp32 slabs fit in the ring");
    const bool r_vec = c_vec && (reinterpret_cast<unsigned long long>(R) & 15) == 0;
    uint4 rv[PER];
#pragma unroll
    for (int q = 0; q < PER; ++q) {
      const int i = t + 128 * q, r = i / CCH, cc = i % CCH;
      const long long gr = row0 + r, gc = bn + c0 + cc * 8;
      rv[q] = make_uint4(0, 0, 0, 0);
      if (r_vec && gr < M && gc < N) rv[q] = *reinterpret_cast<const uint4*>(R + gr * N + gc);
    }
#pragma unroll
    for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
      for (int i8 = c0 / 8; i8 < (c0 + EN) / 8; ++i8)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = mi * 64 + w * 16 + g + h * 8, lc = i8 * 8 - c0 + t4 * 2;
          const int e = 4 * ((i8 * 8) % WG_NI / 8) + 2 * h;
          wg_st_shared_f2(stg + wg_fswz<EN>(lr, lc) * 4, acc[mi][(i8 * 8) / WG_NI][e], acc[mi][(i8 * 8) / WG_NI][e + 1]);
        }
    bar();  // the slab is staged
#pragma unroll
    for (int q = 0; q < PER; ++q) {
      const int i = t + 128 * q, r = i / CCH, cc = i % CCH;
      const long long gr = row0 + r, gc = bn + c0 + cc * 8;
      if (gr >= M || gc >= N) continue;
      const float4 x = wg_ld_shared_f4(stg + wg_fswz<EN>(r, cc * 8) * 4), y = wg_ld_shared_f4(stg + wg_fswz<EN>(r, cc * 8 + 4) * 4);
      const float f[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
      if (r_vec) {
        const gemm_t2* rp = reinterpret_cast<const gemm_t2*>(&rv[q]);
        unsigned o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const gemm_t2 pk = epi_pack(f[2 * e] + epi_to_f(rp[e].x), f[2 * e + 1] + epi_to_f(rp[e].y));
          o[e] = *reinterpret_cast<const unsigned*>(&pk);
        }
        ptx_st_global16(C + gr * N + gc, make_uint4(o[0], o[1], o[2], o[3]));
      } else {  // C or R not 16-byte aligned, or N % 8 != 0: 2 bytes at a time
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (gc + e < N) C[gr * N + gc + e] = epi_from_f(f[e] + epi_to_f(R[gr * N + gc + e]));
      }
    }
#else
#if GEMM_HAS_BIAS
    const gemm_t* const bias = extra;
#else
    (void)extra;
#endif
#pragma unroll
    for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
      for (int i8 = c0 / 8; i8 < (c0 + EN) / 8; ++i8)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = mi * 64 + w * 16 + g + h * 8;  // row in the slab
          const int lc = i8 * 8 + t4 * 2;               // column in the tile
          const long long gc = bn + lc;
          (void)gc;
          const int e = 4 * ((i8 * 8) % WG_NI / 8) + 2 * h;
          float v0 = acc[mi][(i8 * 8) / WG_NI][e], v1 = acc[mi][(i8 * 8) / WG_NI][e + 1];
#if GEMM_HAS_BIAS
          if (gc < N) v0 += epi_to_f(bias[gc]);
          if (gc + 1 < N) v1 += epi_to_f(bias[gc + 1]);
#endif
#if GEMM_EPILOGUE == GEMM_EPI_SILU
          v0 = epi_silu(v0);
          v1 = epi_silu(v1);
#elif GEMM_HAS_GELU
          v0 = epi_gelu(v0);
          v1 = epi_gelu(v1);
#elif GEMM_GATED
          {
            const int cu = BN + i8 * 8;  // the up projection's column
            const int eu = 4 * (cu % WG_NI / 8) + 2 * h;
            v0 = epi_silu(v0) * acc[mi][cu / WG_NI][eu];
            v1 = epi_silu(v1) * acc[mi][cu / WG_NI][eu + 1];
          }
#endif
          const gemm_t2 pk = epi_pack(v0, v1);
          wg_st_shared32(stg + wg_swz<CCH>(lr, i8 - c0 / 8) * 2 + t4 * 4, *reinterpret_cast<const unsigned*>(&pk));
        }
    bar();  // the slab is staged
#pragma unroll 4
    for (int i = t; i < WG_ROWS * CCH; i += 128) {
      const int r = i / CCH, cc = i % CCH;
      const long long gr = row0 + r, gc = bn + c0 + cc * 8;
      if (gr >= M || gc >= N) continue;
      const uint4 v = wg_ld_shared16(stg + wg_swz<CCH>(r, cc) * 2);
      if (c_vec) {
        ptx_st_global16(C + gr * N + gc, v);
      } else {
        const unsigned short* ev = reinterpret_cast<const unsigned short*>(&v);
        unsigned short* cs = reinterpret_cast<unsigned short*>(C + gr * N + gc);
#pragma unroll
        for (int q = 0; q < 8; ++q)
          if (gc + q < N) cs[q] = ev[q];
      }
    }
#endif
  }
  if (kAgain) bar();  // the slab has been read
}
#endif

#if SPLIT > 1
// Split K, after every consumer's wgmmas have completed: consumer cw's fp32 partial tile(s)
// [NB][BM][BN] to this block's shared memory at `tiles`, then the cluster sums them (rank q
// finishes rows [q * BM / SPLIT, (q + 1) * BM / SPLIT)) between two cluster barriers, which
// every thread of the cluster's blocks must reach (ct: the thread among the consumers').
__device__ __forceinline__ void wg_split_store(float (&acc)[WG_MI][WG_NSUB][WG_NI / 2], unsigned tiles, int cw, int t,
                                               int ct, long long bm, long long bn, long long M, long long N, gemm_t* C,
                                               const gemm_t* extra) {
  const int w = t >> 5, l = t & 31, g = l >> 2, t4 = l & 3;
  const bool c_vec = N % 8 == 0 && (reinterpret_cast<unsigned long long>(C) & 15) == 0;
#pragma unroll
  for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
    for (int i8 = 0; i8 < BN / 8; ++i8)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int b = 0; b < WG_NB; ++b) {
          const int lr = cw * WG_ROWS + mi * 64 + w * 16 + g + h * 8, lc = i8 * 8 + t4 * 2;
          const int col = b * BN + i8 * 8;
          const int e = 4 * (col % WG_NI / 8) + 2 * h;
          wg_st_shared_f2(tiles + (b * BM * BN + gemm_fswz(lr, lc)) * 4, acc[mi][col / WG_NI][e],
                          acc[mi][col / WG_NI][e + 1]);
        }
  ptx_cluster_sync();
  gemm_split_finish<WG_NB>(tiles, ct, WG_NC * 128, bm, bn, M, N, C, extra, c_vec);
  ptx_cluster_sync();
}
#endif

#if !WG_TMA
extern "C" __global__ void WG_CLUSTER __launch_bounds__(WG_NT, MINB) gemm(GEMM_PARAMS) {
  extern __shared__ unsigned char wg_smem[];
  __shared__ __align__(8) unsigned long long wg_bars[2 * STAGES];  // full[STAGES], empty[STAGES]
  const unsigned sbase = (wg_smem_u32(wg_smem) + 1023u) & ~1023u;  // the spec's `shared` has 1 KiB to spare
  const unsigned full0 = wg_smem_u32(wg_bars), empty0 = full0 + 8 * STAGES;
  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // warpgroup: 0 the producer, 1 .. NC the consumers

  long long bm, bn;  // this block's tile
  gemm_tile_of(blockIdx.x, M, N, bm, bn);

  // This block's part of K: whole 64-wide tiles.
  const GemmKSlice kslice = gemm_k_slice(K, WG_BK);
  const long long kbeg = kslice.beg;
  const int ktiles = kslice.tiles;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      wg_mbar_init(full0 + 8 * s, 128);    // one cp.async arrival a producer thread
      wg_mbar_init(empty0 + 8 * s, WG_NC);  // one arrival a consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ================= producer: global -> shared, cp.async =================
#if WG_NC == 2
    wg_regs_producer();
#endif
    const int pt = tid;
    // A (and an nt B): thread pt copies 16-byte chunk pt % 8 of rows pt / 8 + 16 j. Row
    // r's chunk c goes to chunk c ^ (r % 8), and (pt / 8 + 16 j) % 8 does not depend on j.
    const int c = pt & 7, r0 = pt >> 3;
    const unsigned dst0 = sbase + r0 * 128 + ((c ^ (r0 & 7)) << 4);
    const long long arows = M - bm - r0;  // this thread's A rows are valid while 16 j < arows
    const gemm_t* const pa0 = A + (arows > 0 ? (bm + r0) * K : 0) + c * 8;
    const long long step = 16 * K;
#if GEMM_B_NT
    const long long brows = N - bn - r0;
    const gemm_t* const pb0 = B0 + (brows > 0 ? (bn + r0) * K : 0) + c * 8;
#if GEMM_GATED
    const gemm_t* const pb1 = B1 + (brows > 0 ? (bn + r0) * K : 0) + c * 8;
#endif
#else
    // B (K x N, N-major): thread pt copies n-chunk pt % CPR of k-rows pt / CPR + RP j into
    // atom chunk / 8 (8 KiB each), k-row k, chunk (chunk % 8) ^ (k % 8).
    constexpr int CPR = BN / 8, RP = 128 / CPR;
    static_assert(128 % CPR == 0 && WG_BK % RP == 0, "B copy mapping");
    const int bc = pt % CPR, bk0 = pt / CPR;
    const long long gcol = bn + bc * 8;
    const bool nv = gcol < N;  // N % 8 == 0: a chunk is wholly inside or outside
    const gemm_t* const qb0 = B0 + (nv ? gcol : 0) + bk0 * N;
#if GEMM_GATED
    const gemm_t* const qb1 = B1 + (nv ? gcol : 0) + bk0 * N;
#endif
    const unsigned bdst0 = (bc >> 3) * 8192 + bk0 * 128;
    const long long bstep = RP * N;
#endif
    int s = 0;
    unsigned ph = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
      if (kt >= STAGES) wg_mbar_wait(empty0 + 8 * s, ph ^ 1);  // the consumers are done with the stage's last tile
      const long long k0 = kbeg + static_cast<long long>(kt) * WG_BK;
      const unsigned dst = dst0 + s * WG_STAGE_BYTES;
      const bool kv = k0 + c * 8 < K;  // K % 8 == 0: a chunk is wholly inside or outside
      {
        const gemm_t* p = pa0 + k0;
#pragma unroll
        for (int j = 0; j < BM / 16; ++j) {
          const bool v = kv && 16 * j < arows;
          ptx_cp_async16(dst + j * 2048, v ? p : A, v);
          p += step;
        }
      }
#pragma unroll
      for (int b = 0; b < WG_NB; ++b) {
#if GEMM_B_NT
#if GEMM_GATED
        const gemm_t* p = (b == 0 ? pb0 : pb1) + k0;
        const gemm_t* const base = b == 0 ? B0 : B1;
#else
        const gemm_t* p = pb0 + k0;
        const gemm_t* const base = B0;
#endif
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
          const bool v = kv && 16 * j < brows;
          ptx_cp_async16(dst + WG_A_BYTES + b * BN * 128 + j * 2048, v ? p : base, v);
          p += step;
        }
#else
#if GEMM_GATED
        const gemm_t* p = (b == 0 ? qb0 : qb1) + k0 * N;
        const gemm_t* const base = b == 0 ? B0 : B1;
#else
        const gemm_t* p = qb0 + k0 * N;
        const gemm_t* const base = B0;
#endif
        const unsigned bdst = sbase + s * WG_STAGE_BYTES + WG_A_BYTES + b * (BN / 64) * 8192 + bdst0;
#pragma unroll
        for (int j = 0; j < WG_BK / RP; ++j) {
          const int k = bk0 + j * RP;
          const bool v = nv && k0 + k < K;
          ptx_cp_async16(bdst + j * RP * 128 + (((bc & 7) ^ (k & 7)) << 4), v ? p : base, v);
          p += bstep;
        }
#endif
      }
      wg_cp_async_arrive(full0 + 8 * s);
      if (++s == STAGES) s = 0, ph ^= 1;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#if SPLIT > 1
    ptx_cluster_sync();  // the consumers' partial tiles are written
    ptx_cluster_sync();  // and read by the whole cluster
#endif
  } else {
    // ================= consumers: wgmma =================
#if WG_NC == 2
    wg_regs_consumer();
#endif
    const int cw = wg - 1;   // this consumer's rows: [cw * ROWS, (cw + 1) * ROWS) of the tile
    const int t = tid & 127;  // thread in the warpgroup
    float acc[WG_MI][WG_NSUB][WG_NI / 2];  // set by the first k-tile's wgmmas (scale-d 0)
    const unsigned a_off = cw * WG_ROWS * 128;
    int s = 0, prev = 0;
    unsigned ph = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
      wg_mbar_wait(full0 + 8 * s, ph);
#ifndef GEMM_WGMMA_NO_PROXY_FENCE
      wg_fence_proxy_async();
#endif
      const unsigned sa = sbase + s * WG_STAGE_BYTES + a_off;
      const unsigned sb = sbase + s * WG_STAGE_BYTES + WG_A_BYTES;
      wg_mma_fence();
#pragma unroll
      for (int kk = 0; kk < WG_BK / 16; ++kk)
#pragma unroll
        for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
          for (int ns = 0; ns < WG_NSUB; ++ns) {
            const unsigned long long da = wg_desc(sa + mi * 64 * 128 + kk * 32, 16, 1024);
#if GEMM_B_NT
            const unsigned long long db = wg_desc(sb + ns * WG_NI * 128 + kk * 32, 16, 1024);
#else
            const unsigned long long db = wg_desc(sb + ns * (WG_NI / 64) * 8192 + kk * 2048, 8192, 1024);
#endif
            wg_mma(acc[mi][ns], da, db, kt > 0 || kk > 0);
          }
      wg_mma_commit();
      wg_mma_wait<1>();  // the previous k-tile's wgmmas are complete: release its stage
      if (kt > 0 && t == 0) wg_mbar_arrive(empty0 + 8 * prev);
      prev = s;
      if (++s == STAGES) s = 0, ph ^= 1;
    }
    wg_mma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
      for (int ns = 0; ns < WG_NSUB; ++ns)
#pragma unroll
        for (int e = 0; e < WG_NI / 2; ++e) {
          if (ktiles == 0) acc[mi][ns][e] = 0.f;  // no k-tile (K = 0, or an empty split slice)
          wg_fence_reg(acc[mi][ns][e]);
        }

    // Every consumer's wgmmas have completed, so the ring is free for the epilogue.
    wg_named_bar<1, WG_NC * 128>();
#if SPLIT == 1
    wg_store_tile<false>(acc, sbase + cw * WG_SLAB, cw, t, bm + cw * WG_ROWS, bn, M, N, C, WG_EXTRA);
#else
    wg_split_store(acc, sbase, cw, t, tid - 128, bm, bn, M, N, C, WG_EXTRA);
#endif
  }
}
#endif  // !WG_TMA

#if WG_TMA
// ================= the TMA kernel (kernels/cuda/gemm_tma.toml) =================
// The same consumers and epilogue, with these changes:
//   - Tiles are loaded by TMA: one producer thread issues cp.async.bulk.tensor copies of the
//     A and B boxes (BM x 64 and BN / MC x 64 elements) through the tensor maps kiln passes
//     after the arguments, with SWIZZLE_128B, which writes exactly the K-major layout the wgmma
//     descriptors describe; the stage's `full` mbarrier (count 1) completes when the bytes
//     have landed (expect_tx). Out-of-bounds rows and k columns read as zero, so M, N and the
//     K tail need no code.
//   - Persistent: min(units, SM_COUNT x MINB / MC) workers (a block, or a cluster of MC
//     blocks), worker w takes units w, w + workers, ... in the GROUP_M raster of units; the
//     ring runs on across units, so the producer loads the next unit's k-tiles while the
//     consumers store the last one. The epilogue stages through its own shared memory
//     (WG_SLAB a consumer: 2 bytes an element, 4 for the residual's fp32 sums) after the ring.
//   - MC = 2: a worker is a cluster of two blocks and a unit is two tiles one above the other
//     (rows bm and bm + BM, the same columns), one a block. Each block loads its own A tile
//     and half of the B tile they share, multicast to both blocks' shared memory, so B is read
//     from L2 once for two tiles. A stage is free again once the consumers of both blocks have
//     released it (each consumer warpgroup arrives on both blocks' `empty` barrier); a block
//     whose tile is past M computes zeros and stores nothing.
//   - SK = 1 (stream-K on the last wave): where the units do not divide into whole waves of
//     workers, the last S units (the remainder and one whole wave; all of them when there is
//     less than a wave) are not taken whole: their k-tiles, S x KT in all, are cut into one
//     contiguous range a worker, units before k-tiles (WgWork says in which order a worker
//     takes its range's items). A unit's part that does not reach its last k-tile is written
//     to the workspace as fp32 (one slot a block) and flagged; the worker holding the unit's
//     last k-tile adds the parts of the workers below it (in a fixed order: deterministic)
//     and runs the epilogue. Waits are only ever on workers of lower index, for items that
//     never wait, so the waits form no cycle: the kernel finishes wherever its blocks run at
//     once (one block an SM for the grid kiln launches), or are started in index order. The
//     flags are set back to 0 by the block that read them. Workspace: 4096 bytes of flags (a
//     word a block), then a slot of BM x BN x WEIGHTS floats a block. kiln keeps one a stream
//     (docs/spec.md, "Workspace"): two launches at once on one workspace could hang.
//   - SPLIT > 1: not persistent; a block a tile and a K slice, a cluster of SPLIT blocks a
//     tile, whose fp32 partial tiles are summed through distributed shared memory as in the
//     wgmma kernel (the ring is free by then, and holds them).
//   - PINGPONG = 1: the two consumer warpgroups take the block's units in turn, each a whole
//     BM x BN tile, so one's epilogue runs while the other's wgmmas do (cooperative, 0: both
//     share every tile, BM / 2 rows each). The ring holds the tiles' k-tiles in order; a
//     consumer steps over the other's, and each stage is released by the one that used it.
//     Their main loops take turns (named barriers 4 and 5): a consumer starts a tile's once
//     the other has passed all its waits on the previous tile's stages. Otherwise a consumer
//     that ran a ring cycle ahead would read a `full` barrier's parity of a phase not yet
//     begun as done.
#ifndef MC
#define MC 1  // blocks a cluster sharing B by multicast: 1 or 2
#endif
#ifndef SK
#define SK 0  // 1: stream-K over the last wave's units
#endif
static_assert(GEMM_B_NT && (SPLIT == 1 || !PINGPONG), "the TMA kernel: nt problems; split K cooperative only");
static_assert(MC == 1 || (MC == 2 && SPLIT == 1), "MC is 1, or 2 without split K");
static_assert(!SK || (SPLIT == 1 && !PINGPONG), "stream-K: cooperative consumers, no split K");
#if MC > 1
#define WG_TMA_CLUSTER __cluster_dims__(MC, 1, 1)
#else
#define WG_TMA_CLUSTER WG_CLUSTER
#endif
// The same box to shared address dst of every block of the cluster in `mask`, each block's
// `bar` (at the same address) counting its bytes.
__device__ __forceinline__ void wg_tma_load_mc(unsigned dst, const wg_tmap* map, unsigned bar, int c0, int c1,
                                               unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
// An arrival on the mbarrier at shared address `bar` of the cluster's block `rank` (release at
// the CTA's scope, as a local arrival: it orders this thread's reads of the stage, which the
// wgmmas already finished, before the refill; a cluster-scope release would wait for every
// earlier access of the thread to reach the cluster, on every k-tile).
__device__ __forceinline__ void wg_mbar_arrive_remote(unsigned bar, unsigned rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(ptx_map_rank(bar, rank)) : "memory");
}

// The units of the problem (MC tiles one above the other) in the GROUP_M raster, and the
// work of one worker: first its whole units, then (SK) its range of the stream-K units'
// k-tiles: the units the range covers whole, then the start of the last unit it reaches
// (k-tiles [0, c), a part for a later worker to add), then the end of the first (k-tiles
// [a, kt), whose worker adds the earlier parts; or the middle, a part). So every worker takes
// its whole units at the same k at the same time, as in a wave, and the starts of units at k
// = 0 together after them: units that share A rows or B columns read them from L2 at about
// the same time (walked in range order, each worker's k was off the others' by a different
// amount, and the long-K shapes read the operands from memory again). A part is done before
// its adder needs it: the adder's end comes last in its range, and a worker's part comes
// before its own end.
struct WgItem {
  long long unit;
  int k0, k1;  // the unit's k-tiles [k0, k1) of kt
};
struct WgWork {
  long long units_m, tiles_n, units;
  long long whole;       // units [0, whole) are taken whole; the rest stream-K
  long long next;        // the worker's next whole unit (then every workers-th)
  long long workers;
  int kt;                // k-tiles a unit
  // The stream-K range's items, in units of the stream-K units (unit whole + j): its whole
  // units [sk_next, sk_end), then its last unit's start [0, start_k1) (none: 0), then its
  // first unit's end or middle [head_k0, head_k1) (none: head_k1 == 0).
  long long sk_next = 0, sk_end = 0, start_unit = 0, head_unit = 0;
  int start_k1 = 0, head_k0 = 0, head_k1 = 0;
  __device__ __forceinline__ WgWork(long long M, long long N, int ktiles, long long w, long long nworkers) {
    units_m = ((M + BM - 1) / BM + MC - 1) / MC;
    tiles_n = (N + BN - 1) / BN;
    units = units_m * tiles_n;
    kt = ktiles;
    workers = nworkers;
    next = w;
    whole = units;
#if SK
    const long long waves = units / nworkers, rest = units % nworkers;
    const long long sk = rest == 0 || ktiles == 0 ? 0 : waves >= 1 ? rest + nworkers : rest;
    whole = units - sk;
    const long long lo = range_start(w), hi = range_start(w + 1);
    if (hi > lo) {
      const long long first = lo / kt, a = lo % kt;
      sk_next = a == 0 ? first : first + 1;
      sk_end = hi / kt;
      if (sk_end < sk_next) sk_end = sk_next;  // (a range inside one unit: its middle only)
      if (hi % kt != 0 && hi / kt >= sk_next) {
        start_unit = hi / kt;
        start_k1 = static_cast<int>(hi % kt);
      }
      if (a != 0) {
        head_unit = first;
        head_k0 = static_cast<int>(a);
        head_k1 = static_cast<int>(hi - first * kt < kt ? hi - first * kt : kt);
      }
    }
#endif
  }
  // Where worker w's stream-K range starts (the ranges cover [0, (units - whole) kt) in order).
  __device__ __forceinline__ long long range_start(long long w) const { return w * ((units - whole) * kt) / workers; }
  // f(w) for each worker w below `me` whose range holds k-tiles of the stream-K unit whose
  // first k-tile is `base` (its parts), nearest first.
  template <class F>
  __device__ __forceinline__ void parts_below(long long me, long long base, F&& f) const {
    for (long long w = me - 1; w >= 0 && range_start(w + 1) > base; --w)
      if (range_start(w) != range_start(w + 1)) f(w);  // (not an empty range)
  }
  __device__ __forceinline__ bool take(WgItem& it) {
    if (next < whole) {
      it.unit = next;
      it.k0 = 0;
      it.k1 = kt;
      next += workers;
      return true;
    }
    if (sk_next < sk_end) {
      it.unit = whole + sk_next++;
      it.k0 = 0;
      it.k1 = kt;
      return true;
    }
    if (start_k1 > 0) {
      it.unit = whole + start_unit;
      it.k0 = 0;
      it.k1 = start_k1;
      start_k1 = 0;
      return true;
    }
    if (head_k1 > 0) {
      it.unit = whole + head_unit;
      it.k0 = head_k0;
      it.k1 = head_k1;
      head_k1 = 0;
      return true;
    }
    return false;
  }
  // Block `rank`'s tile of unit u: bm, bn.
  __device__ __forceinline__ void tile(long long u, unsigned rank, long long& bm, long long& bn) const {
    long long r, c;
    gemm_raster(u, units_m, tiles_n, r, c);
    bm = (r * MC + rank) * BM;
    bn = c * BN;
  }
};

#if SK
__device__ __forceinline__ unsigned wg_ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void wg_st_release(unsigned* p, unsigned v) {
  asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void wg_st_cg_f4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ float4 wg_ld_cg_f4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}
#define WG_ACC (WG_MI * WG_NSUB * WG_NI / 2)  // fp32 accumulators a consumer thread
#define WG_SK_FLAGS 4096                       // bytes of flags before the slots: a word a block, 1024 blocks
// f(p, a, b, c, d) for each group of 4 accumulators of consumer thread ct (of NT) with its
// place p in a block's slot: group q at slot + (q NT + ct) 4 floats, so that the threads'
// accesses to one group are coalesced.
template <int NT, class F>
__device__ __forceinline__ void wg_slot_groups(float (&acc)[WG_MI][WG_NSUB][WG_NI / 2], float* slot, int ct, F&& f) {
#pragma unroll
  for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
    for (int ns = 0; ns < WG_NSUB; ++ns)
#pragma unroll
      for (int e = 0; e < WG_NI / 2; e += 4) {
        const int q = ((mi * WG_NSUB + ns) * (WG_NI / 2) + e) / 4;
        f(slot + (static_cast<long long>(q) * NT + ct) * 4, acc[mi][ns][e], acc[mi][ns][e + 1], acc[mi][ns][e + 2],
          acc[mi][ns][e + 3]);
      }
}
#endif

extern "C" __global__ void WG_TMA_CLUSTER __launch_bounds__(WG_NT, MINB)
    gemm(GEMM_PARAMS, const __grid_constant__ wg_tmap tmA, const __grid_constant__ wg_tmap tmB0
#if GEMM_GATED
         , const __grid_constant__ wg_tmap tmB1
#endif
         , unsigned char* __restrict__ ws) {
  extern __shared__ unsigned char wg_smem[];
  __shared__ __align__(8) unsigned long long wg_bars[2 * STAGES];  // full[STAGES], empty[STAGES]
  const unsigned sbase = (wg_smem_u32(wg_smem) + 1023u) & ~1023u;  // the spec's `shared` has 1 KiB to spare
  const unsigned full0 = wg_smem_u32(wg_bars), empty0 = full0 + 8 * STAGES;
  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // warpgroup: 0 the producer, 1 .. NC the consumers
  const GemmKSlice kslice = gemm_k_slice(K, WG_BK);  // all of K where SPLIT = 1
  const long long kbeg = kslice.beg;
#if MC > 1
  const unsigned rank = ptx_cluster_rank();
#else
  const unsigned rank = 0;
#endif
  WgWork work(M, N, kslice.tiles, blockIdx.x / MC, gridDim.x / MC);
#if SPLIT > 1
  if (gridDim.x < work.units) __trap();  // split K takes one tile a block: both sides reach two cluster barriers
#endif
#if SK
  if (gridDim.x > WG_SK_FLAGS / 4) __trap();  // a flag a block
#else
  (void)ws;
#endif

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      wg_mbar_init(full0 + 8 * s, 1);  // the producer's expect_tx; TMA completes the bytes
      // one arrival a consumer warpgroup using it, of each block it was loaded into
      wg_mbar_init(empty0 + 8 * s, (PINGPONG ? 1 : WG_NC) * MC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#if MC > 1
  ptx_cluster_sync();  // the other block's barriers are set before any copy or arrival reaches them
#else
  __syncthreads();
#endif

  if (wg == 0) {
    // ================= producer: one thread issues the TMA copies =================
#if WG_NC == 2
    wg_regs_producer();
#endif
    if (tid == 0) {
      wg_tma_prefetch(&tmA);
      wg_tma_prefetch(&tmB0);
#if GEMM_GATED
      wg_tma_prefetch(&tmB1);
#endif
      int s = 0;
      unsigned ph = 0;
      long long it = 0;  // k-tiles issued by this block, over all its items
      WgItem item;
      while (work.take(item)) {
        long long bm, bn;
        work.tile(item.unit, rank, bm, bn);
        for (int kt = item.k0; kt < item.k1; ++kt, ++it) {
          if (it >= STAGES) wg_mbar_wait(empty0 + 8 * s, ph ^ 1);  // the consumers are done with the stage
          const unsigned full = full0 + 8 * s, dst = sbase + s * WG_STAGE_BYTES;
          const int k0 = static_cast<int>(kbeg) + kt * WG_BK;
          wg_mbar_expect_tx(full, WG_STAGE_BYTES);  // whole boxes, zero-filled ones included
          wg_tma_load(dst, &tmA, full, k0, static_cast<int>(bm));
#if MC == 1
          wg_tma_load(dst + WG_A_BYTES, &tmB0, full, k0, static_cast<int>(bn));
#if GEMM_GATED
          wg_tma_load(dst + WG_A_BYTES + BN * 128, &tmB1, full, k0, static_cast<int>(bn));
#endif
#else
          // this block's rows of the B tile, to both blocks
          const unsigned half = rank * (BN / MC) * 128;
          const int brow = static_cast<int>(bn) + static_cast<int>(rank) * (BN / MC);
          wg_tma_load_mc(dst + WG_A_BYTES + half, &tmB0, full, k0, brow, (1u << MC) - 1);
#if GEMM_GATED
          wg_tma_load_mc(dst + WG_A_BYTES + BN * 128 + half, &tmB1, full, k0, brow, (1u << MC) - 1);
#endif
#endif
          if (++s == STAGES) s = 0, ph ^= 1;
        }
      }
    }
#if SPLIT > 1
    __syncwarp();        // lane 0 is back from its copies
    ptx_cluster_sync();  // the consumers' partial tiles are written
    ptx_cluster_sync();  // and read by the whole cluster
#endif
  } else {
    // ================= consumers: wgmma, then the epilogue, an item at a time =================
#if WG_NC == 2
    wg_regs_consumer();
#endif
    const int cw = wg - 1;
    const int t = tid & 127;
    const unsigned a_off = PINGPONG ? 0 : cw * WG_ROWS * 128;
    const unsigned stg = sbase + STAGES * WG_STAGE_BYTES + cw * WG_SLAB;  // this consumer's epilogue slab
    int s = 0;
    unsigned ph = 0;
    WgItem item;
#if PINGPONG
    // The ring position of this consumer's first k-tile: the other consumer's tile comes first.
    const int ktiles = work.kt;
    const long long skip = static_cast<long long>(ktiles) * cw;
    s = static_cast<int>(skip % STAGES);
    ph = static_cast<unsigned>(skip / STAGES) & 1u;
    long long mine = 0;  // tiles this consumer has taken before this one
    if (cw == 1) work.take(item);  // the other consumer's first
    for (; work.take(item); ++mine) {
#else
    while (work.take(item)) {
#endif
      long long bm, bn;
      work.tile(item.unit, rank, bm, bn);
#if PINGPONG
      // Wait for the other consumer's main loop over the previous tile (none before the first).
      if (cw == 1)
        wg_named_bar<4, 256>();
      else if (mine > 0)
        wg_named_bar<5, 256>();
#endif
      float acc[WG_MI][WG_NSUB][WG_NI / 2];  // set by the first k-tile's wgmmas (scale-d 0)
      // Stage st is free again, for this block and (MC = 2) the other, whose producer fills it too.
      auto release = [&](int st) {
        wg_mbar_arrive(empty0 + 8 * st);
#if MC > 1
        wg_mbar_arrive_remote(empty0 + 8 * st, rank ^ 1u);
#endif
      };
      int prev = 0;
      for (int kt = item.k0; kt < item.k1; ++kt) {
        wg_mbar_wait(full0 + 8 * s, ph);
        const unsigned sa = sbase + s * WG_STAGE_BYTES + a_off;
        const unsigned sb = sbase + s * WG_STAGE_BYTES + WG_A_BYTES;
        wg_mma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk)
#pragma unroll
          for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
            for (int ns = 0; ns < WG_NSUB; ++ns) {
              const unsigned long long da = wg_desc(sa + mi * 64 * 128 + kk * 32, 16, 1024);
              const unsigned long long db = wg_desc(sb + ns * WG_NI * 128 + kk * 32, 16, 1024);
              wg_mma(acc[mi][ns], da, db, kt > item.k0 || kk > 0);
            }
        wg_mma_commit();
        wg_mma_wait<1>();  // the previous k-tile's wgmmas are complete: release its stage
        if (kt > item.k0 && t == 0) release(prev);
        prev = s;
        if (++s == STAGES) s = 0, ph ^= 1;
      }
#if PINGPONG
      // This main loop is past its waits: the other consumer's next tile may begin, if it has one.
      if (item.unit + work.workers < work.whole) {
        if (cw == 0)
          wg_named_arrive<4, 256>();
        else
          wg_named_arrive<5, 256>();
      }
#endif
      wg_mma_wait<0>();
      if (item.k1 > item.k0 && t == 0) release(prev);  // the item's last stage
#pragma unroll
      for (int mi = 0; mi < WG_MI; ++mi)
#pragma unroll
        for (int ns = 0; ns < WG_NSUB; ++ns)
#pragma unroll
          for (int e = 0; e < WG_NI / 2; ++e) {
            if (item.k1 == item.k0) acc[mi][ns][e] = 0.f;  // K = 0
            wg_fence_reg(acc[mi][ns][e]);
          }
#if PINGPONG
      // Step over the other consumer's tile (ktiles stages; STAGES x 2 positions a parity cycle),
      // and its item.
      const int adv = ktiles % (2 * STAGES);
      for (int i = 0; i < adv; ++i)
        if (++s == STAGES) s = 0, ph ^= 1;
      {
        WgItem other;
        work.take(other);
      }
#endif
#if SK
      {
        constexpr int NT = WG_NC * 128;  // consumer threads
        const int ct = tid - 128;
        float* const slots = reinterpret_cast<float*>(ws + WG_SK_FLAGS);
        unsigned* const flags = reinterpret_cast<unsigned*>(ws);
        if (item.k1 < work.kt) {
          // A part that does not reach the unit's last k-tile: to this block's slot, then flagged.
          wg_slot_groups<NT>(acc, slots + static_cast<long long>(blockIdx.x) * NT * WG_ACC, ct,
                             [](float* p, float& a, float& b, float& c, float& d) { wg_st_cg_f4(p, a, b, c, d); });
          wg_named_bar<1, NT>();  // every consumer thread's part is written
          if (ct == 0) wg_st_release(flags + blockIdx.x, 1u);
          continue;
        }
        if (item.k0 > 0) {
          // The unit's last part: add the parts of the workers below this one that hold the
          // unit's earlier k-tiles, nearest first.
          const long long base = (item.unit - work.whole) * work.kt;  // the unit's first k-tile in the ranges
          if (ct == 0)
            work.parts_below(blockIdx.x / MC, base, [&](long long w) {
              unsigned* const f = flags + w * MC + rank;
              wg_poll([&] { return wg_ld_acquire(f) != 0; });
              *f = 0;  // read once, by this block only: ready for the next launch
            });
          wg_named_bar<1, NT>();  // the parts are all written
          work.parts_below(blockIdx.x / MC, base, [&](long long w) {
            wg_slot_groups<NT>(acc, slots + (w * MC + rank) * NT * WG_ACC, ct,
                               [](float* p, float& a, float& b, float& c, float& d) {
                                 const float4 v = wg_ld_cg_f4(p);
                                 a += v.x, b += v.y, c += v.z, d += v.w;
                               });
          });
        }
      }
#endif
#if SPLIT > 1
      (void)stg;
      wg_named_bar<1, WG_NC * 128>();  // every consumer's wgmmas are complete: the ring is free
      wg_split_store(acc, sbase, cw, t, tid - 128, bm, bn, M, N, C, WG_EXTRA);
#else
      wg_store_tile<true>(acc, stg, cw, t, PINGPONG ? bm : bm + cw * WG_ROWS, bn, M, N, C, WG_EXTRA);
#endif
    }
  }
#if MC > 1
  __syncwarp();
  ptx_cluster_sync();  // no block leaves while the other may still copy into it or arrive on its barriers
#endif
}
#endif  // WG_TMA
