// Standalone correctness and speed check of kernels/cuda/gemm.cu and gemm_decode.cu,
// one config per build (the config's params and the spec's cflags as -D), from the
// repository root:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemm_check bench/gpu/gemm_check.cu -lcublas \
//        -DBM=128 -DBN=128 -DBK=32 -DWM=64 -DWN=64 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DVEC=8 \
//        -DDT=0 -DBT=1 -DEPI=0
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemm_check_dec bench/gpu/gemm_check.cu -lcublas \
//        -DDECODE=1 -DRG=1 -DWARPS=8 -DUNROLL=2 -DKSPLIT=1 -DMT=1 -DVEC=8 -DPIPE=1 -DL2PF=1 -DDT=0 -DEPI=0
//   ./gemm_check            # every shape the config can run, then timings
//   ./gemm_check -q         # no timings;  -s, -t: small / tiny shapes only, no timings (for compute-sanitizer)
//   ./gemm_check -x         # timings only
//
// A handful of configs in one go (16 builds in parallel, about 15 s on the H100 machine):
//
//   while read n f; do echo "nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/$n bench/gpu/gemm_check.cu -lcublas $f"; \
//   done <<'EOF' | xargs -P 16 -I{} sh -c {}; for n in def nn v1 split gated dec dec_split; do /tmp/$n -q; done
//   def   -DBM=128 -DBN=128 -DBK=32 -DWM=64 -DWN=64 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DVEC=8 -DDT=0 -DBT=1 -DEPI=0
//   nn    -DBM=256 -DBN=128 -DBK=64 -DWM=64 -DWN=64 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DVEC=8 -DDT=1 -DBT=0 -DEPI=4
//   v1    -DBM=64 -DBN=128 -DBK=32 -DWM=64 -DWN=16 -DSTAGES=3 -DSPLIT=1 -DGROUP_M=8 -DVEC=1 -DDT=0 -DBT=0 -DEPI=6
//   split -DBM=128 -DBN=128 -DBK=64 -DWM=64 -DWN=64 -DSTAGES=4 -DSPLIT=8 -DGROUP_M=8 -DVEC=8 -DDT=0 -DBT=1 -DEPI=2
//   gated -DBM=128 -DBN=128 -DBK=32 -DWM=64 -DWN=32 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DVEC=8 -DDT=0 -DBT=1 -DEPI=6
//   dec   -DDECODE=1 -DRG=1 -DWARPS=8 -DUNROLL=2 -DKSPLIT=1 -DMT=2 -DVEC=8 -DPIPE=1 -DL2PF=1 -DDT=0 -DEPI=6
//   dec_split -DDECODE=1 -DRG=2 -DWARPS=4 -DUNROLL=2 -DKSPLIT=8 -DMT=1 -DVEC=8 -DPIPE=1 -DL2PF=1 -DDT=0 -DEPI=2
//   EOF
//
// For each shape (non-multiples of every tile among them: M = 1, 7, 33, ..., K = 1 .. 8200)
// it fills A, B (Bg, Bu), bias and R with random values in [-1, 1) of the kernel's type,
// poisons C with NaN, surrounds C with guard zones, runs the kernel once, and compares
// every element with an fp32 reference (a plain CUDA kernel over the same rounded inputs,
// the same epilogue in fp32): it reports the max relative error (over elements with
// |ref| >= 5% of max|ref|), the max absolute error over max|ref|, elements left unwritten,
// and writes outside C; a shape passes when every element is within 2^-7 (bf16) or 2^-9
// (fp16) relative plus 2e-3 * max|ref|. A shape the config cannot run (its spec's
// constraint: VEC 8 needs K % 8 == 0 and N % 8 == 0, decode N % 2 == 0; decode M <= 8*MT)
// is skipped, saying so. The last line reads "N passed, N failed, N skipped"; the exit
// status is 1 if any failed.
// Then (EPI 0 gives the like-for-like comparison; the others are timed all the same
// against cuBLAS's plain GEMM) it times the kernel and cublasGemmEx (bf16/fp16 in and out,
// fp32 compute) with CUDA events, the median of 20 (50) runs: GEMM at 4096^3 and 8192^3
// (TFLOP/s), decode at M = 1, 8, 16 with N x K weights of 4096 x 4096, 14336 x 4096 and
// 4096 x 14336 (weight GB/s, with the L2 flushed before each run).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef DECODE
#define DECODE 0
#endif
#ifndef DT
#define DT 0
#endif
#ifndef BT
#define BT (DECODE ? 1 : 0)
#endif
#ifndef EPI
#define EPI 0
#endif
// The kernels take their problem as kiln's named defines (docs/families.md,
// GemmProblem::defines); this check keeps its DT, BT and EPI numbers and passes
// them on as those (EPI n is the n-th epilogue: none, bias, residual, silu, gelu,
// bias_gelu, gated).
#define GEMM_DTYPE_F16 3
#define GEMM_DTYPE_BF16 4
#define GEMM_LAYOUT_NN 1
#define GEMM_LAYOUT_NT 2
#define GEMM_EPI_NONE 1
#define GEMM_EPI_BIAS 2
#define GEMM_EPI_RESIDUAL 3
#define GEMM_EPI_SILU 4
#define GEMM_EPI_GELU 5
#define GEMM_EPI_BIAS_GELU 6
#define GEMM_EPI_GATED 7
#define GEMM_DTYPE (DT == 0 ? GEMM_DTYPE_BF16 : GEMM_DTYPE_F16)
#define GEMM_LAYOUT (BT ? GEMM_LAYOUT_NT : GEMM_LAYOUT_NN)
#define GEMM_EPILOGUE (EPI + 1)
#define GEMM_RMSNORM 0  // (the RMSNorm prologue is checked through kiln: tests/test_cuda.cpp)
// kiln's device functions, which kiln puts before every kernel it compiles (launched here
// without overlap, the wait returns at once)
static __device__ __forceinline__ void kiln_wait_prior() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
static __device__ __forceinline__ void kiln_start_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#if DECODE
#include "../../kernels/cuda/gemm_decode.cu"
typedef gemm_t elem_t;
#define CHECK_BT 1
#else
#include "../../kernels/cuda/gemm.cu"
typedef gemm_t elem_t;
#define CHECK_BT BT
#endif
#define CHECK_NB (EPI == 6 ? 2 : 1)

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
#define CB(x)                                                                       \
  do {                                                                              \
    cublasStatus_t s_ = (x);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                              \
      std::printf("cuBLAS error %d at %s:%d: %s\n", (int)s_, __FILE__, __LINE__, #x); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

static long long cdivll(long long a, long long b) { return (a + b - 1) / b; }

// ---- the launch shape, as the specs compute it ----
struct Launch {
  dim3 grid, block;
  size_t shared;
};
static Launch launch_shape(long long M, long long N, long long K) {
  (void)K;
  Launch l;
#if DECODE
  l.grid = dim3((unsigned)cdivll(N, 16 * RG), KSPLIT, 1);
  l.block = dim3(WARPS * 32);
  l.shared = (size_t)CHECK_NB * WARPS * MT * 8 * (16 * RG + 4) * 4 + (KSPLIT > 1 ? (size_t)CHECK_NB * MT * 8 * RG * 16 * 4 : 0);
#else
  l.grid = dim3((unsigned)(cdivll(M, BM) * cdivll(N, BN)), 1, SPLIT);
  l.block = dim3((BM / WM) * (BN / WN) * 32);
  l.shared = std::max<size_t>((size_t)STAGES * (BM * BK + CHECK_NB * BN * BK) * 2,
                              SPLIT > 1 ? (size_t)CHECK_NB * BM * BN * 4 : (size_t)BM * BN * 2);
#endif
  return l;
}
// Whether the spec's constraints let this config run the call (cudaMalloc'd buffers are
// 256-byte aligned, so only the shape matters here).
static bool applicable(long long M, long long N, long long K) {
#if DECODE
  if (M > 8 * MT) return false;
  if (VEC == 8 && (K % 8 != 0 || N % 2 != 0)) return false;
#else
  if (VEC == 8 && (K % 8 != 0 || N % 8 != 0)) return false;
#endif
  (void)M;
  return true;
}

// ---- device helpers ----
__device__ __forceinline__ float e2f(elem_t x) {
#if DT == 0
  return __bfloat162float(x);
#else
  return __half2float(x);
#endif
}
__device__ __forceinline__ elem_t f2e(float x) {
#if DT == 0
  return __float2bfloat16_rn(x);
#else
  return __float2half_rn(x);
#endif
}
__global__ void fill_random(elem_t* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long x = (unsigned long long)i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = (float)(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = f2e(2.f * u - 1.f);
  }
}
__global__ void fill_bits(unsigned short* p, long long n, unsigned short v) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = v;
}
// The fp32 reference: one thread an element of C.
__global__ void reference(const elem_t* A, const elem_t* B0, const elem_t* B1, const elem_t* bias, const elem_t* R,
                          float* ref, long long M, long long N, long long K) {
  const long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N || m >= M) return;
  float s0 = 0.f, s1 = 0.f;
  for (long long k = 0; k < K; ++k) {
    const float a = e2f(A[m * K + k]);
    const long long bi = CHECK_BT ? n * K + k : k * N + n;
    s0 = fmaf(a, e2f(B0[bi]), s0);
    if (EPI == 6) s1 = fmaf(a, e2f(B1[bi]), s1);
  }
  float v = s0;
  if (EPI == 1 || EPI == 5) v += e2f(bias[n]);
  if (EPI == 2) v += e2f(R[m * N + n]);
  if (EPI == 3) v = v / (1.f + expf(-v));
  if (EPI == 4 || EPI == 5) v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
  if (EPI == 6) v = v / (1.f + expf(-v)) * s1;
  ref[m * N + n] = v;
}

static float h2f(unsigned short h) {
#if DT == 0
  unsigned u = (unsigned)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#else
  const unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float f;
  if (e == 0) f = std::ldexp((float)m, -24);
  else if (e == 31) f = m ? NAN : INFINITY;
  else f = std::ldexp((float)(m | 1024), (int)e - 25);
  return s ? -f : f;
#endif
}

struct Bufs {
  elem_t *A = nullptr, *B0 = nullptr, *B1 = nullptr, *bias = nullptr, *R = nullptr, *Cbase = nullptr, *C = nullptr;
  float* ref = nullptr;
  long long M = 0, N = 0, K = 0;
};
static const long long kGuard = 256;  // elements of guard zone each side of C (512 bytes: C stays aligned)
static const unsigned short kGuardBits = 0x3C3C;

static void alloc(Bufs& b, long long M, long long N, long long K, bool with_ref) {
  b.M = M, b.N = N, b.K = K;
  CK(cudaMalloc(&b.A, std::max(1LL, M * K) * sizeof(elem_t)));
  CK(cudaMalloc(&b.B0, std::max(1LL, N * K) * sizeof(elem_t)));
  if (EPI == 6) CK(cudaMalloc(&b.B1, std::max(1LL, N * K) * sizeof(elem_t)));
  if (EPI == 1 || EPI == 5) CK(cudaMalloc(&b.bias, N * sizeof(elem_t)));
  if (EPI == 2) CK(cudaMalloc(&b.R, M * N * sizeof(elem_t)));
  CK(cudaMalloc(&b.Cbase, (M * N + 2 * kGuard) * sizeof(elem_t)));
  b.C = b.Cbase + kGuard;
  if (with_ref) CK(cudaMalloc(&b.ref, M * N * sizeof(float)));
  fill_random<<<1024, 256>>>(b.A, M * K, 1);
  fill_random<<<1024, 256>>>(b.B0, N * K, 2);
  if (b.B1) fill_random<<<1024, 256>>>(b.B1, N * K, 3);
  if (b.bias) fill_random<<<1024, 256>>>(b.bias, N, 4);
  if (b.R) fill_random<<<1024, 256>>>(b.R, M * N, 5);
  CK(cudaGetLastError());
}
static void release(Bufs& b) {
  cudaFree(b.A), cudaFree(b.B0), cudaFree(b.B1), cudaFree(b.bias), cudaFree(b.R), cudaFree(b.Cbase), cudaFree(b.ref);
  b = Bufs();
}

static void run_kernel(const Bufs& b, cudaStream_t st = 0) {
  const Launch l = launch_shape(b.M, b.N, b.K);
#if EPI == 6
  gemm<<<l.grid, l.block, l.shared, st>>>(b.A, b.B0, b.B1, b.C, b.M, b.N, b.K);
#elif EPI == 2
  gemm<<<l.grid, l.block, l.shared, st>>>(b.A, b.B0, b.C, b.R, b.M, b.N, b.K);
#elif (EPI == 1 || EPI == 5) && !DECODE
  gemm<<<l.grid, l.block, l.shared, st>>>(b.A, b.B0, b.C, b.bias, b.M, b.N, b.K);
#else
  gemm<<<l.grid, l.block, l.shared, st>>>(b.A, b.B0, b.C, b.M, b.N, b.K);
#endif
}

// Before a run: C poisoned (NaN), guards set.
static void prepare_c(const Bufs& b) {
  fill_bits<<<256, 256>>>(reinterpret_cast<unsigned short*>(b.Cbase), kGuard, kGuardBits);
  fill_bits<<<256, 256>>>(reinterpret_cast<unsigned short*>(b.C + b.M * b.N), kGuard, kGuardBits);
  fill_bits<<<1024, 256>>>(reinterpret_cast<unsigned short*>(b.C), b.M * b.N, 0xFFFF);
  CK(cudaGetLastError());
}

static int g_pass = 0, g_fail = 0, g_skip = 0;

static void check_shape(long long M, long long N, long long K) {
  if (!applicable(M, N, K)) {
    std::printf("  M=%-6lld N=%-6lld K=%-6lld skipped (the config's constraints rule it out)\n", M, N, K);
    ++g_skip;
    return;
  }
  Bufs b;
  alloc(b, M, N, K, true);
  prepare_c(b);
  run_kernel(b);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  dim3 rg((unsigned)cdivll(N, 128), (unsigned)M);
  reference<<<rg, 128>>>(b.A, b.B0, b.B1, b.bias, b.R, b.ref, M, N, K);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned short> c(M * N + 2 * kGuard);
  std::vector<float> ref(M * N);
  CK(cudaMemcpy(c.data(), b.Cbase, c.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref.data(), b.ref, ref.size() * 4, cudaMemcpyDeviceToHost));
  long long guard_bad = 0, unwritten = 0, bad = 0;
  for (long long i = 0; i < kGuard; ++i) {
    guard_bad += c[i] != kGuardBits;
    guard_bad += c[kGuard + M * N + i] != kGuardBits;
  }
  double maxref = 0;
  for (float r : ref) maxref = std::max(maxref, (double)std::fabs(r));
  const double rtol = DT == 0 ? 1.0 / 128 : 1.0 / 512;                // a couple of output rounding steps
  const double atol = 2e-3 * std::max(maxref, 1e-3);
  double max_rel = 0, max_abs = 0;
  long long worst = -1;
  for (long long i = 0; i < M * N; ++i) {
    const float got = h2f(c[kGuard + i]);
    const double r = ref[i];
    if (std::isnan(got)) {
      ++unwritten;
      continue;
    }
    const double d = std::fabs(got - r);
    if (d > max_abs) max_abs = d, worst = i;
    if (std::fabs(r) >= 0.05 * maxref) max_rel = std::max(max_rel, d / std::fabs(r));
    if (!(d <= atol + rtol * std::fabs(r))) ++bad;
  }
  const bool ok = !guard_bad && !unwritten && !bad;
  std::printf("  M=%-6lld N=%-6lld K=%-6lld max_rel=%.3e max_abs/max|ref|=%.3e (max|ref| %.3g) unwritten=%lld "
              "outside=%lld beyond_tol=%lld %s",
              M, N, K, max_rel, maxref > 0 ? max_abs / maxref : max_abs, maxref, unwritten, guard_bad, bad,
              ok ? "PASS" : "FAIL");
  if (!ok && worst >= 0)
    std::printf("  (worst at m=%lld n=%lld: got %g, ref %g)", worst / N, worst % N, h2f(c[kGuard + worst]),
                ref[worst]);
  std::printf("\n");
  ok ? ++g_pass : ++g_fail;
  release(b);
}

static void cublas_gemm(cublasHandle_t h, const Bufs& b) {
  const float one = 1.f, zero = 0.f;
  const cudaDataType_t t = DT == 0 ? CUDA_R_16BF : CUDA_R_16F;
  const int M = (int)b.M, N = (int)b.N, K = (int)b.K;
  // Row-major C = A . op(B) is column-major C^T = op(B)^T . A^T.
  if (CHECK_BT)
    CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b.B0, t, K, b.A, t, K, &zero, b.C, t, N,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  else
    CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, b.B0, t, N, b.A, t, K, &zero, b.C, t, N,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Median time (ms) of `iters` runs; flush: write a 256 MB buffer before each run (L2 cold).
template <class F>
static float time_ms(F&& f, int iters, void* flush, size_t flush_bytes) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int i = 0; i < 3; ++i) f();  // warm-up
  for (int i = 0; i < iters; ++i) {
    if (flush) CK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes));
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

static void timing(cublasHandle_t h, long long M, long long N, long long K, void* flush, size_t flush_bytes) {
  if (!applicable(M, N, K)) {
    std::printf("  %lldx%lldx%lld: the config cannot run it\n", M, N, K);
    return;
  }
  Bufs b;
  alloc(b, M, N, K, false);
  CK(cudaDeviceSynchronize());
  auto mine = [&] { run_kernel(b); };
  const float t_k = time_ms(mine, DECODE ? 50 : 20, flush, flush_bytes);
  CK(cudaGetLastError());
  const float t_c = time_ms([&] { cublas_gemm(h, b); }, DECODE ? 50 : 20, flush, flush_bytes);
  const double flop = 2.0 * M * N * K * CHECK_NB;
  const double wbytes = (double)N * K * 2 * CHECK_NB;
  std::printf("  M=%-5lld N=%-6lld K=%-6lld kernel %8.3f ms (%6.1f TFLOP/s, weights %6.0f GB/s)   cuBLAS%s %8.3f ms "
              "(%6.1f TFLOP/s, %6.0f GB/s)   kernel/cuBLAS time %.2f\n",
              M, N, K, t_k, flop / t_k * 1e-9, wbytes / t_k * 1e-6, CHECK_NB == 2 ? " (one weight)" : "", t_c,
              2.0 * M * N * K / t_c * 1e-9, (double)N * K * 2 / t_c * 1e-6, t_k / t_c);
  release(b);
}

#if DECODE
// The device's copy bandwidth: a device-to-device copy of 1 GiB (far larger than L2),
// bytes read + written (2N / t), the copies back to back between two events.
static double copy_gbps() {
  const size_t n = 1ull << 30;
  void *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, n));
  CK(cudaMalloc(&dst, n));
  CK(cudaMemset(src, 1, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));  // warm-up
  const int reps = 10;
  CK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i) CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaFree(src), cudaFree(dst);
  return 2.0 * n * reps / (ms * 1e-3) * 1e-9;
}

// Weight bytes streamed a second by the kernel and by cuBLAS at one decode shape, two ways:
//   b2b:   calls back to back between two events, each call on the next of a ring of weight
//          copies that together hold at least 4x L2, so no call finds its weights in L2;
//   flush: single calls, the median of 50, each after a 256 MB write (L2 cold).
// The kernel's result on the first copy is checked against the reference first (check_shape).
static void bandwidth(cublasHandle_t h, long long M, long long N, long long K, double copy, int l2_bytes) {
  if (!applicable(M, N, K)) {
    std::printf("  %lldx%lldx%lld: the config cannot run it\n", M, N, K);
    return;
  }
  const double wbytes = (double)N * K * sizeof(elem_t) * CHECK_NB;
  const int ring = std::max(2, (int)std::ceil(4.0 * l2_bytes / wbytes));
  std::vector<Bufs> bs(ring);
  for (int i = 0; i < ring; ++i) {
    if (i == 0) {
      alloc(bs[0], M, N, K, false);
    } else {  // the same A, C, R; weights of its own
      bs[i] = bs[0];
      CK(cudaMalloc(&bs[i].B0, N * K * sizeof(elem_t)));
      CK(cudaMemcpy(bs[i].B0, bs[0].B0, N * K * sizeof(elem_t), cudaMemcpyDeviceToDevice));
      if (EPI == 6) {
        CK(cudaMalloc(&bs[i].B1, N * K * sizeof(elem_t)));
        CK(cudaMemcpy(bs[i].B1, bs[0].B1, N * K * sizeof(elem_t), cudaMemcpyDeviceToDevice));
      }
    }
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto b2b = [&](auto&& f) {
    for (int i = 0; i < ring; ++i) f(bs[i]);  // warm-up
    const int reps = std::max(200, 4 * ring);
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) f(bs[i % ring]);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaGetLastError());
    return ms / reps;
  };
  size_t flush_bytes = 256ull << 20;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  const float k_b2b = b2b([](const Bufs& b) { run_kernel(b); });
  const float c_b2b = b2b([&](const Bufs& b) { cublas_gemm(h, b); });
  const float k_fl = time_ms([&] { run_kernel(bs[0]); }, 50, flush, flush_bytes);
  const float c_fl = time_ms([&] { cublas_gemm(h, bs[0]); }, 50, flush, flush_bytes);
  const double cbytes = (double)N * K * sizeof(elem_t);  // cuBLAS's plain GEMM reads one weight
  auto gb = [](double bytes, float ms) { return bytes / (ms * 1e-3) * 1e-9; };
  std::printf("  M=%-3lld N=%-6lld K=%-6lld ring %2d | b2b: kernel %7.4f ms %5.0f GB/s = %5.1f%% of copy, cuBLAS%s "
              "%5.0f GB/s = %5.1f%% | flush: kernel %7.4f ms %5.0f GB/s = %5.1f%%, cuBLAS %5.0f GB/s = %5.1f%%\n",
              M, N, K, ring, k_b2b, gb(wbytes, k_b2b), 100 * gb(wbytes, k_b2b) / copy, CHECK_NB == 2 ? " (one weight)" : "",
              gb(cbytes, c_b2b), 100 * gb(cbytes, c_b2b) / copy, k_fl, gb(wbytes, k_fl), 100 * gb(wbytes, k_fl) / copy,
              gb(cbytes, c_fl), 100 * gb(cbytes, c_fl) / copy);
  cudaFree(flush);
  for (int i = 1; i < ring; ++i) cudaFree(bs[i].B0), cudaFree(bs[i].B1);
  release(bs[0]);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
}
#endif

int main(int argc, char** argv) {
  // -q: no timings; -s / -t: no timings, only shapes of up to 2^28 / 2^22 multiply-adds
  // (sanitizers); -x: timings only
  bool quick = false, bw = false;
  long long limit = 1LL << 62;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-q") == 0) quick = true;
    if (std::strcmp(argv[i], "-s") == 0) quick = true, limit = 1LL << 28;
    if (std::strcmp(argv[i], "-t") == 0) quick = true, limit = 1LL << 22;
    if (std::strcmp(argv[i], "-x") == 0) limit = 0;  // timings only
    if (std::strcmp(argv[i], "-b") == 0) bw = true;   // decode: bandwidth against the copy's, after the check
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", p.name, p.major, p.minor, p.multiProcessorCount);
#if DECODE
  std::printf("config: decode RG=%d WARPS=%d UNROLL=%d KSPLIT=%d MT=%d VEC=%d PIPE=%d L2PF=%d DT=%d EPI=%d\n", RG, WARPS,
              UNROLL, KSPLIT, MT, VEC, PIPE, L2PF, DT, EPI);
#else
  std::printf("config: BM=%d BN=%d BK=%d WM=%d WN=%d STAGES=%d SPLIT=%d GROUP_M=%d VEC=%d DT=%d BT=%d EPI=%d\n", BM, BN, BK,
              WM, WN, STAGES, SPLIT, GROUP_M, VEC, DT, BT, EPI);
#endif
  {
    const Launch l = launch_shape(4096, 4096, 4096);
    CK(cudaFuncSetAttribute(gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)l.shared));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, gemm));
    std::printf("kernel: %d registers, %zu bytes local, %zu bytes dynamic shared, %d threads\n", fa.numRegs,
                fa.localSizeBytes, l.shared, l.block.x);
  }

  std::printf("correctness:\n");
#if DECODE
  const long long shapes[][3] = {{1, 4096, 4096}, {1, 72, 8},      {3, 1000, 8200}, {7, 14336, 4096}, {8, 200, 136},
                                 {9, 4096, 1024}, {16, 520, 2056}, {16, 4104, 8200}, {13, 264, 24},   {5, 64, 8192},
                                 {2, 77, 133},    {13, 31, 7},     {1, 5, 1},       {16, 33, 1031}};
#else
  const long long shapes[][3] = {
      {1, 64, 8},        {7, 72, 24},        {33, 200, 136},    {64, 64, 64},     {128, 256, 32},   {129, 136, 264},
      {257, 520, 1000},  {33, 4104, 8200},   {1000, 1000, 1000}, {511, 384, 2056}, {16, 4096, 4096}, {300, 8, 8192},
      {2048, 2048, 2048}, {4096, 4096, 4096}, {130, 131, 133},   {3, 5, 7},        {1031, 1029, 1027}, {1, 1, 1}};
#endif
  for (const auto& s : shapes)
    if (s[0] * s[1] * s[2] <= limit) check_shape(s[0], s[1], s[2]);
  std::printf("%d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skip);

#if DECODE
  if (bw) {
    cublasHandle_t h;
    CB(cublasCreate(&h));
    const double copy = copy_gbps();
    std::printf("bandwidth (copy: %.0f GB/s, 1 GiB device-to-device, read + write; L2 %d MB):\n", copy,
                p.l2CacheSize >> 20);
    const long long bshapes[][3] = {{1, 4096, 4096},  {1, 14336, 4096}, {1, 4096, 14336}, {8, 14336, 4096},
                                    {16, 4096, 14336}, {4, 5120, 5120},  {1, 3584, 18944}, {12, 8192, 3072}};
    for (const auto& s : bshapes) bandwidth(h, s[0], s[1], s[2], copy, p.l2CacheSize);
    cublasDestroy(h);
    quick = true;
  }
#endif
  if (!quick) {
    cublasHandle_t h;
    CB(cublasCreate(&h));
    std::printf("timing (median of runs):\n");
#if DECODE
    size_t flush_bytes = 256ull << 20;
    void* flush = nullptr;
    CK(cudaMalloc(&flush, flush_bytes));
    const long long tshapes[][3] = {{1, 4096, 4096}, {1, 14336, 4096}, {8, 4096, 4096}, {16, 4096, 4096},
                                    {16, 14336, 4096}, {1, 4096, 14336}};
    for (const auto& s : tshapes) timing(h, s[0], s[1], s[2], flush, flush_bytes);
    cudaFree(flush);
#else
    const long long tshapes[][3] = {{4096, 4096, 4096}, {8192, 8192, 8192}};
    for (const auto& s : tshapes) timing(h, s[0], s[1], s[2], nullptr, 0);
#endif
    cublasDestroy(h);
  }
  return g_fail ? 1 : 0;
}
