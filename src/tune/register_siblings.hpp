// Pruning before compiling by a sibling's registers ([tuning] registers_by,
// docs/tuning.md): configs that agree on the spec's registers_by params
// use about the same registers per thread, so once one of a class is
// compiled, the others whose block would need more registers than the
// device has are pruned without compiling them.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tune/session.hpp"

namespace kiln {

class RegisterSiblings {
 public:
  struct Batch {
    std::vector<size_t> kept;                             // the configs compiled, in order
    std::vector<BinaryFuture> futures;                    // theirs, in the same order
    std::vector<std::pair<size_t, ConfigResult>> pruned;  // the others, with why
  };

  // Submits the compiles of `todo` (candidate indices; `config_of` gives
  // each one's config): first one config of each class whose registers are
  // not known yet, waiting for those; then the rest that their class's
  // registers do not rule out.
  Batch compile(const std::vector<size_t>& todo, const std::function<Config(size_t)>& config_of, Session& s,
                Backend& backend, const std::string& label);

  size_t pruned() const { return pruned_; }

 private:
  std::map<std::string, std::pair<int, std::string>> known_;  // class -> registers, the config compiled
  size_t pruned_ = 0;
};

}  // namespace kiln
