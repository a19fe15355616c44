// Tuner: picks the fastest correct config of a kernel for the tuning-key
// values of a real call, once per device (the record is cached).
//
//   1. the record of the key, if any, answers when it holds a result for
//      every config the search would evaluate (a config added to the spec
//      since is evaluated alone; one removed costs nothing);
//   2. otherwise, holding the key's lock (one process tunes, the others wait
//      for its record): prune configs that cannot run for this call;
//      compile candidates in parallel; benchmark each on a copy of the call's
//      arguments (in a kiln-worker unless KILN_TUNE_IN_PROCESS=1), checking
//      its outputs against the reference config's; then re-time the fastest
//      few side by side, and measure the noise;
//   3. record every config's time or failure; the fastest correct one wins,
//      configs within the noise of it counting as equal (docs/tuning.md).
//
// Thread-safe: tune may be called from several threads (it serialises on
// the key's lock).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/ext/backend.hpp"
#include "kiln/ext/call_view.hpp"
#include "kiln/tune_options.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

class Benchmarker;
class CompilePool;
class TuningCache;

// A config for a call that has no tuning record of its own, made without
// benchmarking (a first call under KILN_FIRST_CALL=swap or serve, serving
// mode), and why it was picked.
struct SafeChoice {
  Config config;
  std::string how;
  // Checked already: a library choice (what tunings trust), or a config that
  // ran and agreed at a nearby key. Others are run once in a worker before
  // their result is given (try_config, dispatch/first_call.hpp).
  bool proven = false;
};
// The safe choices for a call, best first (docs/dispatch.md): the choices of
// the nearest tuned keys (L1 distance over log2 of the key values) that can
// run it; the spec's first available library choice (nothing to compile,
// nothing to check first: the library is what a tuning trusts); the spec's
// default config; then the cheap rule: the template config that fills the
// device with the fewest programs (the smallest grid of at least one
// program per multiprocessor or core; where none reaches that, the largest
// grid); then the first config that can run the call. Only configs that can run the call
// are listed, and a config that failed (crashed, computed something else,
// timed out) in a nearby record is left out. `cache` may be null. With
// `libraries` false (TuneOptions::libraries), no library choice is listed.
std::vector<SafeChoice> safe_choices(const KernelSpec& spec, void* const* params, Backend& backend,
                                     const TuningCache* cache, bool libraries = true);
std::vector<SafeChoice> safe_choices(const CallView& call, Backend& backend, const TuningCache* cache,
                                     bool libraries = true);

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
  // arguments, which are read, never written). A record in which no config
  // survived is returned too (record.best and choice empty); callers decide.
  // Throws when tuning cannot be done at all (a worker killed from outside
  // twice, a disk error): such faults are not the configs', and nothing is
  // stored.
  TuneOutcome tune(const KernelSpec& spec, void* const* params, const TuneOptions& o);
  // The same for a call decoded already (its view's spec is the one tuned).
  TuneOutcome tune(const CallView& call, const TuneOptions& o);

  // Why `config` cannot run a call whose integer scalars are `slots` (a
  // constraint is false, the grid is empty, the launch exceeds `limits`),
  // or "" when it can.
  static std::string why_not(const KernelSpec& spec, const Config& config, const int64_t* slots,
                             const LaunchLimits& limits);
  // The config a record answers for a call: among its results that ran and
  // agreed, exist in the spec's current space and can run the call, the
  // fastest, configs within min(noise, 3%) of it counting as equal (the
  // earliest in the space wins). nullopt when none qualifies.
  // `plans_per_shape(choice)`, where given, says whether a library choice builds a plan per
  // shape (Backend::library_plans_per_shape): such a choice is passed over where
  // bucket_refusal refuses it (a record from before the rule, or from a call in a bucket of
  // one value, may hold its time).
  static std::optional<Config> choose(const TuningRecord& r, const KernelSpec& spec, const int64_t* slots,
                                      const LaunchLimits& limits,
                                      const std::function<bool(const std::string&)>& plans_per_shape = {});
  // Why a library choice that builds a plan per shape (Library::plans_per_shape) is no
  // candidate for a call of `spec` whose integer scalars are `slots`: the spec's tuning keeps
  // a key name by bucket, and the call's bucket of it holds more than one value (pow2_bucket
  // keeps values up to 2 as they are). "" where each of the call's buckets is its value alone.
  static std::string bucket_refusal(const KernelSpec& spec, const int64_t* slots);
  // choose()'s `plans_per_shape` for the libraries of `backend` (which must outlive it).
  static std::function<bool(const std::string&)> plans_per_shape_of(Backend& backend) {
    return [&backend](const std::string& choice) { return backend.library_plans_per_shape(choice); };
  }
  static constexpr double kMaxTieWindow = 0.03;
  static constexpr int kMaxRemeasures = 3;


  // The default tolerances for comparing outputs of dtype `t`.
  static double default_rtol(DType t);
  static double default_atol(DType t);
  // The tolerances compare() applies to values of `dtype` against a
  // reference whose largest magnitude is `max_abs_ref`: an element agrees
  // when |got - ref| <= atol + rtol * |ref|.
  struct Tolerance {
    double rtol = 0, atol = 0;
  };
  static Tolerance tolerance(DType dtype, const TuningSpec& ts, int64_t reduction, double max_abs_ref);
  // Compares a buffer of `dtype` values with a reference one, with the
  // tolerances of `ts` (or the defaults); says where the worst error is, or
  // nullopt when they agree. `reduction`: the length of the sums each
  // element is (the spec's [tuning] reduction for this call; 0: not given),
  // which f16 and bf16 defaults follow (docs/tuning.md).
  static std::optional<std::string> compare(DType dtype, std::span<const std::byte> got,
                                            std::span<const std::byte> ref, const TuningSpec& ts,
                                            int64_t reduction = 0);

 private:
  Parts p_;
};

}  // namespace kiln
