// The stages of one kernel variant, each a value: CompileRequest (source +
// parameter defines + options) → Binary (bytes + metadata) → LoadedKernel
// (launchable). A Backend turns one stage into the next; backends know their
// compiler and loader, nothing above them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/options.hpp"
#include "kiln/spec.hpp"

namespace kiln {

struct ArgSig {
  std::string name;
  DType dtype = DType::i64;
  bool pointer = false;
};

struct CompileRequest {
  std::string backend;
  std::string kernel;       // for messages
  std::string config_text;  // for messages: "BM=32 BN=32"
  std::string entry;
  std::string source_name;  // the path compiler messages name
  std::string source_text;
  std::vector<std::string> include_dirs;  // the source's own folder first
  std::vector<std::pair<std::string, int64_t>> defines;
  std::vector<ArgSig> args;
  std::vector<std::string> cflags;
};

// Builds the request for one config of a spec.
CompileRequest make_compile_request(const KernelSpec& spec, const Config& config);

struct Binary {
  std::string key;  // the binary key (hex), see BinaryKey
  std::string backend;
  std::string kernel;
  std::string config_text;
  std::string entry;
  std::vector<uint8_t> bytes;
  double compile_seconds = 0;
  std::string log;  // the compiler's warnings, if any
  bool from_cache = false;  // set by the cache layer; not stored
};

struct Grid {
  int64_t x = 1, y = 1, z = 1;
  int64_t total() const { return x * y * z; }
  bool operator==(const Grid&) const = default;
};

// The launch geometry of one config: the spec's grid expressions compiled
// with the config's parameter values, evaluated per call from the scalars.
class GridPlan {
 public:
  GridPlan() = default;
  GridPlan(const KernelSpec& spec, const Config& config);
  // slots[i] holds integer scalar argument i (see read_int_slots).
  Grid eval(const int64_t* slots) const {
    Grid g;
    int64_t* d[3] = {&g.x, &g.y, &g.z};
    for (size_t i = 0; i < dims_.size(); ++i) *d[i] = dims_[i].eval(slots);
    return g;
  }

 private:
  std::vector<CompiledExpr> dims_;
};

class LoadedKernel {
 public:
  virtual ~LoadedKernel() = default;
  // params[i] points to the value of argument i (as cuLaunchKernel's kernelParams).
  // A grid with a dimension <= 0 launches nothing.
  virtual void launch(void* const* params, const Grid& grid) = 0;
  const std::string& key() const { return key_; }

 protected:
  explicit LoadedKernel(std::string key) : key_(std::move(key)) {}

 private:
  std::string key_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Everything outside a request that changes the bytes it compiles to:
  // compiler identity and version, target, flags. Part of every binary key.
  virtual std::string toolchain_identity() = 0;
  // What tuning records are keyed by: the CPU model and thread count, or the GPU.
  virtual std::string device_identity() = 0;
  // Compiles; throws Error(Errc::compile) carrying the compiler's log.
  virtual Binary compile(const CompileRequest& req, const std::string& key) = 0;
  // Loads; throws Error(Errc::launch) when the bytes cannot be loaded.
  virtual std::shared_ptr<LoadedKernel> load(const Binary& bin) = 0;
  // Whether compiling runs in a child process of its own already (a system
  // compiler) or inside this process (NVRTC): this picks the default compile mode.
  virtual bool compiles_out_of_process() const = 0;
};

// "cpu" (and later "cuda"); throws Error(Errc::usage) for an unknown name.
std::shared_ptr<Backend> make_backend(const std::string& name, const Options& opts);

}  // namespace kiln
