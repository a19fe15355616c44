// Tuner: picks the fastest correct config of a kernel for the tuning-key
// values of a real call, once per device (the record is cached).
//
//   1. prune configs whose constraints fail or whose grid is empty for this call;
//   2. compile candidates in parallel (exhaustive: all; coordinate descent:
//      the start, then each round's neighbours);
//   3. benchmark each on a copy of the call's arguments (in a kiln-worker
//      unless KILN_TUNE_IN_PROCESS=1), checking its outputs against the
//      reference config's within a tolerance;
//   4. record every config's time or failure; the fastest correct one wins.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "kiln/backend.hpp"
#include "kiln/compile_pool.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

class Benchmarker;

struct TuneOptions {
  std::optional<SearchKind> search;  // default: the spec's
  bool force = false;                // tune again even when a record exists
  int max_configs = 0;               // 0: KILN_TUNE_MAX_CONFIGS, else no cap
  bool show_progress = false;
};

struct TuneOutcome {
  TuningRecord record;
  bool from_cache = false;
};

class Tuner {
 public:
  struct Parts {
    Backend* backend;
    CompilePool* compiler;
    Benchmarker* bench;
    TuningCache* cache;  // may be null (KILN_NO_CACHE)
    std::function<std::shared_ptr<LoadedKernel>(const Binary&)> load;
    Options opts;
  };
  explicit Tuner(Parts parts) : p_(std::move(parts)) {}

  // Tunes `spec` for the tuning-key values in `params` (the call's real
  // arguments, which are copied, never written). A record in which every
  // config failed is returned too (record.best empty); callers decide.
  TuneOutcome tune(const KernelSpec& spec, void* const* params, const TuneOptions& o);

  // The default tolerances for comparing outputs of dtype `t`.
  static double default_rtol(DType t);
  static double default_atol(DType t);
  // Compares a buffer of `dtype` values with a reference one, with the
  // tolerances of `ts` (or the defaults); says where the worst error is, or
  // nullopt when they agree.
  static std::optional<std::string> compare(DType dtype, std::span<const std::byte> got,
                                            std::span<const std::byte> ref, const TuningSpec& ts);

 private:
  Parts p_;
};

}  // namespace kiln
