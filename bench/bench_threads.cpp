// Grid start-up and engine threads:
//   - launches of a grid of 1, 2 and 64 program instances of a small cpu
//     kernel, one calling thread: what starting a grid costs;
//   - the same launches from 1 and from 2 calling threads at once (each with
//     its own buffer): total launches per second, and 2 threads / 1 thread.
// Run: build/bench/kiln_bench_threads [seconds per row, default 1]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "core/fsutil.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

// Launches per second over `secs`, from `threads` threads each calling `k`
// on its own buffer of n floats.
double rate(Kernel& k, int threads, int64_t n, double secs) {
  std::atomic<bool> go{false}, stop{false};
  std::vector<long> counts(threads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      std::vector<float> buf(static_cast<size_t>(n), 0.f);
      float* p = buf.data();
      int64_t nn = n;
      void* params[] = {&p, &nn};
      k.launch(params);  // first call decides
      while (!go.load()) std::this_thread::yield();
      long c = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        k.launch(params);
        ++c;
      }
      counts[t] = c;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = Clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  stop = true;
  for (auto& t : ts) t.join();
  double el = std::chrono::duration<double>(Clock::now() - t0).count();
  long total = 0;
  for (long c : counts) total += c;
  return static_cast<double>(total) / el;
}

}  // namespace

int main(int argc, char** argv) {
  double secs = argc > 1 ? std::atof(argv[1]) : 1.0;
  TempDir dir("kiln-bench");
  Options opts = Options::from_env();
  opts.cache_dir = dir.path() / "cache";
  opts.tune_in_process = true;
  opts.bench_budget_ms = 1;
  opts.quiet = true;
  Runtime rt(opts);
  Kernel k(rt, load_spec(bench_kernels_dir() + "/small.toml"));
  std::printf("%-10s %14s %16s %16s %8s\n", "grid", "us/launch", "1 thread /s", "2 threads /s", "2 / 1");
  for (int64_t programs : {1, 2, 64}) {
    int64_t n = programs * 64;
    double one = rate(k, 1, n, secs);
    double two = rate(k, 2, n, secs);
    std::printf("%-10lld %14.2f %16.0f %16.0f %7.2fx\n", static_cast<long long>(programs), 1e6 / one, one, two,
                two / one);
  }
  return 0;
}
