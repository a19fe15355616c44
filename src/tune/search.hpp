// Search strategies: which configs a tuning evaluates, and in what order.
// The tuner asks a strategy for the next batch, evaluates it (reusing any
// result a record already holds), and asks again until the strategy has no
// more or the budget is spent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/spec.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

struct CallView;
class TuningCache;

// What a strategy sees.
struct SearchState {
  const ConfigSpace& space;
  const std::vector<size_t>& runnable;  // space indices that can run for this call, in space order
  // The result of space index i, if it has been evaluated (now or before); null otherwise.
  std::function<const ConfigResult*(size_t)> result;
  size_t budget_left;  // evaluations the tuning may still make
  double seconds_left = 1e300;  // the tuning's time budget left (--budget-seconds); 1e300: none
};

class SearchStrategy {
 public:
  virtual ~SearchStrategy() = default;
  virtual SearchMethod method() const = 0;
  // The next space indices to evaluate (only runnable ones); empty when done.
  virtual std::vector<size_t> next(const SearchState& s) = 0;
  // Configs (evaluated, runnable) to time again side by side, in interleaved
  // rounds, before the strategy is asked for its next batch once more: asked
  // when next() has nothing left. A strategy that compares configs timed at
  // different moments asks this before it stops, so drift that fell between
  // those moments (a busy machine) is not taken for a difference.
  virtual std::vector<size_t> confirm(const SearchState&) { return {}; }
  // Where the search started and why, for the record ("" when it does not say).
  virtual std::string start() const { return ""; }
};

// Every runnable config: in one batch, or, under a time budget
// (SearchState::seconds_left), in batches until the budget is spent; what
// was timed is kept, and tuning again times the rest.
std::unique_ptr<SearchStrategy> make_exhaustive_search();

// Coordinate descent: from `start` (or, if it is absent or fails, the first
// runnable config that runs), each round evaluates the neighbours of the
// current config (each param one step up or down its value list) and moves
// to the fastest not yet stood on if it is at least 1% faster by its median
// or, failing that, by its minimum. Where none is, it asks (once per config
// it stands on) to re-time the current config beside its neighbours in
// interleaved rounds, and stops if none is faster after that either.
std::unique_ptr<SearchStrategy> make_coordesc_search(std::optional<size_t> start, std::string why);

// Budgeted search over n runnable configs, in rounds of n/256 (at least 8):
// first a seeded sample (the start config, if any, and random others), then
// rounds of a quarter untimed neighbours of the best so far, then the
// configs a surrogate model (gradient-boosted trees, XGBoost, fitted to log
// time over the configs timed so far; params as log2 features; a failed
// config counts as 4 times the slowest that ran) predicts fastest, and 1
// drawn at random. It stops when the time budget or the evaluation cap is
// spent (the first sample is timed even where the time budget is spent
// already, so a tiny budget still answers), or, with `until_settled`, once
// n/32 configs (at least two rounds) in a row have not improved the best by
// 1%. Without XGBoost the rounds are random draws (its start() says so).
std::unique_ptr<SearchStrategy> make_budgeted_search(std::optional<size_t> start, uint64_t seed, bool until_settled);

// The strategy of one tuning of `call`. `pruned`: per candidate, why it
// cannot run the call ("" when it can). A budgeted search starts from the
// spec's default config; coordinate descent from the spec's default config,
// else (absent, or it cannot run the call) from the choice of the nearest
// cached key (L1 over log2 of the key values) that can. `settle`: a
// budgeted search stops once it settles.
std::unique_ptr<SearchStrategy> make_search(SearchKind kind, bool settle, const CallView& call,
                                            const std::vector<std::string>& pruned, TuningCache* cache);

}  // namespace kiln
