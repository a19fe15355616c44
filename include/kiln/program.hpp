// Program: runs a ProgramSpec (kiln/program_spec.hpp) through kiln's
// handles (docs/program.md).
//
// Loading one makes every kernel's handle at once, so their compiles start
// in the background (the first step's first). A call binds the symbols from
// the inputs' shapes, checks the guards (on the first call of a shape),
// plans the intermediates into one arena by liveness (kept per shape), and
// launches the steps, each through its handle: a step's first call of a
// shape tunes it on the real intermediate tensors (or takes the record's
// choice; in serving mode it never tunes), later calls only compute grids
// and launch. On cuda, once every step of a shape is tuned, the shape's
// launches are captured into a graph and replayed for later calls with the
// same buffers (KILN_PROGRAM_GRAPHS=0 turns that off). A scalar the spec buckets
// ([buckets] S = "pow2") shares a shape, its plan and its graphs across its bucket:
// where every kernel that takes it reads it from a cell (a word on the device), the
// launches are sized for the bucket's largest value and a call with another value
// sets that one word; else a call sets the graph's launches to it in place.
//
// Thread-safety: a Program may be called from one thread at a time (it
// reuses one arena and its argument arrays); make one per thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/memory_plan.hpp"
#include "kiln/options.hpp"
#include "kiln/program_spec.hpp"

namespace kiln {

class Runtime;

// A buffer of a call: where it is and its shape.
struct Tensor {
  void* data = nullptr;
  std::vector<int64_t> shape;
};

struct ProgramOptions {
  bool graphs = true;       // capture and replay each tuned shape's launches (cuda; off: KILN_PROGRAM_GRAPHS=0)
  int graph_capacity = 8;   // graphs kept (least recently used dropped)
  int plan_capacity = 64;   // shapes whose memory plans are kept
  // Each step runs one config of its kernel as it is, untuned: the spec's
  // default where it can run the call, else the first config that can. How
  // a reference program runs (its kernels must be kernel specs).
  bool plain = false;
  // Where a bucketed scalar's exact value is kept in a cell and the launches are
  // sized for its bucket (docs/program.md, "Cells"); unset: Options::program_cells.
  std::optional<ProgramCells> cells;
};

// What Program::check found: each output the reference computes, compared
// with it element by element by tuning's tolerance rules.
struct ProgramCheck {
  struct Output {
    std::string name;
    DType dtype = DType::f32;
    size_t compared = 0, bad = 0;  // elements compared; outside the tolerance (NaN where the reference is not: bad)
    double max_error = 0;          // the largest |got - reference| among the bad ones (0: none)
    std::string worst;             // the worst element: "y[37, 1022] = 0.5 where the reference has 0.2514"
    double rtol = 0, atol = 0;     // the tolerance applied
  };
  std::string program, reference;
  std::vector<Output> outputs;
  std::string rows;  // "all 37 rows" or "64 of 2000 rows of T (0, 31, ..., 1999)"
  bool ok() const;
  std::string str() const;  // a line per output, then the verdict
};

class Program {
 public:
  // Makes every kernel's handle (their compiles start now). `rt` must outlive it.
  Program(Runtime& rt, ProgramSpec spec, ProgramOptions opts = {});
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // Runs the program: `inputs` and `outputs` in the spec's order. Throws
  // Error(Errc::usage) naming the input, dimension or guard that does not
  // hold. Launches are queued on `stream` (cuda).
  // `scalars`: the spec's scalars' values for this call, in its order.
  void run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, Stream stream = nullptr,
           const std::vector<int64_t>& scalars = {});
  // Binds the symbols from the inputs' shapes (and the scalars) and checks the guards.
  std::map<std::string, int64_t> bind(const std::vector<Tensor>& inputs, const std::vector<int64_t>& scalars = {}) const;
  // The memory plan of the intermediates for these symbol values.
  MemoryPlan memory(const std::map<std::string, int64_t>& symbols) const;
  // Each step's device time (ns) for these buffers: the steps launched one
  // at a time, synchronised, `reps` times; the median. Tunes what is untuned first.
  std::vector<double> time_steps(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, int reps,
                                 const std::vector<int64_t>& scalars = {});
  // Host time (ns) per call of the steps' handles alone, launched back to
  // back `calls` times with these buffers' symbols bound and planned once:
  // what a call costs beyond the program's own binding and lookups.
  double host_ns_handles_only(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, int calls,
                              const std::vector<int64_t>& scalars = {});
  // What each launch step runs for these buffers: "kernel: config (source)"; a step of a program
  // run by this one whose kernel shares a handle is "its own name (handle kernel): ..."
  std::vector<std::string> choices(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                                   const std::vector<int64_t>& scalars = {});
  // Runs the program once on these buffers and checks its outputs against
  // its reference (the spec's [check] reference, run plain on the inputs as
  // they were before the call, converted to the reference's dtypes; rows of
  // [check] sample compared on at most max_rows of them). Throws
  // Error(Errc::usage) where the program names no reference, or the
  // reference's inputs and outputs do not match the program's. State inputs
  // (updated in place) are compared too, as the call left them.
  ProgramCheck check(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, Stream stream = nullptr,
                     const std::vector<int64_t>& scalars = {});
  // Waits until the compiles the load started are done.
  void prepare();
  const ProgramSpec& spec() const;

  struct Stats {
    uint64_t calls = 0;
    uint64_t graph_captures = 0, graph_replays = 0;
    uint64_t graph_updates = 0;      // graphs set in place to a bucketed scalar's new value (no capture)
    double graph_update_ns = 0;      // the host time those updates took, in all
    uint64_t cell_calls = 0;         // calls launched sized for their buckets, the exact values in cells
    size_t plans = 0;                // shapes planned
    int64_t arena_bytes = 0;         // the arena as allocated (the largest plan's)
  };
  Stats stats() const;
  // Why the program keeps exact launches rather than cells (docs/program.md, "Cells"): "" where
  // it uses them, else the reason (cells off, no graphs, or a kernel that reads no cell).
  std::string cells_refusal() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
