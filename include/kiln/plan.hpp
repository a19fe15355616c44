// Dispatch plans: which config runs which shape, chosen from measurements.
//
// `kiln plan` tunes a kernel at training shapes (exhaustively, through the
// usual caches, so each record holds every config's time at its shape),
// then keeps the smallest set of configs (at most max_configs) such that
// every training shape has one within `slack` of its best, and gives each
// training shape the fastest kept config there. A call runs the config of
// the nearest training shape (L1 distance over log2 of the tuning-key
// values; ties go to the larger shape) that can run it: the rule of the
// size-hint multi-kernel, over measured points instead of hand-chosen ones,
// at the same cost per call. docs/plan.md says why this rule.
//
// A plan is stored beside the kernel's tuning records (tune/<base>/plan.pln),
// versioned, checksummed and keyed like them, and travels in packed artifacts.
//
// Thread-safety: DispatchPlan is a value; const calls may run concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

class Backend;

struct DispatchPlan {
  static constexpr int kFormat = 1;
  std::string kernel;
  TuningKey base;  // the kernel's key; its values name the tuning key with 0s
  double slack = 1.05;
  int max_configs = 8;
  // The kept set, then (from index `kept` on) a fallback pool: the configs
  // fastest over the training shapes that were not kept (at most 16), used
  // only for a call no kept config can run (a misaligned pointer, a size
  // that breaks a kept config's constraint).
  std::vector<Config> configs;
  size_t kept = 0;
  static constexpr size_t kFallbacks = 16;
  struct Point {
    std::vector<int64_t> values;  // a training shape, in key order
    size_t config = 0;            // index into configs: the fastest kept one here
    double best_ns = 0;           // the fastest of all configs here
    double pick_ns = 0;           // the kept config's time here
    std::vector<double> ns;       // each config's time here (0: it failed or was not timed)
  };
  static constexpr size_t kNeighbours = 4;
  std::vector<Point> points;
  std::vector<std::string> uncovered;  // training shapes with no kept config within slack
  std::string when, kiln_version;

  // The config for a call (`values`: its tuning-key values; `slots`: its
  // integer scalars), by the rule above; nullopt when no kept config can run it.
  std::optional<Config> pick(const KernelSpec& spec, const std::vector<int64_t>& values, const int64_t* slots,
                             const LaunchLimits& limits) const;
  // Training points by distance from `values` (the handle's rule).
  std::vector<size_t> by_distance(const std::vector<int64_t>& values) const;
};

// Builds a plan from one record per training shape (each should hold every
// config's time at its shape). Configs not in `spec`'s space now, and
// library choices `spec` no longer names, are left out.
DispatchPlan build_plan(const KernelSpec& spec, const TuningKey& base, const std::vector<TuningRecord>& records,
                        double slack, int max_configs);

// Checksummed text and back; plan_from_text returns nullopt for a plan that
// does not validate against `base` and `spec` (checksum, format, kiln
// version, key, every config a point of the spec's current space).
std::string plan_to_text(const DispatchPlan& p);
std::optional<DispatchPlan> plan_from_text(std::string_view text, const TuningKey& base, const KernelSpec& spec);

// The kernel's base key (tuning-key names with zero values), for plans.
TuningKey plan_base_key(const KernelSpec& spec, Backend& backend);

}  // namespace kiln
