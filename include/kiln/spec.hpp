// KernelSpec: a kernel's source plus what kiln needs to compile, tune and
// launch it, read from a TOML spec file (format: docs/spec.md).
//
// Thread-safety: load_spec and parse_spec may run concurrently; a KernelSpec
// is a value, safe to read from many threads once made.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/expr.hpp"
#include "kiln/hash.hpp"

namespace kiln {

// Element types. f16 is IEEE binary16, bf16 is bfloat16 (the top half of an
// f32); both are stored in 2 bytes and compared in f64 while tuning.
enum class DType : uint8_t { f32, f64, i32, i64, f16, bf16 };
inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16};
size_t dtype_size(DType t);
const char* dtype_name(DType t);   // "f32"
const char* dtype_ctype(DType t);  // the cpu backend's C++ type: "float", "_Float16", "kiln::bf16"
const char* dtype_cuda_type(DType t);  // the cuda backend's: "float", "__half", "__nv_bfloat16"
bool dtype_is_float(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

enum class Intent : uint8_t { in, out, inout };
const char* intent_name(Intent i);

struct ArgSpec {
  std::string name;
  DType dtype = DType::i64;
  bool pointer = false;
  Intent intent = Intent::in;  // pointers only
  Expr size;                   // element count; pointers only
  // An i64 scalar the kernel reads through kiln_cell(): a program may then pass
  // it as a cell, the address of a 32-bit word on the device that holds the
  // exact value, and size the launch for a larger value of its bucket
  // (docs/program.md, "Cells"). Its values are never negative.
  bool cell = false;
  std::string type_text() const;  // "f32*" or "i64"
};

// A TMA tensor map (cuda, the spec's `tensor_maps`): a 2-D row-major view of a
// buffer argument that the launch encodes from the buffer's address and passes
// after the arguments, as a 128-byte `const __grid_constant__` parameter. The
// expressions are over the integer scalars, params and constants; sizes in elements.
struct TensorMapSpec {
  std::string of;           // the buffer argument
  Expr rows, cols, pitch;   // the view; pitch: elements from one row to the next (cols when not given)
  Expr box_rows, box_cols;  // the tile one copy moves
  int swizzle = 0;          // the shared-memory swizzle in bytes: 0, 32, 64 or 128
};

struct Param {
  std::string name;
  std::vector<int64_t> values;
};

// One point of a config space: a value per parameter, in the space's order;
// or a library choice (a call into a vendor library with the kernel's
// arguments, such as cuBLAS), which has no params.
struct Config {
  std::vector<std::pair<std::string, int64_t>> values;
  std::string library;  // the library choice's name; empty for a point of the space

  std::optional<int64_t> get(std::string_view name) const;
  // "BM=32 BN=64"; "-" when there are no params; "library:cublas" for a library choice
  std::string str() const;
  bool operator==(const Config&) const = default;
};

class ConfigSpace {
 public:
  std::vector<Param> params;

  // The product of the value counts (1 if no params), saturating at SIZE_MAX
  // (a spec larger than kMaxConfigs is refused when it is read).
  size_t size() const;
  static constexpr size_t kMaxConfigs = 100000;
  Config at(size_t index) const;       // mixed radix, the last param varies fastest
  std::vector<Config> all() const;
  std::optional<size_t> index_of(const Config& c) const;
  const Param* find(std::string_view name) const;
  Hash128 hash() const;                // changes when any name or value changes
};

enum class HintPoints : uint8_t { diagonal, grid };
enum class SearchKind : uint8_t { exhaustive, coordesc, budgeted };

// The bucket of a key value kept by powers of two: the least power of two at or
// above it (values up to 2, and past 2^62, as they are).
inline int64_t pow2_bucket(int64_t v) {
  if (v <= 2 || v > (int64_t{1} << 62)) return v;
  return int64_t{1} << (64 - __builtin_clzll(static_cast<uint64_t>(v - 1)));
}

struct TuningSpec {
  // Integer scalar args whose values select a tuning record. When the spec
  // gives no [tuning] key, every integer scalar that a size, the grid, the
  // launch shape or a constraint uses (key_given is then false).
  std::vector<std::string> key;
  bool key_given = false;
  // Per key name, in key order; empty when the spec gives no hints.
  std::vector<std::pair<std::string, std::vector<int64_t>>> hints;
  HintPoints hint_points = HintPoints::diagonal;
  SearchKind search = SearchKind::exhaustive;
  bool search_given = false;               // the spec names its search (else large spaces search quickly)
  std::optional<Config> default_config;    // where coordinate descent starts
  std::optional<Config> reference_config;  // whose outputs others must match
  double rtol = -1, atol = -1;             // negative: the dtype's default
  // The length of the sums each output element is (a GEMM's K), over the
  // integer scalars: with it, the default tolerances of f16 and bf16 outputs
  // follow it (docs/tuning.md).
  std::optional<Expr> reduction;
  // The params a thread's register count follows (cuda): configs that agree
  // on them are siblings, and once one is compiled, a sibling whose block
  // would need more registers than the device has is pruned before compiling.
  std::vector<std::string> registers_by;
  // Key names whose records are kept by bucket ([tuning] buckets = { S = "pow2" }):
  // the value's next power of two, so that a length growing by one a call (a KV
  // cache's) is tuned once a doubling, not once a value. The call's own value
  // still sizes its launch, and a record's choice is checked against it.
  std::vector<std::string> pow2;
  // The value of key name `name` in a tuning key: bucketed where it is.
  int64_t key_value(const std::string& name, int64_t v) const;

  // The hint points: diagonal takes the i-th hint of every dimension,
  // grid takes every combination. Each point is in key order.
  std::vector<std::vector<int64_t>> hint_point_list() const;
};

// What is derived from a spec and kept with it (Tuner::why_not's compiled checks):
// made on first use, under its own lock. A copy or an assignment of the spec starts
// empty; what is kept notes what it was derived from, and a spec changed in place
// since has it derived afresh.
class SpecMemo {
 public:
  SpecMemo() = default;
  SpecMemo(const SpecMemo&) noexcept {}
  SpecMemo& operator=(const SpecMemo&) noexcept {
    std::lock_guard<std::mutex> g(m_);
    p_.reset();
    return *this;
  }
  // The memo's content, made by `make` the first time.
  std::shared_ptr<void> get(const std::function<std::shared_ptr<void>()>& make) const {
    std::lock_guard<std::mutex> g(m_);
    if (!p_) p_ = make();
    return p_;
  }

 private:
  mutable std::mutex m_;
  mutable std::shared_ptr<void> p_;
};

struct KernelSpec {
  std::string name;
  std::string backend;  // "cpu" or "cuda"
  std::string entry;
  std::filesystem::path spec_path;    // as given (a family's file, for a member)
  std::string member;                 // a family's member (docs/families.md), or empty
  std::filesystem::path source_path;  // resolved against the spec's folder
  std::string source_text;
  std::vector<Expr> grid;  // 1 to 3
  std::vector<Expr> block; // cuda: threads per block, 1 to 3 (empty: 1); cpu: empty
  std::optional<Expr> shared;  // cuda: dynamic shared memory bytes per block
  // cuda: bytes of device memory kiln keeps for the kernel (a buffer for each thread and
  // stream that launches it, zeroed when made, kept while the kernel is loaded), passed to the
  // entry after the tensor maps; a kernel that keeps flags there sets them back before it
  // ends. 0 bytes: a null pointer (docs/spec.md, "Workspace").
  std::optional<Expr> workspace;
  // Buffers zeroed on the launch's stream before each launch (a kernel that
  // accumulates into its output with atomics, as split-K does), when
  // zero_when (over params and scalars) is not 0; always, without it.
  std::vector<std::string> zero;
  std::optional<Expr> zero_when;
  std::vector<ArgSpec> args;
  ConfigSpace space;
  std::vector<Expr> constraints;  // a config is pruned when one evaluates to 0
  // cuda: the kernel calls kiln_wait_prior() in every thread before it touches memory an
  // earlier launch writes or reads (and before it returns), so it may be launched to
  // overlap the kernel before it (programmatic dependent launch; docs/program.md).
  bool pdl = false;
  // cuda, with pdl: input buffer arguments the kernel reads before its kiln_wait_prior()
  // (the decode GEMM: its weights). Such a launch overlaps the kernel before it only where
  // nothing that may still run writes them: within a program call, where they are inputs
  // no step writes (docs/program.md, "Reads before the wait"); launched otherwise, the
  // kernel waits for the work before it whole.
  std::vector<std::string> early_reads;
  std::vector<TensorMapSpec> tensor_maps;  // cuda: passed after the arguments, in order (at most 4)
  std::vector<std::filesystem::path> include_dirs;  // resolved
  std::vector<std::string> cflags;
  // Library choices tuned beside the templates (calls into a vendor library
  // that compute the same thing with the same arguments): kiln/library.hpp.
  std::vector<std::string> libraries;
  TuningSpec tuning;
  // Named values a kernel family gives its member's expressions (docs/families.md):
  // WEIGHTS, B_NT, and align_<operand> = 256 for an operand other members have and this one lacks.
  std::vector<std::pair<std::string, int64_t>> constants;

  int arg_index(std::string_view name) const;  // -1 when absent
  std::optional<int64_t> constant(std::string_view name) const;
  // What names this spec on a command line: spec_path, and ":member" for a family's member.
  std::string path_text() const;
  // Integer scalars that decide whether a config can run, or with what launch
  // shape (grid, block, shared memory and constraints use them), but are not
  // in the tuning key: a call is checked against them (see Kernel).
  std::vector<std::string> unkeyed_launch_scalars() const;

  SpecMemo memo;  // derived checks, kept (see SpecMemo)
};

// Reads source files named by a spec: the file's contents, or nullopt if it
// cannot be read. load_spec uses the file system; tests and fuzzers pass their own.
using SourceReader = std::function<std::optional<std::string>(const std::filesystem::path&)>;

// The device symbol of grid, block, shared and constraint expressions: the
// multiprocessors of the device the kernel runs on (SMs on cuda, the cores
// that run a grid on cpu), read from LaunchLimits when the expression is
// compiled for a device. Argument sizes may not use it.
inline constexpr std::string_view kSmCountSymbol = "SM_COUNT";

// Throws Error(Errc::spec) naming the file, line, column and key.
// `spec_file` may name a member of a kernel family: "gemm.toml:bf16_nt"
// (docs/families.md).
KernelSpec load_spec(const std::filesystem::path& spec_file);
KernelSpec parse_spec(std::string_view toml_text, const std::filesystem::path& spec_path,
                      const SourceReader& read_source);
// A member of the kernel family in `toml_text` (kind = "family"); `member`
// empty reads a plain spec, as parse_spec does.
KernelSpec parse_spec(std::string_view toml_text, const std::filesystem::path& spec_path,
                      const SourceReader& read_source, std::string_view member);
// The members of the kernel family in `file` (kind = "family"), in the order
// it lists them; empty for any other spec. Throws Error(Errc::spec) as load_spec.
std::vector<std::string> family_members(const std::filesystem::path& file);
// A spec path and the family member it names: "k/gemm.toml:bf16_nt" is
// {"k/gemm.toml", "bf16_nt"}; a path with no member is {path, ""}. The part
// after the last ':' is a member only when it is an identifier and the whole
// path is not an existing file.
std::pair<std::filesystem::path, std::string> split_member(const std::filesystem::path& spec_path);

bool is_identifier(std::string_view s);
// A C++ keyword or alternative token (and, or, not, ...): never a name in kiln emit's C++.
bool is_cpp_keyword(std::string_view s);

// Expressions may use align_<buffer>: the largest power of two, at most 256,
// that divides the buffer's address in the call (256 for a null pointer).
// "align_A" → "A", or "" when `sym` is no alignment symbol.
std::string_view align_target(std::string_view sym);
// The -I (-isystem, -iquote, -idirafter) folders among compiler flags,
// relative ones resolved against the working folder as a compiler would.
std::vector<std::filesystem::path> include_dirs_in_flags(const std::vector<std::string>& flags);
// `s` as a C string literal's contents: quotes, backslashes and control
// characters escaped (for #line directives naming a user's path).
std::string c_escape(std::string_view s);

// ---- multi-kernel specs (kind = "multi"; docs/spec.md) ----

// One launch of a variant: a kernel spec and how the multi-kernel's
// arguments (and scratch buffers) map onto its own, one entry per kernel
// argument: a name of ours or of a scratch buffer (a name may repeat), or,
// for an integer scalar, an expression over our integer scalars
// ("cdiv(K, 8) * 8").
struct VariantStep {
  KernelSpec kernel;
  std::vector<std::string> args;
};

inline constexpr size_t kMaxVariantSteps = 8;

// A variant: one launch, or several run in order (a multi-launch variant,
// such as an unfused form or a GEMM on padded copies), timed as a whole.
struct VariantSpec {
  std::vector<VariantStep> steps;  // at least one
  // What names it in messages: the kernel's name, or "a + b + c".
  std::string name() const;
};

// A buffer kiln allocates for variants that need one (per calling thread).
struct ScratchSpec {
  std::string name;
  DType dtype = DType::f32;
  Expr size;  // element count, over the multi-kernel's integer scalars
};

struct MultiKernelSpec {
  std::string name;
  std::string backend;
  std::filesystem::path spec_path;
  std::vector<ArgSpec> args;
  std::vector<ScratchSpec> scratch;
  std::vector<std::string> key;  // tuning key: integer scalars of args
  std::vector<std::string> pow2;  // key names kept by bucket (TuningSpec::pow2)
  std::vector<VariantSpec> variants;
};

// Throws Error(Errc::spec) naming the file, line, column and key; a variant's
// own spec errors name that file.
MultiKernelSpec load_multi_spec(const std::filesystem::path& file);
MultiKernelSpec parse_multi_spec(std::string_view toml_text, const std::filesystem::path& spec_path,
                                 const std::function<KernelSpec(const std::filesystem::path&)>& load_variant);
// Whether a spec file says kind = "multi".
bool is_multi_spec(const std::filesystem::path& file);

}  // namespace kiln
