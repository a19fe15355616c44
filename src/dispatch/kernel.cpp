#include "compile/compile_pool.hpp"
#include "kiln/kernel.hpp"

#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

namespace {
// Background compiles are for spaces an exhaustive search will compile
// anyway; a larger or searched space compiles what its search asks for.
constexpr size_t kBackgroundCompileMax = 1024;
}  // namespace

struct Kernel::Impl {
  Impl(Runtime& r, KernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), shape(spec.name, spec.args, CallShape::memo_key(spec)),
        memo(static_cast<int>(shape.key_size()), static_cast<size_t>(r.options().memo_capacity)) {}
  Runtime& rt;
  KernelSpec spec;
  TuneOptions tune;
  CallShape shape;
  ShapeMemo<const Choice*> memo;
  std::mutex m;  // guards choices and background
  std::vector<std::unique_ptr<Choice>> choices;  // one per (config, source): bounded by the space
  std::vector<BinaryFuture> background;
  bool started = false;

  // `asked`: prepare() was called, so compile even with background compiling off.
  void start_background(bool asked) {
    std::lock_guard<std::mutex> g(m);
    if (started || (!asked && !rt.options().compiles_ahead())) return;
    started = true;
    if (spec.space.size() > kBackgroundCompileMax || spec.tuning.search != SearchKind::exhaustive) return;
    CompilePool& pool = rt.compile_pool(spec.backend);
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    for (const auto& c : spec.space.all())
      if (statically_pruned(spec, c, limits).empty()) background.push_back(pool.submit(make_compile_request(spec, c)));
  }

  const Choice* choice_for(const Config& c, const std::string& source) {
    std::lock_guard<std::mutex> g(m);
    for (const auto& x : choices)
      if (x->config == c && x->source == source) return x.get();
    auto x = std::make_unique<Choice>();
    x->config = c;
    x->source = source;
    auto bin = rt.compile_pool(spec.backend).submit(spec, c, /*urgent=*/true).get();
    x->kernel = rt.load(*bin);
    if (c.library.empty()) x->plan = LaunchPlan(spec, c, rt.backend(spec.backend).limits());
    choices.push_back(std::move(x));
    return choices.back().get();
  }
};

Kernel::Kernel(Runtime& rt, KernelSpec spec, TuneOptions tune)
    : impl_(std::make_unique<Impl>(rt, std::move(spec), tune)) {
  impl_->start_background(false);
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
  const Choice* c;
  if (!impl_->memo.find(key, &c)) c = decide(params, key, stream);
  c->kernel->launch(params, c->plan.eval(slots), stream);
}

const Choice& Kernel::choice(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  int64_t key[CallShape::kMaxKey];
  impl_->shape.read(params, slots, key);
  const Choice* c;
  if (!impl_->memo.find(key, &c)) c = decide(params, key, nullptr);
  return *c;
}

const Choice* Kernel::decide(void* const* params, const int64_t* key, Stream stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.memo.mutex());
  const Choice* found;
  if (m.memo.find(key, &found)) return found;  // another thread decided meanwhile
  TuneOptions to = m.tune;
  to.stream = stream;
  // A record (local, artifact, remote) answers with no need of the whole
  // space compiled: only the chosen config is compiled, ahead of the rest.
  to.cached_only = true;
  TuneOutcome o = m.rt.tune(m.spec, params, to);
  if (!o.choice) {
    // Tuning: wait for what the background compile has left (none was started with it off).
    std::vector<BinaryFuture> fs;
    {
      std::lock_guard<std::mutex> lk(m.m);
      fs = m.background;
    }
    for (const auto& f : fs) f.wait();
    to.cached_only = false;
    o = m.rt.tune(m.spec, params, to);
  }
  if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
  const Choice* c = m.choice_for(*o.choice, o.from_cache ? "cache" : "tuned");
  log::info("kernel '{}' at {}: {} ({})", m.spec.name, o.record.key.values_text(), c->config.str(), c->source);
  m.memo.insert(key, c);
  return c;
}

void Kernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
