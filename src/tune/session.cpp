#include "tune/session.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/format.hpp"

namespace kiln {

using Clock = std::chrono::steady_clock;

namespace {

// The relative spread of a set of samples: (p75 - p25) / median.
double spread(std::vector<double> v) {
  if (v.size() < 4) return 0;
  std::sort(v.begin(), v.end());
  double med = v[v.size() / 2];
  return med > 0 ? (v[v.size() * 3 / 4] - v[v.size() / 4]) / med : 0;
}

double spread_of_scores(std::vector<double> v) {
  if (v.size() < 2) return 0;
  std::sort(v.begin(), v.end());
  size_t q1 = (v.size() - 1) / 4, q3 = (3 * (v.size() - 1) + 3) / 4;
  return (v[q3] - v[q1]) / v[v.size() / 2];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Records a config's failure in `r` and returns it.
ConfigResult failed(ConfigResult r, FailKind kind, std::string error) {
  r.ns.reset();
  r.kind = kind;
  r.error = std::move(error);
  return r;
}

}  // namespace

Session::Session(Tuner::Parts& p, const CallView& call, const TuneOptions& o)
    : p_(p), call_(call), inputs_(call, p.backend->device(), p.bench->in_process(), o.stream),
      keyer_(call.spec, *p.backend), show_(o.show_progress) {}

BinaryFuture Session::compile(const Config& c) {
  std::string key = keyer_.hex(c);
  auto it = futures_.find(key);
  if (it != futures_.end()) return it->second;
  if (!c.library.empty()) return futures_[key] = p_.compiler->submit(call_.spec, c);
  return futures_[key] = p_.compiler->submit(make_compile_request(call_.spec, c), key);
}

LaunchDims Session::dims_of(const Config& c) const {
  return c.library.empty() ? LaunchPlan(call_.spec, c, call_.limits).eval(call_.slot_data()) : LaunchDims{};
}

// The deadline of the next benchmark: the ceiling until a config has been
// timed, then 20 times the wall time the fastest one took, never under the floor; the
// ceiling for a library choice (session.hpp).
double Session::deadline_s(const Config& c) const {
  const double ceiling = p_.opts.bench_timeout_s;
  if (!fastest_wall_s_ || !c.library.empty()) return ceiling;
  return std::min(ceiling, std::max(p_.opts.bench_deadline_floor_s, 20 * *fastest_wall_s_));
}

std::string Session::deadline_why(double d, const Config& c) const {
  if (!c.library.empty()) return "KILN_BENCH_TIMEOUT, a library choice's";
  if (!fastest_wall_s_) return "KILN_BENCH_TIMEOUT";
  if (d >= p_.opts.bench_timeout_s) return "KILN_BENCH_TIMEOUT, the ceiling";
  if (d <= p_.opts.bench_deadline_floor_s) return "the floor, KILN_BENCH_DEADLINE_FLOOR";
  return fmt::format("20 times the {:.3g} s the fastest config so far took", *fastest_wall_s_);
}

// Benchmarks one config; the caller classifies. Fills the result or throws.
BenchResult Session::bench(const Config& c, const BenchSettings& st, double* wall_s) {
  std::shared_ptr<const Binary> bin = compile(c).get();
  LaunchDims dims = dims_of(c);
  std::string what = fmt::format("kernel '{}' (config {})", call_.spec.name, c.str());
  std::shared_ptr<LoadedKernel> loaded = p_.bench->in_process() ? p_.load(*bin) : nullptr;
  auto t0 = Clock::now();
  BenchResult r = p_.bench->run(*bin, loaded.get(), inputs_, dims, what, st, deadline_s(c));
  *wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  bench_s_ += *wall_s;
  peak_device_bytes_ = std::max(peak_device_bytes_, r.device_bytes);
  return r;
}

// A compiled config this call cannot run: a launch past the device's
// resources, or a library's own rules (the sizes it takes, the algorithms
// its heuristic offers). nullopt when it can run; fills r.detail with a
// library choice's description.
std::optional<ConfigResult> Session::refuse(const Config& c, const Binary& bin, ConfigResult& r) {
  if (c.library.empty()) {
    if (std::string why = p_.backend->check_resources(bin.meta, dims_of(c)); !why.empty())
      return failed(r, FailKind::pruned, "pruned: " + why);
    return std::nullopt;
  }
  try {
    std::shared_ptr<LoadedKernel> lib = p_.load(bin);
    if (std::string why = lib->can_implement(call_.params); !why.empty())
      return failed(r, FailKind::pruned, "pruned: " + why);
    r.detail = lib->describe(call_.params);
  } catch (const Error& e) {
    if (e.code() != Errc::launch) throw;
    return failed(r, FailKind::launch, e.what());
  }
  return std::nullopt;
}

ConfigResult Session::evaluate(const Config& c) {
  ConfigResult r;
  r.config = c;
  r.binary = keyer_.hex(c);
  std::shared_ptr<const Binary> bin;
  struct AddWait {  // compile waits count whether or not the compile succeeds
    double& to;
    Clock::time_point t0 = Clock::now();
    ~AddWait() { to += std::chrono::duration<double>(Clock::now() - t0).count(); }
  };
  try {
    AddWait wait{compile_wait_s_};
    bin = compile(c).get();
  } catch (const WorkerError& e) {
    if (!e.fault().of_request) throw;
    return failed(r, FailKind::compile, e.what());  // the compiler crashed or hung on this config, twice
  } catch (const Error& e) {
    if (e.code() != Errc::compile) throw;  // a disk or process failure: not the config's
    return failed(r, FailKind::compile, e.what());
  }
  if (auto no = refuse(c, *bin, r)) return *no;
  BenchResult res;
  double wall = 0;
  const double deadline = deadline_s(c);
  try {
    res = bench(c, p_.bench->settings(), &wall);
  } catch (const WorkerError& e) {
    if (!e.fault().of_request) throw;
    if (e.fault().kind == WorkerFault::Kind::timeout)
      return failed(r, FailKind::timeout, fmt::format("ran past its deadline of {:.3g} s ({}); not retried",
                                                      deadline, deadline_why(deadline, c)));
    return failed(r, FailKind::crash, e.what());
  } catch (const Error& e) {
    if (e.code() != Errc::launch) throw;
    return failed(r, FailKind::launch, e.what());
  }
  r.ns = res.median_ns;
  r.min_ns = res.min_ns;
  r.max_ns = res.max_ns;
  r.reps = static_cast<int>(res.ns.size());
  samples_[r.binary] = res.ns;
  if (auto bad = unwritten(res)) return failed(r, FailKind::wrong, *bad);
  if (!have_ref_) {
    take_reference(c);
  } else if (auto bad = disagrees()) {
    ++disagreed_;
    return failed(r, FailKind::wrong, *bad);
  }
  if (!fastest_wall_s_ || wall < *fastest_wall_s_) fastest_wall_s_ = wall;
  return r;
}

bool Session::check_reference(const Config& c) {
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

// A contender's score in a round is its median over the round's fastest
// median, so drift that falls on a whole round (another tenant, a clock
// change) cancels. Its time becomes its median score over the rounds times
// the median of the rounds' fastest medians. The noise: the median, over
// the contenders, of the spread (p75 - p25) of their per-round scores.
double Session::refine(std::vector<ConfigResult*> contenders, int rounds) {
  BenchSettings st = p_.bench->settings();
  st.check = false;
  st.budget_ms = st.budget_ms / 3;
  const size_t n = contenders.size();
  std::vector<std::vector<double>> med(rounds, std::vector<double>(n, 0));
  std::vector<std::vector<double>> samples(n);
  std::vector<bool> failed(n, false);
  ProgressBar bar(fmt::format("re-timing the {} fastest of {}", n, call_.spec.name), n * rounds, show_);
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

double Session::spread_of(const std::string& binary) const {
  auto it = samples_.find(binary);
  return it == samples_.end() ? 0 : spread(it->second);
}

std::optional<std::string> Session::unwritten(const BenchResult& res) const {
  const KernelSpec& spec = call_.spec;
  for (size_t i = 0; i < res.unwritten.size() && i < spec.args.size(); ++i)
    if (res.unwritten[i] > 0) {
      int64_t n = inputs_.args()[i].elements;
      return fmt::format("left {} of the {} elements of '{}' unwritten (still holding kiln's poison); an out "
                         "buffer must be written whole",
                         res.unwritten[i], n, spec.args[i].name);
    }
  return std::nullopt;
}

void Session::take_reference(const Config& c) {
  ref_.clear();
  for (size_t i = 0; i < call_.spec.args.size(); ++i) {
    auto out = inputs_.result(i);
    ref_.emplace_back(out.begin(), out.end());
  }
  have_ref_ = true;
  reference_ = c.str();
}

std::optional<std::string> Session::disagrees() const {
  const KernelSpec& spec = call_.spec;
  for (size_t i = 0; i < spec.args.size(); ++i) {
    auto out = inputs_.result(i);
    if (out.empty()) continue;
    if (auto bad = Tuner::compare(spec.args[i].dtype, out, ref_[i], spec.tuning, call_.reduction))
      return fmt::format("wrong result in '{}' against the reference config {}: {}", spec.args[i].name, reference_,
                         *bad);
  }
  return std::nullopt;
}

// Both leaders (by median and by minimum: a run that a neighbour disturbed
// can double a median; its minimum still shows what the config can do)
// always get a place: filling the places in median order alone once left
// out a library call 8 times faster than the template chosen, whose first
// timing a busy machine had disturbed. Then the rest by median, then by minimum.
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

// The noise of a re-timing is the larger of two spreads: the contenders'
// per-round scores (how steady their ranking is) and the leader's own
// timings (how steady its time is). A contender that fails in any attempt
// (a crash, a time-out while being re-timed) stays failed, and is not run again.
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

}  // namespace kiln
