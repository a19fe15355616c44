// The decode GEMM: C[M,N] = epilogue(A[M,K] . W^T) for M <= 16 (a few tokens) and W an
// N x K row-major weight (a linear layer's), bf16 or fp16 (GEMM_DTYPE),
// fp32 accumulation. Such a call only streams W, so the kernel is built to read each
// weight byte exactly once, 16 bytes a load, with many loads in flight.
//
// The family kernels/cuda/gemm_decode.toml; a member's epilogue (gemm_problem.cuh), on the
// fp32 sums before the one rounding to the element type:
//   GEMM_EPI_NONE      C = A.W^T
//   GEMM_EPI_RESIDUAL  C = A.W^T + R
//   GEMM_EPI_GATED     C = silu(A.Wg^T) * (A.Wu^T)
// With the RMSNorm prologue (GEMM_RMSNORM 1: members *_rmsnorm*), A is first the RMSNorm of
// its rows with the gain G: A'[m,k] = A[m,k] G[k] / sqrt(mean_k A[m,k]^2 + eps). Each thread
// multiplies the A chunks it loads by G's (rounded to the element type, as an RMSNorm kernel
// rounds its output) and adds up their squares; every A element is loaded once by one thread
// of the block (of the cluster, split over K), so the warps' and blocks' squares add up to
// each row's, and the fp32 sums are scaled by 1 / sqrt(mean + eps) before the epilogue.
// Entry `gemm`, the problem's arguments (GEMM_PARAMS), as gemm.cu's.
//
// Params:
//   RG      groups of 16 weight rows (output columns) a block computes: 16*RG columns
//   WARPS   warps a block; they split the block's part of K and add up through shared memory
//   UNROLL  32-wide K steps a warp loads before it multiplies (loads in flight per thread:
//           UNROLL * (MT + 2*RG*NB) 16-byte loads, + UNROLL for the gain with the prologue)
//   KSPLIT  K split over blockIdx.y (1, 2, 4, 8), for few columns (small N): the KSPLIT blocks
//           of a column group are one thread-block cluster and add their fp32 sums through
//           distributed shared memory before the epilogue (no atomics, no zeroed C, any epilogue).
//   PIPE    1: a warp loads a step, multiplies it, loads the next; 2: it issues the next
//           step's loads before it multiplies this one's, so two steps are in flight
//           (twice the registers: PIPE * UNROLL * (MT + RMSNORM + 2*RG*NB) 16-byte loads)
//   L2PF    1: the weight loads ask L2 to fetch the whole 256-byte segment (.L2::256B), so
//           the rows' next bytes are on their way before a warp asks for them; 0: no hint
//   MT      token tiles of 8: the call must have M <= 8*MT
//   VEC     8: 16-byte loads (A and W 16-byte aligned, K % 8 == 0) and paired 4-byte stores
//           (N % 2 == 0, C 4-byte aligned): the spec's constraint; 1: any shape and
//           alignment, guarded 2-byte loads packed into the same registers, 2-byte stores.
//
// How the tensor cores are used. The product is computed transposed, C^T[n, m] =
// sum_k W[n, k] A[m, k], with mma.m16n8k16: its A operand is 16 weight rows, its B
// operand 8 tokens. The k order inside a 32-wide step is free as long as both operands
// use the same one, so each thread loads 16 contiguous bytes (8 k) of a weight row and of
// a token row and uses them directly as fragments: lane (g = lane/4, t = lane%4) loads
// W[n0+g][k+8t .. k+8t+7], W[n0+g+8][same], A[g][same] as 4 registers each (2 k a
// register), and the two mma of the step read
//   step 0: a = {Wg.r0, Wg8.r0, Wg.r1, Wg8.r1}, b = {A.r0, A.r1}
//   step 1: a = {Wg.r2, Wg8.r2, Wg.r3, Wg8.r3}, b = {A.r2, A.r3}
// In the mma's terms, lane t's logical k {2t, 2t+1, 2t+8, 2t+9} are its physical
// k + 8t + 4*step + {0, 1, 2, 3} in both operands, so every product pairs W[n][k'] with
// A[m][k'] and the 32 physical k are each used once. The accumulator's d0, d1 are
// (n0+g, tokens 2t, 2t+1) and d2, d3 (n0+g+8, same tokens).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(RG) || !defined(WARPS) || !defined(UNROLL) || !defined(KSPLIT) || !defined(MT) || !defined(VEC) || \
    !defined(PIPE) || !defined(L2PF)
#error "gemm_decode.cu: the params RG WARPS UNROLL KSPLIT MT VEC PIPE L2PF must be defined"
#endif

#include "gemm_problem.cuh"  // the member's problem: element type, epilogue, parameters
#include "gemm_common.cuh"  // PTX wrappers for clusters; the epilogues' math

#define DEC_NT (WARPS * 32)
#define DEC_NB GEMM_WEIGHTS
#define DEC_KSTEP (32 * UNROLL)
#define DEC_TOK (8 * MT)
#define DEC_PITCH (16 * RG + 4)  // floats a token row in the reduction buffer (+4: no bank conflicts)

static_assert(GEMM_EPILOGUE == GEMM_EPI_NONE || GEMM_HAS_R || GEMM_GATED,
              "the decode kernel has the epilogues none, residual and gated");
static_assert(GEMM_B_NT, "the decode kernel reads an N x K weight (nt)");
// (The prologue rounds x * g before the row's scale is known: safe in bf16's range, not in
// fp16's, where unnormalised activations times a gain may pass 65504.)
static_assert(!GEMM_RMSNORM || GEMM_DTYPE == GEMM_DTYPE_BF16, "the RMSNorm prologue is bf16 only");
#define DEC_AN (MT + GEMM_RMSNORM)  // 16-byte A registers a K step: MT token tiles, and G's chunk with the prologue
static_assert(KSPLIT == 1 || KSPLIT == 2 || KSPLIT == 4 || KSPLIT == 8, "KSPLIT in {1, 2, 4, 8}");
#if KSPLIT > 1
#define DEC_CLUSTER __cluster_dims__(1, KSPLIT, 1)  // the KSPLIT K-slices of a column group: one cluster
#else
#define DEC_CLUSTER
#endif
static_assert(MT == 1 || MT == 2, "MT is 1 (M <= 8) or 2 (M <= 16)");
static_assert(VEC == 1 || VEC == 8, "VEC is 1 or 8");
static_assert(PIPE == 1 || PIPE == 2, "PIPE is 1 or 2");
static_assert(L2PF == 0 || L2PF == 1, "L2PF is 0 or 1");
#if L2PF
#define DEC_STREAM_LD "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
#else
#define DEC_STREAM_LD "ld.global.nc.L1::no_allocate.v4.u32"
#endif

__device__ __forceinline__ void dec_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." GEMM_MMA_TYPE "." GEMM_MMA_TYPE
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Asks L2 for `bytes` (a multiple of 16) at p (16-byte aligned), with nothing waited for.
__device__ __forceinline__ void dec_prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// 16 bytes of row `row` from column k, zero where row >= rows or k + e >= kend.
// Weights stream (read once: no L1 allocation); activations are re-read by every block
// (read-only path, cached).
template <bool STREAM>
__device__ __forceinline__ uint4 dec_load(const gemm_t* __restrict__ p, long long row, long long rows, long long ld,
                                          long long k, long long kend) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
#if VEC == 8
  if (row < rows && k < kend) {  // kend % 8 == 0: whole chunks
    const gemm_t* q = p + row * ld + k;
    if (STREAM)
      asm volatile(DEC_STREAM_LD " {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(q));
    else
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(q));
  }
#else
  if (row < rows) {
    const unsigned short* q = reinterpret_cast<const unsigned short*>(p) + row * ld + k;
    unsigned h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = k + e < kend ? __ldg(q + e) : 0u;
    v = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
  }
#endif
  return v;
}

#if GEMM_RMSNORM
// The prologue on one 16-byte A chunk x with the gain's chunk gv: x * gv rounded to the
// element type, and x's squares added to ss.
__device__ __forceinline__ uint4 dec_norm(uint4 x, uint4 gv, float& ss) {
  const unsigned xs[4] = {x.x, x.y, x.z, x.w}, gs[4] = {gv.x, gv.y, gv.z, gv.w};
  unsigned out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xs[i]));  // bf16 only (above)
    const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gs[i]));
    ss = fmaf(xf.x, xf.x, fmaf(xf.y, xf.y, ss));
    const gemm_t2 y = epi_pack(xf.x * gf.x, xf.y * gf.y);
    out[i] = *reinterpret_cast<const unsigned*>(&y);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}
#endif

// Launch bounds with "1 block an SM is enough": ptxas then uses the registers the loads in
// flight need (40 to 128) instead of stopping at an occupancy boundary with a few bytes of
// spills, which it did with the block size alone; measured faster too (M = 1, 4096 x 4096
// weight: 19 us against 21 us; the gated 4-warp config 31 us against 47 us).
extern "C" __global__ void DEC_CLUSTER __launch_bounds__(DEC_NT, 1) gemm(GEMM_PARAMS) {
  extern __shared__ __align__(16) float dec_red[];  // [NB][WARPS][TOK][PITCH]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const long long n0 = static_cast<long long>(blockIdx.x) * (16 * RG);

  // This block's part of K (a multiple of 8 wide), split over the warps in steps of 32*UNROLL.
  const long long kslice = ((K + KSPLIT - 1) / KSPLIT + 7) / 8 * 8;
  const long long kb = static_cast<long long>(blockIdx.y) * kslice;
  const long long ke = kb + kslice < K ? kb + kslice : K;
  // (No early exit for an empty slice: every block of a cluster must reach its barriers.)

  float acc[DEC_NB][RG][MT][4];
#pragma unroll
  for (int j = 0; j < DEC_NB; ++j)
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][r][m][e] = 0.f;
#if GEMM_RMSNORM
  float ssq[MT];  // the squares of the A elements this thread loads, of row m 8 + g
#pragma unroll
  for (int m = 0; m < MT; ++m) ssq[m] = 0.f;
#endif

  // One step: the loads of UNROLL 32-wide K steps at kp (zeros past ke: no memory
  // traffic, and the multiplies below then add nothing), and the multiplies of a loaded step.
  typedef uint4 StepA[UNROLL][DEC_AN];  // [u][MT]: G's chunk, with the prologue
  typedef uint4 StepW[DEC_NB][UNROLL][RG][2];
  auto load_step = [&](long long kp, StepA& a, StepW& w) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long k = kp + u * 32 + t * 8;
#pragma unroll
      for (int j = 0; j < DEC_NB; ++j)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#if GEMM_GATED
            const gemm_t* Wj = j == 0 ? B0 : B1;
#else
            const gemm_t* Wj = B0;
#endif
            w[j][u][r][h] = dec_load<true>(Wj, n0 + r * 16 + h * 8 + g, N, K, k, ke);
          }
#pragma unroll
      for (int m = 0; m < MT; ++m) a[u][m] = dec_load<false>(A, m * 8 + g, M, K, k, ke);
#if GEMM_RMSNORM
      a[u][MT] = dec_load<false>(G, 0, 1, K, k, ke);
#endif
    }
  };
  auto mma_step = [&](StepA& a, const StepW& w) {
#if GEMM_RMSNORM
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int m = 0; m < MT; ++m) a[u][m] = dec_norm(a[u][m], a[u][MT], ssq[m]);
#endif
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int j = 0; j < DEC_NB; ++j)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            const uint4 lo = w[j][u][r][0], hi = w[j][u][r][1], x = a[u][m];
            dec_mma(acc[j][r][m], lo.x, hi.x, lo.y, hi.y, x.x, x.y);
            dec_mma(acc[j][r][m], lo.z, hi.z, lo.w, hi.w, x.z, x.w);
          }
  };
  const long long kstride = static_cast<long long>(WARPS) * DEC_KSTEP;
  long long kp = kb + static_cast<long long>(warp) * DEC_KSTEP;

  // Launched with pdl (the spec's), this kernel may start while the one before it still runs.
  // Before it waits for that kernel, it asks L2 for the weight bytes its first steps read (a
  // thread a row: the block's first kstride of K). A prefetch into L2 cannot read stale
  // data, whatever wrote the weights: L2 is where every write lands, so the loads after the
  // wait see the previous kernel's writes. (4 KiB a row, 64 KiB a block, measured slower on
  // the H100: the layer 177 us a call against 165, the tuning of the gated MLP GEMM then
  // preferring cuBLASLt.)
#if VEC == 8
  {
    const long long pf_end = kb + kstride < ke ? kb + kstride : ke;
    if (tid < 16 * RG * DEC_NB && pf_end > kb) {
      const int j = tid / (16 * RG);
      const long long n = n0 + tid % (16 * RG);
#if GEMM_GATED
      const gemm_t* Wj = j == 0 ? B0 : B1;
#else
      const gemm_t* Wj = B0;
      (void)j;
#endif
      if (n < N) dec_prefetch_l2(Wj + n * K + kb, static_cast<unsigned>((pf_end - kb) * sizeof(gemm_t)));
    }
  }
#endif
  kiln_wait_prior();
#if PIPE == 1
  for (; kp < ke; kp += kstride) {
    StepA a;
    StepW w;
    load_step(kp, a, w);
    mma_step(a, w);
  }
#else
  // Two steps in flight: the next step's loads are issued before this step's multiplies
  // wait for its own.
  if (kp < ke) {
    StepA a0, a1;
    StepW w0, w1;
    load_step(kp, a0, w0);
    for (; kp < ke; kp += 2 * kstride) {
      load_step(kp + kstride, a1, w1);
      mma_step(a0, w0);
      load_step(kp + 2 * kstride, a0, w0);
      mma_step(a1, w1);
    }
  }
#endif

  // The next kernel may be scheduled once every block has passed here: its blocks then take
  // their SMs during this grid's tail (its last blocks' sums and stores), not while its
  // later blocks still wait to stream their weights.
  kiln_start_next();

  // Each warp's sums into shared memory as [token][column]; then the block adds them up.
#pragma unroll
  for (int j = 0; j < DEC_NB; ++j)
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = m * 8 + t * 2 + (e & 1), col = r * 16 + g + (e >> 1) * 8;
          dec_red[((j * WARPS + warp) * DEC_TOK + tok) * DEC_PITCH + col] = acc[j][r][m][e];
        }
#if GEMM_RMSNORM
  // Each row's squares: over the 4 lanes of a row (t), then the warps; dec_ssb the block's.
  __shared__ float dec_ss[WARPS][DEC_TOK];
  __shared__ __align__(8) float dec_ssb[DEC_TOK];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float v = ssq[m];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (t == 0) dec_ss[warp][m * 8 + g] = v;
  }
  __syncthreads();
  if (tid < DEC_TOK) {
    float v = 0.f;
#pragma unroll
    for (int wi = 0; wi < WARPS; ++wi) v += dec_ss[wi][tid];
    dec_ssb[tid] = v;
  }
#endif
  __syncthreads();

  // Sum of the warps' partials for output pair p = (token, 2 columns).
  constexpr int PAIRS = DEC_TOK * RG * 8;
  auto warp_sum = [&](int p, int j) {
    const int tok = p / (RG * 8), col = (p % (RG * 8)) * 2;
    float2 v = make_float2(0.f, 0.f);
#pragma unroll
    for (int wi = 0; wi < WARPS; ++wi) {
      const float2 x = *reinterpret_cast<const float2*>(&dec_red[((j * WARPS + wi) * DEC_TOK + tok) * DEC_PITCH + col]);
      v.x += x.x;
      v.y += x.y;
    }
    return v;
  };
  // The epilogue and the store of pair p from its sums s[j].
  // With the prologue, the row's scale 1 / sqrt(mean of its squares + eps): its squares are the
  // block's (dec_ssb), or with KSPLIT > 1 the cluster's blocks' added in rank order (read after
  // the cluster barrier below, like the sums).
  auto row_scale = [&](long long m) {
#if GEMM_RMSNORM
#if KSPLIT == 1
    const float ss = dec_ssb[m];
#else
    float ss = 0.f;
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(&dec_ssb[m & ~1LL]));
#pragma unroll
    for (int q = 0; q < KSPLIT; ++q) {
      const float2 x = ptx_ld_cluster_f2(ptx_map_rank(at, q));
      ss += (m & 1) ? x.y : x.x;
    }
#endif
    return rsqrtf(ss / static_cast<float>(K) + eps);
#else
    (void)m;
    return 1.f;
#endif
  };
  auto finish = [&](int p, const float2 (&s)[DEC_NB]) {
    const long long m = p / (RG * 8), n = n0 + (p % (RG * 8)) * 2;
    if (m >= M || n >= N) return;
    const float rs = row_scale(m);
    float v0 = s[0].x * rs, v1 = s[0].y * rs;
#if GEMM_HAS_R
    v0 += epi_to_f(R[m * N + n]);
    if (n + 1 < N) v1 += epi_to_f(R[m * N + n + 1]);
#elif GEMM_GATED
    v0 = v0 / (1.f + __expf(-v0)) * (s[DEC_NB - 1].x * rs);
    v1 = v1 / (1.f + __expf(-v1)) * (s[DEC_NB - 1].y * rs);
#endif
    gemm_t* c = C + m * N + n;
    if (VEC == 8 && n + 1 < N) {  // VEC 8: N even and C 4-byte aligned, so c is too
      *reinterpret_cast<gemm_t2*>(c) = epi_pack(v0, v1);
    } else {
      c[0] = epi_from_f(v0);
      if (n + 1 < N) c[1] = epi_from_f(v1);
    }
  };
#if KSPLIT == 1
  for (int p = tid; p < PAIRS; p += DEC_NT) {
    float2 s[DEC_NB];
#pragma unroll
    for (int j = 0; j < DEC_NB; ++j) s[j] = warp_sum(p, j);
    finish(p, s);
  }
#else
  // K split over a cluster of KSPLIT blocks: each block's sums (fp32) go to its shared
  // memory after the warps' buffers; after a cluster barrier rank q finishes pairs
  // [q*PAIRS/KSPLIT, (q+1)*PAIRS/KSPLIT), adding the KSPLIT blocks' sums in rank order
  // through distributed shared memory; a last barrier keeps the memory alive until read.
  float* const part = dec_red + DEC_NB * WARPS * DEC_TOK * DEC_PITCH;  // [NB][PAIRS] float2
  for (int p = tid; p < PAIRS; p += DEC_NT)
#pragma unroll
    for (int j = 0; j < DEC_NB; ++j) reinterpret_cast<float2*>(part)[j * PAIRS + p] = warp_sum(p, j);
  ptx_cluster_sync();
  const unsigned part_u32 = static_cast<unsigned>(__cvta_generic_to_shared(part));
  constexpr int PER_RANK = (PAIRS + KSPLIT - 1) / KSPLIT;
  const int rank = static_cast<int>(ptx_cluster_rank());
  for (int p = rank * PER_RANK + tid; p < (rank + 1) * PER_RANK && p < PAIRS; p += DEC_NT) {
    float2 s[DEC_NB];
#pragma unroll
    for (int j = 0; j < DEC_NB; ++j) {
      s[j] = make_float2(0.f, 0.f);
#pragma unroll
      for (int q = 0; q < KSPLIT; ++q) {
        const float2 x = ptx_ld_cluster_f2(ptx_map_rank(part_u32 + (j * PAIRS + p) * 8, q));
        s[j].x += x.x;
        s[j].y += x.y;
      }
    }
    finish(p, s);
  }
  ptx_cluster_sync();
#endif
}
