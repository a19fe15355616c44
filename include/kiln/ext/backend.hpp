// The stages of one kernel variant, each a value: CompileRequest (source +
// parameter defines + options) → Binary (bytes + launch metadata) →
// LoadedKernel (launchable on a Device). A Backend turns one stage into the
// next and provides the Device: what touches memory and time. Backends know
// their compiler, loader and device, nothing above them; the tuner, the
// dispatcher and the workers never ask which backend they hold.
//
// Extension tier: an application uses Runtime and the handles
// (kiln/kernel.hpp); this header is for those who add or drive a backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/device.hpp"
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
  int tensor_maps = 0;  // 128-byte tensor-map parameters after the arguments (cuda)
  bool workspace = false;  // cuda: a workspace pointer after the tensor maps (the spec's workspace)
  std::vector<std::string> cflags;
  bool pdl = false;     // cuda: the spec's pdl; the compile checks that the entry waits
};

// Builds the request for one config of a spec.
CompileRequest make_compile_request(const KernelSpec& spec, const Config& config);

// What a backend learns about a compiled kernel, stored with its binary so
// that a cached binary loads and launches without compiling again.
struct KernelMeta {
  std::string symbol;      // the entry's symbol in the binary (cuda: its lowered name)
  std::string target;      // "sm_90" on cuda; the cpu's target flags hash on cpu
  int registers = 0;       // per thread (cuda)
  int static_shared = 0;   // bytes per block (cuda)
  int local_bytes = 0;     // stack frame per thread (cuda); spilled registers live here
  int spill_bytes = 0;     // spill stores + loads the compiler reported (cuda)
  int max_threads = 0;     // the most threads per block the binary allows (0: not limited)
  int tensor_maps = 0;     // tensor-map parameters the entry takes after the arguments (cuda)
  bool workspace = false;  // the entry takes a workspace pointer after them (cuda)
  bool operator==(const KernelMeta&) const = default;
};

struct Binary {
  std::string key;  // the binary key (hex), see BinaryKey
  std::string backend;
  std::string kernel;
  std::string config_text;
  std::string entry;
  KernelMeta meta;
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

// A TMA tensor map a cuda launch passes after the arguments (the spec's
// tensor_maps), for one call: a 2-D row-major view of buffer argument `arg`.
// The backend encodes it from the buffer's address at launch (and keeps it).
struct TensorMapDims {
  int arg = 0;
  DType dtype = DType::bf16;
  int swizzle = 0;                        // bytes: 0, 32, 64, 128
  int64_t rows = 0, cols = 0, pitch = 0;  // elements
  int64_t box_rows = 0, box_cols = 0;
  bool operator==(const TensorMapDims&) const = default;
};

// Where and how a kernel runs for one call.
struct LaunchDims {
  Grid grid;             // program instances (cuda: blocks)
  Grid block;            // threads per block (cuda); {1,1,1} on cpu
  int64_t shared = 0;    // dynamic shared memory bytes per block (cuda)
  // Buffers the launch zeroes first, on its stream (the spec's `zero`).
  int nzero = 0;
  int zero_arg[4] = {0, 0, 0, 0};
  int64_t zero_bytes[4] = {0, 0, 0, 0};
  // Tensor maps passed after the spec's `nargs` arguments (cuda).
  int nargs = 0;
  int ntmap = 0;
  TensorMapDims tmap[4] = {};
  // cuda: the kernel may start before the previous kernel in its stream ends (the spec's pdl).
  bool pdl = false;
  // cuda: bit i set where argument i is a buffer the kernel reads before its wait (the spec's
  // early_reads): such a launch overlaps the kernel before it only where the thread's
  // EarlyReadScope vouches for those buffers (may_overlap below).
  uint64_t early = 0;
  // cuda: the bytes of the workspace passed after the tensor maps (the spec's workspace;
  // nargs is then set), or -1 where the kernel takes none; at most kMaxWorkspaceBytes.
  int64_t workspace = -1;
  static constexpr int64_t kMaxWorkspaceBytes = int64_t(1) << 40;
  // The spec's `cell = true` arguments (nargs is then set): passed as cells within a CellScope.
  int ncell = 0;
  int cell_arg[4] = {0, 0, 0, 0};
  bool empty() const { return grid.x <= 0 || grid.y <= 0 || grid.z <= 0; }
};

// Cells (docs/program.md, "Cells"): a program that sizes its launches for the
// largest value of a bucketed scalar keeps the call's exact value in a 32-bit
// word on the device. While a CellScope lives on a thread, a launch from it
// passes each `cell = true` argument whose value is one the scope binds as that
// word instead (minus the word's address), which the kernel reads with kiln_cell.
struct CellBinding {
  int64_t value = 0;           // the value the launches were sized for
  const void* word = nullptr;  // the word that holds the exact one
};
class CellScope {
 public:
  CellScope(const CellBinding* bindings, int n);
  ~CellScope();
  CellScope(const CellScope&) = delete;
  CellScope& operator=(const CellScope&) = delete;

 private:
  const CellBinding* prev_;
  int prev_n_;
};
// Reads before the wait (docs/program.md): a pdl kernel whose spec lists early_reads reads
// those buffers before kiln_wait_prior(), so it may overlap the kernel before it only where
// nothing that may still run writes them. A program vouches for the inputs none of its steps
// writes: while an EarlyReadScope lives on a thread, a launch from it on the scope's stream
// whose early-read pointers all lie in the scope's ranges may overlap (the pointer, not the
// bytes after it, is checked: a scope vouches for whole buffers, and a program checks each
// argument's size against its buffer); elsewhere such a kernel is launched to wait for the
// work before it whole. With `serial_first`, the scope's first
// launch on its stream does not overlap either (whatever it is), so that no kernel of the
// scope runs beside work queued before the scope, which may write what the scope vouches for.
struct EarlyReadRange {
  uintptr_t begin = 0, end = 0;  // bytes [begin, end)
};
class EarlyReadScope {
 public:
  // `ranges`: sorted by begin, not overlapping; it must outlive the scope.
  EarlyReadScope(const std::vector<EarlyReadRange>* ranges, Stream stream, bool serial_first);
  ~EarlyReadScope();
  EarlyReadScope(const EarlyReadScope&) = delete;
  EarlyReadScope& operator=(const EarlyReadScope&) = delete;

 private:
  friend bool may_overlap(void* const* params, const LaunchDims& d, Stream s);
  const std::vector<EarlyReadRange>* ranges_;
  Stream stream_;
  bool first_;
  EarlyReadScope* prev_;
};
// For a backend about to launch `d` on `s` with `params`: false where the launch must not
// overlap the work before it (the first launch of a serial_first scope on its stream, which
// this call takes; a kernel with early reads that the thread's scope does not vouch for).
// Whether a launch without that objection overlaps is still the spec's pdl and the device's.
bool may_overlap(void* const* params, const LaunchDims& d, Stream s);

// Room for a launch's params with cells in place of values.
struct CellParams {
  static constexpr int kMaxArgs = 64;
  void* ptrs[kMaxArgs];
  int64_t values[4];
};
// What a backend passes for `params`: `params` itself, or, where `d` has cell
// arguments that the thread's CellScope binds, a copy in `room` with cells in place.
void* const* with_cells(void* const* params, const LaunchDims& d, CellParams& room);


// The launch shape of one config: the spec's grid, block and shared-memory
// expressions compiled with the config's params folded in, evaluated per
// call from the integer scalars. Evaluation allocates nothing.
class LaunchPlan {
 public:
  LaunchPlan() = default;
  // `limits`: the device's (Backend::limits()); a block or shared memory past them is refused.
  LaunchPlan(const KernelSpec& spec, const Config& config, const LaunchLimits& limits);
  // slots[i] holds integer scalar argument i (see read_int_slots). Throws
  // Error(Errc::launch) when a dimension overflows or exceeds the limits;
  // an empty grid (a dimension <= 0) is returned, not thrown.
  LaunchDims eval(const int64_t* slots) const;
  // Why these dims cannot launch, or "" (an empty grid is "" too).
  std::string check(const LaunchDims& d) const;

 private:
  std::vector<CompiledExpr> grid_, block_;
  CompiledExpr shared_;
  bool has_shared_ = false;
  CompiledExpr workspace_;
  bool has_workspace_ = false;
  std::vector<std::pair<int, CompiledExpr>> zero_;  // (argument, bytes)
  CompiledExpr zero_when_;
  bool has_zero_when_ = false;
  struct TensorMapPlan {
    int arg;
    DType dtype;
    int swizzle;
    CompiledExpr rows, cols, pitch, box_rows, box_cols;
    CompiledExpr size;  // the buffer's elements: a view past them is refused
  };
  std::vector<TensorMapPlan> tmaps_;
  int nargs_ = 0;
  bool pdl_ = false;
  uint64_t early_ = 0;
  std::vector<int> cells_;  // the `cell = true` arguments
  LaunchLimits limits_;
  std::string kernel_, config_;
};

class Library;
struct LibraryChoice;

class LoadedKernel {
 public:
  virtual ~LoadedKernel() = default;
  // params[i] points to the value of argument i (as cuLaunchKernel's
  // kernelParams; a buffer argument is a pointer into the device's memory).
  // Asynchronous on devices that queue work (cuda): errors the launch itself
  // reports throw Error(Errc::launch) naming the kernel, config and dims;
  // faults inside the kernel surface at the next synchronisation. An empty
  // grid launches nothing.
  virtual void launch(void* const* params, const LaunchDims& dims, Stream stream) = 0;
  // The variant contract, in the shape of CUTLASS's operations: whether this
  // variant can run a call ("" when it can, else why not), the scratch bytes
  // it needs for it, then launch() on a stream. A compiled template answers
  // through its spec (constraints and launch limits: Tuner::why_not); a
  // library call through the library's own rules. (A compiled kernel's spec
  // workspace is the backend's to keep, made on its first launch on a stream;
  // workspace_bytes does not count it.)
  virtual std::string can_implement(void* const* params) const {
    static_cast<void>(params);
    return "";
  }
  virtual size_t workspace_bytes(void* const* params) const {
    static_cast<void>(params);
    return 0;
  }
  // What runs for a call, where the choice decides it per call (a library's
  // algorithm, tile, stages, split-K); "" when there is nothing to add.
  virtual std::string describe(void* const* params) const {
    static_cast<void>(params);
    return "";
  }
  const std::string& key() const { return key_; }
  const KernelMeta& meta() const { return meta_; }
  // The backend's own handle of the loaded code (cuda: the CUkernel), for
  // benchmarks that launch it raw; nullptr where there is none.
  virtual void* native_handle() const { return nullptr; }

 protected:
  LoadedKernel(std::string key, KernelMeta meta) : key_(std::move(key)), meta_(std::move(meta)) {}

 private:
  std::string key_;
  KernelMeta meta_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // "" when the backend can compile and run here, else why not (no libcuda,
  // no GPU, driver too old...). Compiling may still work without a device
  // (cuda with KILN_CUDA_ARCH); running never does.
  virtual std::string unavailable_reason() = 0;
  // Everything outside a request that changes the bytes it compiles to:
  // compiler identity and version, target, flags. Part of every binary key.
  virtual std::string toolchain_identity() = 0;
  // What tuning records are keyed by: the CPU model and thread count, or the GPU.
  virtual std::string device_identity() = 0;
  // Compiles; throws Error(Errc::compile) carrying the compiler's log.
  virtual Binary compile(const CompileRequest& req, const std::string& key) = 0;
  // The device this backend runs on (cpu: the host; cuda: KILN_CUDA_DEVICE).
  // Throws Error(Errc::launch) with unavailable_reason() when there is none.
  virtual Device& device() = 0;
  // Loads a binary on the device; throws Error(Errc::launch) when the bytes
  // cannot be loaded or their metadata does not match what the device reports.
  virtual std::shared_ptr<LoadedKernel> load(const Binary& bin) = 0;
  // Whether compiling runs in a child process of its own already (a system
  // compiler) or inside this process (NVRTC): this picks the default compile mode.
  virtual bool compiles_out_of_process() const = 0;
  // Launch limits of the device, for pruning before compiling. Without a
  // device (cuda compiling for KILN_CUDA_ARCH) the architecture's limits.
  virtual LaunchLimits limits() = 0;
  // Why a compiled config cannot launch with these dims on this device
  // (threads, registers or shared memory beyond what it has), or "".
  virtual std::string check_resources(const KernelMeta& meta, const LaunchDims& dims);
  // The most threads a block may have when each uses `registers` registers;
  // 0 when registers do not limit a block here.
  virtual int max_threads_for_registers(int registers) const {
    (void)registers;
    return 0;
  }

  // The libraries this backend calls for library choices (kiln/ext/library.hpp).
  virtual std::vector<Library*> libraries() { return {}; }
  // The library a choice names, or null when this backend has none of that name.
  Library* library(const std::string& library_name);
  // Library choices (kiln/library.hpp). "" when the choice `name` can be
  // made here, else why not (the library is not installed, no device, it
  // does not implement the problem): the choice is then skipped, with that
  // reason, never an error.
  std::string library_unavailable(const std::string& name);
  // Whether the library of choice `name` builds a plan per shape (Library::plans_per_shape);
  // false where this backend calls no such library.
  bool library_plans_per_shape(const std::string& name);
  // The library's name and version: what its results are kept by.
  std::string library_identity(const std::string& name);
  // Throws Error(Errc::spec) when a library choice of `spec` names a library
  // this backend does not call (a typo, or a library of another backend).
  void check_libraries(const KernelSpec& spec);
  // The loaded library choice of a library binary (is_library_binary).
  std::shared_ptr<LoadedKernel> load_library(const Binary& bin);

 private:
  Library* resolve_library(const std::string& name, std::optional<LibraryChoice>* choice, std::string* why);
};

// Why `config` can never run, whatever the call: a constraint over params
// alone is false, or a block or shared-memory size the params alone decide
// exceeds `limits`. "" when some call may run it. Used to prune before
// compiling, by `kiln compile`, background compiles and the tuner.
std::string statically_pruned(const KernelSpec& spec, const Config& config, const LaunchLimits& limits);

// The register sibling class of `config`: its values of the spec's [tuning]
// registers_by params ("" when the spec names none).
std::string register_sibling_key(const KernelSpec& spec, const Config& config);
// The registers a thread of `meta`'s binary uses, as a guide to its
// siblings: 0 when unknown, or when launch bounds held the compiler to
// fewer threads than those registers allow (its count then follows its block).
int learned_registers(const Backend& backend, const KernelMeta& meta);
// Why `config` cannot launch, judged before compiling it from the
// `registers` a thread its sibling (`sibling`, the config's text) was
// compiled to and the block the params alone decide; "" when it may.
std::string pruned_by_sibling_registers(const Backend& backend, const KernelSpec& spec, const Config& config,
                                        int registers, const std::string& sibling);

// A binary standing for a library call: no code; its metadata names the
// call ("library:cublas_sgemm"), and the backend's load() makes it launchable.
Binary library_binary(const std::string& backend, const std::string& name, const std::string& kernel,
                      const std::string& key);
bool is_library_binary(const Binary& b);

// "cpu" or "cuda"; throws Error(Errc::usage) for an unknown name.
std::shared_ptr<Backend> make_backend(const std::string& name, const Options& opts);

}  // namespace kiln
