#include "worker/bench_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/hash.hpp"

namespace kiln {

namespace {

size_t bytes_of(const BenchArg& a) { return static_cast<size_t>(a.elements) * dtype_size(a.dtype); }

// Held timing (BenchSettings::hold): runs enqueued behind one hold, and the longest the device
// waits for the host to let them go (a bound for a host that stalls; the runs then start).
constexpr int kHoldBatch = 16;
constexpr double kHoldLimitMs = 100;

// Lets a held stream go when it leaves scope, also when a launch throws.
struct HoldRelease {
  Device& dev;
  uint64_t hold;  // 0: none
  ~HoldRelease() {
    if (hold) dev.release_stream(hold);
  }
};

}  // namespace

Poison poison_of(DType t) {
  switch (t) {
    case DType::f32: return {0x7FC0BAD5u, 4};  // quiet NaNs with a payload no arithmetic makes
    case DType::f64: return {0x7FF8BAD5u, 4};  // 0x7FF8BAD57FF8BAD5
    case DType::f16: return {0x7E5Au, 2};
    case DType::bf16: return {0x7FDAu, 2};
    case DType::i32:
    case DType::i64: return {0x5Au, 1};
  }
  return {0, 1};
}

int64_t count_poisoned(DType t, std::span<const std::byte> bytes) {
  Poison p = poison_of(t);
  size_t es = dtype_size(t);
  unsigned char pat[8];
  for (size_t i = 0; i < es; ++i) pat[i] = static_cast<unsigned char>(p.pattern >> (8 * (i % p.bytes)));
  int64_t n = 0;
  for (size_t off = 0; off + es <= bytes.size(); off += es)
    if (std::memcmp(bytes.data() + off, pat, es) == 0) ++n;
  return n;
}

BenchResult summarize(std::vector<double> ns) {
  BenchResult r;
  r.ns = std::move(ns);
  std::vector<double> sorted = r.ns;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) {
    size_t m = sorted.size();
    r.median_ns = m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
    r.min_ns = sorted.front();
    r.max_ns = sorted.back();
  }
  return r;
}

BenchExecutor::~BenchExecutor() { release(); }

void BenchExecutor::release() noexcept {
  for (size_t i = 0; i < work_.size(); ++i) {
    if (!work_[i]) continue;
    if (owned_[i]) dev_.free(work_[i]);
    else if (imported_[i]) dev_.close_import(work_[i]);
  }
  for (void* p : pristine_)
    if (p) dev_.free(p);
  pristine_.clear();
  work_.clear();
  owned_.clear();
  imported_.clear();
  snapshot_.clear();
  device_bytes_ = 0;
  id_ = 0;
}

void BenchExecutor::prepare(const BenchPlan& plan, std::byte* arena, Stream s) {
  if (id_ == plan.arena_id && work_.size() == plan.args.size() && id_ != 0) return;
  release();
  const size_t n = plan.args.size();
  work_.assign(n, nullptr);
  pristine_.assign(n, nullptr);
  owned_.assign(n, false);
  imported_.assign(n, false);
  snapshot_.assign(n, {});
  try {
    for (size_t i = 0; i < n; ++i) {
      const BenchArg& a = plan.args[i];
      if (!a.buffer || a.alias >= 0) continue;
      const size_t bytes = bytes_of(a);
      const bool in_place = a.intent == Intent::in && a.source != BenchArg::Source::host;
      if (in_place) {
        if (a.source == BenchArg::Source::shared) {
          work_[i] = dev_.import_buffer(a.handle);
          imported_[i] = true;
        } else {
          work_[i] = reinterpret_cast<void*>(a.direct);
        }
        snapshot_[i].resize(bytes);
        dev_.to_host(snapshot_[i].data(), work_[i], bytes, s);
        continue;
      }
      work_[i] = dev_.alloc(bytes);
      owned_[i] = true;
      device_bytes_ += static_cast<int64_t>(align256(bytes));
      if (a.source == BenchArg::Source::shared && a.intent == Intent::inout) {
        // The source is read for every restore: import it once.
        void* src = dev_.import_buffer(a.handle);
        snapshot_[i].resize(0);
        dev_.copy(work_[i], src, bytes, s);
        dev_.sync(s);
        dev_.close_import(src);
        // Keep a device copy of the pristine data to restore from.
        pristine_[i] = dev_.alloc(bytes);
        dev_.copy(pristine_[i], work_[i], bytes, s);
        device_bytes_ += static_cast<int64_t>(align256(bytes));
      }
    }
  } catch (...) {
    release();
    throw;
  }
  static_cast<void>(arena);
  id_ = plan.arena_id;
}

void BenchExecutor::restore(const BenchPlan& plan, std::byte* arena, bool with_in, Stream s) {
  for (size_t i = 0; i < plan.args.size(); ++i) {
    const BenchArg& a = plan.args[i];
    if (!a.buffer || a.alias >= 0) continue;
    const size_t bytes = bytes_of(a);
    const bool shared_inout = a.source == BenchArg::Source::shared && a.intent == Intent::inout;
    if (a.intent == Intent::out) continue;
    if (a.intent == Intent::in && (!with_in || a.source != BenchArg::Source::host)) continue;
    switch (a.source) {
      case BenchArg::Source::host: dev_.to_device(work_[i], arena + a.pristine, bytes, s); break;
      case BenchArg::Source::direct: dev_.copy(work_[i], reinterpret_cast<const void*>(a.direct), bytes, s); break;
      case BenchArg::Source::shared: break;
    }
    if (shared_inout) dev_.copy(work_[i], pristine_[i], bytes, s);
  }
}

BenchResult BenchExecutor::run(LoadedKernel& k, const BenchPlan& plan, std::byte* arena, Stream s) {
  // A benchmark run from within a program's call (a first call tuned in process) vouches for
  // nothing and does not take the call's first launch: its runs are launched as alone.
  EarlyReadScope none(nullptr, s, false);
  prepare(plan, arena, s);
  const size_t n = plan.args.size();
  std::vector<void*> ptrs(n, nullptr);
  std::vector<uint64_t> scalars(n, 0);
  std::vector<void*> params(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const BenchArg& a = plan.args[i];
    if (a.buffer) {
      ptrs[i] = work_[a.alias >= 0 ? static_cast<size_t>(a.alias) : i];
      params[i] = &ptrs[i];
    } else {
      scalars[i] = a.scalar_bits;
      params[i] = &scalars[i];
    }
  }
  const BenchSettings& st = plan.settings;
  BenchResult out;
  restore(plan, arena, true, s);
  if (st.check) {
    for (const auto& a : plan.args)
      if (a.buffer && a.alias < 0 && a.intent == Intent::out) {
        Poison p = poison_of(a.dtype);
        size_t idx = static_cast<size_t>(&a - plan.args.data());
        dev_.fill(work_[idx], p.pattern, p.bytes, bytes_of(a) / static_cast<size_t>(p.bytes), s);
      }
    k.launch(params.data(), plan.dims, s);
    dev_.sync(s);
    Hasher h;
    out.unwritten.assign(n, 0);
    std::vector<std::byte> tmp;
    for (size_t i = 0; i < n; ++i) {
      const BenchArg& a = plan.args[i];
      if (!a.buffer || a.alias >= 0) continue;
      const size_t bytes = bytes_of(a);
      if (a.intent == Intent::in) {
        bool same;
        if (a.source == BenchArg::Source::host) {
          if (dev_.host_addressable()) {
            same = std::memcmp(work_[i], arena + a.pristine, bytes) == 0;
          } else {
            tmp.resize(bytes);
            dev_.to_host(tmp.data(), work_[i], bytes, s);
            same = std::memcmp(tmp.data(), arena + a.pristine, bytes) == 0;
          }
        } else {
          tmp.resize(bytes);
          dev_.to_host(tmp.data(), work_[i], bytes, s);
          same = std::memcmp(tmp.data(), snapshot_[i].data(), bytes) == 0;
        }
        if (!same) fail(Errc::launch, "the kernel wrote to '{}', an argument declared intent = \"in\"", a.name);
        continue;
      }
      dev_.to_host(arena + a.result, work_[i], bytes, s);
      std::span<const std::byte> got(arena + a.result, bytes);
      if (a.intent == Intent::out) out.unwritten[i] = count_poisoned(a.dtype, got);
      h.add(a.name, std::string_view(reinterpret_cast<const char*>(got.data()), bytes));
    }
    out.checksum = h.digest().hex();
  }
  if (st.time) {
    auto timer = dev_.timer();
    for (int i = 0; i < st.warmup; ++i) {
      restore(plan, arena, false, s);
      k.launch(params.data(), plan.dims, s);
    }
    // (The flush's first use allocates its buffer and may load a kernel: not behind a hold.)
    if (st.hold && st.flush) dev_.flush_caches(s);
    dev_.sync(s);
    std::vector<double> ns;
    auto start = std::chrono::steady_clock::now();
    auto budget = std::chrono::duration<double, std::milli>(st.budget_ms);
    int64_t flush_bytes = 0;
    // A kernel shorter than launch gaps (tens of microseconds) is timed by
    // replaying a graph of many launches, where the device can, when no run
    // needs restoring or flushing first.
    bool restores = false;
    for (const auto& a : plan.args) restores = restores || (a.buffer && a.intent == Intent::inout);
    if (!st.flush && !restores) {
      timer->start(s);
      k.launch(params.data(), plan.dims, s);
      timer->stop(s);
      double one = timer->elapsed_ns();
      if (one < 20000) {
        auto launch = [&](Stream cs) { k.launch(params.data(), plan.dims, cs); };
        int count = static_cast<int>(std::clamp(200000.0 / std::max(one, 1.0), 20.0, 1000.0));
        double first = dev_.replay_ns(launch, count);
        if (first > 0) {
          ns.push_back(first);
          while (static_cast<int>(ns.size()) < st.max_reps &&
                 (static_cast<int>(ns.size()) < st.min_reps || std::chrono::steady_clock::now() - start < budget))
            ns.push_back(dev_.replay_ns(launch, count));
          out.replayed = true;
        }
      }
    }
    // Held (st.hold, where the device can): kHoldBatch runs at a time are enqueued behind a
    // held stream and let go together, so the device runs them back to back and a delay of
    // the host's between a run's start event and its launch is not timed. Not with restores,
    // whose copies from host memory may wait for the stream.
    std::vector<std::unique_ptr<Timer>> timers;
    timers.push_back(std::move(timer));
    while (!out.replayed && static_cast<int>(ns.size()) < st.max_reps &&
           (static_cast<int>(ns.size()) < st.min_reps || std::chrono::steady_clock::now() - start < budget)) {
      const uint64_t held = st.hold && !restores ? dev_.hold_stream(s, kHoldLimitMs) : 0;
      const int batch = held ? std::min(kHoldBatch, st.max_reps - static_cast<int>(ns.size())) : 1;
      {
        HoldRelease release{dev_, held};
        while (static_cast<int>(timers.size()) < batch) timers.push_back(dev_.timer());
        for (int j = 0; j < batch; ++j) {
          restore(plan, arena, false, s);
          if (st.flush) flush_bytes = static_cast<int64_t>(dev_.flush_caches(s));
          timers[j]->start(s);
          k.launch(params.data(), plan.dims, s);
          timers[j]->stop(s);
        }
      }
      for (int j = 0; j < batch; ++j) ns.push_back(timers[j]->elapsed_ns());
    }
    BenchResult r = summarize(std::move(ns));
    out.ns = std::move(r.ns);
    out.median_ns = r.median_ns;
    out.min_ns = r.min_ns;
    out.max_ns = r.max_ns;
    out.device_bytes = device_bytes_ + (dev_.host_addressable() ? 0 : flush_bytes);
  } else {
    out.device_bytes = device_bytes_;
  }
  return out;
}

}  // namespace kiln
