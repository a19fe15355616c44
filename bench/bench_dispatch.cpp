// What a call through kiln costs, with the choice memoised, against calling
// the kernel's entry directly: a grid-of-one cpu kernel that does nothing.
//   raw entry        the compiled kiln_entry, dlopen'd by this program itself
//   LoadedKernel     kiln's loaded kernel, grid given
//   Kernel           shape key → memoised config → grid → launch
//   SizeHint         shape key → memoised nearest-hint variant → grid → launch
//   MultiKernel      shape key → memoised variant → mapped args → grid → launch
//   KernelBounded, MultiKernelBounded: the same, the key's n in buckets of powers of two and
//                    a bound n <= cap checked at each call (what a bucket's per-call check costs)
// Run: build/bench/kiln_bench_dispatch
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdio>
#include <map>

#include "compile/compile_pool.hpp"
#include "bench_util.hpp"
#include "core/fsutil.hpp"
#include "kiln/kernel.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;

namespace {

using EntryFn = void (*)(void* const*, const int64_t*, int64_t, int64_t);

struct Fixture {
  TempDir dir{"kiln-bench"};
  Options opts;
  std::unique_ptr<Runtime> rt;
  KernelSpec spec;
  std::unique_ptr<Kernel> kernel;
  std::unique_ptr<SizeHintMultiKernel> hinted;
  std::unique_ptr<MultiKernel> multi;
  // The same behind a bound (n <= cap) and a key in buckets of n: the bound checked at each call.
  std::unique_ptr<Kernel> bounded;
  std::unique_ptr<MultiKernel> multi_bounded;
  int64_t cap = 16;  // x holds 16 floats
  void* bounded_params[3] = {&px, &n, &cap};
  std::shared_ptr<LoadedKernel> loaded;
  void* handle = nullptr;
  EntryFn raw = nullptr;
  float x[16] = {};
  float* px = x;
  int64_t n = 16;
  void* params[2] = {&px, &n};

  Fixture() {
    opts = Options::from_env();
    opts.cache_dir = dir.path() / "cache";
    opts.tune_in_process = true;
    opts.bench_budget_ms = 1;
    opts.quiet = true;
    rt = std::make_unique<Runtime>(opts);
    std::string kdir = bench_kernels_dir();
    spec = load_spec(kdir + "/empty.toml");
    kernel = std::make_unique<Kernel>(*rt, spec);
    kernel->launch(params);  // tunes, memoises
    hinted = std::make_unique<SizeHintMultiKernel>(*rt, spec);
    hinted->launch(params);
    multi = std::make_unique<MultiKernel>(*rt, load_multi_spec(kdir + "/empty_multi.toml"));
    multi->launch(params);
    bounded = std::make_unique<Kernel>(*rt, load_spec(kdir + "/empty_bounded.toml"));
    bounded->launch(bounded_params);
    multi_bounded = std::make_unique<MultiKernel>(*rt, load_multi_spec(kdir + "/empty_multi_bounded.toml"));
    multi_bounded->launch(bounded_params);
    auto bin = rt->compile_pool("cpu").submit(make_compile_request(spec, kernel->choice(params).config)).get();
    loaded = rt->load(*bin);
    std::string so = (dir.path() / "raw.so").string();
    write_file_atomic(so, std::string_view(reinterpret_cast<const char*>(bin->bytes.data()), bin->bytes.size()));
    handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    raw = handle ? reinterpret_cast<EntryFn>(dlsym(handle, "kiln_entry")) : nullptr;
    if (!raw) std::fprintf(stderr, "cannot dlopen the raw entry: %s\n", dlerror());
  }
  ~Fixture() {
    if (handle) dlclose(handle);
  }
};

Fixture& fx() {
  static Fixture f;
  return f;
}

void BM_RawEntry(benchmark::State& st) {
  Fixture& f = fx();
  const int64_t grid[3] = {1, 1, 1};
  for (auto _ : st) {
    f.raw(f.params, grid, 0, 1);
    benchmark::ClobberMemory();
  }
}
void BM_LoadedKernel(benchmark::State& st) {
  Fixture& f = fx();
  LaunchDims d;
  for (auto _ : st) {
    f.loaded->launch(f.params, d, nullptr);
    benchmark::ClobberMemory();
  }
}
// Empty program instances over kiln's thread pool: what starting a grid costs.
void BM_Grid2(benchmark::State& st) {
  Fixture& f = fx();
  LaunchDims d;
  d.grid.x = 2;
  for (auto _ : st) {
    f.loaded->launch(f.params, d, nullptr);
    benchmark::ClobberMemory();
  }
}
void BM_Grid64(benchmark::State& st) {
  Fixture& f = fx();
  LaunchDims d;
  d.grid.x = 64;
  for (auto _ : st) {
    f.loaded->launch(f.params, d, nullptr);
    benchmark::ClobberMemory();
  }
}
void BM_Kernel(benchmark::State& st) {
  Fixture& f = fx();
  for (auto _ : st) {
    f.kernel->launch(f.params);
    benchmark::ClobberMemory();
  }
}
void BM_KernelTypedCall(benchmark::State& st) {
  Fixture& f = fx();
  for (auto _ : st) {
    (*f.kernel)(f.px, f.n);
    benchmark::ClobberMemory();
  }
}
void BM_SizeHint(benchmark::State& st) {
  Fixture& f = fx();
  for (auto _ : st) {
    f.hinted->launch(f.params);
    benchmark::ClobberMemory();
  }
}
void BM_MultiKernel(benchmark::State& st) {
  Fixture& f = fx();
  for (auto _ : st) {
    f.multi->launch(f.params);
    benchmark::ClobberMemory();
  }
}

void BM_KernelBounded(benchmark::State& st) {
  Fixture& f = fx();
  for (auto _ : st) {
    f.bounded->launch(f.bounded_params);
    benchmark::ClobberMemory();
  }
}
void BM_MultiKernelBounded(benchmark::State& st) {
  Fixture& f = fx();
  for (auto _ : st) {
    f.multi_bounded->launch(f.bounded_params);
    benchmark::ClobberMemory();
  }
}

BENCHMARK(BM_RawEntry);
BENCHMARK(BM_LoadedKernel);
BENCHMARK(BM_Kernel);
BENCHMARK(BM_KernelTypedCall);
BENCHMARK(BM_SizeHint);
BENCHMARK(BM_MultiKernel);
BENCHMARK(BM_KernelBounded);
BENCHMARK(BM_MultiKernelBounded);
BENCHMARK(BM_Grid2);
BENCHMARK(BM_Grid64);

// Prints, after the usual table, what each kiln path adds over the raw entry.
class Summary : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs)
      if (r.run_type == Run::RT_Iteration) ns_[r.benchmark_name()] = r.GetAdjustedRealTime();
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    double raw = ns_["BM_RawEntry"];
    std::printf("\n%-22s %10s %14s %10s\n", "call path", "ns/call", "added vs raw", "ratio");
    for (const char* k : {"BM_RawEntry", "BM_LoadedKernel", "BM_Kernel", "BM_KernelTypedCall", "BM_SizeHint",
                          "BM_MultiKernel", "BM_KernelBounded", "BM_MultiKernelBounded"})
      std::printf("%-22s %10.1f %14.1f %9.2fx\n", k + 3, ns_[k], ns_[k] - raw, ns_[k] / raw);
    std::printf("\n%-22s %10s\n", "empty grid", "ns/launch");
    for (const char* k : {"BM_Grid2", "BM_Grid64"}) std::printf("%-22s %10.1f\n", k + 3, ns_[k]);
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  fx();
  Summary s;
  benchmark::RunSpecifiedBenchmarks(&s);
  benchmark::Shutdown();
  return 0;
}
