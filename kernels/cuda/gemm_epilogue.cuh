// The epilogues' element math, shared by gemm.cu (mma.sync) and
// gemm_wgmma.cu (wgmma): conversions between fp32 accumulators and the
// element type (gemm_t, gemm_problem.cuh), SiLU, and GELU in the erf form.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm_problem.cuh"

__device__ __forceinline__ float epi_to_f(gemm_t x) {
#if GEMM_DTYPE == GEMM_DTYPE_BF16
  return __bfloat162float(x);
#else
  return __half2float(x);
#endif
}
__device__ __forceinline__ gemm_t2 epi_pack(float a, float b) {
#if GEMM_DTYPE == GEMM_DTYPE_BF16
  return __floats2bfloat162_rn(a, b);
#else
  return __floats2half2_rn(a, b);
#endif
}
__device__ __forceinline__ gemm_t epi_from_f(float a) {
#if GEMM_DTYPE == GEMM_DTYPE_BF16
  return __float2bfloat16_rn(a);
#else
  return __float2half_rn(a);
#endif
}
__device__ __forceinline__ float epi_silu(float x) { return x / (1.f + __expf(-x)); }
// GELU, the erf form 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default, not the tanh
// approximation). erf by Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7, far below the
// output's rounding: branch-free and lighter on registers than erff.
__device__ __forceinline__ float epi_erf(float x) {
  const float z = fabsf(x);
  const float t = __frcp_rn(fmaf(0.3275911f, z, 1.f));
  float p = fmaf(1.061405429f, t, -1.453152027f);
  p = fmaf(p, t, 1.421413741f);
  p = fmaf(p, t, -0.284496736f);
  p = fmaf(p, t, 0.254829592f);
  const float r = 1.f - p * t * __expf(-z * z);
  return copysignf(r, x);
}
__device__ __forceinline__ float epi_gelu(float x) { return 0.5f * x * (1.f + epi_erf(x * 0.70710678118654752f)); }
