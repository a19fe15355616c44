#include "compile/compile_pool.hpp"
#include "kiln/kernel.hpp"

#include "kiln/args.hpp"

#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_copy.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/first_call.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/ext/library.hpp"
#include "kiln/plan.hpp"
#include "kiln/runtime.hpp"
#include "kiln/tuning.hpp"

#include <map>
#include <ostream>

namespace kiln {

namespace {
// Background compiles are for spaces an exhaustive search will compile
// anyway; a larger or searched space compiles what its search asks for.
constexpr size_t kBackgroundCompileMax = 1024;
}  // namespace

// A choice with its launch plan (the plan is the dispatcher's, not the application's).
struct Kernel::Chosen : Choice {
  LaunchPlan plan;
};

namespace {
// The key names a kernel's handle remembers its choice by bucket: its spec's
// bucketed key names, unless a constraint ties a config's params to one of them
// (a choice made at one value of the bucket might not run at another: it is
// then remembered per value, and a record answers each new one).
std::vector<std::string> memo_pow2(const KernelSpec& spec) {
  for (const auto& c : spec.constraints) {
    const std::vector<std::string> names = c.symbols();
    bool bucketed = false, param = false;
    for (const auto& n : names) {
      bucketed = bucketed || std::find(spec.tuning.pow2.begin(), spec.tuning.pow2.end(), n) != spec.tuning.pow2.end();
      for (const auto& p : spec.space.params) param = param || p.name == n;
    }
    if (bucketed && param) return {};
  }
  return spec.tuning.pow2;
}

// The constraints a call must meet that the memo's buckets hide: those that read a bucketed
// key name (none of which reads a param: memo_pow2 keeps such names exact), compiled once.
// A choice remembered for a bucket is reused at its other values, so these are checked at
// every call (S + T <= CAP of a cache's bound, say: a call past the cache is refused, not run
// past the buffers). A constraint that also reads SM_COUNT is not among them (compiling it needs
// the device, which a handle does not touch until its first call; no spec has one).
std::vector<std::pair<size_t, CompiledExpr>> bucket_guards(const KernelSpec& spec) {
  std::vector<std::pair<size_t, CompiledExpr>> out;
  const std::vector<std::string> bucketed = memo_pow2(spec);
  if (bucketed.empty()) return out;
  for (size_t i = 0; i < spec.constraints.size(); ++i) {
    const std::vector<std::string> names = spec.constraints[i].symbols();
    auto reads = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    if (reads(std::string(kSmCountSymbol)) || std::none_of(bucketed.begin(), bucketed.end(), reads)) continue;
    out.emplace_back(i, compile_expr(spec, spec.constraints[i], nullptr));
  }
  return out;
}
}  // namespace

struct Kernel::Impl {
  Impl(Runtime& r, KernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), shape(spec.name, spec.args, CallShape::memo_key(spec), memo_pow2(spec)),
        memo(static_cast<int>(shape.key_size()), static_cast<size_t>(r.options().memo_capacity)),
        guards(bucket_guards(spec)) {}
  Runtime& rt;
  KernelSpec spec;
  TuneOptions tune;
  CallShape shape;
  ShapeMemo<const Chosen*> memo;
  const std::vector<std::pair<size_t, CompiledExpr>> guards;  // bucket_guards(spec)

  // Throws Error(Errc::usage) when the call breaks a constraint its bucket hides.
  void check_guards(const int64_t* slots) const {
    for (const auto& [i, e] : guards)
      if (e.eval(slots) == 0)
        fail(Errc::usage, "kernel '{}': this call breaks its constraint '{}'", spec.name, spec.constraints[i].str());
  }
  std::mutex m;  // guards choices and background
  std::vector<std::unique_ptr<Chosen>> choices;  // one per (config, source): bounded by the space
  std::vector<BinaryFuture> background;
  bool started = false;
  Swaps<Chosen> swaps;  // shapes tuned in the background (KILN_FIRST_CALL=swap); under memo.mutex()

  // `asked`: prepare() was called, so compile even with background compiling off.
  // `stop`: set when the runtime goes away (no more is submitted).
  void start_background(bool asked, const std::atomic<bool>* stop = nullptr) {
    std::lock_guard<std::mutex> g(m);
    if (started || (!asked && !rt.options().compiles_ahead())) return;
    started = true;
    if (spec.space.size() > kBackgroundCompileMax || spec.tuning.search != SearchKind::exhaustive) return;
    CompilePool& pool = rt.compile_pool(spec.backend);
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    std::vector<Config> runnable;
    for (const auto& c : spec.space.all())
      if (statically_pruned(spec, c, limits).empty()) runnable.push_back(c);
    // A space its tunings will search quickly (Options::quick_above) compiles
    // what each search asks for, not all of it.
    if (!spec.tuning.search_given && runnable.size() > static_cast<size_t>(rt.options().quick_above)) return;
    for (const auto& c : runnable) {
      if (stop && *stop) return;
      background.push_back(pool.submit(make_compile_request(spec, c)));
    }
  }

  // What a handle compiles as it is made, on the runtime's background thread
  // so that making it costs the caller nothing: its space, unless the tuning
  // cache holds records of this kernel on this device already (a warm process:
  // its first calls are answered by them, and compiling the rest would only
  // compete with them; a shape it lacks is then compiled as its tuning asks).
  // Where the records are here, they are read now (the tuning cache keeps them
  // parsed, off the first call's path), with an artifact too.
  void compile_ahead(const std::atomic<bool>& stop) {
    {
      std::lock_guard<std::mutex> g(m);
      if (started) return;
    }
    if (std::shared_ptr<TuningCache> cache = rt.tuning_cache())
      if (size_t n = cache->all(plan_base_key(spec, rt.backend(spec.backend))).size()) {
        log::debug("kernel '{}': the tuning cache holds {} records of it; nothing compiled ahead", spec.name, n);
        return;
      }
    if (!stop && rt.options().compiles_ahead()) start_background(false, &stop);
  }

  const Chosen* choice_for(const Config& c, ChoiceSource source) {
    std::lock_guard<std::mutex> g(m);
    for (const auto& x : choices)
      if (x->config == c && x->source == source) return x.get();
    auto x = std::make_unique<Chosen>();
    x->config = c;
    x->source = source;
    const auto t0 = std::chrono::steady_clock::now();
    auto bin = rt.compile_pool(spec.backend).submit(spec, c, /*urgent=*/true).get();
    const double got = log::ms_since(t0);
    x->kernel = rt.load(*bin);
    if (log::debugging())
      log::debug("kernel '{}': config {} ready in {:.2f} ms (its binary in {:.2f} ms)", spec.name, c.str(),
                 log::ms_since(t0), got);
    if (c.library.empty()) x->plan = LaunchPlan(spec, c, rt.backend(spec.backend).limits());
    choices.push_back(std::move(x));
    return choices.back().get();
  }

  const Chosen* first_call(const CallView& call, const std::vector<int64_t>& shape_key, Stream stream, FirstCall mode);
  const Chosen* while_library_readies(const CallView& call, const std::vector<int64_t>& shape_key, const Config& choice,
                                      const TuningRecord& record);
  void tune_behind(const CallView& call, const std::vector<int64_t>& shape_key, Stream stream, const Chosen* running,
                   const std::string& why);
  std::weak_ptr<Impl> self;  // what a background tuning keeps alive
};

Kernel::Kernel(Runtime& rt, KernelSpec spec, TuneOptions tune)
    : impl_(std::make_shared<Impl>(rt, std::move(spec), tune)) {
  rt.backend(impl_->spec.backend).check_libraries(impl_->spec);
  impl_->self = impl_;
  if (rt.options().background_compile)  // compile_ahead() reads records, or compiles where compiles_ahead()
    rt.run_ahead(fmt::format("compiling kernel '{}' ahead", impl_->spec.name),
                         [w = std::weak_ptr<Impl>(impl_)](const std::atomic<bool>& stop) {
                           if (stop) return;
                           if (std::shared_ptr<Impl> i = w.lock()) i->compile_ahead(stop);
                         });
}

Kernel::~Kernel() {
  if (!impl_) return;
  // Background compiles finish in the pool; nothing here waits on them.
}
Kernel::Kernel(Kernel&&) noexcept = default;
Kernel& Kernel::operator=(Kernel&&) noexcept = default;

const KernelSpec& Kernel::spec() const { return impl_->spec; }
size_t Kernel::shapes_seen() const {
  std::lock_guard<std::mutex> g(impl_->memo.mutex());
  return impl_->memo.size();
}

void Kernel::prepare() {
  impl_->start_background(true);
  std::vector<BinaryFuture> fs;
  {
    std::lock_guard<std::mutex> g(impl_->m);
    fs = impl_->background;
  }
  for (const auto& f : fs) f.wait();
}

void Kernel::launch(void* const* params, Stream stream) {
  int64_t slots[CallShape::kMaxArgs];
  int64_t key[CallShape::kMaxKey];
  impl_->shape.read(params, slots, key);
  const Chosen* c;
  impl_->check_guards(slots);
  if (!impl_->memo.find(key, &c)) c = decide(params, key, stream);
  c->kernel->launch(params, c->plan.eval(slots), stream);
}

const Choice& Kernel::choice(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  int64_t key[CallShape::kMaxKey];
  impl_->shape.read(params, slots, key);
  const Chosen* c;
  impl_->check_guards(slots);
  if (!impl_->memo.find(key, &c)) c = decide(params, key, nullptr);
  return *c;
}

const Kernel::Chosen* Kernel::decide(void* const* params, const int64_t* key, Stream stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.memo.mutex());
  const Chosen* found;
  if (m.memo.find(key, &found)) return found;  // another thread decided meanwhile
  std::vector<int64_t> shape_key(key, key + m.shape.key_size());
  if (const Chosen* safe = m.swaps.running(shape_key)) {
    m.memo.insert(key, safe);  // evicted while its tuning runs: the safe choice again
    return safe;
  }
  const CallView call(m.spec, m.rt.backend(m.spec.backend), params);
  TuneOptions to = m.tune;
  to.stream = stream;
  // A record (local, artifact, remote) answers with no need of the whole
  // space compiled: only the chosen config is compiled, ahead of the rest.
  to.cached_only = true;
  const auto t0 = std::chrono::steady_clock::now();
  TuneOutcome o = m.rt.tune(call, to);
  if (log::debugging())  // (a new shape of a decode loop comes here: nothing formatted otherwise)
    log::debug("kernel '{}' at {}: the caches looked up in {:.2f} ms ({})", m.spec.name, call.key.values_text(),
               log::ms_since(t0), o.from_cache ? "a record" : "none");
  // A shape that will be tuned: the space compiled ahead now if the runtime's thread
  // has not yet (or would not: another shape's record is here), so that a tuning
  // waits for those compiles, not timing beside them.
  if (!o.choice && !o.from_cache) m.start_background(false);
  const FirstCall mode = first_call_mode(m.rt);
  // A record that answered without a choice (no config survived, or the
  // reference disagreed with all) is the answer: no safe choice overrides it.
  if (!o.choice && !o.from_cache && mode != FirstCall::wait) {
    // Its tuning key (a bucket of a bucketed key) is being tuned already: that tuning's
    // safe choice where it can run this call, not memoised.
    if (!m.spec.tuning.pow2.empty())
      if (const Chosen* joined = m.swaps.join(call.key.values_text()))
        if (Tuner::why_not(m.spec, joined->config, call.slot_data(), call.limits).empty()) return joined;
    if (const Chosen* c = m.first_call(call, shape_key, stream, mode)) {
      m.memo.insert(key, c);
      return c;
    }
    if (mode == FirstCall::serve)
      fail(Errc::tune, "kernel '{}' at {}: KILN_FIRST_CALL=serve, and no config can run this call without tuning",
           m.spec.name, call.key.values_text());
  }
  if (!o.choice) {
    // Tuning: wait for what the background compile has left (none was started with it off).
    std::vector<BinaryFuture> fs;
    {
      std::lock_guard<std::mutex> lk(m.m);
      fs = m.background;
    }
    for (const auto& f : fs) f.wait();
    to.cached_only = false;
    o = m.rt.tune(call, to);
  }
  if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
  if (o.from_cache && mode == FirstCall::swap)
    if (const Chosen* now = m.while_library_readies(call, shape_key, *o.choice, o.record)) {
      m.memo.insert(key, now);
      return now;
    }
  const Chosen* c = m.choice_for(*o.choice, o.from_cache ? ChoiceSource::cache : ChoiceSource::tuned);
  log::info("kernel '{}' at {}: {} ({})", m.spec.name, call.key.values_text(), c->config.str(), choice_source_name(c->source));
  m.memo.insert(key, c);
  // A record timed on a busy machine answers now and is re-measured behind
  // the calls; the re-measured choice replaces it if its timings are quieter.
  // A packed artifact's record is what the application ships with: it is
  // not re-measured (kiln pack re-measured it, and said so if it stayed noisy).
  if (o.from_cache && o.record.noisy && !o.record.from_artifact && mode == FirstCall::swap)
    m.tune_behind(call, shape_key, stream, c, "its record was timed on a busy machine: re-measuring it");
  return c;
}

// A shape with no record, under KILN_FIRST_CALL=swap or serve: the first
// safe choice that compiles, loads and (unless proven) runs cleanly in a
// worker runs now; with swap, the shape is tuned behind it. nullptr when no
// safe choice can run the call (the caller then tunes it as with wait).
// Holds memo.mutex().
const Kernel::Chosen* Kernel::Impl::first_call(const CallView& call, const std::vector<int64_t>& shape_key, Stream stream,
                                       FirstCall mode) {
  std::string failures;
  std::optional<SafeChoice> safe = first_safe_choice(
      rt, call, stream, tune.libraries,
      [&](const Config& cfg) -> const LoadedKernel& { return *choice_for(cfg, ChoiceSource::safe)->kernel; }, &failures);
  if (!safe) {
    log::info("kernel '{}': no safe choice could run this call; it is tuned before it returns:{}", spec.name,
              failures);
    return nullptr;
  }
  const Chosen* c = choice_for(safe->config, ChoiceSource::safe);
  if (mode == FirstCall::serve) rt.note_miss(spec, call.key, c->config.str(), safe->how);
  else tune_behind(call, shape_key, stream, c, safe->how);
  return c;
}

// A record's choice that calls a library still being readied in the background
// (a warm process's first calls, begun beside the device's making): the record's
// fastest own config with its binary at hand runs meanwhile, as a safe choice,
// and the record's choice replaces it once the library is ready (Swaps). Null
// where the choice is no such library's, or no own config is at hand (the call
// then waits for the library). Holds memo.mutex().
const Kernel::Chosen* Kernel::Impl::while_library_readies(const CallView& call, const std::vector<int64_t>& shape_key,
                                                          const Config& choice, const TuningRecord& record) {
  Library* lib = readying_library(rt, spec.backend, choice);
  if (!lib) return nullptr;
  std::optional<std::pair<Config, double>> own = own_choice_at_hand(rt, call, record);
  if (!own) return nullptr;
  const Chosen* now = choice_for(own->first, ChoiceSource::safe);
  const std::string at = call.key.values_text();
  log::info("kernel '{}' at {}: {} runs while {} is readied; then its record's {}", spec.name, at, now->config.str(),
            lib->name(), choice.str());
  swaps.start(rt, memo, self.lock(), shape_key, now, fmt::format("kernel '{}' at {}", spec.name, at),
              [this, lib, choice](const std::atomic<bool>& stop) -> const Chosen* {
                wait_readied(*lib, stop);
                return stop ? nullptr : choice_for(choice, ChoiceSource::cache);
              });
  return now;
}

// Tunes the call's shape on the runtime's background thread, on a copy of
// the call's arguments, while `running` answers its calls; the winner
// replaces it (Swaps). Holds memo.mutex().
void Kernel::Impl::tune_behind(const CallView& call, const std::vector<int64_t>& shape_key, Stream stream,
                               const Chosen* running, const std::string& why) {
  const std::string at = call.key.values_text();
  log::info("kernel '{}' at {}: {} ({}) runs while the shape is tuned in the background", spec.name, at,
            running->config.str(), why);
  auto copy = std::make_shared<CallCopy>(call, rt.backend(spec.backend).device(), stream);
  const Config safe_config = running->config;
  swaps.start(rt, memo, self.lock(), shape_key, running, fmt::format("kernel '{}' at {}", spec.name, at),
              [this, copy, call = call.on(copy->params()), safe_config, at](const std::atomic<bool>& stop) mutable
              -> const Chosen* {
                TuneOptions to = tune;
                to.stream = nullptr;
                to.show_progress = false;
                to.remeasure_noisy = true;  // a noisy record answered meanwhile is re-measured here
                to.cancel = &stop;
                TuneOutcome o = rt.tune(call, to);
                copy.reset();
                if (const ConfigResult* r = o.record.find(safe_config); r && !r->ok() && r->kind != FailKind::pruned)
                  log::warn("kernel '{}' at {}: the calls before the swap ran {}, which the tuning found {}: {}",
                            spec.name, at, safe_config.str(), fail_kind_name(r->kind), r->error);
                if (!o.choice) {
                  log::warn("kernel '{}' at {}: the background tuning chose nothing; the safe choice {} stays: {}",
                            spec.name, at, safe_config.str(), o.record.all_failed_message());
                  return nullptr;
                }
                const Chosen* c = choice_for(*o.choice, o.from_cache ? ChoiceSource::cache : ChoiceSource::tuned);
                log::info("kernel '{}' at {}: tuned in the background: {} replaces {}", spec.name, at,
                          c->config.str(), safe_config.str());
                return c;
              },
              spec.tuning.pow2.empty() ? std::string() : call.key.values_text());
}

Launchable::Running Kernel::running(void* const* params) {
  const Choice& c = choice(params);
  return {c.config.str(), c.source, !c.config.library.empty()};
}

bool Kernel::settled(void* const* params) { return choice(params).source != ChoiceSource::safe; }

const char* choice_source_name(ChoiceSource s) {
  switch (s) {
    case ChoiceSource::tuned: return "tuned";
    case ChoiceSource::cache: return "cache";
    case ChoiceSource::safe: return "safe";
    case ChoiceSource::benchmarked: return "benchmarked";
    case ChoiceSource::forced: return "forced";
    case ChoiceSource::only_variant: return "only variant";
    case ChoiceSource::size_hints: return "size hints";
    case ChoiceSource::plain: return "plain";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, ChoiceSource s) { return os << choice_source_name(s); }

void Kernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
