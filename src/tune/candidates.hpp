// The prune step of a tuning: which of a spec's candidates (its space's
// configs, then its library choices) can run a call, and which already have
// a result in the key's record.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ext/binary_key.hpp"
#include "kiln/ext/call_view.hpp"
#include "kiln/ext/tuner.hpp"

namespace kiln {

// The candidates of a tuning: the space's configs (index i < space size),
// then the spec's library choices (index space size + k).
Config candidate(const KernelSpec& spec, size_t i);

struct Candidates {
  std::vector<size_t> runnable;            // space indices
  std::vector<size_t> libraries;           // candidate indices of library choices that are available
  std::vector<std::string> pruned;         // per candidate: why not ("" if runnable)
  std::vector<bool> unavailable;           // per candidate: a library choice that cannot be made here
  std::map<size_t, ConfigResult> reused;   // candidate index -> a result from the record
};

// Prunes the candidates that cannot run `call` and takes the results `rec`
// holds for the others (by binary key, through `keyer`; none without one).
Candidates prune(const CallView& call, const std::optional<TuningRecord>& rec, const BinaryKeyer* keyer,
                 Backend& backend);

// Whether a record already answers: every candidate the search would
// evaluate has a result in it.
bool complete(const Candidates& p, const TuningRecord& rec, const KernelSpec& spec, SearchKind wanted);

}  // namespace kiln
