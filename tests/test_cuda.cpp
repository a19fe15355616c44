// The cuda backend. Compiling needs NVRTC only (the CI machine has the
// toolkit and no GPU): those tests run everywhere NVRTC is. Tests that
// launch need a GPU and skip, saying so, where there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "compile/compile_pool.hpp"
#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/device_args.hpp"
#include "kiln/fill.hpp"
#include "kiln/kernel.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"
#include "worker/worker_pool.hpp"
#include "backends/cuda/fill_kernel.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct CudaTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  std::shared_ptr<Backend> cuda;
  void SetUp() override {
    opts.bench_budget_ms = 5;
    opts.workers = 2;
    if (!gpu()) opts.cuda_arch = "sm_90";  // compile for an H100 where there is no GPU
    cuda = make_backend("cuda", opts);
  }
  static bool gpu() { return make_backend("cuda", Options::from_env())->unavailable_reason().empty(); }
  // Skips a test that needs NVRTC when it is absent, saying why.
  bool nvrtc_missing() {
    try {
      cuda->toolchain_identity();
      return false;
    } catch (const Error& e) {
      std::cout << "[  SKIPPED ] no NVRTC here: " << e.what() << "\n";
      return true;
    }
  }
  std::vector<fs::path> builtin_specs() {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(test::kernels() + "/cuda")) {
      if (e.path().extension() != ".toml" || is_multi_spec(e.path())) continue;
      const std::vector<std::string> members = family_members(e.path());
      if (members.empty()) out.push_back(e.path());
      for (const auto& m : members) out.push_back(e.path().string() + ":" + m);  // every member of a family
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

#define NEEDS_GPU()                                                                                     \
  do {                                                                                                  \
    std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();                 \
    if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine"; \
  } while (0)

// A cuda spec of kernel k in k.cu, one block of 32 threads, with the keys `rest` adds.
std::string one_block_spec(const std::string& rest) {
  return "name = \"k\"\nbackend = \"cuda\"\nsource = \"k.cu\"\nentry = \"k\"\ngrid = [\"1\"]\nblock = [\"32\"]\n" + rest;
}

// The error compiling s's first config gives ("" where it compiles).
std::string compile_error(Runtime& rt, const KernelSpec& s) {
  try {
    rt.compile_pool("cuda").submit(make_compile_request(s, s.space.at(0))).get();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Every config of every built-in cuda kernel (a sample of the search
// spaces) compiles for sm_90, and its launch metadata is read from NVRTC's report.
TEST_F(CudaTest, NvrtcCompilesEveryBuiltInConfigForTheH100) {
  if (nvrtc_missing()) return;
  Runtime rt(opts);
  auto specs = builtin_specs();
  ASSERT_GE(specs.size(), 3u);
  size_t configs = 0;
  std::set<std::string> keys;
  for (const auto& p : specs) {
    KernelSpec s = load_spec(p);
    ASSERT_EQ(s.backend, "cuda");
    std::vector<BinaryFuture> fs;
    std::vector<Config> cs;
    std::vector<Config> valid;
    for (const auto& c : s.space.all())
      if (statically_pruned(s, c, rt.backend("cuda").limits()).empty()) valid.push_back(c);
    // The search spaces (thousands of configs, matmul_search.toml) are
    // compiled whole by bench/gpu/search.sh; here every 97th of them. The
    // tensor-core GEMM spaces (over a hundred configs each, of one source)
    // are compiled whole by `kiln compile` on the GPU machine; here every 29th.
    const size_t step = valid.size() > 1000 ? 97 : valid.size() > 64 ? 29 : 1;
    for (size_t i = 0; i < valid.size(); i += step) {
      cs.push_back(valid[i]);
      fs.push_back(rt.compile_pool("cuda").submit(make_compile_request(s, valid[i])));
    }
    for (size_t i = 0; i < fs.size(); ++i) {
      std::shared_ptr<const Binary> b;
      ASSERT_NO_THROW(b = fs[i].get()) << s.name << " " << cs[i].str();
      EXPECT_GT(b->meta.registers, 0) << s.name;
      const std::string arch = opts.cuda_arch.empty() ? rt.backend("cuda").device().info().arch : opts.cuda_arch;
      EXPECT_TRUE(b->meta.target == arch || b->meta.target == arch + "a") << b->meta.target;  // a spec's target
      EXPECT_FALSE(b->meta.symbol.empty());
      EXPECT_GT(b->meta.max_threads, 0);
      EXPECT_GT(b->bytes.size(), 100u);
      // No built-in kernel has its wgmmas serialized by ptxas (advisories C7513 and C7515: its
      // tensor-core work would run one instruction at a time), and kiln's own device functions,
      // put before every kernel, raise no message where a kernel does not call them.
      const std::string what = s.name + " " + cs[i].str() + ":\n" + b->log;
      EXPECT_EQ(b->log.find("instructions are serialized"), std::string::npos) << what;
      EXPECT_EQ(b->log.find("function \"kiln_"), std::string::npos) << what;
      keys.insert(b->key);
      ++configs;
    }
  }
  EXPECT_GT(configs, 10u);
  // NVRTC runs in worker processes by default: a crash in it cannot take this
  // process down, and it compiled faster there than on threads (docs/workers.md).
  EXPECT_EQ(rt.compile_mode("cuda"), CompileMode::subprocess);
  // (One call per distinct binary: the search spec shares matmul.cu, and its
  // configs that the small spec also has are the same binaries.)
  EXPECT_GE(rt.worker_pool()->counters().calls, keys.size());
}

// A compile on a thread that runs past KILN_COMPILE_TIMEOUT is compiled again
// in a worker, where the deadline can be enforced (ThreadedCompiler).
TEST_F(CudaTest, ACompileThatOutrunsItsDeadlineOnAThreadMovesToAWorker) {
  if (nvrtc_missing()) return;
  Options o = opts;
  // NVRTC takes far longer than this for anything: the compile always
  // outruns it (at 0.1 s, a warm machine compiled the matmul in time, and
  // the test failed in a full run while it passed alone).
  o.compile_timeout_s = 0.001;
  o.no_cache = true;
  o.compile_mode = CompileMode::threads;
  Runtime rt(o);
  KernelSpec s = load_spec(test::kernels() + "/cuda/matmul.toml");
  std::shared_ptr<const Binary> b = rt.compile_pool("cuda").submit(make_compile_request(s, s.space.at(0))).get();
  EXPECT_GT(b->bytes.size(), 100u);
  EXPECT_EQ(rt.worker_pool()->counters().calls, 1u);
}

TEST_F(CudaTest, MetadataRoundTripsThroughTheCache) {
  if (nvrtc_missing()) return;
  KernelSpec s = load_spec(test::kernels() + "/cuda/softmax_rowwise.toml");
  Binary first;
  {
    Runtime rt(opts);
    first = *rt.compile_pool("cuda").submit(make_compile_request(s, s.space.at(2))).get();
    EXPECT_FALSE(first.from_cache);
  }
  Runtime rt(opts);
  auto again = rt.compile_pool("cuda").submit(make_compile_request(s, s.space.at(2))).get();
  EXPECT_TRUE(again->from_cache);
  EXPECT_EQ(again->meta, first.meta);
  EXPECT_EQ(again->meta.static_shared, 128) << "32 floats of reduction scratch";
  EXPECT_EQ(again->bytes, first.bytes);
  // Another architecture is another binary.
  Options o2 = opts;
  o2.cuda_arch = "sm_80";
  Runtime rt2(o2);
  BinaryKey k1 = make_binary_key(make_compile_request(s, s.space.at(2)), rt.backend("cuda"));
  BinaryKey k2 = make_binary_key(make_compile_request(s, s.space.at(2)), rt2.backend("cuda"));
  EXPECT_NE(k1.hex(), k2.hex());
}

TEST_F(CudaTest, CompileErrorsNameTheUsersFileAndLineAndTheEntryIsChecked) {
  if (nvrtc_missing()) return;
  std::string toml = R"(name = "k"
backend = "cuda"
source = "k.cu"
entry = "k"
grid = ["1"]
block = ["32"]
args = [ { name = "x", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
)";
  KernelSpec bad = test::spec_in(dir.path() / "a", toml, "k.cu",
                                 "extern \"C\" __global__ void k(float* x, long long n) {\n  x[0] = n;\n  not cuda;\n}\n");
  Runtime rt(opts);
  try {
    rt.compile_pool("cuda").submit(make_compile_request(bad, bad.space.at(0))).get();
    FAIL() << "compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::compile);
    std::string m = e.what();
    EXPECT_NE(m.find("k.cu(3)"), std::string::npos) << m;
    EXPECT_NE(m.find("NVRTC"), std::string::npos) << m;
  }
  KernelSpec wrong = test::spec_in(dir.path() / "b", toml, "k.cu",
                                   "extern \"C\" __global__ void k(float* x, int n) { x[0] = n; }\n");
  try {
    rt.compile_pool("cuda").submit(make_compile_request(wrong, wrong.space.at(0))).get();
    FAIL() << "a 4-byte int was accepted for an i64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 1 ('n') of the spec is i64"), std::string::npos) << e.what();
  }
}

// A spec that says pdl = true (launched to overlap the kernel before it) compiles only when its
// code waits for that kernel (kiln_wait_prior, the device function kiln puts before every
// kernel); the same kernel without pdl compiles either way.
TEST_F(CudaTest, APdlKernelThatNeverWaitsIsRefusedAtCompile) {
  if (nvrtc_missing()) return;
  const std::string toml = one_block_spec(R"(pdl = true
args = [ { name = "x", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
)");
  const std::string waits = "extern \"C\" __global__ void k(float* x, long long n) {\n  kiln_wait_prior();\n  x[0] = n;\n}\n";
  const std::string never = "extern \"C\" __global__ void k(float* x, long long n) {\n  kiln_start_next();\n  x[0] = n;\n}\n";
  Runtime rt(opts);
  KernelSpec good = test::spec_in(dir.path() / "a", toml, "k.cu", waits);
  EXPECT_NO_THROW(rt.compile_pool("cuda").submit(make_compile_request(good, good.space.at(0))).get());
  KernelSpec bad = test::spec_in(dir.path() / "b", toml, "k.cu", never);
  try {
    rt.compile_pool("cuda").submit(make_compile_request(bad, bad.space.at(0))).get();
    FAIL() << "a pdl kernel that never waits compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::compile);
    EXPECT_NE(std::string(e.what()).find("says pdl = true, but its code never calls kiln_wait_prior()"),
              std::string::npos) << e.what();
  }
  std::string plain_toml = toml;
  plain_toml.erase(plain_toml.find("pdl = true\n"), 11);
  KernelSpec plain = test::spec_in(dir.path() / "c", plain_toml, "k.cu", never);
  EXPECT_NO_THROW(rt.compile_pool("cuda").submit(make_compile_request(plain, plain.space.at(0))).get());
}

// A spec's tensor maps are parameters after its arguments: the entry check counts them
// and wants 128 bytes each; a kernel that takes them compiles (launching is the GPU's test).
TEST_F(CudaTest, TensorMapsFollowTheArgumentsAndTheEntryIsCheckedForThem) {
  if (nvrtc_missing()) return;
  const std::string toml = one_block_spec(R"(args = [ { name = "x", type = "bf16*", size = "n * m", intent = "in" }, { name = "n", type = "i64" },
         { name = "m", type = "i64" } ]
tensor_maps = [ { of = "x", rows = "n", cols = "m", box_rows = "64", box_cols = "64", swizzle = 128 } ]
)");
  const char* head = "#include <cuda_bf16.h>\nstruct __align__(64) tmap { unsigned long long v[16]; };\n";
  Runtime rt(opts);
  KernelSpec good = test::spec_in(dir.path() / "a", toml, "k.cu",
                                  std::string(head) + "extern \"C\" __global__ void k(const __nv_bfloat16* x, long long n, "
                                                      "long long m, const __grid_constant__ tmap t) {}\n");
  EXPECT_NO_THROW(rt.compile_pool("cuda").submit(make_compile_request(good, good.space.at(0))).get());
  KernelSpec missing = test::spec_in(dir.path() / "b", toml, "k.cu",
                                     std::string(head) + "extern \"C\" __global__ void k(const __nv_bfloat16* x, long long n, "
                                                         "long long m) {}\n");
  EXPECT_CONTAINS(compile_error(rt, missing), "and then its 1 tensor maps");  // (an entry without its map)
  KernelSpec small = test::spec_in(dir.path() / "c", toml, "k.cu",
                                   std::string(head) + "extern \"C\" __global__ void k(const __nv_bfloat16* x, long long n, "
                                                       "long long m, long long t) {}\n");
  EXPECT_CONTAINS(compile_error(rt, small), "is not a 128-byte tensor map");  // (an 8-byte parameter there)
}

// A spec's workspace is a pointer parameter after the tensor maps: the entry check counts
// it and wants a pointer; a kernel that takes one compiles.
TEST_F(CudaTest, AWorkspaceFollowsTheTensorMapsAndTheEntryIsCheckedForIt) {
  if (nvrtc_missing()) return;
  const std::string toml = one_block_spec(R"(args = [ { name = "x", type = "bf16*", size = "n * m", intent = "in" }, { name = "n", type = "i64" },
         { name = "m", type = "i64" } ]
tensor_maps = [ { of = "x", rows = "n", cols = "m", box_rows = "64", box_cols = "64", swizzle = 128 } ]
workspace = "SM_COUNT * 16"
)");
  const std::string head = "#include <cuda_bf16.h>\nstruct __align__(64) tmap { unsigned long long v[16]; };\n"
                           "extern \"C\" __global__ void k(const __nv_bfloat16* x, long long n, long long m, const "
                           "__grid_constant__ tmap t";
  Runtime rt(opts);
  KernelSpec good = test::spec_in(dir.path() / "a", toml, "k.cu", head + ", unsigned char* ws) {}\n");
  std::shared_ptr<const Binary> b;
  ASSERT_NO_THROW(b = rt.compile_pool("cuda").submit(make_compile_request(good, good.space.at(0))).get());
  EXPECT_TRUE(b->meta.workspace);
  EXPECT_EQ(b->meta.tensor_maps, 1);
  KernelSpec missing = test::spec_in(dir.path() / "b", toml, "k.cu", head + ") {}\n");
  EXPECT_CONTAINS(compile_error(rt, missing), "and then its workspace pointer");
  KernelSpec scalar = test::spec_in(dir.path() / "c", toml, "k.cu", head + ", long long ws) {}\n");
  EXPECT_CONTAINS(compile_error(rt, scalar), "is not a pointer (the spec's workspace)");
}

// A binary keeps its compilers' messages (`kiln compile` prints them): the front end's warnings
// and ptxas' numbered advisories, which NVRTC's log gives among ptxas' resource report (the
// report itself is left out), and none for kiln's own device functions that a kernel leaves
// uncalled. The second kernel (sm_90a) redefines a wgmma's A registers while the wgmma group is open,
// which ptxas answers with waits or fences of its own and an advisory saying so.
TEST_F(CudaTest, ABinaryKeepsTheCompilersWarningsAndPtxasAdvisoriesButNotItsReport) {
  if (nvrtc_missing()) return;
  test::write(dir.path() / "k.cu", "extern \"C\" __global__ void k(float* out) { out[threadIdx.x] = 1.f; }\n");
  // (through kernels/cuda/wgmma_ptx.cuh: its fences and the operand lists of a 64-accumulator wgmma)
  test::write(dir.path() / "w.cu", R"(#include "wgmma_ptx.cuh"
__device__ __forceinline__ void mma_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_R8 "}, {%64, %65, %66, %67}, %68, "
               "1, 1, 1, 1;\n"
               : WG_O8
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
extern "C" __global__ void __launch_bounds__(128) w(float* out, int x, long long db) {
  int unused_here = 3;
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  unsigned a[4] = {unsigned(x), unsigned(x) + 1, unsigned(x) + 2, unsigned(x) + 3};
  for (int k = 0; k < 4; ++k) {
    wg_mma_fence();
    mma_rs(d, a, db);
    for (int e = 0; e < 4; ++e) a[e] = a[e] * 3u + threadIdx.x;  // A redefined while the group is open
    mma_rs(d, a, db + 2);
    wg_mma_commit();
  }
  wg_mma_wait<0>();
  float s = 0.f;
  for (int i = 0; i < 64; ++i) s += d[i];
  out[threadIdx.x] = s;
}
)");
  const std::string args = "args = [{ name = \"out\", type = \"f32*\", size = \"128\", intent = \"out\" }";
  test::write(dir.path() / "k.toml", one_block_spec(args + "]\n"));
  test::write(dir.path() / "w.toml",
              "name = \"w\"\nbackend = \"cuda\"\ntarget = \"sm_90a\"\nsource = \"w.cu\"\nentry = \"w\"\n"
              "grid = [\"1\"]\nblock = [\"128\"]\ncflags = [\"-I" + test::kernels() + "/cuda\"]\n" + args +
                  ", { name = \"x\", type = \"i32\" }, { name = \"db\", type = \"i64\" }]\n");
  Runtime rt(opts);
  auto log_of = [&](const std::string& spec) {
    KernelSpec s = load_spec((dir.path() / spec).string());
    return rt.compile_pool("cuda").submit(make_compile_request(s, s.space.at(0))).get()->log;
  };
  const std::string plain = log_of("k.toml");
  EXPECT_EQ(plain, "") << "a kernel with nothing to warn of, but kiln's functions uncalled:\n" << plain;
  const std::string noted = log_of("w.toml");
  EXPECT_NE(noted.find("warning #177"), std::string::npos) << noted;  // the unused variable
  EXPECT_NE(noted.find("unused_here"), std::string::npos) << noted;
  EXPECT_NE(noted.find("ptxas info    : (C75"), std::string::npos) << "no ptxas advisory kept:\n" << noted;
  EXPECT_EQ(noted.find("Used "), std::string::npos) << "ptxas' report kept:\n" << noted;
  EXPECT_EQ(noted.find("bytes stack frame"), std::string::npos) << noted;
  EXPECT_EQ(noted.find("function \"kiln_"), std::string::npos) << noted;
}

// The TMA family's clusters (MC = 2, B multicast to a pair of blocks), stream-K (SK = 1, with
// the workspace) and tile widths that are not a multiple of 64 compile for every member, at
// the tiles the large shapes take, with no spill (running them is
// TheTmaFamilyComputesItsProblemsAtEdgeShapes, on the GPU).
TEST_F(CudaTest, TheTmaFamilysClustersStreamKAndWidthsCompileForEveryMember) {
  if (nvrtc_missing()) return;
  Runtime rt(opts);
  for (const std::string member : {"bf16_nt", "bf16_nt_residual", "bf16_nt_gated"}) {
    KernelSpec s = load_spec(test::kernels() + "/cuda/gemm_tma.toml:" + member);
    ASSERT_TRUE(s.workspace.has_value());
    std::vector<Config> cs;
    std::vector<BinaryFuture> fs;
    for (const auto& c : s.space.all()) {
      // (split K takes no odd width: the kernel refuses it at compile time, so no config the
      // spec keeps for some call pairs them)
      if (*c.get("BN") % 64 != 0 && *c.get("SPLIT") > 1) {
        EXPECT_FALSE(statically_pruned(s, c, rt.backend("cuda").limits()).empty()) << c.str();
      }
      const bool tile = *c.get("BM") == 128 && *c.get("STAGES") == 4 && *c.get("SPLIT") == 1 && *c.get("MINB") == 1;
      if (!tile) continue;
      // at 128 x 128, MC = 2 or SK = 1, or both; every width that is not a multiple of 64
      if (*c.get("BN") == 128 ? *c.get("MC") + *c.get("SK") < 2 : *c.get("BN") % 64 == 0) continue;
      if (!statically_pruned(s, c, rt.backend("cuda").limits()).empty()) continue;  // (ping-pong with SK = 1)
      cs.push_back(c);
      fs.push_back(rt.compile_pool("cuda").submit(make_compile_request(s, c)));
    }
    // MC 2 SK 0 and 1, MC 1 SK 1, and ping-pong with MC 2; BN = 96 (the gated member: n = 192),
    // and for bf16_nt 160 and 224 as well (the residual's and gated member's constraints keep
    // them out)
    EXPECT_GE(cs.size(), member == "bf16_nt" ? 10u : 6u) << member;
    for (size_t i = 0; i < fs.size(); ++i) {
      std::shared_ptr<const Binary> b;
      ASSERT_NO_THROW(b = fs[i].get()) << member << " " << cs[i].str();
      EXPECT_TRUE(b->meta.workspace);
      EXPECT_EQ(b->meta.spill_bytes, 0) << member << " " << cs[i].str();
      EXPECT_EQ(b->meta.local_bytes, 0) << member << " " << cs[i].str();
    }
  }
}

// Without a GPU the backend says why, in every error that needs a device,
// and `kiln backends` says so too; compiling still works (above).
TEST_F(CudaTest, WithoutAGpuTheBackendSaysWhy) {
  std::string why = cuda->unavailable_reason();
  ProcessResult r = run_process({test::kiln_exe(), "backends", "--json"}, 60);
  ASSERT_TRUE(r.ok()) << r.output;
  auto j = nlohmann::json::parse(r.output);
  auto c = j["backends"][1];
  EXPECT_EQ(c["backend"], "cuda");
  EXPECT_EQ(c["available"], why.empty());
  if (why.empty()) {
    EXPECT_TRUE(c["device"]["name"].is_string());
    std::cout << "[  NOTE    ] a GPU is here: " << c["device"]["name"] << "\n";
    return;
  }
  EXPECT_EQ(c["reason"], why);
  try {
    cuda->device();
    FAIL() << "a device without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::launch);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  // Tuning or calling needs the device: a clear error, not a crash.
  Runtime rt(opts);
  Kernel k(rt, load_spec(test::kernels() + "/cuda/axpy.toml"));
  unsigned long long x = 0, y = 0, out = 0;
  float alpha = 1;
  int64_t n = 16;
  try {
    k(x, y, out, alpha, n);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

// ---- on the GPU ----

// axpy's buffers on the device: x and y random (seeds 2s - 1 and 2s), out for the result.
struct AxpyBuffers {
  Device& dev;
  int64_t n;
  std::vector<float> hx, hy;
  DeviceBuffer x, y, out;
  AxpyBuffers(Device& d, int64_t count, uint64_t seed)
      : dev(d), n(count), hx(count), hy(count), x(d, count * 4), y(d, count * 4), out(d, count * 4) {
    fill_random(DType::f32, std::as_writable_bytes(std::span(hx)), 2 * seed - 1);
    fill_random(DType::f32, std::as_writable_bytes(std::span(hy)), 2 * seed);
    dev.to_device(x.get(), hx.data(), n * 4, nullptr);
    dev.to_device(y.get(), hy.data(), n * 4, nullptr);
  }
  float* px() { return static_cast<float*>(x.get()); }
  float* py() { return static_cast<float*>(y.get()); }
  float* po() { return static_cast<float*>(out.get()); }
  // out = alpha x + y at every step-th element. The GPU fuses the multiply-add: compared
  // within rounding of the terms, not of the result.
  void expect_result(float alpha, int64_t step) {
    std::vector<float> hout(static_cast<size_t>(n));
    dev.sync(nullptr);
    dev.to_host(hout.data(), out.get(), n * 4, nullptr);
    for (int64_t i = 0; i < n; i += step)
      ASSERT_NEAR(hout[i], alpha * hx[i] + hy[i], 1e-6 * (std::abs(alpha * hx[i]) + std::abs(hy[i]))) << i;
  }
};

// axpy (kernels/cuda/axpy.toml) tuned in rt (its worker's timing as rt's options say) on fresh
// buffers of 4M elements, then its result checked at every step-th element.
static void expect_axpy_tunes_right(Runtime& rt, uint64_t seed, float alpha, int64_t step) {
  KernelSpec s = load_spec(test::kernels() + "/cuda/axpy.toml");
  AxpyBuffers b(rt.backend("cuda").device(), 1 << 22, seed);
  Kernel k(rt, s);
  k(b.px(), b.py(), b.po(), alpha, b.n);
  b.expect_result(alpha, step);
}

TEST_F(CudaTest, LaunchesTunesAndDispatchesOnTheDevice) {
  NEEDS_GPU();
  Runtime rt(opts);
  KernelSpec s = load_spec(test::kernels() + "/cuda/axpy.toml");
  Device& dev = rt.backend("cuda").device();
  const int64_t n = 1 << 20;
  AxpyBuffers b(dev, n, 1);
  Kernel k(rt, s);
  float alpha = 2.5f;
  float *px = b.px(), *py = b.py(), *po = b.po();
  k(px, py, po, alpha, n);  // tunes on these very buffers (shared with the worker, never written)
  b.expect_result(alpha, 997);
  const std::vector<float>& hx = b.hx;
  std::vector<float> check(n);
  dev.to_host(check.data(), b.x.get(), n * 4, nullptr);
  EXPECT_EQ(check, hx) << "tuning wrote to an input";
  // The second call only launches.
  size_t calls = rt.worker_pool()->counters().calls;
  k.on(nullptr)(px, py, po, alpha, n);
  dev.sync(nullptr);
  EXPECT_EQ(rt.worker_pool()->counters().calls, calls);
}

// KILN_BENCH_HOLD: work enqueued behind a held stream runs only once it is released (a timer
// around the hold counts the host's sleep before the release; one behind the hold does not),
// and a kernel tuned with held timing (in its worker) computes what it should.
TEST_F(CudaTest, AHeldStreamRunsWhatIsBehindItOnlyOnceReleased) {
  NEEDS_GPU();
  Options o = opts;
  o.cuda_bench_hold = true;
  Runtime rt(o);
  Device& dev = rt.backend("cuda").device();
  DeviceBuffer word(dev, 4);
  dev.write_word(word.get(), 1, nullptr);  // (its kernel loaded before the hold)
  dev.sync(nullptr);
  auto around = dev.timer(), behind = dev.timer();
  around->start(nullptr);
  const uint64_t hold = dev.hold_stream(nullptr, 2000);
  ASSERT_NE(hold, 0u);
  behind->start(nullptr);
  dev.write_word(word.get(), 7, nullptr);
  behind->stop(nullptr);
  around->stop(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  dev.release_stream(hold);
  const double around_ns = around->elapsed_ns(), behind_ns = behind->elapsed_ns();
  EXPECT_GE(around_ns, 45e6) << "the stream was not held while the host slept";
  EXPECT_LT(around_ns, 1e9) << "the release did not let the stream go (it ran at the hold's limit)";
  EXPECT_LT(behind_ns, 25e6) << "the work behind the hold was timed with the host's sleep";
  int32_t got = 0;
  dev.to_host(&got, word.get(), 4, nullptr);
  dev.sync(nullptr);
  EXPECT_EQ(got, 7);
  expect_axpy_tunes_right(rt, 4, 1.5f, 991);
}

// The L2 prefetch step (l2_prefetch_bf16.toml): its PTX loads and runs, first call and tuning
// included, for lengths of nothing, less than 16 bytes, a 4 KiB piece's edge and 10 MiB with a
// tail shorter than 16 bytes; it writes nothing. A buffer not 16-byte
// aligned is refused with the constraint named. (What it saves in a program is for bench/gpu.)
TEST_F(CudaTest, TheL2PrefetchStepRunsAndWritesNothing) {
  NEEDS_GPU();
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  KernelSpec s = load_spec(test::kernels() + "/cuda/l2_prefetch_bf16.toml");
  Kernel k(rt, s);
  for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{8}, int64_t{2048}, int64_t{2049}, (int64_t{5} << 20) + 3}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    DeviceArgs args(s, parse_scalars(s, {{"n", std::to_string(n)}}), dev);
    args.fill_random(static_cast<uint64_t>(n) + 1);
    const std::vector<std::byte> before = args.read(0);
    k.launch(args.params());
    k.launch(args.params());  // tuned by now: a plain launch
    dev.sync(nullptr);
    EXPECT_EQ(dev.fault(), "");
    EXPECT_TRUE(args.read(0) == before) << "the prefetch wrote to its buffer";
  }
  DeviceBuffer buf(dev, 4096);
  void* misaligned = static_cast<std::byte*>(buf.get()) + 2;
  int64_t n = 1000;
  void* params[] = {&misaligned, &n};
  try {
    k.launch(params);
    dev.sync(nullptr);
    ADD_FAILURE() << "a buffer 2 bytes off 16 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("align_w"), std::string::npos) << e.what();
  }
}

// KILN_BENCH_L2_FLUSH=read: the flush is a kernel reading the buffer (its PTX loads and
// runs on this GPU, in this process and in the tuning's worker: where it does not load, the
// flush is an error, not a flush by writing), and a kernel tuned with it computes what it
// should. (Whether its timings match a program's better than the writing
// flush's is for bench/gpu, not a test.)
TEST_F(CudaTest, TheReadingL2FlushRunsInTheProcessAndInTheWorker) {
  NEEDS_GPU();
  Options o = opts;
  o.cuda_flush_read = true;
  Runtime rt(o);
  Device& dev = rt.backend("cuda").device();
  EXPECT_GE(dev.flush_caches(nullptr), static_cast<size_t>(dev.info().l2_bytes) * 2);
  EXPECT_GE(dev.flush_caches(nullptr), static_cast<size_t>(dev.info().l2_bytes) * 2);  // the reading kernel now
  dev.sync(nullptr);
  expect_axpy_tunes_right(rt, 2, 0.5f, 1009);
}

// A faulting config (an out-of-bounds write, a trap) or one that never ends
// poisons only its worker's context: the host survives, a correct config is
// picked, and each fault is recorded with its CUDA error or time-out.
TEST_F(CudaTest, FaultingConfigsCostTheirWorkerNotThisProcess) {
  NEEDS_GPU();
  std::string toml = R"SPEC(name = "planted"
backend = "cuda"
source = "planted.cu"
entry = "planted"
grid = ["cdiv(n, 256)"]
block = ["256"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2, 3, 4]
[tuning]
key = ["n"]
)SPEC";
  KernelSpec s = test::spec_in(dir.path(), toml, "planted.cu", R"SRC(
extern "C" __global__ void planted(const float* x, float* y, long long n) {
  long long i = blockIdx.x * 256LL + threadIdx.x;
#if MODE == 1
  if (i == 0) y[1LL << 40] = 1.f;   // far out of bounds
#elif MODE == 2
  if (i == 0) __trap();
#elif MODE == 3
  if (i == 0) { volatile int k = 0; while (true) k = k + 1; }
#endif
  if (i < n) y[i] = x[i] * 2.f + (MODE == 4 ? 0.f : 0.f);
}
)SRC");
  opts.bench_deadline_floor_s = 1;
  opts.bench_timeout_s = 20;
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  const int64_t n = 100000;
  DeviceArgs args(s, parse_scalars(s, {{"n", std::to_string(n)}}), dev);
  args.fill_random(3);
  auto t0 = std::chrono::steady_clock::now();
  TuneOutcome o = rt.tune(s, args.params());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(o.choice);
  int chosen = static_cast<int>(*o.choice->get("MODE"));
  EXPECT_TRUE(chosen == 0 || chosen == 4) << o.choice->str();
  auto result = [&](int m) { return *o.record.find(s.space.at(static_cast<size_t>(m))); };
  EXPECT_EQ(result(1).kind, FailKind::crash) << result(1).error;
  EXPECT_NE(result(1).error.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << result(1).error;
  EXPECT_EQ(result(2).kind, FailKind::crash) << result(2).error;
  EXPECT_EQ(result(3).kind, FailKind::timeout) << result(3).error;
  std::cout << "[  NOTE    ] the planted run tuned in " << secs << " s\n";
  // This process's context is untouched: it still launches.
  Kernel k(rt, s);
  k.launch(args.params());
  dev.sync(nullptr);
  EXPECT_EQ(dev.fault(), "");
}

// The metadata read from a cubin (what kiln uses when NVRTC logs no report,
// as when a compile is answered from a compute cache) agrees with ptxas'
// report, for every built-in config, on two architectures.
TEST_F(CudaTest, CubinMetadataAgreesWithPtxasReport) {
  if (nvrtc_missing()) return;
  for (const char* arch : {"sm_90", "sm_80"}) {
    Options o = opts;
    o.cuda_arch = arch;
    o.no_cache = true;
    auto b = make_backend("cuda", o);
    const LaunchLimits limits = b->limits();  // the architecture's, SM_COUNT among them
    for (const auto& p : builtin_specs()) {
      KernelSpec s = load_spec(p);
      // The tensor-core GEMMs split K over thread-block clusters: sm_90 and up only.
      if (std::string(arch) == "sm_80" && s.source_text.find("__cluster_dims__") != std::string::npos) continue;
      // The last config that a representative call (every size 1024, else 8 or 4096,
      // else sizes that grow with the argument's place, 1024 (i + 1), every buffer
      // aligned) can run: a spec's constraints may rule out configs that do not even compile.
      // Decode attention's call needs its new tokens to fit the cache (S + T <= CAP) and whole
      // groups of query heads, which none of those sizes give: its call is Llama-3-8B's.
      const std::map<std::string, int64_t> attention = {{"T", 1}, {"S", 1024}, {"CAP", 1025}, {"HQ", 32}, {"HKV", 8},
                                                        {"CHUNK", 256}};
      std::optional<Config> pick;
      for (int64_t size : {1024, 8, 4096, -1024, 0}) {
        std::vector<int64_t> slots(s.args.size());
        for (size_t i = 0; i < s.args.size(); ++i)
          slots[i] = s.args[i].pointer ? 256
                     : size == 0      ? (attention.count(s.args[i].name) ? attention.at(s.args[i].name) : 1)
                     : size > 0       ? size
                                      : -size * static_cast<int64_t>(i + 1);
        for (size_t i = s.space.size(); i-- > 0 && !pick;) {
          Config c = s.space.at(i);
          bool ok = true;
          for (const auto& e : s.constraints) ok = ok && compile_expr(s, e, &c, &limits).eval(slots.data()) != 0;
          if (ok) pick = c;
        }
        if (pick) break;
      }
      ASSERT_TRUE(pick) << s.name << ": no config runs a call of sizes 1024, 8 or 4096, or 1024 (i + 1), or decode attention's";
      Config c = *pick;
      CompileRequest req = make_compile_request(s, c);
      Binary bin = b->compile(req, make_binary_key(req, *b).hex());  // throws if the two disagree
      auto m = cubin_meta(bin.bytes, bin.meta.symbol);
      ASSERT_TRUE(m) << s.name << " " << arch;
      EXPECT_EQ(m->registers, bin.meta.registers) << s.name << " " << arch;
      EXPECT_EQ(m->static_shared, bin.meta.static_shared) << s.name << " " << arch;
      EXPECT_EQ(m->local_bytes, bin.meta.local_bytes) << s.name << " " << arch;
    }
  }
}

// The matmul templates' VEC = 4 configs are specialised on 16-byte aligned
// pointers: tuned on aligned inputs, then called with an offset pointer (and
// the reverse), a call never runs a config its arguments break.
TEST_F(CudaTest, MatmulAlignmentSpecialisationBothWays) {
  NEEDS_GPU();
  KernelSpec s = load_spec(test::kernels() + "/cuda/matmul.toml");
  const int64_t n = 256;
  for (bool aligned_first : {true, false}) {
    Options o = opts;
    o.cache_dir = dir.path() / (aligned_first ? "c1" : "c2");
    Runtime rt(o);
    Device& dev = rt.backend("cuda").device();
    TuneOptions to;
    to.libraries = false;  // the templates alone: cuBLAS takes any alignment
    Kernel k(rt, s, to);
    std::vector<float> ha(n * n + 4), hb(n * n), hc(n * n);
    fill_random(DType::f32, std::as_writable_bytes(std::span(ha)), 1);
    fill_random(DType::f32, std::as_writable_bytes(std::span(hb)), 2);
    DeviceBuffer a(dev, (n * n + 4) * 4), b(dev, n * n * 4), c(dev, n * n * 4);
    dev.to_device(a.get(), ha.data(), ha.size() * 4, nullptr);
    dev.to_device(b.get(), hb.data(), hb.size() * 4, nullptr);
    auto call = [&](bool aligned) {
      float* pa = static_cast<float*>(a.get()) + (aligned ? 0 : 1);  // 4 bytes off: 16-byte loads would fault
      auto* pb = static_cast<float*>(b.get());
      auto* pc = static_cast<float*>(c.get());
      k(pa, pb, pc, n, n, n);
      dev.sync(nullptr);
      dev.to_host(hc.data(), pc, n * n * 4, nullptr);
      const float* A = ha.data() + (aligned ? 0 : 1);
      for (int64_t i = 0; i < n; i += 37)
        for (int64_t j = 0; j < n; j += 41) {
          double ref = 0;
          for (int64_t x = 0; x < n; ++x) ref += double(A[i * n + x]) * hb[x * n + j];
          EXPECT_NEAR(hc[i * n + j], ref, 1e-3) << i << "," << j;
        }
      int64_t nn = n;
      void* params[] = {&pa, &pb, &pc, &nn, &nn, &nn};
      return k.choice(params).config;
    };
    Config first = call(aligned_first), second = call(!aligned_first);
    Config misaligned = aligned_first ? second : first;
    ASSERT_TRUE(first.library.empty() && second.library.empty()) << "templates only: " << first.str() << ", " << second.str();
    EXPECT_EQ(*misaligned.get("VEC"), 1) << misaligned.str();
    std::cout << "[  NOTE    ] " << (aligned_first ? "aligned first" : "misaligned first") << ": aligned call runs "
              << (aligned_first ? first : second).str() << ", misaligned " << misaligned.str() << "\n";
  }
}

// Registers known for a sibling ([tuning] registers_by): with R = 128 live
// values a thread, the config compiled first (T = 256) needs over 64
// registers a thread, so its sibling with 1024 threads a block cannot launch
// (64K registers a block) and is pruned before it is compiled, with the
// reason; without registers_by all four compile.
TEST_F(CudaTest, ARegisterSiblingPrunesABlockItsRegistersRuleOutBeforeCompiling) {
  if (nvrtc_missing()) return;
  const std::string src = R"(extern "C" __global__ void k(float* x, long long n) {
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = x[(threadIdx.x + i * 7) % n];
#pragma unroll
  for (int it = 0; it < 8; ++it)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = acc[i] * acc[(i + 1) % R] + 1.0f;
  float s = 0;
#pragma unroll
  for (int i = 0; i < R; ++i) s += acc[i];
  x[threadIdx.x % n] = s;
}
)";
  const std::string toml = R"(name = "regs"
backend = "cuda"
source = "k.cu"
entry = "k"
grid = ["1"]
block = ["T"]
args = [ { name = "x", type = "f32*", size = "n", intent = "inout" }, { name = "n", type = "i64" } ]
[params]
R = [8, 128]
T = [256, 1024]
)";
  auto compile = [&](const std::string& name, const std::string& extra) {
    fs::path d = dir.path() / name;
    fs::create_directories(d);
    std::ofstream(d / "k.cu") << src;
    std::ofstream(d / "k.toml") << toml + extra;
    fs::path outp = d / "out.json";
    ProcessResult r = run_process(
        {"bash", "-c",
         fmt::format("{} KILN_CACHE_DIR={} {} -q compile {} --json > {}", gpu() ? "" : "KILN_CUDA_ARCH=sm_90",
                     (d / "cache").string(), test::kiln_exe(), (d / "k.toml").string(), outp.string())},
        300);
    EXPECT_TRUE(r.ok()) << r.describe() << r.output;
    return nlohmann::json::parse(read_file(outp).value_or("{}"));
  };
  nlohmann::json with = compile("with", "[tuning]\nregisters_by = [\"R\"]\n");
  ASSERT_TRUE(with.contains("totals")) << with.dump();
  EXPECT_EQ(with["totals"]["configs"], 3) << with.dump(1);
  EXPECT_EQ(with["pruned_by_registers"], 1);
  for (const auto& c : with["configs"]) {
    EXPECT_FALSE(c["params"]["R"] == 128 && c["params"]["T"] == 1024) << "compiled: " << c.dump();
    if (c["params"]["R"] == 128) {
      EXPECT_GT(c["registers"].get<int>(), 64) << c.dump();
    }
  }
  nlohmann::json without = compile("without", "");
  EXPECT_EQ(without["totals"]["configs"], 4) << without.dump(1);
  EXPECT_EQ(without["pruned_by_registers"], 0);
}

// A bf16 buffer of a call's arguments, by name, as doubles (empty where the spec has none).
std::vector<double> read_bf16(const KernelSpec& s, DeviceArgs& args, const char* name) {
  std::vector<double> v;
  const int i = s.arg_index(name);
  if (i < 0) return v;
  std::vector<std::byte> b = args.read(static_cast<size_t>(i));
  v.resize(b.size() / 2);
  for (size_t j = 0; j < v.size(); ++j) {
    uint16_t h;
    std::memcpy(&h, b.data() + 2 * j, 2);
    v[j] = bf16_bits_to_f32(h);
  }
  return v;
}

// The M x K rows of x through an RMSNorm with the gain g (eps 1e-5), in double.
std::vector<double> rmsnorm_rows(const std::vector<double>& x, const std::vector<double>& g, int64_t M, int64_t K) {
  std::vector<double> a(x.size());
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += x[static_cast<size_t>(m * K + k)] * x[static_cast<size_t>(m * K + k)];
    const double r = 1 / std::sqrt(ss / static_cast<double>(K) + 1e-5);
    for (int64_t k = 0; k < K; ++k) a[static_cast<size_t>(m * K + k)] = x[static_cast<size_t>(m * K + k)] * r * g[static_cast<size_t>(k)];
  }
  return a;
}

// C = A . B^T in double, gated (silu(A . B^T) * (A . Bu^T)) where Bu is given, + R where given,
// and each output's tolerance: rel (|C| + the sum's magnitude / sqrt(K) + 1e-2), bf16 operands
// rounded on the way. Where A was rounded to bf16 from a normalised row (a_rounded: the RMSNorm
// forms), each sum of a gated product is off by about its magnitude / sqrt(K) times bf16's
// precision, multiplied by the other factor, so both terms count.
struct GemmReference {
  std::vector<double> want, tol;
};
GemmReference gemm_reference(const std::vector<double>& A, const std::vector<double>& B, const std::vector<double>& Bu,
                             const std::vector<double>& R, int64_t M, int64_t N, int64_t K, double rel, bool a_rounded) {
  GemmReference ref{std::vector<double>(static_cast<size_t>(M * N)), std::vector<double>(static_cast<size_t>(M * N))};
  const bool gated = !Bu.empty();
  const double sk = std::sqrt(static_cast<double>(K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double g = 0, u = 0, mag = 0, mag_u = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = A[static_cast<size_t>(m * K + k)], b = B[static_cast<size_t>(n * K + k)];
        g += a * b;
        mag += std::abs(a * b);
        if (gated) {
          u += a * Bu[static_cast<size_t>(n * K + k)];
          mag_u += std::abs(a * Bu[static_cast<size_t>(n * K + k)]);
        }
      }
      const double silu = g / (1 + std::exp(-g));
      double w = gated ? silu * u : g;
      if (!R.empty()) w += R[static_cast<size_t>(m * N + n)];
      const size_t i = static_cast<size_t>(m * N + n);
      ref.want[i] = w;
      ref.tol[i] = gated && a_rounded ? rel * (std::abs(w) + std::abs(silu) * mag_u / sk + std::abs(u) * mag / sk + 1e-2)
                                      : rel * (std::abs(w) + mag / sk + 1e-2);
    }
  return ref;
}

// The outputs of C (rows of N) outside the reference's tolerance; the first three are reported.
size_t count_outside(const std::vector<double>& C, const GemmReference& ref, int64_t N) {
  size_t bad = 0;
  for (size_t j = 0; j < C.size(); ++j)
    if (!(std::abs(C[j] - ref.want[j]) <= ref.tol[j]) && bad++ < 3)
      ADD_FAILURE() << "C[" << j / static_cast<size_t>(N) << ", " << j % static_cast<size_t>(N) << "] = " << C[j]
                    << ", want " << ref.want[j] << " (tol " << ref.tol[j] << ")";
  return bad;
}

// The GEMM handles' variants of several launches, forced, on the device,
// against a host reference at edge shapes: linear_bf16_nt's padded form (K
// not a multiple of 8), mlp_gate_up_bf16's and linear_residual_bf16_nt's
// unfused forms; the RMSNorm handles' fused form (the decode GEMM's rmsnorm members) and
// their unfused forms (the norm, then the GEMM). Then linear_bf16_nt chooses by itself at a
// misaligned K, and the RMSNorm handles choose by themselves.
TEST_F(CudaTest, TheGemmHandlesFormsOfSeveralLaunchesComputeTheirProblem) {
  NEEDS_GPU();
  struct Case {
    std::string spec;
    int variant;  // -1: benchmarked
    int64_t M, N, K;
  };
  const std::vector<Case> cases = {
      {"linear_bf16_nt", 3, 1, 7, 9},     {"linear_bf16_nt", 3, 7, 129, 127},  {"linear_bf16_nt", 3, 129, 8, 4100},
      {"linear_bf16_nt", 3, 9, 127, 1},   {"linear_bf16_nt", -1, 127, 129, 4100},
      {"mlp_gate_up_bf16", 2, 1, 7, 8},   {"mlp_gate_up_bf16", 2, 9, 129, 64}, {"mlp_gate_up_bf16", 2, 129, 127, 4104},
      {"linear_residual_bf16_nt", 2, 1, 9, 8}, {"linear_residual_bf16_nt", 2, 127, 129, 4104},
      {"rmsnorm_linear_bf16_nt", 0, 1, 7, 8},    {"rmsnorm_linear_bf16_nt", 0, 16, 129, 4104},
      {"rmsnorm_linear_bf16_nt", 0, 9, 127, 7},  {"rmsnorm_linear_bf16_nt", 1, 129, 127, 4104},
      {"rmsnorm_linear_bf16_nt", 3, 3, 33, 520}, {"rmsnorm_linear_bf16_nt", -1, 1, 4100, 4096},
      {"rmsnorm_mlp_gate_up_bf16", 0, 1, 7, 8},  {"rmsnorm_mlp_gate_up_bf16", 0, 16, 129, 4104},
      {"rmsnorm_mlp_gate_up_bf16", 3, 9, 127, 64}, {"rmsnorm_mlp_gate_up_bf16", 2, 7, 9, 520},
      {"rmsnorm_mlp_gate_up_bf16", -1, 1, 1100, 4096},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} variant {} at M={} N={} K={}", c.spec, c.variant, c.M, c.N, c.K));
    Options o = opts;
    if (c.variant >= 0) o.force_variant = c.variant;
    o.first_call = FirstCall::wait;
    Runtime rt(o);
    MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cuda/" + c.spec + ".toml");
    KernelSpec shape;
    shape.name = ms.name;
    shape.args = ms.args;
    std::vector<ScalarValue> scalars(ms.args.size());
    for (size_t i = 0; i < ms.args.size(); ++i) {
      if (ms.args[i].name == "M") scalars[i].i = c.M;
      if (ms.args[i].name == "N") scalars[i].i = c.N;
      if (ms.args[i].name == "K") scalars[i].i = c.K;
      if (ms.args[i].name == "eps") scalars[i].f = 1e-5;
    }
    Device& dev = rt.backend("cuda").device();
    DeviceArgs args(shape, scalars, dev);
    args.fill_random(static_cast<uint64_t>(c.M * 1000003 + c.N * 101 + c.K));
    MultiKernel k(rt, ms);
    k.launch(args.params());
    dev.sync(nullptr);
    MultiKernel::Pick p = k.pick(args.params());
    if (c.variant >= 0) {
      EXPECT_EQ(p.variant, static_cast<size_t>(c.variant));
    }
    auto host = [&](const char* name) { return read_bf16(shape, args, name); };
    std::vector<double> A = host("A");
    const std::vector<double> C = host("C");
    const bool normed = A.empty();
    if (normed) A = rmsnorm_rows(host("x"), host("g"), c.M, c.K);  // an RMSNorm handle: A is rmsnorm(x) * g
    const bool gated = c.spec == "mlp_gate_up_bf16" || c.spec == "rmsnorm_mlp_gate_up_bf16";
    ASSERT_EQ(C.size(), static_cast<size_t>(c.M * c.N));
    // (the unfused forms round G and U, or the product, once more; the RMSNorm handles the normalised A)
    const GemmReference ref = gemm_reference(A, host(gated ? "Bg" : "B"), host("Bu"), host("R"), c.M, c.N, c.K, 2e-2, normed);
    const size_t bad = count_outside(C, ref, c.N);
    EXPECT_EQ(bad, 0u);
  }
}

// Every config of a GEMM family member that no static rule prunes, compiled and loaded.
struct EveryConfig {
  std::vector<Config> configs;
  std::vector<std::shared_ptr<LoadedKernel>> loaded;
};
EveryConfig compile_every_config(Runtime& rt, const KernelSpec& s) {
  EveryConfig e;
  Backend& be = rt.backend("cuda");
  std::vector<BinaryFuture> bins;
  for (const auto& c : s.space.all())
    if (statically_pruned(s, c, be.limits()).empty()) {
      e.configs.push_back(c);
      bins.push_back(rt.compile_pool("cuda").submit(make_compile_request(s, c)));
    }
  for (auto& b : bins) e.loaded.push_back(rt.load(*b.get()));
  return e;
}

// A GEMM member's inputs at one shape on the device, read back as doubles by name.
struct GemmCall {
  const KernelSpec& s;
  int64_t M, N, K;
  DeviceArgs args;
  GemmCall(const KernelSpec& spec, int64_t m, int64_t n, int64_t k, Device& dev)
      : s(spec), M(m), N(n), K(k), args(spec, scalars(spec, m, n, k), dev) {
    args.fill_random(static_cast<uint64_t>(M * 31 + N * 7 + K));
  }
  static std::vector<ScalarValue> scalars(const KernelSpec& s, int64_t M, int64_t N, int64_t K) {
    std::vector<ScalarValue> v(s.args.size());
    for (size_t i = 0; i < s.args.size(); ++i) {
      if (s.args[i].name == "M") v[i].i = M;
      if (s.args[i].name == "N") v[i].i = N;
      if (s.args[i].name == "K") v[i].i = K;
      if (s.args[i].name == "eps") v[i].f = 1e-5;
    }
    return v;
  }
  // The bf16 buffer `name` (empty where the member has none).
  std::vector<double> host(const char* name) { return read_bf16(s, args, name); }
  // Launches each config that can run this shape, into a C first filled with junk, and
  // checks C against the reference; `what` names the member. Returns how many ran.
  // (ran, if given, gets the index of each config that ran)
  size_t check_every_config(const EveryConfig& e, Backend& be, const std::string& what, const GemmReference& ref,
                            std::vector<size_t>* ran_configs = nullptr) {
    std::vector<int64_t> slots(s.args.size());
    read_int_slots(s, args.params(), slots.data());
    const int c_arg = s.arg_index("C");
    size_t ran = 0;
    for (size_t ci = 0; ci < e.configs.size(); ++ci) {
      if (!Tuner::why_not(s, e.configs[ci], slots.data(), be.limits()).empty()) continue;
      SCOPED_TRACE(fmt::format("{} {} at M={} N={} K={}", what, e.configs[ci].str(), M, N, K));
      const std::vector<std::byte> junk(ref.want.size() * 2, std::byte{0x7f});  // not zeros: an unwritten output shows
      be.device().to_device(args.buffer(static_cast<size_t>(c_arg)), junk.data(), junk.size(), nullptr);
      e.loaded[ci]->launch(args.params(), LaunchPlan(s, e.configs[ci], be.limits()).eval(slots.data()), nullptr);
      be.device().sync(nullptr);
      EXPECT_EQ(count_outside(host("C"), ref, N), 0u);
      ++ran;
      if (ran_configs) ran_configs->push_back(ci);
    }
    return ran;
  }
};

// The TMA family (kernels/cuda/gemm_tma.toml): every config of each member that can run a
// shape, launched directly, against a float64 host reference, at edge shapes (M and N of
// 1, 7, 9, 127, 129, 4100; K of 8 and past 4096) and where the tiles outnumber the blocks, so a
// persistent block takes several tiles and its ring runs on from one tile into the next.
TEST_F(CudaTest, TheTmaFamilyComputesItsProblemsAtEdgeShapes) {
  NEEDS_GPU();
  struct Shape {
    int64_t M, N, K;
  };
  // (stream-K, SK = 1: 1100 x 2100 x 520 is more than a wave of tiles, all of them taken as
  // ranges of k-tiles, tiles in parts over two blocks; 2200 x 2100 x 520 more than two, the
  // first wave whole, then the ranges; 300 x 520 x 4104 under a wave, each tile in parts over
  // several blocks. MC = 2: M of 300 leaves a pair's second tile past M. The widths that are
  // not a multiple of 64, where they fill the waves better: 128 x 96 tiles at 300 x 3001 x 520,
  // with stream-K, under a wave, and the last tile 25 columns wide; 64 x 224, 128 x 160 and
  // 256 x 96 at 129 x 8452 x 136; 128 x 160 and 256 x 96 at 1100 x 2100)
  const std::vector<Shape> shapes = {{1, 7, 8},         {7, 129, 64},      {129, 9, 136},    {127, 4100, 72},
                                     {4100, 127, 16},   {1100, 2100, 24},  {1100, 2100, 520}, {2200, 2100, 520},
                                     {300, 520, 4104},  {300, 3001, 520},  {129, 8452, 136}};
  Runtime rt(opts);
  Backend& be = rt.backend("cuda");
  for (const std::string member : {"bf16_nt", "bf16_nt_residual", "bf16_nt_gated"}) {
    KernelSpec s = load_spec(test::kernels() + "/cuda/gemm_tma.toml:" + member);
    const bool gated = member == "bf16_nt_gated";
    const EveryConfig every = compile_every_config(rt, s);
    ASSERT_GE(every.configs.size(), 10u) << member;
    std::vector<size_t> ran;
    for (const Shape& sh : shapes) {
      GemmCall call(s, sh.M, sh.N, sh.K, be.device());
      call.check_every_config(every, be, member,
                              gemm_reference(call.host("A"), call.host(gated ? "Bg" : "B"), call.host("Bu"),
                                             call.host("R"), sh.M, sh.N, sh.K, 1e-2, false),
                              &ran);
    }
    // The clusters and stream-K ran (their constraints did not pass over them all).
    auto ran_with = [&](const char* param, int64_t value) {
      return std::count_if(ran.begin(), ran.end(), [&](size_t i) { return *every.configs[i].get(param) == value; });
    };
    EXPECT_GE(ran_with("MC", 2), 4) << member;
    EXPECT_GE(ran_with("SK", 1), 4) << member;
    EXPECT_GE(std::count_if(ran.begin(), ran.end(), [&](size_t i) { return *every.configs[i].get("BN") % 64 != 0; }), 4)
        << member;
  }
}

// Stream-K's workspace (the TMA family's SK = 1): kiln keeps one for each stream (each thread's,
// on the default streams), made on the first launch there, here first one being captured into
// a graph, which then replays with it; then direct launches; then two threads at once, each
// on its default stream, held until both have queued five launches, each into a C of its own
// (one workspace for both would let a launch read the other's parts, or wait for a flag the
// other reset: a wrong C or a hang). Every C is first filled with junk and checked against a
// float64 reference; at both shapes tiles are in parts over two blocks.
TEST_F(CudaTest, AStreamKWorkspaceServesGraphsDirectLaunchesAndThreadsAtOnce) {
  NEEDS_GPU();
  Runtime rt(opts);
  Backend& be = rt.backend("cuda");
  Device& dev = be.device();
  const KernelSpec s = load_spec(test::kernels() + "/cuda/gemm_tma.toml:bf16_nt");
  const int c_arg = s.arg_index("C");
  for (const int mc : {1, 2}) {
    std::optional<Config> cfg;
    for (const auto& c : s.space.all())
      if (*c.get("BM") == 128 && *c.get("BN") == 128 && *c.get("STAGES") == 4 && *c.get("SPLIT") == 1 &&
          *c.get("MINB") == 1 && *c.get("PINGPONG") == 0 && *c.get("MC") == mc && *c.get("SK") == 1)
        cfg = c;
    ASSERT_TRUE(cfg.has_value());
    SCOPED_TRACE(cfg->str());
    std::shared_ptr<LoadedKernel> k = rt.load(*rt.compile_pool("cuda").submit(make_compile_request(s, *cfg)).get());
    GemmCall a(s, 1100, 2100, 520, dev), b(s, 1000, 2100, 776, dev);
    struct Run {
      GemmCall& call;
      LaunchDims dims;
      GemmReference ref;
    };
    auto run_of = [&](GemmCall& c) {
      std::vector<int64_t> slots(s.args.size());
      read_int_slots(s, c.args.params(), slots.data());
      EXPECT_EQ(Tuner::why_not(s, *cfg, slots.data(), be.limits()), "");
      return Run{c, LaunchPlan(s, *cfg, be.limits()).eval(slots.data()),
                 gemm_reference(c.host("A"), c.host("B"), {}, {}, c.M, c.N, c.K, 1e-2, false)};
    };
    Run ra = run_of(a), rb = run_of(b);
    EXPECT_GT(ra.dims.workspace, 0);
    auto junk = [&](Run& r) {
      const std::vector<std::byte> j(r.ref.want.size() * 2, std::byte{0x7f});
      dev.to_device(r.call.args.buffer(static_cast<size_t>(c_arg)), j.data(), j.size(), nullptr);
      dev.sync(nullptr);
    };
    auto check = [&](Run& r, const char* what) {
      SCOPED_TRACE(what);
      EXPECT_EQ(count_outside(r.call.host("C"), r.ref, r.call.N), 0u);
    };
    // Captured before any launch of it on this thread: its workspace is made inside the capture.
    std::unique_ptr<Graph> g = dev.capture([&](Stream st) { k->launch(ra.call.args.params(), ra.dims, st); });
    ASSERT_TRUE(g);
    for (int i = 0; i < 3; ++i) {
      junk(ra);
      g->launch(nullptr);
      dev.sync(nullptr);
      check(ra, "a graph's replay");
    }
    junk(ra);
    k->launch(ra.call.args.params(), ra.dims, nullptr);
    dev.sync(nullptr);
    check(ra, "a direct launch");
    // Two threads at once.
    std::atomic<int> queued{0};
    auto loop = [&](Run& r, std::vector<void*>& cs) {
      dev.bind();
      void* const* p = r.call.args.params();
      std::vector<void*> params(p, p + s.args.size());
      const uint64_t held = dev.hold_stream(nullptr, 10000);
      for (void*& c : cs) {
        params[static_cast<size_t>(c_arg)] = &c;
        k->launch(params.data(), r.dims, nullptr);
      }
      ++queued;
      while (queued.load() < 2) std::this_thread::yield();
      dev.release_stream(held);
      dev.sync(nullptr);
    };
    auto outputs = [&](Run& r) {
      std::vector<void*> cs(5);
      const std::vector<std::byte> j(r.ref.want.size() * 2, std::byte{0x7f});
      for (void*& c : cs) {
        c = dev.alloc(j.size());
        dev.to_device(c, j.data(), j.size(), nullptr);
      }
      dev.sync(nullptr);
      return cs;
    };
    std::vector<void*> ca = outputs(ra), cb = outputs(rb);
    std::thread t1(loop, std::ref(ra), std::ref(ca)), t2(loop, std::ref(rb), std::ref(cb));
    t1.join();
    t2.join();
    for (auto [r, cs] : {std::pair<Run*, std::vector<void*>*>{&ra, &ca}, {&rb, &cb}})
      for (size_t i = 0; i < cs->size(); ++i) {
        SCOPED_TRACE(fmt::format("thread {}, launch {}", r == &ra ? 1 : 2, i));
        std::vector<uint16_t> h(r->ref.want.size());
        dev.to_host(h.data(), (*cs)[i], h.size() * 2, nullptr);
        dev.sync(nullptr);
        std::vector<double> c(h.size());
        for (size_t e = 0; e < h.size(); ++e) c[e] = bf16_bits_to_f32(h[e]);
        EXPECT_EQ(count_outside(c, r->ref, r->call.N), 0u);
        dev.free((*cs)[i]);
      }
  }
}

// The decode GEMM's RMSNorm members (kernels/cuda/gemm_decode.toml: bf16_nt_rmsnorm and
// bf16_nt_rmsnorm_gated), and its gated, residual and plain members beside them: every config that can run a
// shape, launched directly, against a float64 host reference of the norm then the product, at
// edge shapes: M of 1, 7, 8, 9 and 16 (one and two token tiles), N of 2 to 130, odd (the
// any-shape configs, VEC = 1, alone) and even (the 16-byte ones too), K of 1 and 7 (the
// any-shape path), 8, 520, 4096 and 4104 (K split over a cluster of up to 8 blocks, each adding
// its slice's squares), rows of very different scale (the norm must use each row's own).
// KILN_TEST_DECODE_MEMBERS=a,b checks those members only.
TEST_F(CudaTest, TheDecodeFamilysRmsNormMembersComputeTheirProblemAtEdgeShapes) {
  NEEDS_GPU();
  struct Shape {
    int64_t M, N, K;
  };
  const std::vector<Shape> shapes = {{1, 7, 8},      {7, 129, 4104}, {9, 9, 7},     {16, 129, 520}, {1, 33, 1},
                                     {16, 7, 4104}, {1, 130, 4104}, {8, 64, 4096}, {16, 2, 520}};
  Runtime rt(opts);
  Backend& be = rt.backend("cuda");
  // (set and empty, it checks every member, as unset does; a list that names none of them fails)
  const char* env = std::getenv("KILN_TEST_DECODE_MEMBERS");
  const std::string only = env ? env : "";
  size_t members = 0;
  for (const std::string member :
       {"bf16_nt_rmsnorm", "bf16_nt_rmsnorm_gated", "bf16_nt_gated", "bf16_nt_residual", "bf16_nt"}) {
    if (!only.empty() && ("," + only + ",").find("," + member + ",") == std::string::npos) continue;
    ++members;
    KernelSpec s = load_spec(test::kernels() + "/cuda/gemm_decode.toml:" + member);
    const bool gated = member.ends_with("gated"), norm = member.find("rmsnorm") != std::string::npos;
    const EveryConfig every = compile_every_config(rt, s);
    ASSERT_GE(every.configs.size(), 10u) << member;
    for (const Shape& sh : shapes) {
      GemmCall call(s, sh.M, sh.N, sh.K, be.device());
      const int a_arg = s.arg_index("A");
      // Row m of A scaled by 4^(m % 5 - 2), so the rows' norms differ by up to 256 times, and
      // its last eighth of K by 8 more, so most of a row's squares are in the last warps' and
      // the last cluster block's slice: a scale made of a part of a row's squares is far off.
      {
        std::vector<std::byte> b = call.args.read(static_cast<size_t>(a_arg));
        for (size_t j = 0; j < b.size() / 2; ++j) {
          uint16_t h;
          std::memcpy(&h, b.data() + 2 * j, 2);
          const int64_t row = static_cast<int64_t>(j) / sh.K, col = static_cast<int64_t>(j) % sh.K;
          const int tail = col >= sh.K - sh.K / 8 && sh.K >= 8 ? 3 : 0;
          const float v = bf16_bits_to_f32(h) * std::ldexp(1.f, 2 * (static_cast<int>(row % 5) - 2) + tail);
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          h = static_cast<uint16_t>(bits >> 16);  // exact: a power-of-two scale of a bf16 value
          std::memcpy(b.data() + 2 * j, &h, 2);
        }
        be.device().to_device(call.args.buffer(static_cast<size_t>(a_arg)), b.data(), b.size(), nullptr);
      }
      const std::vector<double> X = call.host("A");
      // (the kernel rounds the normalised A to bf16 before the product, as an RMSNorm kernel's output is)
      const GemmReference ref = gemm_reference(norm ? rmsnorm_rows(X, call.host("g"), sh.M, sh.K) : X,
                                               call.host(gated ? "Bg" : "B"), call.host("Bu"), call.host("R"), sh.M, sh.N, sh.K, 2e-2,
                                               norm);
      const size_t ran = call.check_every_config(every, be, member, ref);
      EXPECT_GT(ran, 0u) << member << " at M=" << sh.M << " N=" << sh.N << " K=" << sh.K;
    }
  }
  EXPECT_GT(members, 0u) << "KILN_TEST_DECODE_MEMBERS=" << only << " names none of the members this test checks";
}

// The kernel that fills inputs in a GPU's memory (kiln run, kiln pack, the
// model's logits check) compiles for the H100 without a GPU, and on the GPU it
// makes the host generator's values bit for bit: every dtype, plain, scaled
// (by three scales) and constant, at sizes on both sides of its block (256),
// of a thread's run of elements (16 bytes) and of its grid stride, into a
// buffer aligned to 16 bytes and one that is not (a fill from its second
// element), with a seed whose counter wraps. (Indices past 2^31 are checked by
// bench/gpu/model_logits.sh: PyTorch remakes the 16 GB model's samples.)
TEST_F(CudaTest, TheDeviceFillKernelCompilesAndMakesTheHostGeneratorsValues) {
  if (nvrtc_missing()) return;
  Runtime rt(opts);
  std::shared_ptr<const Binary> b;
  ASSERT_NO_THROW(b = rt.compile_pool("cuda").submit(cuda_fill_request()).get());
  EXPECT_GT(b->bytes.size(), 100u);
  EXPECT_FALSE(b->meta.symbol.empty());
  NEEDS_GPU();
  InputFiller filler(rt, "cuda");
  EXPECT_TRUE(filler.on_device());
  EXPECT_EQ(filler.binary(), nullptr);  // compiled at the first device fill
  Device& dev = rt.device("cuda");
  const int64_t stride = rt.backend("cuda").limits().multiprocessors * 8 * 256;
  for (DType t : kAllDTypes)
    for (int mode = 0; mode < 5; ++mode) {  // 1, 3, 4: scaled by 0.02, 0.3, 1e-3
      const double scale = mode == 1 ? 0.02 : mode == 3 ? 0.3 : mode == 4 ? 1e-3 : 1;
      const int64_t run = 16 / static_cast<int64_t>(dtype_size(t));  // a thread's elements at a time
      for (int64_t n : {int64_t{1}, run - 1, run + 1, int64_t{255}, int64_t{257}, stride + 3, run * stride + 5,
                        3 * stride + 1000})
        for (size_t skip : {size_t{0}, size_t{1}}) {  // from the buffer's start (aligned), or its second element
          if (n < 1) continue;
          ProgramTensor x{"x", t, {}, false, scale, mode == 2 ? std::optional<double>(-3.0) : std::nullopt};
          const size_t bytes = static_cast<size_t>(n) * dtype_size(t), off = skip * dtype_size(t);
          DeviceBuffer buf(dev, bytes + off);
          const uint64_t seed = 0xfffffffffffff000ULL + static_cast<uint64_t>(n);  // wraps as it counts
          filler.fill(x, static_cast<std::byte*>(buf.get()) + off, bytes, seed);
          std::vector<std::byte> got(bytes);
          dev.to_host(got.data(), static_cast<std::byte*>(buf.get()) + off, bytes, nullptr);
          dev.sync(nullptr);
          const std::vector<std::byte> want = filled_input(x, bytes, seed);
          size_t first_bad = bytes;
          for (size_t i = 0; i < bytes && first_bad == bytes; ++i)
            if (got[i] != want[i]) first_bad = i;
          EXPECT_EQ(first_bad, bytes) << dtype_name(t) << " mode " << mode << " n " << n << " from element " << skip
                                      << ": element " << first_bad / dtype_size(t) << " differs";
        }
    }
  // What kiln pack ships for an application that fills with it: the binary compiled above.
  ASSERT_NE(filler.binary(), nullptr);
  EXPECT_EQ(filler.binary()->key, b->key);
}
