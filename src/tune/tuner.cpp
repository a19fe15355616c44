#include "compile/compile_pool.hpp"
#include "kiln/ext/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/hash.hpp"
#include "tune/benchmarker.hpp"
#include "tune/record_io.hpp"
#include "tune/search.hpp"

namespace kiln {

using Clock = std::chrono::steady_clock;

double Tuner::default_rtol(DType t) {
  switch (t) {
    case DType::f32: return 1e-4;
    case DType::f64: return 1e-10;
    case DType::f16: return 1e-2;
    case DType::bf16: return 5e-2;
    default: return 0;
  }
}

// Applied as atol * max(1, max |reference|) unless the spec sets atol: fp
// sums over long rows differ by rounding in proportion to their magnitude.
double Tuner::default_atol(DType t) {
  switch (t) {
    case DType::f32: return 1e-5;
    case DType::f64: return 1e-12;
    case DType::f16: return 1e-3;
    case DType::bf16: return 1e-2;
    default: return 0;
  }
}

namespace {

template <class T>
double as_double(const T* p, size_t i, DType t) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return t == DType::f16 ? f16_bits_to_f32(p[i]) : bf16_bits_to_f32(p[i]);
  else
    return static_cast<double>(p[i]);
}

template <class T>
std::optional<std::string> compare_typed(DType t, const T* got, const T* ref, size_t n, const TuningSpec& ts,
                                         int64_t reduction) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    double r = as_double(ref, i, t);
    if (std::isfinite(r)) m = std::max(m, std::abs(r));
  }
  const Tuner::Tolerance tol = Tuner::tolerance(t, ts, reduction, m);
  const double rtol = tol.rtol, tol_abs = tol.atol;
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double g = as_double(got, i, t), r = as_double(ref, i, t);
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
                     worst, worst_i, as_double(got, worst_i, t), as_double(ref, worst_i, t), bad, n, tol_abs, rtol);
}

}  // namespace

Tuner::Tolerance Tuner::tolerance(DType dtype, const TuningSpec& ts, int64_t reduction, double max_abs_ref) {
  double rtol = ts.rtol >= 0 ? ts.rtol : default_rtol(dtype);
  double atol = ts.atol >= 0 ? ts.atol : default_atol(dtype);
  if (reduction > 0 && (dtype == DType::f16 || dtype == DType::bf16)) {
    // Sums of `reduction` products accumulated in fp32, then rounded to a
    // 16-bit output, compared with another such sum: each side rounds once
    // to the output (u = 2^-8 bf16, 2^-11 f16), so rtol = 2u; and sums in
    // another order differ by about sqrt(reduction) roundings of the
    // partial sums (fp32 accumulators; a split reduction adds its partials
    // in fp32 too), which is what matters where a sum cancels to near zero:
    // atol = u * max|ref| * max(1, sqrt(reduction) / 16) (one output unit of
    // the largest value up to 256 terms, 8 at 16384).
    const double u = dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    if (ts.rtol < 0) rtol = 2 * u;
    if (ts.atol < 0) atol = u * std::max(1.0, std::sqrt(static_cast<double>(reduction)) / 16);
  }
  // A given atol is absolute; a default one scales with the reference's
  // magnitude (fp sums over long rows differ by rounding in proportion to it).
  const bool integer = dtype == DType::i32 || dtype == DType::i64;
  if (ts.atol < 0 && !integer) atol *= std::max(1.0, max_abs_ref);
  return {rtol, atol};
}

std::optional<std::string> Tuner::compare(DType dtype, std::span<const std::byte> got, std::span<const std::byte> ref,
                                          const TuningSpec& ts, int64_t reduction) {
  size_t n = got.size() / dtype_size(dtype);
  auto cast = [](auto* dummy, std::span<const std::byte> s) {
    return reinterpret_cast<const std::remove_pointer_t<decltype(dummy)>*>(s.data());
  };
  switch (dtype) {
    case DType::f32: return compare_typed(dtype, cast((float*)nullptr, got), cast((float*)nullptr, ref), n, ts, reduction);
    case DType::f64: return compare_typed(dtype, cast((double*)nullptr, got), cast((double*)nullptr, ref), n, ts, reduction);
    case DType::i32: return compare_typed(dtype, cast((int32_t*)nullptr, got), cast((int32_t*)nullptr, ref), n, ts, reduction);
    case DType::i64: return compare_typed(dtype, cast((int64_t*)nullptr, got), cast((int64_t*)nullptr, ref), n, ts, reduction);
    case DType::f16:
    case DType::bf16:
      return compare_typed(dtype, cast((uint16_t*)nullptr, got), cast((uint16_t*)nullptr, ref), n, ts, reduction);
  }
  return std::nullopt;
}

std::string Tuner::why_not(const KernelSpec& spec, const Config& c, const int64_t* slots, const LaunchLimits& limits) {
  if (!c.library.empty()) return "";
  try {
    for (const auto& e : spec.constraints)
      if (compile_expr(spec, e, &c).eval(slots) == 0) return fmt::format("constraint '{}' is false", e.str());
    LaunchPlan plan(spec, c, limits);
    LaunchDims d = plan.eval(slots);
    if (d.empty()) return fmt::format("empty grid ({}, {}, {})", d.grid.x, d.grid.y, d.grid.z);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::optional<Config> Tuner::choose(const TuningRecord& r, const KernelSpec& spec, const int64_t* slots,
                                    const LaunchLimits& limits) {
  if (!r.verdict.empty()) return std::nullopt;  // the record refused to choose, and says why
  std::vector<const ConfigResult*> cands;
  for (const ConfigResult* c : r.ranked()) {
    // Ranked fastest first: past the tie window of the first candidate, none can be chosen.
    if (!cands.empty() && *c->ns > *cands[0]->ns * (1 + std::min(r.noise, kMaxTieWindow))) break;
    const std::string& lib = c->config.library;
    if (lib.empty() ? !spec.space.index_of(c->config)
                    : std::find(spec.libraries.begin(), spec.libraries.end(), lib) == spec.libraries.end())
      continue;  // no longer in the spec
    if (!why_not(spec, c->config, slots, limits).empty()) continue;
    cands.push_back(c);
  }
  if (cands.empty()) return std::nullopt;
  // Within the window (every candidate is), library choices first (the implementation users
  // trust, and a tuned call is then never slower than the library by more
  // than noise), then the earliest config in the space.
  auto order = [&](const Config& c) -> size_t {
    auto l = std::find(spec.libraries.begin(), spec.libraries.end(), c.library);
    if (!c.library.empty()) return static_cast<size_t>(l - spec.libraries.begin());
    auto i = spec.space.index_of(c);
    return spec.libraries.size() + (i ? *i : spec.space.size());
  };
  const ConfigResult* pick = cands[0];
  for (const ConfigResult* c : cands)
    if (order(c->config) < order(pick->config)) pick = c;
  return pick->config;
}

namespace {

// The relative spread of a set of samples: (p75 - p25) / median.
double spread(std::vector<double> v) {
  if (v.size() < 4) return 0;
  std::sort(v.begin(), v.end());
  double med = v[v.size() / 2];
  return med > 0 ? (v[v.size() * 3 / 4] - v[v.size() / 4]) / med : 0;
}

// One tuning of one key: the call's inputs, compiles, the reference's
// outputs, and the adaptive deadline.
class Session {
 public:
  Session(Tuner::Parts& p, const KernelSpec& spec, void* const* params, const TuneOptions& o)
      : p_(p), spec_(spec), params_(params), inputs_(spec, params, p.backend->device(), p.bench->in_process(), o.stream),
        slots_(spec.args.size(), 0), keyer_(spec, *p.backend), limits_(p.backend->limits()), show_(o.show_progress) {
    read_int_slots(spec, params, slots_.data());
    if (spec.tuning.reduction) reduction_ = compile_expr(spec, *spec.tuning.reduction, nullptr).eval(slots_.data());
  }

  const std::vector<int64_t>& slots() const { return slots_; }
  const LaunchLimits& limits() const { return limits_; }
  const BinaryKeyer& keyer() const { return keyer_; }
  bool show() const { return show_; }
  int64_t peak_device_bytes() const { return peak_device_bytes_; }
  double compile_wait_s() const { return compile_wait_s_; }
  double bench_s() const { return bench_s_; }

  BinaryFuture compile(const Config& c) {
    std::string key = keyer_.hex(c);
    auto it = futures_.find(key);
    if (it != futures_.end()) return it->second;
    if (!c.library.empty()) return futures_[key] = p_.compiler->submit(spec_, c);
    return futures_[key] = p_.compiler->submit(make_compile_request(spec_, c), key);
  }

  LaunchDims dims_of(const Config& c) const {
    return c.library.empty() ? LaunchPlan(spec_, c, limits_).eval(slots_.data()) : LaunchDims{};
  }

  // The deadline of the next benchmark: the ceiling until a config has been
  // timed, then 20 times the wall time the fastest one took, never under the floor.
  double deadline_s() const {
    const double ceiling = p_.opts.bench_timeout_s;
    if (!fastest_wall_s_) return ceiling;
    return std::min(ceiling, std::max(p_.opts.bench_deadline_floor_s, 20 * *fastest_wall_s_));
  }
  std::string deadline_why(double d) const {
    if (!fastest_wall_s_) return "KILN_BENCH_TIMEOUT";
    if (d >= p_.opts.bench_timeout_s) return "KILN_BENCH_TIMEOUT, the ceiling";
    if (d <= p_.opts.bench_deadline_floor_s) return "the floor, KILN_BENCH_DEADLINE_FLOOR";
    return fmt::format("20 times the {:.3g} s the fastest config so far took", *fastest_wall_s_);
  }

  // Benchmarks one config; the caller classifies. Fills `res` or throws.
  BenchResult bench(const Config& c, const BenchSettings& st, double* wall_s) {
    std::shared_ptr<const Binary> bin = compile(c).get();
    LaunchDims dims = dims_of(c);
    std::string what = fmt::format("kernel '{}' (config {})", spec_.name, c.str());
    std::shared_ptr<LoadedKernel> loaded = p_.bench->in_process() ? p_.load(*bin) : nullptr;
    auto t0 = Clock::now();
    BenchResult r = p_.bench->run(*bin, loaded.get(), inputs_, dims, what, st, deadline_s());
    *wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    bench_s_ += *wall_s;
    peak_device_bytes_ = std::max(peak_device_bytes_, r.device_bytes);
    return r;
  }

  // Compiles (already submitted), benchmarks and checks one config.
  // Throws for faults that are not the config's.
  ConfigResult evaluate(const Config& c) {
    ConfigResult r;
    r.config = c;
    r.binary = keyer_.hex(c);
    std::shared_ptr<const Binary> bin;
    auto t_compile = Clock::now();
    struct AddWait {
      double& to;
      Clock::time_point t0;
      ~AddWait() { to += std::chrono::duration<double>(Clock::now() - t0).count(); }
    };
    try {
      AddWait wait{compile_wait_s_, t_compile};
      bin = compile(c).get();
    } catch (const WorkerError& e) {
      if (!e.fault().of_request) throw;
      r.kind = FailKind::compile;  // the compiler crashed or hung on this config, twice
      r.error = e.what();
      return r;
    } catch (const Error& e) {
      if (e.code() != Errc::compile) throw;  // a disk or process failure: not the config's
      r.kind = FailKind::compile;
      r.error = e.what();
      return r;
    }
    LaunchDims dims = dims_of(c);
    if (std::string why = c.library.empty() ? p_.backend->check_resources(bin->meta, dims) : ""; !why.empty()) {
      r.kind = FailKind::pruned;
      r.error = "pruned: " + why;
      return r;
    }
    if (!c.library.empty()) {
      // A library's own rules for the call (sizes it takes, the algorithms its heuristic offers).
      try {
        std::shared_ptr<LoadedKernel> lib = p_.load(*bin);
        if (std::string why = lib->can_implement(params_); !why.empty()) {
          r.kind = FailKind::pruned;
          r.error = "pruned: " + why;
          return r;
        }
        r.detail = lib->describe(params_);
      } catch (const Error& e) {
        if (e.code() != Errc::launch) throw;
        r.kind = FailKind::launch;
        r.error = e.what();
        return r;
      }
    }
    BenchResult res;
    double wall = 0;
    const double deadline = deadline_s();
    try {
      res = bench(c, p_.bench->settings(), &wall);
    } catch (const WorkerError& e) {
      if (!e.fault().of_request) throw;
      if (e.fault().kind == WorkerFault::Kind::timeout) {
        r.kind = FailKind::timeout;
        r.error = fmt::format("ran past its deadline of {:.3g} s ({}); not retried", deadline, deadline_why(deadline));
      } else {
        r.kind = FailKind::crash;
        r.error = e.what();
      }
      return r;
    } catch (const Error& e) {
      if (e.code() != Errc::launch) throw;
      r.kind = FailKind::launch;
      r.error = e.what();
      return r;
    }
    r.ns = res.median_ns;
    r.min_ns = res.min_ns;
    r.max_ns = res.max_ns;
    r.reps = static_cast<int>(res.ns.size());
    samples_[r.binary] = res.ns;
    if (auto bad = unwritten(res)) {
      r.ns.reset();
      r.kind = FailKind::wrong;
      r.error = *bad;
      return r;
    }
    if (!have_ref_) {
      take_reference(c);
    } else if (auto bad = disagrees()) {
      r.ns.reset();
      r.kind = FailKind::wrong;
      r.error = *bad;
      ++disagreed_;
      return r;
    }
    if (!fastest_wall_s_ || wall < *fastest_wall_s_) fastest_wall_s_ = wall;
    return r;
  }

  // Runs a config's checking run only, to take its outputs as the reference
  // (its time is already known). False when it did not run cleanly.
  bool check_reference(const Config& c) {
    BenchSettings st = p_.bench->settings();
    st.time = false;
    double wall = 0;
    try {
      BenchResult res = bench(c, st, &wall);
      if (unwritten(res)) return false;
    } catch (const WorkerError& e) {
      if (!e.fault().of_request) throw;
      return false;
    } catch (const Error& e) {
      if (e.code() != Errc::launch && e.code() != Errc::compile) throw;
      return false;
    }
    take_reference(c);
    return true;
  }

  // Re-times configs that ran and agreed, side by side in interleaved
  // rounds, and compares them within each round: a contender's score in a
  // round is its median over the round's fastest median, so drift that falls
  // on a whole round (another tenant, a clock change) cancels. Its time
  // becomes its median score over the rounds times the median of the rounds'
  // fastest medians. Returns the noise: the median, over the contenders, of
  // the spread (p75 - p25) of their per-round scores.
  double refine(std::vector<ConfigResult*> contenders, int rounds) {
    BenchSettings st = p_.bench->settings();
    st.check = false;
    st.budget_ms = st.budget_ms / 3;
    const size_t n = contenders.size();
    std::vector<std::vector<double>> med(rounds, std::vector<double>(n, 0));
    std::vector<std::vector<double>> samples(n);
    std::vector<bool> failed(n, false);
    ProgressBar bar(fmt::format("re-timing the {} fastest of {}", n, spec_.name), n * rounds, show_);
    size_t done = 0;
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < n; ++i) {
        if (failed[i]) continue;
        double wall = 0;
        try {
          BenchResult r = bench(contenders[i]->config, st, &wall);
          med[round][i] = r.median_ns;
          samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
        } catch (const WorkerError& e) {
          if (!e.fault().of_request) throw;
          failed[i] = true;
          contenders[i]->ns.reset();
          contenders[i]->kind = e.fault().kind == WorkerFault::Kind::timeout ? FailKind::timeout : FailKind::crash;
          contenders[i]->error = std::string("while being re-timed: ") + e.what();
        }
        bar.set(++done);
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    std::vector<double> base;  // each round's fastest median
    std::vector<std::vector<double>> score(n);
    for (int round = 0; round < rounds; ++round) {
      double best = 0;
      for (size_t i = 0; i < n; ++i)
        if (!failed[i] && med[round][i] > 0 && (best == 0 || med[round][i] < best)) best = med[round][i];
      if (best == 0) continue;
      base.push_back(best);
      for (size_t i = 0; i < n; ++i)
        if (!failed[i] && med[round][i] > 0) score[i].push_back(med[round][i] / best);
    }
    const double base_ns = median(base);
    std::vector<double> spreads;
    for (size_t i = 0; i < n; ++i) {
      if (failed[i] || score[i].empty()) continue;
      samples_[contenders[i]->binary] = samples[i];  // spread_of() tells of the latest timing
      BenchResult r = summarize(std::move(samples[i]));
      contenders[i]->ns = median(score[i]) * base_ns;
      contenders[i]->min_ns = r.min_ns;
      contenders[i]->max_ns = r.max_ns;
      contenders[i]->reps = static_cast<int>(r.ns.size());
      spreads.push_back(spread_of_scores(score[i]));
    }
    return spreads.empty() ? 0 : median(spreads);
  }

  static double spread_of_scores(std::vector<double> v) {
    if (v.size() < 2) return 0;
    std::sort(v.begin(), v.end());
    size_t q1 = (v.size() - 1) / 4, q3 = (3 * (v.size() - 1) + 3) / 4;
    return (v[q3] - v[q1]) / v[v.size() / 2];
  }

  double spread_of(const std::string& binary) const {
    auto it = samples_.find(binary);
    return it == samples_.end() ? 0 : spread(it->second);
  }

  bool have_reference() const { return have_ref_; }
  const std::string& reference() const { return reference_; }
  int disagreed() const { return disagreed_; }

 private:
  std::optional<std::string> unwritten(const BenchResult& res) const {
    for (size_t i = 0; i < res.unwritten.size() && i < spec_.args.size(); ++i)
      if (res.unwritten[i] > 0) {
        int64_t n = inputs_.args()[i].elements;
        return fmt::format("left {} of the {} elements of '{}' unwritten (still holding kiln's poison); an out "
                           "buffer must be written whole",
                           res.unwritten[i], n, spec_.args[i].name);
      }
    return std::nullopt;
  }

  void take_reference(const Config& c) {
    ref_.clear();
    for (size_t i = 0; i < spec_.args.size(); ++i) {
      auto out = inputs_.result(i);
      ref_.emplace_back(out.begin(), out.end());
    }
    have_ref_ = true;
    reference_ = c.str();
  }

  std::optional<std::string> disagrees() const {
    for (size_t i = 0; i < spec_.args.size(); ++i) {
      auto out = inputs_.result(i);
      if (out.empty()) continue;
      if (auto bad = Tuner::compare(spec_.args[i].dtype, out, ref_[i], spec_.tuning, reduction_))
        return fmt::format("wrong result in '{}' against the reference config {}: {}", spec_.args[i].name, reference_,
                           *bad);
    }
    return std::nullopt;
  }

  Tuner::Parts& p_;
  const KernelSpec& spec_;
  int64_t reduction_ = 0;
  void* const* params_;
  BenchInputs inputs_;
  std::vector<int64_t> slots_;
  BinaryKeyer keyer_;
  LaunchLimits limits_;
  bool show_;
  std::map<std::string, BinaryFuture> futures_;
  std::map<std::string, std::vector<double>> samples_;
  bool have_ref_ = false;
  std::vector<std::vector<std::byte>> ref_;
  std::string reference_;
  int disagreed_ = 0;
  std::optional<double> fastest_wall_s_;
  int64_t peak_device_bytes_ = 0;
  double compile_wait_s_ = 0, bench_s_ = 0;
};

// What a tuning re-times side by side: the configs within 15% of the
// fastest by median and those within 15% of the best by minimum (a run that
// a neighbour disturbed can double a median; its minimum still shows what
// the config can do), at most kMaxContenders. Both leaders always get a
// place: filling the places in median order alone once left out a library
// call 8 times faster than the template chosen, whose first timing a busy
// machine had disturbed. Then the rest by median, then by minimum.
constexpr size_t kMaxContenders = 6;
std::vector<ConfigResult*> contenders_of(std::vector<ConfigResult*> ok) {
  std::vector<ConfigResult*> out;
  if (ok.empty()) return out;
  auto by_median = ok, by_min = ok;
  std::sort(by_median.begin(), by_median.end(), [](auto* a, auto* b) { return *a->ns < *b->ns; });
  std::stable_sort(by_min.begin(), by_min.end(), [](auto* a, auto* b) {
    const double x = a->min_ns > 0 ? a->min_ns : *a->ns, y = b->min_ns > 0 ? b->min_ns : *b->ns;
    return x < y;
  });
  const double best_median = *by_median[0]->ns;
  const double best_min = by_min[0]->min_ns > 0 ? by_min[0]->min_ns : *by_min[0]->ns;
  auto add = [&](ConfigResult* r) {
    if (out.size() < kMaxContenders && std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  };
  add(by_median[0]);
  add(by_min[0]);
  for (ConfigResult* r : by_median)
    if (*r->ns <= best_median * 1.15) add(r);
  for (ConfigResult* r : by_min)
    if (r->min_ns > 0 && r->min_ns <= best_min * 1.15) add(r);
  return out;
}

// Re-times the contenders side by side (Session::refine); a re-timing whose
// noise passes `bound` is taken again, twice at most, and the quietest of
// the re-timings is kept. Returns its noise.
//
// The noise of a re-timing is the larger of two spreads: the contenders'
// per-round scores (how steady their ranking is) and the leader's own
// timings (p75 - p25 over the median: how steady its time is).
// A contender that fails in any attempt (a crash, a time-out while being
// re-timed) stays failed, and is not run again.
double retime(Session& s, const std::vector<ConfigResult*>& contenders, double bound) {
  std::vector<ConfigResult> quietest;
  std::vector<std::optional<ConfigResult>> failed(contenders.size());
  double least = INFINITY;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<ConfigResult*> live;
    for (size_t i = 0; i < contenders.size(); ++i)
      if (!failed[i]) live.push_back(contenders[i]);
    if (live.empty()) break;
    double noise = s.refine(live, 6);
    for (size_t i = 0; i < contenders.size(); ++i)
      if (!failed[i] && !contenders[i]->ok()) failed[i] = *contenders[i];
    const ConfigResult* leader = nullptr;
    for (const ConfigResult* c : live)
      if (c->ok() && (!leader || *c->ns < *leader->ns)) leader = c;
    if (leader) noise = std::max(noise, s.spread_of(leader->binary));
    if (noise < least) {
      least = noise;
      quietest.clear();
      for (ConfigResult* c : contenders) quietest.push_back(*c);
    }
    if (noise <= bound || live.size() < 2) break;
  }
  if (!quietest.empty())
    for (size_t i = 0; i < contenders.size(); ++i) *contenders[i] = quietest[i];
  for (size_t i = 0; i < contenders.size(); ++i)
    if (failed[i]) *contenders[i] = *failed[i];
  return least == INFINITY ? 0 : least;
}

// The candidates of a tuning: the space's configs (index i < space size),
// then the spec's library choices (index space size + k).
Config candidate(const KernelSpec& spec, size_t i) {
  if (i < spec.space.size()) return spec.space.at(i);
  Config c;
  c.library = spec.libraries.at(i - spec.space.size());
  return c;
}

// What a tuning works from: the candidates, which can run, and which
// already have results (from a record).
struct Plan {
  std::vector<size_t> runnable;            // space indices
  std::vector<size_t> libraries;           // candidate indices of library choices that are available
  std::vector<std::string> pruned;         // per candidate: why not ("" if runnable)
  std::vector<bool> unavailable;           // per candidate: a library choice that cannot be made here
  std::map<size_t, ConfigResult> reused;   // candidate index -> a result from the record
};

Plan make_plan(const KernelSpec& spec, const std::optional<TuningRecord>& rec, const BinaryKeyer* keyer,
               const int64_t* slots, const LaunchLimits& limits, Backend& backend) {
  Plan p;
  const size_t n = spec.space.size(), total = n + spec.libraries.size();
  p.pruned.resize(total);
  p.unavailable.assign(total, false);
  std::map<std::string, const ConfigResult*> by_binary;
  if (rec)
    for (const auto& c : rec->configs)
      // Pruned results with a binary key were judged for this key's call
      // (after compiling, or before it by a register sibling): kept too.
      if (!c.binary.empty() && c.kind != FailKind::unavailable) by_binary[c.binary] = &c;
  for (size_t i = n; i < total; ++i) {
    Config c = candidate(spec, i);
    std::string why = backend.library_unavailable(c.library);
    if (!why.empty()) {
      p.pruned[i] = why;
      p.unavailable[i] = true;
      continue;
    }
    p.libraries.push_back(i);
    if (rec && keyer) {
      auto it = by_binary.find(keyer->hex(c));
      if (it != by_binary.end()) {
        ConfigResult r = *it->second;
        r.config = c;
        p.reused[i] = std::move(r);
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    Config c = spec.space.at(i);
    p.pruned[i] = Tuner::why_not(spec, c, slots, limits);
    if (!p.pruned[i].empty()) continue;
    p.runnable.push_back(i);
    if (rec && keyer) {
      auto it = by_binary.find(keyer->hex(c));
      if (it != by_binary.end()) {
        ConfigResult r = *it->second;
        r.config = c;
        p.reused[i] = std::move(r);
      }
    }
  }
  return p;
}

// Whether a record already answers: every config the search would evaluate has a result.
bool complete(const Plan& p, const TuningRecord& rec, const KernelSpec& spec, SearchKind wanted) {
  for (size_t i : p.libraries)
    if (!p.reused.count(i)) return false;
  for (size_t i : p.runnable) {
    if (p.reused.count(i)) continue;
    // A config the record's search chose not to evaluate is not missing;
    // one that is new to the spec is.
    // Asked for every config, a record of a partial search is missing some.
    if (rec.method != SearchMethod::exhaustive && wanted != SearchKind::exhaustive && rec.space.index_of(spec.space.at(i)))
      continue;
    return false;
  }
  return true;
}

}  // namespace

TuneOutcome Tuner::tune(const KernelSpec& in, void* const* params, const TuneOptions& o) {
  // Templates only: a spec without its library choices (they are not in the key).
  KernelSpec templates_only;
  if (!o.libraries && !in.libraries.empty()) {
    templates_only = in;
    templates_only.libraries.clear();
  }
  const KernelSpec& spec = !o.libraries && !in.libraries.empty() ? templates_only : in;
  TuningKey key = make_tuning_key(spec, *p_.backend, params);
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  const LaunchLimits limits = p_.backend->limits();
  SearchKind search = o.search.value_or(spec.tuning.search);
  bool settle = false;
  if (o.effort) {
    if (*o.effort == Effort::quick) search = SearchKind::budgeted, settle = true;
    else if (*o.effort == Effort::full) search = SearchKind::exhaustive;
    else search = spec.tuning.search;
  }
  if (o.budget_seconds > 0 && !o.search && (!o.effort || *o.effort != Effort::full)) search = SearchKind::budgeted;
  // Nobody chose the search: a space with many runnable configs for this
  // call is searched quickly (decided once the runnable count is known).
  const bool automatic = !o.search && !o.effort && o.budget_seconds <= 0 && !spec.tuning.search_given &&
                         search == SearchKind::exhaustive;
  auto automatic_search = [&](size_t runnable) {
    if (automatic && runnable > static_cast<size_t>(p_.opts.quick_above)) search = SearchKind::budgeted, settle = true;
  };
  const auto started = std::chrono::steady_clock::now();

  // 1. A record that answers. The warm path: a record tuned over this very
  // config space, holding what the search wants, answers without a binary
  // key computed or a library opened (a library choice is opened when it
  // runs, not to check that it could).
  auto fast_answer = [&](const TuningRecord& rec) -> bool {
    if (!rec.verdict.empty() || !rec.best || !(rec.space.hash() == spec.space.hash())) return false;
    size_t pruned = 0;
    for (const auto& c : rec.configs) {
      if (!c.config.library.empty() || c.kind != FailKind::pruned) continue;
      ++pruned;
      // Pruned for the call it was tuned at (alignment, an unkeyed scalar)
      // but runnable for this one: it must be timed, so not the warm path.
      if (c.binary.empty() && why_not(spec, c.config, slots.data(), limits).empty()) return false;
    }
    for (const auto& lib : spec.libraries) {
      auto it = std::find_if(rec.configs.begin(), rec.configs.end(),
                             [&](const ConfigResult& c) { return c.config.library == lib; });
      if (it == rec.configs.end() || it->kind == FailKind::unavailable) return false;  // look again: it may be here now
    }
    SearchKind wanted = search;
    if (automatic && spec.space.size() - std::min(pruned, spec.space.size()) > static_cast<size_t>(p_.opts.quick_above))
      wanted = SearchKind::budgeted;
    const bool whole = rec.configs.size() >= spec.space.size() + spec.libraries.size();
    return whole || (rec.method != SearchMethod::exhaustive && wanted != SearchKind::exhaustive);
  };
  // A noisy record answers a call that must not tune (the hot path takes
  // its choice as it is); a tuning re-measures it (below).
  auto answer = [&](std::optional<TuningRecord> rec) -> std::optional<TuneOutcome> {
    if (!rec || o.force) return std::nullopt;
    if (rec->noisy && o.remeasure_noisy && !o.cached_only && rec->best && rec->remeasured < kMaxRemeasures)
      return std::nullopt;
    if (fast_answer(*rec))
      if (auto c = choose(*rec, spec, slots.data(), limits)) {
        TuneOutcome out;
        out.choice = c;
        out.record = std::move(*rec);
        out.from_cache = true;
        return out;
      }
    BinaryKeyer keyer(spec, *p_.backend);
    Plan plan = make_plan(spec, rec, &keyer, slots.data(), limits, *p_.backend);
    automatic_search(plan.runnable.size());
    if (!complete(plan, *rec, spec, search)) return std::nullopt;
    TuneOutcome out;
    out.choice = choose(*rec, spec, slots.data(), limits);
    out.record = std::move(*rec);
    out.from_cache = true;
    return out;
  };
  if (p_.cache)
    if (auto out = answer(p_.cache->get(key))) return std::move(*out);
  if (o.cached_only) {
    TuneOutcome none;
    none.record.kernel = spec.name;
    none.record.key = key;
    return none;
  }

  TuneOutcome outcome;
  auto session = [&] {
    // Another process may have tuned this key while we waited for its lock.
    std::optional<TuningRecord> existing = p_.cache ? p_.cache->get(key) : std::nullopt;
    if (auto out = answer(existing)) {
      outcome = std::move(*out);
      return;
    }
    if (o.force) existing.reset();
    int cap = o.max_configs > 0 ? o.max_configs : p_.opts.tune_max_configs;
    Session s(p_, spec, params, o);
    Plan plan = make_plan(spec, existing, &s.keyer(), slots.data(), limits, *p_.backend);
    automatic_search(plan.runnable.size());
    std::map<size_t, ConfigResult> done = plan.reused;
    std::set<size_t> fresh;  // evaluated by this tuning
    std::map<std::string, std::pair<int, std::string>> sibling_registers;  // class -> registers, the config compiled
    size_t pruned_by_registers = 0;

    TuningRecord rec;
    rec.kernel = spec.name;
    rec.key = key;
    rec.space = spec.space;
    rec.timed = existing ? existing->timed : 0;

    // The reference: the spec's, else the record's, else the first config that runs.
    constexpr size_t none = static_cast<size_t>(-1);
    size_t ref = none;
    bool ref_declared = false;
    if (spec.tuning.reference_config) {
      ref = spec.space.index_of(*spec.tuning.reference_config).value_or(none);
      ref_declared = ref != none;
      if (ref != none && !plan.pruned[ref].empty()) {
        log::warn("kernel '{}': the reference config {} cannot run at {} ({}); the first config that runs is the "
                  "reference instead",
                  spec.name, spec.space.at(ref).str(), key.values_text(), plan.pruned[ref]);
        ref = none;
        ref_declared = false;
      }
    }
    if (ref == none && existing && !existing->reference.empty()) {
      std::vector<size_t> all = plan.runnable;
      all.insert(all.end(), plan.libraries.begin(), plan.libraries.end());
      for (size_t i : all)
        if (candidate(spec, i).str() == existing->reference && done.count(i) && done[i].ok()) ref = i;
    }

    // The search.
    std::unique_ptr<SearchStrategy> strategy;
    if (search == SearchKind::exhaustive) {
      strategy = make_exhaustive_search();
    } else if (search == SearchKind::budgeted) {
      std::optional<size_t> start;
      if (spec.tuning.default_config) start = spec.space.index_of(*spec.tuning.default_config);
      strategy = make_budgeted_search(start, hash64(key.values_hex().data(), key.values_hex().size()), settle);
    } else {
      std::optional<size_t> start;
      std::string why;
      if (spec.tuning.default_config) {
        start = spec.space.index_of(*spec.tuning.default_config);
        why = "the spec's default";
      }
      if ((!start || !plan.pruned[*start].empty()) && p_.cache) {
        start.reset();
        double best_d = INFINITY;
        for (const auto& r : p_.cache->all(key)) {
          if (r.key.values == key.values) continue;
          auto c = choose(r, spec, slots.data(), limits);
          if (!c) continue;
          double d = log2_distance(r.key.values, key.values);
          auto idx = spec.space.index_of(*c);
          if (idx && plan.pruned[*idx].empty() && d < best_d) {
            best_d = d;
            start = idx;
            why = "the best of the nearest cached key, " + r.key.values_text();
          }
        }
      }
      strategy = make_coordesc_search(start, why);
    }
    rec.method = strategy->method();
    log::info("tuning kernel '{}' at {}: {} configs, {} runnable, {} with results already, {} search", spec.name,
              key.values_text(), spec.space.size(), plan.runnable.size(), plan.reused.size(),
              search_method_name(rec.method));

    auto budget_left = [&]() -> size_t {
      return cap <= 0 ? SIZE_MAX : static_cast<size_t>(std::max<int64_t>(0, cap - static_cast<int64_t>(fresh.size())));
    };
    // Evaluates a batch: compiles in parallel, then benchmarks one at a time.
    auto run_batch = [&](const std::vector<size_t>& batch, const char* what) {
      std::vector<size_t> todo;
      for (size_t i : batch)
        if (!done.count(i) && plan.pruned[i].empty() && todo.size() < budget_left()) todo.push_back(i);
      if (todo.empty()) return;
      // The reference's outputs must be at hand before anything is compared with them.
      if (!s.have_reference() && ref != none && done.count(ref) && !fresh.count(ref)) {
        if (!s.check_reference(candidate(spec, ref))) ref = none;
      }
      if (!s.have_reference() && ref != none && !done.count(ref)) {
        auto it = std::find(todo.begin(), todo.end(), ref);
        if (it != todo.end()) todo.erase(it);
        todo.insert(todo.begin(), ref);
      }
      std::vector<BinaryFuture> fs;
      if (!spec.tuning.registers_by.empty()) {
        // Registers known for a sibling (a config that agrees on the spec's
        // registers_by params): one config of each sibling class whose
        // registers are not known yet is compiled first; then the others
        // whose block would need more registers than the device has are
        // pruned before compiling.
        std::vector<size_t> first, rest;
        std::set<std::string> classes;
        for (size_t i : todo) {
          const std::string k = register_sibling_key(spec, candidate(spec, i));
          if (!sibling_registers.count(k) && classes.insert(k).second) first.push_back(i);
          else rest.push_back(i);
        }
        std::vector<BinaryFuture> ffirst;
        for (size_t i : first) ffirst.push_back(s.compile(candidate(spec, i)));
        if (!ffirst.empty())
          wait_all(ffirst, fmt::format("compiling {} {} (one of each register sibling class)", spec.name, what),
                   s.show());
        for (size_t k = 0; k < first.size(); ++k) {
          try {
            const Config c = candidate(spec, first[k]);
            if (int regs = learned_registers(*p_.backend, ffirst[k].get()->meta); regs > 0)
              sibling_registers[register_sibling_key(spec, c)] = {regs, c.str()};
          } catch (const Error&) {
          }
        }
        std::vector<size_t> kept = first;
        for (size_t i : rest) {
          const Config c = candidate(spec, i);
          auto it = sibling_registers.find(register_sibling_key(spec, c));
          std::string why = it == sibling_registers.end()
                                ? ""
                                : pruned_by_sibling_registers(*p_.backend, spec, c, it->second.first, it->second.second);
          if (why.empty()) {
            kept.push_back(i);
            continue;
          }
          ConfigResult r;
          r.config = c;
          r.binary = s.keyer().hex(c);  // what a later tuning of this key reuses it by
          r.kind = FailKind::pruned;
          r.error = "pruned before compiling: " + why;
          done[i] = std::move(r);
          ++pruned_by_registers;
        }
        todo = kept;
        fs = ffirst;
        for (size_t k = first.size(); k < todo.size(); ++k) fs.push_back(s.compile(candidate(spec, todo[k])));
      } else {
        for (size_t i : todo) fs.push_back(s.compile(candidate(spec, i)));
      }
      wait_all(fs, fmt::format("compiling {} {}", spec.name, what), s.show());
      ProgressBar bar(fmt::format("benchmarking {} {}", spec.name, what), todo.size(), s.show());
      for (size_t k = 0; k < todo.size(); ++k) {
        if (o.cancel && o.cancel->load(std::memory_order_relaxed))
          throw Error(Errc::cancelled, fmt::format("kernel '{}' at {}: tuning stopped", spec.name, key.values_text()));
        done[todo[k]] = s.evaluate(candidate(spec, todo[k]));
        fresh.insert(todo[k]);
        outcome.evaluated.push_back(candidate(spec, todo[k]).str());
        bar.set(k + 1);
      }
    };
    // Library choices first: each is one call, and where the spec names no
    // reference, a vendor library is the one to trust.
    if (!plan.libraries.empty()) {
      if (ref == none) {
        ref = plan.libraries.front();
        ref_declared = false;
      }
      run_batch(plan.libraries, "library choices");
    }
    for (;;) {
      SearchState st{spec.space, plan.runnable,
                     [&](size_t i) -> const ConfigResult* {
                       auto it = done.find(i);
                       return it == done.end() ? nullptr : &it->second;
                     },
                     budget_left()};
      if (o.budget_seconds > 0)
        st.seconds_left = o.budget_seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::vector<size_t> batch = strategy->next(st);
      if (batch.empty() || budget_left() == 0) break;
      size_t before = done.size();
      run_batch(batch, rec.method == SearchMethod::exhaustive ? "configs" : "neighbours");
      if (done.size() == before) {
        // Nothing new was evaluated (the budget, or every proposal known): a
        // strategy that proposes known configs only is done.
        bool all_known = true;
        for (size_t i : batch) all_known = all_known && done.count(i);
        if (!all_known) break;
      }
    }
    rec.start = strategy->start();
    if (pruned_by_registers > 0)
      rec.start += fmt::format("{}{} pruned before compiling by a sibling's registers", rec.start.empty() ? "" : "; ",
                               pruned_by_registers);
    if (rec.method == SearchMethod::budgeted || !rec.start.empty()) {
      size_t timed = 0;
      for (size_t i : plan.runnable) timed += done.count(i) && done[i].kind != FailKind::pruned;
      rec.start += fmt::format("; {} of {} runnable configs timed in {:.1f} s{}", timed, plan.runnable.size(),
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                               o.budget_seconds > 0 ? fmt::format(" (budget {:g} s)", o.budget_seconds) : "");
    }

    // The verdict on a reference that no other config agrees with.
    size_t agreeing = 0;
    for (const auto& [i, r] : done)
      if (r.ok() && candidate(spec, i).str() != s.reference()) ++agreeing;
    if (!ref_declared && s.have_reference() && agreeing == 0 && s.disagreed() > 0) {
      rec.verdict = fmt::format(
          "the reference config {} (the first that ran) disagrees with every other config that ran ({} of them); "
          "kiln cannot tell which is right, so it chooses none: name a config you trust as [tuning] reference",
          s.reference(), s.disagreed());
    }

    // Re-time the contenders side by side when one of them is new.
    std::vector<ConfigResult*> ok;
    for (auto& [i, r] : done)
      if (r.ok()) ok.push_back(&r);
    std::vector<ConfigResult*> contenders = contenders_of(ok);
    // A noisy record is re-measured; a lone contender whose own timings
    // spread past the bound is no clear winner either: each is re-timed
    // beside the runner-up.
    const bool remeasure =
        existing && existing->noisy && o.remeasure_noisy && !o.force && existing->remeasured < kMaxRemeasures;
    if (contenders.size() == 1 && ok.size() > 1 &&
        (remeasure || s.spread_of(contenders[0]->binary) > p_.opts.noise_bound)) {
      std::vector<ConfigResult*> rest;
      for (ConfigResult* r : ok)
        if (r != contenders[0]) rest.push_back(r);
      std::vector<ConfigResult*> runner_up = contenders_of(rest);
      contenders.push_back(runner_up[0]);
    }
    bool any_fresh = false;
    for (ConfigResult* r : contenders)
      for (size_t f : fresh) any_fresh = any_fresh || candidate(spec, f) == r->config;
    rec.noise = existing ? existing->noise : 0;
    rec.noisy = existing && existing->noisy;
    rec.remeasured = existing ? existing->remeasured : 0;
    if (contenders.size() > 1 && (any_fresh || remeasure) && rec.verdict.empty()) {
      std::vector<ConfigResult> before;
      for (ConfigResult* c : contenders) before.push_back(*c);
      const double noise = retime(s, contenders, p_.opts.noise_bound);
      outcome.retimed_now = contenders.size();
      if (remeasure && !any_fresh) {
        ++rec.remeasured;
        if (noise >= existing->noise) {
          // No quieter than what the record holds: its timings stay (a failure seen now stays too).
          for (size_t i = 0; i < contenders.size(); ++i)
            if (contenders[i]->ok()) *contenders[i] = before[i];
          log::info("kernel '{}' at {}: re-measured, no quieter ({:.1f}% against {:.1f}%); the record stays",
                    spec.name, key.values_text(), noise * 100, existing->noise * 100);
        } else {
          rec.noise = noise;
        }
      } else {
        rec.noise = noise;
      }
      rec.noisy = rec.noise > p_.opts.noise_bound;
      if (rec.noisy)
        log::warn("kernel '{}' at {}: the fastest configs' timings spread {:.0f}% (more than KILN_NOISE_BOUND, "
                  "{:.0f}%) after re-timing them {}: the machine is busy; stored flagged as noisy, to be re-measured "
                  "by the next tuning of this key",
                  spec.name, key.values_text(), rec.noise * 100, p_.opts.noise_bound * 100,
                  remeasure ? "again" : "three times");
    } else if (contenders.size() == 1 && any_fresh) {
      rec.noise = s.spread_of(contenders[0]->binary);
      rec.noisy = false;  // the only config that ran: nothing to tell apart
    }
    if (ok.size() <= 1) rec.noisy = false;  // one config left that runs: nothing to re-measure it against

    for (size_t i = 0; i < spec.space.size() + spec.libraries.size(); ++i) {
      if (!plan.pruned[i].empty()) {
        ConfigResult r;
        r.config = candidate(spec, i);
        r.kind = plan.unavailable[i] ? FailKind::unavailable : FailKind::pruned;
        r.error = plan.unavailable[i] ? "unavailable: " + plan.pruned[i] : "pruned: " + plan.pruned[i];
        rec.configs.push_back(std::move(r));
      } else if (done.count(i)) {
        rec.configs.push_back(done[i]);
      }
    }
    rec.reference = s.have_reference() ? s.reference() : (existing ? existing->reference : "");
    rec.timed += fresh.size();
    rec.peak_device_bytes = std::max(existing ? existing->peak_device_bytes : 0, s.peak_device_bytes());
    if (rec.verdict.empty()) {
      if (auto c = choose(rec, spec, slots.data(), limits)) {
        rec.best = *c;
        rec.best_ns = *rec.find(*c)->ns;
      }
    }
    rec.kiln_version = kiln_version();
    rec.when = utc_now();
    outcome.timed_now = fresh.size();
    outcome.peak_device_bytes = s.peak_device_bytes();
    outcome.compile_wait_s = s.compile_wait_s();
    outcome.bench_s = s.bench_s();
    outcome.choice = rec.best;
    if (p_.cache) {
      try {
        p_.cache->put(rec);
      } catch (const Error& e) {
        outcome.stored = false;
        log::warn("kernel '{}' at {}: tuned, but the record could not be stored, so the next process will tune "
                  "again: {}",
                  spec.name, key.values_text(), e.what());
      }
    }
    outcome.record = std::move(rec);
  };
  if (p_.cache) p_.cache->with_lock(key, session);
  else session();
  return outcome;
}

}  // namespace kiln
