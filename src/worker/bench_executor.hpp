// The executor of a benchmark: runs one compiled config on a call's
// arguments as a BenchPlan describes them, in a kiln-worker process
// (default) or, with KILN_TUNE_IN_PROCESS=1, in the caller's:
//   1. restore in/inout buffers from the caller's data; poison outputs
//      (a NaN with a payload of kiln's for floats, 0x5A bytes for integers);
//   2. the checking run: its outputs are copied back and checksummed, the
//      elements still poisoned are counted, and a kernel that wrote to an
//      `in` buffer is an error;
//   3. warm-up runs, then timed runs (the device's timer) until the budget is
//      spent (at least min_reps); inout buffers are restored, and caches
//      flushed when asked, before every run, outside the timing.
// The caller's side (tune/benchmarker.hpp) describes the arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/ext/backend.hpp"
#include "worker/protocol.hpp"

namespace kiln {

inline uint64_t align256(uint64_t x) { return (x + 255) / 256 * 256; }

// A result from timed runs: keeps them, with their median (the mean of the
// middle two for an even count), minimum and maximum. No checksum.
BenchResult summarize(std::vector<double> ns);

// The bit pattern kiln poisons outputs of a dtype with, and the elements of
// `bytes` still holding it.
struct Poison {
  uint32_t pattern;
  int bytes;  // 1, 2 or 4: the pattern repeats to fill each element
};
Poison poison_of(DType t);
int64_t count_poisoned(DType t, std::span<const std::byte> bytes);

class BenchExecutor {
 public:
  explicit BenchExecutor(Device& dev) : dev_(dev) {}
  ~BenchExecutor();
  BenchExecutor(const BenchExecutor&) = delete;
  BenchExecutor& operator=(const BenchExecutor&) = delete;

  // Throws Error(Errc::launch) for a kernel that wrote to an input or whose
  // launch failed; device faults surface as the device reports them.
  BenchResult run(LoadedKernel& k, const BenchPlan& plan, std::byte* arena, Stream stream = nullptr);

 private:
  void release() noexcept;
  void prepare(const BenchPlan& plan, std::byte* arena, Stream s);
  void restore(const BenchPlan& plan, std::byte* arena, bool with_in, Stream s);
  Device& dev_;
  uint64_t id_ = 0;
  std::vector<void*> work_;                         // per argument: the buffer the kernel runs on
  std::vector<void*> pristine_;                     // shared inout arguments: a device copy to restore from
  std::vector<bool> owned_, imported_;
  std::vector<std::vector<std::byte>> snapshot_;    // in buffers read in place: their bytes at the start
  int64_t device_bytes_ = 0;
};

}  // namespace kiln
