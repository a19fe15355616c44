// kiln plan: a dispatch plan from measurements, and its evaluation on shapes
// it never saw (docs/plan.md).
#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "backends/serialize.hpp"
#include "commands.hpp"
#include "compile/compile_pool.hpp"
#include "core/format.hpp"
#include "kiln/device_args.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/plan.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

using Shape = std::vector<std::pair<std::string, std::string>>;

struct PlanArgs {
  std::string spec, shapes, eval;
  std::vector<std::string> grid;
  double slack = 1.05;
  int max_configs = 8;
  bool json = false;
  bool no_library = false;
  uint64_t seed = 1;
};

// "M=64 N=128 K=4096" (spaces or commas between), one shape per line; # comments. Lines end
// in LF, CRLF or CR; a UTF-8 byte-order mark is skipped. Each line's values are read as the
// spec's scalars here, so a bad one is named by its line; a line given twice counts once.
std::vector<Shape> read_shapes(const std::string& file, const KernelSpec& spec) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(Errc::usage, "cannot read the shapes file {}", file);
  std::string text;  // read in pieces, so that /dev/zero is refused rather than read forever
  char piece[1 << 16];
  while (in.read(piece, sizeof piece) || in.gcount() > 0) {
    text.append(piece, static_cast<size_t>(in.gcount()));
    if (text.size() > (size_t{64} << 20))
      fail(Errc::usage, "{}: more than 64 MiB; a shapes file holds lines of NAME=VALUE", file);
  }
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  std::vector<Shape> out;
  std::set<std::string> seen;
  int no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find_first_of("\r\n", at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + (end < text.size() && text[end] == '\r' && end + 1 < text.size() && text[end + 1] == '\n' ? 2 : 1);
    ++no;
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    for (char& c : line) {
      if (c == ',' || c == '\t') c = ' ';
      // A NUL (or another control byte) would cut the messages that quote the line short.
      if (static_cast<unsigned char>(c) < 0x20)
        fail(Errc::usage, "{}:{}: byte {} (0x{:02x}) is not text: a shapes file holds NAME=VALUE lines", file, no,
             &c - line.data() + 1, static_cast<unsigned char>(c));
    }
    std::istringstream ls(line);
    std::string tok;
    Shape s;
    while (ls >> tok) {
      auto eq = tok.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == tok.size())
        fail(Errc::usage, "{}:{}: '{}' is not NAME=VALUE", file, no, tok);
      s.push_back({tok.substr(0, eq), tok.substr(eq + 1)});
    }
    if (s.empty()) continue;
    try {
      parse_scalars(spec, s);
    } catch (const Error& e) {
      fail(Errc::usage, "{}:{}: {}", file, no, e.what());
    }
    if (seen.insert(canonical_shape(s)).second) out.push_back(std::move(s));
  }
  if (out.empty()) fail(Errc::usage, "{} holds no shapes", file);
  return out;
}

// NAME=LO:HI:COUNT for each dimension: COUNT values from LO to HI evenly
// spaced on a log2 scale (rounded); every combination.
std::vector<Shape> grid_shapes(const std::vector<std::string>& dims) {
  std::vector<Shape> out{Shape{}};
  for (const auto& d : dims) {
    long long lo = 0, hi = 0, n = 0;
    auto eq = d.find('=');
    // Three whole numbers and nothing else: "2.5" or "8k" is refused, not read as 2 or 8.
    bool ok = eq != std::string::npos && eq > 0;
    if (ok) {
      const char* p = d.c_str() + eq + 1;
      const char* end = d.c_str() + d.size();
      long long* fields[] = {&lo, &hi, &n};
      for (int i = 0; i < 3 && ok; ++i) {
        auto [q, ec] = std::from_chars(p, end, *fields[i]);
        ok = ec == std::errc() && q != p && (i == 2 ? q == end : q < end && *q == ':');
        p = q + 1;
      }
    }
    if (!ok || lo < 1 || hi < lo || n < 1 || n > 64)
      fail(Errc::usage, "--grid {}: write NAME=LO:HI:COUNT, whole numbers (1 <= LO <= HI, 1 <= COUNT <= 64)", d);
    std::string name = d.substr(0, eq);
    std::vector<int64_t> values;
    for (long long i = 0; i < n; ++i) {
      double l = n == 1 ? std::log2(double(lo)) : std::log2(double(lo)) + i * (std::log2(double(hi)) - std::log2(double(lo))) / double(n - 1);
      // Kept within [LO, HI]: near 2^63 the rounded power would not fit an int64_t.
      const double r = std::exp2(l);
      int64_t v = r >= static_cast<double>(hi) ? hi : r <= static_cast<double>(lo) ? lo : std::llround(r);
      if (values.empty() || values.back() != v) values.push_back(v);
    }
    std::vector<Shape> next;
    for (const auto& s : out)
      for (int64_t v : values) {
        Shape x = s;
        x.push_back({name, std::to_string(v)});
        next.push_back(std::move(x));
      }
    out = std::move(next);
  }
  return out;
}

std::string shape_text(const Shape& s) {
  std::string t;
  for (const auto& [n, v] : s) t += (t.empty() ? "" : " ") + n + "=" + v;
  return t;
}

// Tunes `spec` at a shape, exhaustively (through the caches).
// Tunes `spec` at a shape, exhaustively (through the caches), on seeded
// random inputs; the inputs come back with the outcome.
struct Tuned {
  TuneOutcome outcome;
  std::unique_ptr<DeviceArgs> args;
};
Tuned tune_at(Runtime& rt, const KernelSpec& spec, const Shape& shape, uint64_t seed, bool libraries) {
  auto args = std::make_unique<DeviceArgs>(spec, parse_scalars(spec, shape), rt.backend(spec.backend).device());
  args->fill_random(seed);
  TuneOptions to;
  to.remeasure_noisy = true;
  to.search = SearchKind::exhaustive;
  to.libraries = libraries;
  TuneOutcome o = rt.tune(spec, args->params(), to);
  if (!o.choice) fail(Errc::tune, "{}", o.record.all_failed_message());
  return {std::move(o), std::move(args)};
}

std::vector<int64_t> key_values(const KernelSpec& spec, const Shape& s) {
  std::vector<int64_t> out;
  for (const auto& k : spec.tuning.key) {
    auto it = std::find_if(s.begin(), s.end(), [&](const auto& p) { return p.first == k; });
    if (it == s.end()) fail(Errc::usage, "shape '{}' gives no value for the tuning key '{}'", shape_text(s), k);
    out.push_back(std::stoll(it->second));
  }
  return out;
}

void run_plan(Globals& g, const PlanArgs& a) {
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  Runtime rt(opts);
  KernelSpec spec = load_spec(a.spec);
  // Templates only: the plan's configs come from the spec without its library choices.
  KernelSpec pspec = spec;
  if (a.no_library) pspec.libraries.clear();
  if (spec.tuning.key.empty()) fail(Errc::usage, "kernel '{}' has no tuning key: a plan maps key values to configs", spec.name);
  Backend& be = rt.backend(spec.backend);
  const LaunchLimits limits = be.limits();
  auto cache = rt.tuning_cache();
  if (!cache) fail(Errc::usage, "kiln plan stores its plan in the tuning cache; KILN_NO_CACHE is set");
  TuningKey base = plan_base_key(spec, be);
  json j = {{"kernel", spec.name}, {"backend", spec.backend}, {"device", be.device_identity()}};
  Legend legend;
  auto t0 = std::chrono::steady_clock::now();

  // Both files are read (and their values checked) before anything is tuned.
  std::vector<Shape> train, eval_shapes;
  if (!a.shapes.empty()) train = read_shapes(a.shapes, spec);
  if (!a.eval.empty()) eval_shapes = read_shapes(a.eval, spec);
  if (!a.grid.empty()) {
    std::set<std::string> seen;
    for (const auto& t : train) seen.insert(canonical_shape(t));
    for (auto& gs : grid_shapes(a.grid))
      if (seen.insert(canonical_shape(gs)).second) train.push_back(std::move(gs));  // a shape of the file too: once
  }
  std::optional<DispatchPlan> plan;
  if (!train.empty()) {
    std::vector<TuningRecord> records;
    size_t tuned = 0;
    for (size_t i = 0; i < train.size(); ++i) {
      TuneOutcome o = tune_at(rt, spec, train[i], a.seed, !a.no_library).outcome;
      tuned += !o.from_cache;
      if (!opts.quiet)
        std::fprintf(stderr, "[%zu/%zu] %s: %s (%s)\n", i + 1, train.size(), shape_text(train[i]).c_str(),
                     o.choice->str().c_str(), o.from_cache ? "cached" : "tuned");
      records.push_back(std::move(o.record));
    }
    plan = build_plan(pspec, base, records, a.slack, a.max_configs);
    cache->put_plan(base, plan_to_text(*plan));
    // Records timed on a busy machine (flagged noisy) are shown as such: a plan made from them is no better than they are.
    std::map<std::vector<int64_t>, bool> noisy;
    size_t noisy_count = 0;
    for (const auto& r : records) {
      std::vector<int64_t> v;
      for (const auto& [n, x] : r.key.values) v.push_back(x);
      noisy[v] = r.noisy;
      noisy_count += r.noisy;
    }
    std::vector<double> ratios;
    Table t({"training shape", "best", "plan's", "plan / best", "timings"}, {false, true, true, true, false});
    json pts = json::array();
    for (const auto& p : plan->points) {
      std::string s;
      for (size_t k = 0; k < p.values.size(); ++k) s += fmt::format("{}{}={}", k ? " " : "", spec.tuning.key[k], p.values[k]);
      double r = p.best_ns > 0 ? p.pick_ns / p.best_ns : 1;
      ratios.push_back(r);
      const bool flagged = noisy[p.values];
      t.row({s, ms_text(p.best_ns / 1e6), legend.name(plan->configs[p.config]), fmt::format("{:.3f}x", r),
             flagged ? "noisy" : ""});
      pts.push_back({{"shape", s}, {"config", plan->configs[p.config].str()}, {"ratio", r}, {"noisy", flagged}});
    }
    j["noisy_records"] = noisy_count;
    double worst = ratios.empty() ? 1 : *std::max_element(ratios.begin(), ratios.end());
    j["training"] = {{"shapes", train.size()}, {"tuned_now", tuned}, {"points", pts},
                     {"geomean", geomean(ratios)}, {"worst", worst}};
    if (!a.json) {
      std::fprintf(out(), "kiln plan: %s on %s, %zu training shapes (%zu tuned now, the rest from the caches)\n",
                   spec.name.c_str(), be.device_identity().c_str(), train.size(), tuned);
      std::fprintf(out(), "kept %zu of the configs (at most %d), each training shape within %.2fx of its best%s\n",
                   plan->kept, a.max_configs, a.slack,
                   plan->uncovered.empty() ? "" : fmt::format(" but {}", plan->uncovered.size()).c_str());
      std::fprintf(out(), "%s", t.str().c_str());
      std::fprintf(out(), "training: plan / best geomean %.3fx, worst %.3fx (ms: best of all configs, timed while tuning)\n",
                   geomean(ratios), worst);
      if (noisy_count)
        std::fprintf(out(), "%zu of the %zu training records were timed on a busy machine (flagged noisy): run kiln "
                            "plan again when it is quieter, which re-measures them\n",
                     noisy_count, records.size());
    }
  } else {
    auto text = cache->get_plan(base);
    if (text) plan = plan_from_text(*text, base, pspec);
    if (!plan)
      fail(Errc::usage, "no valid plan for kernel '{}' on this device: give training shapes (--shapes FILE or --grid)",
           spec.name);
  }
  json cfgs = json::array();
  for (size_t i = 0; i < plan->kept; ++i) cfgs.push_back(plan->configs[i].str());
  j["configs"] = cfgs;
  j["fallbacks"] = plan->configs.size() - plan->kept;
  j["slack"] = a.slack;

  if (!a.eval.empty()) {
    // The hint-based pick, for comparison: the spec's hints tuned (through the caches).
    std::vector<std::pair<std::vector<int64_t>, Config>> hints;
    DispatchPlan hint_rule;
    for (const auto& pt : spec.tuning.hint_point_list()) {
      Shape s;
      for (size_t k = 0; k < pt.size(); ++k) s.push_back({spec.tuning.key[k], std::to_string(pt[k])});
      TuneOutcome o = tune_at(rt, spec, s, a.seed, !a.no_library).outcome;
      hint_rule.configs.push_back(*o.choice);
      hint_rule.points.push_back({pt, hint_rule.configs.size() - 1, 0, 0, {}});
      hint_rule.kept = hint_rule.configs.size();
    }
    const std::vector<Shape>& eval = eval_shapes;
    std::vector<double> rp, rh;
    Table t({"evaluation shape", "oracle ms", "oracle", "plan", "plan / oracle", "hint", "hint / oracle", "timings"},
            {false, true, true, true, true, true, true, false});
    json rows = json::array();
    for (size_t i = 0; i < eval.size(); ++i) {
      Tuned tuned = tune_at(rt, spec, eval[i], a.seed + 1, !a.no_library);
      const TuneOutcome& o = tuned.outcome;
      DeviceArgs* args = tuned.args.get();
      std::vector<int64_t> slots(spec.args.size());
      read_int_slots(spec, args->params(), slots.data());
      std::vector<int64_t> vals = key_values(spec, eval[i]);
      std::optional<Config> pp = plan->pick(pspec, vals, slots.data(), limits);
      // The size-hint multi-kernel's rule: the nearest hint point whose config can run the call.
      std::optional<Config> hp;
      for (size_t h : hint_rule.by_distance(vals))
        if (Tuner::why_not(spec, hint_rule.configs[hint_rule.points[h].config], slots.data(), limits).empty()) {
          hp = hint_rule.configs[hint_rule.points[h].config];
          break;
        }
      if (!pp) fail(Errc::tune, "the plan has no config that can run {}", shape_text(eval[i]));
      std::vector<Config> cs{*o.choice, *pp};
      if (hp) cs.push_back(*hp);
      std::vector<double> ms = time_side_by_side(rt, spec, cs, *args);
      double r1 = ms[1] / ms[0], r2 = hp ? ms[2] / ms[0] : 0;
      rp.push_back(r1);
      if (hp) rh.push_back(r2);
      t.row({shape_text(eval[i]), ms_text(ms[0]), legend.name(*o.choice), legend.name(*pp), fmt::format("{:.3f}x", r1),
             hp ? legend.name(*hp) : "-", hp ? fmt::format("{:.3f}x", r2) : "-", o.record.noisy ? "noisy" : ""});
      rows.push_back({{"shape", shape_text(eval[i])}, {"oracle", o.choice->str()}, {"oracle_ms", ms[0]},
                      {"plan", pp->str()}, {"plan_ms", ms[1]}, {"plan_ratio", r1},
                      {"hint", hp ? json(hp->str()) : json(nullptr)}, {"hint_ms", hp ? json(ms[2]) : json(nullptr)},
                      {"hint_ratio", hp ? json(r2) : json(nullptr)}, {"noisy", o.record.noisy}});
      if (!opts.quiet && !a.json)
        std::fprintf(stderr, "[eval %zu/%zu] %s: plan %.3fx\n", i + 1, eval.size(), shape_text(eval[i]).c_str(), r1);
    }
    double wp = *std::max_element(rp.begin(), rp.end());
    double wh = rh.empty() ? 0 : *std::max_element(rh.begin(), rh.end());
    j["eval"] = {{"shapes", rows}, {"plan_geomean", geomean(rp)}, {"plan_worst", wp},
                 {"hint_geomean", rh.empty() ? json(nullptr) : json(geomean(rh))},
                 {"hint_worst", rh.empty() ? json(nullptr) : json(wh)}};
    if (!a.json) {
      std::fprintf(out(), "\nevaluation on %zu shapes (each tuned exactly: the oracle; timed side by side)\n", eval.size());
      std::fprintf(out(), "%s", t.str().c_str());
      std::fprintf(out(), "plan / oracle: geomean %.3fx, worst %.3fx\n", geomean(rp), wp);
      if (!rh.empty()) std::fprintf(out(), "hint / oracle: geomean %.3fx, worst %.3fx  (the spec's size hints, nearest)\n", geomean(rh), wh);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  j["seconds"] = secs;
  if (a.json) {
    std::fprintf(out(), "%s\n", j.dump(2).c_str());
    return;
  }
  std::fprintf(out(), "configs:\n");
  for (size_t i = 0; i < legend.configs.size(); ++i)
    std::fprintf(out(), "  c%zu: %s\n", i + 1, legend.configs[i].str().c_str());
  std::fprintf(out(), "plan stored for this device; done in %s\n", seconds_text(secs).c_str());
}

}  // namespace

void add_plan(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("plan", "Make a dispatch plan from measurements at training shapes, and evaluate it "
                                         "on shapes it never saw");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("spec", a->spec, "The kernel's spec file (.toml; file.toml:member for a family's member)")->required()->check(SpecFile);
  cmd->add_option("--shapes", a->shapes, "Training shapes: a file, one NAME=VALUE ... line per shape")
      ->check(CLI::ExistingFile);
  cmd->add_option("--grid", a->grid, "Training shapes on a log2 grid: NAME=LO:HI:COUNT, once per dimension")
      ->allow_extra_args(false);  // one value an occurrence: a spec file after it is not taken as one
  cmd->add_option("--slack", a->slack, "Every training shape gets a kept config within this factor of its best")
      ->check(Finite & CLI::Range(1.0, 10.0))
      ->capture_default_str();
  cmd->add_option("--max-configs", a->max_configs, "Keep at most this many configs")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--eval", a->eval,
                  "Evaluation shapes (a file like --shapes): the plan's pick and the hint-based pick against tuning "
                  "each exactly")
      ->check(CLI::ExistingFile);
  cmd->add_option("--seed", a->seed, "Seed of the random inputs")->check(Seed)->capture_default_str();
  cmd->add_flag("--no-library", a->no_library, "Leave the spec's library choices out: a plan over templates only");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([&g, a] { run_plan(g, *a); });
}

}  // namespace kiln::cli
