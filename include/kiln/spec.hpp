// KernelSpec: a kernel's source plus what kiln needs to compile, tune and
// launch it, read from a TOML spec file (format: docs/spec.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/expr.hpp"
#include "kiln/hash.hpp"

namespace kiln {

enum class DType : uint8_t { f32, f64, i32, i64 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);   // "f32"
const char* dtype_ctype(DType t);  // "float"
bool dtype_is_float(DType t);

enum class Intent : uint8_t { in, out, inout };
const char* intent_name(Intent i);

struct ArgSpec {
  std::string name;
  DType dtype = DType::i64;
  bool pointer = false;
  Intent intent = Intent::in;  // pointers only
  Expr size;                   // element count; pointers only
  std::string type_text() const;  // "f32*" or "i64"
};

struct Param {
  std::string name;
  std::vector<int64_t> values;
};

// One point of a config space: a value per parameter, in the space's order.
struct Config {
  std::vector<std::pair<std::string, int64_t>> values;

  std::optional<int64_t> get(std::string_view name) const;
  std::string str() const;  // "BM=32 BN=64", or "-" when there are no params
  bool operator==(const Config&) const = default;
};

class ConfigSpace {
 public:
  std::vector<Param> params;

  size_t size() const;                 // the product of the value counts (1 if no params)
  Config at(size_t index) const;       // mixed radix, the last param varies fastest
  std::vector<Config> all() const;
  std::optional<size_t> index_of(const Config& c) const;
  const Param* find(std::string_view name) const;
  Hash128 hash() const;                // changes when any name or value changes
};

enum class HintPoints : uint8_t { diagonal, grid };
enum class SearchKind : uint8_t { exhaustive, coordesc };

struct TuningSpec {
  std::vector<std::string> key;  // integer scalar args whose values select a tuning record
  // Per key name, in key order; empty when the spec gives no hints.
  std::vector<std::pair<std::string, std::vector<int64_t>>> hints;
  HintPoints hint_points = HintPoints::diagonal;
  SearchKind search = SearchKind::exhaustive;
  std::optional<Config> default_config;    // where coordinate descent starts
  std::optional<Config> reference_config;  // whose outputs others must match
  double rtol = -1, atol = -1;             // negative: the dtype's default

  // The hint points: diagonal takes the i-th hint of every dimension,
  // grid takes every combination. Each point is in key order.
  std::vector<std::vector<int64_t>> hint_point_list() const;
};

struct KernelSpec {
  std::string name;
  std::string backend;  // "cpu" or "cuda"
  std::string entry;
  std::filesystem::path spec_path;    // as given
  std::filesystem::path source_path;  // resolved against the spec's folder
  std::string source_text;
  std::vector<Expr> grid;  // 1 to 3
  std::vector<ArgSpec> args;
  ConfigSpace space;
  std::vector<Expr> constraints;  // a config is pruned when one evaluates to 0
  std::vector<std::filesystem::path> include_dirs;  // resolved
  std::vector<std::string> cflags;
  TuningSpec tuning;

  int arg_index(std::string_view name) const;  // -1 when absent
};

// Reads source files named by a spec: the file's contents, or nullopt if it
// cannot be read. load_spec uses the file system; tests and fuzzers pass their own.
using SourceReader = std::function<std::optional<std::string>(const std::filesystem::path&)>;

// Throws Error(Errc::spec) naming the file, line, column and key.
KernelSpec load_spec(const std::filesystem::path& spec_file);
KernelSpec parse_spec(std::string_view toml_text, const std::filesystem::path& spec_path,
                      const SourceReader& read_source);

bool is_identifier(std::string_view s);

// ---- multi-kernel specs (kind = "multi"; docs/spec.md) ----

// A variant: a kernel spec and how the multi-kernel's arguments (and scratch
// buffers) map onto its own, one name per variant argument (a name may repeat).
struct VariantSpec {
  KernelSpec kernel;
  std::vector<std::string> args;
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
