// Program specs: a wrapper of buffers and kernel launches whose sizes are
// symbols, as data (docs/program.md); kiln/program.hpp runs them.
//
// A ProgramSpec is read from a file (kind = "program", TOML, versioned) or
// made with ProgramBuilder: integer symbols (bound from the input shapes at
// call time), scalars (integers the caller gives at each call) and constants; guards over them; input, output and
// intermediate buffers with dtypes and symbolic shapes; the kernels it
// launches (kernel specs, multi-kernels or size-hint kernels); and steps,
// each a launch of one of them with argument expressions. lower() makes the
// allocations and frees explicit (each intermediate lives from the step
// before its first use to the step after its last).
//
// A Program loads one: every kernel's handle is made at once, so their
// compiles start in the background (the first step's first). A call binds
// the symbols, checks the guards (the first call of a shape), plans the
// intermediates into one arena by liveness (kept per shape), and launches
// the steps, each through its handle: a step's first call of a shape tunes
// it on the real intermediate tensors (or takes the record's choice), later
// calls only compute grids and launch. On cuda, once every step of a shape
// is tuned, the shape's launches are captured into a graph and replayed.
//
// Thread-safety: ProgramSpec is a value; a Program may be called from one
// thread at a time (it reuses one arena and its argument arrays).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/expr.hpp"
#include "kiln/spec.hpp"

namespace kiln {

struct ProgramTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<Expr> shape;  // over the symbols and constants
  // An input the program updates in place (a KV cache): steps may write it;
  // the check compares it after the call with the reference's.
  bool state = false;
  // How kiln run fills an input: uniform in [-1, 1) times `scale` (a layer's
  // weights, 0.02), or every element `constant` (a norm's weights, 1).
  double scale = 1;
  std::optional<double> constant;
};

// One argument of a launch: a buffer, an integer expression over the
// symbols and constants, or a number (for a float scalar).
struct ProgramArg {
  enum class Kind : uint8_t { buffer, integer, real };
  Kind kind = Kind::integer;
  std::string text;  // as written; a buffer view's: the buffer's name, its index apart
  Expr value;        // integer
  double real = 0;
  // A buffer view, written `name[index]`: row `index` of the buffer, the
  // buffer less its first dimension (one layer's weights of a stack, one
  // layer's KV cache); the index over the symbols and constants.
  std::optional<Expr> index;
  std::string written() const { return index ? text + "[" + index->str() + "]" : text; }
};

struct ProgramStep {
  enum class Kind : uint8_t { launch, alloc, free, ret };
  Kind kind = Kind::launch;
  std::string kernel;              // launch: the kernel's name in the program
  // launch, a step of a program this one runs whose kernel there became a handle of the same
  // spec that this program already had: its own kernel's name there, prefixed by that
  // program's (`kernel` names the handle it shares); empty otherwise
  std::string label;
  std::vector<ProgramArg> args;    // launch
  std::string buffer;              // alloc, free
  int line = 0;                    // where it was written (0: made by a builder or by lower())
};

struct ProgramKernel {
  enum class Kind : uint8_t { kernel, multi, size_hint };
  std::string name;
  std::filesystem::path spec;  // resolved against the program's folder
  Kind kind = Kind::kernel;
  KernelSpec kernel;           // kernel, size_hint: the spec as loaded
  MultiKernelSpec multi;       // multi
  const std::vector<ArgSpec>& args() const { return kind == Kind::multi ? multi.args : kernel.args; }
  const std::string& backend() const { return kind == Kind::multi ? multi.backend : kernel.backend; }
};

// How a program's result is checked (kiln run --check, Program::check):
// against its reference, a second program that computes the same outputs
// from the same inputs (matched by name) with plain kernels, typically in
// double on the cpu backend; a wiring mistake in the program is then not
// repeated by the check. docs/program.md.
struct ProgramCheckSpec {
  std::filesystem::path reference;  // resolved against the program's folder; empty: none
  // A symbol whose rows may be sampled where it is large: the inputs and
  // outputs whose first dimension is this symbol alone are compared on at
  // most `max_rows` of their rows (rows are independent, as tokens are).
  std::string sample;
  int64_t max_rows = 64;
  // The length of the longest sum an output is made of, over the symbols and
  // constants: f16 and bf16 outputs get tuning's tolerances for sums of that
  // length (docs/tuning.md). rtol and atol override, as in a spec's [tuning].
  std::optional<Expr> reduction;
  double rtol = -1, atol = -1;
};

struct ProgramSpec {
  // Bump when the file format changes meaning; a file states its version.
  static constexpr int kVersion = 1;
  std::string name;
  std::string backend;
  std::filesystem::path path;  // the file it was read from (empty: built)
  std::vector<std::pair<std::string, int64_t>> constants;
  std::vector<std::string> symbols;  // bound from the inputs' shapes
  // Integers the caller gives at each call, in this order (a KV cache's
  // length S); expressions use them as they use symbols.
  std::vector<std::string> scalars;
  // Scalars whose calls share a plan and a graph by bucket ([buckets] S = "pow2":
  // the next power of two at or above the value): a decode loop's S, growing by
  // one a call, gets one plan and one graph a doubling, the graph's launches set
  // to each call's S in place (docs/program.md).
  std::vector<std::string> pow2;
  std::vector<Expr> guards;
  // Per guard, where one came from when it is not the program's own (a step's program's
  // guard, or the shape a bound tensor must have); shorter than guards where the rest are own.
  std::vector<std::string> guard_from;
  std::vector<ProgramTensor> inputs, outputs, buffers;  // buffers: the intermediates
  std::vector<ProgramKernel> kernels;
  std::vector<ProgramStep> steps;  // launches (and returns) as written
  ProgramCheckSpec check;

  const ProgramTensor* tensor(std::string_view name) const;
  // The symbols, then the scalars: every name a call gives a value.
  std::vector<std::string> all_symbols() const;
  const ProgramKernel* kernel(std::string_view name) const;
  // A tensor's dimensions for these symbol values (Error(Errc::usage) for a
  // symbol without a value).
  std::vector<int64_t> dims(const ProgramTensor& t, const std::map<std::string, int64_t>& symbols) const;
  // Its element count; Error(Errc::usage) naming it for a negative
  // dimension or a count past 64 bits.
  int64_t elements(const ProgramTensor& t, const std::map<std::string, int64_t>& symbols) const;
  // The steps with the allocations and frees made explicit, a return last.
  std::vector<ProgramStep> lower() const;
  // The program as text (its steps lowered), for `kiln run --show`.
  std::string str() const;
};

// Reads a program file; throws Error(Errc::spec) naming the file, line,
// column and key, or the step, for anything it cannot use: a schema it does
// not know, an unknown symbol, a step naming a kernel it lacks, arguments
// that do not match the kernel's.
ProgramSpec load_program(const std::filesystem::path& file);
ProgramSpec parse_program(std::string_view toml_text, const std::filesystem::path& path);
bool is_program_file(const std::filesystem::path& file);

// The same object from C++. Each call returns the builder; build() checks
// it as load_program does (Error(Errc::spec) for what is wrong).
class ProgramBuilder {
 public:
  ProgramBuilder(std::string name, std::string backend);
  ProgramBuilder& constant(const std::string& name, int64_t value);
  ProgramBuilder& symbol(const std::string& name);
  ProgramBuilder& scalar(const std::string& name);
  // The last input added is state (updated in place by the program).
  ProgramBuilder& state();
  ProgramBuilder& guard(const std::string& text);
  ProgramBuilder& input(const std::string& name, DType dtype, std::vector<std::string> shape);
  ProgramBuilder& output(const std::string& name, DType dtype, std::vector<std::string> shape);
  ProgramBuilder& buffer(const std::string& name, DType dtype, std::vector<std::string> shape);
  // A kernel spec, multi-kernel spec (kind "multi") or a size-hint kernel ("size_hint").
  ProgramBuilder& kernel(const std::string& name, const std::filesystem::path& spec, const std::string& kind = "");
  ProgramBuilder& launch(const std::string& kernel, std::vector<std::string> args);
  ProgramSpec build() const;

 private:
  Expr expr(const std::string& text, const std::string& what) const;
  ProgramBuilder& tensor(std::vector<ProgramTensor>& to, const char* group, const std::string& name, DType dtype,
                         const std::vector<std::string>& shape);
  ProgramSpec p_;
};

}  // namespace kiln
