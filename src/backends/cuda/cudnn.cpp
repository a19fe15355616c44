// cuDNN's fused attention as a library choice of the cuda backend: cudnn_attn_bf16
// (kiln/library.hpp's AttentionProblem), through the cuDNN frontend's SDPA graph
// with the library opened at run time (libcudnn.so.9 by dlopen; absent, the
// choice is unavailable, with why).
//
// One graph a call's (T, S, CAP, HQ, HKV), built on first sight: the keys and
// values are the cache's first S + T rows exactly, so cuDNN never reads a row
// past them (a cache's rows not yet written may hold anything, NaN included: a
// graph over the whole cache with a padding mask multiplied them by zero, and
// NaN times zero is NaN). The causal mask is aligned bottom-right (query i sees
// keys 0 .. S + i), as the problem's. S is read from the call, never from a cell:
// a program keeps exact launches for a shape whose choice is a library's
// (docs/program.md, "Cells"), and a launch given a cell is refused.
#include <dlfcn.h>

#include <chrono>
#include <deque>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_libraries.hpp"
#include "core/format.hpp"
#include "core/log.hpp"

#if KILN_HAVE_CUDNN_FRONTEND
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <cudnn_frontend.h>
#pragma GCC diagnostic pop

// The frontend's functions look cuDNN's up in this handle (set below, once).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace kiln {

namespace {

#if KILN_HAVE_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

// libcudnn opened once: its handle for the frontend, its version, or why not.
struct Cudnn {
  std::string why;
  size_t version = 0;
  static const Cudnn& get() {
    static Cudnn c = [] {
      Cudnn o;
      std::vector<std::string> tried;
      void* h = nullptr;
      for (const char* n : {"libcudnn.so.9", "libcudnn.so"}) {
        tried.push_back(n);
        if ((h = ::dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
      }
      if (!h) {
        o.why = fmt::format("cuDNN is not installed (tried {}; a directory holding libcudnn.so.9 can be put on "
                            "LD_LIBRARY_PATH)",
                            fmt::join(tried, ", "));
        return o;
      }
      auto get_version = reinterpret_cast<size_t (*)()>(::dlsym(h, "cudnnGetVersion"));
      if (!get_version || !::dlsym(h, "cudnnBackendCreateDescriptor")) {
        o.why = "libcudnn lacks the functions kiln calls (cudnnGetVersion, the backend API)";
        return o;
      }
      o.version = get_version();
      if (o.version < 90700) {
        o.why = fmt::format("cuDNN {} is older than 9.7, the first with a bottom-right causal mask", o.version);
        return o;
      }
      // The frontend asks the CUDA runtime a few things (the device's compute capability):
      // name the one of this toolkit, where the loader would not find one by itself.
      if (!std::getenv("CUDNN_FRONTEND_CUDART_LIB_NAME")) {
        std::string rt = "libcudart.so.13";
        if (void* t = ::dlopen(rt.c_str(), RTLD_LAZY | RTLD_LOCAL)) ::dlclose(t);
        else if (std::string dir = cuda::toolkit_library_dir(); !dir.empty()) rt = dir + "/libcudart.so.13";
        ::setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", rt.c_str(), 0);
      }
      fe::cudnn_dlhandle = h;
      return o;
    }();
    return c;
  }
};

std::string fe_error(fe::error_t e) { return e.get_message(); }

class CudnnAttention final : public LoadedKernel {
 public:
  CudnnAttention(std::string key, KernelMeta meta, const LibraryChoice& c, Device& dev)
      : LoadedKernel(std::move(key), std::move(meta)), dev_(dev), name_(c.name()) {
    const Cudnn& cd = Cudnn::get();
    if (!cd.why.empty()) fail(Errc::launch, "{}: {}", name_, cd.why);
    const auto t0 = std::chrono::steady_clock::now();
    dev_.bind();
    if (fe::detail::create_handle(&h_) != CUDNN_STATUS_SUCCESS) fail(Errc::launch, "{}: cudnnCreate failed", name_);
    log::debug("{}: a handle made in {:.1f} ms (cuDNN {})", name_, log::ms_since(t0), cd.version);
  }
  ~CudnnAttention() override {
    try {
      dev_.bind();
      for (void* w : retired_)
        if (w) dev_.free(w);
      if (workspace_) dev_.free(workspace_);
    } catch (const Error&) {
    }
    graphs_.clear();
    if (h_) fe::detail::destroy_handle(h_);
  }

  std::string can_implement(void* const* params) const override {
    const AttentionOperands o = attention_operands(params);
    if (o.t <= 0) return "";
    if (o.hkv <= 0 || o.hq % o.hkv != 0) return "HQ is not a multiple of HKV";
    if (o.s < 0) return "cuDNN's attention takes S from the call, not from a cell";
    if (o.s + o.t > o.cap) return "S + T is past the cache's capacity";
    if (o.t > INT32_MAX || o.cap > INT32_MAX) return "cuDNN's lengths are 32-bit";
    // (The graph is built by the first launch, never here: a check may come during a capture.)
    std::lock_guard<std::mutex> g(m_);
    auto it = graphs_.find(key_of(o));
    return it == graphs_.end() ? "" : it->second.why;
  }

  std::string describe(void* const* params) const override {
    const AttentionOperands o = attention_operands(params);
    if (o.t <= 0) return "";
    std::lock_guard<std::mutex> g(m_);
    auto it = graphs_.find(key_of(o));
    if (it == graphs_.end()) return "";
    const Built& b = it->second;
    return b.why.empty() ? fmt::format("cuDNN {} SDPA (graph built in {:.0f} ms), workspace {} B", Cudnn::get().version,
                                       b.build_ms, b.workspace_bytes)
                         : "";
  }

  void launch(void* const* params, const LaunchDims&, Stream stream) override {
    if (cuda_graph_update_declines(stream)) return;
    // A cell in place of S (a program that sized the launch for its bucket) cannot be read
    // here: refused, never run with the bucket's bound.
    LaunchDims cd;
    cd.nargs = 9;
    cd.ncell = 1;
    cd.cell_arg[0] = AttentionProblem::kCellArg;
    CellParams room;
    if (with_cells(params, cd, room) != params)
      fail(Errc::launch, "{}: cuDNN's attention takes S from the call, not from a cell", name_);
    const AttentionOperands o = attention_operands(params);
    if (o.t <= 0) return;
    void* s = stream ? stream : cuda::default_stream();
    std::lock_guard<std::mutex> g(m_);
    dev_.bind();
    // A graph is built (memory allocated, the device asked) outside a capture only: a capture
    // meeting a new (T, S) is refused, and its caller launches once without one first.
    if (!graphs_.count(key_of(o)) && cuda::stream_capturing(s))
      fail(Errc::launch, "{}: the graph of T={} S={} is built outside a capture first", name_, o.t, o.s);
    Built& b = built(o);
    if (!b.why.empty()) fail(Errc::launch, "{}: {}", name_, b.why);
    try {
      if (fe::detail::set_stream(h_, static_cast<cudaStream_t>(s)) != CUDNN_STATUS_SUCCESS)
        fail(Errc::launch, "{}: cudnnSetStream failed", name_);
      std::unordered_map<int64_t, void*> pack = {
          {kQ, const_cast<void*>(o.q)}, {kK, const_cast<void*>(o.k)}, {kV, const_cast<void*>(o.v)}, {kO, o.o}};
      fe::error_t e = b.graph->execute(h_, pack, b.workspace);
      if (e.is_bad()) fail(Errc::launch, "{}: cuDNN's SDPA failed: {}", name_, fe_error(e));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // the frontend's own (a symbol the library lacks)
      fail(Errc::launch, "{}: {}", name_, e.what());
    }
  }

 private:
  static constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4;
  struct Built {
    std::shared_ptr<fe::graph::Graph> graph;
    void* workspace = nullptr;
    int64_t workspace_bytes = 0;
    double build_ms = 0;
    std::string why;  // "" when it runs
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
  static Key key_of(const AttentionOperands& o) { return {o.t, o.s, o.cap, o.hq, o.hkv}; }
  // The graph of a call's (T, S, CAP, HQ, HKV), built on first sight (under m_); kept whole
  // or, where it cannot be built, with why.
  Built& built(const AttentionOperands& o) const {
    const Key key = key_of(o);
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return it->second;
    Built b;
    try {
      build(o, b);
    } catch (const std::exception& e) {  // the frontend's (or an allocation's): the choice cannot run it
      b.graph.reset();
      b.why = fmt::format("cuDNN's graph of T={} S={} HQ={} HKV={} was not built: {}", o.t, o.s, o.hq, o.hkv, e.what());
    }
    if (!b.why.empty()) log::debug("{}: {}", name_, b.why);
    // At most kMaxGraphs kept (a prompt in chunks meets a new S each chunk): the oldest goes,
    // its plan with it. The workspace is the handle's, never freed before the choice (a graph
    // captured over an evicted plan still uses it).
    if (graphs_.size() >= kMaxGraphs) {
      graphs_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(key);
    return graphs_.emplace(key, std::move(b)).first->second;
  }
  void build(const AttentionOperands& o, Built& b) const {
    const auto t0 = std::chrono::steady_clock::now();
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t T = o.t, S = o.s, C = o.cap, HQ = o.hq, HKV = o.hkv, D = 128, L = S + T;
    auto tensor = [&](const char* name, int64_t uid, std::vector<int64_t> dim, std::vector<int64_t> stride) {
      return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
    };
    // [batch, heads, rows, dims] over row-major rows x heads x dims; the caches' first L rows.
    auto q = tensor("q", kQ, {1, HQ, T, D}, {T * HQ * D, D, HQ * D, 1});
    auto k = tensor("k_cache", kK, {1, HKV, L, D}, {C * HKV * D, D, HKV * D, 1});
    auto v = tensor("v_cache", kV, {1, HKV, L, D}, {C * HKV * D, D, HKV * D, 1});
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention")
                    .set_generate_stats(false)
                    .set_attn_scale(1.0f / std::sqrt(128.0f));
    // With no past the two alignments are one mask: the top-left one, as PyTorch's SDPA asks for it.
    if (S == 0) opts.set_causal_mask(true);
    else opts.set_causal_mask_bottom_right(true);
    auto [out, stats] = g->sdpa(q, k, v, opts);
    (void)stats;
    out->set_output(true).set_uid(kO).set_dim({1, HQ, T, D}).set_stride({T * HQ * D, D, HQ * D, 1});
    fe::error_t e = g->validate();
    if (e.is_good()) e = g->build_operation_graph(h_);
    if (e.is_good()) e = g->create_execution_plans({fe::HeurMode_t::A});
    if (e.is_good()) e = g->check_support(h_);
    if (e.is_good()) e = g->build_plans(h_);
    if (e.is_good()) e = g->get_workspace_size(b.workspace_bytes);
    if (e.is_bad()) {
      b.why = fmt::format("cuDNN cannot run T={} S={} HQ={} HKV={}: {}", T, S, HQ, HKV, fe_error(e));
      return;
    }
    if (b.workspace_bytes > workspace_bytes_) {
      // A larger workspace for the handle; the smaller one is kept until the choice goes
      // (graphs captured before may still use it).
      retired_.push_back(workspace_);
      workspace_ = dev_.alloc(static_cast<size_t>(b.workspace_bytes));
      workspace_bytes_ = b.workspace_bytes;
    }
    b.workspace = workspace_;
    b.graph = std::move(g);
    b.build_ms = log::ms_since(t0);
    log::debug("{}: the graph of T={} S={} HQ={} HKV={} built in {:.1f} ms (workspace {} B)", name_, T, S, HQ, HKV,
               b.build_ms, b.workspace_bytes);
  }

  Device& dev_;
  std::string name_;
  cudnnHandle_t h_ = nullptr;
  mutable std::mutex m_;
  static constexpr size_t kMaxGraphs = 64;
  mutable std::map<Key, Built> graphs_;
  mutable std::deque<Key> order_;  // graphs_' keys, oldest first
  mutable void* workspace_ = nullptr;  // the largest any graph needs, shared by them (under m_)
  mutable int64_t workspace_bytes_ = 0;
  mutable std::vector<void*> retired_;  // smaller workspaces, freed with the choice
};

#endif  // KILN_HAVE_CUDNN_FRONTEND

class CudnnLibrary final : public Library {
 public:
  explicit CudnnLibrary(CudaLibraryHost host) : host_(std::move(host)) {}
  std::string name() const override { return "cudnn"; }
  // A graph built for each (T, S, CAP, HQ, HKV) on first sight.
  bool plans_per_shape() const override { return true; }
  std::string implements(const GemmProblem& p) const override {
    return fmt::format("kiln calls cuDNN for attention only (cuBLASLt for GEMMs), not {}", p.text());
  }
  std::string implements_attention(const AttentionProblem& p) const override {
    if (p.dtype == DType::bf16) return "";
    return fmt::format("kiln calls cuDNN's attention for bf16 only, not {}", p.text());
  }
  std::string unavailable() override {
#if KILN_HAVE_CUDNN_FRONTEND
    if (std::string why = Cudnn::get().why; !why.empty()) return why;
    return host_.unavailable();
#else
    return "kiln was built without the cuDNN frontend's headers (scripts/fetch-cudnn-frontend.sh fetches them)";
#endif
  }
  std::string identity() override {
#if KILN_HAVE_CUDNN_FRONTEND
    const Cudnn& c = Cudnn::get();
    return fmt::format("{} frontend {} {}", c.why.empty() ? fmt::format("cuDNN {}", c.version) : "cuDNN (unavailable)",
                       CUDNN_FRONTEND_VERSION, host_.arch());
#else
    return "cuDNN (not built) " + host_.arch();
#endif
  }
  std::shared_ptr<LoadedKernel> load(std::string key, KernelMeta meta, const LibraryChoice& c) override {
#if KILN_HAVE_CUDNN_FRONTEND
    return std::make_shared<CudnnAttention>(std::move(key), std::move(meta), c, host_.device());
#else
    (void)key;
    (void)meta;
    fail(Errc::launch, "{}: {}", c.name(), unavailable());
#endif
  }

 private:
  CudaLibraryHost host_;
};

}  // namespace

std::unique_ptr<Library> make_cudnn(const CudaLibraryHost& host) { return std::make_unique<CudnnLibrary>(host); }

}  // namespace kiln
