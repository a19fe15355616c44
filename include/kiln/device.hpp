// What a program touches of a device: its memory, its streams, its clock.
// Buffers are device addresses (host memory on cpu). An application gets
// the device of a backend from Runtime::device(); backends implement it
// (kiln/ext/backend.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kiln {

// A backend's queue of work: a CUstream on cuda (nullptr: the calling
// thread's per-thread default stream); ignored on cpu, where a launch
// returns when the grid is done.
using Stream = void*;

// The largest launch a device takes; LaunchPlan checks calls against it.
struct LaunchLimits {
  int64_t grid[3] = {INT64_MAX, INT64_MAX, INT64_MAX};
  int64_t grid_total = INT64_MAX;
  int64_t block[3] = {1, 1, 1};
  int64_t block_threads = 1;
  int64_t shared = 0;  // dynamic + static shared memory per block, opted in
  int64_t multiprocessors = 0;  // SMs, or the cores that run a grid: SM_COUNT in a spec's expressions
};

// Facts about a device, for limits, keys and `kiln backends`.
struct DeviceInfo {
  std::string name;         // "NVIDIA H100 80GB HBM3", or the CPU model
  std::string arch;         // "sm_90"; "x86_64" on cpu
  int ordinal = 0;
  int multiprocessors = 0;  // SMs, or cores that run a grid
  int64_t l2_bytes = 0;     // last-level cache
  int64_t memory_bytes = 0;
  std::string driver;       // driver and compiler versions, for reports
  LaunchLimits limits;
  int64_t registers_per_block = 0;  // cuda
};

// Times work queued on a stream (a host clock on cpu, CUDA events on cuda).
class Timer {
 public:
  virtual ~Timer() = default;
  virtual void start(Stream s) = 0;
  virtual void stop(Stream s) = 0;
  // Waits for the stop and returns the time between start and stop.
  virtual double elapsed_ns() = 0;
};

// Work captured once and replayed (a CUDA graph): launch() queues all of it
// on a stream with one call.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void launch(Stream s) = 0;
  // Runs `work` again as the graph's launches with new arguments, launching
  // nothing: each kernel launch it makes is matched, in order, with the graph's
  // nodes, and where it differs from what the node holds, the node's grid,
  // block, shared memory and arguments are set in place; nodes the work keeps
  // (Device::graph_keep: a piece that did not change, a library's call or a
  // fill among them) are passed over. False where they do not match (another
  // kernel or count of them, a fill or a library's call launched rather than
  // kept): the graph is then partly updated and must be captured anew.
  virtual bool update(const std::function<void(Stream)>& work) {
    (void)work;
    return false;
  }
  // Sets the value the k-th Device::write_word of the captured work writes, in
  // place; false where the graph cannot (it is then as it was).
  virtual bool set_word(size_t k, int32_t value) {
    (void)k;
    (void)value;
    return false;
  }
};

// What touches a device's memory and time. Buffers are device addresses
// (host memory on cpu). Copies and fills are queued on the stream; to_host
// returns when the bytes are there. Throws Error(Errc::launch) for a device
// fault, Error(Errc::io) when memory runs out.
class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() = 0;
  virtual bool host_addressable() const = 0;  // whether buffers are host memory
  virtual void* alloc(size_t bytes) = 0;       // zeroed, aligned to 256 bytes
  virtual void free(void* p) noexcept = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes, Stream s) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes, Stream s) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, Stream s) = 0;
  // Writes `count` copies of a 1-, 2- or 4-byte `pattern`.
  virtual void fill(void* dst, uint32_t pattern, int pattern_bytes, size_t count, Stream s) = 0;
  virtual void sync(Stream s) = 0;
  // Writes a 32-bit word at `dst` (4-byte aligned) in the stream's order: a cell a
  // program's kernels read (docs/program.md, "Cells"). Captured into a graph, it is
  // a node of its own whose value Graph::set_word changes.
  virtual void write_word(void* dst, int32_t value, Stream s) { fill(dst, static_cast<uint32_t>(value), 4, 1, s); }
  virtual std::unique_ptr<Timer> timer() = 0;
  // Evicts caches between timed runs (writes a buffer larger than the last
  // level); returns the bytes it holds for that.
  virtual size_t flush_caches(Stream s) = 0;
  // Holds stream s: what is enqueued on it next waits until release_stream(hold) with the
  // hold this returns (or until `limit_ms` has passed), so that timed runs enqueued meanwhile
  // run back to back and no delay of the host between them is timed (KILN_BENCH_HOLD). 0,
  // with nothing enqueued, where the device cannot. Nothing may wait for the stream until
  // it is released. Holds of several threads are independent.
  virtual uint64_t hold_stream(Stream s, double limit_ms) {
    (void)s, (void)limit_ms;
    return 0;
  }
  virtual void release_stream(uint64_t hold) { (void)hold; }
  // Sharing a caller's buffer with a worker process without copying it:
  // an opaque handle (with the buffer's offset inside what it names), or ""
  // with `why` set when the memory cannot be shared.
  virtual std::string export_buffer(const void* p, std::string* why) = 0;
  virtual void* import_buffer(const std::string& handle) = 0;
  virtual void close_import(void* p) noexcept = 0;
  // Makes the device current for the calling thread (cuda: its context).
  virtual void bind() = 0;
  // Times `launch` (which queues one run on the stream it is given) by
  // capturing `count` of them in a graph and replaying it, so launch gaps are
  // not counted: ns per run, or -1 where the device has no graphs (cpu).
  virtual double replay_ns(const std::function<void(Stream)>& launch, int count) {
    static_cast<void>(launch);
    static_cast<void>(count);
    return -1;
  }
  // Captures what `work` queues on the stream it is given (nothing runs
  // then) into a graph to replay on any stream; nullptr where the device has
  // no graphs (cpu). Throws Error(Errc::launch) when the capture fails.
  virtual std::unique_ptr<Graph> capture(const std::function<void(Stream)>& work) {
    static_cast<void>(work);
    return nullptr;
  }
  // Within capture's or Graph::update's work on stream `s`: the graph's nodes so
  // far (every node, a library's and fills included; while updating, the nodes
  // already matched). Work of one piece after another measures each piece's
  // nodes by it. 0 elsewhere.
  virtual size_t graph_nodes(Stream s) {
    static_cast<void>(s);
    return 0;
  }
  // Within Graph::update's work on stream `s`: the next `n` nodes keep their
  // launches (a piece of the work that did not change, not run again); false
  // where they cannot be kept, and the update then fails.
  virtual bool graph_keep(Stream s, size_t n) {
    static_cast<void>(s);
    static_cast<void>(n);
    return false;
  }
  // Why the device can no longer be used (a kernel faulted and took its
  // context down), or "".
  virtual std::string fault() const { return ""; }
};

}  // namespace kiln
