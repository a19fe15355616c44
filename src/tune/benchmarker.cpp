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
  s.hold = gpu_ && opts_.cuda_bench_hold;
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
