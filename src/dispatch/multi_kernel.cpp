#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include "compile/compile_pool.hpp"
#include "core/format.hpp"
#include "core/log.hpp"
#include "dispatch/call_copy.hpp"
#include "dispatch/call_shape.hpp"
#include "dispatch/first_call.hpp"
#include "dispatch/shape_memo.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/ext/library.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/plan.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"

namespace kiln {

namespace {

std::atomic<uint64_t> g_next_owner{1};   // multi-kernels
std::atomic<uint64_t> g_next_thread{1};  // threads that called one

// The scratch memory one multi-kernel hands out to the threads that call it:
// per thread and scratch buffer, one buffer, replaced by a larger one (at
// least twice as large) when a call needs more. An outgrown buffer is kept:
// a graph captured with it may still run it. A thread's buffers are freed
// when the thread ends, and everything when the multi-kernel dies. The device
// is looked up on the first allocation, not before: a multi-kernel can be
// made (and compiled) where its backend has no device.
class ScratchPool {
 public:
  using DeviceOf = std::function<Device&()>;
  explicit ScratchPool(DeviceOf device_of) : device_of_(std::move(device_of)) {}
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;
  ~ScratchPool() {
    for (auto& [key, e] : entries_) free_entry(e);
  }
  // Thread `thread`'s buffer `index`, at least `bytes` long, and its size.
  // When the allocation throws, the thread keeps what it had.
  std::pair<void*, size_t> get(uint64_t thread, size_t index, size_t bytes) {
    std::lock_guard lk(mu_);
    Entry& e = entries_[{thread, index}];
    if (e.ptr && e.bytes >= bytes) return {e.ptr, e.bytes};
    if (!dev_) dev_ = &device_of_();
    const size_t want = round(std::max(bytes, e.bytes * 2));
    void* p = dev_->alloc(want);
    if (e.ptr) e.retired.push_back(e.ptr);
    e.ptr = p;
    e.bytes = want;
    return {p, want};
  }
  // A thread ended: its buffers go.
  void release_thread(uint64_t thread) {
    std::lock_guard lk(mu_);
    for (auto it = entries_.lower_bound({thread, 0}); it != entries_.end() && it->first.first == thread;) {
      free_entry(it->second);
      it = entries_.erase(it);
    }
  }
  size_t size() {
    std::lock_guard lk(mu_);
    size_t n = 0;
    for (const auto& [key, e] : entries_) n += (e.ptr ? 1 : 0) + e.retired.size();
    return n;
  }

 private:
  static size_t round(size_t bytes) { return bytes ? (bytes + 255) / 256 * 256 : 256; }
  struct Entry {
    void* ptr = nullptr;
    size_t bytes = 0;
    std::vector<void*> retired;  // outgrown, kept for graphs captured with them
  };
  void free_entry(Entry& e) noexcept {
    if (e.ptr) dev_->free(e.ptr);
    for (void* p : e.retired) dev_->free(p);
    e = Entry{};
  }
  DeviceOf device_of_;
  Device* dev_ = nullptr;  // set by the first allocation; entries_ holds no buffer until then
  std::mutex mu_;
  std::map<std::pair<uint64_t, size_t>, Entry> entries_;  // (thread, scratch index)
};

// What a multi-kernel's call path remembers of its scratch, per thread: a
// cache of 8 slots, each naming its owner by an id that is never reused (an
// address would be, once a multi-kernel dies and another is made where it
// was), so a slot of a dead owner never matches again. The buffers are the
// owners' pools': evicting a slot only forgets the pointer (the next miss
// finds the same buffer in the pool), and never evicts a slot of the owner
// asking, whose other buffers a launch may be holding. When the thread ends,
// it tells every pool it took buffers from that still lives.
struct ThreadScratch {
  struct Slot {
    uint64_t owner = 0;  // 0: unused
    size_t index = 0;
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Slot slots[8];
  const uint64_t key = g_next_thread.fetch_add(1);
  std::vector<std::pair<uint64_t, std::weak_ptr<ScratchPool>>> pools;  // (owner, its pool) this thread used
  ThreadScratch() = default;
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  ~ThreadScratch() {
    for (auto& [owner, w] : pools)
      if (std::shared_ptr<ScratchPool> p = w.lock()) p->release_thread(key);
  }
  // The hot path: a matching slot that is large enough costs a scan of 8 ids.
  void* get(uint64_t owner, size_t index, size_t bytes, const std::shared_ptr<ScratchPool>& pool) {
    for (auto& s : slots)
      if (s.owner == owner && s.index == index) {
        if (s.bytes < bytes) std::tie(s.ptr, s.bytes) = pool->get(key, index, bytes);
        return s.ptr;
      }
    auto [p, b] = pool->get(key, index, bytes);
    note(owner, pool);
    Slot* s = nullptr;
    for (auto& x : slots)
      if (!x.owner) {
        s = &x;
        break;
      }
    for (size_t j = 0; j < 8 && !s; ++j)
      if (slots[(index + j) % 8].owner != owner) s = &slots[(index + j) % 8];
    if (!s) s = &slots[index % 8];  // cannot happen: an owner has at most 8 buffers, and this one is not cached
    *s = Slot{owner, index, p, b};
    return p;
  }
  // Whether this thread's buffer `index` of `owner` is at hand and holds `bytes`: a
  // launch would then allocate nothing (nothing may be allocated while a graph is captured).
  bool ready(uint64_t owner, size_t index, size_t bytes) const {
    for (const auto& s : slots)
      if (s.owner == owner && s.index == index) return s.bytes >= bytes;
    return false;
  }
  void note(uint64_t owner, const std::shared_ptr<ScratchPool>& pool) {
    for (const auto& [o, w] : pools)
      if (o == owner) return;
    if (pools.size() >= 16) std::erase_if(pools, [](const auto& x) { return x.second.expired(); });
    pools.push_back({owner, pool});
  }
};
thread_local ThreadScratch t_scratch;

}  // namespace

struct MultiKernel::Impl {
  // One launch of a chosen variant: its step's config, loaded, and its launch shape.
  struct Run {
    Config config;
    std::shared_ptr<LoadedKernel> kernel;
    LaunchPlan plan;
    // With S (say) in buckets, the step's constraints that read the call, compiled for the
    // config (index into the step kernel's constraints): checked at every call (check_call).
    std::vector<std::pair<size_t, CompiledExpr>> guards;
  };
  struct Chosen {
    size_t variant = 0;
    ChoiceSource source = ChoiceSource::benchmarked;
    std::vector<Run> runs;  // one per step of the variant
    std::string text;       // the configs: "BM=64 BN=128", or "a ; b ; c" for several steps
  };

  // Where a step's argument comes from on a call.
  struct ArgFrom {
    enum Kind : uint8_t { ours, scratch, computed } kind = ours;
    int index = 0;     // our argument, the scratch buffer, or the step's computed scalar
    bool i32 = false;  // computed: the kernel takes an i32
  };
  struct StepMap {
    std::vector<ArgFrom> from;
    std::vector<CompiledExpr> exprs;  // the computed scalars, over our integer scalars
    CallShape shape;                  // the step kernel's integer scalars and its buffers' alignments
    std::vector<CompiledExpr> needs;  // per argument: the elements the step kernel reads or writes (buffers)
  };

  // The index of our argument `name` (a buffer only, where `buffers`), or -1.
  static int our_arg(const MultiKernelSpec& spec, const std::string& name, bool buffers = false) {
    for (size_t i = 0; i < spec.args.size(); ++i)
      if (spec.args[i].name == name && (!buffers || spec.args[i].pointer)) return static_cast<int>(i);
    return -1;
  }

  // The shape key a call's choice is memoised by: every integer scalar, then
  // the alignment of each buffer of ours that a launch's config may depend on
  // (a constraint or the launch shape of its kernel names its alignment, or
  // the kernel has library choices), as many as the key holds: a config chosen
  // for aligned buffers may need them (16-byte loads), so a call with such a
  // buffer aligned less is decided again.
  static std::vector<std::string> memo_key(const MultiKernelSpec& spec) {
    std::vector<std::string> out;
    for (const auto& a : spec.args)
      if (!a.pointer && !dtype_is_float(a.dtype)) out.push_back(a.name);
    for (const auto& v : spec.variants)
      for (const auto& st : v.steps) {
        const std::vector<std::string> used = st.kernel.unkeyed_launch_scalars();
        for (size_t j = 0; j < st.args.size() && j < st.kernel.args.size(); ++j) {
          const int ours = our_arg(spec, st.args[j], true);
          if (ours < 0) continue;
          const std::string mine = "align_" + spec.args[static_cast<size_t>(ours)].name;
          const bool matters = !st.kernel.libraries.empty() ||
                               std::find(used.begin(), used.end(), "align_" + st.kernel.args[j].name) != used.end();
          if (matters && std::find(out.begin(), out.end(), mine) == out.end() &&
              out.size() < static_cast<size_t>(CallShape::kMaxKey))
            out.push_back(mine);
        }
      }
    return out;
  }

  Impl(Runtime& r, MultiKernelSpec s, TuneOptions t)
      : rt(r), spec(std::move(s)), tune(t), shape(spec.name, spec.args, memo_key(spec), spec.pow2),
        memo(static_cast<int>(shape.key_size()), static_cast<size_t>(r.options().memo_capacity)) {
    if (spec.scratch.size() > 8)
      fail(Errc::usage, "multi-kernel '{}' has {} scratch buffers; kiln takes at most 8", spec.name, spec.scratch.size());
    KernelSpec host;  // our arguments, for expressions over our integer scalars
    host.name = spec.name;
    host.args = spec.args;
    for (const auto& v : spec.variants) {
      if (v.steps.empty() || v.steps.size() > kMaxVariantSteps)
        fail(Errc::usage, "multi-kernel '{}': a variant has {} steps (1 to {})", spec.name, v.steps.size(),
             kMaxVariantSteps);
      std::vector<StepMap> vmaps;
      std::vector<size_t> used;
      for (const auto& st : v.steps) {
        r.backend(spec.backend).check_libraries(st.kernel);
        StepMap sm{{}, {}, CallShape(st.kernel.name, st.kernel.args, {}), {}};
        for (const auto& a : st.kernel.args)
          sm.needs.push_back(a.pointer ? compile_expr(st.kernel, a.size, nullptr) : CompiledExpr());
        for (size_t j = 0; j < st.args.size(); ++j) {
          const std::string& name = st.args[j];
          ArgFrom f;
          int idx = our_arg(spec, name);
          if (idx >= 0) {
            f = {ArgFrom::ours, idx, false};
          } else {
            for (size_t k = 0; k < spec.scratch.size(); ++k)
              if (spec.scratch[k].name == name) idx = static_cast<int>(k);
            if (idx >= 0) {
              f = {ArgFrom::scratch, idx, false};
              if (std::find(used.begin(), used.end(), static_cast<size_t>(idx)) == used.end())
                used.push_back(static_cast<size_t>(idx));
            } else {
              sm.exprs.push_back(compile_expr(host, Expr::parse(name), nullptr));
              f = {ArgFrom::computed, static_cast<int>(sm.exprs.size() - 1), st.kernel.args[j].dtype == DType::i32};
            }
          }
          sm.from.push_back(f);
        }
        vmaps.push_back(std::move(sm));
      }
      steps.push_back(std::move(vmaps));
      scratch_used.push_back(std::move(used));
    }
    for (const auto& sc : spec.scratch) scratch_sizes.push_back(compile_expr(host, sc.size, nullptr));
    for (const auto& a : spec.args) our_sizes.push_back(a.pointer ? compile_expr(host, a.size, nullptr) : CompiledExpr());
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
    as_kernel.tuning.pow2 = spec.pow2;
    as_kernel.tuning.key_given = true;
    Param p{"VARIANT", {}};
    for (size_t i = 0; i < spec.variants.size(); ++i) {
      p.values.push_back(static_cast<int64_t>(i));
      std::string id;
      for (size_t k = 0; k < spec.variants[i].steps.size(); ++k) {
        const VariantStep& st = spec.variants[i].steps[k];
        id += (k ? ";" : "") + st.kernel.name + ":" + kernel_source_hash(st.kernel).hex() + ":" +
              spec_semantics_hash(st.kernel);
        for (const auto& a : st.args) id += "," + a;
      }
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
  std::vector<std::vector<StepMap>> steps;     // per variant, per step
  std::vector<std::vector<size_t>> scratch_used;  // per variant: the scratch buffers its steps use
  std::vector<CompiledExpr> scratch_sizes;
  std::vector<CompiledExpr> our_sizes;  // per argument of ours: a buffer's elements, as our spec declares them
  std::optional<size_t> forced;
  const uint64_t id = g_next_owner.fetch_add(1);  // names this multi-kernel's per-thread scratch slots
  std::shared_ptr<ScratchPool> scratch_pool =
      std::make_shared<ScratchPool>([this]() -> Device& { return rt.backend(spec.backend).device(); });
  KernelSpec as_kernel;
  std::vector<std::string> variant_ids;  // what a variant's result is kept by in the record
  std::mutex m;                          // guards chosen
  std::vector<std::unique_ptr<Chosen>> chosen;  // one per (variant, configs, source)
  std::weak_ptr<Impl> self;                     // what a background tuning holds
  Swaps<Chosen> swaps;  // shapes tuned in the background (KILN_FIRST_CALL=swap); under memo.mutex()

  bool several(size_t v) const { return spec.variants[v].steps.size() > 1; }

  // The scratch buffers of one call, on the device, for deciding and timing
  // (the call path uses per-thread scratch), each allocated when a variant
  // that uses it first needs it (a shape decided from the records needs only
  // its variant's); freed with it.
  struct Scratch {
    Scratch(const Impl& m, void* const* params)
        : m_(m), dev(m.rt.backend(m.spec.backend).device()), ptrs(m.spec.scratch.size(), nullptr) {
      int64_t unused[CallShape::kMaxKey];
      m.shape.read(params, slots, unused);
    }
    ~Scratch() {
      for (void* x : ptrs)
        if (x) dev.free(x);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    // Allocates the buffers variant v uses that are not yet.
    void ensure(size_t v) {
      for (size_t k : m_.scratch_used[v])
        if (!ptrs[k]) {
          const int64_t n = m_.scratch_sizes[k].eval(slots);
          ptrs[k] = dev.alloc(static_cast<size_t>(std::max<int64_t>(n, 0)) * dtype_size(m_.spec.scratch[k].dtype) + 64);
        }
    }
    const Impl& m_;
    Device& dev;
    std::vector<void*> ptrs;
    int64_t slots[CallShape::kMaxArgs];  // the call's integer scalars and alignments, as the call path reads them
  };

  // Step k of variant v's params from ours (`slots`: our integer scalars);
  // scratch from `scratch_ptrs`, computed scalars into `values`. Allocates nothing.
  void map_params(size_t v, size_t k, void* const* params, const int64_t* slots, void** scratch_ptrs,
                  int64_t* values, void** out) const {
    const StepMap& sm = steps[v][k];
    for (size_t j = 0; j < sm.from.size(); ++j) {
      const ArgFrom& f = sm.from[j];
      switch (f.kind) {
        case ArgFrom::ours: out[j] = params[f.index]; break;
        case ArgFrom::scratch: out[j] = &scratch_ptrs[f.index]; break;
        case ArgFrom::computed: {
          const int64_t x = sm.exprs[static_cast<size_t>(f.index)].eval(slots);
          if (f.i32) {
            if (x < INT32_MIN || x > INT32_MAX)
              fail(Errc::usage, "multi-kernel '{}', variant {}, step {}: '{}' = {} is out of range for the step's "
                   "i32 argument", spec.name, v, k, spec.variants[v].steps[k].args[j], x);
            const auto x32 = static_cast<int32_t>(x);
            std::memcpy(&values[j], &x32, sizeof x32);
          } else {
            values[j] = x;
          }
          out[j] = &values[j];
          break;
        }
      }
    }
  }

  // A step's params for deciding and timing: the array and the values it points to.
  struct StepParams {
    std::vector<void*> ptrs;
    std::vector<int64_t> values;
    StepParams() = default;
    StepParams(const StepParams&) = delete;
    StepParams& operator=(const StepParams&) = delete;
    void* const* data() const { return ptrs.data(); }
  };
  // `scratch` is this call's (made from the same params, whose integer scalars it read).
  void step_params(size_t v, size_t k, void* const* params, Scratch& scratch, StepParams& out) const {
    scratch.ensure(v);
    out.ptrs.assign(steps[v][k].from.size(), nullptr);
    out.values.assign(steps[v][k].from.size(), 0);
    map_params(v, k, params, scratch.slots, scratch.ptrs.data(), out.values.data(), out.ptrs.data());
  }

  // Why variant v cannot run this call without reaching past a buffer, or "": each
  // step's buffers must hold what its kernel's spec says it touches at this call, as our
  // spec declares them (ours) or as it sizes our scratch. Checked where a shape is
  // decided, before any of the variant's steps runs (with S in buckets, check_call
  // checks the chosen variant again at each call).
  std::string size_fault(size_t v, void* const* params, Scratch& scratch) const {
    for (size_t k = 0; k < steps[v].size(); ++k) {
      const KernelSpec& ks = spec.variants[v].steps[k].kernel;
      StepParams sp;
      step_params(v, k, params, scratch, sp);
      std::vector<int64_t> vslots(ks.args.size(), 0);
      read_int_slots(ks, sp.data(), vslots.data());
      if (std::string why = buffer_fault(v, k, vslots.data(), scratch.slots); !why.empty()) return why;
    }
    return "";
  }

  // Why step k of variant v reaches past a buffer at this call (its slots vslots, ours slots),
  // or "" (allocates nothing then).
  std::string buffer_fault(size_t v, size_t k, const int64_t* vslots, const int64_t* slots) const {
    const StepMap& sm = steps[v][k];
    const KernelSpec& ks = spec.variants[v].steps[k].kernel;
    for (size_t j = 0; j < sm.from.size(); ++j) {
      const ArgFrom& f = sm.from[j];
      if (f.kind == ArgFrom::computed || !ks.args[j].pointer) continue;
      const bool ours = f.kind == ArgFrom::ours;
      const size_t i = static_cast<size_t>(f.index);
      const int64_t holds = ours ? our_sizes[i].eval(slots) : scratch_sizes[i].eval(slots);
      const int64_t needs = sm.needs[j].eval(vslots);
      if (holds < 0 || needs > holds)
        return fmt::format("step {} ('{}'): its argument '{}' touches {} elements at this call, but {} '{}' holds {} "
                           "(its size '{}' in the multi-kernel's spec)",
                           k, ks.name, ks.args[j].name, needs, ours ? "the buffer" : "the scratch buffer",
                           ours ? spec.args[i].name : spec.scratch[i].name, holds,
                           ours ? spec.args[i].size.str() : spec.scratch[i].size.str());
    }
    return "";
  }

  // Launches each step of a chosen variant (the call path and the timing of a
  // multi-launch variant). Allocates nothing.
  void run_chosen(const Chosen& c, void* const* params, const int64_t* slots, void** scratch_ptrs,
                  Stream stream) const {
    for (size_t k = 0; k < c.runs.size(); ++k) {
      void* vp[CallShape::kMaxArgs];
      int64_t values[CallShape::kMaxArgs];
      map_params(c.variant, k, params, slots, scratch_ptrs, values, vp);
      int64_t vslots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
      steps[c.variant][k].shape.read(vp, vslots, unused);
      const Run& r = c.runs[k];
      r.kernel->launch(vp, r.plan.eval(vslots), stream);
    }
  }

  // The choice for the call's shape (decided on first sight); fills slots.
  const Chosen* find(void* const* params, int64_t* slots, Stream stream) {
    int64_t key[CallShape::kMaxKey];
    shape.read(params, slots, key);
    const Chosen* c;
    if (!memo.find(key, &c)) c = decide(params, key, stream);
    // (After decide too: another thread may have decided the bucket at another S meanwhile.)
    if (!spec.pow2.empty()) check_call(*c, params, slots);
    return c;
  }

  Run make_run(size_t variant, size_t k, const Config& config) {
    const KernelSpec& ks = spec.variants[variant].steps[k].kernel;
    Run r;
    r.config = config;
    const auto t0 = std::chrono::steady_clock::now();
    // On the caller's path (a first call waits for it): ahead of compiles queued for later.
    BinaryFuture bin = rt.compile_pool(spec.backend).submit(ks, config, /*urgent=*/true);
    bin.wait();
    const double got = log::ms_since(t0);
    r.kernel = rt.load(*bin.get());
    if (log::debugging())
      log::debug("multi-kernel '{}': {} config {} ready in {:.2f} ms (its binary in {:.2f} ms)", spec.name, ks.name,
                 config.str(), log::ms_since(t0), got);
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    if (config.library.empty()) r.plan = LaunchPlan(ks, config, limits);
    if (!spec.pow2.empty())
      for (size_t i = 0; i < ks.constraints.size(); ++i) {
        bool call = false, param = false;
        for (const std::string& n : ks.constraints[i].symbols()) {
          const bool p = std::any_of(ks.space.params.begin(), ks.space.params.end(), [&](const auto& q) { return q.name == n; });
          param = param || p;
          call = call || (!p && !ks.constant(n));
        }
        // (A library choice has no params: a constraint on them is not its own.)
        if (call && (!param || config.library.empty()))
          r.guards.emplace_back(i, compile_expr(ks, ks.constraints[i], &config, &limits));
      }
    return r;
  }

  // Where a call's choice is remembered by a bucket of the key (S = "pow2"), it was decided at
  // another value of that bucket, and is reused at this one: the chosen steps' constraints that
  // read the call, and what their buffers must hold, are checked at every such call (a call past a
  // cache's capacity, say, is refused, not run past the buffers). Allocates nothing.
  void check_call(const Chosen& c, void* const* params, const int64_t* slots) const {
    void* no_scratch[8] = {};
    for (size_t k = 0; k < c.runs.size(); ++k) {
      void* vp[CallShape::kMaxArgs];
      int64_t values[CallShape::kMaxArgs], vslots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
      map_params(c.variant, k, params, slots, no_scratch, values, vp);
      steps[c.variant][k].shape.read(vp, vslots, unused);
      const KernelSpec& ks = spec.variants[c.variant].steps[k].kernel;
      for (const auto& [i, e] : c.runs[k].guards)
        if (e.eval(vslots) == 0)
          fail(Errc::usage, "multi-kernel '{}': this call breaks the constraint '{}' of its step {} ('{}'): the choice "
               "made for this bucket of {} cannot run it", spec.name, ks.constraints[i].str(), k, ks.name,
               fmt::join(spec.pow2, ", "));
      if (std::string why = buffer_fault(c.variant, k, vslots, slots); !why.empty())
        fail(Errc::usage, "multi-kernel '{}': the choice made for this bucket of {} cannot run this call: {}", spec.name,
             fmt::join(spec.pow2, ", "), why);
    }
  }

  const Chosen* chosen_for(size_t variant, const std::vector<Config>& configs, ChoiceSource source) {
    std::lock_guard<std::mutex> g(m);
    for (const auto& c : chosen) {
      if (c->variant != variant || c->source != source || c->runs.size() != configs.size()) continue;
      bool same = true;
      for (size_t k = 0; k < configs.size(); ++k) same = same && c->runs[k].config == configs[k];
      if (same) return c.get();
    }
    auto c = std::make_unique<Chosen>();
    c->variant = variant;
    c->source = source;
    for (size_t k = 0; k < configs.size(); ++k) {
      c->runs.push_back(make_run(variant, k, configs[k]));
      c->text += (k ? " ; " : "") + configs[k].str();
    }
    chosen.push_back(std::move(c));
    return chosen.back().get();
  }

  // Tunes each step of variant v for this call, in order (each from its own
  // record where there is one): a step that writes only scratch runs its
  // choice before the next is tuned, so that one is tuned on real data.
  // Returns each step's choice, and fills `runs` (when given) with them
  // loaded. Throws Error(Errc::tune) when a step has no config that runs, Error(Errc::launch)
  // when a step would reach past a buffer at this call (size_fault).
  std::vector<Config> tune_steps(size_t v, void* const* params, Scratch& scratch, Stream stream,
                                 const std::atomic<bool>* cancel, std::vector<Run>* runs) {
    const VariantSpec& var = spec.variants[v];
    if (std::string why = size_fault(v, params, scratch); !why.empty())
      fail(Errc::launch, "multi-kernel '{}', variant {} ('{}'): {}", spec.name, v, var.name(), why);
    std::vector<Config> out;
    if (several(v) && !runs && !tune.force) {
      // Every step answered by its record: nothing needs to run.
      for (size_t k = 0; k < var.steps.size(); ++k) {
        StepParams sp;
        step_params(v, k, params, scratch, sp);
        TuneOptions to = tune;
        to.stream = stream;
        to.cached_only = true;
        TuneOutcome o = rt.tune(CallView(var.steps[k].kernel, rt.backend(spec.backend), sp.data()), to);
        if (!o.choice) break;
        out.push_back(*o.choice);
      }
      if (out.size() == var.steps.size()) return out;
      out.clear();
    }
    for (size_t k = 0; k < var.steps.size(); ++k) {
      const VariantStep& st = var.steps[k];
      StepParams sp;
      step_params(v, k, params, scratch, sp);
      TuneOptions to = tune;
      to.stream = stream;
      to.cancel = cancel;
      TuneOutcome o = rt.tune(st.kernel, sp.data(), to);
      if (!o.choice)
        fail(Errc::tune, "{}: {}", several(v) ? fmt::format("step {} ('{}')", k, st.kernel.name) : st.kernel.name,
             o.record.all_failed_message());
      out.push_back(*o.choice);
      if (!several(v)) break;
      bool scratch_only = true;
      for (size_t j = 0; j < st.args.size(); ++j)
        if (st.kernel.args[j].pointer && st.kernel.args[j].intent != Intent::in &&
            steps[v][k].from[j].kind != ArgFrom::scratch)
          scratch_only = false;
      if (runs || (scratch_only && k + 1 < var.steps.size())) {
        Run r = make_run(v, k, *o.choice);
        if (scratch_only && k + 1 < var.steps.size()) {
          int64_t vslots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
          steps[v][k].shape.read(sp.data(), vslots, unused);
          r.kernel->launch(sp.data(), r.plan.eval(vslots), stream);
          scratch.dev.sync(stream);
        }
        if (runs) runs->push_back(std::move(r));
      }
    }
    return out;
  }

  const Chosen* decide(void* const* params, const int64_t* key, Stream stream) {
    std::lock_guard<std::mutex> g(memo.mutex());
    const Chosen* found;
    if (memo.find(key, &found)) return found;
    const auto t0 = std::chrono::steady_clock::now();
    Scratch scratch(*this, params);
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
        // Its tuning key (a bucket of a bucketed key) is being tuned already: that tuning's
        // safe choice where every step of it can run this call, not memoised.
        if (mode == FirstCall::swap && !spec.pow2.empty())
          if (const Chosen* joined = swaps.join(tkey.values_text()))
            if (runs_here(*joined, params, scratch)) return joined;
        if (const Chosen* c = first_call(params, key, stream, tkey, mode, scratch)) {
          memo.insert(key, c);
          return c;
        }
        if (mode == FirstCall::serve)
          fail(Errc::tune, "multi-kernel '{}' at {}: KILN_FIRST_CALL=serve, and no variant can run this call "
               "without tuning", spec.name, tkey.values_text());
      }
    }
    const double variant_ms = log::ms_since(t0);  // its record read and the variant known
    std::vector<Config> configs;
    if (source == ChoiceSource::benchmarked) {
      TuningRecord fresh = benchmark(tkey, params, scratch, stream, nullptr, &configs);
      variant = static_cast<size_t>(*fresh.best->get("VARIANT"));
    } else {
      try {
        configs = tune_steps(variant, params, scratch, stream, nullptr, nullptr);
      } catch (const Error& e) {
        // (Errc::launch: a step would reach past a buffer at this call, size_fault; its message is whole.)
        if (e.code() != Errc::tune && e.code() != Errc::launch) throw;
        if (source != ChoiceSource::cache && e.code() == Errc::launch) throw;
        if (source != ChoiceSource::cache)
          fail(Errc::tune, "multi-kernel '{}', variant {} ('{}'): {}", spec.name, variant,
               spec.variants[variant].name(), e.what());
        // The record's variant cannot run this call (the record is kept by
        // shape, and this call's buffers are aligned less, say): the variants
        // are benchmarked on it.
        log::info("multi-kernel '{}' at {}: the recorded variant {} cannot run this call ({}); benchmarking the "
                  "variants on it", spec.name, tkey.values_text(), variant, e.what());
        source = ChoiceSource::benchmarked;
        TuningRecord fresh = benchmark(tkey, params, scratch, stream, nullptr, &configs);
        variant = static_cast<size_t>(*fresh.best->get("VARIANT"));
      }
    }
    if (source == ChoiceSource::cache && !several(variant) && mode == FirstCall::swap)
      if (const Chosen* now = while_library_readies(params, key, tkey, variant, configs, scratch)) {
        memo.insert(key, now);
        return now;
      }
    const VariantSpec& v = spec.variants[variant];
    const double configs_ms = log::ms_since(t0);
    const Chosen* c = chosen_for(variant, configs, source);
    if (log::debugging())
      log::debug("multi-kernel '{}' at {}: variant {} ready in {:.2f} ms (the variant at {:.2f}, its configs at "
                 "{:.2f} ms)", spec.name, tkey.values_text(), variant, log::ms_since(t0), variant_ms, configs_ms);
    log::info("multi-kernel '{}' at {}: variant {} ('{}', {}), {}", spec.name, tkey.values_text(), variant, v.name(),
              c->text, choice_source_name(source));
    memo.insert(key, c);
    return c;
  }

  // The records' choice (variant `variant`, `configs`) calls a library still
  // being readied in the background (a warm process's first calls): the fastest
  // own config of any one-launch variant's record, with its binary at hand,
  // runs meanwhile as a safe choice, and the records' choice replaces it once
  // the library is ready (Swaps). Null where the choice is no such library's,
  // or no own config is at hand (the call then waits for the library). Holds
  // memo.mutex().
  const Chosen* while_library_readies(void* const* params, const int64_t* key, const TuningKey& tkey, size_t variant,
                                      const std::vector<Config>& configs, Scratch& scratch) {
    Library* lib = readying_library(rt, spec.backend, configs[0]);
    if (!lib || !rt.tuning_cache()) return nullptr;
    std::vector<int64_t> shape_key(key, key + shape.key_size());
    if (const Chosen* running = swaps.running(shape_key)) return running;  // evicted while it waits
    std::optional<std::pair<Config, double>> best;
    size_t best_vi = 0;
    for (size_t vi = 0; vi < spec.variants.size(); ++vi) {
      if (several(vi) || !size_fault(vi, params, scratch).empty()) continue;
      StepParams vp;
      step_params(vi, 0, params, scratch, vp);
      const CallView call(spec.variants[vi].steps[0].kernel, rt.backend(spec.backend), vp.data());
      std::optional<TuningRecord> rec = rt.tuning_cache()->get(call.key);
      if (!rec) continue;
      if (auto own = own_choice_at_hand(rt, call, *rec); own && (!best || own->second < best->second)) {
        best = std::move(own);
        best_vi = vi;
      }
    }
    if (!best) return nullptr;
    const Chosen* now = chosen_for(best_vi, {best->first}, ChoiceSource::safe);
    log::info("multi-kernel '{}' at {}: variant {} ('{}', {}) runs while {} is readied; then its records' variant {} "
              "({})", spec.name, tkey.values_text(), best_vi, spec.variants[best_vi].name(), now->text, lib->name(),
              variant, configs[0].str());
    swaps.start(rt, memo, self.lock(), shape_key, now, fmt::format("multi-kernel '{}' at {}", spec.name, tkey.values_text()),
                [this, lib, variant, configs](const std::atomic<bool>& stop) -> const Chosen* {
                  wait_readied(*lib, stop);
                  return stop ? nullptr : chosen_for(variant, configs, ChoiceSource::cache);
                });
    return now;
  }

  // The first variant with a choice that can run the call now: its record's,
  // else its first safe choice. nullptr when none can. A variant of several
  // launches is never the one: each of its steps would need tuning first.
  const Chosen* safe_variant(void* const* params, Stream stream, Scratch& scratch, std::string* how,
                             std::string* failures) {
    for (size_t vi = 0; vi < spec.variants.size(); ++vi) {
      if (several(vi)) continue;
      const VariantStep& v = spec.variants[vi].steps[0];
      if (std::string why = size_fault(vi, params, scratch); !why.empty()) {
        *failures += fmt::format("\n variant {} ('{}'): {}", vi, v.kernel.name, why);
        continue;
      }
      StepParams vp;
      step_params(vi, 0, params, scratch, vp);
      const CallView call(v.kernel, rt.backend(spec.backend), vp.data());
      TuneOptions to = tune;
      to.stream = stream;
      to.cached_only = true;
      TuneOutcome o = rt.tune(call, to);
      if (o.choice) {
        *how = "the variant's own record";
        return chosen_for(vi, {*o.choice}, ChoiceSource::safe);
      }
      if (o.from_cache) continue;  // its record says nothing of it runs
      std::string f;
      std::optional<SafeChoice> s = first_safe_choice(
          rt, call, stream, tune.libraries,
          [&](const Config& cfg) -> const LoadedKernel& {
            return *chosen_for(vi, {cfg}, ChoiceSource::safe)->runs[0].kernel;
          },
          &f);
      if (s) {
        *how = s->how;
        return chosen_for(vi, {s->config}, ChoiceSource::safe);
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
  const Chosen* first_call(void* const* params, const int64_t* key, Stream stream, const TuningKey& tkey,
                           FirstCall mode, Scratch& scratch) {
    std::vector<int64_t> shape_key(key, key + shape.key_size());
    if (const Chosen* running = swaps.running(shape_key)) return running;
    std::string failures, how;
    const Chosen* c = safe_variant(params, stream, scratch, &how, &failures);
    if (!c) {
      log::info("multi-kernel '{}': no variant can run this call untuned; it is tuned before it returns:{}",
                spec.name, failures);
      return nullptr;
    }
    if (mode == FirstCall::serve) {
      rt.note_miss(as_kernel, tkey, fmt::format("variant {}, {}", c->variant, c->text), how);
      return c;
    }
    log::info("multi-kernel '{}' at {}: variant {} ('{}', {}: {}) runs while the variants are tuned in the background",
              spec.name, tkey.values_text(), c->variant, spec.variants[c->variant].name(), c->text, how);
    auto copy = std::make_shared<CallCopy>(as_kernel, params, rt.backend(spec.backend).device(), stream);
    swaps.start(rt, memo, self.lock(), shape_key, c, fmt::format("multi-kernel '{}' at {}", spec.name, tkey.values_text()),
                [this, copy, tkey](const std::atomic<bool>& stop) -> const Chosen* {
                  Scratch scratch(*this, copy->params());
                  std::vector<Config> configs;
                  TuningRecord rec = benchmark(tkey, copy->params(), scratch, nullptr, &stop, &configs);
                  const size_t variant = static_cast<size_t>(*rec.best->get("VARIANT"));
                  const Chosen* won = chosen_for(variant, configs, ChoiceSource::tuned);
                  log::info("multi-kernel '{}' at {}: tuned in the background: variant {} ({})", spec.name,
                            tkey.values_text(), variant, won->text);
                  return won;
                },
                spec.pow2.empty() ? std::string() : tkey.values_text());
    return c;
  }

  // Whether every step of a choice made for another call can run this one.
  bool runs_here(const Chosen& c, void* const* params, Scratch& scratch) {
    if (!size_fault(c.variant, params, scratch).empty()) return false;
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    for (size_t k = 0; k < c.runs.size(); ++k) {
      if (!c.runs[k].config.library.empty()) continue;  // a library checks its own call
      StepParams sp;
      step_params(c.variant, k, params, scratch, sp);
      const KernelSpec& ks = spec.variants[c.variant].steps[k].kernel;
      std::vector<int64_t> slots(ks.args.size(), 0);
      read_int_slots(ks, sp.data(), slots.data());
      if (!Tuner::why_not(ks, c.runs[k].config, slots.data(), limits).empty()) return false;
    }
    return true;
  }

  // A variant of several launches as one kernel, for timing it as a whole:
  // params are ours; its scratch is its own.
  class Sequence final : public LoadedKernel {
   public:
    Sequence(const Impl& m, size_t variant, std::vector<Run> runs, void* const* params)
        : LoadedKernel("sequence:" + m.variant_ids[variant], KernelMeta{}), m_(m), scratch_(m, params) {
      chosen_.variant = variant;
      chosen_.runs = std::move(runs);
      scratch_.ensure(variant);
    }
    void launch(void* const* params, const LaunchDims&, Stream stream) override {
      int64_t slots[CallShape::kMaxArgs], unused[CallShape::kMaxKey];
      m_.shape.read(params, slots, unused);
      m_.run_chosen(chosen_, params, slots, scratch_.ptrs.data(), stream);
    }

   private:
    const Impl& m_;
    Scratch scratch_;
    Chosen chosen_;
  };

  // Tunes each variant, then times the variants' best configs against each
  // other in interleaved rounds on this call's arguments, checking that they
  // agree. A variant of several launches is timed as a whole, in this process
  // (each of its steps' configs was checked when its step was tuned, in a
  // worker unless tuning runs in process). Stores and returns the record
  // (throws when every variant failed).
  // `chosen_configs`: the winner's steps' configs, as tuned here.
  TuningRecord benchmark(const TuningKey& tkey, void* const* params, Scratch& scratch, Stream stream,
                         const std::atomic<bool>* cancel, std::vector<Config>* chosen_configs) {
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
    std::vector<std::unique_ptr<StepParams>> vps(n);
    std::vector<std::vector<Config>> best(n);
    for (size_t i = 0; i < n; ++i) {
      rec.configs[i].config = as_kernel.space.at(i);
      rec.configs[i].binary = variant_ids[i];
      try {
        if (several(i)) {
          std::vector<Run> runs;
          best[i] = tune_steps(i, params, scratch, stream, cancel, &runs);
          loaded[i] = std::make_shared<Sequence>(*this, i, std::move(runs), params);
          inputs[i] = std::make_unique<BenchInputs>(as_kernel, params, backend.device(), true, stream);
        } else {
          const KernelSpec& ks = spec.variants[i].steps[0].kernel;
          best[i] = tune_steps(i, params, scratch, stream, cancel, nullptr);
          bins[i] = rt.compile_pool(spec.backend).submit(ks, best[i][0]).get();
          if (rt.options().tune_in_process) loaded[i] = rt.load(*bins[i]);
          vps[i] = std::make_unique<StepParams>();
          step_params(i, 0, params, scratch, *vps[i]);
          inputs[i] = std::make_unique<BenchInputs>(ks, vps[i]->data(), backend.device(),
                                                    rt.options().tune_in_process, stream);
        }
      } catch (const Error& e) {
        // A variant whose scratch does not fit in memory (io) is passed over, as one that cannot run.
        if (e.code() != Errc::tune && e.code() != Errc::launch && e.code() != Errc::io) throw;
        rec.configs[i].error = e.what();
        rec.configs[i].kind = e.code() == Errc::tune ? FailKind::wrong : FailKind::launch;
      }
    }
    Benchmarker& bench = rt.benchmarker(spec.backend);
    std::unique_ptr<BenchExecutor> here;  // times the variants of several launches
    std::vector<std::vector<double>> samples(n);
    std::optional<size_t> ref;
    // Times variant i once with these settings (throws as the benchmarker does).
    auto time_variant = [&](size_t i, const BenchSettings& st) -> BenchResult {
      const VariantSpec& v = spec.variants[i];
      if (several(i)) {
        if (!here) here = std::make_unique<BenchExecutor>(backend.device());
        return here->run(*loaded[i], inputs[i]->plan(LaunchDims{}, st), inputs[i]->arena().data(), stream);
      }
      std::string text;
      for (size_t k = 0; k < best[i].size(); ++k) text += (k ? " ; " : "") + best[i][k].str();
      std::string what = fmt::format("multi-kernel '{}' variant {} ('{}', config {})", spec.name, i, v.name(), text);
      const KernelSpec& ks = v.steps[0].kernel;
      std::vector<int64_t> vslots(ks.args.size(), 0);
      read_int_slots(ks, vps[i]->data(), vslots.data());
      LaunchDims dims =
          best[i][0].library.empty() ? LaunchPlan(ks, best[i][0], backend.limits()).eval(vslots.data()) : LaunchDims{};
      return bench.run(*bins[i], loaded[i].get(), *inputs[i], dims, what, st, rt.options().bench_timeout_s);
    };
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < n; ++i) {
        if (!inputs[i] || rec.configs[i].kind != FailKind::none) continue;
        BenchSettings st = bench.settings();
        st.check = round == 0;
        st.budget_ms /= 2;
        try {
          BenchResult r = time_variant(i, st);
          samples[i].insert(samples[i].end(), r.ns.begin(), r.ns.end());
          if (round == 0 && several(i))  // a one-launch variant's outputs were checked when it was tuned
            for (size_t m = 0; m < r.unwritten.size() && m < spec.args.size(); ++m)
              if (r.unwritten[m] > 0 && !written_by(i, m).empty()) {
                rec.configs[i].error = fmt::format("its launches left {} elements of '{}' unwritten", r.unwritten[m],
                                                   spec.args[m].name);
                rec.configs[i].kind = FailKind::wrong;
              }
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
      }
      if (round == 0) {
        // The reference is the first variant of one launch that ran (its
        // configs were checked against their own reference when tuned), else
        // the first that ran; the others must agree with it.
        for (size_t i = 0; i < n && !ref; ++i)
          if (!several(i) && !samples[i].empty() && rec.configs[i].kind == FailKind::none) ref = i;
        for (size_t i = 0; i < n && !ref; ++i)
          if (!samples[i].empty() && rec.configs[i].kind == FailKind::none) ref = i;
        for (size_t i = 0; i < n; ++i) {
          if (!ref || i == *ref || samples[i].empty() || rec.configs[i].kind != FailKind::none) continue;
          if (auto bad = disagree(*ref, i, *inputs[*ref], *inputs[i])) {
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
    const std::optional<size_t> tie = break_tie(rec, time_variant, bench.settings());
    auto ranked = rec.ranked();
    rec.kiln_version = kiln_version();
    rec.when = utc_now();
    rec.timed = n;
    if (tie) {
      rec.best = rec.configs[*tie].config;
      rec.best_ns = *rec.configs[*tie].ns;
    } else if (!ranked.empty()) {
      rec.best = ranked[0]->config;
      rec.best_ns = *ranked[0]->ns;
    }
    if (auto cache = rt.tuning_cache()) {
      try {
        // A record with no choice (no variant could run this call: a buffer misaligned for them
        // all, where the key does not hold the alignment) does not replace one with a choice under
        // the same key: the calls that were decided by it keep their answer in later processes.
        std::optional<TuningRecord> kept;
        if (!rec.best) kept = cache->get(rec.key);
        if (kept && kept->best)
          log::info("multi-kernel '{}' at {}: no variant could run this call; the stored choice is kept", spec.name,
                    rec.key.values_text());
        else
          cache->put(rec);
      } catch (const Error& e) {
        log::warn("multi-kernel '{}': chose a variant but could not store the record: {}", spec.name, e.what());
      }
    }
    if (!rec.best) throw Error(Errc::tune, rec.all_failed_message());
    if (auto cache = rt.tuning_cache()) cache->note_used(rec);
    if (chosen_configs) *chosen_configs = best[static_cast<size_t>(*rec.best->get("VARIANT"))];
    return rec;
  }

  // Where the variants are timed as single calls after a cache flush (a GPU's
  // default), those within kTieBand of the fastest cannot be told apart by it:
  // they are timed again with a warm cache, one run after another (as a
  // program's graph runs them, its intermediates in L2), and the fastest of
  // that decides. Each is noted in its result's detail. The winner, or nullopt
  // (no tie, or the flush is off and the timing was warm already).
  static constexpr double kTieBand = 0.02;
  template <class TimeVariant>
  std::optional<size_t> break_tie(TuningRecord& rec, TimeVariant&& time_variant, const BenchSettings& base) {
    if (!base.flush) return std::nullopt;
    double fastest = 0;
    for (const auto& c : rec.configs)
      if (c.ok() && (fastest == 0 || *c.ns < fastest)) fastest = *c.ns;
    std::vector<size_t> near;
    for (size_t i = 0; i < rec.configs.size(); ++i)
      if (rec.configs[i].ok() && *rec.configs[i].ns <= fastest * (1 + kTieBand)) near.push_back(i);
    if (near.size() < 2) return std::nullopt;
    std::vector<std::vector<double>> warm(rec.configs.size());
    for (int round = 0; round < 3; ++round)
      for (size_t i : near) {
        BenchSettings st = base;
        st.flush = false;
        st.check = false;
        st.budget_ms /= 2;
        try {
          BenchResult r = time_variant(i, st);
          warm[i].insert(warm[i].end(), r.ns.begin(), r.ns.end());
        } catch (const Error& e) {
          log::warn("multi-kernel '{}': timing variant {} with a warm cache to break a tie failed: {}", spec.name, i,
                    e.what());
          return std::nullopt;
        }
      }
    std::optional<size_t> won;
    double won_ns = 0;
    for (size_t i : near) {
      const double w = summarize(warm[i]).median_ns;
      rec.configs[i].detail = fmt::format("within {:.0f}% of the fastest after a flush; {:.1f} us with a warm cache",
                                          kTieBand * 100, w * 1e-3);
      if (!won || w < won_ns) won = i, won_ns = w;
    }
    log::info("multi-kernel '{}' at {}: {} variants within {:.0f}% of each other after a flush; with a warm cache "
              "variant {} is the fastest", spec.name, rec.key.values_text(), near.size(), kTieBand * 100, *won);
    return won;
  }

  // The kernel of variant v's first launch that writes our argument m, or "" where none does.
  std::string written_by(size_t v, size_t m) const {
    for (size_t k = 0; k < steps[v].size(); ++k)
      for (size_t j = 0; j < steps[v][k].from.size(); ++j)
        if (steps[v][k].from[j].kind == ArgFrom::ours && steps[v][k].from[j].index == static_cast<int>(m) &&
            spec.variants[v].steps[k].kernel.args[j].intent != Intent::in)
          return spec.variants[v].steps[k].kernel.name;
    return "";
  }

  // Whether variants a and b wrote the same values into every argument of
  // ours that both write (within the dtypes' default tolerances).
  std::optional<std::string> disagree(size_t a, size_t b, const BenchInputs& ra, const BenchInputs& rb) const {
    for (size_t m = 0; m < spec.args.size(); ++m) {
      if (!spec.args[m].pointer || spec.args[m].intent == Intent::in) continue;
      // A variant of several launches was timed on our arguments; one launch on its kernel's.
      auto written = [&](size_t v, const BenchInputs& in) -> std::span<const std::byte> {
        if (several(v)) return written_by(v, m).empty() ? std::span<const std::byte>{} : in.result(m);
        const StepMap& sm = steps[v][0];
        for (size_t j = 0; j < sm.from.size(); ++j)
          if (sm.from[j].kind == ArgFrom::ours && sm.from[j].index == static_cast<int>(m)) {
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
  // Its variants' spaces compiled ahead, as a Kernel's are: queued on the runtime's
  // thread for work ahead of the calls, and not where its records are here.
  if (rt.options().background_compile)  // the job reads records, or compiles where compiles_ahead()
    rt.run_ahead(fmt::format("compiling multi-kernel '{}' ahead", impl_->spec.name),
                 [w = std::weak_ptr<Impl>(impl_)](const std::atomic<bool>& stop) {
                   std::shared_ptr<Impl> m = w.lock();
                   if (!m || stop) return;
                   Backend& be = m->rt.backend(m->spec.backend);
                   if (std::shared_ptr<TuningCache> cache = m->rt.tuning_cache())
                     if (!cache->all(plan_base_key(m->as_kernel, be)).empty()) {
                       // Its variants' records read now (the cache keeps them parsed): a first call
                       // answered by them does not parse them on its path.
                       size_t read = 0;
                       for (const auto& v : m->spec.variants)
                         for (const auto& st : v.steps)
                           if (!stop) read += cache->all(plan_base_key(st.kernel, be)).size();
                       log::debug("multi-kernel '{}': the tuning cache holds its records; nothing compiled ahead "
                                  "({} records of its variants read)", m->spec.name, read);
                       return;
                     }
                   if (!m->rt.options().compiles_ahead()) return;  // serving, or an artifact's: nothing compiled ahead
                   CompilePool& pool = m->rt.compile_pool(m->spec.backend);
                   const LaunchLimits limits = be.limits();
                   for (const auto& v : m->spec.variants)
                     for (const auto& st : v.steps)
                       if (st.kernel.space.size() <= 1024)
                         for (const auto& c : st.kernel.space.all())
                           if (!stop && statically_pruned(st.kernel, c, limits).empty())
                             pool.submit(make_compile_request(st.kernel, c));
                 });
}
MultiKernel::~MultiKernel() = default;

void MultiKernel::launch(void* const* params, Stream stream) {
  Impl& m = *impl_;
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = m.find(params, slots, stream);
  void* scratch[8];
  for (size_t k : m.scratch_used[c->variant]) {
    const int64_t n = m.scratch_sizes[k].eval(slots);
    scratch[k] = t_scratch.get(m.id, k, static_cast<size_t>(n < 0 ? 0 : n) * dtype_size(m.spec.scratch[k].dtype),
                               m.scratch_pool);
  }
  m.run_chosen(*c, params, slots, scratch, stream);
}

Launchable::Running MultiKernel::running(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = impl_->find(params, slots, nullptr);
  bool library = false;
  for (const auto& r : c->runs) library = library || !r.config.library.empty();
  return {fmt::format("variant {}: {}", c->variant, c->text), c->source, library};
}

// Settled: the choice is not a safe one waiting for a tuning, and this
// thread's scratch for it is in place, so that a launch captured into a graph
// allocates nothing (a choice settled by a tuning, or the first call of a
// larger size, is launched once outside a capture first).
bool MultiKernel::settled(void* const* params) {
  Impl& m = *impl_;
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = m.find(params, slots, nullptr);
  if (c->source == ChoiceSource::safe) return false;
  for (size_t k : m.scratch_used[c->variant]) {
    const int64_t n = m.scratch_sizes[k].eval(slots);
    if (!t_scratch.ready(m.id, k, static_cast<size_t>(n < 0 ? 0 : n) * dtype_size(m.spec.scratch[k].dtype)))
      return false;
  }
  return true;
}

MultiKernel::Pick MultiKernel::pick(void* const* params) {
  int64_t slots[CallShape::kMaxArgs];
  const Impl::Chosen* c = impl_->find(params, slots, nullptr);
  Pick p{c->variant, c->source, c->runs[0].config, {}, {}};
  for (const auto& r : c->runs) p.steps.push_back(r.config);
  if (auto cache = impl_->rt.tuning_cache())
    if (auto rec = cache->get(make_tuning_key(impl_->as_kernel, impl_->rt.backend(impl_->spec.backend), params)))
      p.results = rec->configs;
  return p;
}

size_t MultiKernel::scratch_buffers() const { return impl_->scratch_pool->size(); }

const MultiKernelSpec& MultiKernel::spec() const { return impl_->spec; }

void MultiKernel::check_types(const uint8_t* codes, size_t n) const { impl_->shape.check_types(codes, n); }

}  // namespace kiln
