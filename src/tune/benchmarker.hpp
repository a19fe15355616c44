// Benchmarking one compiled config on a call's arguments, on any Device.
//
// The caller's side (BenchInputs) describes the call's arguments and where
// their data comes from: a copy in shared memory (cpu; or a GPU buffer that
// cannot be shared), the caller's own GPU buffer shared with the worker
// (read, never written), or, in-process, the caller's buffer itself. The
// checking run's outputs come back into the shared arena.
//
// The executor (BenchExecutor, worker/bench_executor.hpp) runs it in a
// kiln-worker process (default) or, with KILN_TUNE_IN_PROCESS=1, in the
// caller's. Output and inout buffers get device memory of the executor's own
// (one copy each); in buffers are read where they are, when they can be.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kiln/ext/backend.hpp"
#include "kiln/ext/call_view.hpp"
#include "kiln/spec.hpp"
#include "worker/arena.hpp"
#include "worker/bench_executor.hpp"
#include "worker/protocol.hpp"

namespace kiln {

class WorkerPool;

// A call's arguments, described for benchmarking: the caller's buffers are
// never written while tuning.
class BenchInputs {
 public:
  // `params` as the kernel takes them (params[i] points to argument i), on
  // `dev`; `stream` is the caller's, synchronised before its buffers are read.
  BenchInputs(const KernelSpec& spec, void* const* params, Device& dev, bool in_process, Stream stream = nullptr);
  // The same for a call decoded already.
  BenchInputs(const CallView& call, Device& dev, bool in_process, Stream stream = nullptr);

  BenchPlan plan(const LaunchDims& dims, const BenchSettings& settings) const;
  // The checking run's output of buffer argument `arg` (out or inout).
  std::span<const std::byte> result(size_t arg) const;
  const SharedArena& arena() const { return arena_; }
  const std::vector<BenchArg>& args() const { return args_; }
  uint64_t id() const { return id_; }
  // How the caller's data travels ("" when shared or in place; else why it was copied).
  const std::string& copied_because() const { return copied_because_; }

 private:
  void init(const KernelSpec& spec, void* const* params, const int64_t* slots, Device& dev, bool in_process,
            Stream stream);
  std::vector<BenchArg> args_;
  SharedArena arena_;
  uint64_t id_ = 0;
  std::string copied_because_;
};

// Runs benchmarks in a kiln-worker (default) or in this process.
class Benchmarker {
 public:
  // workers == nullptr: in-process, on `device`. `gpu`: the backend's
  // device is a GPU (its L2 is flushed between timed runs by default).
  Benchmarker(std::shared_ptr<WorkerPool> workers, Device* device, const Options& opts, bool gpu);
  ~Benchmarker();

  // Benchmarks one compiled config within `timeout_s`. `loaded` is used
  // in-process. `what` names kernel and config for errors. Throws
  // WorkerError when the worker crashed or hung, Error(Errc::launch) when
  // the kernel misbehaved (wrote to an input, could not launch), and what
  // loading throws.
  BenchResult run(const Binary& bin, LoadedKernel* loaded, const BenchInputs& in, const LaunchDims& dims,
                  const std::string& what, const BenchSettings& settings, double timeout_s);
  bool in_process() const { return !workers_; }
  BenchSettings settings() const;

 private:
  std::shared_ptr<WorkerPool> workers_;
  std::unique_ptr<BenchExecutor> local_;
  Options opts_;
  bool gpu_ = false;
};

}  // namespace kiln
