// How a handle tunes (TuneOptions) and what a tuning gives (TuneOutcome):
// what an application passes to Kernel and Runtime::tune.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

// How hard a tuning looks: `none` the spec's search, `quick` a budgeted
// search until it settles, `full` every config.
enum class Effort : uint8_t { none, quick, full };

struct TuneOptions {
  std::optional<SearchKind> search;  // default: the spec's
  bool force = false;                // tune again even when a record exists (reusing none of it)
  int max_configs = 0;               // evaluations at most; 0: KILN_TUNE_MAX_CONFIGS, else no cap
  bool show_progress = false;
  Stream stream = nullptr;           // the caller's stream: synchronised before its buffers are read
  bool libraries = true;             // false: the spec's library choices are left out (templates only)
  bool cached_only = false;          // true: answer from a record or not at all (choice empty), never tune
  // Re-measure a record flagged noisy (its timings taken on a busy machine):
  // kiln tune, kiln plan and a first call's background tuning ask for it;
  // without it a noisy record answers like any other. At most
  // Tuner::kMaxRemeasures times a record.
  bool remeasure_noisy = false;
  std::optional<Effort> effort;      // overrides `search` when set
  double budget_seconds = 0;         // > 0: stop searching after this long (a budgeted search unless
                                     // `search` or effort=full says otherwise)
  // Set from another thread to stop a tuning between configs: it throws
  // Error(Errc::cancelled) and stores nothing.
  const std::atomic<bool>* cancel = nullptr;
};

struct TuneOutcome {
  TuningRecord record;
  bool from_cache = false;       // answered by a record, nothing benchmarked
  std::optional<Config> choice;  // what this call runs: the record's best, or the fastest
                                 // recorded config that can run this call
  size_t timed_now = 0;          // configs benchmarked for the first time by this tuning
  size_t retimed_now = 0;        // configs re-timed side by side by this tuning
  bool stored = true;            // false when the record could not be written (a warning said why)
  int64_t peak_device_bytes = 0; // extra device memory this tuning used at most
  double compile_wait_s = 0;     // waiting for compiles to finish
  double bench_s = 0;            // benchmarking: timing, checking and re-timing, workers' round trips included
  // The configs this tuning evaluated, in the order it did (their text), for
  // the best-so-far curve of a search (`kiln tune --json`: "evaluated").
  std::vector<std::string> evaluated;
};

}  // namespace kiln
