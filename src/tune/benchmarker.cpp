#include "tune/benchmarker.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "compile/worker_compiler.hpp"
#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/hash.hpp"
#include "worker/worker_pool.hpp"

namespace kiln {

namespace {

size_t bytes_of(const BenchArg& a) { return static_cast<size_t>(a.elements) * dtype_size(a.dtype); }
uint64_t align256(uint64_t x) { return (x + 255) / 256 * 256; }

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

// ---- BenchExecutor ----

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
    while (!out.replayed && static_cast<int>(ns.size()) < st.max_reps &&
           (static_cast<int>(ns.size()) < st.min_reps || std::chrono::steady_clock::now() - start < budget)) {
      restore(plan, arena, false, s);
      if (st.flush) flush_bytes = static_cast<int64_t>(dev_.flush_caches(s));
      timer->start(s);
      k.launch(params.data(), plan.dims, s);
      timer->stop(s);
      ns.push_back(timer->elapsed_ns());
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

// ---- BenchInputs ----

BenchInputs::BenchInputs(const KernelSpec& spec, void* const* params, Device& dev, bool in_process, Stream stream) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  init(spec, params, slots.data(), dev, in_process, stream);
}

BenchInputs::BenchInputs(const CallView& call, Device& dev, bool in_process, Stream stream) {
  init(call.spec, call.params, call.slot_data(), dev, in_process, stream);
}

void BenchInputs::init(const KernelSpec& spec, void* const* params, const int64_t* slots, Device& dev,
                       bool in_process, Stream stream) {
  static std::atomic<uint64_t> next_id{1};
  id_ = (static_cast<uint64_t>(::getpid()) << 32) ^ next_id.fetch_add(1);
  dev.sync(stream);  // the caller's data must be there before it is read
  const bool host = dev.host_addressable();
  uint64_t off = 0;
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const ArgSpec& a = spec.args[i];
    BenchArg b;
    b.name = a.name;
    b.buffer = a.pointer;
    b.dtype = a.dtype;
    b.intent = a.intent;
    if (!a.pointer) {
      std::memcpy(&b.scalar_bits, params[i], dtype_size(a.dtype));
      args_.push_back(std::move(b));
      continue;
    }
    b.elements = compile_expr(spec, a.size, nullptr).eval(slots);
    buffer_bytes(a.dtype, b.elements, fmt::format("kernel '{}': argument '{}'", spec.name, a.name));
    // A buffer passed twice (an in-place variant) is one buffer, read and written.
    for (size_t j = 0; j < i; ++j)
      if (args_[j].buffer && args_[j].alias < 0 &&
          *static_cast<void* const*>(params[j]) == *static_cast<void* const*>(params[i])) {
        if (args_[j].elements != b.elements || args_[j].dtype != b.dtype)
          fail(Errc::usage, "kernel '{}': '{}' and '{}' are the same buffer but differ in size or type", spec.name,
               args_[j].name, a.name);
        b.alias = static_cast<int>(j);
        b.intent = Intent::inout;
        args_[j].intent = Intent::inout;
      }
    args_.push_back(std::move(b));
  }
  // Where each buffer's data comes from, then the arena's layout.
  for (size_t i = 0; i < args_.size(); ++i) {
    BenchArg& b = args_[i];
    if (!b.buffer || b.alias >= 0) continue;
    const void* src = *static_cast<void* const*>(params[i]);
    const uint64_t bytes = align256(static_cast<uint64_t>(b.elements) * dtype_size(b.dtype));
    if (b.intent != Intent::out) {
      if (host) {
        b.source = BenchArg::Source::host;
      } else if (in_process) {
        b.source = BenchArg::Source::direct;
        b.direct = reinterpret_cast<uint64_t>(src);
      } else {
        std::string why;
        b.handle = dev.export_buffer(src, &why);
        if (!b.handle.empty()) {
          b.source = BenchArg::Source::shared;
        } else {
          b.source = BenchArg::Source::host;
          if (copied_because_.empty()) copied_because_ = fmt::format("'{}': {}", b.name, why);
        }
      }
      if (b.source == BenchArg::Source::host) b.pristine = off, off += bytes;
    }
    if (b.intent != Intent::in) b.result = off, off += bytes;
  }
  for (auto& b : args_)
    if (b.alias >= 0) {
      const BenchArg& first = args_[static_cast<size_t>(b.alias)];
      b.source = first.source;
      b.pristine = first.pristine;
      b.result = first.result;
    }
  arena_ = SharedArena(off);
  for (size_t i = 0; i < args_.size(); ++i) {
    const BenchArg& b = args_[i];
    if (b.buffer && b.alias < 0 && b.intent != Intent::out && b.source == BenchArg::Source::host) {
      const void* src = *static_cast<void* const*>(params[i]);
      dev.to_host(arena_.data() + b.pristine, src, static_cast<size_t>(b.elements) * dtype_size(b.dtype), stream);
    }
  }
  if (!copied_because_.empty()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      log::warn("tuning copies the call's buffers to host memory for the worker, since one cannot be shared ({}); "
                "this costs time, not correctness (said once)",
                copied_because_);
  }
}

BenchPlan BenchInputs::plan(const LaunchDims& dims, const BenchSettings& settings) const {
  BenchPlan p;
  p.args = args_;
  p.dims = dims;
  p.settings = settings;
  p.arena_bytes = arena_.size();
  p.arena_id = id_;
  return p;
}

std::span<const std::byte> BenchInputs::result(size_t arg) const {
  const BenchArg& b = args_.at(arg);
  if (!b.buffer || b.intent == Intent::in) return {};
  return {arena_.data() + b.result, static_cast<size_t>(b.elements) * dtype_size(b.dtype)};
}

// ---- Benchmarker ----

Benchmarker::Benchmarker(std::shared_ptr<WorkerPool> workers, Device* device, const Options& opts, bool gpu)
    : workers_(std::move(workers)), opts_(opts), gpu_(gpu) {
  if (!workers_) {
    if (!device) fail(Errc::internal, "an in-process Benchmarker needs a device");
    local_ = std::make_unique<BenchExecutor>(*device);
  }
}

Benchmarker::~Benchmarker() = default;

BenchSettings Benchmarker::settings() const {
  BenchSettings s;
  s.budget_ms = opts_.bench_budget_ms;
  s.flush = gpu_ ? opts_.cuda_flush_l2 : opts_.bench_flush;
  return s;
}

BenchResult Benchmarker::run(const Binary& bin, LoadedKernel* loaded, const BenchInputs& in, const LaunchDims& dims,
                             const std::string& what, const BenchSettings& settings, double timeout_s) {
  BenchPlan plan = in.plan(dims, settings);
  if (!workers_) {
    if (!loaded) fail(Errc::internal, "in-process benchmark of {} without a loaded kernel", what);
    return local_->run(*loaded, plan, in.arena().data());
  }
  WorkerPool::Request r;
  r.msg = {{"op", "bench"}, {"binary", wire::binary_to_json(bin)}, {"plan", to_json(plan)},
           {"options", worker_options(opts_)}};
  r.fd = in.arena().fd();
  r.timeout_s = timeout_s;
  r.what = "benchmarking " + what;
  r.reproduce = "KILN_TUNE_IN_PROCESS=1 (the fault will then take this process down)";
  r.request_faults = true;
  r.retry_request_faults = false;
  nlohmann::json reply = workers_->call(r);
  if (!reply.value("ok", false)) {
    // The kernel faulted on the GPU: the worker lost its context (and left). The fault is the config's.
    if (reply.at("error").value("code", "") == "device-fault") {
      WorkerFault f;
      f.kind = WorkerFault::Kind::crash;
      f.of_request = true;
      throw WorkerError(f, fmt::format("benchmarking {}: the kernel faulted on the GPU: {} (the worker's context is "
                                       "lost; it was replaced; not retried)",
                                       what, reply["error"].value("message", "")));
    }
    rethrow_worker_error(reply);
  }
  return bench_result_from_json(reply.at("result"));
}

}  // namespace kiln
