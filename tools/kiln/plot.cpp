#include "plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/format.hpp"
#include "kiln/error.hpp"

#ifdef KILN_HAVE_PLPLOT
#include <plplot.h>
#endif

namespace kiln::cli {

namespace {

// A config's identity whatever order its params are written in: its
// "NAME=VALUE" words, sorted ("library:NAME" for a library choice). The
// "evaluated" list holds Config::str() text; "configs" hold params objects.
std::string canonical(std::vector<std::string> words) {
  std::sort(words.begin(), words.end());
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

std::string config_key(const nlohmann::ordered_json& params) {
  if (params.contains("library")) return "library:" + params["library"].get<std::string>();
  std::vector<std::string> words;
  for (const auto& [name, v] : params.items()) words.push_back(name + "=" + std::to_string(v.get<int64_t>()));
  return words.empty() ? "-" : canonical(words);  // Config::str() of a config without params
}

std::string config_key(const std::string& text) {
  std::vector<std::string> words;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    if (end > at) words.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return canonical(words);
}

}  // namespace

SearchCurve curve_of_tuning(const nlohmann::ordered_json& j, const std::string& label_prefix) {
  SearchCurve c;
  const std::string method = j.value("method", "");
  std::map<std::string, double> ns;
  std::vector<double> in_order;
  // Runnable: the space less what was pruned, plus the library choices that
  // can be made (a partial search's record lists only what it timed and
  // what was pruned).
  size_t pruned = 0, libraries = 0;
  for (const auto& cfg : j.at("configs")) {
    const std::string result = cfg.value("result", "");
    const auto& params = cfg.at("params");
    const bool library = params.contains("library");
    if (result == "pruned" || result == "unavailable") {
      pruned += !library;
      continue;
    }
    libraries += library;
    const double t = cfg.contains("ns") && cfg.at("ns").is_number() && result == "ok" ? cfg.at("ns").get<double>() : NAN;
    ns[config_key(params)] = t;
    in_order.push_back(t);
  }
  const size_t space = j.value("space_size", size_t{0});
  // An exhaustive record that its time budget stopped lists only what it timed.
  const bool whole = method == "exhaustive" && j.value("start", "").find("stopped by its time budget") == std::string::npos;
  c.runnable = whole || space < pruned ? in_order.size() : space - pruned + libraries;
  if (whole) {
    c.ns = std::move(in_order);
  } else {
    for (const auto& e : j.value("evaluated", nlohmann::ordered_json::array())) {
      auto it = ns.find(config_key(e.get<std::string>()));
      c.ns.push_back(it == ns.end() ? NAN : it->second);
    }
  }
  c.label = fmt::format("{}{}, {} of {} timed", label_prefix, method, c.ns.size(), c.runnable);
  return c;
}

#ifdef KILN_HAVE_PLPLOT

bool can_plot(std::string* why) {
  // PLplot fills arrays the caller gives, of the size it passes in.
  std::vector<const char*> menus(128), names(128);
  PLINT n = static_cast<PLINT>(names.size());
  const char** m = menus.data();
  const char** d = names.data();
  plgDevs(&m, &d, &n);
  bool found = false;
  for (PLINT i = 0; i < n && i < static_cast<PLINT>(names.size()); ++i)
    found = found || (d[i] && std::string(d[i]) == "pngcairo");
  if (!found && why)
    *why = "PLplot has no pngcairo driver here (install plplot-driver-cairo, or the driver folder PLPLOT_DRV_DIR names)";
  return found;
}

void plot_search(const std::filesystem::path& png, const std::string& title, const std::vector<SearchCurve>& curves) {
  std::string why;
  if (!can_plot(&why)) fail(Errc::usage, "cannot draw {}: {}", png.string(), why);
  double best = INFINITY;
  size_t longest = 1, runnable = 0;
  for (const auto& c : curves) {
    for (double t : c.ns)
      if (std::isfinite(t)) best = std::min(best, t);
    longest = std::max(longest, c.ns.size());
    runnable = std::max(runnable, c.runnable);
  }
  if (!std::isfinite(best)) fail(Errc::usage, "cannot draw {}: no config in the searches ran", png.string());
  // PLplot reports a file it cannot open by exiting; find out first.
  if (FILE* f = std::fopen(png.c_str(), "wb")) std::fclose(f);
  else fail(Errc::io, "cannot write {}", png.string());

  // Each curve: log10(configs timed) against best so far / best of all,
  // from the first config that ran.
  std::vector<std::vector<PLFLT>> xs(curves.size()), ys(curves.size());
  double top = 1.1;
  for (size_t k = 0; k < curves.size(); ++k) {
    double so_far = INFINITY;
    for (size_t i = 0; i < curves[k].ns.size(); ++i) {
      if (std::isfinite(curves[k].ns[i])) so_far = std::min(so_far, curves[k].ns[i]);
      if (!std::isfinite(so_far)) continue;
      xs[k].push_back(std::log10(static_cast<double>(i + 1)));
      ys[k].push_back(so_far / best);
      top = std::max(top, so_far / best);
    }
  }
  top = std::min(top, 3.0);  // worse than 3x is off the picture's top
  top = 0.98 + (top - 0.98) * 1.45;  // and room above the curves for the legend
  const double right = std::log10(static_cast<double>(longest)) + 0.05;

  plsdev("pngcairo");
  plsfnam(png.c_str());
  plspage(0, 0, 1000, 620, 0, 0);
  plscolbg(255, 255, 255);
  plscol0(15, 0, 0, 0);         // axes and text
  plscol0(1, 31, 119, 180);     // curves
  plscol0(2, 214, 39, 40);
  plscol0(3, 44, 160, 44);
  plscol0(4, 148, 103, 189);
  plscol0(5, 255, 127, 14);
  plscol0(6, 120, 120, 120);    // guides
  plinit();
  plschr(0, 1.1);
  plcol0(15);
  plenv(0, right, 0.98, top, 0, 10);  // 10: a logarithmic x axis
  pllab("configs timed", "best so far / best of all", title.c_str());

  plcol0(6);
  pllsty(2);
  PLFLT gx[2] = {0, right}, gy[2] = {1.02, 1.02};
  plline(2, gx, gy);
  if (runnable >= 5) {
    PLFLT vx[2], vy[2] = {0.98, top};
    vx[0] = vx[1] = std::log10(static_cast<double>(runnable) / 5);
    plline(2, vx, vy);
  }
  pllsty(1);

  std::vector<PLINT> opts, colors, styles, sym_colors, sym_numbers;
  std::vector<PLFLT> widths, sym_scales;
  std::vector<std::string> labels;
  std::vector<const char*> texts, symbols;
  for (size_t k = 0; k < curves.size(); ++k) {
    const PLINT color = static_cast<PLINT>(1 + k % 5);
    plcol0(color);
    plwidth(2.0);
    if (xs[k].size() == 1) {
      plpoin(1, xs[k].data(), ys[k].data(), 2);
    } else if (!xs[k].empty()) {
      plline(static_cast<PLINT>(xs[k].size()), xs[k].data(), ys[k].data());
    }
    labels.push_back(ys[k].empty() ? curves[k].label + ", no config ran"
                                   : fmt::format("{}, reached {:.3f}x", curves[k].label, ys[k].back()));
    opts.push_back(PL_LEGEND_LINE);
    colors.push_back(color);
    styles.push_back(1);
    widths.push_back(2.0);
    sym_colors.push_back(color);
    sym_scales.push_back(1.0);
    sym_numbers.push_back(1);
    symbols.push_back("");
  }
  labels.push_back("guides: 1.02x the best; a fifth of the runnable configs");
  opts.push_back(PL_LEGEND_LINE);
  colors.push_back(6);
  styles.push_back(2);
  widths.push_back(1.0);
  sym_colors.push_back(6);
  sym_scales.push_back(1.0);
  sym_numbers.push_back(1);
  symbols.push_back("");
  for (const auto& l : labels) texts.push_back(l.c_str());
  std::vector<PLINT> text_colors(labels.size(), 15);
  plwidth(1.0);
  plcol0(15);
  PLFLT lw = 0, lh = 0;
  pllegend(&lw, &lh, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX, PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_INSIDE,
           0.02, 0.02, 0.08, 0, 15, 1, static_cast<PLINT>(labels.size()), 1, static_cast<PLINT>(labels.size()),
           opts.data(), 0.8, 0.7, 2.0, 1.0, text_colors.data(), texts.data(), nullptr, nullptr, nullptr, nullptr,
           colors.data(), styles.data(), widths.data(), sym_colors.data(), sym_scales.data(), sym_numbers.data(),
           symbols.data());
  plend();
}

#else

bool can_plot(std::string* why) {
  if (why) *why = "this kiln was built without PLplot (install libplplot-dev and plplot-driver-cairo, then build again)";
  return false;
}

void plot_search(const std::filesystem::path& png, const std::string&, const std::vector<SearchCurve>&) {
  std::string why;
  can_plot(&why);
  fail(Errc::usage, "cannot draw {}: {}", png.string(), why);
}

#endif

}  // namespace kiln::cli
