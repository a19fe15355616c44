#include "tune/benchmarker.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "core/format.hpp"
#include "kiln/hash.hpp"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

size_t bytes_of(const BenchArg& a) { return static_cast<size_t>(a.elements) * dtype_size(a.dtype); }

void poison(const BenchArg& a, std::byte* p) {
  size_t n = static_cast<size_t>(a.elements);
  switch (a.dtype) {
    case DType::f32: std::fill_n(reinterpret_cast<float*>(p), n, std::numeric_limits<float>::quiet_NaN()); break;
    case DType::f64: std::fill_n(reinterpret_cast<double*>(p), n, std::numeric_limits<double>::quiet_NaN()); break;
    default: std::memset(p, 0x5A, bytes_of(a));
  }
}

// Evicts the caches: writes and reads a buffer larger than any last-level cache.
void flush_caches() {
  static std::vector<char> junk(256u << 20);
  static char sink = 0;
  for (size_t i = 0; i < junk.size(); i += 64) junk[i] = static_cast<char>(junk[i] + 1 + sink);
  sink = junk[junk.size() / 2];
}

// The checking run: poisoned outputs, one launch, outputs kept in the
// result regions; returns their checksum.
std::string check_run(LoadedKernel& k, const BenchPlan& plan, std::byte* arena, void* const* params) {
  for (const auto& a : plan.args)
    if (a.buffer && a.intent == Intent::out) poison(a, arena + a.work);
  k.launch(params, plan.grid);
  Hasher h;
  for (const auto& a : plan.args) {
    if (!a.buffer) continue;
    if (a.intent == Intent::in) {
      if (std::memcmp(arena + a.work, arena + a.pristine, bytes_of(a)) != 0)
        fail(Errc::launch, "the kernel wrote to '{}', an argument declared intent = \"in\"", a.name);
      continue;
    }
    std::memcpy(arena + a.result, arena + a.work, bytes_of(a));
    h.add(a.name, std::string_view(reinterpret_cast<const char*>(arena + a.result), bytes_of(a)));
  }
  return h.digest().hex();
}

}  // namespace

BenchResult run_bench(LoadedKernel& k, const BenchPlan& plan, std::byte* arena) {
  const size_t n = plan.args.size();
  std::vector<void*> ptrs(n, nullptr);
  std::vector<uint64_t> scalars(n, 0);
  std::vector<void*> params(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const BenchArg& a = plan.args[i];
    if (a.buffer) {
      ptrs[i] = arena + a.work;
      params[i] = &ptrs[i];
    } else {
      scalars[i] = a.scalar_bits;
      params[i] = &scalars[i];
    }
  }
  auto restore = [&](bool with_in) {
    for (const auto& a : plan.args)
      if (a.buffer && (a.intent == Intent::inout || (with_in && a.intent == Intent::in)))
        std::memcpy(arena + a.work, arena + a.pristine, bytes_of(a));
  };

  BenchResult r;
  const BenchSettings& s = plan.settings;
  restore(true);
  if (s.check) r.checksum = check_run(k, plan, arena, params.data());

  // Warm-up, then timed runs.
  for (int i = 0; i < s.warmup; ++i) {
    restore(false);
    k.launch(params.data(), plan.grid);
  }
  auto start = Clock::now();
  auto budget = std::chrono::duration<double, std::milli>(s.budget_ms);
  while (static_cast<int>(r.ns.size()) < s.max_reps &&
         (static_cast<int>(r.ns.size()) < s.min_reps || Clock::now() - start < budget)) {
    restore(false);
    if (s.flush) flush_caches();
    auto t0 = Clock::now();
    k.launch(params.data(), plan.grid);
    auto t1 = Clock::now();
    r.ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  BenchResult out = summarize(std::move(r.ns));
  out.checksum = std::move(r.checksum);
  return out;
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

}  // namespace kiln

#include "compile/worker_compiler.hpp"
#include "kiln/args.hpp"
#include "worker/worker_pool.hpp"

namespace kiln {

namespace {
uint64_t align64(uint64_t x) { return (x + 63) / 64 * 64; }
}  // namespace

BenchArena::BenchArena(const KernelSpec& spec, void* const* params) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  // Buffers passed more than once (an in-place variant) share one region, as
  // they share memory in the call; such a region is read and written (inout).
  std::vector<int> alias_of(spec.args.size(), -1);
  for (size_t i = 0; i < spec.args.size(); ++i) {
    if (!spec.args[i].pointer) continue;
    for (size_t j = 0; j < i; ++j)
      if (spec.args[j].pointer && alias_of[j] < 0 &&
          *static_cast<void* const*>(params[j]) == *static_cast<void* const*>(params[i])) {
        alias_of[i] = static_cast<int>(j);
        break;
      }
  }
  uint64_t off = 0;
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const ArgSpec& a = spec.args[i];
    BenchArg b;
    b.name = a.name;
    b.buffer = a.pointer;
    b.dtype = a.dtype;
    b.intent = a.intent;
    if (a.pointer) {
      b.elements = compile_expr(spec, a.size, nullptr).eval(slots.data());
      if (b.elements < 0)
        fail(Errc::usage, "kernel '{}': argument '{}' has size {} = {}", spec.name, a.name, a.size.str(), b.elements);
      if (alias_of[i] >= 0) {
        BenchArg& first = args_[alias_of[i]];
        if (first.elements != b.elements || first.dtype != b.dtype)
          fail(Errc::usage, "kernel '{}': '{}' and '{}' are the same buffer but differ in size or type", spec.name,
               first.name, a.name);
        args_.push_back(b);  // offsets are set below, once the first has its regions
        continue;
      }
      bool shared = std::find(alias_of.begin(), alias_of.end(), static_cast<int>(i)) != alias_of.end();
      if (shared) b.intent = Intent::inout;
      uint64_t bytes = align64(static_cast<uint64_t>(b.elements) * dtype_size(a.dtype));
      if (b.intent != Intent::out) b.pristine = off, off += bytes;
      b.work = off, off += bytes;
      if (b.intent != Intent::in) b.result = off, off += bytes;
    } else {
      std::memcpy(&b.scalar_bits, params[i], dtype_size(a.dtype));
    }
    args_.push_back(std::move(b));
  }
  for (size_t i = 0; i < args_.size(); ++i) {
    if (alias_of[i] < 0) continue;
    const BenchArg& first = args_[alias_of[i]];
    args_[i].intent = Intent::inout;
    args_[i].pristine = first.pristine;
    args_[i].work = first.work;
    args_[i].result = first.result;
  }
  arena_ = SharedArena(off);
  for (size_t i = 0; i < args_.size(); ++i) {
    const BenchArg& b = args_[i];
    if (b.buffer && alias_of[i] < 0 && b.intent != Intent::out) {
      const void* src = *static_cast<void* const*>(params[i]);
      std::memcpy(arena_.data() + b.pristine, src, static_cast<size_t>(b.elements) * dtype_size(b.dtype));
    }
  }
}

BenchPlan BenchArena::plan(const Grid& grid, const BenchSettings& settings) const {
  BenchPlan p;
  p.args = args_;
  p.grid = grid;
  p.settings = settings;
  p.arena_bytes = arena_.size();
  return p;
}

std::span<const std::byte> BenchArena::result(size_t arg) const {
  const BenchArg& b = args_.at(arg);
  if (!b.buffer || b.intent == Intent::in) return {};
  return {arena_.data() + b.result, static_cast<size_t>(b.elements) * dtype_size(b.dtype)};
}

Benchmarker::Benchmarker(std::shared_ptr<WorkerPool> workers, const Options& opts)
    : workers_(std::move(workers)), opts_(opts) {}

BenchSettings Benchmarker::settings() const {
  BenchSettings s;
  s.budget_ms = opts_.bench_budget_ms;
  s.flush = opts_.bench_flush;
  return s;
}

BenchResult Benchmarker::run(const Binary& bin, LoadedKernel* loaded, const BenchArena& arena, const Grid& grid,
                             const std::string& what, const BenchSettings& settings) {
  BenchPlan plan = arena.plan(grid, settings);
  if (!workers_) {
    if (!loaded) fail(Errc::internal, "in-process benchmark of {} without a loaded kernel", what);
    return run_bench(*loaded, plan, arena.arena().data());
  }
  WorkerPool::Request r;
  r.msg = {{"op", "bench"}, {"binary", wire::binary_to_json(bin)}, {"plan", to_json(plan)},
           {"options", worker_options(opts_)}};
  r.fd = arena.arena().fd();
  r.timeout_s = opts_.bench_timeout_s;
  r.what = "benchmarking " + what;
  r.reproduce = "KILN_TUNE_IN_PROCESS=1 (the crash will then take this process down)";
  nlohmann::json reply = workers_->call(r);
  if (!reply.value("ok", false)) rethrow_worker_error(reply);
  return bench_result_from_json(reply.at("result"));
}

}  // namespace kiln
