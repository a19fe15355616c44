#include <cmath>
#include <mutex>
#include <thread>

#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

namespace {

double log2_of(int64_t v) { return std::log2(static_cast<double>(v < 1 ? 1 : v)); }

}  // namespace

struct SizeHintMultiKernel::Impl {
  struct Variant {
    Config config;
    std::shared_ptr<LoadedKernel> kernel;
    GridPlan grid;
  };
  // One shape seen at run time.
  struct Entry {
    std::atomic<const Variant*> active{nullptr};
    std::atomic<uint32_t> calls{0};
    std::atomic<bool> exact{false};  // tuned at exactly this shape
    std::vector<int64_t> key;
  };

  Impl(Runtime& r, KernelSpec s, SizeHintOptions o)
      : rt(r), spec(std::move(s)), opts(o), shape(spec.name, spec.args, spec.tuning.key),
        memo(static_cast<int>(spec.tuning.key.size())) {
    retune_after = opts.retune_after >= 0 ? opts.retune_after : r.options().retune_after;
  }

  Runtime& rt;
  KernelSpec spec;
  SizeHintOptions opts;
  CallShape shape;
  ShapeMemo<Entry> memo;
  int retune_after = 0;

  std::mutex m;  // guards everything below
  bool prepared = false;
  std::vector<std::pair<std::string, std::string>> other_scalars;
  std::vector<HintPoint> points;
  std::vector<const Variant*> point_variant;
  std::vector<std::unique_ptr<Variant>> variants;
  std::vector<std::thread> background;
  std::atomic<size_t> retuned{0};

  // The loaded variant for a config (one per config); holds m.
  const Variant* variant_for(const Config& c) {
    for (const auto& v : variants)
      if (v->config == c) return v.get();
    auto v = std::make_unique<Variant>();
    v->config = c;
    v->kernel = rt.load(*rt.compile_pool(spec.backend).submit(make_compile_request(spec, c)).get());
    v->grid = GridPlan(spec, c);
    variants.push_back(std::move(v));
    return variants.back().get();
  }

  // Arguments of the kernel at one shape, with seeded random inputs.
  HostArgs args_at(const std::vector<int64_t>& key) {
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
    HostArgs h(spec, parse_scalars(spec, sets));
    h.fill_random(0);
    return h;
  }

  void prepare(const std::vector<std::pair<std::string, std::string>>& others) {
    std::lock_guard<std::mutex> g(m);
    if (prepared) return;
    other_scalars = others;
    auto list = spec.tuning.hint_point_list();
    if (list.empty())
      fail(Errc::usage, "kernel '{}' has no tuning.hints: a size-hint multi-kernel tunes at them", spec.name);
    // Every config compiles once, in parallel; each hint point's tuning then finds them compiled.
    CompilePool& pool = rt.compile_pool(spec.backend);
    std::vector<BinaryFuture> fs;
    for (const auto& c : spec.space.all()) fs.push_back(pool.submit(make_compile_request(spec, c)));
    wait_all(fs, "compiling " + spec.name, opts.tune.show_progress);
    for (const auto& pt : list) {
      HostArgs a = args_at(pt);
      TuneOutcome o = rt.tune(spec, a.params(), opts.tune);
      if (!o.record.best) throw Error(Errc::tune, o.record.all_failed_message());
      points.push_back({pt, *o.record.best, o.record.best_ns});
      point_variant.push_back(variant_for(*o.record.best));
      log::info("kernel '{}' hint point {}: {} ({})", spec.name, o.record.key.values_text(), o.record.best->str(),
                o.from_cache ? "cache" : "tuned");
    }
    prepared = true;
  }

  size_t nearest(const std::vector<int64_t>& key) const {
    size_t best = 0;
    double best_d = INFINITY, best_size = -INFINITY;
    for (size_t i = 0; i < points.size(); ++i) {
      double d = 0, size = 0;
      for (size_t k = 0; k < key.size(); ++k) {
        d += std::abs(log2_of(key[k]) - log2_of(points[i].values[k]));
        size += log2_of(points[i].values[k]);
      }
      // Within rounding, a tie: the larger hint point wins, then the later one.
      if (d < best_d - 1e-9 || (std::abs(d - best_d) <= 1e-9 && size >= best_size)) {
        best = i;
        best_d = d;
        best_size = size;
      }
    }
    return best;
  }

  Entry* add_shape(const int64_t* key) {
    prepare(other_scalars);
    std::lock_guard<std::mutex> g(memo.mutex());
    if (Entry* e = memo.find(key)) return e;
    auto e = std::make_unique<Entry>();
    e->key.assign(key, key + shape.key_size());
    size_t h;
    {
      std::lock_guard<std::mutex> lk(m);
      h = nearest(e->key);
      e->active.store(point_variant[h], std::memory_order_release);
      e->exact = points[h].values == e->key;
    }
    return memo.insert(key, std::move(e));
  }

  // Tunes an often-called shape exactly, off the call path; the call path
  // switches to the result with one atomic store.
  void retune(Entry* e) {
    std::lock_guard<std::mutex> g(m);
    background.emplace_back([this, e] {
      try {
        HostArgs a = [&] {
          std::lock_guard<std::mutex> lk(m);
          return args_at(e->key);
        }();
        TuneOutcome o = rt.tune(spec, a.params(), opts.tune);
        if (!o.record.best) return;
        const Variant* v;
        {
          std::lock_guard<std::mutex> lk(m);
          v = variant_for(*o.record.best);
        }
        e->active.store(v, std::memory_order_release);
        e->exact = true;
        ++retuned;
        log::info("kernel '{}' at {}: re-tuned exactly in the background: {}", spec.name, o.record.key.values_text(),
                  v->config.str());
      } catch (const std::exception& ex) {
        log::warn("kernel '{}': re-tuning a shape in the background failed: {}", spec.name, ex.what());
      }
    });
  }

  // The entry of the call's shape (added on first sight); fills slots.
  Entry* entry(void* const* params, int64_t* slots) {
    int64_t key[CallShape::kMaxKey];
    shape.read(params, slots, key);
    Entry* e = memo.find(key);
    return e ? e : add_shape(key);
  }

  void join_background() {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> g(m);
      ts.swap(background);
    }
    for (auto& t : ts) t.join();
  }
};

SizeHintMultiKernel::SizeHintMultiKernel(Runtime& rt, KernelSpec spec, SizeHintOptions opts)
    : impl_(std::make_unique<Impl>(rt, std::move(spec), opts)) {}

SizeHintMultiKernel::~SizeHintMultiKernel() { impl_->join_background(); }

void SizeHintMultiKernel::prepare(const std::vector<std::pair<std::string, std::string>>& other_scalars) {
  impl_->prepare(other_scalars);
}

void SizeHintMultiKernel::launch(void* const* params) {
  Impl& m = *impl_;
  int64_t slots[CallShape::kMaxArgs];
  Impl::Entry* e = m.entry(params, slots);
  if (m.retune_after > 0 && !e->exact.load(std::memory_order_relaxed) &&
      e->calls.fetch_add(1, std::memory_order_relaxed) + 1 == static_cast<uint32_t>(m.retune_after))
    m.retune(e);
  const Impl::Variant* v = e->active.load(std::memory_order_acquire);
  v->kernel->launch(params, v->grid.eval(slots));
}

const std::vector<SizeHintMultiKernel::HintPoint>& SizeHintMultiKernel::hint_points() const {
  impl_->prepare(impl_->other_scalars);
  return impl_->points;
}

size_t SizeHintMultiKernel::nearest(const std::vector<int64_t>& key) const {
  impl_->prepare(impl_->other_scalars);
  std::lock_guard<std::mutex> g(impl_->m);
  return impl_->nearest(key);
}

Config SizeHintMultiKernel::config_for(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  return impl_->entry(params, slots)->active.load(std::memory_order_acquire)->config;
}

size_t SizeHintMultiKernel::retuned() {
  wait_background();
  return impl_->retuned.load();
}

void SizeHintMultiKernel::wait_background() { impl_->join_background(); }

const KernelSpec& SizeHintMultiKernel::spec() const { return impl_->spec; }

void SizeHintMultiKernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
