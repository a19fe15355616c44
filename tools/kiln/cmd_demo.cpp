// kiln demo: the main job. On the built-in matmul:
//   - compiles its whole config space (in parallel, through the cache);
//   - tunes one config at each hint point of its spec, and one at each run
//     size (the oracle);
//   - times, at each run size: each hint's config ("tuned at one hint, run at
//     each size"), the size-hint multi-kernel's pick (the nearest hint), and
//     the oracle; then the ratio of kiln's pick to the oracle per size and
//     their geometric mean;
//   - checks a result against a plain loop;
//   - lets the softmax multi-kernel pick a variant for a shape.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "core/format.hpp"
#include "kiln/args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"

namespace kiln::cli {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1 || v > 4096) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      fail(Errc::usage, "--sizes: '{}' is not a size from 1 to 4096", item);
    }
  }
  if (out.empty()) fail(Errc::usage, "--sizes: no sizes");
  return out;
}

std::vector<std::pair<std::string, std::string>> square(int64_t n) {
  std::string s = std::to_string(n);
  return {{"M", s}, {"N", s}, {"K", s}};
}

// Times configs of `spec` at one shape side by side: interleaved rounds on
// the same inputs, so drift falls on all alike. Returns median ms per config.
std::vector<double> time_side_by_side(Runtime& rt, const KernelSpec& spec, const std::vector<Config>& configs,
                                      int64_t n) {
  HostArgs args(spec, parse_scalars(spec, square(n)));
  args.fill_random(7);
  Device& dev = rt.backend(spec.backend).device();
  BenchInputs inputs(spec, args.params(), dev, true);
  Benchmarker bench(nullptr, &dev, rt.options());
  BenchSettings st = bench.settings();
  st.budget_ms = 15;
  st.check = false;
  std::vector<int64_t> slots(spec.args.size());
  read_int_slots(spec, args.params(), slots.data());
  std::vector<std::shared_ptr<const Binary>> bins;
  std::vector<std::shared_ptr<LoadedKernel>> ks;
  for (const auto& c : configs) {
    bins.push_back(rt.compile_pool(spec.backend).submit(spec, c).get());
    ks.push_back(rt.load(*bins.back()));
  }
  std::vector<std::vector<double>> samples(configs.size());
  for (int round = 0; round < 4; ++round)
    for (size_t i = 0; i < configs.size(); ++i) {
      LaunchDims dims = configs[i].library.empty() ? LaunchPlan(spec, configs[i]).eval(slots.data()) : LaunchDims{};
      BenchResult r = bench.run(*bins[i], ks[i].get(), inputs, dims,
                                "demo " + configs[i].str(), st, rt.options().bench_timeout_s);
      samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
    }
  std::vector<double> ms;
  for (auto& v : samples) ms.push_back(summarize(std::move(v)).median_ns / 1e6);
  return ms;
}

std::string ms_text(double ms) {
  if (ms >= 100) return fmt::format("{:.1f}", ms);
  if (ms >= 1) return fmt::format("{:.2f}", ms);
  return fmt::format("{:.3f}", ms);
}

void run_demo(Globals& g, const std::string& backend, const std::string& sizes_text) {
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  bool show = !opts.quiet && stderr_is_terminal();
  Runtime rt(opts);
  if (backend != "cpu") rt.backend(backend);  // says clearly if it is not built in
  KernelSpec spec = load_spec(kernels_dir() / backend / "matmul.toml");
  std::vector<int64_t> sizes = parse_sizes(sizes_text);
  auto points = spec.tuning.hint_point_list();
  std::string hint_list, size_list;
  for (const auto& p : points) hint_list += (hint_list.empty() ? "" : ", ") + std::to_string(p[0]);
  for (int64_t s : sizes) size_list += (size_list.empty() ? "" : " ") + std::to_string(s);
  std::fprintf(out(), "kiln demo: %s on the %s backend, %zu configs (%s)\n", spec.name.c_str(), backend.c_str(),
              spec.space.size(), rt.backend(backend).device_identity().c_str());
  std::fprintf(out(), "hints at M = N = K = %s; run at M = N = K = %s\n\n", hint_list.c_str(), size_list.c_str());
  auto t_all = Clock::now();

  // 1. Compile every config.
  auto t0 = Clock::now();
  CompilePool& pool = rt.compile_pool(backend);
  std::vector<BinaryFuture> fs;
  const LaunchLimits limits = rt.backend(backend).limits();
  for (const auto& c : spec.space.all())
    if (statically_pruned(spec, c, limits).empty()) fs.push_back(pool.submit(make_compile_request(spec, c)));
  wait_all(fs, "compiling", show);
  auto cc = pool.counters();
  std::fprintf(out(), "compiled %zu configs (%zu from the cache) in %s\n", spec.space.size(), cc.cache_hits,
              seconds_text(since(t0)).c_str());

  // 2. One config per hint point, through the size-hint multi-kernel.
  t0 = Clock::now();
  SizeHintOptions sho;
  sho.tune.show_progress = show;
  sho.retune_after = 0;
  SizeHintMultiKernel shmk(rt, spec, sho);
  shmk.prepare();
  const auto& hints = shmk.hint_points();
  std::fprintf(out(), "tuned at the hint points in %s:", seconds_text(since(t0)).c_str());
  for (const auto& h : hints) std::fprintf(out(), "  %lld: %s", static_cast<long long>(h.values[0]), h.config.str().c_str());
  std::fprintf(out(), "\n");

  // 3. The oracle: each run size tuned exactly.
  t0 = Clock::now();
  std::vector<Config> oracle;
  TuneOptions to;
  to.show_progress = show;
  for (int64_t n : sizes) {
    HostArgs a(spec, parse_scalars(spec, square(n)));
    a.fill_random(0);
    TuneOutcome o = rt.tune(spec, a.params(), to);
    if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
    oracle.push_back(*o.choice);
  }
  std::fprintf(out(), "tuned at each run size (the oracle) in %s\n\n", seconds_text(since(t0)).c_str());

  // 4. Time everything at each size, side by side.
  t0 = Clock::now();
  const size_t H = hints.size(), S = sizes.size();
  std::vector<std::vector<double>> hint_ms(H, std::vector<double>(S));
  std::vector<double> pick_ms(S), oracle_ms(S);
  std::vector<size_t> picked(S);
  for (size_t j = 0; j < S; ++j) {
    int64_t n = sizes[j];
    picked[j] = shmk.nearest({n, n, n});
    std::vector<Config> cs;
    auto index_of = [&](const Config& c) {
      for (size_t i = 0; i < cs.size(); ++i)
        if (cs[i] == c) return i;
      cs.push_back(c);
      return cs.size() - 1;
    };
    std::vector<size_t> hi(H);
    for (size_t h = 0; h < H; ++h) hi[h] = index_of(hints[h].config);
    size_t oi = index_of(oracle[j]);
    std::vector<double> ms = time_side_by_side(rt, spec, cs, n);
    for (size_t h = 0; h < H; ++h) hint_ms[h][j] = ms[hi[h]];
    pick_ms[j] = ms[hi[picked[j]]];
    oracle_ms[j] = ms[oi];
  }

  std::fprintf(out(), "tuned at one hint, run at each size: ms per matmul (median, side by side)\n");
  std::vector<std::string> header{"hint \\ size"};
  for (int64_t s : sizes) header.push_back(std::to_string(s));
  std::vector<bool> right(header.size(), true);
  right[0] = false;
  Table t(header, right);
  for (size_t h = 0; h < H; ++h) {
    std::vector<std::string> row{fmt::format("{} ({})", hints[h].values[0], hints[h].config.str())};
    for (size_t j = 0; j < S; ++j) row.push_back(ms_text(hint_ms[h][j]));
    t.row(row);
  }
  std::vector<std::string> pick_row{"size-hint multi-kernel"}, oracle_row{"oracle (tuned at the size)"},
      ratio_row{"kiln / oracle"}, which_row{"  nearest hint"};
  double log_sum = 0;
  for (size_t j = 0; j < S; ++j) {
    pick_row.push_back(ms_text(pick_ms[j]));
    which_row.push_back(std::to_string(hints[picked[j]].values[0]));
    oracle_row.push_back(ms_text(oracle_ms[j]));
    double r = pick_ms[j] / oracle_ms[j];
    ratio_row.push_back(fmt::format("{:.2f}x", r));
    log_sum += std::log(r);
  }
  t.row(pick_row);
  t.row(which_row);
  t.row(oracle_row);
  t.row(ratio_row);
  std::fprintf(out(), "%s", t.str().c_str());
  std::fprintf(out(), "geometric mean of kiln / oracle: %.3fx   (1.000x = as fast as tuning every size exactly)\n",
              std::exp(log_sum / static_cast<double>(S)));
  std::fprintf(out(), "each single hint / oracle, geometric mean:");
  for (size_t h = 0; h < H; ++h) {
    double ls = 0;
    for (size_t j = 0; j < S; ++j) ls += std::log(hint_ms[h][j] / oracle_ms[j]);
    std::fprintf(out(), "  %lld: %.3fx", static_cast<long long>(hints[h].values[0]), std::exp(ls / static_cast<double>(S)));
  }
  std::fprintf(out(), "\n(timed in %s)\n\n", seconds_text(since(t0)).c_str());

  // 5. A result, checked against a plain loop.
  int64_t n = sizes[S / 2];
  HostArgs a(spec, parse_scalars(spec, square(n)));
  a.fill_random(11);
  shmk.launch(a.params());
  auto* A = reinterpret_cast<const float*>(a.buffer(0).data());
  auto* B = reinterpret_cast<const float*>(a.buffer(1).data());
  auto* C = reinterpret_cast<const float*>(a.buffer(2).data());
  double max_err = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t k = 0; k < n; ++k) ref += static_cast<double>(A[i * n + k]) * B[k * n + j];
      max_err = std::max(max_err, std::abs(ref - C[i * n + j]));
    }
  bool ok = max_err < 1e-3 * std::sqrt(static_cast<double>(n));
  std::fprintf(out(), "check: the size-hint multi-kernel at M = N = K = %lld against a plain loop: max error %.2e, %s\n",
              static_cast<long long>(n), max_err, ok ? "OK" : "WRONG");
  if (!ok) g.exit_code = 1;

  // 6. The softmax multi-kernel picks a variant.
  MultiKernel softmax(rt, load_multi_spec(kernels_dir() / backend / "softmax_multi.toml"));
  int64_t M = 256, N = 2048;
  std::vector<float> x(M * N), y(M * N);
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 3);
  float *px = x.data(), *py = y.data();
  void* params[] = {&px, &py, &M, &N};
  softmax.launch(params);
  MultiKernel::Pick p = softmax.pick(params);
  std::fprintf(out(), "multi-kernel softmax at M = %lld, N = %lld: variant %zu (%s, %s), %s", static_cast<long long>(M),
              static_cast<long long>(N), p.variant, softmax.spec().variants[p.variant].kernel.name.c_str(),
              p.config.str().c_str(), p.source.c_str());
  if (!p.results.empty()) {
    std::fprintf(out(), ":");
    for (size_t i = 0; i < p.results.size(); ++i)
      std::fprintf(out(), "  %zu: %s", i, p.results[i].ns ? seconds_text(*p.results[i].ns * 1e-9).c_str() : "failed");
  }
  std::fprintf(out(), "\n\ndemo done in %s\n", seconds_text(since(t_all)).c_str());
}

}  // namespace

void add_demo(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("demo", "The main job: tune the built-in matmul at hint sizes, pick per run size, "
                                         "compare with tuning each size exactly");
  auto backend = std::make_shared<std::string>("cpu");
  auto sizes = std::make_shared<std::string>("40,100,200,500,900");
  cmd->add_option("--backend", *backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--sizes", *sizes, "Run sizes, comma-separated (M = N = K)")->capture_default_str();
  cmd->callback([&g, backend, sizes] { run_demo(g, *backend, *sizes); });
}

}  // namespace kiln::cli
