// kiln demo: the main job. On the built-in matmul of a backend (cpu or cuda):
//   - compiles its config space (in parallel, through the cache; configs the
//     device cannot run are pruned first);
//   - tunes at each hint point of its spec, and at each run size (the
//     oracle), with the spec's library choice (OpenBLAS, cuBLAS) beside the
//     templates; and at each run size once more with templates only;
//   - times side by side at each run size: each hint's choice ("tuned at one
//     hint, run at each size"), the size-hint multi-kernel's pick, the
//     oracle, the templates-only choice and the library call; prints the
//     ratios kiln / oracle, oracle / library and templates / library;
//   - checks the size-hint multi-kernel's result against a plain loop;
//   - lets the softmax multi-kernel pick a variant for a shape.
// --json FILE writes every figure of the tables.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "compile/compile_pool.hpp"
#include "commands.hpp"
#include "core/format.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"

namespace kiln::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1 || v > 16384) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      fail(Errc::usage, "--sizes: '{}' is not a size from 1 to 16384", item);
    }
  }
  if (out.empty()) fail(Errc::usage, "--sizes: no sizes");
  return out;
}

std::vector<std::pair<std::string, std::string>> square(int64_t n) {
  std::string s = std::to_string(n);
  return {{"M", s}, {"N", s}, {"K", s}};
}

}  // namespace

// Times configs of `spec` at one shape side by side: interleaved rounds on
// the same inputs, so drift falls on all alike. Returns median ms per config.
std::vector<double> time_side_by_side(Runtime& rt, const KernelSpec& spec, const std::vector<Config>& configs,
                                      const DeviceArgs& args) {
  Device& dev = rt.backend(spec.backend).device();
  BenchInputs inputs(spec, args.params(), dev, true);
  Benchmarker bench(nullptr, &dev, rt.options(), !dev.host_addressable());  // a GPU: its L2 flushed, as in tuning
  BenchSettings st = bench.settings();
  st.budget_ms = 15;
  st.check = false;
  std::vector<int64_t> slots(spec.args.size());
  read_int_slots(spec, args.params(), slots.data());
  const LaunchLimits limits = rt.backend(spec.backend).limits();
  std::vector<std::shared_ptr<const Binary>> bins;
  std::vector<std::shared_ptr<LoadedKernel>> ks;
  for (const auto& c : configs) {
    bins.push_back(rt.compile_pool(spec.backend).submit(spec, c).get());
    ks.push_back(rt.load(*bins.back()));
  }
  std::vector<std::vector<double>> samples(configs.size());
  for (int round = 0; round < 4; ++round)
    for (size_t i = 0; i < configs.size(); ++i) {
      LaunchDims dims = configs[i].library.empty() ? LaunchPlan(spec, configs[i], limits).eval(slots.data()) : LaunchDims{};
      BenchResult r = bench.run(*bins[i], ks[i].get(), inputs, dims, "demo " + configs[i].str(), st,
                                rt.options().bench_timeout_s);
      samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
    }
  std::vector<double> ms;
  for (auto& v : samples) ms.push_back(summarize(std::move(v)).median_ns / 1e6);
  return ms;
}

std::string ms_text(double ms) {
  if (ms >= 100) return fmt::format("{:.1f}", ms);
  if (ms >= 1) return fmt::format("{:.2f}", ms);
  if (ms >= 0.01) return fmt::format("{:.3f}", ms);
  return fmt::format("{:.4f}", ms);
}

double geomean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::log(x);
  return v.empty() ? 0 : std::exp(s / static_cast<double>(v.size()));
}

namespace {

// The largest |C - A·B| over `rows` rows of C spread over the matrix (all of
// them when n is small), against a plain loop in double.
double check_rows(const DeviceArgs& a, int64_t n) {
  std::vector<std::byte> hA = a.read(0), hB = a.read(1), hC = a.read(2);
  auto* A = reinterpret_cast<const float*>(hA.data());
  auto* B = reinterpret_cast<const float*>(hB.data());
  auto* C = reinterpret_cast<const float*>(hC.data());
  int64_t rows = std::min<int64_t>(n, 16);
  double max_err = 0;
  std::vector<double> ref(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t i = rows == n ? r : (r * (n - 1)) / (rows - 1);
    std::fill(ref.begin(), ref.end(), 0.0);
    for (int64_t k = 0; k < n; ++k) {
      double aik = A[i * n + k];
      for (int64_t j = 0; j < n; ++j) ref[j] += aik * B[k * n + j];
    }
    for (int64_t j = 0; j < n; ++j) max_err = std::max(max_err, std::abs(ref[j] - C[i * n + j]));
  }
  return max_err;
}

void run_demo(Globals& g, const std::string& backend, const std::string& sizes_text, const std::string& json_path) {
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  bool show = !opts.quiet && stderr_is_terminal();
  Runtime rt(opts);
  Backend& be = rt.backend(backend);  // says clearly if it is not built in
  if (std::string why = be.unavailable_reason(); !why.empty())
    fail(Errc::usage, "the {} backend cannot run here: {}", backend, why);
  Device& dev = be.device();
  KernelSpec spec = load_spec(kernels_dir() / backend / "matmul.toml");
  std::vector<int64_t> sizes = parse_sizes(sizes_text);
  auto points = spec.tuning.hint_point_list();
  std::string hint_list, size_list;
  for (const auto& p : points) hint_list += (hint_list.empty() ? "" : ", ") + std::to_string(p[0]);
  for (int64_t s : sizes) size_list += (size_list.empty() ? "" : " ") + std::to_string(s);
  std::string library = spec.libraries.empty() ? "" : spec.libraries.front();
  std::string library_why = library.empty() ? "the spec names no library choice" : be.library_unavailable(library);
  bool have_library = library_why.empty();
  std::fprintf(out(), "kiln demo: %s on the %s backend (%s), %zu configs%s\n", spec.name.c_str(), backend.c_str(),
               be.device_identity().c_str(), spec.space.size(),
               library.empty() ? "" : fmt::format(" and the library choice {}", library).c_str());
  if (!have_library) std::fprintf(out(), "the library choice is skipped: %s\n", library_why.c_str());
  std::fprintf(out(), "hints at M = N = K = %s; run at M = N = K = %s\n\n", hint_list.c_str(), size_list.c_str());
  auto t_all = Clock::now();
  json js = {{"backend", backend}, {"device", be.device_identity()}, {"kernel", spec.name}, {"sizes", sizes}};

  // 1. Compile every config the device can run.
  auto t0 = Clock::now();
  CompilePool& pool = rt.compile_pool(backend);
  std::vector<BinaryFuture> fs;
  const LaunchLimits limits = be.limits();
  size_t pruned = 0;
  for (const auto& c : spec.space.all()) {
    if (statically_pruned(spec, c, limits).empty()) fs.push_back(pool.submit(make_compile_request(spec, c)));
    else ++pruned;
  }
  wait_all(fs, "compiling", show);
  auto cc = pool.counters();
  std::fprintf(out(), "compiled %zu configs (%zu from the cache; %zu pruned before compiling) in %s\n", fs.size(),
               cc.cache_hits, pruned, seconds_text(since(t0)).c_str());
  js["compiled"] = fs.size();
  js["pruned_before_compiling"] = pruned;

  // 2. One choice per hint point, through the size-hint multi-kernel.
  t0 = Clock::now();
  SizeHintOptions sho;
  sho.tune.show_progress = show;
  sho.retune_after = 0;
  SizeHintMultiKernel shmk(rt, spec, sho);
  shmk.prepare();
  const auto& hints = shmk.hint_points();
  Legend legend;
  std::fprintf(out(), "tuned at the hint points in %s:", seconds_text(since(t0)).c_str());
  for (const auto& h : hints)
    std::fprintf(out(), "  %lld: %s", static_cast<long long>(h.values[0]), legend.name(h.config).c_str());
  std::fprintf(out(), "\n");

  // 3. Inputs per run size, and the oracles: each size tuned exactly, with
  //    and without the library choice.
  t0 = Clock::now();
  const size_t H = hints.size(), S = sizes.size();
  std::vector<std::unique_ptr<DeviceArgs>> inputs;
  std::vector<Config> oracle, templates;
  TuneOptions with_lib, no_lib;
  with_lib.show_progress = no_lib.show_progress = show;
  no_lib.libraries = false;
  for (int64_t n : sizes) {
    inputs.push_back(std::make_unique<DeviceArgs>(spec, parse_scalars(spec, square(n)), dev));
    inputs.back()->fill_random(static_cast<uint64_t>(n));
    for (auto [to, dst] : {std::pair{&with_lib, &oracle}, std::pair{&no_lib, &templates}}) {
      TuneOutcome o = rt.tune(spec, inputs.back()->params(), *to);
      if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
      dst->push_back(*o.choice);
    }
  }
  std::fprintf(out(), "tuned at each run size (the oracle; and templates only) in %s\n\n",
               seconds_text(since(t0)).c_str());

  // 4. Everything at each size, side by side.
  t0 = Clock::now();
  std::vector<std::vector<double>> hint_ms(H, std::vector<double>(S));
  std::vector<double> pick_ms(S), oracle_ms(S), templ_ms(S), lib_ms(S, 0);
  std::vector<size_t> picked(S);
  std::vector<Config> pick_cfg(S);
  for (size_t j = 0; j < S; ++j) {
    int64_t n = sizes[j];
    picked[j] = shmk.nearest({n, n, n});
    pick_cfg[j] = shmk.config_for(inputs[j]->params());
    std::vector<Config> cs;
    auto index_of = [&](const Config& c) {
      for (size_t i = 0; i < cs.size(); ++i)
        if (cs[i] == c) return i;
      cs.push_back(c);
      return cs.size() - 1;
    };
    std::vector<size_t> hi(H);
    for (size_t h = 0; h < H; ++h) hi[h] = index_of(hints[h].config);
    size_t pi = index_of(pick_cfg[j]), oi = index_of(oracle[j]), ti = index_of(templates[j]);
    size_t li = have_library ? index_of(Config{{}, library}) : 0;
    std::vector<double> ms = time_side_by_side(rt, spec, cs, *inputs[j]);
    for (size_t h = 0; h < H; ++h) hint_ms[h][j] = ms[hi[h]];
    pick_ms[j] = ms[pi];
    oracle_ms[j] = ms[oi];
    templ_ms[j] = ms[ti];
    if (have_library) lib_ms[j] = ms[li];
  }
  double timed_s = since(t0);

  std::fprintf(out(), "ms per matmul at M = N = K (median of side-by-side runs on the same inputs)\n");
  std::vector<std::string> header{""};
  for (int64_t s : sizes) header.push_back(std::to_string(s));
  std::vector<bool> right(header.size(), true);
  right[0] = false;
  Table t(header, right);
  for (size_t h = 0; h < H; ++h) {
    std::vector<std::string> row{fmt::format("tuned at {} ({})", hints[h].values[0], legend.name(hints[h].config))};
    for (size_t j = 0; j < S; ++j) row.push_back(ms_text(hint_ms[h][j]));
    t.row(row);
  }
  auto row_of = [&](std::string label, const auto& cell) {
    std::vector<std::string> r{std::move(label)};
    for (size_t j = 0; j < S; ++j) r.push_back(cell(j));
    t.row(r);
  };
  row_of("size-hint multi-kernel", [&](size_t j) { return ms_text(pick_ms[j]); });
  row_of("  its pick (nearest hint)",
         [&](size_t j) { return fmt::format("{} ({})", legend.name(pick_cfg[j]), hints[picked[j]].values[0]); });
  row_of("oracle: tuned at the size", [&](size_t j) { return ms_text(oracle_ms[j]); });
  row_of("  its choice", [&](size_t j) { return legend.name(oracle[j]); });
  row_of("templates only, tuned at the size", [&](size_t j) { return ms_text(templ_ms[j]); });
  row_of("  its choice", [&](size_t j) { return legend.name(templates[j]); });
  if (have_library) row_of("library: " + library, [&](size_t j) { return ms_text(lib_ms[j]); });
  row_of("kiln / oracle", [&](size_t j) { return fmt::format("{:.2f}x", pick_ms[j] / oracle_ms[j]); });
  if (have_library) {
    row_of("oracle / library", [&](size_t j) { return fmt::format("{:.2f}x", oracle_ms[j] / lib_ms[j]); });
    row_of("templates / library", [&](size_t j) { return fmt::format("{:.2f}x", templ_ms[j] / lib_ms[j]); });
  }
  std::fprintf(out(), "%s", t.str().c_str());

  std::vector<double> r_pick(S), r_oracle_lib(S), r_templ_lib(S);
  for (size_t j = 0; j < S; ++j) {
    r_pick[j] = pick_ms[j] / oracle_ms[j];
    if (have_library) {
      r_oracle_lib[j] = oracle_ms[j] / lib_ms[j];
      r_templ_lib[j] = templ_ms[j] / lib_ms[j];
    }
  }
  std::fprintf(out(), "geometric mean of kiln / oracle: %.3fx   (1.000x = as fast as tuning every size exactly)\n",
               geomean(r_pick));
  if (have_library)
    std::fprintf(out(), "worst oracle / library: %.3fx; templates / library, geometric mean %.3fx, worst %.3fx\n",
                 *std::max_element(r_oracle_lib.begin(), r_oracle_lib.end()), geomean(r_templ_lib),
                 *std::max_element(r_templ_lib.begin(), r_templ_lib.end()));
  std::fprintf(out(), "each single hint / oracle, geometric mean:");
  json js_hints = json::array();
  for (size_t h = 0; h < H; ++h) {
    std::vector<double> r(S);
    for (size_t j = 0; j < S; ++j) r[j] = hint_ms[h][j] / oracle_ms[j];
    std::fprintf(out(), "  %lld: %.3fx", static_cast<long long>(hints[h].values[0]), geomean(r));
    js_hints.push_back({{"hint", hints[h].values[0]}, {"config", hints[h].config.str()}, {"ms", hint_ms[h]}});
  }
  std::fprintf(out(), "\n");
  std::fprintf(out(), "configs:");
  for (size_t i = 0; i < legend.configs.size(); ++i)
    std::fprintf(out(), "%s c%zu: %s", i % 3 == 0 ? "\n " : ";", i + 1, legend.configs[i].str().c_str());
  std::fprintf(out(), "\n(timed in %s)\n\n", seconds_text(timed_s).c_str());

  auto strs = [](const std::vector<Config>& v) {
    std::vector<std::string> out;
    for (const auto& c : v) out.push_back(c.str());
    return out;
  };
  js["hints"] = js_hints;
  js["size_hint"] = {{"ms", pick_ms}, {"config", strs(pick_cfg)}};
  js["oracle"] = {{"ms", oracle_ms}, {"config", strs(oracle)}};
  js["templates_only"] = {{"ms", templ_ms}, {"config", strs(templates)}};
  js["library"] = have_library ? json{{"name", library}, {"ms", lib_ms}} : json{{"name", library}, {"skipped", library_why}};
  js["ratios"] = {{"kiln_over_oracle", r_pick}, {"geomean_kiln_over_oracle", geomean(r_pick)}};
  if (have_library) {
    js["ratios"]["oracle_over_library"] = r_oracle_lib;
    js["ratios"]["templates_over_library"] = r_templ_lib;
  }

  // 5. A result, checked against a plain loop (rows spread over C).
  size_t cj = S / 2;
  int64_t n = sizes[cj];
  DeviceArgs& a = *inputs[cj];
  shmk.launch(a.params());
  dev.sync(nullptr);
  double max_err = check_rows(a, n);
  bool ok = max_err < 1e-3 * std::sqrt(static_cast<double>(n));
  std::fprintf(out(), "check: the size-hint multi-kernel at M = N = K = %lld against a plain loop (%lld rows): "
               "max error %.2e, %s\n", static_cast<long long>(n), static_cast<long long>(std::min<int64_t>(n, 16)),
               max_err, ok ? "OK" : "WRONG");
  js["check"] = {{"size", n}, {"max_error", max_err}, {"ok", ok}};
  if (!ok) g.exit_code = 1;

  // 6. The softmax multi-kernel picks a variant.
  MultiKernelSpec ms = load_multi_spec(kernels_dir() / backend / "softmax_multi.toml");
  KernelSpec shape;
  shape.name = ms.name;
  shape.args = ms.args;
  MultiKernel softmax(rt, ms);
  const int64_t M = 256, N = 2048;
  DeviceArgs sa(shape, parse_scalars(shape, {{"M", std::to_string(M)}, {"N", std::to_string(N)}}), dev);
  sa.fill_random(3);
  softmax.launch(sa.params());
  dev.sync(nullptr);
  MultiKernel::Pick p = softmax.pick(sa.params());
  std::fprintf(out(), "multi-kernel softmax at M = %lld, N = %lld: variant %zu (%s, %s), %s",
               static_cast<long long>(M), static_cast<long long>(N), p.variant,
               softmax.spec().variants[p.variant].name().c_str(), p.config.str().c_str(), choice_source_name(p.source));
  if (!p.results.empty()) {
    std::fprintf(out(), ":");
    for (size_t i = 0; i < p.results.size(); ++i)
      std::fprintf(out(), "  %zu: %s", i, p.results[i].ns ? seconds_text(*p.results[i].ns * 1e-9).c_str() : "failed");
  }
  js["softmax"] = {{"variant", p.variant}, {"kernel", softmax.spec().variants[p.variant].name()},
                   {"source", choice_source_name(p.source)}};
  double total = since(t_all);
  std::fprintf(out(), "\n\ndemo done in %s\n", seconds_text(total).c_str());
  js["seconds"] = total;
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << js.dump(2) << "\n";
    if (!f) fail(Errc::io, "--json: cannot write '{}'", json_path);
  }
}

}  // namespace

void add_demo(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand(
      "demo",
      "The main job: tune the built-in matmul at its hint sizes, pick per run size, and compare with tuning each "
      "size exactly and with the library call (OpenBLAS on cpu, cuBLAS on cuda)");
  auto backend = std::make_shared<std::string>("cpu");
  auto sizes = std::make_shared<std::string>();
  auto json_path = std::make_shared<std::string>();
  cmd->add_option("--backend", *backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--sizes", *sizes,
                  "Run sizes, comma-separated (M = N = K); default 40,100,200,500,900 on cpu, 64,256,1024,4096 on cuda");
  cmd->add_option("--json", *json_path, "Also write every figure to this file as JSON");
  cmd->callback([&g, backend, sizes, json_path] {
    std::string s = !sizes->empty() ? *sizes : *backend == "cuda" ? "64,256,1024,4096" : "40,100,200,500,900";
    run_demo(g, *backend, s, *json_path);
  });
}

}  // namespace kiln::cli
