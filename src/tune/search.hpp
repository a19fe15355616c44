// Search strategies: which configs a tuning evaluates, and in what order.
// The tuner asks a strategy for the next batch, evaluates it (reusing any
// result a record already holds), and asks again until the strategy has no
// more or the budget is spent.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/spec.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

// What a strategy sees.
struct SearchState {
  const ConfigSpace& space;
  const std::vector<size_t>& runnable;  // space indices that can run for this call, in space order
  // The result of space index i, if it has been evaluated (now or before); null otherwise.
  std::function<const ConfigResult*(size_t)> result;
  size_t budget_left;  // evaluations the tuning may still make
};

class SearchStrategy {
 public:
  virtual ~SearchStrategy() = default;
  virtual SearchMethod method() const = 0;
  // The next space indices to evaluate (only runnable ones); empty when done.
  virtual std::vector<size_t> next(const SearchState& s) = 0;
  // Where the search started and why, for the record ("" when it does not say).
  virtual std::string start() const { return ""; }
};

// Every runnable config, in one batch.
std::unique_ptr<SearchStrategy> make_exhaustive_search();

// Coordinate descent: from `start` (or, if it is absent or fails, the first
// runnable config that runs), each round evaluates the neighbours of the
// current config (each param one step up or down its value list) and moves
// to the fastest if it is at least 1% faster; it stops when none is.
std::unique_ptr<SearchStrategy> make_coordesc_search(std::optional<size_t> start, std::string why);

}  // namespace kiln
