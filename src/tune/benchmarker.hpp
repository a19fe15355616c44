// Benchmarker: runs one loaded kernel on arguments laid out in an arena
// (see BenchPlan) and times it. The same code runs in a kiln-worker process
// and, with KILN_TUNE_IN_PROCESS=1, in the caller's.
//
//   1. restore in/inout buffers from the caller's data; poison outputs
//      (NaN for floats, 0x5A bytes for integers);
//   2. the checking run: its outputs are kept (result regions) and checksummed,
//      and a kernel that wrote to an `in` buffer is an error;
//   3. warm-up runs, then timed runs until the budget is spent (at least
//      min_reps); inout buffers are restored before every run, untimed.
// With settings.check off, step 2 is skipped (for re-timing a checked config).
#pragma once

#include <cstddef>

#include "kiln/backend.hpp"
#include "worker/protocol.hpp"

namespace kiln {

// A result from timed runs: keeps them, with their median (the mean of the
// middle two for an even count), minimum and maximum. No checksum.
BenchResult summarize(std::vector<double> ns);

// Throws Error(Errc::launch) for a kernel that wrote to an input.
BenchResult run_bench(LoadedKernel& k, const BenchPlan& plan, std::byte* arena);

}  // namespace kiln

#include <memory>
#include <span>
#include <string>

#include "kiln/spec.hpp"
#include "worker/arena.hpp"

namespace kiln {

class WorkerPool;

// A call's arguments copied into shared memory, laid out for run_bench:
// the caller's buffers are never touched while tuning.
class BenchArena {
 public:
  // `params` as the kernel takes them (params[i] points to argument i).
  BenchArena(const KernelSpec& spec, void* const* params);

  BenchPlan plan(const Grid& grid, const BenchSettings& settings) const;
  // The checking run's output of buffer argument `arg` (out or inout).
  std::span<const std::byte> result(size_t arg) const;
  const SharedArena& arena() const { return arena_; }
  const std::vector<BenchArg>& args() const { return args_; }

 private:
  std::vector<BenchArg> args_;
  SharedArena arena_;
};

// Runs benchmarks in a kiln-worker (default) or in this process.
class Benchmarker {
 public:
  // workers == nullptr: in-process.
  Benchmarker(std::shared_ptr<WorkerPool> workers, const Options& opts);

  // Benchmarks one compiled config. `loaded` is used in-process (and loaded
  // there if null). `what` names kernel and config for errors. Throws
  // Error: Errc::worker when the kernel crashed or hung (twice), Errc::launch
  // when it misbehaved (wrote to an input), and what loading throws.
  BenchResult run(const Binary& bin, LoadedKernel* loaded, const BenchArena& arena, const Grid& grid,
                  const std::string& what, const BenchSettings& settings);
  BenchResult run(const Binary& bin, LoadedKernel* loaded, const BenchArena& arena, const Grid& grid,
                  const std::string& what) {
    return run(bin, loaded, arena, grid, what, settings());
  }
  bool in_process() const { return !workers_; }
  BenchSettings settings() const;

 private:
  std::shared_ptr<WorkerPool> workers_;
  Options opts_;
};

}  // namespace kiln
