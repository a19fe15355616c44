// Choosing among variants at run time.
//
// SizeHintMultiKernel: one config of a kernel is tuned per hint point of its
// spec (tuning.hints) ahead of time; at run time each shape runs the config of
// the nearest hint point, by L1 distance over log2 of the tuning-key values,
// with no benchmarking on the call path. Optionally, an exact shape that is
// called often is re-tuned in the background and switched to when ready.
//
// MultiKernel: several kernels (variants) that compute the same thing, perhaps
// with different argument lists; a variant may also be several launches run
// in order (an unfused form, a GEMM on padded copies), with scratch buffers
// between them. The first call with a new shape key tunes each variant (each
// launch of a variant on its own), benchmarks them against each other on that
// call's arguments (a variant of several launches timed as a whole), and
// remembers the winner (in memory and in the tuning cache).
//
// In both, a memoised shape costs a lock-free, allocation-free table lookup,
// a launch-shape evaluation and the launch. Both remember a bounded number
// of shapes (KILN_MEMO_CAPACITY); a shape evicted is decided again (from
// memory or the tuning cache) when it returns. Both start compiling their
// config spaces in the background when made (Options::background_compile).
//
// Thread-safe: calls may come from any number of threads at once.
#pragma once

#include <optional>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kernel.hpp"
#include "kiln/plan.hpp"

namespace kiln {

class Runtime;

struct SizeHintOptions {
  // Calls of one exact shape after which it is re-tuned in the background
  // (0: never). Default: KILN_RETUNE_AFTER.
  int retune_after = -1;
  TuneOptions tune;
  // Dispatch by a plan (kiln plan) instead of the spec's hints: its training
  // points and their configs become the points, nothing is tuned ahead.
  // `use_plan`: the plan stored for this kernel on this device, if there is
  // a valid one (else the hints, with a warning).
  std::optional<DispatchPlan> plan;
  bool use_plan = false;
};

class SizeHintMultiKernel final : public detail::TypedCall<SizeHintMultiKernel>, public Launchable {
 public:
  SizeHintMultiKernel(Runtime& rt, KernelSpec spec, SizeHintOptions opts = {});
  ~SizeHintMultiKernel();  // waits for background re-tuning
  SizeHintMultiKernel(const SizeHintMultiKernel&) = delete;
  SizeHintMultiKernel& operator=(const SizeHintMultiKernel&) = delete;

  // Tunes one config per hint point: every config is compiled once (in
  // parallel) and each hint point is benchmarked in turn on random inputs of
  // its shape; records come from the cache when they exist. Scalars outside
  // the tuning key take the values given here (floats default to 1). The
  // first launch calls this if nobody has.
  void prepare(const std::vector<std::pair<std::string, std::string>>& other_scalars = {});

  void launch(void* const* params, Stream stream = nullptr) override;
  Running running(void* const* params) override;
  void check_types(const uint8_t* codes, size_t n) const;

  struct HintPoint {
    std::vector<int64_t> values;  // in tuning-key order
    Config config;                // tuned there
    double ns = 0;                // its time there
  };
  const std::vector<HintPoint>& hint_points() const;
  // The hint point a shape maps to (its index), by the rule above; ties go to
  // the larger hint point (the larger sum of log2 values), then the later one.
  // A call runs the nearest hint point whose config can run it (a constraint
  // or an empty grid may rule one out), else the spec's default or the first
  // config that can, chosen without benchmarking.
  size_t nearest(const std::vector<int64_t>& key) const;
  // The config a call with these arguments runs now.
  Config config_for(void* const* params);
  // Shapes re-tuned exactly in the background so far; waits for pending ones.
  size_t retuned();
  void wait_background();
  const KernelSpec& spec() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class MultiKernel final : public detail::TypedCall<MultiKernel>, public Launchable {
 public:
  // Honours KILN_FORCE_VARIANT (Options::force_variant).
  MultiKernel(Runtime& rt, MultiKernelSpec spec, TuneOptions tune = {});
  ~MultiKernel();
  MultiKernel(const MultiKernel&) = delete;
  MultiKernel& operator=(const MultiKernel&) = delete;

  void launch(void* const* params, Stream stream = nullptr) override;
  Running running(void* const* params) override;
  bool settled(void* const* params) override;
  void check_types(const uint8_t* codes, size_t n) const;

  // Which variant a call with these arguments runs (deciding if needed), and why.
  struct Pick {
    size_t variant = 0;
    ChoiceSource source = ChoiceSource::benchmarked;  // benchmarked, cache, forced, only variant, safe, tuned
    Config config;       // the variant's own config (its first step's, for a variant of several launches)
    // When benchmarked or from the cache: each variant's time or failure (VARIANT=i).
    std::vector<ConfigResult> results;
    std::vector<Config> steps;  // each launch's config, in order (one for a variant of one launch)
  };
  Pick pick(void* const* params);
  const MultiKernelSpec& spec() const;
  // Scratch buffers held for the threads that called it: per thread and
  // scratch buffer, the one in use, and the ones it outgrew (kept while the
  // multi-kernel lives: a graph captured with one may still run it). A thread
  // that ends gives its buffers back.
  size_t scratch_buffers() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with its background tunings
};

}  // namespace kiln
