// kiln tune SPEC --set NAME=VALUE ...: tunes a kernel on seeded random inputs.
// kiln report SPEC --set NAME=VALUE ...: prints the stored record, running nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/format.hpp"
#include "kiln/args.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace {

using json = nlohmann::ordered_json;  // params keep the spec's order

std::string ns_text(double ns) { return seconds_text(ns * 1e-9); }

json params_json(const Config& c) {
  json j = json::object();
  for (const auto& [n, v] : c.values) j[n] = v;
  return j;
}

std::vector<std::pair<std::string, std::string>> split_sets(const std::vector<std::string>& sets) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& s : sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) fail(Errc::usage, "--set {}: expected NAME=VALUE", s);
    out.push_back({s.substr(0, eq), s.substr(eq + 1)});
  }
  return out;
}

int kind_rank(const std::string& k) {
  for (int i = 0; const char* x : {"wrong", "crash", "timeout", "launch", "compile", "pruned"}) {
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
  for (const ConfigResult* c : ranked) {
    ++rank;
    t.row({std::to_string(rank), c->config.str(), ns_text(*c->ns), ns_text(c->min_ns),
           fmt::format("{:.2f}x", *c->ns / r.best_ns), rank == 1 ? "best" : "ok"});
  }
  std::vector<const ConfigResult*> failed;
  for (const auto& c : r.configs)
    if (!c.error.empty()) failed.push_back(&c);
  std::stable_sort(failed.begin(), failed.end(),
                   [](auto* a, auto* b) { return kind_rank(a->error_kind) < kind_rank(b->error_kind); });
  for (const ConfigResult* c : failed) t.row({"-", c->config.str(), "-", "-", "-", c->error_kind});
  std::printf("%s", t.str().c_str());
  for (const ConfigResult* c : failed) {
    std::string e = c->error;
    if (c->error_kind != "pruned") {  // keep the first lines of long compiler logs
      size_t cut = 0;
      for (int i = 0; i < 6 && cut != std::string::npos; ++i) cut = e.find('\n', cut + 1);
      if (cut != std::string::npos) e = e.substr(0, cut) + "\n    ...";
    }
    std::printf("  %s: %s\n", c->config.str().c_str(), e.c_str());
  }
}

json record_json(const TuningRecord& r, const std::string& source, double seconds) {
  json configs = json::array();
  for (const auto& c : r.configs)
    configs.push_back({{"params", params_json(c.config)},
                       {"ns", c.ns ? json(*c.ns) : json(nullptr)},
                       {"error", c.error.empty() ? json(nullptr) : json(c.error)},
                       {"error_kind", c.error_kind.empty() ? json(nullptr) : json(c.error_kind)}});
  json key = json::object();
  for (const auto& [n, v] : r.key.values) key[n] = v;
  return {{"kernel", r.kernel},
          {"backend", r.key.backend},
          {"key", key},
          {"best", r.best ? params_json(*r.best) : json(nullptr)},
          {"best_ns", r.best ? json(r.best_ns) : json(nullptr)},
          {"source", source},
          {"method", r.method},
          {"reference", r.reference},
          {"when", r.when},
          {"seconds", seconds},
          {"configs", configs}};
}

struct TuneArgs {
  std::string spec;
  std::vector<std::string> sets;
  bool json = false;
  std::string search;
  bool force = false;
  uint64_t seed = 0;
  int max_configs = 0;
};

void run_tune(Globals& g, const TuneArgs& a) {
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  Runtime rt(opts);
  KernelSpec spec = load_spec(a.spec);
  HostArgs args(spec, parse_scalars(spec, split_sets(a.sets)));
  args.fill_random(a.seed);
  TuneOptions to;
  if (a.search == "exhaustive") to.search = SearchKind::exhaustive;
  else if (a.search == "coordesc") to.search = SearchKind::coordesc;
  to.force = a.force;
  to.max_configs = a.max_configs;
  to.show_progress = !opts.quiet && !a.json && stderr_is_terminal();
  auto t0 = std::chrono::steady_clock::now();
  TuneOutcome o = rt.tune(spec, args.params(), to);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const TuningRecord& r = o.record;
  std::string source = o.from_cache ? "cache" : "tuned";
  if (!r.best) g.exit_code = 1;
  if (a.json) {
    std::printf("%s\n", record_json(r, source, secs).dump(2).c_str());
    return;
  }
  std::printf("kernel %s at %s (%s search, reference %s)\n", spec.name.c_str(), r.key.values_text().c_str(),
              r.method.c_str(), r.reference.empty() ? "-" : r.reference.c_str());
  print_record(r);
  if (!r.best) {
    std::fprintf(stderr, "kiln: error: %s\n", r.all_failed_message().c_str());
    return;
  }
  std::printf("chose %s: %s, %s %s\n", r.best->str().c_str(), ns_text(r.best_ns).c_str(),
              o.from_cache ? "answered from the cache in" : "tuned in", seconds_text(secs).c_str());
}

void run_report(const std::string& spec_path, const std::vector<std::string>& sets, bool as_json) {
  Options opts = Options::from_env();
  Runtime rt(opts);
  KernelSpec spec = load_spec(spec_path);
  auto given = split_sets(sets);
  std::vector<std::pair<std::string, int64_t>> values;
  for (const auto& name : spec.tuning.key) {
    auto it = std::find_if(given.begin(), given.end(), [&](auto& p) { return p.first == name; });
    if (it == given.end()) fail(Errc::usage, "kernel '{}' is tuned by {}: pass --set {}=VALUE", spec.name, name, name);
    try {
      values.push_back({name, std::stoll(it->second)});
    } catch (const std::exception&) {
      fail(Errc::usage, "--set {}={}: not a whole number", name, it->second);
    }
  }
  TuningKey key = make_tuning_key(spec, rt.backend(spec.backend).device_identity(), values);
  auto cache = rt.tuning_cache();
  std::optional<TuningRecord> r = cache ? cache->get(key, spec.space) : std::nullopt;
  if (!r)
    fail(Errc::usage, "no tuning record for kernel '{}' at {} on this device ({}); run 'kiln tune {}{}' first",
         spec.name, key.values_text(), key.device, spec_path, [&] {
           std::string s;
           for (const auto& [n, v] : values) s += fmt::format(" --set {}={}", n, v);
           return s;
         }());
  if (as_json) {
    std::printf("%s\n", record_json(*r, "cache", 0).dump(2).c_str());
    return;
  }
  std::printf("kernel %s at %s: recorded %s by kiln %s (%s search, reference %s)\n", spec.name.c_str(),
              key.values_text().c_str(), r->when.c_str(), r->kiln_version.c_str(), r->method.c_str(),
              r->reference.empty() ? "-" : r->reference.c_str());
  print_record(*r);
  if (r->best) std::printf("chose %s: %s\n", r->best->str().c_str(), ns_text(r->best_ns).c_str());
}

}  // namespace

void add_tune(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("tune", "Tune a kernel on seeded random inputs and store the choice");
  auto a = std::make_shared<TuneArgs>();
  cmd->add_option("spec", a->spec, "The kernel's spec file (.toml)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", a->sets, "A scalar argument's value, NAME=VALUE (each scalar needs one)");
  cmd->add_flag("--json", a->json, "Print one JSON object (see docs/cli.md)");
  cmd->add_option("--search", a->search, "exhaustive or coordesc (default: the spec's, else exhaustive)")
      ->check(CLI::IsMember({"exhaustive", "coordesc"}));
  cmd->add_flag("--force", a->force, "Tune again even when a record exists");
  cmd->add_option("--seed", a->seed, "Seed of the random inputs")->capture_default_str();
  cmd->add_option("--max-configs", a->max_configs, "Benchmark at most this many configs (default: KILN_TUNE_MAX_CONFIGS)");
  cmd->callback([&g, a] { run_tune(g, *a); });

  auto* rep = app.add_subcommand("report", "Print a stored tuning record as a table; runs nothing");
  auto spec = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  rep->add_option("spec", *spec, "The kernel's spec file (.toml)")->required()->check(CLI::ExistingFile);
  rep->add_option("--set", *sets, "A tuning-key value, NAME=VALUE");
  rep->add_flag("--json", *json, "Print one JSON object");
  rep->callback([spec, sets, json] { run_report(*spec, *sets, *json); });
}

}  // namespace kiln::cli
