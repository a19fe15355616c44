#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/args.hpp"
#include "kiln/binary_key.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"

namespace kiln {

namespace {

// Scratch memory of the calling thread: a few grow-only buffers, keyed by
// owner and scratch index. Grows (allocates) only the first time a thread
// needs more than it has.
struct ThreadScratch {
  struct Slot {
    const void* owner = nullptr;
    size_t index = 0;
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Slot slots[8];
  ~ThreadScratch() {
    for (auto& s : slots) std::free(s.ptr);
  }
  void* get(const void* owner, size_t index, size_t bytes) {
    Slot* free_slot = nullptr;
    for (auto& s : slots) {
      if (s.owner == owner && s.index == index) {
        if (s.bytes < bytes) grow(s, bytes);
        return s.ptr;
      }
      if (!s.owner && !free_slot) free_slot = &s;
    }
    Slot& s = free_slot ? *free_slot : slots[index % 8];  // evict when full
    s.owner = owner;
    s.index = index;
    grow(s, bytes);
    return s.ptr;
  }
  static void grow(Slot& s, size_t bytes) {
    std::free(s.ptr);
    s.bytes = (bytes + 63) / 64 * 64;
    s.ptr = std::aligned_alloc(64, s.bytes ? s.bytes : 64);
    if (!s.ptr) fail(Errc::io, "cannot allocate {} bytes of scratch", bytes);
  }
};
thread_local ThreadScratch t_scratch;

}  // namespace

struct MultiKernel::Impl {
  struct Chosen {
    size_t variant = 0;
    Config config;
    std::string source;
    std::vector<ConfigResult> results;
    std::shared_ptr<LoadedKernel> kernel;
    GridPlan grid;
  };

  Impl(Runtime& r, MultiKernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), shape(spec.name, spec.args, spec.key),
        memo(static_cast<int>(spec.key.size())) {
    for (const auto& v : spec.variants) {
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
    Param p{"VARIANT", {}};
    for (size_t i = 0; i < spec.variants.size(); ++i) {
      p.values.push_back(static_cast<int64_t>(i));
      const auto& v = spec.variants[i];
      as_kernel.source_text += v.kernel.name + ":" + kernel_source_hash(v.kernel).hex() + ":" + v.kernel.space.hash().hex();
      for (const auto& a : v.args) as_kernel.source_text += "," + a;
      as_kernel.source_text += "\n";
    }
    as_kernel.space.params.push_back(std::move(p));
  }

  Runtime& rt;
  MultiKernelSpec spec;
  TuneOptions tune;
  CallShape shape;
  ShapeMemo<Chosen> memo;
  std::vector<std::vector<int>> maps;  // per variant, per its argument: ours (>= 0) or scratch -(k + 1)
  std::vector<CallShape> vshapes;
  std::vector<CompiledExpr> scratch_sizes;
  std::optional<size_t> forced;
  KernelSpec as_kernel;

  // The variant's params array from ours; scratch from `scratch_ptrs`.
  void map_params(size_t v, void* const* params, void** scratch_ptrs, void** out) const {
    const auto& map = maps[v];
    for (size_t j = 0; j < map.size(); ++j) out[j] = map[j] >= 0 ? params[map[j]] : &scratch_ptrs[-map[j] - 1];
  }

  // The choice for the call's shape (decided on first sight); fills slots.
  Chosen* find(void* const* params, int64_t* slots) {
    int64_t key[CallShape::kMaxKey];
    shape.read(params, slots, key);
    Chosen* c = memo.find(key);
    return c ? c : decide(params, key);
  }

  Chosen* decide(void* const* params, const int64_t* key) {
    std::lock_guard<std::mutex> g(memo.mutex());
    if (Chosen* c = memo.find(key)) return c;
    int64_t slots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
    shape.read(params, slots, unused);
    // Host scratch for deciding (the call path uses per-thread scratch).
    std::vector<std::vector<std::byte>> scratch_mem;
    std::vector<void*> scratch_ptrs;
    for (size_t k = 0; k < spec.scratch.size(); ++k) {
      int64_t n = scratch_sizes[k].eval(slots);
      scratch_mem.emplace_back(static_cast<size_t>(std::max<int64_t>(n, 0)) * dtype_size(spec.scratch[k].dtype) + 64);
      scratch_ptrs.push_back(scratch_mem.back().data());
    }
    auto vparams = [&](size_t v) {
      std::vector<void*> out(maps[v].size());
      map_params(v, params, scratch_ptrs.data(), out.data());
      return out;
    };
    TuningKey tkey = make_tuning_key(as_kernel, rt.backend(spec.backend).device_identity(), params);

    auto c = std::make_unique<Chosen>();
    if (forced) {
      c->variant = *forced;
      c->source = "forced";
    } else if (spec.variants.size() == 1) {
      c->source = "only variant";
    } else if (auto rec = rt.tuning_cache() && !tune.force ? rt.tuning_cache()->get(tkey, as_kernel.space)
                                                             : std::nullopt;
               rec && rec->best) {
      c->variant = static_cast<size_t>(*rec->best->get("VARIANT"));
      c->source = "cache";
      c->results = rec->configs;
    } else {
      TuningRecord fresh = benchmark(tkey, vparams);
      c->variant = static_cast<size_t>(*fresh.best->get("VARIANT"));
      c->source = "benchmarked";
      c->results = std::move(fresh.configs);
    }
    const VariantSpec& v = spec.variants[c->variant];
    std::vector<void*> vp = vparams(c->variant);
    TuneOutcome o = rt.tune(v.kernel, vp.data(), tune);
    if (!o.record.best)
      fail(Errc::tune, "multi-kernel '{}', variant {} ('{}'): {}", spec.name, c->variant, v.kernel.name,
           o.record.all_failed_message());
    c->config = *o.record.best;
    c->kernel = rt.load(*rt.compile_pool(spec.backend).submit(make_compile_request(v.kernel, c->config)).get());
    c->grid = GridPlan(v.kernel, c->config);
    log::info("multi-kernel '{}' at {}: variant {} ('{}', {}), {}", spec.name, tkey.values_text(), c->variant,
              v.kernel.name, c->config.str(), c->source);
    return memo.insert(key, std::move(c));
  }

  // Tunes each variant, then times the variants' best configs against each
  // other in interleaved rounds on this call's arguments, checking that they
  // agree. Stores and returns the record (throws when every variant failed).
  template <class VParams>
  TuningRecord benchmark(const TuningKey& tkey, VParams&& vparams) {
    const size_t n = spec.variants.size();
    TuningRecord rec;
    rec.kernel = spec.name;
    rec.key = tkey;
    rec.method = "multi-kernel";
    rec.configs.resize(n);
    std::vector<std::shared_ptr<const Binary>> bins(n);
    std::vector<std::shared_ptr<LoadedKernel>> loaded(n);
    std::vector<std::unique_ptr<BenchArena>> arenas(n);
    std::vector<Config> best(n);
    for (size_t i = 0; i < n; ++i) {
      rec.configs[i].config = as_kernel.space.at(i);
      const VariantSpec& v = spec.variants[i];
      std::vector<void*> vp = vparams(i);
      try {
        TuneOutcome o = rt.tune(v.kernel, vp.data(), tune);
        if (!o.record.best) throw Error(Errc::tune, o.record.all_failed_message());
        best[i] = *o.record.best;
        bins[i] = rt.compile_pool(spec.backend).submit(make_compile_request(v.kernel, best[i])).get();
        if (rt.options().tune_in_process) loaded[i] = rt.load(*bins[i]);
        arenas[i] = std::make_unique<BenchArena>(v.kernel, vp.data());
      } catch (const Error& e) {
        rec.configs[i].error = e.what();
        rec.configs[i].error_kind = e.code() == Errc::tune ? "tune" : "launch";
      }
    }
    Benchmarker bench(rt.options().tune_in_process ? nullptr : rt.worker_pool(), rt.options());
    std::vector<std::vector<double>> samples(n);
    std::optional<size_t> ref;
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < n; ++i) {
        if (!arenas[i] || !rec.configs[i].error.empty()) continue;
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
          BenchResult r = bench.run(*bins[i], loaded[i].get(), *arenas[i],
                                    GridPlan(v.kernel, best[i]).eval(vslots.data()), what, st);
          samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
        } catch (const Error& e) {
          rec.configs[i].error = e.what();
          rec.configs[i].error_kind = e.code() == Errc::worker ? "crash" : "launch";
          continue;
        }
        if (round == 0) {
          if (!ref) {
            ref = i;
          } else if (auto bad = disagree(*ref, i, *arenas[*ref], *arenas[i])) {
            rec.configs[i].error = *bad;
            rec.configs[i].error_kind = "wrong";
          }
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (samples[i].empty() || !rec.configs[i].error.empty()) continue;
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
    if (!ranked.empty()) {
      rec.best = ranked[0]->config;
      rec.best_ns = *ranked[0]->ns;
    }
    if (auto cache = rt.tuning_cache()) cache->put(rec);
    if (!rec.best) throw Error(Errc::tune, rec.all_failed_message());
    return rec;
  }

  // Whether variants a and b wrote the same values into every argument of
  // ours that both write (within the f32/f64 default tolerances).
  std::optional<std::string> disagree(size_t a, size_t b, const BenchArena& ra, const BenchArena& rb) const {
    for (size_t m = 0; m < spec.args.size(); ++m) {
      if (!spec.args[m].pointer || spec.args[m].intent == Intent::in) continue;
      auto written = [&](size_t v, const BenchArena& arena) -> std::span<const std::byte> {
        for (size_t j = 0; j < maps[v].size(); ++j)
          if (maps[v][j] == static_cast<int>(m)) {
            auto r = arena.result(j);
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
    : impl_(std::make_unique<Impl>(rt, std::move(spec), tune)) {}
MultiKernel::~MultiKernel() = default;

void MultiKernel::launch(void* const* params) {
  Impl& m = *impl_;
  int64_t slots[CallShape::kMaxArgs];
  Impl::Chosen* c = m.find(params, slots);
  void* scratch[8];
  const auto& map = m.maps[c->variant];
  void* vp[CallShape::kMaxArgs];
  for (size_t j = 0; j < map.size(); ++j) {
    if (map[j] >= 0) {
      vp[j] = params[map[j]];
    } else {
      size_t k = static_cast<size_t>(-map[j] - 1);
      int64_t n = m.scratch_sizes[k].eval(slots);
      scratch[k] = t_scratch.get(&m, k, static_cast<size_t>(n < 0 ? 0 : n) * dtype_size(m.spec.scratch[k].dtype));
      vp[j] = &scratch[k];
    }
  }
  int64_t vslots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
  m.vshapes[c->variant].read(vp, vslots, unused);
  c->kernel->launch(vp, c->grid.eval(vslots));
}

MultiKernel::Pick MultiKernel::pick(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  Impl::Chosen* c = impl_->find(params, slots);
  return {c->variant, c->source, c->config, c->results};
}

const MultiKernelSpec& MultiKernel::spec() const { return impl_->spec; }

void MultiKernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
