// Runtime settings. Each one is also an environment variable; Options::from_env()
// reads them all, and defaults work with nothing set. docs/settings.md lists them.
// Thread-safety: Options is a plain value; from_env reads the environment
// (do not change it from another thread meanwhile).
#pragma once

#include <filesystem>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

enum class CompileMode { automatic, threads, subprocess };
enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3 };
// What a handle's first call of a shape with no tuning record does
// (KILN_FIRST_CALL): `wait` tunes before returning; `swap` launches a safe
// choice at once and tunes behind it on copies of the call's inputs, then
// swaps the winner in for later calls; `serve` launches the safe choice and
// never tunes (as serving mode does for that handle's misses).
enum class ProgramCells : uint8_t { graphs, always, off };

enum class FirstCall : uint8_t { wait, swap, serve };

struct Options {
  std::filesystem::path cache_dir;    // KILN_CACHE_DIR; default $XDG_CACHE_HOME/kiln, else ~/.cache/kiln
  bool no_cache = false;              // KILN_NO_CACHE=1: no disk caches are read or written
  int compile_threads = 0;            // KILN_COMPILE_THREADS; 0: the number of cores
  CompileMode compile_mode = CompileMode::automatic;  // KILN_COMPILE_MODE=threads|subprocess
  std::string cxx = "c++";            // KILN_CXX: the cpu backend's compiler
  double compile_timeout_s = 300;     // KILN_COMPILE_TIMEOUT: a compile is killed after this long
  int launch_threads = 0;             // KILN_NUM_THREADS: threads running a cpu grid; 0: the cores
  std::filesystem::path worker_path;  // KILN_WORKER: the kiln-worker executable; default: found beside kiln
  int workers = 0;                    // KILN_WORKERS: worker processes; 0: compile_threads
  bool tune_in_process = false;       // KILN_TUNE_IN_PROCESS=1: benchmark without a worker
  int tune_max_configs = 0;           // KILN_TUNE_MAX_CONFIGS: cap on configs tried; 0: no cap
  int quick_above = 128;              // KILN_QUICK_ABOVE: a space with more runnable configs for a call is
                                      // searched with the budgeted search (effort quick) unless the spec
                                      // names its search or the caller asks for one (docs/tuning.md)
  double bench_budget_ms = 50;        // KILN_BENCH_BUDGET_MS: timed repetitions per config
  double bench_timeout_s = 30;        // KILN_BENCH_TIMEOUT: the longest a config's benchmark may run
                                      // (once a config is timed, the deadline follows it: docs/tuning.md)
  double bench_deadline_floor_s = 1;  // KILN_BENCH_DEADLINE_FLOOR: the shortest adaptive deadline
  bool bench_flush = false;           // KILN_BENCH_FLUSH=1: flush caches between timed runs
  double noise_bound = 0.10;          // KILN_NOISE_BOUND: re-timings whose spread passes this are taken again
                                      // (twice at most), then stored flagged as noisy (docs/tuning.md)
  std::optional<int> force_variant;   // KILN_FORCE_VARIANT: a multi-kernel always runs this variant
  int retune_after = 0;               // KILN_RETUNE_AFTER: calls of one exact shape before a size-hint
                                      // multi-kernel re-tunes it in the background; 0: never
  bool quiet = false;                 // no progress bars
  LogLevel log_level = LogLevel::warn;      // KILN_LOG: error, warn, info, debug
  int memo_capacity = 4096;           // KILN_MEMO_CAPACITY: shapes a handle remembers (a fixed-size table)
  bool background_compile = true;     // KILN_BACKGROUND_COMPILE=0: handles compile on first call, not when made
  int cuda_device = 0;                // KILN_CUDA_DEVICE: the GPU the cuda backend uses
  std::string cuda_arch;              // KILN_CUDA_ARCH: sm_90, sm_90a...; default: the device's (required
                                      // to compile cuda kernels where there is no GPU)
  bool cuda_flush_l2 = true;          // KILN_BENCH_NO_L2_FLUSH=1: time GPU kernels with a warm L2
  // KILN_BENCH_L2_FLUSH=read: flush by reading the buffer (a kernel), leaving L2 clean, instead
  // of writing it (a memset), which leaves L2 full of dirty lines a timed kernel's reads must
  // write back first
  bool cuda_flush_read = false;
  // KILN_BENCH_HOLD=1: a GPU's timed runs are enqueued behind a held stream, in batches, and
  // run back to back once it is released, so that no delay of the host's between them is timed
  // (docs/cuda.md, "Timing")
  bool cuda_bench_hold = false;
  bool cuda_pdl = true;               // KILN_PDL=0: no launch overlaps the kernel before it (a spec's pdl
                                      // is not used: docs/program.md)
  bool cuda_warm_libraries = true;    // KILN_CUDA_WARM_LIBRARIES=0: the GPU libraries (cuBLASLt) are opened and
                                      // readied on a first call that needs them, not beside the device's making

  // Sharing with a fleet (docs/fleet.md).
  std::string remote_cache;           // KILN_REMOTE_CACHE=redis://host:port/db: tuning records shared through Redis
  double remote_timeout_s = 0.05;     // KILN_REMOTE_TIMEOUT: the longest one Redis command may take, connect included
  bool remote_binaries = false;       // KILN_REMOTE_BINARIES=1: share compiled binaries too (content-addressed, verified on read)
  double lease_ttl_s = 30;            // KILN_REMOTE_LEASE_TTL: a tuner's lease expires this long after its last renewal
  double lease_wait_s = 300;          // KILN_REMOTE_LEASE_WAIT: the longest a process waits for another's tuning
  std::string bundle;                 // KILN_BUNDLE: a name; the records this process uses are kept together
                                      // under it in Redis and fetched in one round trip by the next process
  bool serving = false;               // KILN_SERVING=1: cached choices only, never benchmark on the call path
  FirstCall first_call = FirstCall::swap;  // KILN_FIRST_CALL=wait|swap|serve (docs/dispatch.md)
  bool program_graphs = true;         // KILN_PROGRAM_GRAPHS=0: programs launch step by step, never as graphs
  // KILN_PROGRAM_CELLS=graphs|always|off: where a program keeps a bucketed scalar's exact value
  // in a cell and sizes its launches for the bucket (docs/program.md, "Cells"): in its graphs (so a
  // new value sets one word, not the launches), at every call (graphs or not), or nowhere.
  ProgramCells program_cells = ProgramCells::graphs;
  std::filesystem::path artifact;     // KILN_ARTIFACT: a packed artifact (kiln pack) loaded at start
  bool artifact_sources_only = false; // KILN_ARTIFACT_MISMATCH=sources: an artifact for another device or
                                      // toolchain gives its sources only (then tuned here), not refused

  // The longest time-out a setting takes (about 11.6 days): a larger one is
  // a mistake, and would overflow the clocks that measure it.
  static constexpr double kMaxTimeoutSeconds = 1e6;

  // Reads the environment; throws Error(Errc::usage) naming a malformed variable.
  static Options from_env();
  // The cache folder after defaults are applied.
  std::filesystem::path resolved_cache_dir() const;
  int resolved_compile_threads() const;
  int resolved_launch_threads() const;
  // Whether handles compile their config space ahead of the first call: not
  // with background compiling off, in serving mode, or with an artifact (an
  // application that ships its kernels compiles only what a call needs).
  bool compiles_ahead() const { return background_compile && !serving && artifact.empty(); }
};

}  // namespace kiln
