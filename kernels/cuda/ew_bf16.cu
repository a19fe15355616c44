// Elementwise kernels of two bf16 inputs, fp32 arithmetic, one rounding: the
// last launch of a fused GEMM's unfused form (multi-kernel variants of several
// launches). A thread handles VEC elements; VEC = 8 moves 16 bytes at a time
// where the call allows it.
//   silu_mul: C = silu(G) * U (an MLP's gated up-projection: two GEMMs, then this)
//   add:      C = G + U      (a GEMM's residual: the GEMM, then this)
#include <cuda_bf16.h>

// SiLU as the GEMM epilogues compute it (gemm_epilogue.cuh, which needs a GEMM problem's defines).
__device__ __forceinline__ float epi_silu(float x) { return x / (1.f + __expf(-x)); }

template <class Op>
__device__ __forceinline__ void ew2(const __nv_bfloat16* __restrict__ G, const __nv_bfloat16* __restrict__ U,
                                    __nv_bfloat16* __restrict__ C, long long n, Op op) {
  kiln_start_next();  // launched with pdl: the next kernel may be scheduled now
  kiln_wait_prior();  // ... and this one reads only once the kernel before it has ended
  const long long i = (static_cast<long long>(blockIdx.x) * NT + threadIdx.x) * VEC;
  if (i >= n) return;
  if (VEC == 8 && i + 8 <= n) {
    uint4 g = *reinterpret_cast<const uint4*>(G + i);
    uint4 u = *reinterpret_cast<const uint4*>(U + i);
    uint4 o;
    const __nv_bfloat162* pg = reinterpret_cast<const __nv_bfloat162*>(&g);
    const __nv_bfloat162* pu = reinterpret_cast<const __nv_bfloat162*>(&u);
    __nv_bfloat162* po = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 a = __bfloat1622float2(pg[k]), b = __bfloat1622float2(pu[k]);
      po[k] = __floats2bfloat162_rn(op(a.x, b.x), op(a.y, b.y));
    }
    *reinterpret_cast<uint4*>(C + i) = o;
    return;
  }
  for (long long j = i; j < i + VEC && j < n; ++j)
    C[j] = __float2bfloat16_rn(op(__bfloat162float(G[j]), __bfloat162float(U[j])));
}

extern "C" __global__ void __launch_bounds__(NT) silu_mul(const __nv_bfloat16* __restrict__ G,
                                                          const __nv_bfloat16* __restrict__ U,
                                                          __nv_bfloat16* __restrict__ C, long long n) {
  ew2(G, U, C, n, [](float g, float u) { return epi_silu(g) * u; });
}

extern "C" __global__ void __launch_bounds__(NT) add(const __nv_bfloat16* __restrict__ G,
                                                     const __nv_bfloat16* __restrict__ U,
                                                     __nv_bfloat16* __restrict__ C, long long n) {
  ew2(G, U, C, n, [](float g, float u) { return g + u; });
}
