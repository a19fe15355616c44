// Standalone correctness and speed check of kernels/cuda/gemm_wgmma.cu (the Hopper wgmma
// GEMM family), one config per invocation. Unlike gemm_check.cu the kernel is not built
// into this program: each config is a cubin, compiled the way kiln compiles it (NVRTC,
// the params as #defines before the source, --gpu-architecture=sm_90a -std=c++17
// -lineinfo, the spec's cflags -DDT -DBT -DEPI), and loaded and launched through the
// driver API (cuModuleLoadData, cuFuncSetAttribute, cuLaunchKernel), as kiln does.
//
// Build (from the repository root):
//
//   nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gemm_wgmma_check \
//        bench/gpu/gemm_wgmma_check.cu -ldl
// (no -lcublas, -lnvrtc or -lcuda: libcublas, libnvrtc and libcuda are dlopen'ed, so the
// same binary compiles configs on a machine with no GPU driver and runs them on the GPU's)
//
// Use:
//
//   # compile one config with NVRTC, exactly as kiln would (prints ptxas' report):
//   ./gemm_wgmma_check --compile cfg.cubin -DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 \
//                      -DDT=0 -DBT=1 -DEPI=0            [--src kernels/cuda/gemm_wgmma.cu]
//   # (nvcc -gencode arch=compute_90a,code=sm_90a -cubin -std=c++17 -DBM=... kernels/cuda/gemm_wgmma.cu
//   #  makes an equivalent cubin)
//   # check it: every shape it can run, then timings (same -D list: it gives the launch shape)
//   ./gemm_wgmma_check cfg.cubin -DBM=128 -DBN=256 -DSTAGES=4 -DSPLIT=1 -DGROUP_M=8 -DMINB=1 -DDT=0 -DBT=1 -DEPI=0
//   ./gemm_wgmma_check -q ...   # correctness only;  -s / -t: small / tiny shapes only (sanitizers)
//   ./gemm_wgmma_check -x ...   # timings only
//   ./gemm_wgmma_check --cublas DT   # cuBLAS (cublasGemmEx, fp32 compute) at the timing shapes, NT and NN
//
// bench/gpu/gemm_wgmma_run.sh builds and runs a list of configs this way and prints a table.
//
// Correctness: for each shape (M = 1, 3, 7, 33, 129, 1031, ...; N not a multiple of any
// tile, odd N; K = 8 .. 8200) it fills A, B (Bg, Bu), bias and R with random values in
// [-1, 1) of the kernel's type, poisons C with NaN, surrounds it with guard zones, runs the
// kernel once and compares every element with an fp32 reference (a tiled CUDA-core kernel
// over the same rounded inputs, the same epilogue in fp32, exact expf/erff). It reports
// the max relative error (over elements with |ref| >= 5% of max|ref|), max abs error over
// max|ref|, elements left unwritten and writes outside C; a shape passes when every
// element is within 2^-7 (bf16) or 2^-9 (fp16) relative plus 2e-3 * max|ref|. Two shapes
// run with C (and R) offset by one element (C then cannot take 16-byte stores: the
// kernel's 2-byte fallback), one EPI 2 shape runs in place (R == C). Shapes the spec's
// constraints rule out (K % 8 != 0; BT = 0 with N % 8 != 0) are skipped, saying so. The
// line "N passed, N failed, N skipped" ends it; the exit status is 1 if any failed.
//
// Timings: CUDA events, the median of 20 runs after 3 warm-ups, L2 not flushed, at
// 4096^3, 8192^3 and the LLM shapes T x 4096 @ (14336 x 4096)^T (MLP up / gate) and
// T x 14336 @ (4096 x 14336)^T (down) for T in {256, 1024, 4096}; EPI 6 (two weights)
// only at the up/gate shapes and 4096^3. Lines "TIME <M> <N> <K> <ms> <TFLOP/s>" (for
// EPI 6 the FLOPs of both products).
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)
#define CU(x)                                                                          \
  do {                                                                                 \
    CUresult r_ = (x);                                                                 \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char* s_ = nullptr;                                                        \
      drv.get_error_string(r_, &s_);                                                   \
      std::printf("CUDA driver error %s at %s:%d: %s\n", s_ ? s_ : "?", __FILE__, __LINE__, #x); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

static long long cdivll(long long a, long long b) { return (a + b - 1) / b; }

static void* open_lib(const char* const* names) {
  for (const char* const* n = names; *n; ++n)
    if (void* h = dlopen(*n, RTLD_NOW | RTLD_LOCAL)) return h;
  return nullptr;
}
template <class F>
static F sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) {
    std::printf("missing symbol %s\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(p);
}
// The driver API, opened at run time (so that --compile runs on a machine with no driver).
struct Driver {
  decltype(&cuModuleLoadData) module_load_data = nullptr;
  decltype(&cuModuleGetFunction) module_get_function = nullptr;
  decltype(&cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&cuFuncGetAttribute) func_get_attribute = nullptr;
  decltype(&cuLaunchKernel) launch_kernel = nullptr;
  decltype(&cuGetErrorString) get_error_string = nullptr;
  void open() {
    const char* names[] = {"libcuda.so.1", "libcuda.so", nullptr};
    void* h = open_lib(names);
    if (!h) {
      std::printf("cannot open libcuda\n");
      std::exit(1);
    }
    module_load_data = sym<decltype(&cuModuleLoadData)>(h, "cuModuleLoadData");
    module_get_function = sym<decltype(&cuModuleGetFunction)>(h, "cuModuleGetFunction");
    func_set_attribute = sym<decltype(&cuFuncSetAttribute)>(h, "cuFuncSetAttribute");
    func_get_attribute = sym<decltype(&cuFuncGetAttribute)>(h, "cuFuncGetAttribute");
    launch_kernel = sym<decltype(&cuLaunchKernel)>(h, "cuLaunchKernel");
    get_error_string = sym<decltype(&cuGetErrorString)>(h, "cuGetErrorString");
  }
};
static Driver drv;

// ---- the config: the -D list ----
struct Cfg {
  std::map<std::string, long long> v;
  std::vector<std::string> defines;  // NAME=VALUE, in order
  long long get(const char* n, long long def = -1) const {
    auto it = v.find(n);
    if (it == v.end()) {
      if (def >= 0) return def;
      std::printf("missing -D%s\n", n);
      std::exit(2);
    }
    return it->second;
  }
  int BM() const { return (int)get("BM"); }
  int BN() const { return (int)get("BN"); }
  int STAGES() const { return (int)get("STAGES"); }
  int SPLIT() const { return (int)get("SPLIT"); }
  int DT() const { return (int)get("DT", 0); }
  int BT() const { return (int)get("BT", 1); }
  int EPI() const { return (int)get("EPI", 0); }
  int NB() const { return EPI() == 6 ? 2 : 1; }
};
static bool parse_define(const char* a, Cfg& c) {
  if (std::strncmp(a, "-D", 2) != 0) return false;
  std::string s(a + 2);
  const size_t eq = s.find('=');
  const std::string n = s.substr(0, eq), val = eq == std::string::npos ? "1" : s.substr(eq + 1);
  c.defines.push_back(n + "=" + val);
  c.v[n] = std::atoll(val.c_str());
  return true;
}

// The launch shape, as the specs' grid / block / shared compute it.
struct Launch {
  unsigned gx, gz, block;
  unsigned shared;
};
static Launch launch_shape(const Cfg& c, long long M, long long N) {
  Launch l;
  l.gx = (unsigned)(cdivll(M, c.BM()) * cdivll(N, c.BN()));
  l.gz = (unsigned)c.SPLIT();
  l.block = (c.BM() == 64 ? 2 : 3) * 128;
  const long long ring = (long long)c.STAGES() * (c.BM() + c.NB() * c.BN()) * 128;
  const long long part = c.SPLIT() > 1 ? (long long)c.BM() * c.BN() * 4 * c.NB() : 0;
  l.shared = (unsigned)(std::max(ring, part) + 1024);
  return l;
}
// The spec's correctness constraints (cudaMalloc'd buffers are 256-byte aligned).
static bool applicable(const Cfg& c, long long M, long long N, long long K) {
  (void)M;
  if (K % 8 != 0) return false;
  if (c.BT() == 0 && N % 8 != 0) return false;
  return true;
}

// ---- NVRTC (compile mode), opened at run time ----
static int compile_mode(const char* out, const char* src_path, const Cfg& cfg) {
  const char* names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", nullptr};
  void* h = open_lib(names);
  if (!h) {
    std::printf("cannot open libnvrtc\n");
    return 1;
  }
  auto create = sym<decltype(&nvrtcCreateProgram)>(h, "nvrtcCreateProgram");
  auto compile = sym<decltype(&nvrtcCompileProgram)>(h, "nvrtcCompileProgram");
  auto log_size = sym<decltype(&nvrtcGetProgramLogSize)>(h, "nvrtcGetProgramLogSize");
  auto get_log = sym<decltype(&nvrtcGetProgramLog)>(h, "nvrtcGetProgramLog");
  auto cubin_size = sym<decltype(&nvrtcGetCUBINSize)>(h, "nvrtcGetCUBINSize");
  auto get_cubin = sym<decltype(&nvrtcGetCUBIN)>(h, "nvrtcGetCUBIN");
  auto destroy = sym<decltype(&nvrtcDestroyProgram)>(h, "nvrtcDestroyProgram");
  std::ifstream f(src_path);
  if (!f) {
    std::printf("cannot read %s\n", src_path);
    return 1;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  // As kiln: the params as #defines, then the source under #line; the spec's cflags
  // (DT, BT, EPI, as the problem's named defines) as compiler options.
  std::string src = "// generated: config";
  for (const auto& d : cfg.defines) src += " " + d;
  src += "\n";
  std::vector<std::string> opts = {"--gpu-architecture=sm_90a", "-std=c++17", "--ptxas-options=-v", "-lineinfo"};
  const char* inc = std::getenv("CUDA_INCLUDE");
  opts.push_back(std::string("-I") + (inc ? inc : "/usr/local/cuda/include"));
  for (const auto& d : cfg.defines) {
    const std::string n = d.substr(0, d.find('='));
    if (n != "DT" && n != "BT" && n != "EPI") src += "#define " + n + " " + d.substr(d.find('=') + 1) + "\n";
  }
  // The problem as kiln passes it (docs/families.md, GemmProblem::defines): named
  // constants, and DT, BT and EPI as the dtype, layout and epilogue they number.
  for (const char* c : {"-DGEMM_DTYPE_F16=3", "-DGEMM_DTYPE_BF16=4", "-DGEMM_LAYOUT_NN=1", "-DGEMM_LAYOUT_NT=2",
                        "-DGEMM_EPI_NONE=1", "-DGEMM_EPI_BIAS=2", "-DGEMM_EPI_RESIDUAL=3", "-DGEMM_EPI_SILU=4",
                        "-DGEMM_EPI_GELU=5", "-DGEMM_EPI_BIAS_GELU=6", "-DGEMM_EPI_GATED=7", "-DGEMM_RMSNORM=0"})
    opts.push_back(c);
  static const char* const kEpi[] = {"NONE", "BIAS", "RESIDUAL", "SILU", "GELU", "BIAS_GELU", "GATED"};
  opts.push_back(std::string("-DGEMM_DTYPE=") + (cfg.DT() == 0 ? "GEMM_DTYPE_BF16" : "GEMM_DTYPE_F16"));
  opts.push_back(std::string("-DGEMM_LAYOUT=") + (cfg.BT() ? "GEMM_LAYOUT_NT" : "GEMM_LAYOUT_NN"));
  opts.push_back(std::string("-DGEMM_EPILOGUE=GEMM_EPI_") + kEpi[cfg.EPI() >= 0 && cfg.EPI() <= 6 ? cfg.EPI() : 0]);
  src += "#line 1 \"gemm_wgmma.cu\"\n" + ss.str();
  nvrtcProgram p;
  if (create(&p, src.c_str(), "gemm_wgmma.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) return 1;
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());
  const nvrtcResult rc = compile(p, (int)argv.size(), argv.data());
  size_t n = 0;
  log_size(p, &n);
  std::string log(n, '\0');
  if (n) get_log(p, &log[0]);
  std::printf("%s", log.c_str());
  if (rc != NVRTC_SUCCESS) {
    std::printf("NVRTC failed\n");
    return 1;
  }
  size_t sz = 0;
  cubin_size(p, &sz);
  std::vector<char> bin(sz);
  get_cubin(p, bin.data());
  destroy(&p);
  FILE* o = std::fopen(out, "wb");
  if (!o || std::fwrite(bin.data(), 1, sz, o) != sz) return 1;
  std::fclose(o);
  std::printf("wrote %s (%zu bytes)\n", out, sz);
  return 0;
}

// ---- cuBLAS, opened at run time ----
typedef cublasStatus_t (*GemmExFn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                   const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*,
                                   void*, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t);
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  GemmExFn gemm = nullptr;
  cublasHandle_t h = nullptr;
  bool ok = false;
  Cublas() {
    const char* names[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12", nullptr};
    void* l = open_lib(names);
    if (!l) return;
    create = sym<decltype(&cublasCreate_v2)>(l, "cublasCreate_v2");
    gemm = sym<GemmExFn>(l, "cublasGemmEx");
    ok = create(&h) == CUBLAS_STATUS_SUCCESS;
  }
  // Row-major C[M,N] = A[M,K] . op(B): column-major C^T = op(B)^T . A^T.
  void run(bool bt, int dt, const void* A, const void* B, void* C, int M, int N, int K) {
    const float one = 1.f, zero = 0.f;
    const cudaDataType_t t = dt == 0 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t s =
        bt ? gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, t, K, A, t, K, &zero, C, t, N, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT)
           : gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, t, N, A, t, K, &zero, C, t, N, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::printf("cublasGemmEx failed: %d\n", (int)s);
      std::exit(1);
    }
  }
};

// ---- device helpers ----
template <class T>
__device__ __forceinline__ float e2f(T x);
template <>
__device__ __forceinline__ float e2f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float e2f(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T f2e(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 f2e(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half f2e(float x) { return __float2half_rn(x); }

template <class T>
__global__ void fill_random(T* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long x = (unsigned long long)i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = (float)(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = f2e<T>(2.f * u - 1.f);
  }
}
__global__ void fill_bits(unsigned short* p, long long n, unsigned short v) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = v;
}
// The fp32 reference: 64 x 64 output tiles, 256 threads, 4 x 4 outputs a thread, k in
// steps of 16 through shared memory; fp32 FMAs in k order.
template <class T>
__global__ void __launch_bounds__(256) reference(const T* A, const T* B0, const T* B1, const T* bias, const T* R,
                                                 float* ref, long long M, long long N, long long K, int bt, int epi) {
  __shared__ float sa[16][64], sb[2][16][65];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const long long m0 = blockIdx.y * 64LL, n0 = blockIdx.x * 64LL;
  float acc[2][4][4] = {};
  const int nb = epi == 6 ? 2 : 1;
  for (long long k0 = 0; k0 < K; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int r = i / 16, kk = i % 16;
      const long long m = m0 + r, k = k0 + kk;
      sa[kk][r] = m < M && k < K ? e2f(A[m * K + k]) : 0.f;
      for (int b = 0; b < nb; ++b) {
        const T* B = b ? B1 : B0;
        int nn, kq;
        if (bt) nn = i / 16, kq = i % 16;  // B[n][k]: k fastest (coalesced-ish)
        else kq = i / 64, nn = i % 64;     // B[k][n]: n fastest
        const long long n = n0 + nn, k2 = k0 + kq;
        sb[b][kq][nn] = n < N && k2 < K ? e2f(bt ? B[n * K + k2] : B[k2 * N + n]) : 0.f;
      }
    }
    __syncthreads();
    for (int kk = 0; kk < 16; ++kk)
      for (int b = 0; b < nb; ++b)
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) acc[b][i][j] = fmaf(sa[kk][ty + 16 * i], sb[b][kk][tx + 16 * j], acc[b][i][j]);
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const long long m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m >= M || n >= N) continue;
      float v = acc[0][i][j];
      if (epi == 1 || epi == 5) v += e2f(bias[n]);
      if (epi == 2) v += e2f(R[m * N + n]);
      if (epi == 3) v = v / (1.f + expf(-v));
      if (epi == 4 || epi == 5) v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
      if (epi == 6) v = v / (1.f + expf(-v)) * acc[1][i][j];
      ref[m * N + n] = v;
    }
}

static float h2f(unsigned short h, int dt) {
  if (dt == 0) {
    unsigned u = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float f;
  if (e == 0) f = std::ldexp((float)m, -24);
  else if (e == 31) f = m ? NAN : INFINITY;
  else f = std::ldexp((float)(m | 1024), (int)e - 25);
  return s ? -f : f;
}

// ---- buffers ----
struct Bufs {
  unsigned short *A = nullptr, *B0 = nullptr, *B1 = nullptr, *bias = nullptr, *Rbase = nullptr, *R = nullptr,
                 *Cbase = nullptr, *C = nullptr;
  float* ref = nullptr;
  long long M = 0, N = 0, K = 0;
};
static const long long kGuard = 256;  // elements of guard zone each side of C (512 bytes)
static const unsigned short kGuardBits = 0x3C3C;

static void fill(int dt, unsigned short* p, long long n, unsigned seed) {
  if (dt == 0) fill_random<<<1024, 256>>>(reinterpret_cast<__nv_bfloat16*>(p), n, seed);
  else fill_random<<<1024, 256>>>(reinterpret_cast<__half*>(p), n, seed);
}
// coff: C (and R) start coff elements past an aligned address.
static void alloc(const Cfg& c, Bufs& b, long long M, long long N, long long K, bool with_ref, int coff) {
  b.M = M, b.N = N, b.K = K;
  const int epi = c.EPI(), dt = c.DT();
  CK(cudaMalloc(&b.A, std::max(1LL, M * K) * 2));
  CK(cudaMalloc(&b.B0, std::max(1LL, N * K) * 2));
  if (epi == 6) CK(cudaMalloc(&b.B1, std::max(1LL, N * K) * 2));
  if (epi == 1 || epi == 5) CK(cudaMalloc(&b.bias, N * 2));
  if (epi == 2) {
    CK(cudaMalloc(&b.Rbase, (M * N + 8) * 2));
    b.R = b.Rbase + coff;
  }
  CK(cudaMalloc(&b.Cbase, (M * N + 2 * kGuard + 8) * 2));
  b.C = b.Cbase + kGuard + coff;
  if (with_ref) CK(cudaMalloc(&b.ref, std::max(1LL, M * N) * 4));
  fill(dt, b.A, M * K, 1);
  fill(dt, b.B0, N * K, 2);
  if (b.B1) fill(dt, b.B1, N * K, 3);
  if (b.bias) fill(dt, b.bias, N, 4);
  if (b.R) fill(dt, b.R, M * N, 5);
  CK(cudaGetLastError());
}
static void release(Bufs& b) {
  cudaFree(b.A), cudaFree(b.B0), cudaFree(b.B1), cudaFree(b.bias), cudaFree(b.Rbase), cudaFree(b.Cbase), cudaFree(b.ref);
  b = Bufs();
}

static CUfunction g_fn;
static void run_kernel(const Cfg& c, Bufs& b, unsigned short* R = nullptr) {
  const Launch l = launch_shape(c, b.M, b.N);
  void* args[8];
  int n = 0;
  args[n++] = &b.A;
  args[n++] = &b.B0;
  if (c.EPI() == 6) args[n++] = &b.B1;
  args[n++] = &b.C;
  if (c.EPI() == 1 || c.EPI() == 5) args[n++] = &b.bias;
  if (c.EPI() == 2) args[n++] = R ? &R : &b.R;
  args[n++] = &b.M;
  args[n++] = &b.N;
  args[n++] = &b.K;
  CU(drv.launch_kernel(g_fn, l.gx, 1, l.gz, l.block, 1, 1, l.shared, 0, args, nullptr));
}

static int g_pass = 0, g_fail = 0, g_skip = 0;

// mode: 0 plain, 1 C and R offset by one element, 2 in place (R == C; EPI 2 only)
static void check_shape(const Cfg& c, long long M, long long N, long long K, int mode) {
  if (!applicable(c, M, N, K) || (mode == 2 && c.EPI() != 2)) {
    std::printf("  M=%-6lld N=%-6lld K=%-6lld skipped (the config's constraints rule it out)\n", M, N, K);
    ++g_skip;
    return;
  }
  const int dt = c.DT();
  Bufs b;
  alloc(c, b, M, N, K, true, mode == 1 ? 1 : 0);
  // The reference first (in place, R is overwritten by the kernel).
  dim3 rg((unsigned)cdivll(N, 64), (unsigned)cdivll(M, 64));
  if (dt == 0)
    reference<__nv_bfloat16><<<rg, 256>>>((const __nv_bfloat16*)b.A, (const __nv_bfloat16*)b.B0,
                                          (const __nv_bfloat16*)b.B1, (const __nv_bfloat16*)b.bias,
                                          (const __nv_bfloat16*)b.R, b.ref, M, N, K, c.BT(), c.EPI());
  else
    reference<__half><<<rg, 256>>>((const __half*)b.A, (const __half*)b.B0, (const __half*)b.B1,
                                   (const __half*)b.bias, (const __half*)b.R, b.ref, M, N, K, c.BT(), c.EPI());
  CK(cudaGetLastError());
  fill_bits<<<256, 256>>>(b.Cbase, kGuard + (b.C - b.Cbase - kGuard), kGuardBits);
  fill_bits<<<256, 256>>>(b.C + M * N, kGuard, kGuardBits);
  if (mode == 2) CK(cudaMemcpy(b.C, b.R, M * N * 2, cudaMemcpyDeviceToDevice));  // in place: C holds R
  else fill_bits<<<1024, 256>>>(b.C, M * N, 0xFFFF);                            // NaN
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  run_kernel(c, b, mode == 2 ? b.C : nullptr);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("  M=%-6lld N=%-6lld K=%-6lld kernel failed: %s\nFAIL (aborting)\n", M, N, K, cudaGetErrorString(e));
    std::exit(1);
  }
  const long long pre = b.C - b.Cbase;
  std::vector<unsigned short> cv(pre + M * N + kGuard);
  std::vector<float> ref(M * N);
  CK(cudaMemcpy(cv.data(), b.Cbase, cv.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref.data(), b.ref, ref.size() * 4, cudaMemcpyDeviceToHost));
  long long guard_bad = 0, unwritten = 0, bad = 0;
  for (long long i = 0; i < pre; ++i) guard_bad += cv[i] != kGuardBits;
  for (long long i = 0; i < kGuard; ++i) guard_bad += cv[pre + M * N + i] != kGuardBits;
  double maxref = 0;
  for (float r : ref) maxref = std::max(maxref, (double)std::fabs(r));
  const double rtol = dt == 0 ? 1.0 / 128 : 1.0 / 512;
  const double atol = 2e-3 * std::max(maxref, 1e-3);
  double max_rel = 0, max_abs = 0;
  long long worst = -1;
  for (long long i = 0; i < M * N; ++i) {
    const float got = h2f(cv[pre + i], dt);
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
  std::printf("  M=%-6lld N=%-6lld K=%-6lld%s max_rel=%.3e max_abs/max|ref|=%.3e unwritten=%lld outside=%lld "
              "beyond_tol=%lld %s",
              M, N, K, mode == 1 ? " (C+1)" : mode == 2 ? " (R==C)" : "", max_rel, maxref > 0 ? max_abs / maxref : max_abs,
              unwritten, guard_bad, bad, ok ? "PASS" : "FAIL");
  if (!ok && worst >= 0)
    std::printf("  (worst at m=%lld n=%lld: got %g, ref %g)", worst / N, worst % N, h2f(cv[pre + worst], dt), ref[worst]);
  std::printf("\n");
  ok ? ++g_pass : ++g_fail;
  release(b);
}

template <class F>
static float time_ms(F&& f, int iters) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int i = 0; i < 3; ++i) f();
  for (int i = 0; i < iters; ++i) {
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

static const long long kTimeShapes[][3] = {{4096, 4096, 4096}, {8192, 8192, 8192}, {256, 14336, 4096},
                                           {1024, 14336, 4096}, {4096, 14336, 4096}, {256, 4096, 14336},
                                           {1024, 4096, 14336}, {4096, 4096, 14336}};
static bool timed_for(int epi, const long long* s) {
  if (epi != 6) return true;
  return s[1] == 14336 || (s[0] == 4096 && s[1] == 4096 && s[2] == 4096);  // gated: up/gate shapes, 4096^3
}

int main(int argc, char** argv) {
  bool quick = false, compile = false, cublas_only = false;
  long long limit = 1LL << 62;
  const char* out = nullptr;
  const char* src = "kernels/cuda/gemm_wgmma.cu";
  const char* cubin = nullptr;
  int cublas_dt = 0;
  Cfg cfg;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-q") == 0) quick = true;
    else if (std::strcmp(argv[i], "-s") == 0) quick = true, limit = 1LL << 28;
    else if (std::strcmp(argv[i], "-t") == 0) quick = true, limit = 1LL << 22;
    else if (std::strcmp(argv[i], "-x") == 0) limit = 0;
    else if (std::strcmp(argv[i], "--compile") == 0 && i + 1 < argc) compile = true, out = argv[++i];
    else if (std::strcmp(argv[i], "--src") == 0 && i + 1 < argc) src = argv[++i];
    else if (std::strcmp(argv[i], "--cublas") == 0 && i + 1 < argc) cublas_only = true, cublas_dt = std::atoi(argv[++i]);
    else if (parse_define(argv[i], cfg)) {
    } else cubin = argv[i];
  }
  if (compile) return compile_mode(out, src, cfg);

  CK(cudaFree(0));  // the runtime's primary context, current for the driver API too
  drv.open();
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", p.name, p.major, p.minor, p.multiProcessorCount);

  if (cublas_only) {
    Cublas cb;
    if (!cb.ok) {
      std::printf("cuBLAS not available\n");
      return 1;
    }
    for (int bt = 1; bt >= 0; --bt)
      for (const auto& s : kTimeShapes) {
        const long long M = s[0], N = s[1], K = s[2];
        unsigned short *A, *B, *C;
        CK(cudaMalloc(&A, M * K * 2));
        CK(cudaMalloc(&B, N * K * 2));
        CK(cudaMalloc(&C, M * N * 2));
        fill(cublas_dt, A, M * K, 1);
        fill(cublas_dt, B, N * K, 2);
        const float ms = time_ms([&] { cb.run(bt, cublas_dt, A, B, C, (int)M, (int)N, (int)K); }, 20);
        std::printf("CUBLAS %s %lld %lld %lld %.4f %.1f\n", bt ? "NT" : "NN", M, N, K, ms, 2.0 * M * N * K / ms * 1e-9);
        cudaFree(A), cudaFree(B), cudaFree(C);
      }
    return 0;
  }

  if (!cubin) {
    std::printf("usage: see the header of %s\n", __FILE__);
    return 2;
  }
  std::printf("config:");
  for (const auto& d : cfg.defines) std::printf(" %s", d.c_str());
  std::printf("\n");
  std::vector<char> bin;
  {
    std::ifstream f(cubin, std::ios::binary);
    if (!f) {
      std::printf("cannot read %s\n", cubin);
      return 1;
    }
    bin.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  CUmodule mod;
  CU(drv.module_load_data(&mod, bin.data()));
  CU(drv.module_get_function(&g_fn, mod, "gemm"));
  {
    const Launch l = launch_shape(cfg, 4096, 4096);
    CU(drv.func_set_attribute(g_fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)l.shared));
    int regs = 0, local = 0, sshared = 0;
    CU(drv.func_get_attribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, g_fn));
    CU(drv.func_get_attribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, g_fn));
    CU(drv.func_get_attribute(&sshared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, g_fn));
    std::printf("kernel: %d registers, %d bytes local, %d static + %u dynamic bytes shared, %u threads\n", regs, local,
                sshared, l.shared, l.block);
  }

  std::printf("correctness:\n");
  // {M, N, K, mode}: mode 1: C (and R) one element off alignment; mode 2: in place (EPI 2)
  const long long shapes[][4] = {
      {1, 64, 64, 0},       {3, 5, 8, 0},          {7, 72, 24, 0},         {33, 200, 136, 0},     {64, 64, 64, 0},
      {128, 256, 64, 0},    {129, 136, 264, 0},    {130, 131, 136, 0},     {257, 520, 1000, 0},   {511, 384, 2056, 0},
      {1000, 1000, 1000, 0}, {33, 4104, 8200, 0},  {16, 4096, 4096, 0},    {300, 8, 8192, 0},     {1031, 1029, 1032, 0},
      {1, 1, 8, 0},         {2048, 2048, 2048, 0}, {256, 4096, 14336, 0},  {4096, 4096, 4096, 0}, {100, 136, 72, 1},
      {257, 264, 520, 1},   {129, 264, 1032, 2},   {1031, 4096, 7, 0}};
  for (const auto& s : shapes)
    if (s[0] * s[1] * s[2] <= limit) check_shape(cfg, s[0], s[1], s[2], (int)s[3]);
  std::printf("%d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skip);

  if (!quick) {
    std::printf("timing (median of 20 runs):\n");
    for (const auto& s : kTimeShapes) {
      if (!timed_for(cfg.EPI(), s)) continue;
      const long long M = s[0], N = s[1], K = s[2];
      if (!applicable(cfg, M, N, K)) continue;
      Bufs b;
      alloc(cfg, b, M, N, K, false, 0);
      CK(cudaDeviceSynchronize());
      const float ms = time_ms([&] { run_kernel(cfg, b); }, 20);
      CK(cudaDeviceSynchronize());
      const double flop = 2.0 * M * N * K * cfg.NB();
      std::printf("TIME %lld %lld %lld %.4f %.1f\n", M, N, K, ms, flop / ms * 1e-9);
      release(b);
    }
  }
  return g_fail ? 1 : 0;
}
