#include "kiln/kernel.hpp"

#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

struct Kernel::Impl {
  Impl(Runtime& r, KernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), memo(static_cast<int>(spec.tuning.key.size())) {}
  Runtime& rt;
  KernelSpec spec;
  TuneOptions tune;
  std::vector<std::pair<int, bool>> int_args;  // (argument, is i32) of every integer scalar
  std::vector<int> key_args;                   // argument of each tuning-key name
  std::vector<uint8_t> codes;                  // expected argument type codes
  ShapeMemo<Choice> memo;
};

Kernel::Kernel(Runtime& rt, KernelSpec spec, TuneOptions tune) {
  if (spec.args.size() > static_cast<size_t>(kMaxArgs))
    fail(Errc::usage, "kernel '{}' has {} arguments; kiln dispatches at most {}", spec.name, spec.args.size(), kMaxArgs);
  if (spec.tuning.key.size() > static_cast<size_t>(ShapeMemo<Choice>::kMaxKey))
    fail(Errc::usage, "kernel '{}' has {} tuning-key names; kiln takes at most {}", spec.name, spec.tuning.key.size(),
         ShapeMemo<Choice>::kMaxKey);
  impl_ = std::make_unique<Impl>(rt, std::move(spec), tune);
  const KernelSpec& s = impl_->spec;
  for (size_t i = 0; i < s.args.size(); ++i) {
    const ArgSpec& a = s.args[i];
    if (!a.pointer && !dtype_is_float(a.dtype)) impl_->int_args.push_back({static_cast<int>(i), a.dtype == DType::i32});
    impl_->codes.push_back(static_cast<uint8_t>(static_cast<int>(a.dtype) + (a.pointer ? 4 : 0)));
  }
  for (const auto& k : s.tuning.key) impl_->key_args.push_back(s.arg_index(k));
}

Kernel::~Kernel() = default;
Kernel::Kernel(Kernel&&) noexcept = default;
Kernel& Kernel::operator=(Kernel&&) noexcept = default;

const KernelSpec& Kernel::spec() const { return impl_->spec; }
size_t Kernel::shapes_seen() const { return impl_->memo.size(); }

void Kernel::launch(void* const* params) {
  Impl& m = *impl_;
  int64_t slots[kMaxArgs];
  for (const auto& [i, is32] : m.int_args)
    slots[i] = is32 ? *static_cast<const int32_t*>(params[i]) : *static_cast<const int64_t*>(params[i]);
  int64_t key[ShapeMemo<Choice>::kMaxKey];
  for (size_t k = 0; k < m.key_args.size(); ++k) key[k] = slots[m.key_args[k]];
  Choice* c = m.memo.find(key);
  if (!c) c = decide(params, key);
  c->kernel->launch(params, c->grid.eval(slots));
}

const Choice& Kernel::choice(void* const* params) {
  Impl& m = *impl_;
  int64_t slots[kMaxArgs];
  for (const auto& [i, is32] : m.int_args)
    slots[i] = is32 ? *static_cast<const int32_t*>(params[i]) : *static_cast<const int64_t*>(params[i]);
  int64_t key[ShapeMemo<Choice>::kMaxKey];
  for (size_t k = 0; k < m.key_args.size(); ++k) key[k] = slots[m.key_args[k]];
  Choice* c = m.memo.find(key);
  return c ? *c : *decide(params, key);
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

void Kernel::check_types(const uint8_t* codes, size_t n) const {
  const auto& want = impl_->codes;
  if (n == want.size() && std::memcmp(codes, want.data(), n) == 0) return;
  const KernelSpec& s = impl_->spec;
  if (n != want.size())
    fail(Errc::usage, "kernel '{}' takes {} arguments, got {}", s.name, want.size(), n);
  static const char* names[] = {"f32", "f64", "i32", "i64", "f32*", "f64*", "i32*", "i64*"};
  for (size_t i = 0; i < n; ++i)
    if (codes[i] != want[i])
      fail(Errc::usage, "kernel '{}': argument {} ('{}') is {} but the spec says {}", s.name, i, s.args[i].name,
           codes[i] < 8 ? names[codes[i]] : "a type kiln cannot pass", names[want[i]]);
}

}  // namespace kiln
