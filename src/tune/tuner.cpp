#include "kiln/tuner.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "tune/benchmarker.hpp"

namespace kiln {

double Tuner::default_rtol(DType t) {
  switch (t) {
    case DType::f32: return 1e-4;
    case DType::f64: return 1e-10;
    default: return 0;
  }
}

// Applied as atol * max(1, max |reference|) unless the spec sets atol: fp
// sums over long rows differ by rounding in proportion to their magnitude.
double Tuner::default_atol(DType t) {
  switch (t) {
    case DType::f32: return 1e-5;
    case DType::f64: return 1e-12;
    default: return 0;
  }
}

namespace {

template <class T>
std::optional<std::string> compare_typed(const T* got, const T* ref, size_t n, double rtol, double atol,
                                         bool scale_atol) {
  double tol_abs = atol;
  if (scale_atol) {
    double m = 1;
    for (size_t i = 0; i < n; ++i)
      if (std::isfinite(static_cast<double>(ref[i]))) m = std::max(m, std::abs(static_cast<double>(ref[i])));
    tol_abs = atol * m;
  }
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    if (std::isnan(g) && std::isnan(r)) continue;
    double err = (std::isnan(g) || std::isnan(r)) ? INFINITY : std::abs(g - r);
    if (!(err <= tol_abs + rtol * std::abs(r))) {
      ++bad;
      if (!(err <= worst)) {
        worst = err;
        worst_i = i;
      }
    }
  }
  if (!bad) return std::nullopt;
  return fmt::format("max error {:g} at element {} (got {:g}, reference {:g}; {} of {} elements outside "
                     "atol {:g} + rtol {:g})",
                     worst, worst_i, static_cast<double>(got[worst_i]), static_cast<double>(ref[worst_i]), bad, n,
                     tol_abs, rtol);
}

}  // namespace

std::optional<std::string> Tuner::compare(DType dtype, std::span<const std::byte> got, std::span<const std::byte> ref,
                                          const TuningSpec& ts) {
  size_t n = got.size() / dtype_size(dtype);
  double rtol = ts.rtol >= 0 ? ts.rtol : default_rtol(dtype);
  double atol = ts.atol >= 0 ? ts.atol : default_atol(dtype);
  bool scale = ts.atol < 0;
  switch (dtype) {
    case DType::f32:
      return compare_typed(reinterpret_cast<const float*>(got.data()), reinterpret_cast<const float*>(ref.data()), n,
                           rtol, atol, scale);
    case DType::f64:
      return compare_typed(reinterpret_cast<const double*>(got.data()), reinterpret_cast<const double*>(ref.data()),
                           n, rtol, atol, scale);
    case DType::i32:
      return compare_typed(reinterpret_cast<const int32_t*>(got.data()), reinterpret_cast<const int32_t*>(ref.data()),
                           n, rtol, atol, false);
    case DType::i64:
      return compare_typed(reinterpret_cast<const int64_t*>(got.data()), reinterpret_cast<const int64_t*>(ref.data()),
                           n, rtol, atol, false);
  }
  return std::nullopt;
}

namespace {

double log2_distance(const std::vector<std::pair<std::string, int64_t>>& a,
                     const std::vector<std::pair<std::string, int64_t>>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d += std::abs(std::log2(static_cast<double>(std::max<int64_t>(a[i].second, 1))) -
                  std::log2(static_cast<double>(std::max<int64_t>(b[i].second, 1))));
  return d;
}

class Session {
 public:
  Session(Tuner::Parts& p, const KernelSpec& spec, void* const* params, bool show)
      : p_(p), spec_(spec), arena_(spec, params), slots_(spec.args.size(), 0), show_(show) {
    read_int_slots(spec, params, slots_.data());
  }

  // Why a config cannot run for this call, or "" if it can.
  std::string pruned(const Config& c) {
    try {
      for (const auto& e : spec_.constraints)
        if (compile_expr(spec_, e, &c).eval(slots_.data()) == 0) return fmt::format("constraint '{}' is false", e.str());
      Grid g = GridPlan(spec_, c).eval(slots_.data());
      if (g.x <= 0 || g.y <= 0 || g.z <= 0) return fmt::format("empty grid ({}, {}, {})", g.x, g.y, g.z);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  BinaryFuture compile(const Config& c) { return p_.compiler->submit(make_compile_request(spec_, c)); }

  // Re-times configs that ran and agreed, in interleaved rounds, so that
  // the machine's drift over time falls on all of them alike; each one's
  // time becomes the median of its samples from these rounds.
  void refine(std::vector<ConfigResult*> contenders, int rounds) {
    BenchSettings st = p_.bench->settings();
    st.check = false;
    st.budget_ms = st.budget_ms / 2;
    std::vector<std::vector<double>> samples(contenders.size());
    std::vector<std::shared_ptr<const Binary>> bins;
    std::vector<std::shared_ptr<LoadedKernel>> loaded;
    for (ConfigResult* c : contenders) {
      bins.push_back(compile(c->config).get());
      loaded.push_back(p_.bench->in_process() ? p_.load(*bins.back()) : nullptr);
    }
    ProgressBar bar(fmt::format("re-timing the {} fastest of {}", contenders.size(), spec_.name),
                    contenders.size() * rounds, show_);
    size_t done = 0;
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < contenders.size(); ++i) {
        std::string what = fmt::format("kernel '{}' (config {})", spec_.name, contenders[i]->config.str());
        BenchResult r = p_.bench->run(*bins[i], loaded[i].get(), arena_,
                                      GridPlan(spec_, contenders[i]->config).eval(slots_.data()), what, st);
        samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
        bar.set(++done);
      }
    }
    for (size_t i = 0; i < contenders.size(); ++i) {
      BenchResult r = summarize(std::move(samples[i]));
      contenders[i]->ns = r.median_ns;
      contenders[i]->min_ns = r.min_ns;
      contenders[i]->max_ns = r.max_ns;
      contenders[i]->reps = static_cast<int>(r.ns.size());
    }
  }

  // Compiles (already submitted), benchmarks, checks against the reference.
  ConfigResult evaluate(const Config& c, const BinaryFuture& f) {
    ConfigResult r;
    r.config = c;
    std::string what = fmt::format("kernel '{}' (config {})", spec_.name, c.str());
    std::shared_ptr<const Binary> bin;
    try {
      bin = f.get();
    } catch (const Error& e) {
      r.error = e.what();
      r.error_kind = "compile";
      return r;
    }
    BenchResult res;
    try {
      std::shared_ptr<LoadedKernel> loaded;
      if (!p_.bench->in_process()) {
        // benchmarked in a worker, which loads the bytes itself
      } else {
        loaded = p_.load(*bin);
      }
      res = p_.bench->run(*bin, loaded.get(), arena_, GridPlan(spec_, c).eval(slots_.data()), what);
    } catch (const Error& e) {
      r.error = e.what();
      std::string m = e.what();
      r.error_kind = e.code() == Errc::worker ? (m.find("timed out") != std::string::npos ? "timeout" : "crash")
                                              : "launch";
      return r;
    }
    r.ns = res.median_ns;
    r.min_ns = res.min_ns;
    r.max_ns = res.max_ns;
    r.reps = static_cast<int>(res.ns.size());
    if (!have_ref_) {
      // The first config that runs is the reference (the spec's, when it names one, runs first).
      for (size_t i = 0; i < spec_.args.size(); ++i) {
        auto out = arena_.result(i);
        ref_.emplace_back(out.begin(), out.end());
      }
      have_ref_ = true;
      reference_ = c.str();
      return r;
    }
    for (size_t i = 0; i < spec_.args.size(); ++i) {
      auto out = arena_.result(i);
      if (out.empty()) continue;
      if (auto bad = Tuner::compare(spec_.args[i].dtype, out, ref_[i], spec_.tuning)) {
        r.error = fmt::format("wrong result in '{}' against the reference config {}: {}", spec_.args[i].name,
                              reference_, *bad);
        r.error_kind = "wrong";
        r.ns.reset();
        return r;
      }
    }
    return r;
  }

  const std::string& reference() const { return reference_; }
  bool show() const { return show_; }

 private:
  Tuner::Parts& p_;
  const KernelSpec& spec_;
  BenchArena arena_;
  std::vector<int64_t> slots_;
  bool show_;
  bool have_ref_ = false;
  std::vector<std::vector<std::byte>> ref_;
  std::string reference_;
};

}  // namespace

TuneOutcome Tuner::tune(const KernelSpec& spec, void* const* params, const TuneOptions& o) {
  TuningKey key = make_tuning_key(spec, p_.backend->device_identity(), params);
  if (p_.cache && !o.force)
    if (auto r = p_.cache->get(key, spec.space)) return {std::move(*r), true};

  SearchKind search = o.search.value_or(spec.tuning.search);
  int cap = o.max_configs > 0 ? o.max_configs : p_.opts.tune_max_configs;
  Session s(p_, spec, params, o.show_progress);
  TuningRecord rec;
  rec.kernel = spec.name;
  rec.key = key;
  rec.method = search == SearchKind::exhaustive ? "exhaustive" : "coordesc";

  const size_t n = spec.space.size();
  std::vector<std::string> prune(n);
  std::vector<size_t> runnable;
  for (size_t i = 0; i < n; ++i) {
    prune[i] = s.pruned(spec.space.at(i));
    if (prune[i].empty()) runnable.push_back(i);
  }
  std::map<size_t, ConfigResult> done;
  auto budget_left = [&] { return cap <= 0 || static_cast<int>(done.size()) < cap; };
  // The spec's reference config runs first, so the others are compared with it.
  constexpr size_t none = static_cast<size_t>(-1);
  size_t ref = none;
  if (spec.tuning.reference_config) ref = spec.space.index_of(*spec.tuning.reference_config).value_or(none);
  if (ref != none && !prune[ref].empty()) {
    log::warn("kernel '{}': the reference config {} cannot run at {} ({}); the first config that runs is the "
              "reference instead",
              spec.name, spec.space.at(ref).str(), key.values_text(), prune[ref]);
    ref = none;
  }
  log::info("tuning kernel '{}' at {}: {} configs, {} pruned, {} search", spec.name, key.values_text(), n,
            n - runnable.size(), rec.method);

  // Evaluates a batch: compiles in parallel, then benchmarks one at a time.
  auto run_batch = [&](std::vector<size_t> batch, const char* what) {
    std::vector<size_t> todo;
    for (size_t i : batch)
      if (!done.count(i) && prune[i].empty() && (cap <= 0 || static_cast<int>(done.size() + todo.size()) < cap))
        todo.push_back(i);
    std::vector<BinaryFuture> fs;
    for (size_t i : todo) fs.push_back(s.compile(spec.space.at(i)));
    wait_all(fs, fmt::format("compiling {} {}", spec.name, what), s.show());
    ProgressBar bar(fmt::format("benchmarking {} {}", spec.name, what), todo.size(), s.show());
    for (size_t k = 0; k < todo.size(); ++k) {
      done[todo[k]] = s.evaluate(spec.space.at(todo[k]), fs[k]);
      bar.set(k + 1);
    }
    return todo;
  };

  if (ref != none) run_batch({ref}, "reference");
  if (search == SearchKind::exhaustive) {
    run_batch(runnable, "configs");
  } else {
    // Start: the spec's default, else the best of the nearest cached key, else the first config that runs.
    std::optional<size_t> start;
    if (spec.tuning.default_config) {
      start = spec.space.index_of(*spec.tuning.default_config);
      rec.start = "the spec's default";
    }
    if (!start || !prune[*start].empty()) {
      start.reset();
      if (p_.cache) {
        double best_d = INFINITY;
        for (const auto& r : p_.cache->all(key, spec.space)) {
          if (!r.best || r.key.values == key.values) continue;
          double d = log2_distance(r.key.values, key.values);
          auto idx = spec.space.index_of(*r.best);
          if (idx && prune[*idx].empty() && d < best_d) {
            best_d = d;
            start = idx;
            rec.start = "the best of the nearest cached key, " + r.key.values_text();
          }
        }
      }
    }
    std::optional<size_t> cur;
    if (start) {
      run_batch({*start}, "start");
      if (done[*start].ns) cur = start;
    }
    for (size_t i : runnable) {  // no usable start: walk the space until a config runs
      if (cur || !budget_left()) break;
      run_batch({i}, "start");
      if (done[i].ns) {
        cur = i;
        rec.start = "the first config that runs";
      }
    }
    if (cur) rec.start = spec.space.at(*cur).str() + " (" + rec.start + ")";
    while (cur && budget_left()) {
      std::vector<size_t> nb;
      Config c = spec.space.at(*cur);
      for (size_t p = 0; p < spec.space.params.size(); ++p) {
        const auto& vals = spec.space.params[p].values;
        size_t at = std::find(vals.begin(), vals.end(), c.values[p].second) - vals.begin();
        for (int step : {-1, 1}) {
          if ((step < 0 && at == 0) || at + step >= vals.size()) continue;
          Config x = c;
          x.values[p].second = vals[at + step];
          nb.push_back(*spec.space.index_of(x));
        }
      }
      std::vector<size_t> ran = run_batch(nb, "neighbours");
      std::optional<size_t> best;
      for (size_t i : ran)
        if (done[i].ns && (!best || *done[i].ns < *done[*best].ns)) best = i;
      if (!best || !(*done[*best].ns < *done[*cur].ns * 0.99)) break;  // a 1% gain to move
      cur = best;
    }
  }

  // The contenders (within 15% of the fastest, at most 4) are re-timed side by side.
  {
    std::vector<ConfigResult*> ok;
    for (auto& [i, r] : done)
      if (r.ns && r.error.empty()) ok.push_back(&r);
    std::sort(ok.begin(), ok.end(), [](auto* a, auto* b) { return *a->ns < *b->ns; });
    std::vector<ConfigResult*> contenders;
    for (ConfigResult* r : ok)
      if (contenders.size() < 4 && *r->ns <= *ok[0]->ns * 1.15) contenders.push_back(r);
    if (contenders.size() > 1) {
      try {
        s.refine(contenders, 4);
      } catch (const Error& e) {
        log::warn("kernel '{}': re-timing the fastest configs failed ({}); keeping the first timings", spec.name,
                  e.what());
      }
    }
  }

  for (size_t i = 0; i < n; ++i) {
    if (!prune[i].empty()) {
      ConfigResult r;
      r.config = spec.space.at(i);
      r.error = "pruned: " + prune[i];
      r.error_kind = "pruned";
      rec.configs.push_back(std::move(r));
    } else if (done.count(i)) {
      rec.configs.push_back(done[i]);
    }
  }
  rec.reference = s.reference();
  auto ranked = rec.ranked();
  if (!ranked.empty()) {
    rec.best = ranked[0]->config;
    rec.best_ns = *ranked[0]->ns;
  }
  rec.kiln_version = kiln_version();
  rec.when = utc_now();
  if (p_.cache) p_.cache->put(rec);
  return {std::move(rec), false};
}

}  // namespace kiln
