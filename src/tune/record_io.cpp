#include "tune/record_io.hpp"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "core/format.hpp"
#include "kiln/hash.hpp"

namespace kiln {

std::string checked_text(std::string_view magic, int version, std::string_view body) {
  return fmt::format("{} {} {:016x} {}\n", magic, version, hash64(body.data(), body.size()), body.size()) +
         std::string(body);
}

std::optional<std::string_view> checked_body(std::string_view text, std::string_view magic, int version) {
  size_t eol = text.find('\n');
  if (eol == std::string_view::npos || eol > 200) return std::nullopt;
  std::string head(text.substr(0, eol));
  std::string_view body = text.substr(eol + 1);
  char m[64] = {};
  int v = 0;
  unsigned long long sum = 0, len = 0;
  if (std::sscanf(head.c_str(), "%63s %d %16llx %llu", m, &v, &sum, &len) != 4) return std::nullopt;
  if (magic != m || v != version || len != body.size() || hash64(body.data(), body.size()) != sum) return std::nullopt;
  return body;
}

nlohmann::json config_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, v] : c.values) j[n] = v;
  if (!c.library.empty()) j["library"] = c.library;
  return j;
}

std::vector<size_t> by_log2_distance(const std::vector<std::vector<int64_t>>& points, const std::vector<int64_t>& key) {
  std::vector<std::tuple<double, double, size_t>> d;
  for (size_t i = 0; i < points.size(); ++i) {
    double size = 0;
    for (size_t k = 0; k < key.size() && k < points[i].size(); ++k) size += log2_of(points[i][k]);
    d.push_back({std::round(log2_distance(key, points[i]) * 1e9) / 1e9, -size, points.size() - i});
  }
  std::sort(d.begin(), d.end());
  std::vector<size_t> out;
  for (const auto& [dist, size, rev] : d) out.push_back(points.size() - rev);
  return out;
}

}  // namespace kiln
