// Worker benchmarks:
//   1. the round trip of an empty request (ping) through a kiln-worker,
//      against a raw 4-byte ping-pong over a socketpair with a child process;
//   2. compiling the built-in matmul's config space (no cache) through
//      worker processes against compiler threads.
// Run: build/bench/kiln_bench_workers [rounds]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compile/compile_pool.hpp"
#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/runtime.hpp"
#include "worker/worker_pool.hpp"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Stats {
  double median, p10, p90;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() / 10], v[v.size() * 9 / 10]};
}

// The raw peer: echoes 4-byte messages on fd 3 until it closes.
int echo_main() {
  char b[4];
  for (;;) {
    size_t got = 0;
    while (got < 4) {
      ssize_t r = ::read(3, b + got, 4 - got);
      if (r <= 0) return 0;
      got += static_cast<size_t>(r);
    }
    if (::write(3, b, 4) != 4) return 0;
  }
}

double compile_space(CompileMode mode, const KernelSpec& spec) {
  TempDir d("kiln-bench");
  Options o = Options::from_env();
  o.cache_dir = d.path();
  o.no_cache = true;
  o.compile_mode = mode;
  o.compile_threads = 2;
  o.workers = 2;
  Runtime rt(o);
  if (mode == CompileMode::subprocess) rt.worker_pool()->warm();
  auto t0 = Clock::now();
  std::vector<BinaryFuture> fs;
  for (const auto& c : spec.space.all()) fs.push_back(rt.compile_pool("cpu").submit(make_compile_request(spec, c)));
  for (auto& f : fs) f.get();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--echo") == 0) return echo_main();
  int rounds = argc > 1 ? std::atoi(argv[1]) : 5000;

  // 1. Round trips.
  WorkerPool pool(WorkerPool::find_exe({}), 1);
  pool.warm();
  std::vector<double> kiln_us, raw_us;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    pool.call({{{"op", "ping"}}, -1, 10, "ping", ""});
    kiln_us.push_back(us(Clock::now() - t0));
  }
  std::string self = std::string(self_exe_dir()) + "/kiln_bench_workers";
  SpawnedChild echo = spawn_with_socket({self, "--echo"});
  char b[4] = {1, 2, 3, 4};
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    if (::write(echo.sock.get(), b, 4) != 4) return 1;
    size_t got = 0;
    while (got < 4) got += static_cast<size_t>(::read(echo.sock.get(), b + got, 4 - got));
    raw_us.push_back(us(Clock::now() - t0));
  }
  echo.sock.reset();
  reap(echo.pid);
  Stats k = stats(kiln_us), r = stats(raw_us);
  std::printf("round trip of an empty request, %d rounds (us)\n", rounds);
  std::printf("  %-34s %8s %8s %8s\n", "", "median", "p10", "p90");
  std::printf("  %-34s %8.1f %8.1f %8.1f\n", "kiln worker ping (CBOR frame)", k.median, k.p10, k.p90);
  std::printf("  %-34s %8.1f %8.1f %8.1f\n", "raw socketpair 4-byte ping-pong", r.median, r.p10, r.p90);
  std::printf("  kiln / raw (median): %.2fx\n\n", k.median / r.median);

  // 2. Compile throughput.
  const char* src_dir = std::getenv("KILN_KERNELS_DIR");
  std::string spec_path = std::string(src_dir ? src_dir : KILN_SOURCE_DIR "/kernels") + "/cpu/matmul.toml";
  KernelSpec spec = load_spec(spec_path);
  double threads = compile_space(CompileMode::threads, spec);
  double workers = compile_space(CompileMode::subprocess, spec);
  size_t n = spec.space.size();
  std::printf("compiling matmul's %zu configs, no cache, 2 at a time\n", n);
  std::printf("  %-34s %8.2fs %8.1f configs/s\n", "compiler threads", threads, n / threads);
  std::printf("  %-34s %8.2fs %8.1f configs/s\n", "worker processes", workers, n / workers);
  std::printf("  workers / threads (time): %.2fx\n", workers / threads);
  return 0;
}
