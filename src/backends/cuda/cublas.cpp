// cuBLAS as a library choice of the cuda backend: cublas_sgemm (f32, B as
// K x N, no TF32), through cublasSgemm.
#include <dlfcn.h>

#include <climits>
#include <string>
#include <vector>

#include "backends/cuda/cuda_api.hpp"
#include "backends/cuda/cuda_libraries.hpp"
#include "core/format.hpp"

namespace kiln {

namespace {

using namespace cuda;

// cuBLAS, opened with dlopen; absent, the library choice is unavailable.
struct Cublas {
  using Handle = void*;
  int (*create)(Handle*);
  int (*destroy)(Handle);
  int (*set_stream)(Handle, void*);
  int (*set_math)(Handle, int);
  int (*get_property)(int, int*);
  int (*sgemm)(Handle, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*,
               float*, int);
  std::string why, version;
  static const Cublas& get() {
    static Cublas c = [] {
      Cublas o{};
      void* h = nullptr;
      std::vector<std::string> tried;
      std::vector<std::string> names = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
      for (const auto& n : names) {
        tried.push_back(n);
        if ((h = ::dlopen(n.c_str(), RTLD_LAZY | RTLD_LOCAL))) break;
      }
      // Beside NVRTC, in the toolkit.
      std::string why;
      if (!h)
        if (const Nvrtc* nv = Nvrtc::get(&why); nv && !nv->path.empty()) {
          std::string dir = nv->path.substr(0, nv->path.rfind('/'));
          for (const char* n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
            std::string p = dir + "/" + n;
            tried.push_back(p);
            if ((h = ::dlopen(p.c_str(), RTLD_LAZY | RTLD_LOCAL))) break;
          }
        }
      if (!h) {
        o.why = fmt::format("cuBLAS is not installed (tried {})", fmt::join(tried, ", "));
        return o;
      }
      o.create = reinterpret_cast<decltype(o.create)>(::dlsym(h, "cublasCreate_v2"));
      o.destroy = reinterpret_cast<decltype(o.destroy)>(::dlsym(h, "cublasDestroy_v2"));
      o.set_stream = reinterpret_cast<decltype(o.set_stream)>(::dlsym(h, "cublasSetStream_v2"));
      o.set_math = reinterpret_cast<decltype(o.set_math)>(::dlsym(h, "cublasSetMathMode"));
      o.get_property = reinterpret_cast<decltype(o.get_property)>(::dlsym(h, "cublasGetProperty"));
      o.sgemm = reinterpret_cast<decltype(o.sgemm)>(::dlsym(h, "cublasSgemm_v2"));
      if (!o.create || !o.destroy || !o.set_stream || !o.set_math || !o.sgemm || !o.get_property) {
        o.why = "libcublas lacks a function kiln calls (cublasCreate_v2, cublasSgemm_v2...)";
        return o;
      }
      int major = 0, minor = 0, patch = 0;
      o.get_property(0, &major);
      o.get_property(1, &minor);
      o.get_property(2, &patch);
      o.version = fmt::format("{}.{}.{}", major, minor, patch);
      return o;
    }();
    return c;
  }
};

// C = A @ B, row-major fp32: cuBLAS is column-major, so it computes
// C^T = B^T A^T, reading B and A as they lie. Default math mode: no TF32.
class CublasSgemm final : public LoadedKernel {
 public:
  CublasSgemm(std::string key, KernelMeta meta, Device& dev) : LoadedKernel(std::move(key), std::move(meta)), dev_(dev) {
    const Cublas& c = Cublas::get();
    dev_.bind();
    if (c.create(&h_) != 0) fail(Errc::launch, "cuBLAS: cublasCreate failed");
    c.set_math(h_, 0);  // CUBLAS_DEFAULT_MATH: fp32 on the CUDA cores
  }
  ~CublasSgemm() override {
    if (h_) Cublas::get().destroy(h_);
  }
  std::string can_implement(void* const* params) const override {
    const GemmOperands o = gemm_operands(GemmProblem{}, params);
    if (o.m > INT32_MAX || o.n > INT32_MAX || o.k > INT32_MAX) return "cublasSgemm takes 32-bit sizes";
    return "";
  }
  void launch(void* const* params, const LaunchDims&, Stream s) override {
    if (cuda_graph_update_declines(s)) return;
    const Cublas& c = Cublas::get();
    const GemmOperands o = gemm_operands(GemmProblem{}, params);
    if (o.m <= 0 || o.n <= 0) return;
    const int M = static_cast<int>(o.m), N = static_cast<int>(o.n), K = static_cast<int>(o.k);
    dev_.bind();
    const float one = 1, zero = 0;
    int r = c.set_stream(h_, s ? s : static_cast<void*>(per_thread_stream()));
    if (r == 0)
      r = c.sgemm(h_, 0, 0, N, M, K, &one, static_cast<const float*>(o.b), N, static_cast<const float*>(o.a),
                  K > 0 ? K : 1, &zero, static_cast<float*>(o.c), N);
    if (r != 0) fail(Errc::launch, "cuBLAS: cublasSgemm({}x{}x{}) failed with status {}", M, N, K, r);
  }

 private:
  Device& dev_;
  Cublas::Handle h_ = nullptr;
};

class CublasLibrary final : public Library {
 public:
  explicit CublasLibrary(CudaLibraryHost host) : host_(std::move(host)) {}
  std::string name() const override { return "cublas"; }
  std::string implements(const GemmProblem& p) const override {
    if (p == GemmProblem{}) return "";
    return fmt::format("kiln calls cuBLAS for sgemm only (cuBLASLt for the others), not {}", p.text());
  }
  std::string unavailable() override {
    if (std::string why = Cublas::get().why; !why.empty()) return why;
    return host_.unavailable();
  }
  std::string identity() override { return fmt::format("cuBLAS {} {}", Cublas::get().version, host_.arch()); }
  std::shared_ptr<LoadedKernel> load(std::string key, KernelMeta meta, const LibraryChoice&) override {
    return std::make_shared<CublasSgemm>(std::move(key), std::move(meta), host_.device());
  }

 private:
  CudaLibraryHost host_;
};

}  // namespace

std::unique_ptr<Library> make_cublas(const CudaLibraryHost& host) { return std::make_unique<CublasLibrary>(host); }

}  // namespace kiln
