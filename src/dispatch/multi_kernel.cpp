#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>

#include "compile/compile_pool.hpp"
#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_copy.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/first_call.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"

namespace kiln {

namespace {

// The scratch memory one multi-kernel hands out to the threads that call it;
// what is still out is freed when the multi-kernel is. The device is looked up
// on the first allocation, not before: a multi-kernel can be made (and
// compiled) where its backend has no device.
class ScratchPool {
 public:
  using DeviceOf = std::function<Device&()>;
  explicit ScratchPool(DeviceOf device_of) : device_of_(std::move(device_of)) {}
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;
  ~ScratchPool() {
    for (void* p : owned_) dev_->free(p);
  }
  // Frees `old` (this pool's, or null), then allocates `bytes`. When the
  // allocation throws, `old` is gone all the same.
  void* replace(void* old, size_t bytes) {
    std::lock_guard lk(mu_);
    if (old) release_locked(old);
    if (!dev_) dev_ = &device_of_();
    void* p = dev_->alloc(bytes);
    owned_.push_back(p);
    return p;
  }
  size_t size() {
    std::lock_guard lk(mu_);
    return owned_.size();
  }
  // A buffer a thread gives back (its slot evicted, or the thread ending).
  void release(void* p) {
    std::lock_guard lk(mu_);
    release_locked(p);
  }

 private:
  void release_locked(void* p) {
    dev_->free(p);
    std::erase(owned_, p);
  }
  DeviceOf device_of_;
  Device* dev_ = nullptr;  // set by the first allocation; owned_ is empty until then
  std::mutex mu_;
  std::vector<void*> owned_;  // a buffer per calling thread and scratch index, at most
};

// What a multi-kernel's call path remembers of its scratch, per thread: a few
// slots, each naming its owner by an id that is never reused (an address would
// be, once a multi-kernel dies and another is made where it was), so a slot of a
// dead owner never matches again; it is taken as a free one. The memory is the owner's pool's: a slot that
// is evicted, or whose thread ends, gives its buffer back to the pool if the
// owner still lives (a dead owner's pool freed it already).
struct ThreadScratch {
  struct Slot {
    uint64_t owner = 0;  // 0: unused
    size_t index = 0;
    void* ptr = nullptr;
    size_t bytes = 0;
    std::weak_ptr<ScratchPool> pool;
  };
  Slot slots[8];
  ThreadScratch() = default;
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  ~ThreadScratch() {
    for (auto& s : slots) give_back(s);
  }
  // The hot path: a matching slot that is large enough costs a scan of 8 ids.
  void* get(uint64_t owner, size_t index, size_t bytes, const std::shared_ptr<ScratchPool>& pool) {
    for (auto& s : slots)
      if (s.owner == owner && s.index == index) {
        if (s.bytes < bytes) {
          const size_t want = round(bytes);
          void* old = s.ptr;
          s.ptr = nullptr, s.bytes = 0;  // a throw below leaves the slot empty, never too small
          s.ptr = pool->replace(old, want);
          s.bytes = want;
        }
        return s.ptr;
      }
    // A miss: an unused slot, or a dead owner's (its pool freed the buffer).
    Slot* free_slot = nullptr;
    for (auto& s : slots)
      if (!s.owner || s.pool.expired()) {
        free_slot = &s;
        break;
      }
    Slot& s = free_slot ? *free_slot : slots[index % 8];  // evict a live owner's when full
    give_back(s);
    const size_t want = round(bytes);
    void* p = pool->replace(nullptr, want);
    s = Slot{owner, index, p, want, pool};
    return p;
  }
  static void give_back(Slot& s) {
    if (s.ptr)
      if (std::shared_ptr<ScratchPool> p = s.pool.lock()) p->release(s.ptr);
    s = Slot{};
  }
  static size_t round(size_t bytes) { return bytes ? (bytes + 255) / 256 * 256 : 256; }
};
thread_local ThreadScratch t_scratch;
std::atomic<uint64_t> g_next_owner{1};

}  // namespace

struct MultiKernel::Impl {
  struct Chosen {
    size_t variant = 0;
    Config config;
    ChoiceSource source = ChoiceSource::benchmarked;
    std::shared_ptr<LoadedKernel> kernel;
    LaunchPlan plan;
  };

  static std::vector<std::string> int_scalars(const std::vector<ArgSpec>& args) {
    std::vector<std::string> out;
    for (const auto& a : args)
      if (!a.pointer && !dtype_is_float(a.dtype)) out.push_back(a.name);
    return out;
  }

  Impl(Runtime& r, MultiKernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), shape(spec.name, spec.args, int_scalars(spec.args)),
        memo(static_cast<int>(shape.key_size()), static_cast<size_t>(r.options().memo_capacity)) {
    for (const auto& v : spec.variants) {
      r.backend(spec.backend).check_libraries(v.kernel);
      std::vector<int> map;
      for (const auto& name : v.args) {
        int idx = -1;
        for (size_t i = 0; i < spec.args.size(); ++i)
          if (spec.args[i].name == name) idx = static_cast<int>(i);
        if (idx < 0)
          for (size_t k = 0; k < spec.scratch.size(); ++k)
            if (spec.scratch[k].name == name) idx = -static_cast<int>(k) - 1;
        map.push_back(idx);
      }
      maps.push_back(std::move(map));
      vshapes.emplace_back(v.kernel.name, v.kernel.args, std::vector<std::string>{});
    }
    if (spec.scratch.size() > 8)
      fail(Errc::usage, "multi-kernel '{}' has {} scratch buffers; kiln takes at most 8", spec.name, spec.scratch.size());
    for (const auto& sc : spec.scratch) {
      KernelSpec host;
      host.name = spec.name;
      host.args = spec.args;
      scratch_sizes.push_back(compile_expr(host, sc.size, nullptr));
    }
    if (auto f = r.options().force_variant) {
      if (*f < 0 || static_cast<size_t>(*f) >= spec.variants.size())
        fail(Errc::usage, "KILN_FORCE_VARIANT={} but multi-kernel '{}' has {} variants (0 to {})", *f, spec.name,
             spec.variants.size(), spec.variants.size() - 1);
      forced = static_cast<size_t>(*f);
    }
    // The multi-kernel as a kernel whose one param picks the variant, so its
    // choice is a tuning record like any other.
    as_kernel.name = spec.name;
    as_kernel.backend = spec.backend;
    as_kernel.entry = spec.name;
    as_kernel.args = spec.args;
    as_kernel.tuning.key = spec.key;
    as_kernel.tuning.key_given = true;
    Param p{"VARIANT", {}};
    for (size_t i = 0; i < spec.variants.size(); ++i) {
      p.values.push_back(static_cast<int64_t>(i));
      const auto& v = spec.variants[i];
      std::string id = v.kernel.name + ":" + kernel_source_hash(v.kernel).hex() + ":" + spec_semantics_hash(v.kernel);
      for (const auto& a : v.args) id += "," + a;
      as_kernel.source_text += id + "\n";
      variant_ids.push_back(hash_bytes(id).hex());
    }
    as_kernel.space.params.push_back(std::move(p));
  }

  Runtime& rt;
  MultiKernelSpec spec;
  TuneOptions tune;
  CallShape shape;
  ShapeMemo<const Chosen*> memo;
  std::vector<std::vector<int>> maps;  // per variant, per its argument: ours (>= 0) or scratch -(k + 1)
  std::vector<CallShape> vshapes;
  std::vector<CompiledExpr> scratch_sizes;
  std::optional<size_t> forced;
  const uint64_t id = g_next_owner.fetch_add(1);  // names this multi-kernel's per-thread scratch slots
  std::shared_ptr<ScratchPool> scratch_pool =
      std::make_shared<ScratchPool>([this]() -> Device& { return rt.backend(spec.backend).device(); });
  KernelSpec as_kernel;
  std::vector<std::string> variant_ids;  // what a variant's result is kept by in the record
  std::mutex m;                          // guards chosen
  std::vector<std::unique_ptr<Chosen>> chosen;  // one per (variant, config, source)
  std::weak_ptr<Impl> self;                     // what a background tuning holds
  Swaps<Chosen> swaps;  // shapes tuned in the background (KILN_FIRST_CALL=swap); under memo.mutex()

  // The scratch buffers of one call, on the device, for deciding (the call
  // path uses per-thread scratch); freed with it.
  struct Scratch {
    Scratch(const Impl& m, void* const* params) : dev(m.rt.backend(m.spec.backend).device()) {
      int64_t slots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
      m.shape.read(params, slots, unused);
      try {
        for (size_t k = 0; k < m.spec.scratch.size(); ++k) {
          const int64_t n = m.scratch_sizes[k].eval(slots);
          ptrs.push_back(
              dev.alloc(static_cast<size_t>(std::max<int64_t>(n, 0)) * dtype_size(m.spec.scratch[k].dtype) + 64));
        }
      } catch (...) {
        for (void* x : ptrs) dev.free(x);
        throw;
      }
    }
    ~Scratch() {
      for (void* x : ptrs) dev.free(x);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    Device& dev;
    std::vector<void*> ptrs;
  };

  // Variant v's params array for a call with our `params`, its scratch in `scratch`.
  std::vector<void*> variant_params(size_t v, void* const* params, Scratch& scratch) const {
    std::vector<void*> out(maps[v].size());
    map_params(v, params, scratch.ptrs.data(), out.data());
    return out;
  }

  // The variant's params array from ours; scratch from `scratch_ptrs`.
  void map_params(size_t v, void* const* params, void** scratch_ptrs, void** out) const {
    const auto& map = maps[v];
    for (size_t j = 0; j < map.size(); ++j) out[j] = map[j] >= 0 ? params[map[j]] : &scratch_ptrs[-map[j] - 1];
  }

  // The choice for the call's shape (decided on first sight); fills slots.
  const Chosen* find(void* const* params, int64_t* slots, Stream stream) {
    int64_t key[CallShape::kMaxKey];
    shape.read(params, slots, key);
    const Chosen* c;
    if (memo.find(key, &c)) return c;
    return decide(params, key, stream);
  }

  const Chosen* chosen_for(size_t variant, const Config& config, ChoiceSource source) {
    std::lock_guard<std::mutex> g(m);
    for (const auto& c : chosen)
      if (c->variant == variant && c->config == config && c->source == source) return c.get();
    const VariantSpec& v = spec.variants[variant];
    auto c = std::make_unique<Chosen>();
    c->variant = variant;
    c->config = config;
    c->source = source;
    c->kernel = rt.load(*rt.compile_pool(spec.backend).submit(v.kernel, config).get());
    if (config.library.empty()) c->plan = LaunchPlan(v.kernel, config, rt.backend(spec.backend).limits());
    chosen.push_back(std::move(c));
    return chosen.back().get();
  }

  const Chosen* decide(void* const* params, const int64_t* key, Stream stream) {
    std::lock_guard<std::mutex> g(memo.mutex());
    const Chosen* found;
    if (memo.find(key, &found)) return found;
    Scratch scratch(*this, params);
    auto vparams = [&](size_t v) { return variant_params(v, params, scratch); };
    TuningKey tkey = make_tuning_key(as_kernel, rt.backend(spec.backend), params);

    size_t variant = 0;
    ChoiceSource source = ChoiceSource::benchmarked;
    std::optional<TuningRecord> rec = rt.tuning_cache() && !tune.force ? rt.tuning_cache()->get(tkey) : std::nullopt;
    const FirstCall mode = first_call_mode(rt);
    if (forced) {
      variant = *forced;
      source = ChoiceSource::forced;
    } else if (spec.variants.size() == 1) {
      source = ChoiceSource::only_variant;
    } else if (rec && rec->best) {
      variant = static_cast<size_t>(*rec->best->get("VARIANT"));
      source = ChoiceSource::cache;
      rt.tuning_cache()->note_used(*rec);
    } else {
      if (mode != FirstCall::wait) {
        if (const Chosen* c = first_call(params, key, stream, tkey, mode, vparams)) {
          memo.insert(key, c);
          return c;
        }
        if (mode == FirstCall::serve)
          fail(Errc::tune, "multi-kernel '{}' at {}: KILN_FIRST_CALL=serve, and no variant can run this call "
               "without tuning", spec.name, tkey.values_text());
      }
      TuningRecord fresh = benchmark(tkey, vparams, stream);
      variant = static_cast<size_t>(*fresh.best->get("VARIANT"));
      source = ChoiceSource::benchmarked;
    }
    const VariantSpec& v = spec.variants[variant];
    std::vector<void*> vp = vparams(variant);
    TuneOptions to = tune;
    to.stream = stream;
    TuneOutcome o = rt.tune(v.kernel, vp.data(), to);
    if (!o.choice)
      fail(Errc::tune, "multi-kernel '{}', variant {} ('{}'): {}", spec.name, variant, v.kernel.name,
           o.record.all_failed_message());
    const Chosen* c = chosen_for(variant, *o.choice, source);
    log::info("multi-kernel '{}' at {}: variant {} ('{}', {}), {}", spec.name, tkey.values_text(), variant,
              v.kernel.name, c->config.str(), choice_source_name(source));
    memo.insert(key, c);
    return c;
  }

  // The first variant with a choice that can run the call now: its record's,
  // else its first safe choice. nullptr when none can.
  template <class VParams>
  const Chosen* safe_variant(Stream stream, VParams&& vparams, std::string* how, std::string* failures) {
    for (size_t vi = 0; vi < spec.variants.size(); ++vi) {
      const VariantSpec& v = spec.variants[vi];
      std::vector<void*> vp = vparams(vi);
      const CallView call(v.kernel, rt.backend(spec.backend), vp.data());
      TuneOptions to = tune;
      to.stream = stream;
      to.cached_only = true;
      TuneOutcome o = rt.tune(call, to);
      if (o.choice) {
        *how = "the variant's own record";
        return chosen_for(vi, *o.choice, ChoiceSource::safe);
      }
      if (o.from_cache) continue;  // its record says nothing of it runs
      std::string f;
      std::optional<SafeChoice> s = first_safe_choice(
          rt, call, stream, tune.libraries,
          [&](const Config& cfg) -> const LoadedKernel& { return *chosen_for(vi, cfg, ChoiceSource::safe)->kernel; }, &f);
      if (s) {
        *how = s->how;
        return chosen_for(vi, s->config, ChoiceSource::safe);
      }
      *failures += fmt::format("\n variant {} ('{}'):{}", vi, v.kernel.name, f);
    }
    return nullptr;
  }

  // A shape with no record under KILN_FIRST_CALL=swap or serve: the first
  // variant that can run the call now (safe_variant); with swap, the
  // variants are tuned and benchmarked behind it on a copy of the call's
  // arguments, and the winner replaces it (Swaps). nullptr when no variant
  // can run the call untuned. Holds memo.mutex().
  template <class VParams>
  const Chosen* first_call(void* const* params, const int64_t* key, Stream stream, const TuningKey& tkey,
                           FirstCall mode, VParams&& vparams) {
    std::vector<int64_t> shape_key(key, key + shape.key_size());
    if (const Chosen* running = swaps.running(shape_key)) return running;
    std::string failures, how;
    const Chosen* c = safe_variant(stream, vparams, &how, &failures);
    if (!c) {
      log::info("multi-kernel '{}': no variant can run this call untuned; it is tuned before it returns:{}",
                spec.name, failures);
      return nullptr;
    }
    if (mode == FirstCall::serve) {
      rt.note_miss(as_kernel, tkey, fmt::format("variant {}, {}", c->variant, c->config.str()), how);
      return c;
    }
    log::info("multi-kernel '{}' at {}: variant {} ('{}', {}: {}) runs while the variants are tuned in the background",
              spec.name, tkey.values_text(), c->variant, spec.variants[c->variant].kernel.name, c->config.str(), how);
    auto copy = std::make_shared<CallCopy>(as_kernel, params, rt.backend(spec.backend).device(), stream);
    swaps.start(rt, memo, self.lock(), shape_key, c, fmt::format("multi-kernel '{}' at {}", spec.name, tkey.values_text()),
                [this, copy, tkey](const std::atomic<bool>& stop) -> const Chosen* {
                  Scratch scratch(*this, copy->params());
                  auto vp_of = [&](size_t v) { return variant_params(v, copy->params(), scratch); };
                  TuningRecord rec = benchmark(tkey, vp_of, nullptr, &stop);
                  const size_t variant = static_cast<size_t>(*rec.best->get("VARIANT"));
                  std::vector<void*> vp = vp_of(variant);
                  TuneOptions to = tune;
                  to.cancel = &stop;
                  TuneOutcome o = rt.tune(spec.variants[variant].kernel, vp.data(), to);
                  if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
                  const Chosen* won = chosen_for(variant, *o.choice, ChoiceSource::tuned);
                  log::info("multi-kernel '{}' at {}: tuned in the background: variant {} ({})", spec.name,
                            tkey.values_text(), variant, won->config.str());
                  return won;
                });
    return c;
  }

  // Tunes each variant, then times the variants' best configs against each
  // other in interleaved rounds on this call's arguments, checking that they
  // agree. Stores and returns the record (throws when every variant failed).
  template <class VParams>
  TuningRecord benchmark(const TuningKey& tkey, VParams&& vparams, Stream stream,
                         const std::atomic<bool>* cancel = nullptr) {
    const size_t n = spec.variants.size();
    TuningRecord rec;
    rec.kernel = spec.name;
    rec.key = tkey;
    rec.method = SearchMethod::multi_kernel;
    rec.space = as_kernel.space;
    rec.configs.resize(n);
    Backend& backend = rt.backend(spec.backend);
    std::vector<std::shared_ptr<const Binary>> bins(n);
    std::vector<std::shared_ptr<LoadedKernel>> loaded(n);
    std::vector<std::unique_ptr<BenchInputs>> inputs(n);
    std::vector<Config> best(n);
    for (size_t i = 0; i < n; ++i) {
      rec.configs[i].config = as_kernel.space.at(i);
      rec.configs[i].binary = variant_ids[i];
      const VariantSpec& v = spec.variants[i];
      std::vector<void*> vp = vparams(i);
      try {
        TuneOptions to = tune;
        to.stream = stream;
        to.cancel = cancel;
        TuneOutcome o = rt.tune(v.kernel, vp.data(), to);
        if (!o.choice) throw Error(Errc::tune, o.record.all_failed_message());
        best[i] = *o.choice;
        bins[i] = rt.compile_pool(spec.backend).submit(v.kernel, best[i]).get();
        if (rt.options().tune_in_process) loaded[i] = rt.load(*bins[i]);
        inputs[i] = std::make_unique<BenchInputs>(v.kernel, vp.data(), backend.device(), rt.options().tune_in_process,
                                                  stream);
      } catch (const Error& e) {
        if (e.code() != Errc::tune && e.code() != Errc::launch) throw;
        rec.configs[i].error = e.what();
        rec.configs[i].kind = e.code() == Errc::tune ? FailKind::wrong : FailKind::launch;
      }
    }
    Benchmarker& bench = rt.benchmarker(spec.backend);
    std::vector<std::vector<double>> samples(n);
    std::optional<size_t> ref;
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < n; ++i) {
        if (!inputs[i] || rec.configs[i].kind != FailKind::none) continue;
        const VariantSpec& v = spec.variants[i];
        BenchSettings st = bench.settings();
        st.check = round == 0;
        st.budget_ms /= 2;
        std::vector<int64_t> vslots(v.kernel.args.size(), 0);
        std::vector<void*> vp = vparams(i);
        read_int_slots(v.kernel, vp.data(), vslots.data());
        std::string what = fmt::format("multi-kernel '{}' variant {} ('{}', config {})", spec.name, i,
                                       v.kernel.name, best[i].str());
        try {
          LaunchDims dims = best[i].library.empty() ? LaunchPlan(v.kernel, best[i], backend.limits()).eval(vslots.data())
                                                    : LaunchDims{};
          BenchResult r = bench.run(*bins[i], loaded[i].get(), *inputs[i], dims, what, st, rt.options().bench_timeout_s);
          samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
        } catch (const WorkerError& e) {
          if (!e.fault().of_request) throw;
          rec.configs[i].error = e.what();
          rec.configs[i].kind = e.fault().kind == WorkerFault::Kind::timeout ? FailKind::timeout : FailKind::crash;
          continue;
        } catch (const Error& e) {
          if (e.code() != Errc::launch) throw;
          rec.configs[i].error = e.what();
          rec.configs[i].kind = FailKind::launch;
          continue;
        }
        if (round == 0) {
          if (!ref) {
            ref = i;
          } else if (auto bad = disagree(*ref, i, *inputs[*ref], *inputs[i])) {
            rec.configs[i].error = *bad;
            rec.configs[i].kind = FailKind::wrong;
          }
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (samples[i].empty() || rec.configs[i].kind != FailKind::none) continue;
      BenchResult r = summarize(std::move(samples[i]));
      rec.configs[i].ns = r.median_ns;
      rec.configs[i].min_ns = r.min_ns;
      rec.configs[i].max_ns = r.max_ns;
      rec.configs[i].reps = static_cast<int>(r.ns.size());
    }
    if (ref) rec.reference = as_kernel.space.at(*ref).str();
    auto ranked = rec.ranked();
    rec.kiln_version = kiln_version();
    rec.when = utc_now();
    rec.timed = n;
    if (!ranked.empty()) {
      rec.best = ranked[0]->config;
      rec.best_ns = *ranked[0]->ns;
    }
    if (auto cache = rt.tuning_cache()) {
      try {
        cache->put(rec);
      } catch (const Error& e) {
        log::warn("multi-kernel '{}': chose a variant but could not store the record: {}", spec.name, e.what());
      }
    }
    if (!rec.best) throw Error(Errc::tune, rec.all_failed_message());
    if (auto cache = rt.tuning_cache()) cache->note_used(rec);
    return rec;
  }

  // Whether variants a and b wrote the same values into every argument of
  // ours that both write (within the dtypes' default tolerances).
  std::optional<std::string> disagree(size_t a, size_t b, const BenchInputs& ra, const BenchInputs& rb) const {
    for (size_t m = 0; m < spec.args.size(); ++m) {
      if (!spec.args[m].pointer || spec.args[m].intent == Intent::in) continue;
      auto written = [&](size_t v, const BenchInputs& in) -> std::span<const std::byte> {
        for (size_t j = 0; j < maps[v].size(); ++j)
          if (maps[v][j] == static_cast<int>(m)) {
            auto r = in.result(j);
            if (!r.empty()) return r;
          }
        return {};
      };
      auto x = written(a, ra), y = written(b, rb);
      if (x.empty() || y.empty() || x.size() != y.size()) continue;
      if (auto bad = Tuner::compare(spec.args[m].dtype, y, x, TuningSpec{}))
        return fmt::format("variant {} disagrees with variant {} in '{}': {}", b, a, spec.args[m].name, *bad);
    }
    return std::nullopt;
  }
};

MultiKernel::MultiKernel(Runtime& rt, MultiKernelSpec spec, TuneOptions tune)
    : impl_(std::make_shared<Impl>(rt, std::move(spec), tune)) {
  impl_->self = impl_;
  if (rt.options().compiles_ahead()) {
    CompilePool& pool = rt.compile_pool(impl_->spec.backend);
    const LaunchLimits limits = rt.backend(impl_->spec.backend).limits();
    for (const auto& v : impl_->spec.variants)
      if (v.kernel.space.size() <= 1024)
        for (const auto& c : v.kernel.space.all())
          if (statically_pruned(v.kernel, c, limits).empty()) pool.submit(make_compile_request(v.kernel, c));
  }
}
MultiKernel::~MultiKernel() = default;

void MultiKernel::launch(void* const* params, Stream stream) {
  Impl& m = *impl_;
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = m.find(params, slots, stream);
  void* scratch[8];
  const auto& map = m.maps[c->variant];
  void* vp[CallShape::kMaxArgs];
  for (size_t j = 0; j < map.size(); ++j) {
    if (map[j] >= 0) {
      vp[j] = params[map[j]];
    } else {
      size_t k = static_cast<size_t>(-map[j] - 1);
      int64_t n = m.scratch_sizes[k].eval(slots);
      scratch[k] = t_scratch.get(m.id, k, static_cast<size_t>(n < 0 ? 0 : n) * dtype_size(m.spec.scratch[k].dtype),
                                 m.scratch_pool);
      vp[j] = &scratch[k];
    }
  }
  int64_t vslots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
  m.vshapes[c->variant].read(vp, vslots, unused);
  c->kernel->launch(vp, c->plan.eval(vslots), stream);
}

Launchable::Running MultiKernel::running(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = impl_->find(params, slots, nullptr);
  return {fmt::format("variant {}: {}", c->variant, c->config.str()), c->source};
}

MultiKernel::Pick MultiKernel::pick(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = impl_->find(params, slots, nullptr);
  Pick p{c->variant, c->source, c->config, {}};
  if (auto cache = impl_->rt.tuning_cache())
    if (auto rec = cache->get(make_tuning_key(impl_->as_kernel, impl_->rt.backend(impl_->spec.backend), params)))
      p.results = rec->configs;
  return p;
}

size_t MultiKernel::scratch_buffers() const { return impl_->scratch_pool->size(); }

const MultiKernelSpec& MultiKernel::spec() const { return impl_->spec; }

void MultiKernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
