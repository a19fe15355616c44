// The GEMM problem a member of a kernel family computes (docs/families.md), from the
// defines kiln compiles the member with (GemmProblem::defines): GEMM_DTYPE, GEMM_LAYOUT
// and GEMM_EPILOGUE, each set to one of kiln's named constants (GEMM_DTYPE_BF16, GEMM_DTYPE_F16;
// GEMM_LAYOUT_NN, GEMM_LAYOUT_NT; GEMM_EPI_NONE, _BIAS, _RESIDUAL, _SILU, _GELU, _BIAS_GELU, _GATED).
// None of them is 0, so a misspelt name matches nothing. Gives the element type, the
// epilogue's predicates and the entry's parameter list, in the order of the problem's
// arguments: A, then with the RMSNorm prologue (GEMM_RMSNORM 1) its gain G, B (gated: B0 = Bg,
// B1 = Bu), C, then bias or R, then M, N, K, then with the prologue eps.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(GEMM_DTYPE) || !defined(GEMM_LAYOUT) || !defined(GEMM_EPILOGUE) || !defined(GEMM_EPI_GATED) || \
    !defined(GEMM_RMSNORM)
#error "a GEMM family's source: compile it as a family member (kernels/cuda/gemm.toml:bf16_nt), which defines its problem"
#endif

#if GEMM_DTYPE == GEMM_DTYPE_BF16
typedef __nv_bfloat16 gemm_t;
typedef __nv_bfloat162 gemm_t2;
#define GEMM_MMA_TYPE "bf16"
#elif GEMM_DTYPE == GEMM_DTYPE_F16
typedef __half gemm_t;
typedef __half2 gemm_t2;
#define GEMM_MMA_TYPE "f16"
#else
#error "the GEMM families compute in bf16 or f16"
#endif

#define GEMM_B_NT (GEMM_LAYOUT == GEMM_LAYOUT_NT)  // B is N x K (a linear layer's weight), else K x N
#define GEMM_GATED (GEMM_EPILOGUE == GEMM_EPI_GATED)
#define GEMM_HAS_BIAS (GEMM_EPILOGUE == GEMM_EPI_BIAS || GEMM_EPILOGUE == GEMM_EPI_BIAS_GELU)
#define GEMM_HAS_R (GEMM_EPILOGUE == GEMM_EPI_RESIDUAL)
#define GEMM_HAS_GELU (GEMM_EPILOGUE == GEMM_EPI_GELU || GEMM_EPILOGUE == GEMM_EPI_BIAS_GELU)
#define GEMM_WEIGHTS (GEMM_GATED ? 2 : 1)  // weight operands

#if GEMM_GATED
#define GEMM_WEIGHT_PARAMS const gemm_t* __restrict__ B0, const gemm_t* __restrict__ B1
#else
#define GEMM_WEIGHT_PARAMS const gemm_t* __restrict__ B0
#endif
#if GEMM_HAS_BIAS
#define GEMM_EXTRA_PARAM const gemm_t* __restrict__ bias,
#elif GEMM_HAS_R
#define GEMM_EXTRA_PARAM const gemm_t* R,  // may be C itself (in place)
#else
#define GEMM_EXTRA_PARAM
#endif
#if GEMM_RMSNORM
#define GEMM_GAIN_PARAM const gemm_t* __restrict__ G,
#define GEMM_EPS_PARAM , float eps
#else
#define GEMM_GAIN_PARAM
#define GEMM_EPS_PARAM
#endif
#define GEMM_PARAMS                                                                                          \
  const gemm_t* __restrict__ A, GEMM_GAIN_PARAM GEMM_WEIGHT_PARAMS, gemm_t* C, GEMM_EXTRA_PARAM long long M, \
      long long N, long long K GEMM_EPS_PARAM
