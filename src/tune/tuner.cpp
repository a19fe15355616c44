#include "kiln/ext/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/binary_key.hpp"
#include "tune/candidates.hpp"
#include "tune/record_io.hpp"
#include "tune/register_siblings.hpp"
#include "tune/search.hpp"
#include "tune/session.hpp"

namespace kiln {

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
    if (g == r) continue;  // infinities of one sign agree (a running max that saw nothing is -inf in both)
    // Past here an infinite or NaN value on either side is an error (an infinite
    // reference must not make the tolerance infinite).
    double err = !std::isfinite(g) || !std::isfinite(r) ? INFINITY : std::abs(g - r);
    if (!std::isfinite(err) || !(err <= tol_abs + rtol * std::abs(r))) {
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

namespace {

// A config's checks for one spec and device, compiled as they are first needed (a config
// pruned by its first constraint never has the rest, nor its launch plan, compiled).
struct ConfigChecks {
  std::vector<std::optional<CompiledExpr>> constraints;
  std::optional<LaunchPlan> plan;
};

// Calls f on each expression a config's checks are compiled from, in a fixed order.
template <class F>
void each_check_expr(const KernelSpec& s, F&& f) {
  for (const auto& a : s.args) f(a.size);
  for (const auto& e : s.constraints) f(e);
  for (const auto& e : s.grid) f(e);
  for (const auto& e : s.block) f(e);
  if (s.shared) f(*s.shared);
  if (s.workspace) f(*s.workspace);
  if (s.zero_when) f(*s.zero_when);
  for (const auto& m : s.tensor_maps)
    for (const Expr* e : {&m.rows, &m.cols, &m.pitch, &m.box_rows, &m.box_cols}) f(*e);
}

// Per config of a spec's space, its checks for the device limits they were compiled with;
// kept in the spec's memo, so that a warm path that checks a record's many configs on
// each new call compiles each of them once. What they were compiled from is kept beside
// them (the expressions held, so that their trees' addresses name them): a spec changed in
// place since has them compiled afresh.
struct SpecChecks {
  std::mutex m;
  LaunchLimits limits;
  std::unordered_map<size_t, ConfigChecks> by_index;
  std::string name;
  std::vector<std::tuple<std::string, DType, bool>> args;
  std::vector<std::pair<std::string, int64_t>> constants;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  std::vector<std::string> zero, tensor_maps;
  std::vector<int> swizzles;
  std::vector<Expr> exprs;

  bool from(const KernelSpec& s) const {
    if (s.name != name || s.constants != constants || s.zero != zero || s.args.size() != args.size() ||
        s.space.params.size() != params.size() || s.tensor_maps.size() != tensor_maps.size())
      return false;
    for (size_t i = 0; i < args.size(); ++i)
      if (s.args[i].name != std::get<0>(args[i]) || s.args[i].dtype != std::get<1>(args[i]) ||
          s.args[i].pointer != std::get<2>(args[i]))
        return false;
    for (size_t i = 0; i < params.size(); ++i)
      if (s.space.params[i].name != params[i].first || s.space.params[i].values != params[i].second) return false;
    for (size_t i = 0; i < tensor_maps.size(); ++i)
      if (s.tensor_maps[i].of != tensor_maps[i] || s.tensor_maps[i].swizzle != swizzles[i]) return false;
    size_t k = 0;
    bool same = true;
    each_check_expr(s, [&](const Expr& e) {
      same = same && k < exprs.size() && &e.root() == &exprs[k].root();
      ++k;
    });
    return same && k == exprs.size();
  }
  void take(const KernelSpec& s) {
    by_index.clear();
    name = s.name;
    constants = s.constants;
    zero = s.zero;
    args.clear();
    for (const auto& a : s.args) args.emplace_back(a.name, a.dtype, a.pointer);
    params.clear();
    for (const auto& p : s.space.params) params.emplace_back(p.name, p.values);
    tensor_maps.clear();
    swizzles.clear();
    for (const auto& m : s.tensor_maps) tensor_maps.push_back(m.of), swizzles.push_back(m.swizzle);
    exprs.clear();
    each_check_expr(s, [&](const Expr& e) { exprs.push_back(e); });
  }
};

bool same_limits(const LaunchLimits& a, const LaunchLimits& b) {
  return std::equal(a.grid, a.grid + 3, b.grid) && a.grid_total == b.grid_total &&
         std::equal(a.block, a.block + 3, b.block) && a.block_threads == b.block_threads && a.shared == b.shared &&
         a.multiprocessors == b.multiprocessors;
}

// Why_not over checks compiled into `k` as needed (k: kept, or this call's own).
std::string check(const KernelSpec& spec, const Config& c, const int64_t* slots, const LaunchLimits& limits,
                  ConfigChecks& k) {
  try {
    k.constraints.resize(spec.constraints.size());
    for (size_t i = 0; i < spec.constraints.size(); ++i) {
      if (!k.constraints[i]) k.constraints[i] = compile_expr(spec, spec.constraints[i], &c, &limits);
      if (k.constraints[i]->eval(slots) == 0) return fmt::format("constraint '{}' is false", spec.constraints[i].str());
    }
    if (!k.plan) k.plan.emplace(spec, c, limits);
    LaunchDims d = k.plan->eval(slots);
    if (d.empty()) return fmt::format("empty grid ({}, {}, {})", d.grid.x, d.grid.y, d.grid.z);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

std::string Tuner::why_not(const KernelSpec& spec, const Config& c, const int64_t* slots, const LaunchLimits& limits) {
  if (!c.library.empty()) return "";
  if (const auto index = spec.space.index_of(c)) {
    auto memo = std::static_pointer_cast<SpecChecks>(spec.memo.get([&] {
      auto s = std::make_shared<SpecChecks>();
      s->limits = limits;
      s->take(spec);
      return s;
    }));
    std::lock_guard<std::mutex> g(memo->m);
    if (!memo->from(spec)) memo->take(spec);  // the spec was changed in place since
    if (same_limits(memo->limits, limits)) return check(spec, c, slots, limits, memo->by_index[*index]);
  }
  ConfigChecks own;  // not a point of the space, or another device's limits
  return check(spec, c, slots, limits, own);
}

std::string Tuner::bucket_refusal(const KernelSpec& spec, const int64_t* slots) {
  for (const std::string& name : spec.tuning.pow2)
    for (size_t i = 0; i < spec.args.size(); ++i) {
      if (spec.args[i].name != name) continue;
      const int64_t v = slots[i];
      if (v > 2 && v <= (int64_t{1} << 62))
        return fmt::format("it builds a plan for each shape, and the bucket of {} = {} holds more than one value (its "
                           "choice runs them all, each new one a plan)", name, v);
    }
  return "";
}

std::optional<Config> Tuner::choose(const TuningRecord& r, const KernelSpec& spec, const int64_t* slots,
                                    const LaunchLimits& limits,
                                    const std::function<bool(const std::string&)>& plans_per_shape) {
  const bool refused = plans_per_shape && !bucket_refusal(spec, slots).empty();
  if (!r.verdict.empty()) return std::nullopt;  // the record refused to choose, and says why
  std::vector<const ConfigResult*> cands;
  for (const ConfigResult* c : r.ranked()) {
    // Ranked fastest first: past the tie window of the first candidate, none can be chosen.
    if (!cands.empty() && *c->ns > *cands[0]->ns * (1 + std::min(r.noise, kMaxTieWindow))) break;
    const std::string& lib = c->config.library;
    if (lib.empty() ? !spec.space.index_of(c->config)
                    : std::find(spec.libraries.begin(), spec.libraries.end(), lib) == spec.libraries.end())
      continue;  // no longer in the spec
    if (refused && !lib.empty() && plans_per_shape(lib)) continue;  // a plan per value of the bucket
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

// The search a tuning runs, as its options and the spec choose it.
struct SearchChoice {
  SearchKind kind = SearchKind::exhaustive;
  bool settle = false;     // a budgeted search stops once it settles
  bool automatic = false;  // nobody chose: a space with many runnable configs is searched quickly
};

SearchChoice choose_search(const KernelSpec& spec, const TuneOptions& o) {
  SearchChoice s;
  s.kind = o.search.value_or(spec.tuning.search);
  if (o.effort) {
    if (*o.effort == Effort::quick) s.kind = SearchKind::budgeted, s.settle = true;
    else if (*o.effort == Effort::full) s.kind = SearchKind::exhaustive;
    else s.kind = spec.tuning.search;
  }
  if (o.budget_seconds > 0 && !o.search && (!o.effort || *o.effort != Effort::full)) s.kind = SearchKind::budgeted;
  s.automatic = !o.search && !o.effort && o.budget_seconds <= 0 && !spec.tuning.search_given &&
                s.kind == SearchKind::exhaustive;
  return s;
}

constexpr size_t kNone = static_cast<size_t>(-1);

// One Tuner::tune of one call: a record that answers, else, holding the
// key's lock, the steps prune → compile → reference → time → re-time →
// choose → store.
class Tuning {
 public:
  Tuning(Tuner::Parts& p, const CallView& call, const TuneOptions& o)
      : p_(p), o_(o), call_(call), spec_(call.spec), search_(choose_search(call.spec, o)) {}

  // A record that answers the call without tuning, or nullopt.
  std::optional<TuneOutcome> answer(std::optional<TuningRecord> rec);
  // The outcome of a call that must not tune and has no record that answers.
  TuneOutcome none() const;
  // Tunes the call (the key's lock held); `existing`: its record, if any.
  TuneOutcome run(std::optional<TuningRecord> existing);

 private:
  bool warm_answer(const TuningRecord& rec) const;
  // `plan`: this space pruned for the call, where it was (its reasons where none can run it).
  TuneOutcome answered(TuningRecord rec, std::optional<Config> choice, const Candidates* plan = nullptr) const;
  // A space with many runnable configs for this call is searched quickly
  // when nobody chose the search.
  void automatic_search(size_t runnable) {
    if (search_.automatic && runnable > static_cast<size_t>(p_.opts.quick_above))
      search_.kind = SearchKind::budgeted, search_.settle = true;
  }
  size_t budget_left() const {
    return cap_ <= 0 ? SIZE_MAX : static_cast<size_t>(std::max<int64_t>(0, cap_ - static_cast<int64_t>(fresh_.size())));
  }
  void pick_reference();
  void search(SearchStrategy& strategy);
  void evaluate(const std::vector<size_t>& batch, const char* what);
  std::vector<size_t> compile(std::vector<size_t> todo, const char* what);
  void time(const std::vector<size_t>& todo, const char* what);
  void describe_search(SearchStrategy& strategy);
  void judge_reference();
  void retime_contenders();
  void choose_and_store();

  Tuner::Parts& p_;
  const TuneOptions& o_;
  const CallView& call_;
  const KernelSpec& spec_;
  SearchChoice search_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  // The state of a tuning (run()).
  std::optional<TuningRecord> existing_;
  std::unique_ptr<Session> s_;
  Candidates plan_;
  std::map<size_t, ConfigResult> done_;  // candidate index -> its result, reused or evaluated now
  std::set<size_t> fresh_;               // evaluated by this tuning
  RegisterSiblings siblings_;
  int cap_ = 0;
  size_t ref_ = kNone;
  bool ref_declared_ = false;
  TuningRecord rec_;
  TuneOutcome out_;
};

// The warm path: a record tuned over this very config space, holding what
// the search wants, answers without a binary key computed or a library
// opened (a library choice is opened when it runs, not to check that it could).
bool Tuning::warm_answer(const TuningRecord& rec) const {
  if (!rec.verdict.empty() || !rec.best || !(rec.space.hash() == spec_.space.hash())) return false;
  size_t pruned = 0;
  for (const auto& c : rec.configs) {
    if (!c.config.library.empty() || c.kind != FailKind::pruned) continue;
    ++pruned;
    // Pruned for the call it was tuned at (alignment, an unkeyed scalar)
    // but runnable for this one: it must be timed, so not the warm path.
    if (c.binary.empty() && Tuner::why_not(spec_, c.config, call_.slot_data(), call_.limits).empty()) return false;
  }
  for (const auto& lib : spec_.libraries) {
    auto it = std::find_if(rec.configs.begin(), rec.configs.end(),
                           [&](const ConfigResult& c) { return c.config.library == lib; });
    if (it == rec.configs.end() || it->kind == FailKind::unavailable) return false;  // look again: it may be here now
  }
  SearchKind wanted = search_.kind;
  if (search_.automatic &&
      spec_.space.size() - std::min(pruned, spec_.space.size()) > static_cast<size_t>(p_.opts.quick_above))
    wanted = SearchKind::budgeted;
  const bool whole = rec.configs.size() >= spec_.space.size() + spec_.libraries.size();
  return whole || (rec.method != SearchMethod::exhaustive && wanted != SearchKind::exhaustive);
}

TuneOutcome Tuning::answered(TuningRecord rec, std::optional<Config> choice, const Candidates* plan) const {
  // A record with results none of which can run this call (a misaligned buffer, a size past a
  // bound, where the tuning key does not hold what the constraint reads): why, for the message
  // (this record is the cache's and is not stored again).
  // (The fastest template of the spec's space: a library choice is never pruned, and one this
  // tuning leaves out, or a config no longer in the space, was never a candidate.)
  if (!choice && rec.verdict.empty())
    for (const ConfigResult* r : rec.ranked()) {
      if (!r->config.library.empty() || !spec_.space.index_of(r->config)) continue;
      const std::string why = Tuner::why_not(spec_, r->config, call_.slot_data(), call_.limits);
      if (why.empty()) break;
      rec.verdict = spec_.space.params.empty()
                        ? fmt::format("its one config cannot run this call ({})", why)
                        : fmt::format("no config its record holds can run this call (the fastest, {}: {})",
                                      r->config.str(), why);
      break;
    }
  // Nothing of this space can run the call, and the record (of another space at this key, none of
  // whose results is a config here) says nothing of why: this space's reasons, in the answer only
  // (the record, which may hold results other calls use, is not stored again).
  if (!choice && rec.verdict.empty() && plan && plan->runnable.empty() && plan->libraries.empty()) {
    std::vector<std::string> why;
    for (const std::string& w : plan->pruned)
      if (!w.empty()) why.push_back(w);
    if (spec_.space.size() == 1 && spec_.libraries.empty() && !why.empty())
      rec.verdict = fmt::format("its one config cannot run this call ({})", why[0]);
    else if (!why.empty())
      rec.verdict = no_config_can_run(why);
  }
  TuneOutcome out;
  out.choice = std::move(choice);
  out.record = std::move(rec);
  out.from_cache = true;
  return out;
}

// A noisy record answers a call that must not tune (the hot path takes its
// choice as it is); a tuning re-measures it (retime_contenders).
std::optional<TuneOutcome> Tuning::answer(std::optional<TuningRecord> rec) {
  if (!rec || o_.force) return std::nullopt;
  if (rec->noisy && o_.remeasure_noisy && !o_.cached_only && rec->best && rec->remeasured < Tuner::kMaxRemeasures)
    return std::nullopt;
  if (warm_answer(*rec))
    if (auto c = Tuner::choose(*rec, spec_, call_.slot_data(), call_.limits, Tuner::plans_per_shape_of(*p_.backend))) return answered(std::move(*rec), c);
  // The whole space pruned for this call, to see that the record covers it.
  const auto t0 = std::chrono::steady_clock::now();
  BinaryKeyer keyer(spec_, *p_.backend);
  Candidates plan = prune(call_, rec, &keyer, *p_.backend);
  automatic_search(plan.runnable.size());
  const bool whole = complete(plan, *rec, spec_, search_.kind);
  log::debug("kernel '{}' at {}: its record checked against the space pruned for this call ({} configs) in {:.2f} ms",
             spec_.name, call_.key.values_text(), spec_.space.size(), log::ms_since(t0));
  if (!whole) return std::nullopt;
  auto c = Tuner::choose(*rec, spec_, call_.slot_data(), call_.limits, Tuner::plans_per_shape_of(*p_.backend));
  return answered(std::move(*rec), c, &plan);
}

TuneOutcome Tuning::none() const {
  TuneOutcome none;
  none.record.kernel = spec_.name;
  none.record.key = call_.key;
  return none;
}

TuneOutcome Tuning::run(std::optional<TuningRecord> existing) {
  if (o_.force) existing.reset();
  existing_ = std::move(existing);
  cap_ = o_.max_configs > 0 ? o_.max_configs : p_.opts.tune_max_configs;
  s_ = std::make_unique<Session>(p_, call_, o_);
  plan_ = prune(call_, existing_, &s_->keyer(), *p_.backend);  // 1. prune
  automatic_search(plan_.runnable.size());
  done_ = plan_.reused;
  rec_.kernel = spec_.name;
  rec_.key = call_.key;
  rec_.space = spec_.space;
  rec_.timed = existing_ ? existing_->timed : 0;
  pick_reference();
  std::unique_ptr<SearchStrategy> strategy = make_search(search_.kind, search_.settle, call_, plan_.pruned, p_.cache);
  rec_.method = strategy->method();
  log::info("tuning kernel '{}' at {}: {} configs, {} runnable, {} with results already, {} search", spec_.name,
            call_.key.values_text(), spec_.space.size(), plan_.runnable.size(), plan_.reused.size(),
            search_method_name(rec_.method));
  search(*strategy);  // 2-4. compile, reference, time
  describe_search(*strategy);
  judge_reference();
  retime_contenders();  // 5. re-time
  choose_and_store();   // 6, 7. choose, store
  return std::move(out_);
}

// The reference: the spec's, else the record's, else the first config that runs.
void Tuning::pick_reference() {
  if (spec_.tuning.reference_config) {
    ref_ = spec_.space.index_of(*spec_.tuning.reference_config).value_or(kNone);
    ref_declared_ = ref_ != kNone;
    if (ref_ != kNone && !plan_.pruned[ref_].empty()) {
      log::warn("kernel '{}': the reference config {} cannot run at {} ({}); the first config that runs is the "
                "reference instead",
                spec_.name, spec_.space.at(ref_).str(), call_.key.values_text(), plan_.pruned[ref_]);
      ref_ = kNone;
      ref_declared_ = false;
    }
  }
  if (ref_ == kNone && existing_ && !existing_->reference.empty()) {
    std::vector<size_t> all = plan_.runnable;
    all.insert(all.end(), plan_.libraries.begin(), plan_.libraries.end());
    for (size_t i : all)
      if (candidate(spec_, i).str() == existing_->reference && done_.count(i) && done_[i].ok()) ref_ = i;
  }
}

// Library choices first: each is one call, and where the spec names no
// reference, a vendor library is the one to trust. Then the strategy's
// batches until it has no more or the budget is spent.
void Tuning::search(SearchStrategy& strategy) {
  if (!plan_.libraries.empty()) {
    if (ref_ == kNone) {
      ref_ = plan_.libraries.front();
      ref_declared_ = false;
    }
    evaluate(plan_.libraries, "library choices");
  }
  for (;;) {
    SearchState st{spec_.space, plan_.runnable,
                   [&](size_t i) -> const ConfigResult* {
                     auto it = done_.find(i);
                     return it == done_.end() ? nullptr : &it->second;
                   },
                   budget_left()};
    if (o_.budget_seconds > 0)
      st.seconds_left =
          o_.budget_seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    std::vector<size_t> batch = strategy.next(st);
    if (batch.empty() && budget_left() > 0 && st.seconds_left > 0) {
      std::vector<ConfigResult*> again;
      for (size_t i : strategy.confirm(st))
        if (done_.count(i) && done_[i].ok()) again.push_back(&done_[i]);
      if (again.size() >= 2) {
        s_->refine(again, 3);
        continue;
      }
    }
    if (batch.empty() || budget_left() == 0) break;
    const size_t before = done_.size();
    evaluate(batch, rec_.method == SearchMethod::exhaustive ? "configs" : "neighbours");
    if (done_.size() == before) {
      // Nothing new was evaluated (the budget, or every proposal known): a
      // strategy that proposes known configs only is done.
      bool all_known = true;
      for (size_t i : batch) all_known = all_known && done_.count(i);
      if (!all_known) break;
    }
  }
}

// Evaluates a batch: compiles in parallel, then times one at a time.
void Tuning::evaluate(const std::vector<size_t>& batch, const char* what) {
  std::vector<size_t> todo;
  for (size_t i : batch)
    if (!done_.count(i) && plan_.pruned[i].empty() && todo.size() < budget_left()) todo.push_back(i);
  if (todo.empty()) return;
  // The reference's outputs must be at hand before anything is compared with them.
  if (!s_->have_reference() && ref_ != kNone && done_.count(ref_) && !fresh_.count(ref_))
    if (!s_->check_reference(candidate(spec_, ref_))) ref_ = kNone;
  if (!s_->have_reference() && ref_ != kNone && !done_.count(ref_)) {
    auto it = std::find(todo.begin(), todo.end(), ref_);
    if (it != todo.end()) todo.erase(it);
    todo.insert(todo.begin(), ref_);
  }
  time(compile(std::move(todo), what), what);
}

// Submits the batch's compiles (pruning by a sibling's registers where the
// spec asks for it) and waits for them; returns the configs to time.
std::vector<size_t> Tuning::compile(std::vector<size_t> todo, const char* what) {
  std::vector<BinaryFuture> fs;
  if (!spec_.tuning.registers_by.empty()) {
    RegisterSiblings::Batch b = siblings_.compile(
        todo, [&](size_t i) { return candidate(spec_, i); }, *s_, *p_.backend, what);
    for (auto& [i, r] : b.pruned) done_[i] = std::move(r);
    todo = std::move(b.kept);
    fs = std::move(b.futures);
  } else {
    for (size_t i : todo) fs.push_back(s_->compile(candidate(spec_, i)));
  }
  wait_all(fs, fmt::format("compiling {} {}", spec_.name, what), s_->show());
  return todo;
}

void Tuning::time(const std::vector<size_t>& todo, const char* what) {
  ProgressBar bar(fmt::format("benchmarking {} {}", spec_.name, what), todo.size(), s_->show());
  for (size_t k = 0; k < todo.size(); ++k) {
    if (o_.cancel && o_.cancel->load(std::memory_order_relaxed))
      throw Error(Errc::cancelled,
                  fmt::format("kernel '{}' at {}: tuning stopped", spec_.name, call_.key.values_text()));
    const Config c = candidate(spec_, todo[k]);
    done_[todo[k]] = s_->evaluate(c);
    fresh_.insert(todo[k]);
    out_.evaluated.push_back(c.str());
    bar.set(k + 1);
  }
}

// Where the search started, what pruned before compiling, and how much of
// the space a partial search timed, for the record.
void Tuning::describe_search(SearchStrategy& strategy) {
  rec_.start = strategy.start();
  if (siblings_.pruned() > 0)
    rec_.start += fmt::format("{}{} pruned before compiling by a sibling's registers", rec_.start.empty() ? "" : "; ",
                              siblings_.pruned());
  if (rec_.method == SearchMethod::budgeted || !rec_.start.empty()) {
    size_t timed = 0;
    for (size_t i : plan_.runnable) timed += done_.count(i) && done_[i].kind != FailKind::pruned;
    rec_.start += fmt::format("; {} of {} runnable configs timed in {:.1f} s{}", timed, plan_.runnable.size(),
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(),
                              o_.budget_seconds > 0 ? fmt::format(" (budget {:g} s)", o_.budget_seconds) : "");
  }
}

// The verdict on a reference that no other config agrees with.
void Tuning::judge_reference() {
  size_t agreeing = 0;
  for (const auto& [i, r] : done_)
    if (r.ok() && candidate(spec_, i).str() != s_->reference()) ++agreeing;
  if (!ref_declared_ && s_->have_reference() && agreeing == 0 && s_->disagreed() > 0) {
    rec_.verdict = fmt::format(
        "the reference config {} (the first that ran) disagrees with every other config that ran ({} of them); "
        "kiln cannot tell which is right, so it chooses none: name a config you trust as [tuning] reference",
        s_->reference(), s_->disagreed());
  }
}

// Re-times the contenders side by side when one of them is new, or when the
// record is noisy and re-measured; sets the record's noise.
void Tuning::retime_contenders() {
  std::vector<ConfigResult*> ok;
  for (auto& [i, r] : done_)
    if (r.ok()) ok.push_back(&r);
  std::vector<ConfigResult*> contenders = contenders_of(ok);
  // A noisy record is re-measured; a lone contender whose own timings
  // spread past the bound is no clear winner either, nor is a new config
  // that leads the record's older timings alone (timed at another moment:
  // a machine less busy now makes it look faster): each is re-timed
  // beside the runner-up.
  const bool remeasure =
      existing_ && existing_->noisy && o_.remeasure_noisy && !o_.force && existing_->remeasured < Tuner::kMaxRemeasures;
  auto is_fresh = [&](const ConfigResult* r) {
    for (size_t f : fresh_)
      if (candidate(spec_, f) == r->config) return true;
    return false;
  };
  if (contenders.size() == 1 && ok.size() > 1 &&
      (remeasure || s_->spread_of(contenders[0]->binary) > p_.opts.noise_bound ||
       (existing_ && is_fresh(contenders[0])))) {
    std::vector<ConfigResult*> rest;
    for (ConfigResult* r : ok)
      if (r != contenders[0]) rest.push_back(r);
    contenders.push_back(contenders_of(rest)[0]);
  }
  bool any_fresh = false;
  for (ConfigResult* r : contenders) any_fresh = any_fresh || is_fresh(r);
  rec_.noise = existing_ ? existing_->noise : 0;
  rec_.noisy = existing_ && existing_->noisy;
  rec_.remeasured = existing_ ? existing_->remeasured : 0;
  if (contenders.size() > 1 && (any_fresh || remeasure) && rec_.verdict.empty()) {
    std::vector<ConfigResult> before;
    for (ConfigResult* c : contenders) before.push_back(*c);
    const double noise = retime(*s_, contenders, p_.opts.noise_bound);
    out_.retimed_now = contenders.size();
    rec_.noise = noise;
    if (remeasure && !any_fresh) {
      ++rec_.remeasured;
      if (noise >= existing_->noise) {
        // No quieter than what the record holds: its timings stay (a failure seen now stays too).
        for (size_t i = 0; i < contenders.size(); ++i)
          if (contenders[i]->ok()) *contenders[i] = before[i];
        rec_.noise = existing_->noise;
        log::info("kernel '{}' at {}: re-measured, no quieter ({:.1f}% against {:.1f}%); the record stays",
                  spec_.name, call_.key.values_text(), noise * 100, existing_->noise * 100);
      }
    }
    rec_.noisy = rec_.noise > p_.opts.noise_bound;
    if (rec_.noisy) {
      // As many decimals (up to 3) as it takes for the spread not to print equal to the bound it passed.
      int digits = 0;
      while (digits < 3 && fmt::format("{:.{}f}", rec_.noise * 100, digits) ==
                               fmt::format("{:.{}f}", p_.opts.noise_bound * 100, digits))
        ++digits;
      log::warn("kernel '{}' at {}: the fastest configs' timings spread {:.{}f}% (more than KILN_NOISE_BOUND, "
                "{:.{}f}%) after re-timing them {}: the machine is busy; stored flagged as noisy, to be re-measured "
                "by the next tuning of this key",
                spec_.name, call_.key.values_text(), rec_.noise * 100, digits, p_.opts.noise_bound * 100, digits,
                remeasure ? "again" : "three times");
    }
  } else if (contenders.size() == 1 && any_fresh) {
    rec_.noise = s_->spread_of(contenders[0]->binary);
    rec_.noisy = false;  // the only config that ran: nothing to tell apart
  }
  if (ok.size() <= 1) rec_.noisy = false;  // one config left that runs: nothing to re-measure it against
}

// Every candidate's result or why it was pruned; the fastest correct one
// wins (Tuner::choose); the record is stored for every later process.
void Tuning::choose_and_store() {
  for (size_t i = 0; i < spec_.space.size() + spec_.libraries.size(); ++i) {
    if (!plan_.pruned[i].empty()) {
      ConfigResult r;
      r.config = candidate(spec_, i);
      r.kind = plan_.unavailable[i] ? FailKind::unavailable : FailKind::pruned;
      r.error = plan_.unavailable[i] ? "unavailable: " + plan_.pruned[i] : "pruned: " + plan_.pruned[i];
      rec_.configs.push_back(std::move(r));
    } else if (done_.count(i)) {
      rec_.configs.push_back(done_[i]);
    }
  }
  rec_.reference = s_->have_reference() ? s_->reference() : (existing_ ? existing_->reference : "");
  rec_.timed += fresh_.size();
  rec_.peak_device_bytes = std::max(existing_ ? existing_->peak_device_bytes : 0, s_->peak_device_bytes());
  if (rec_.verdict.empty()) {
    if (auto c = Tuner::choose(rec_, spec_, call_.slot_data(), call_.limits, Tuner::plans_per_shape_of(*p_.backend))) {
      rec_.best = *c;
      rec_.best_ns = *rec_.find(*c)->ns;
    }
  }
  rec_.kiln_version = kiln_version();
  rec_.when = utc_now();
  out_.timed_now = fresh_.size();
  out_.peak_device_bytes = s_->peak_device_bytes();
  out_.compile_wait_s = s_->compile_wait_s();
  out_.bench_s = s_->bench_s();
  out_.choice = rec_.best;
  if (p_.cache) {
    try {
      p_.cache->put(rec_);
    } catch (const Error& e) {
      out_.stored = false;
      log::warn("kernel '{}' at {}: tuned, but the record could not be stored, so the next process will tune "
                "again: {}",
                spec_.name, call_.key.values_text(), e.what());
    }
  }
  out_.record = std::move(rec_);
}

}  // namespace

TuneOutcome Tuner::tune(const KernelSpec& spec, void* const* params, const TuneOptions& o) {
  return tune(CallView(spec, *p_.backend, params), o);
}

TuneOutcome Tuner::tune(const CallView& given, const TuneOptions& o) {
  // Templates only: a spec without its library choices (they are not in the key).
  std::optional<KernelSpec> templates_only;
  std::optional<CallView> templates_call;
  if (!o.libraries && !given.spec.libraries.empty()) {
    templates_only = given.spec;
    templates_only->libraries.clear();
    templates_call.emplace(*templates_only, *p_.backend, given.params);
  }
  const CallView& call = templates_call ? *templates_call : given;
  Tuning t(p_, call, o);
  if (p_.cache)
    if (auto out = t.answer(p_.cache->get(call.key))) return std::move(*out);
  if (o.cached_only) return t.none();
  TuneOutcome outcome;
  auto locked = [&] {
    // Another process may have tuned this key while we waited for its lock.
    std::optional<TuningRecord> existing = p_.cache ? p_.cache->get(call.key) : std::nullopt;
    if (auto out = t.answer(existing)) outcome = std::move(*out);
    else outcome = t.run(std::move(existing));
  };
  if (p_.cache) p_.cache->with_lock(call.key, locked);
  else locked();
  return outcome;
}

}  // namespace kiln
