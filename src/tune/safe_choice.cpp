// Safe choices: what a call with no tuning record of its own runs while
// (or instead of) tuning. See safe_choices in kiln/ext/tuner.hpp.
#include <algorithm>
#include <cmath>
#include <set>

#include "core/format.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/tuner.hpp"
#include "tune/record_io.hpp"

namespace kiln {

std::vector<SafeChoice> safe_choices(const KernelSpec& spec, void* const* params, Backend& backend,
                                     const TuningCache* cache, bool libraries) {
  return safe_choices(CallView(spec, backend, params), backend, cache, libraries);
}

std::vector<SafeChoice> safe_choices(const CallView& call, Backend& backend, const TuningCache* cache,
                                     bool libraries) {
  const KernelSpec& spec = call.spec;
  const int64_t* slots = call.slot_data();
  const LaunchLimits& limits = call.limits;
  std::vector<SafeChoice> out;
  std::set<std::string> seen, failed_nearby;
  // A library that builds a plan per shape is no choice for a bucket of many values (a call in
  // it while it is tuned would build one each new value).
  const bool per_shape_refused = !Tuner::bucket_refusal(spec, slots).empty();
  auto fits = [&](const std::string& lib) { return !per_shape_refused || !backend.library_plans_per_shape(lib); };
  auto add = [&](const Config& c, std::string how, bool proven = false) {
    const std::string text = c.str();
    if (seen.count(text) || failed_nearby.count(text)) return;
    if (!c.library.empty()) {
      if (!libraries || !fits(c.library)) return;
      if (std::find(spec.libraries.begin(), spec.libraries.end(), c.library) == spec.libraries.end()) return;
    } else if (!spec.space.index_of(c) || !Tuner::why_not(spec, c, slots, limits).empty()) {
      return;
    }
    seen.insert(text);
    out.push_back({c, std::move(how), proven || !c.library.empty()});
  };

  // 1. The nearest tuned keys' choices.
  if (cache) {
    const TuningKey& key = call.key;
    std::vector<std::pair<double, TuningRecord>> near;
    for (auto& r : cache->all(key)) {
      if (!r.best || r.key.values.size() != key.values.size() || r.key.values == key.values) continue;
      near.emplace_back(log2_distance(key.values, r.key.values), std::move(r));
    }
    std::stable_sort(near.begin(), near.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    // A config that failed at the nearest keys is not trusted here either.
    for (size_t i = 0; i < near.size() && i < 4; ++i)
      for (const auto& c : near[i].second.configs)
        if (c.kind == FailKind::crash || c.kind == FailKind::wrong || c.kind == FailKind::timeout ||
            c.kind == FailKind::launch)
          failed_nearby.insert(c.config.str());
    for (size_t i = 0; i < near.size() && out.size() < 3; ++i)
      if (auto c = Tuner::choose(near[i].second, spec, slots, limits, Tuner::plans_per_shape_of(backend)))
        add(*c, fmt::format("the choice of the nearest tuned key {}", near[i].second.key.values_text()), true);
  }
  // 2. A library choice: nothing to compile, nothing to check first (it is
  // what a tuning trusts), so the first result comes soonest.
  for (const auto& lib : spec.libraries)
    if (fits(lib) && backend.library_unavailable(lib).empty()) {
      Config c;
      c.library = lib;
      add(c, "the spec's library choice (nothing to compile)");
      break;
    }
  // 3. The spec's default, then the cheap rule: the template that fills the device with the fewest programs.
  if (spec.tuning.default_config) add(*spec.tuning.default_config, "the spec's default config");
  const int64_t units = std::max<int64_t>(1, backend.device().info().multiprocessors);
  std::optional<size_t> pick;
  int64_t pick_programs = 0;
  for (size_t i = 0; i < spec.space.size(); ++i) {
    const Config c = spec.space.at(i);
    if (!statically_pruned(spec, c, limits).empty() || !Tuner::why_not(spec, c, slots, limits).empty()) continue;
    int64_t programs = 0;
    try {
      programs = LaunchPlan(spec, c, limits).eval(slots).grid.total();
    } catch (const Error&) {
      continue;
    }
    const bool fills = programs >= units, pick_fills = pick_programs >= units;
    bool better = !pick || (fills && !pick_fills) || (fills && pick_fills && programs < pick_programs) ||
                  (!fills && !pick_fills && programs > pick_programs);
    if (better) pick = i, pick_programs = programs;
  }
  if (pick)
    add(spec.space.at(*pick), fmt::format("the cheap rule: the config that fills the device's {} units with the "
                                          "fewest programs ({})",
                                          units, pick_programs));
  // 4. Anything that can run it.
  for (size_t i = 0; i < spec.space.size() && out.size() < 8; ++i)
    add(spec.space.at(i), "the first config that can run it");
  return out;
}

}  // namespace kiln
