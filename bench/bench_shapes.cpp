// Memory under dynamic shapes: drives distinct shapes through one
// SizeHintMultiKernel handle and prints the process's peak resident set
// (VmHWM) as it goes. It must stay flat once the handle has warmed up.
// Run: build/bench/kiln_bench_shapes [shapes, default 100000]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "core/fsutil.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;

namespace {
long status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::string(field).size() + 1);
  return -1;
}
}  // namespace

int main(int argc, char** argv) {
  long shapes = argc > 1 ? std::atol(argv[1]) : 100000;
  TempDir dir("kiln-bench");
  Options opts = Options::from_env();
  opts.cache_dir = dir.path() / "cache";
  opts.tune_in_process = true;
  opts.bench_budget_ms = 1;
  opts.quiet = true;
  Runtime rt(opts);
  SizeHintMultiKernel k(rt, load_spec(bench_kernels_dir() + "/small.toml"));
  std::vector<float> buf(64, 0.f);
  float* p = buf.data();
  int64_t n = 1;
  void* params[] = {&p, &n};
  k.launch(params);
  std::printf("%10s %14s %14s\n", "shapes", "VmHWM MiB", "VmRSS MiB");
  long next = 1;
  for (long s = 1; s <= shapes; ++s) {
    n = s;  // a distinct shape key on every call
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n)), p = buf.data();
    k.launch(params);
    if (s == next || s == shapes) {
      std::printf("%10ld %14.1f %14.1f\n", s, status_kib("VmHWM:") / 1024.0, status_kib("VmRSS:") / 1024.0);
      std::fflush(stdout);
      next *= 4;
    }
  }
  return 0;
}
