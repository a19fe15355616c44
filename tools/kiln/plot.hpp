// Pictures of searches: the best time found so far against configs timed,
// drawn with PLplot (a plotting library) into a PNG.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::cli {

// One search, in the order it timed its configs: each config's time in ns,
// NaN where it failed.
struct SearchCurve {
  std::string label;
  std::vector<double> ns;
  size_t runnable = 0;  // configs the search could have timed
};

// The curve of one `kiln tune --json` object: a budgeted or coordinate
// search in the order it timed (its "evaluated" list, times from its
// configs); a whole exhaustive one over every runnable config in the
// record's order (space order; an exhaustive tuning times its library
// choices and reference first).
SearchCurve curve_of_tuning(const nlohmann::ordered_json& tune_json, const std::string& label_prefix = "");

// Whether this kiln can draw (built with PLplot, and its cairo driver is
// there); `why` says why not.
bool can_plot(std::string* why);

// Draws best-so-far / best-of-all (the least time over every curve) against
// configs timed (log scale), one line per curve, with a dashed line at 1.02x
// and one at a fifth of the runnable configs. Throws Error when it cannot.
void plot_search(const std::filesystem::path& png, const std::string& title, const std::vector<SearchCurve>& curves);

}  // namespace kiln::cli
