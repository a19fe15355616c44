#include "kiln/plan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/hash.hpp"
#include "tune/record_io.hpp"

namespace kiln {

using nlohmann::json;

namespace {

// A config read back: a point of the spec's current space, or one of its library choices.
std::optional<Config> config_from(const json& j, const KernelSpec& spec) {
  if (!j.is_object()) return std::nullopt;
  Config c;
  if (j.contains("library")) {
    if (!j["library"].is_string() || j.size() != 1) return std::nullopt;
    c.library = j["library"].get<std::string>();
    if (std::find(spec.libraries.begin(), spec.libraries.end(), c.library) == spec.libraries.end()) return std::nullopt;
    return c;
  }
  for (const auto& p : spec.space.params) {
    if (!j.contains(p.name) || !j[p.name].is_number_integer()) return std::nullopt;
    c.values.push_back({p.name, j[p.name].get<int64_t>()});
  }
  if (j.size() != spec.space.params.size() || !spec.space.index_of(c)) return std::nullopt;
  return c;
}

constexpr std::string_view kMagic = "kiln-dispatch-plan";

}  // namespace

TuningKey plan_base_key(const KernelSpec& spec, Backend& backend) {
  std::vector<std::pair<std::string, int64_t>> values;
  for (const auto& k : spec.tuning.key) values.push_back({k, 0});
  return make_tuning_key(spec, backend, std::move(values));
}

std::vector<size_t> DispatchPlan::by_distance(const std::vector<int64_t>& key) const {
  std::vector<std::vector<int64_t>> values;
  for (const auto& p : points) values.push_back(p.values);
  return by_log2_distance(values, key);
}

std::optional<Config> DispatchPlan::pick(const KernelSpec& spec, const std::vector<int64_t>& values,
                                         const int64_t* slots, const LaunchLimits& limits) const {
  std::vector<size_t> order = by_distance(values);
  if (order.size() > kNeighbours) order.resize(kNeighbours);
  std::optional<Config> best;
  double best_score = INFINITY;
  auto score_range = [&](size_t from, size_t to) {
    for (size_t c = from; c < to; ++c) {
      if (!Tuner::why_not(spec, configs[c], slots, limits).empty()) continue;
      double sum = 0, weights = 0;
      for (size_t i : order) {
        const Point& p = points[i];
        double d = log2_distance(values, p.values);
        double w = 1.0 / ((0.5 + d) * (0.5 + d));  // inverse-distance weights, squared
        double t = c < p.ns.size() ? p.ns[c] : 0;
        // A config that failed or was not timed there counts as 4 times the best.
        double r = t > 0 && p.best_ns > 0 ? t / p.best_ns : 4.0;
        sum += w * std::log(r);
        weights += w;
      }
      double score = weights > 0 ? sum / weights : 0;
      // Ties (within 1e-9) go to the config the nearest point was given.
      bool nearest_own = !order.empty() && points[order.front()].config == c;
      if (score < best_score - 1e-9 || (std::abs(score - best_score) <= 1e-9 && nearest_own)) {
        best = configs[c];
        best_score = score;
      }
    }
  };
  score_range(0, std::min(kept, configs.size()));
  if (!best) score_range(kept, configs.size());  // no kept config can run it: the fallback pool
  return best;
}

DispatchPlan build_plan(const KernelSpec& spec, const TuningKey& base, const std::vector<TuningRecord>& records,
                        double slack, int max_configs) {
  DispatchPlan plan;
  plan.kernel = spec.name;
  plan.base = base;
  plan.slack = slack;
  plan.max_configs = max_configs;
  plan.when = utc_now();
  plan.kiln_version = kiln_version();
  // The time matrix: t[config][shape], configs by their text.
  std::map<std::string, Config> configs;
  std::map<std::string, std::vector<double>> t;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> best(records.size(), inf);
  for (size_t s = 0; s < records.size(); ++s)
    for (const ConfigResult* r : records[s].ranked()) {
      const Config& c = r->config;
      bool current = c.library.empty()
                         ? spec.space.index_of(c).has_value()
                         : std::find(spec.libraries.begin(), spec.libraries.end(), c.library) != spec.libraries.end();
      if (!current) continue;
      std::string name = c.str();
      configs.emplace(name, c);
      auto& row = t[name];
      row.resize(records.size(), inf);
      row[s] = *r->ns;
      best[s] = std::min(best[s], *r->ns);
    }
  for (auto& [n, row] : t) row.resize(records.size(), inf);
  // Greedy cover: each step keeps the config that brings the most uncovered
  // shapes within slack of their best; ties go to the one whose kept set is
  // fastest over all shapes (geometric mean of time / best).
  std::vector<std::string> kept;
  std::vector<bool> covered(records.size(), false);
  for (size_t s = 0; s < records.size(); ++s)
    if (best[s] == inf) covered[s] = true;  // nothing ran there: nothing to cover
  auto geo = [&](const std::vector<std::string>& set) {
    double sum = 0;
    int n = 0;
    for (size_t s = 0; s < records.size(); ++s) {
      if (best[s] == inf) continue;
      double m = inf;
      for (const auto& c : set) m = std::min(m, t[c][s]);
      sum += std::log(std::min(m / best[s], 1e6));
      ++n;
    }
    return n ? std::exp(sum / n) : 1.0;
  };
  while (static_cast<int>(kept.size()) < max_configs) {
    std::string pick;
    int pick_gain = 0;
    double pick_geo = inf;
    for (const auto& [name, row] : t) {
      if (std::find(kept.begin(), kept.end(), name) != kept.end()) continue;
      int gain = 0;
      for (size_t s = 0; s < records.size(); ++s)
        if (!covered[s] && row[s] <= slack * best[s]) ++gain;
      if (gain == 0) continue;
      std::vector<std::string> with = kept;
      with.push_back(name);
      double g = geo(with);
      if (gain > pick_gain || (gain == pick_gain && g < pick_geo)) {
        pick = name;
        pick_gain = gain;
        pick_geo = g;
      }
    }
    if (pick.empty()) break;  // everything covered (or nothing more can be)
    kept.push_back(pick);
    for (size_t s = 0; s < records.size(); ++s)
      if (t[pick][s] <= slack * best[s]) covered[s] = true;
  }
  // The fallback pool: the fastest of the others over all training shapes.
  std::vector<std::pair<double, std::string>> others;
  for (const auto& [name, row] : t)
    if (std::find(kept.begin(), kept.end(), name) == kept.end()) others.push_back({geo({name}), name});
  std::stable_sort(others.begin(), others.end());
  std::vector<std::string> all = kept;
  for (size_t i = 0; i < others.size() && i < DispatchPlan::kFallbacks; ++i) all.push_back(others[i].second);
  for (const auto& name : all) plan.configs.push_back(configs.at(name));
  plan.kept = kept.size();
  for (size_t s = 0; s < records.size(); ++s) {
    DispatchPlan::Point p;
    for (const auto& [n, v] : records[s].key.values) p.values.push_back(v);
    p.best_ns = best[s] == inf ? 0 : best[s];
    double m = inf;
    for (size_t i = 0; i < kept.size(); ++i)
      if (t[kept[i]][s] < m) {
        m = t[kept[i]][s];
        p.config = i;
      }
    if (kept.empty() || m == inf) continue;  // no kept config ran here: not a point
    p.pick_ns = m;
    for (const auto& name : all) p.ns.push_back(t[name][s] == inf ? 0 : t[name][s]);
    if (!covered[s] || m > slack * best[s]) plan.uncovered.push_back(records[s].key.values_text());
    plan.points.push_back(std::move(p));
  }
  return plan;
}

std::string plan_to_text(const DispatchPlan& p) {
  json configs = json::array(), points = json::array(), names = json::array();
  for (const auto& c : p.configs) configs.push_back(config_json(c));
  for (const auto& pt : p.points)
    points.push_back({{"values", pt.values}, {"config", pt.config}, {"best_ns", pt.best_ns}, {"pick_ns", pt.pick_ns},
                      {"ns", pt.ns}});
  for (const auto& [n, v] : p.base.values) names.push_back(n);
  json j = {{"format", DispatchPlan::kFormat},
            {"kiln_version", p.kiln_version},
            {"kernel", p.kernel},
            {"base", p.base.base_hex()},
            {"key_names", names},
            {"slack", p.slack},
            {"max_configs", p.max_configs},
            {"configs", configs},
            {"kept", p.kept},
            {"points", points},
            {"uncovered", p.uncovered},
            {"when", p.when}};
  return checked_text(kMagic, DispatchPlan::kFormat, dump_json(j, 1));
}

std::optional<DispatchPlan> plan_from_text(std::string_view text, const TuningKey& base, const KernelSpec& spec) {
  try {
    std::optional<std::string_view> body = checked_body(text, kMagic, DispatchPlan::kFormat);
    if (!body) return std::nullopt;
    json j = json::parse(*body);
    DispatchPlan p;
    p.kiln_version = j.at("kiln_version").get<std::string>();
    if (!kiln_version_compatible(p.kiln_version)) return std::nullopt;
    if (j.at("base").get<std::string>() != base.base_hex()) return std::nullopt;
    p.kernel = j.at("kernel").get<std::string>();
    p.base = base;
    p.slack = j.at("slack").get<double>();
    p.max_configs = j.at("max_configs").get<int>();
    for (const auto& c : j.at("configs")) {
      auto cfg = config_from(c, spec);
      if (!cfg) return std::nullopt;  // a config the spec no longer has: the plan is stale
      p.configs.push_back(*cfg);
    }
    p.kept = j.at("kept").get<size_t>();
    if (p.kept == 0 || p.kept > p.configs.size()) return std::nullopt;
    for (const auto& pt : j.at("points")) {
      DispatchPlan::Point x;
      x.values = pt.at("values").get<std::vector<int64_t>>();
      x.config = pt.at("config").get<size_t>();
      x.best_ns = pt.at("best_ns").get<double>();
      x.pick_ns = pt.at("pick_ns").get<double>();
      x.ns = pt.at("ns").get<std::vector<double>>();
      if (x.values.size() != spec.tuning.key.size() || x.config >= p.kept || x.ns.size() != p.configs.size())
        return std::nullopt;
      p.points.push_back(std::move(x));
    }
    p.uncovered = j.at("uncovered").get<std::vector<std::string>>();
    p.when = j.at("when").get<std::string>();
    if (p.points.empty() || !(p.slack >= 1)) return std::nullopt;
    return p;
  } catch (const std::exception& e) {
    log::debug("a dispatch plan does not parse: {}", e.what());
    return std::nullopt;
  }
}

}  // namespace kiln
