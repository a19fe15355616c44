// cuBLASLt as library choices of the cuda backend: bf16 and f16 GEMMs with
// fp32 accumulation, row-major, B as K x N (nn) or N x K (nt), with the
// epilogues cuBLASLt has (bias, GELU, bias then GELU) and a residual (beta =
// 1 over a separate C input). A choice "cublaslt_<problem>#k" runs the k-th
// algorithm cuBLASLt's heuristic offers for the call; the heuristic is asked
// once per shape and remembered.
#include "backends/cuda/cuda_libraries.hpp"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_api.hpp"
#include "core/format.hpp"
#include "core/log.hpp"

namespace kiln::cuda {

namespace {

// Threads readying cuBLASLt in the background now (cublaslt_readying).
std::atomic<int> g_readying{0};

// The few cuBLASLt types and constants kiln uses (cublasLt.h, CUDA 12 and 13).
using LtHandle = void*;
using LtDesc = void*;
using LtLayout = void*;
using LtPref = void*;
struct LtAlgo {
  uint64_t data[8];
};
struct LtHeuristic {
  LtAlgo algo;
  size_t workspace;
  int state;
  float waves;
  int reserved[4];
};
constexpr int kCompute32F = 68;                      // CUBLAS_COMPUTE_32F
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;     // cudaDataType
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8, kDescBiasType = 26;
constexpr uint32_t kEpiDefault = 1, kEpiBias = 4, kEpiGelu = 32, kEpiGeluBias = 36;
constexpr int kPrefMaxWorkspace = 1;
constexpr int kAlgoId = 0, kAlgoTile = 1, kAlgoSplitK = 2, kAlgoReduction = 3, kAlgoSwizzle = 4, kAlgoCustom = 5,
              kAlgoStages = 6;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS asks for on Hopper
constexpr int kAsk = 16;                              // algorithms asked of the heuristic

struct Lt {
  int (*create)(LtHandle*);
  int (*destroy)(LtHandle);
  int (*desc_create)(LtDesc*, int, int);
  int (*desc_destroy)(LtDesc);
  int (*desc_set)(LtDesc, int, const void*, size_t);
  int (*layout_create)(LtLayout*, int, uint64_t, uint64_t, int64_t);
  int (*layout_destroy)(LtLayout);
  int (*pref_create)(LtPref*);
  int (*pref_destroy)(LtPref);
  int (*pref_set)(LtPref, int, const void*, size_t);
  int (*heuristic)(LtHandle, LtDesc, LtLayout, LtLayout, LtLayout, LtLayout, LtPref, int, LtHeuristic*, int*);
  int (*matmul)(LtHandle, LtDesc, const void*, const void*, LtLayout, const void*, LtLayout, const void*, const void*,
                LtLayout, void*, LtLayout, const LtAlgo*, void*, size_t, void*);
  int (*algo_get)(const LtAlgo*, int, void*, size_t, size_t*);
  size_t (*version)();
  std::string why;

  static const Lt& get() {
    static const Lt lt = [] {
      const auto t0 = std::chrono::steady_clock::now();
      Lt o{};
      void* h = nullptr;
      std::vector<std::string> tried;
      for (const char* n : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
        tried.push_back(n);
        if ((h = ::dlopen(n, RTLD_LAZY | RTLD_LOCAL))) break;
      }
      std::string why;
      if (!h)
        if (const Nvrtc* nv = Nvrtc::get(&why); nv && !nv->path.empty()) {
          std::string dir = nv->path.substr(0, nv->path.rfind('/'));
          for (const char* n : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
            tried.push_back(dir + "/" + n);
            if ((h = ::dlopen(tried.back().c_str(), RTLD_LAZY | RTLD_LOCAL))) break;
          }
        }
      if (!h) {
        o.why = fmt::format("cuBLASLt is not installed (tried {})", fmt::join(tried, ", "));
        return o;
      }
      std::string missing;
      auto bind = [&](auto& fn, const char* sym) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, sym));
        if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(sym);
      };
      bind(o.create, "cublasLtCreate");
      bind(o.destroy, "cublasLtDestroy");
      bind(o.desc_create, "cublasLtMatmulDescCreate");
      bind(o.desc_destroy, "cublasLtMatmulDescDestroy");
      bind(o.desc_set, "cublasLtMatmulDescSetAttribute");
      bind(o.layout_create, "cublasLtMatrixLayoutCreate");
      bind(o.layout_destroy, "cublasLtMatrixLayoutDestroy");
      bind(o.pref_create, "cublasLtMatmulPreferenceCreate");
      bind(o.pref_destroy, "cublasLtMatmulPreferenceDestroy");
      bind(o.pref_set, "cublasLtMatmulPreferenceSetAttribute");
      bind(o.heuristic, "cublasLtMatmulAlgoGetHeuristic");
      bind(o.matmul, "cublasLtMatmul");
      bind(o.algo_get, "cublasLtMatmulAlgoConfigGetAttribute");
      bind(o.version, "cublasLtGetVersion");
      if (!missing.empty()) o.why = "libcublasLt lacks functions kiln calls: " + missing;
      log::debug("cuBLASLt: library opened in {:.1f} ms", log::ms_since(t0));
      return o;
    }();
    return lt;
  }
};

enum class Epi { none, bias, residual, gelu, bias_gelu };

// The problem in cuBLASLt's terms.
struct Problem {
  int dtype = kR16BF;
  bool nt = false;
  Epi epi = Epi::none;
  int rank = 0;
};

Problem problem_of(const LibraryChoice& c) {
  Problem p;
  p.rank = c.rank;
  p.dtype = c.problem.dtype == DType::f16 ? kR16F : kR16BF;
  p.nt = c.problem.layout == GemmLayout::nt;
  switch (c.problem.epilogue) {
    case GemmEpilogue::none: p.epi = Epi::none; break;
    case GemmEpilogue::bias: p.epi = Epi::bias; break;
    case GemmEpilogue::residual: p.epi = Epi::residual; break;
    case GemmEpilogue::gelu: p.epi = Epi::gelu; break;
    case GemmEpilogue::bias_gelu: p.epi = Epi::bias_gelu; break;
    case GemmEpilogue::silu:
    case GemmEpilogue::gated: fail(Errc::usage, "{}: cuBLASLt has no such epilogue", c.name());
  }
  return p;
}

class LtKernel final : public LoadedKernel {
 public:
  LtKernel(std::string key, KernelMeta meta, const LibraryChoice& c, Device& dev)
      : LoadedKernel(std::move(key), std::move(meta)), lt_(Lt::get()), dev_(dev), name_(c.name()),
        problem_(c.problem), p_(problem_of(c)) {
    if (!lt_.why.empty()) fail(Errc::launch, "{}: {}", name_, lt_.why);
    const auto t0 = std::chrono::steady_clock::now();
    dev_.bind();
    if (lt_.create(&h_) != 0) fail(Errc::launch, "{}: cublasLtCreate failed", name_);
    if (lt_.desc_create(&desc_, kCompute32F, kR32F) != 0) fail(Errc::launch, "{}: cublasLtMatmulDescCreate failed", name_);
    const int32_t ta = p_.nt ? 1 : 0, tb = 0;
    lt_.desc_set(desc_, kDescTransA, &ta, sizeof ta);
    lt_.desc_set(desc_, kDescTransB, &tb, sizeof tb);
    uint32_t epi = p_.epi == Epi::bias        ? kEpiBias
                   : p_.epi == Epi::gelu      ? kEpiGelu
                   : p_.epi == Epi::bias_gelu ? kEpiGeluBias
                                              : kEpiDefault;
    lt_.desc_set(desc_, kDescEpilogue, &epi, sizeof epi);
    if (p_.epi == Epi::bias || p_.epi == Epi::bias_gelu) {
      const int32_t bt = p_.dtype;
      lt_.desc_set(desc_, kDescBiasType, &bt, sizeof bt);
    }
    lt_.pref_create(&pref_);
    const uint64_t ws = kWorkspaceBytes;
    lt_.pref_set(pref_, kPrefMaxWorkspace, &ws, sizeof ws);
    workspace_ = dev_.alloc(kWorkspaceBytes);
    log::debug("{}: handle and workspace made in {:.1f} ms", name_, log::ms_since(t0));
  }
  ~LtKernel() override {
    for (auto& [k, s] : shapes_)
      for (LtLayout l : {s.a, s.b, s.d}) lt_.layout_destroy(l);
    if (workspace_) dev_.free(workspace_);
    if (pref_) lt_.pref_destroy(pref_);
    if (desc_) lt_.desc_destroy(desc_);
    if (h_) lt_.destroy(h_);
  }

  std::string can_implement(void* const* params) const override {
    auto [M, N, K] = mnk(params);
    if (M <= 0 || N <= 0) return "";  // nothing to compute: the launch returns at once
    if (K <= 0) return "K is 0: cuBLASLt has nothing to multiply";
    std::lock_guard<std::mutex> g(m_);
    const Shape& s = shape(M, N, K);
    if (static_cast<int>(s.algos.size()) <= p_.rank)
      return fmt::format("cuBLASLt's heuristic offers {} algorithm{} for {}x{}x{}; #{} is not one", s.algos.size(),
                         s.algos.size() == 1 ? "" : "s", M, N, K, p_.rank);
    return "";
  }

  std::string describe(void* const* params) const override {
    auto [M, N, K] = mnk(params);
    if (M <= 0 || N <= 0 || K <= 0) return "";
    std::lock_guard<std::mutex> g(m_);
    const Shape& s = shape(M, N, K);
    if (static_cast<int>(s.algos.size()) <= p_.rank) return "";
    const LtAlgo& a = s.algos[p_.rank].algo;
    auto get = [&](int attr) {
      uint32_t v = 0;
      size_t w = 0;
      lt_.algo_get(&a, attr, &v, sizeof v, &w);
      return v;
    };
    return fmt::format("cuBLASLt algo {} tile {} stages {} split-k {} reduction {} swizzle {} custom {}",
                       static_cast<int32_t>(get(kAlgoId)), get(kAlgoTile), get(kAlgoStages), get(kAlgoSplitK),
                       get(kAlgoReduction), get(kAlgoSwizzle), get(kAlgoCustom));
  }

  void launch(void* const* params, const LaunchDims&, Stream stream) override {
    if (cuda_graph_update_declines(stream)) return;
    auto [M, N, K] = mnk(params);
    if (M <= 0 || N <= 0) return;
    const GemmOperands o = gemm_operands(problem_, params);
    const void* A = o.a;
    const void* B = o.b;
    void* C = o.c;
    const void* extra = o.extra;
    const float alpha = 1, beta = p_.epi == Epi::residual ? 1.0f : 0.0f;
    const void* cin = p_.epi == Epi::residual ? extra : C;
    void* s = stream ? stream : static_cast<void*>(per_thread_stream());
    std::lock_guard<std::mutex> g(m_);
    dev_.bind();
    Shape& sh = shape(M, N, K);
    if (p_.epi == Epi::bias || p_.epi == Epi::bias_gelu) lt_.desc_set(desc_, kDescBiasPointer, &extra, sizeof extra);
    const LtAlgo* algo =
        !sh.refused && static_cast<int>(sh.algos.size()) > p_.rank ? &sh.algos[p_.rank].algo : nullptr;
    // cuBLASLt's operands: D^T = op(B) A^T in its column-major terms.
    const bool first = !sh.launched;  // timed for its debug line, not on later launches
    const auto t0 = first ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    int r = lt_.matmul(h_, desc_, &alpha, B, sh.a, A, sh.b, &beta, cin, sh.d, C, sh.d, algo, workspace_,
                       kWorkspaceBytes, s);
    if (r != 0 && algo) {
      // The library refused the algorithm it offered: its own choice instead, from now
      // on for this shape (never the refused call again), said once.
      sh.refused = true;
      if (!said_fallback_) {
        said_fallback_ = true;
        log::warn("{}: cuBLASLt refused the algorithm it ranked #{} for {}x{}x{} (status {}); running its own choice "
                  "instead",
                  name_, p_.rank, M, N, K, r);
      }
      r = lt_.matmul(h_, desc_, &alpha, B, sh.a, A, sh.b, &beta, cin, sh.d, C, sh.d, nullptr, workspace_,
                     kWorkspaceBytes, s);
    }
    if (r != 0) fail(Errc::launch, "{}: cublasLtMatmul({}x{}x{}) failed with status {}", name_, M, N, K, r);
    if (first) {
      sh.launched = true;
      log::debug("{}: the first product of {}x{}x{} launched in {:.2f} ms", name_, M, N, K, log::ms_since(t0));
    }
  }

 private:
  struct Shape {
    LtLayout a = nullptr, b = nullptr, d = nullptr;
    std::vector<LtHeuristic> algos;
    bool refused = false;  // the library refused algos[rank] at run time: its own choice runs
    bool launched = false;  // for the debug line of its first launch
  };
  std::tuple<int64_t, int64_t, int64_t> mnk(void* const* params) const {
    const GemmOperands o = gemm_operands(problem_, params);
    return {o.m, o.n, o.k};
  }
  // The layouts and the heuristic's algorithms for one shape; holds m_.
  Shape& shape(int64_t M, int64_t N, int64_t K) const {
    auto key = std::make_tuple(M, N, K);
    auto it = shapes_.find(key);
    if (it != shapes_.end()) return it->second;
    dev_.bind();
    Shape s;
    const uint64_t m = static_cast<uint64_t>(M), n = static_cast<uint64_t>(N), k = static_cast<uint64_t>(K);
    // Row-major X[r][c] is column-major c x r. B: N x K (nt) is K x N, transposed; K x N (nn) is N x K.
    if (p_.nt) lt_.layout_create(&s.a, p_.dtype, k, n, static_cast<int64_t>(k));
    else lt_.layout_create(&s.a, p_.dtype, n, k, static_cast<int64_t>(n));
    lt_.layout_create(&s.b, p_.dtype, k, m, static_cast<int64_t>(k));
    lt_.layout_create(&s.d, p_.dtype, n, m, static_cast<int64_t>(n));
    if (p_.epi == Epi::bias || p_.epi == Epi::bias_gelu) {
      // The heuristic looks at the bias pointer's alignment: any well-aligned one will do here.
      const void* aligned = workspace_;
      lt_.desc_set(desc_, kDescBiasPointer, &aligned, sizeof aligned);
    }
    LtHeuristic res[kAsk] = {};
    int got = 0;
    const auto t0 = std::chrono::steady_clock::now();
    if (lt_.heuristic(h_, desc_, s.a, s.b, s.d, s.d, pref_, kAsk, res, &got) == 0)
      for (int i = 0; i < got; ++i)
        if (res[i].state == 0) s.algos.push_back(res[i]);
    log::debug("{}: the heuristic for {}x{}x{} answered in {:.2f} ms", name_, M, N, K, log::ms_since(t0));
    return shapes_.emplace(key, std::move(s)).first->second;
  }

  const Lt& lt_;
  Device& dev_;
  std::string name_;
  GemmProblem problem_;
  Problem p_;
  LtHandle h_ = nullptr;
  LtDesc desc_ = nullptr;
  LtPref pref_ = nullptr;
  void* workspace_ = nullptr;
  mutable std::mutex m_;
  mutable std::map<std::tuple<int64_t, int64_t, int64_t>, Shape> shapes_;
  bool said_fallback_ = false;
};


class CublasLt final : public Library {
 public:
  explicit CublasLt(CudaLibraryHost host) : host_(std::move(host)) {}
  std::string name() const override { return "cublaslt"; }
  bool ranked() const override { return true; }
  std::string implements(const GemmProblem& p) const override {
    if (p.epilogue == GemmEpilogue::silu || p.epilogue == GemmEpilogue::gated)
      return fmt::format("cuBLASLt has no epilogue for {}", p.text());
    if (p.rmsnorm) return fmt::format("cuBLASLt has no RMSNorm prologue ({})", p.text());
    if (p.dtype == DType::bf16 || p.dtype == DType::f16) return "";
    return fmt::format("kiln calls cuBLASLt for bf16 and f16 GEMMs, not {}", p.text());
  }
  std::string unavailable() override {
    if (std::string why = Lt::get().why; !why.empty()) return why;
    return host_.unavailable();
  }
  std::string identity() override {
    const Lt& lt = Lt::get();
    return fmt::format("{} {}", lt.why.empty() ? fmt::format("cuBLASLt {}", lt.version()) : "cuBLASLt (unavailable)",
                       host_.arch());
  }
  std::shared_ptr<LoadedKernel> load(std::string key, KernelMeta meta, const LibraryChoice& c) override {
    return std::make_shared<LtKernel>(std::move(key), std::move(meta), c, host_.device());
  }
  bool readying() const override { return g_readying.load() > 0; }

 private:
  CudaLibraryHost host_;
};

}  // namespace

void cublaslt_readying(bool begun) {
  if (begun) ++g_readying;
  else --g_readying;
}

bool open_cublaslt() {
  return Lt::get().why.empty();
}

// cuBLASLt's one-time work: a handle and the heuristic for one small bf16 problem
// (128 x 128 x 128), which need no context of kiln's (the library's own runtime
// starts here, beside the context's making; after it where `device_first`), then
// that product on this thread's stream once the device is made (its first
// kernel's loading).
void ready_cublaslt(const std::function<Device*()>& device_when_made, bool device_first) {
  const Lt& lt = Lt::get();
  if (!lt.why.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  Device* first = nullptr;
  if (device_first) {
    // The library's runtime takes the current context's device: kiln's, once made.
    if (!(first = device_when_made())) return;
    try {
      first->bind();
    } catch (const Error&) {
      return;
    }
  }
  LtHandle h = nullptr;
  LtDesc desc = nullptr;
  LtPref pref = nullptr;
  LtLayout a = nullptr, b = nullptr, d = nullptr;
  constexpr uint64_t n = 128;
  constexpr size_t ws_bytes = size_t{4} << 20;
  LtHeuristic res[1] = {};
  int got = 0, status = -1;
  double heuristic_ms = 0;
  Device* dev = nullptr;
  void *A = nullptr, *B = nullptr, *D = nullptr, *ws = nullptr;
  if (lt.create(&h) == 0 && lt.desc_create(&desc, kCompute32F, kR32F) == 0 && lt.pref_create(&pref) == 0) {
    const int32_t ta = 1;
    lt.desc_set(desc, kDescTransA, &ta, sizeof ta);
    const uint64_t wsb = ws_bytes;
    lt.pref_set(pref, kPrefMaxWorkspace, &wsb, sizeof wsb);
    lt.layout_create(&a, kR16BF, n, n, n);
    lt.layout_create(&b, kR16BF, n, n, n);
    lt.layout_create(&d, kR16BF, n, n, n);
    if (lt.heuristic(h, desc, a, b, d, d, pref, 1, res, &got) != 0) got = 0;
    heuristic_ms = log::ms_since(t0);
    dev = got == 0 ? nullptr : first ? first : device_when_made();
  }
  try {
    if (dev) {
      dev->bind();
      A = dev->alloc(n * n * 2);
      B = dev->alloc(n * n * 2);
      D = dev->alloc(n * n * 2);
      ws = dev->alloc(ws_bytes);
      const float alpha = 1, beta = 0;
      Stream s = reinterpret_cast<Stream>(per_thread_stream());
      status = lt.matmul(h, desc, &alpha, A, a, B, b, &beta, D, d, D, d, &res[0].algo, ws, ws_bytes, s);
      dev->sync(s);
    }
  } catch (const Error& e) {
    log::debug("cuBLASLt: its small product failed ({}); a first call loads its own", e.what());
  }
  for (LtLayout l : {a, b, d})
    if (l) lt.layout_destroy(l);
  if (dev)
    for (void* p : {A, B, D, ws})
      if (p) dev->free(p);
  if (pref) lt.pref_destroy(pref);
  if (desc) lt.desc_destroy(desc);
  if (h) lt.destroy(h);
  log::debug("cuBLASLt: readied in {:.1f} ms (a handle and the heuristic in {:.1f} ms; a small product: status {})",
             log::ms_since(t0), heuristic_ms, status);
}

}  // namespace kiln::cuda

namespace kiln {
std::unique_ptr<Library> make_cublaslt(const CudaLibraryHost& host) { return std::make_unique<cuda::CublasLt>(host); }
}  // namespace kiln
