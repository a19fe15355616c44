// A surrogate model of a kernel's run time over its config space, for the
// budgeted search: gradient-boosted trees (XGBoost, opened at run time from
// libxgboost, Debian's libxgboost-dev), trained on the configs timed so far
// and asked which of the others to time next.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kiln {

class Surrogate {
 public:
  // An XGBoost model, or nullptr with `why` saying why not (no libxgboost:
  // KILN_XGBOOST_LIB names the library when it is not on the loader's path).
  static std::unique_ptr<Surrogate> make(std::string* why);
  virtual ~Surrogate() = default;
  // Fits rows of `features` (n rows of `cols`) to `targets` (lower is better).
  virtual bool fit(const std::vector<float>& features, size_t cols, const std::vector<float>& targets) = 0;
  // Predictions for rows of `features`; empty on failure.
  virtual std::vector<float> predict(const std::vector<float>& features, size_t cols) = 0;
  virtual std::string name() const = 0;
};

}  // namespace kiln
