// What a GPU launch through kiln costs on the host, against a raw
// cuLaunchKernel of the very same loaded function, in one process:
//   raw cuLaunchKernel   the CUkernel kiln loaded, launched by this program
//   LoadedKernel         kiln's loaded kernel, launch dims given
//   Kernel               shape key → memoised choice → launch dims → launch
//   SizeHint             shape key → memoised nearest-hint variant → launch
//   MultiKernel          shape key → memoised variant → mapped args → launch
// Each path launches an empty kernel in batches of 256 on one stream; only
// the launch loop is timed (the stream is drained between batches, untimed),
// so the figure is host time per call. The paths take turns, one batch each
// per round, so the machine's drift falls on all of them alike; the median
// over rounds is reported.
// Run: build/bench/kiln_bench_cuda_dispatch [batches, default 400]
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "core/fsutil.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/kernel.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                         void**);

struct Path {
  const char* name;
  std::function<void()> launch;
  std::vector<double> ns;
};

void measure(Device& dev, std::vector<Path>& paths, int rounds) {
  constexpr int kBatch = 256;
  for (auto& p : paths)
    for (int i = 0; i < 2000; ++i) p.launch();  // warm
  dev.sync(nullptr);
  for (int r = 0; r < rounds; ++r)
    for (auto& p : paths) {
      auto t0 = Clock::now();
      for (int i = 0; i < kBatch; ++i) p.launch();
      auto t1 = Clock::now();
      p.ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kBatch);
      dev.sync(nullptr);
    }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int batches = argc > 1 ? std::atoi(argv[1]) : 400;
  TempDir dir("kiln-bench");
  Options opts = Options::from_env();
  opts.cache_dir = dir.path() / "cache";
  opts.bench_budget_ms = 2;
  opts.quiet = true;
  Runtime rt(opts);
  Backend& cuda = rt.backend("cuda");
  if (std::string why = cuda.unavailable_reason(); !why.empty()) {
    std::printf("no GPU here (%s): nothing to measure\n", why.c_str());
    return 0;
  }
  Device& dev = cuda.device();
  std::string kdir = bench_kernels_dir();
  KernelSpec spec = load_spec(kdir + "/empty_cuda.toml");
  void* x = dev.alloc(4096 * 4);
  int64_t n = 16;
  void* params[] = {&x, &n};

  Kernel kernel(rt, spec);
  kernel.launch(params);  // tunes, memoises
  SizeHintMultiKernel hinted(rt, spec);
  hinted.launch(params);
  MultiKernel multi(rt, load_multi_spec(kdir + "/empty_cuda_multi.toml"));
  multi.launch(params);
  const Choice& c = kernel.choice(params);
  std::shared_ptr<LoadedKernel> loaded = c.kernel;
  LaunchDims dims = LaunchPlan(spec, c.config, cuda.limits()).eval(std::vector<int64_t>{0, n}.data());
  dev.sync(nullptr);

  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto raw = lib ? reinterpret_cast<LaunchFn>(::dlsym(lib, "cuLaunchKernel")) : nullptr;
  if (!raw || !loaded->native_handle()) {
    std::printf("cannot launch raw: %s\n", lib ? "no handle" : ::dlerror());
    return 1;
  }
  void* fn = loaded->native_handle();
  void* stream = reinterpret_cast<void*>(0x2);  // the per-thread default stream, as kiln uses by default

  std::vector<Path> paths;
  paths.push_back({"raw cuLaunchKernel", [&] { raw(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr); }, {}});
  paths.push_back({"LoadedKernel", [&] { loaded->launch(params, dims, nullptr); }, {}});
  paths.push_back({"Kernel", [&] { kernel.launch(params); }, {}});
  paths.push_back({"Kernel typed call", [&] { kernel(x, n); }, {}});
  paths.push_back({"SizeHintMultiKernel", [&] { hinted.launch(params); }, {}});
  paths.push_back({"MultiKernel", [&] { multi.launch(params); }, {}});
  measure(dev, paths, batches);
  double base = median(paths[0].ns);
  std::printf("%s, host time per launch of an empty kernel (median of %d interleaved batches of 256)\n",
              dev.info().name.c_str(), batches);
  std::printf("%-28s %10s %14s\n", "call path", "ns/call", "added vs raw");
  for (const auto& p : paths) std::printf("%-28s %10.0f %14.0f\n", p.name, median(p.ns), median(p.ns) - base);
  dev.free(x);
  return 0;
}
