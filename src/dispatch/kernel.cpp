#include "kiln/kernel.hpp"

#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

struct Kernel::Impl {
  Impl(Runtime& r, KernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), shape(spec.name, spec.args, spec.tuning.key),
        memo(static_cast<int>(spec.tuning.key.size())) {}
  Runtime& rt;
  KernelSpec spec;
  TuneOptions tune;
  CallShape shape;
  ShapeMemo<Choice> memo;
};

Kernel::Kernel(Runtime& rt, KernelSpec spec, TuneOptions tune)
    : impl_(std::make_unique<Impl>(rt, std::move(spec), tune)) {}

Kernel::~Kernel() = default;
Kernel::Kernel(Kernel&&) noexcept = default;
Kernel& Kernel::operator=(Kernel&&) noexcept = default;

const KernelSpec& Kernel::spec() const { return impl_->spec; }
size_t Kernel::shapes_seen() const { return impl_->memo.size(); }

Choice* Kernel::find(void* const* params, int64_t* slots) {
  int64_t key[CallShape::kMaxKey];
  impl_->shape.read(params, slots, key);
  Choice* c = impl_->memo.find(key);
  return c ? c : decide(params, key);
}

void Kernel::launch(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  Choice* c = find(params, slots);
  c->kernel->launch(params, c->grid.eval(slots));
}

const Choice& Kernel::choice(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  return *find(params, slots);
}

Choice* Kernel::decide(void* const* params, const int64_t* key) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> g(m.memo.mutex());
  if (Choice* c = m.memo.find(key)) return c;  // another thread decided meanwhile
  TuneOutcome o = m.rt.tune(m.spec, params, m.tune);
  if (!o.record.best) throw Error(Errc::tune, o.record.all_failed_message());
  auto c = std::make_unique<Choice>();
  c->config = *o.record.best;
  c->source = o.from_cache ? "cache" : "tuned";
  c->ns = o.record.best_ns;
  auto bin = m.rt.compile_pool(m.spec.backend).submit(make_compile_request(m.spec, c->config)).get();
  c->kernel = m.rt.load(*bin);
  c->grid = GridPlan(m.spec, c->config);
  log::info("kernel '{}' at {}: {} ({}, {:.1f} us)", m.spec.name, o.record.key.values_text(), c->config.str(),
            c->source, c->ns / 1e3);
  return m.memo.insert(key, std::move(c));
}

void Kernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
