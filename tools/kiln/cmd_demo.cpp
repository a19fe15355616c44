// kiln demo: the main job. Compiles the built-in matmul's whole config space
// and runs a config on random inputs, checking it against a plain loop.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "kiln/args.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace {

void run_demo(Globals& g) {
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  Runtime rt(opts);
  KernelSpec spec = load_spec(kernels_dir() / "cpu" / "matmul.toml");
  CompilePool& pool = rt.compile_pool("cpu");
  std::vector<Config> configs = spec.space.all();
  std::printf("kiln demo: %s, %zu configs, %d compile threads\n", spec.name.c_str(), configs.size(), pool.threads());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<BinaryFuture> futures;
  for (const auto& c : configs) futures.push_back(pool.submit(make_compile_request(spec, c)));
  wait_all(futures, "compiling", !opts.quiet && stderr_is_terminal());
  auto counters = pool.counters();
  std::printf("compiled %zu, from cache %zu, in %s\n", counters.compiled, counters.cache_hits,
              seconds_text(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()).c_str());

  const int64_t M = 200, N = 136, K = 72;
  Config cfg = spec.tuning.default_config.value_or(configs.front());
  auto bin = futures[*spec.space.index_of(cfg)].get();
  auto kernel = rt.load(*bin);
  HostArgs args(spec, parse_scalars(spec, {{"M", std::to_string(M)}, {"N", std::to_string(N)}, {"K", std::to_string(K)}}));
  args.fill_random(1);
  std::vector<int64_t> slots(spec.args.size());
  read_int_slots(spec, args.params(), slots.data());
  Grid grid = GridPlan(spec, cfg).eval(slots.data());
  kernel->launch(args.params(), grid);

  auto* A = reinterpret_cast<const float*>(args.buffer(0).data());
  auto* B = reinterpret_cast<const float*>(args.buffer(1).data());
  auto* C = reinterpret_cast<const float*>(args.buffer(2).data());
  double max_err = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += static_cast<double>(A[i * K + k]) * B[k * N + j];
      max_err = std::max(max_err, std::abs(ref - C[i * N + j]));
    }
  bool ok = max_err < 1e-3;
  std::printf("ran %s at M=%lld N=%lld K=%lld on a %lldx%lld grid: max error vs a plain loop %.2e: %s\n",
              cfg.str().c_str(), static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
              static_cast<long long>(grid.x), static_cast<long long>(grid.y), max_err, ok ? "OK" : "WRONG");
  if (!ok) g.exit_code = 1;
}

}  // namespace

void add_demo(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("demo", "Compile the built-in matmul and run it, checked against a plain loop");
  cmd->callback([&g] { run_demo(g); });
}

}  // namespace kiln::cli
