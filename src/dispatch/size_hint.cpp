#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>

#include "compile/compile_pool.hpp"
#include "core/format.hpp"
#include "kiln/ext/tuner.hpp"
#include "core/log.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/record_io.hpp"

namespace kiln {

struct SizeHintMultiKernel::Impl {
  struct Variant {
    Config config;
    std::shared_ptr<LoadedKernel> kernel;
    LaunchPlan plan;
  };

  Impl(Runtime& r, KernelSpec s, SizeHintOptions o)
      : rt(r), spec(std::move(s)), opts(o), shape(spec.name, spec.args, CallShape::memo_key(spec)),
        memo(static_cast<int>(shape.key_size()), static_cast<size_t>(r.options().memo_capacity)) {
    retune_after = opts.retune_after >= 0 ? opts.retune_after : r.options().retune_after;
  }

  Runtime& rt;
  KernelSpec spec;
  SizeHintOptions opts;
  CallShape shape;
  ShapeMemo<const Variant*> memo;
  int retune_after = 0;

  std::mutex m;  // guards everything below
  bool prepared = false;
  std::vector<std::pair<std::string, std::string>> other_scalars;
  std::vector<HintPoint> points;
  std::vector<const Variant*> point_variant;
  std::vector<std::unique_ptr<Variant>> variants;  // one per config: bounded by the space
  std::vector<BinaryFuture> background;
  std::vector<std::thread> threads;
  std::set<std::vector<int64_t>> exact;  // shape keys tuned exactly in the background
  std::atomic<size_t> retuned{0};
  std::atomic<bool> said_fallback{false};
  std::optional<DispatchPlan> plan_;  // dispatching by a plan (its rule), not by hint points

  // The plan to dispatch by: the one given, else (use_plan) the stored one.
  std::optional<DispatchPlan> stored_plan() {
    if (opts.plan) return opts.plan;
    if (!opts.use_plan) return std::nullopt;
    Backend& be = rt.backend(spec.backend);
    TuningKey base = plan_base_key(spec, be);
    if (auto cache = rt.tuning_cache())
      if (auto text = cache->get_plan(base))
        if (auto p = plan_from_text(*text, base, spec)) return p;
    log::warn("kernel '{}': no valid dispatch plan for this device (run `kiln plan {}`); dispatching by its hints",
              spec.name, spec.path_text());
    return std::nullopt;
  }

  // The loaded variant for a config (one per config); holds m.
  const Variant* variant_for(const Config& c) {
    for (const auto& v : variants)
      if (v->config == c) return v.get();
    auto v = std::make_unique<Variant>();
    v->config = c;
    v->kernel = rt.load(*rt.compile_pool(spec.backend).submit(spec, c, /*urgent=*/true).get());
    if (c.library.empty()) v->plan = LaunchPlan(spec, c, rt.backend(spec.backend).limits());
    variants.push_back(std::move(v));
    return variants.back().get();
  }

  void start_background() {
    if (!background.empty()) return;
    CompilePool& pool = rt.compile_pool(spec.backend);
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    for (const auto& c : spec.space.all())
      if (statically_pruned(spec, c, limits).empty()) background.push_back(pool.submit(make_compile_request(spec, c)));
  }

  // Arguments of the kernel at one shape, with seeded random inputs, in the backend's memory.
  std::unique_ptr<DeviceArgs> args_at(const std::vector<int64_t>& key) {
    std::vector<std::pair<std::string, std::string>> sets;
    for (size_t i = 0; i < spec.tuning.key.size(); ++i) sets.push_back({spec.tuning.key[i], std::to_string(key[i])});
    for (const auto& a : spec.args) {
      if (a.pointer || std::find(spec.tuning.key.begin(), spec.tuning.key.end(), a.name) != spec.tuning.key.end())
        continue;
      auto it = std::find_if(other_scalars.begin(), other_scalars.end(), [&](auto& p) { return p.first == a.name; });
      if (it != other_scalars.end()) sets.push_back(*it);
      else if (dtype_is_float(a.dtype)) sets.push_back({a.name, "1"});
      else
        fail(Errc::usage, "kernel '{}': '{}' is not in the tuning key; give it a value in prepare()", spec.name, a.name);
    }
    auto h = std::make_unique<DeviceArgs>(spec, parse_scalars(spec, sets), rt.backend(spec.backend).device());
    h->fill_random(0);
    return h;
  }

  void prepare(const std::vector<std::pair<std::string, std::string>>& others) {
    std::lock_guard<std::mutex> g(m);
    if (prepared) return;
    other_scalars = others;
    if (std::optional<DispatchPlan> plan = stored_plan()) {
      plan_ = plan;
      for (const auto& pt : plan->points) {
        points.push_back({pt.values, plan->configs[pt.config], pt.pick_ns});
        point_variant.push_back(variant_for(plan->configs[pt.config]));
      }
      log::info("kernel '{}': dispatching by its plan ({} points, {} configs)", spec.name, plan->points.size(),
                plan->kept);
      prepared = true;
      return;
    }
    auto list = spec.tuning.hint_point_list();
    if (list.empty())
      fail(Errc::usage, "kernel '{}' has no tuning.hints: a size-hint multi-kernel tunes at them", spec.name);
    // Every config compiles once, in parallel; each hint point's tuning then
    // finds them compiled. Not in serving mode or with an artifact: nothing is tuned there.
    if (!rt.options().serving && rt.options().artifact.empty()) {
      start_background();
      wait_all(background, "compiling " + spec.name, opts.tune.show_progress);
    }
    for (const auto& pt : list) {
      auto a = args_at(pt);
      TuneOutcome o = rt.tune(spec, a->params(), opts.tune);
      if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
      const ConfigResult* timed = o.record.find(*o.choice);  // none in serving mode without a record here
      points.push_back({pt, *o.choice, timed && timed->ns ? *timed->ns : 0.0});
      point_variant.push_back(variant_for(*o.choice));
      log::info("kernel '{}' hint point {}: {} ({})", spec.name, o.record.key.values_text(), o.choice->str(),
                o.from_cache ? "cache" : "tuned");
    }
    prepared = true;
  }

  // Hint points by distance from `key`: L1 over log2; ties go to the larger
  // hint point (the larger sum of log2 values), then the later one.
  std::vector<size_t> by_distance(const std::vector<int64_t>& key) const {
    std::vector<std::vector<int64_t>> values;
    for (const auto& p : points) values.push_back(p.values);
    return by_log2_distance(values, key);
  }

  // The variant for a call's shape: the nearest hint's config that can run
  // it, else the spec's default, else the first config of the space that
  // can (no benchmarking either way). Holds m.
  const Variant* pick(const int64_t* slots, const std::vector<int64_t>& tkey) {
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    if (plan_)
      if (std::optional<Config> c = plan_->pick(spec, tkey, slots, limits)) return variant_for(*c);
    for (size_t h : by_distance(tkey))
      if (Tuner::why_not(spec, points[h].config, slots, limits).empty()) return point_variant[h];
    std::optional<Config> fallback;
    if (spec.tuning.default_config && Tuner::why_not(spec, *spec.tuning.default_config, slots, limits).empty())
      fallback = spec.tuning.default_config;
    for (size_t i = 0; !fallback && i < spec.space.size(); ++i)
      if (Tuner::why_not(spec, spec.space.at(i), slots, limits).empty()) fallback = spec.space.at(i);
    if (!fallback)
      fail(Errc::launch, "kernel '{}': no config of its space can run this call ({})", spec.name,
           Tuner::why_not(spec, points[0].config, slots, limits));
    if (!said_fallback.exchange(true))
      log::warn("kernel '{}': no hint point's config can run some calls (such as {}); they run {}, chosen without "
                "benchmarking (said once)",
                spec.name, fmt::join(tkey, ","), fallback->str());
    return variant_for(*fallback);
  }

  const Variant* add_shape(const int64_t* key, const int64_t* slots) {
    prepare(other_scalars);
    std::lock_guard<std::mutex> g(memo.mutex());
    const Variant* v;
    if (memo.find(key, &v)) return v;
    std::vector<int64_t> tkey(key, key + spec.tuning.key.size());
    {
      std::lock_guard<std::mutex> lk(m);
      v = pick(slots, tkey);
    }
    memo.insert(key, v);
    return v;
  }

  // Tunes an often-called shape exactly, off the call path; the call path
  // switches to the result when the memo's slot is rewritten.
  void retune(const int64_t* key) {
    std::vector<int64_t> k(key, key + shape.key_size());
    std::lock_guard<std::mutex> g(m);
    if (exact.count(k)) return;
    for (const auto& p : points)
      if (std::equal(p.values.begin(), p.values.end(), k.begin())) return;  // a hint point: tuned exactly already
    exact.insert(k);
    threads.emplace_back([this, k] {
      try {
        std::vector<int64_t> tkey(k.begin(), k.begin() + static_cast<ptrdiff_t>(spec.tuning.key.size()));
        auto a = [&] {
          std::lock_guard<std::mutex> lk(m);
          return args_at(tkey);
        }();
        TuneOutcome o = rt.tune(spec, a->params(), opts.tune);
        if (!o.choice) return;
        const Variant* v;
        {
          std::lock_guard<std::mutex> lk(m);
          v = variant_for(*o.choice);
        }
        {
          std::lock_guard<std::mutex> lk(memo.mutex());
          memo.insert(k.data(), v);
        }
        ++retuned;
        log::info("kernel '{}' at {}: re-tuned exactly in the background: {}", spec.name, o.record.key.values_text(),
                  v->config.str());
      } catch (const std::exception& ex) {
        log::warn("kernel '{}': re-tuning a shape in the background failed: {}", spec.name, ex.what());
      }
    });
  }

  void join_background() {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> g(m);
      ts.swap(threads);
    }
    for (auto& t : ts) t.join();
  }
};

SizeHintMultiKernel::SizeHintMultiKernel(Runtime& rt, KernelSpec spec, SizeHintOptions opts)
    : impl_(std::make_unique<Impl>(rt, std::move(spec), opts)) {
  if (rt.options().compiles_ahead() && !opts.plan && !opts.use_plan) {
    std::lock_guard<std::mutex> g(impl_->m);
    impl_->start_background();
  }
}

SizeHintMultiKernel::~SizeHintMultiKernel() { impl_->join_background(); }

void SizeHintMultiKernel::prepare(const std::vector<std::pair<std::string, std::string>>& other_scalars) {
  impl_->prepare(other_scalars);
}

void SizeHintMultiKernel::launch(void* const* params, Stream stream) {
  Impl& m = *impl_;
  int64_t slots[CallShape::kMaxArgs];
  int64_t key[CallShape::kMaxKey];
  m.shape.read(params, slots, key);
  const Impl::Variant* v;
  std::atomic<uint32_t>* calls = nullptr;
  if (!m.memo.find(key, &v, m.retune_after > 0 ? &calls : nullptr)) v = m.add_shape(key, slots);
  if (calls && calls->fetch_add(1, std::memory_order_relaxed) + 1 == static_cast<uint32_t>(m.retune_after))
    m.retune(key);
  v->kernel->launch(params, v->plan.eval(slots), stream);
}

const std::vector<SizeHintMultiKernel::HintPoint>& SizeHintMultiKernel::hint_points() const {
  impl_->prepare(impl_->other_scalars);
  return impl_->points;
}

size_t SizeHintMultiKernel::nearest(const std::vector<int64_t>& key) const {
  impl_->prepare(impl_->other_scalars);
  std::lock_guard<std::mutex> g(impl_->m);
  return impl_->by_distance(key).front();
}

Launchable::Running SizeHintMultiKernel::running(void* const* params) {
  const Config c = config_for(params);
  return {c.str(), ChoiceSource::size_hints, !c.library.empty()};
}

Config SizeHintMultiKernel::config_for(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  int64_t key[CallShape::kMaxKey];
  impl_->shape.read(params, slots, key);
  const Impl::Variant* v;
  if (!impl_->memo.find(key, &v)) v = impl_->add_shape(key, slots);
  return v->config;
}

size_t SizeHintMultiKernel::retuned() {
  wait_background();
  return impl_->retuned.load();
}

void SizeHintMultiKernel::wait_background() { impl_->join_background(); }

const KernelSpec& SizeHintMultiKernel::spec() const { return impl_->spec; }

void SizeHintMultiKernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
