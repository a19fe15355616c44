// kiln tune SPEC --set NAME=VALUE ...: tunes a kernel on seeded random inputs.
// kiln report SPEC --set NAME=VALUE ...: prints the stored record, running nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "compile/compile_pool.hpp"
#include "commands.hpp"
#include <charconv>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "plot.hpp"

namespace kiln::cli {

namespace {

using json = nlohmann::ordered_json;  // params keep the spec's order

std::string ns_text(double ns) { return seconds_text(ns * 1e-9); }

json params_json(const Config& c) {
  json j = json::object();
  for (const auto& [n, v] : c.values) j[n] = v;
  if (!c.library.empty()) j["library"] = c.library;
  return j;
}

int kind_rank(FailKind k) {
  for (int i = 0; FailKind x : {FailKind::wrong, FailKind::crash, FailKind::timeout, FailKind::launch, FailKind::compile,
                                FailKind::unavailable, FailKind::pruned}) {
    if (k == x) return i;
    ++i;
  }
  return 9;
}

// The record as a table, fastest first, then failures; then each failure's reason.
void print_record(const TuningRecord& r) {
  auto ranked = r.ranked();
  Table t({"#", "config", "median", "min", "vs best", "result"}, {true, false, true, true, true, false});
  int rank = 0;
  double base = r.best ? r.best_ns : (ranked.empty() ? 1 : *ranked[0]->ns);
  for (const ConfigResult* c : ranked) {
    ++rank;
    bool chosen = r.best && c->config == *r.best;
    t.row({std::to_string(rank), c->detail.empty() ? c->config.str() : c->config.str() + " (" + c->detail + ")",
           ns_text(*c->ns), ns_text(c->min_ns),
           fmt::format("{:.3f}x", *c->ns / base), chosen ? "chosen" : "ok"});
  }
  std::vector<const ConfigResult*> failed;
  for (const auto& c : r.configs)
    if (!c.ok()) failed.push_back(&c);
  std::stable_sort(failed.begin(), failed.end(), [](auto* a, auto* b) { return kind_rank(a->kind) < kind_rank(b->kind); });
  for (const ConfigResult* c : failed) t.row({"-", c->config.str(), "-", "-", "-", fail_kind_name(c->kind)});
  std::fprintf(out(), "%s", t.str().c_str());
  for (const ConfigResult* c : failed) {
    std::string e = c->error;
    if (c->kind != FailKind::pruned) {  // keep the first lines of long compiler logs
      size_t cut = 0;
      for (int i = 0; i < 6 && cut != std::string::npos; ++i) cut = e.find('\n', cut + 1);
      if (cut != std::string::npos) e = e.substr(0, cut) + "\n    ...";
    }
    std::fprintf(out(), "  %s: %s\n", c->config.str().c_str(), e.c_str());
  }
  if (!r.verdict.empty()) std::fprintf(out(), "no choice: %s\n", r.verdict.c_str());
}

json record_json(const TuningRecord& r, const std::string& source, double seconds, const TuneOutcome* o) {
  json configs = json::array();
  for (const auto& c : r.configs)
    configs.push_back({{"params", params_json(c.config)},
                       {"binary", c.binary},
                       {"ns", c.ns ? json(*c.ns) : json(nullptr)},
                       {"result", fail_kind_name(c.kind)},
                       {"detail", c.detail.empty() ? json(nullptr) : json(c.detail)},
                       {"error", c.error.empty() ? json(nullptr) : json(c.error)}});
  json key = json::object();
  for (const auto& [n, v] : r.key.values) key[n] = v;
  json j = {{"kernel", r.kernel},
            {"backend", r.key.backend},
            {"device", r.key.device},
            {"key", key},
            {"best", r.best ? params_json(*r.best) : json(nullptr)},
            {"best_ns", r.best ? json(r.best_ns) : json(nullptr)},
            {"noise", r.noise},
            {"noisy", r.noisy},
            {"source", source},
            {"method", search_method_name(r.method)},
            {"start", r.start},
            {"reference", r.reference},
            {"verdict", r.verdict.empty() ? json(nullptr) : json(r.verdict)},
            {"when", r.when},
            {"seconds", seconds},
            {"timed", r.timed},
            {"space_size", r.space.size()},
            {"peak_device_bytes", r.peak_device_bytes},
            {"configs", configs}};
  if (o) {
    j["timed_now"] = o->timed_now;
    j["retimed_now"] = o->retimed_now;
    j["stored"] = o->stored;
    j["peak_extra_device_bytes"] = o->peak_device_bytes;
    j["compile_wait_seconds"] = o->compile_wait_s;
    j["bench_seconds"] = o->bench_s;
    j["evaluated"] = o->evaluated;
  }
  return j;
}

struct TuneArgs {
  std::string spec;
  std::vector<std::string> sets;
  bool json = false;
  std::string search;
  bool force = false;
  uint64_t seed = 0;
  std::string inputs = "uniform";
  int max_configs = 0;
  bool explain = false;
  bool no_library = false;
  std::string effort;
  double budget_seconds = 0;
  std::string plot;  // a PNG of best-so-far against configs timed
};

// Tuning-key values from --set, strictly: every key name, whole numbers, no
// name that is not a scalar of the kernel.
std::vector<std::pair<std::string, int64_t>> key_values(const KernelSpec& spec,
                                                         const std::vector<std::pair<std::string, std::string>>& given) {
  for (const auto& [name, v] : given) {
    int i = spec.arg_index(name);
    if (i < 0 || spec.args[i].pointer)
      fail(Errc::usage, "--set {}={}: kernel '{}' has no scalar '{}'", name, v, spec.name, name);
  }
  std::vector<std::pair<std::string, int64_t>> values;
  for (const auto& name : spec.tuning.key) {
    auto it = std::find_if(given.begin(), given.end(), [&](auto& p) { return p.first == name; });
    if (it == given.end()) fail(Errc::usage, "kernel '{}' is tuned by {}: pass --set {}=VALUE", spec.name,
                                fmt::join(spec.tuning.key, ", "), name);
    int64_t v = 0;
    const std::string& t = it->second;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || ec != std::errc() || p != t.data() + t.size())
      fail(Errc::usage, "--set {}={}: not a whole number", name, t);
    if (spec.args[spec.arg_index(name)].dtype == DType::i32 && (v < INT32_MIN || v > INT32_MAX))
      fail(Errc::usage, "--set {}={}: out of range for i32", name, t);
    values.push_back({name, v});
  }
  return values;
}

TuneOptions tune_options(const TuneArgs& a, const Options& opts) {
  TuneOptions to;
  to.remeasure_noisy = true;  // a record timed on a busy machine is re-measured
  if (a.search == "exhaustive") to.search = SearchKind::exhaustive;
  else if (a.search == "coordesc") to.search = SearchKind::coordesc;
  else if (a.search == "budgeted") to.search = SearchKind::budgeted;
  to.force = a.force;
  if (a.effort == "none") to.effort = Effort::none;
  else if (a.effort == "quick") to.effort = Effort::quick;
  else if (a.effort == "full") to.effort = Effort::full;
  to.budget_seconds = a.budget_seconds;
  to.max_configs = a.max_configs;
  to.libraries = !a.no_library;
  to.show_progress = !opts.quiet && !a.json && stderr_is_terminal();
  return to;
}

// A multi-kernel: its first call on seeded random inputs, which tunes each
// variant (each launch of a variant of several) and times the variants
// against each other; then the variants' times and the choice.
void run_tune_multi(const TuneArgs& a, Options opts) {
  if (!a.plot.empty()) fail(Errc::usage, "--plot draws a kernel's search; {} is a multi-kernel", a.spec);
  opts.first_call = FirstCall::wait;  // decide on this call, not behind a safe choice
  Runtime rt(opts);
  MultiKernelSpec ms = load_multi_spec(a.spec);
  KernelSpec shape;  // the multi-kernel's arguments, for the inputs
  shape.name = ms.name;
  shape.backend = ms.backend;
  shape.args = ms.args;
  DeviceArgs args(shape, parse_scalars(shape, split_sets(a.sets)), rt.backend(ms.backend).device());
  args.fill_random(a.seed, a.inputs == "wide");
  auto t0 = std::chrono::steady_clock::now();
  MultiKernel k(rt, ms, tune_options(a, opts));
  k.launch(args.params());
  rt.backend(ms.backend).device().sync(nullptr);
  MultiKernel::Pick p = k.pick(args.params());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int64_t> slots(shape.args.size(), 0);
  read_int_slots(shape, args.params(), slots.data());
  std::string key;
  for (const auto& name : ms.key) key += fmt::format("{}{}={}", key.empty() ? "" : " ", name, slots[shape.arg_index(name)]);
  std::vector<std::string> configs;
  for (const auto& c : p.steps) configs.push_back(c.str());
  if (a.json) {
    json vs = json::array();
    for (size_t i = 0; i < ms.variants.size(); ++i) {
      const ConfigResult* r = i < p.results.size() ? &p.results[i] : nullptr;
      vs.push_back({{"variant", i},
                    {"name", ms.variants[i].name()},
                    {"launches", ms.variants[i].steps.size()},
                    {"ns", r && r->ns ? json(*r->ns) : json(nullptr)},
                    {"min_ns", r && r->ns ? json(r->min_ns) : json(nullptr)},
                    {"result", r ? json(fail_kind_name(r->kind)) : json(nullptr)},
                    {"detail", r && !r->detail.empty() ? json(r->detail) : json(nullptr)},
                    {"error", r && !r->error.empty() ? json(r->error) : json(nullptr)}});
    }
    json j = {{"multi_kernel", ms.name},  {"backend", ms.backend},
              {"key", key},               {"variant", p.variant},
              {"name", ms.variants[p.variant].name()},
              {"configs", configs},       {"source", choice_source_name(p.source)},
              {"seconds", secs},          {"variants", vs}};
    std::fprintf(out(), "%s\n", dump_json(j, 2).c_str());
    return;
  }
  std::fprintf(out(), "multi-kernel %s at %s\n", ms.name.c_str(), key.c_str());
  Table t({"variant", "launches", "median", "min", "vs chosen", "result"}, {false, true, true, true, true, false});
  const double base = p.variant < p.results.size() && p.results[p.variant].ns ? *p.results[p.variant].ns : 0;
  for (size_t i = 0; i < ms.variants.size(); ++i) {
    const ConfigResult* r = i < p.results.size() ? &p.results[i] : nullptr;
    const bool timed = r && r->ns;
    t.row({fmt::format("{}: {}", i, ms.variants[i].name()), std::to_string(ms.variants[i].steps.size()),
           timed ? ns_text(*r->ns) : "-", timed ? ns_text(r->min_ns) : "-",
           timed && base > 0 ? fmt::format("{:.3f}x", *r->ns / base) : "-",
           i == p.variant ? "chosen" : r ? fail_kind_name(r->kind) : "-"});
  }
  std::fprintf(out(), "%s", t.str().c_str());
  for (size_t i = 0; i < p.results.size(); ++i)
    if (!p.results[i].detail.empty()) std::fprintf(out(), "  %zu: %s\n", i, p.results[i].detail.c_str());
  for (size_t i = 0; i < p.results.size(); ++i)
    if (!p.results[i].ok()) {
      std::string e = p.results[i].error;
      if (size_t cut = e.find('\n'); cut != std::string::npos) e = e.substr(0, cut) + " ...";
      std::fprintf(out(), "  %zu: %s\n", i, e.c_str());
    }
  std::fprintf(out(), "chose variant %zu (%s): %s; %s in %s\n", p.variant, ms.variants[p.variant].name().c_str(),
               fmt::format("{}", fmt::join(configs, " ; ")).c_str(), choice_source_name(p.source),
               seconds_text(secs).c_str());
}

void run_tune(Globals& g, const TuneArgs& a) {
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  if (is_multi_spec(a.spec)) return run_tune_multi(a, opts);
  Runtime rt(opts);
  KernelSpec spec = load_spec(a.spec);
  if (std::string why; !a.plot.empty() && !can_plot(&why)) fail(Errc::usage, "--plot {}: {}", a.plot, why);
  if (!a.plot.empty() && !std::filesystem::exists(a.plot)) {  // found out before tuning, not after
    if (FILE* f = std::fopen(a.plot.c_str(), "wb")) {
      std::fclose(f);
      std::filesystem::remove(a.plot);
    } else {
      fail(Errc::usage, "--plot {}: cannot write there", a.plot);
    }
  }
  // Seeded random inputs in the backend's memory (the GPU's, on cuda).
  DeviceArgs args(spec, parse_scalars(spec, split_sets(a.sets)), rt.backend(spec.backend).device());
  args.fill_random(a.seed, a.inputs == "wide");
  TuneOptions to = tune_options(a, opts);
  auto t0 = std::chrono::steady_clock::now();
  TuneOutcome o = rt.tune(spec, args.params(), to);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const TuningRecord& r = o.record;
  TuningCache::Stats cs = rt.tuning_cache() ? rt.tuning_cache()->stats() : TuningCache::Stats{};
  std::string source = !o.from_cache ? "tuned" : cs.remote_hits ? "remote" : cs.artifact_hits ? "artifact" : "cache";
  if (!o.choice) g.exit_code = 1;
  // The picture comes after the results are printed: a failure to draw
  // warns and loses nothing.
  auto draw = [&] {
    if (a.plot.empty()) return;
    if (o.from_cache) {
      std::fprintf(stderr, "kiln: warning: --plot: answered from the %s, so nothing was timed to draw (--force tunes "
                   "again; kiln plot draws saved --json outputs)\n", source.c_str());
      return;
    }
    try {
      plot_search(a.plot, fmt::format("{} at {} ({})", spec.name, r.key.values_text(),
                                      r.key.device.substr(0, r.key.device.find(" ("))),
                  {curve_of_tuning(record_json(r, source, secs, &o))});
      if (!a.json) std::fprintf(out(), "wrote %s\n", a.plot.c_str());
    } catch (const Error& e) {
      std::fprintf(stderr, "kiln: warning: --plot: %s\n", e.what());
    }
  };
  if (a.json) {
    json j = record_json(r, source, secs, &o);
    j["records"] = {{"local_hits", cs.local_hits},         {"artifact_hits", cs.artifact_hits},
                    {"remote_hits", cs.remote_hits},       {"remote_rejected", cs.remote_rejected},
                    {"remote_writes", cs.remote_writes},   {"lease_waits", cs.lease_waits},
                    {"leases_taken", cs.leases_taken}};
    std::fprintf(out(), "%s\n", dump_json(j, 2).c_str());
    draw();
    return;
  }
  std::fprintf(out(), "kernel %s at %s (%s search, reference %s)\n", spec.name.c_str(), r.key.values_text().c_str(),
               search_method_name(r.method), r.reference.empty() ? "-" : r.reference.c_str());
  print_record(r);
  draw();
  if (!o.choice) {
    std::fprintf(stderr, "kiln: error: %s\n", r.all_failed_message().c_str());
    return;
  }
  std::string how = o.from_cache ? fmt::format("answered from the {} in {}",
                                               source == "remote" ? "remote cache" : source == "artifact" ? "artifact" : "cache",
                                               seconds_text(secs))
                                 : fmt::format("tuned in {} ({} configs timed now, {} re-timed side by side)",
                                               seconds_text(secs), o.timed_now, o.retimed_now);
  const ConfigResult* timed = r.find(*o.choice);
  if (!timed || !timed->ns) {  // serving mode, with no record at this key
    std::fprintf(out(), "serving: runs %s, with no tuned choice at this key (see the warning)\n",
                 o.choice->str().c_str());
    return;
  }
  std::fprintf(out(), "chose %s: %s (noise %.1f%%%s), %s\n", o.choice->str().c_str(), ns_text(*timed->ns).c_str(),
               r.noise * 100, r.noisy ? ", noisy: timed on a busy machine, re-measured by the next tuning" : "",
               how.c_str());
  if (!o.stored) std::fprintf(stderr, "kiln: warning: the record was not stored (see above)\n");
}

void run_report(const std::string& spec_path, const std::vector<std::string>& sets, bool as_json, bool explain) {
  isolate_stdout();
  Options opts = Options::from_env();
  Runtime rt(opts);
  KernelSpec spec = load_spec(spec_path);
  std::vector<std::pair<std::string, int64_t>> values = key_values(spec, split_sets(sets));
  TuningKey key = make_tuning_key(spec, rt.backend(spec.backend), values);
  if (explain) std::fprintf(out(), "%s\n\n", key.to_string().c_str());
  auto cache = TuningCache::open_existing(opts.resolved_cache_dir());
  std::optional<TuningRecord> r = opts.no_cache ? std::nullopt : cache->get(key);
  if (!r)
    fail(Errc::usage, "no tuning record for kernel '{}' at {} on this device ({}); run 'kiln tune {}{}' first",
         spec.name, key.values_text(), key.device, spec_path, [&] {
           std::string s;
           for (const auto& [n, v] : values) s += fmt::format(" --set {}={}", n, v);
           return s;
         }());
  if (as_json) {
    std::fprintf(out(), "%s\n", dump_json(record_json(*r, "cache", 0, nullptr), 2).c_str());
    return;
  }
  std::fprintf(out(), "kernel %s at %s: recorded %s by kiln %s (%s search, reference %s, %zu of %zu configs timed)\n",
               spec.name.c_str(), key.values_text().c_str(), r->when.c_str(), r->kiln_version.c_str(),
               search_method_name(r->method), r->reference.empty() ? "-" : r->reference.c_str(), r->timed,
               r->space.size());
  print_record(*r);
  if (r->best)
    std::fprintf(out(), "chose %s: %s (noise %.1f%%%s)\n", r->best->str().c_str(), ns_text(r->best_ns).c_str(),
                 r->noise * 100,
                 r->noisy ? fmt::format(", noisy: timed on a busy machine, re-measured {} times so far; the next "
                                        "tuning of this key re-measures it", r->remeasured).c_str()
                          : "");
}

void run_misses(const std::string& spec_path, bool as_json) {
  isolate_stdout();
  Options opts = Options::from_env();
  Runtime rt(opts);
  KernelSpec spec = load_spec(spec_path);
  TuningKey base = make_tuning_key(spec, rt.backend(spec.backend), std::vector<std::pair<std::string, int64_t>>{});
  for (const auto& k : spec.tuning.key) base.values.push_back({k, 0});
  auto cache = TuningCache::open_existing(opts.resolved_cache_dir());
  auto misses = cache->serving_misses(base);
  if (as_json) {
    json j = json::array();
    for (const auto& [k, n] : misses) j.push_back({{"key", k}, {"count", n}});
    std::fprintf(out(), "%s\n", dump_json(json{{"kernel", spec.name}, {"misses", j}}, 2).c_str());
    return;
  }
  if (misses.empty()) {
    std::fprintf(out(), "kernel %s: no serving misses recorded on this device\n", spec.name.c_str());
    return;
  }
  std::fprintf(out(), "kernel %s: keys serving mode met with no tuned choice (tune them, or pack them)\n",
               spec.name.c_str());
  Table t({"key", "processes"}, {false, true});
  for (const auto& [k, n] : misses) t.row({k, std::to_string(n)});
  std::fprintf(out(), "%s", t.str().c_str());
}

}  // namespace

void add_tune(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("tune", "Tune a kernel on seeded random inputs and store the choice");
  auto a = std::make_shared<TuneArgs>();
  cmd->add_option("spec", a->spec,
                  "The kernel's spec file (.toml; file.toml:member for a family's member); a multi-kernel's spec "
                  "tunes each variant and times them against each other")
      ->required()
      ->check(SpecFile);
  cmd->add_option("--set", a->sets, "A scalar argument's value, NAME=VALUE (each scalar needs one)")
      ->allow_extra_args(false);  // one value an occurrence: the spec file after it is not taken as one
  cmd->add_flag("--json", a->json, "Print one JSON object (see docs/cli.md)");
  cmd->add_option("--search", a->search,
                  "exhaustive, coordesc or budgeted (default: the spec's; a spec that names none is searched "
                  "exhaustively, or with --effort quick where more than KILN_QUICK_ABOVE (128) configs can run the call)")
      ->check(CLI::IsMember({"exhaustive", "coordesc", "budgeted"}));
  cmd->add_option("--effort", a->effort,
                  "none: the spec's search; quick: a budgeted search (a surrogate model picks what to time) until "
                  "it settles; full: every config (default: see --search)")
      ->check(CLI::IsMember({"none", "quick", "full"}));
  cmd->add_option("--budget-seconds", a->budget_seconds,
                  "Stop searching after this long (a budgeted search unless --search or --effort full says otherwise)")
      ->check(Finite & CLI::Range(0.001, 1e6));
  cmd->add_flag("--force", a->force, "Tune again even when a record exists");
  cmd->add_flag("--no-library", a->no_library, "Leave the spec's library choices out: templates only");
  cmd->add_option("--seed", a->seed, "Seed of the random inputs")->check(Seed)->capture_default_str();
  cmd->add_option("--inputs", a->inputs,
                  "uniform: floats in [-1, 1); wide: +-2^e (1 + f) with e in [-8, 8), a large dynamic range")
      ->check(CLI::IsMember({"uniform", "wide"}))
      ->capture_default_str();
  cmd->add_option("--max-configs", a->max_configs, "Benchmark at most this many configs (default: KILN_TUNE_MAX_CONFIGS)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--plot", a->plot, "Draw the best time so far against configs timed into this PNG (PLplot)");
  cmd->callback([&g, a] { run_tune(g, *a); });

  auto* rep = app.add_subcommand("report", "Print a stored tuning record as a table; runs nothing");
  auto spec = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto explain = std::make_shared<bool>(false);
  rep->add_option("spec", *spec, "The kernel's spec file (.toml; file.toml:member for a family's member)")->required()->check(SpecFile);
  rep->add_option("--set", *sets, "A tuning-key value, NAME=VALUE (each key name needs one)")->allow_extra_args(false);
  rep->add_flag("--json", *json, "Print one JSON object");
  rep->add_flag("--explain", *explain, "Print every field of the record's key first");
  auto misses = std::make_shared<bool>(false);
  rep->add_flag("--misses", *misses,
                "Print the keys serving mode met with no tuned choice (KILN_SERVING=1), with counts; needs no --set");
  rep->callback([spec, sets, json, explain, misses] {
    if (*misses) run_misses(*spec, *json);
    else run_report(*spec, *sets, *json, *explain);
  });
}

}  // namespace kiln::cli
