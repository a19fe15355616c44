// Runtime: the process-wide pieces kiln works with (backends, the code cache,
// compile pools, loaded kernels), built from Options. Create one and share it.
//
// Thread-safety: every call may come from any number of threads at once; a
// Runtime must outlive the handles (Kernel, MultiKernel) made from it.
#pragma once

#include <map>
#include <memory>
#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "kiln/device.hpp"
#include "kiln/options.hpp"
#include "kiln/tune_options.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

// The machinery a runtime holds, for the extension tier (kiln/ext/): an
// application needs none of their definitions.
class Backend;
class LoadedKernel;
struct Binary;
struct CallView;
class WorkerPool;
class CodeCache;
class CompilePool;
class Benchmarker;
class RemoteCache;

class Runtime {
 public:
  explicit Runtime(Options opts = Options::from_env());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Options& options() const { return opts_; }
  // The device of a backend ("cpu", "cuda"): its memory, streams and clock.
  Device& device(const std::string& backend);
  // The backend itself (kiln/ext/backend.hpp: compiling, loading, limits).
  Backend& backend(const std::string& name);
  // The code cache, or nullptr with KILN_NO_CACHE.
  std::shared_ptr<CodeCache> code_cache();
  CompilePool& compile_pool(const std::string& backend);
  // Loads a binary; the same key returns the same loaded kernel while anyone holds it.
  std::shared_ptr<LoadedKernel> load(const Binary& bin);
  // Which compile mode a backend gets: the option, or the backend's default.
  CompileMode compile_mode(const std::string& backend);
  // The kiln-worker processes (KILN_WORKERS of them, default the compile
  // threads), made on first use; workers themselves start on first request.
  std::shared_ptr<WorkerPool> worker_pool();
  // The tuning cache, or nullptr with KILN_NO_CACHE. With KILN_REMOTE_CACHE
  // it reads and writes Redis too (docs/fleet.md).
  std::shared_ptr<TuningCache> tuning_cache();
  // The Redis connection of KILN_REMOTE_CACHE, or nullptr.
  std::shared_ptr<RemoteCache> remote_cache();
  // Tunes a kernel for the tuning-key values of `params` (see Tuner). In
  // serving mode (Options::serving) nothing is benchmarked: the cached
  // choice, else the nearest tuned key's, else the spec's default.
  TuneOutcome tune(const KernelSpec& spec, void* const* params, const TuneOptions& o = {});
  // The same for a call decoded already.
  TuneOutcome tune(const CallView& call, const TuneOptions& o = {});
  // The benchmarker of a backend (in a worker, or in-process with KILN_TUNE_IN_PROCESS).
  Benchmarker& benchmarker(const std::string& backend);

  // Background tunings (KILN_FIRST_CALL=swap): handles queue them; they run
  // one at a time, in order, on a thread of the runtime's, so their timings
  // do not compete with each other. A job gets the flag that tells it to
  // stop (set when the runtime is destroyed: jobs not started are dropped,
  // the running one stops between configs). Thread-safe.
  void run_in_background(std::string what, std::function<void(const std::atomic<bool>& stop)> job);
  // Work ahead of the calls (a handle's compiles queued as it is made): the
  // same, on another thread, neither counted as a tuning nor waited for by
  // wait_tuned(), so that making a handle costs its caller nothing. Thread-safe.
  void run_ahead(std::string what, std::function<void(const std::atomic<bool>& stop)> job);
  // Waits until every background tuning queued so far has finished (or, with
  // a timeout, until it passes: false then). A program or a test calls this
  // to have the tuned choices in use.
  bool wait_tuned(double timeout_s = -1);
  // Background tunings queued or running now.
  size_t tunings_pending() const;

 private:
  struct BackendState;
  BackendState& state(const std::string& name);

  Options opts_;
  mutable std::mutex m_;
  std::shared_ptr<CodeCache> code_cache_;  // stays null with KILN_NO_CACHE
  std::map<std::string, std::unique_ptr<BackendState>> backends_;
  std::shared_ptr<WorkerPool> workers_;
  std::shared_ptr<TuningCache> tuning_cache_;
  std::shared_ptr<RemoteCache> remote_;
  std::atomic<uint64_t> serving_misses_{0};
  std::set<std::string> missed_;  // keys a serving miss was logged for (under m_)
  std::string cache_off_;          // why the cache folder is not used, when it cannot be written (under m_)
  void without_cache(const std::string& why);
  TuneOutcome serve(const CallView& call, bool libraries);

 public:
  // Counts a call answered with no tuned choice of its own (serving mode, or
  // KILN_FIRST_CALL=serve): logged once per key, kept for `kiln report --misses`.
  void note_miss(const KernelSpec& spec, const TuningKey& key, const std::string& ran, const std::string& how);

 private:

 public:
  // Calls in serving mode that had no tuned choice of their own (each key counted every time it is decided).
  uint64_t serving_misses() const;

  // What this runtime has done so far (thread-safe; a snapshot).
  struct Stats {
    uint64_t compiled = 0;           // compiles run (not answered by a cache or an artifact)
    uint64_t compile_cache_hits = 0; // binaries from the disk cache or an artifact
    uint64_t configs_timed = 0;      // configs benchmarked by tunings, re-timings included
    uint64_t records_local = 0, records_artifact = 0, records_remote = 0;  // tuning records answered from each
    uint64_t serving_misses = 0;
    uint64_t background_tunings = 0;  // background tunings finished (KILN_FIRST_CALL=swap)
  };
  Stats stats();

 private:
  std::atomic<uint64_t> configs_timed_{0};
  struct Background;
  std::unique_ptr<Background> background_;
  std::unique_ptr<Background> ahead_;
  void enqueue(std::unique_ptr<Background>& slot, const char* kind, std::string what,
               std::function<void(const std::atomic<bool>& stop)> job);
};

}  // namespace kiln
