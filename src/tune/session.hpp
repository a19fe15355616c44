// One tuning of one key, the steps that touch a config: compile it, time and
// check it against the reference, re-time the fastest side by side. The
// tuner (tuner.cpp) decides which configs go through these steps.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compile/compile_pool.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/ext/tuner.hpp"
#include "tune/benchmarker.hpp"
#include "kiln/ext/call_view.hpp"

namespace kiln {

// The call's inputs, its compiles, the reference's outputs and the adaptive
// deadline of one tuning.
class Session {
 public:
  Session(Tuner::Parts& p, const CallView& call, const TuneOptions& o);

  const CallView& call() const { return call_; }
  const BinaryKeyer& keyer() const { return keyer_; }
  bool show() const { return show_; }
  int64_t peak_device_bytes() const { return peak_device_bytes_; }
  double compile_wait_s() const { return compile_wait_s_; }
  double bench_s() const { return bench_s_; }

  // Submits a config's compile once; later asks get the same future.
  BinaryFuture compile(const Config& c);

  // Compiles (already submitted), benchmarks and checks one config. The
  // first config that runs cleanly gives the reference outputs. Throws for
  // faults that are not the config's.
  ConfigResult evaluate(const Config& c);

  // Runs a config's checking run only, to take its outputs as the reference
  // (its time is already known). False when it did not run cleanly.
  bool check_reference(const Config& c);

  // Re-times configs that ran and agreed, side by side in interleaved rounds
  // (docs/tuning.md); returns the noise of their per-round scores.
  double refine(std::vector<ConfigResult*> contenders, int rounds);

  // The spread (p75 - p25 over the median) of a binary's latest timings.
  double spread_of(const std::string& binary) const;

  bool have_reference() const { return have_ref_; }
  const std::string& reference() const { return reference_; }
  int disagreed() const { return disagreed_; }

 private:
  LaunchDims dims_of(const Config& c) const;
  // (A library choice is given the ceiling: its first call may load the library in the worker
  // and build a plan for the shape, cuDNN's graph taking up to about a second, which the
  // adaptive deadline, made for configs of kiln's own that may hang, would cut.)
  double deadline_s(const Config& c) const;
  std::string deadline_why(double d, const Config& c) const;
  BenchResult bench(const Config& c, const BenchSettings& st, double* wall_s);
  // Why a compiled config cannot run this call ("" when it can); fills
  // r.detail with a library choice's description.
  std::optional<ConfigResult> refuse(const Config& c, const Binary& bin, ConfigResult& r);
  std::optional<std::string> unwritten(const BenchResult& res) const;
  void take_reference(const Config& c);
  std::optional<std::string> disagrees() const;

  Tuner::Parts& p_;
  const CallView& call_;
  BenchInputs inputs_;
  BinaryKeyer keyer_;
  bool show_;
  std::map<std::string, BinaryFuture> futures_;
  std::map<std::string, std::vector<double>> samples_;
  bool have_ref_ = false;
  std::vector<std::vector<std::byte>> ref_;
  std::string reference_;
  int disagreed_ = 0;
  std::optional<double> fastest_wall_s_;
  int64_t peak_device_bytes_ = 0;
  double compile_wait_s_ = 0, bench_s_ = 0;
};

// What a tuning re-times side by side: the configs within 15% of the fastest
// by median and of the best by minimum, at most kMaxContenders.
constexpr size_t kMaxContenders = 6;
std::vector<ConfigResult*> contenders_of(std::vector<ConfigResult*> ok);

// Re-times the contenders side by side (Session::refine); a re-timing whose
// noise passes `bound` is taken again, twice at most, and the quietest is
// kept. Returns its noise.
double retime(Session& s, const std::vector<ConfigResult*>& contenders, double bound);

}  // namespace kiln
