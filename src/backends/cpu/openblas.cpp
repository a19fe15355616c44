// OpenBLAS as library choices of the cpu backend: openblas_sgemm (f32, B as
// K x N), openblas_f32_nt, openblas_f64_nn and openblas_f64_nt, through
// cblas_sgemm and cblas_dgemm. The worked example of docs/libraries.md.
//
// Every epilogue too, in its unfused form, so that a fused template is timed
// against the computation it fuses: a bias or a residual is put in C first
// and the GEMM adds to it (beta = 1); SiLU and GELU (the erf form, as kiln's
// cpu kernels) are a pass over C after it; the gated MLP is two GEMMs (the
// up projection into scratch memory of M x N, allocated for the call) and a
// pass computing silu(gate) * up. A choice is timed as a whole.
//
// Opened with dlopen (Debian's libopenblas0): absent, its choices are
// unavailable. Its own thread count is set to kiln's launch threads
// (KILN_NUM_THREADS), so a library call and a kiln grid share the cores alike.
// Its idle threads busy-wait for 2^28 cycles (about 0.1 s) by default, which
// halves a kiln grid that runs next on the same cores; unless the user set
// OPENBLAS_THREAD_TIMEOUT, it is set to 17 (2^17 cycles, about 50 us, as long
// as kiln's own pool spins) before the library is loaded and reads it.
#include "backends/cpu/cpu_libraries.hpp"

#include <dlfcn.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/format.hpp"

namespace kiln {

namespace {

struct OpenBlasApi {
  void (*sgemm)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  void (*dgemm)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*, int);
  void (*set_threads)(int);
  char* (*config)();
  std::string why;
  static const OpenBlasApi& get() {
    static OpenBlasApi b = [] {
      OpenBlasApi o{};
      if (!std::getenv("OPENBLAS_THREAD_TIMEOUT") && !std::getenv("GOTO_THREAD_TIMEOUT"))
        ::setenv("OPENBLAS_THREAD_TIMEOUT", "17", 0);
      void* h = nullptr;
      for (const char* n : {"libopenblas.so.0", "libopenblas.so"})
        if ((h = ::dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
      if (!h) {
        const char* e = ::dlerror();
        o.why = fmt::format("OpenBLAS is not installed (libopenblas.so.0: {}); on Debian: apt-get install libopenblas0",
                            e ? e : "not found");
        return o;
      }
      o.sgemm = reinterpret_cast<decltype(o.sgemm)>(::dlsym(h, "cblas_sgemm"));
      o.dgemm = reinterpret_cast<decltype(o.dgemm)>(::dlsym(h, "cblas_dgemm"));
      o.set_threads = reinterpret_cast<decltype(o.set_threads)>(::dlsym(h, "openblas_set_num_threads"));
      o.config = reinterpret_cast<decltype(o.config)>(::dlsym(h, "openblas_get_config"));
      if (!o.sgemm || !o.dgemm) o.why = "libopenblas has no cblas_sgemm or cblas_dgemm";
      return o;
    }();
    return b;
  }
};

// C = epilogue(A . B (or A . B^T)), row-major.
class OpenBlasGemm final : public LoadedKernel {
 public:
  OpenBlasGemm(std::string key, KernelMeta meta, GemmProblem p, int threads)
      : LoadedKernel(std::move(key), std::move(meta)), p_(p) {
    const OpenBlasApi& b = OpenBlasApi::get();
    if (b.set_threads) b.set_threads(threads);
  }
  std::string can_implement(void* const* params) const override {
    const GemmOperands o = gemm_operands(p_, params);
    if (o.m > INT32_MAX || o.n > INT32_MAX || o.k > INT32_MAX) return "cblas_?gemm takes 32-bit sizes";
    return "";
  }
  void launch(void* const* params, const LaunchDims&, Stream) override {
    const GemmOperands o = gemm_operands(p_, params);
    if (o.m <= 0 || o.n <= 0) return;
    if (p_.dtype == DType::f32) run<float>(o);
    else run<double>(o);
  }

 private:
  static void gemm(const float* a, const float* b, float* c, int M, int N, int K, bool nt, float beta) {
    OpenBlasApi::get().sgemm(kRowMajor, kNoTrans, nt ? kTrans : kNoTrans, M, N, K, 1.0f, a, K > 0 ? K : 1, b,
                             nt ? (K > 0 ? K : 1) : N, beta, c, N);
  }
  static void gemm(const double* a, const double* b, double* c, int M, int N, int K, bool nt, double beta) {
    OpenBlasApi::get().dgemm(kRowMajor, kNoTrans, nt ? kTrans : kNoTrans, M, N, K, 1.0, a, K > 0 ? K : 1, b,
                             nt ? (K > 0 ? K : 1) : N, beta, c, N);
  }
  template <typename T>
  static T silu(T x) { return x / (T(1) + std::exp(-x)); }
  template <typename T>
  static T gelu(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752))); }

  template <typename T>
  void run(const GemmOperands& o) const {
    const int M = static_cast<int>(o.m), N = static_cast<int>(o.n), K = static_cast<int>(o.k);
    const bool nt = p_.layout == GemmLayout::nt;
    const T* a = static_cast<const T*>(o.a);
    const T* b = static_cast<const T*>(o.b);
    T* c = static_cast<T*>(o.c);
    const size_t mn = static_cast<size_t>(M) * static_cast<size_t>(N);
    T beta = 0;
    switch (p_.epilogue) {
      case GemmEpilogue::residual:  // C = R, then C += A . B
        if (c != o.extra) std::memmove(c, o.extra, mn * sizeof(T));
        beta = 1;
        break;
      case GemmEpilogue::bias:
      case GemmEpilogue::bias_gelu:  // every row of C the bias, then C += A . B
        for (int i = 0; i < M; ++i) std::memcpy(c + static_cast<size_t>(i) * N, o.extra, N * sizeof(T));
        beta = 1;
        break;
      default:
        break;
    }
    gemm(a, b, c, M, N, K, nt, beta);
    switch (p_.epilogue) {
      case GemmEpilogue::silu:
        for (size_t i = 0; i < mn; ++i) c[i] = silu(c[i]);
        break;
      case GemmEpilogue::gelu:
      case GemmEpilogue::bias_gelu:
        for (size_t i = 0; i < mn; ++i) c[i] = gelu(c[i]);
        break;
      case GemmEpilogue::gated: {  // C = A . Bg (above), up = A . Bu, C = silu(C) * up
        std::unique_ptr<T[]> up(new T[mn]);  // per call: nothing of this size stays allocated
        gemm(a, static_cast<const T*>(o.b2), up.get(), M, N, K, nt, 0);
        for (size_t i = 0; i < mn; ++i) c[i] = silu(c[i]) * up[i];
        break;
      }
      default:
        break;
    }
  }

  static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  GemmProblem p_;
};

class OpenBlas final : public Library {
 public:
  explicit OpenBlas(int threads) : threads_(threads) {}
  std::string name() const override { return "openblas"; }
  std::string implements(const GemmProblem& p) const override {
    if (p.rmsnorm) return fmt::format("OpenBLAS has no RMSNorm prologue ({})", p.text());
    if (p.dtype == DType::f32 || p.dtype == DType::f64) return "";
    return fmt::format("OpenBLAS has no {} (kiln calls its f32 and f64 GEMMs)", p.text());
  }
  std::string unavailable() override { return OpenBlasApi::get().why; }
  std::string identity() override {
    const OpenBlasApi& b = OpenBlasApi::get();
    return fmt::format("{} threads={}", b.config ? b.config() : "(not installed)", threads_);
  }
  std::shared_ptr<LoadedKernel> load(std::string key, KernelMeta meta, const LibraryChoice& c) override {
    return std::make_shared<OpenBlasGemm>(std::move(key), std::move(meta), c.problem, threads_);
  }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Library> make_openblas(int threads) { return std::make_unique<OpenBlas>(threads); }

}  // namespace kiln
