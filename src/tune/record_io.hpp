// What tuning records and dispatch plans share on disk and in their rules:
// the checksummed text form, a config as JSON, and log2 distance between
// tuning-key values.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

// "<magic> <version> <xxh3-64 of body, hex> <bytes>\n<body>".
std::string checked_text(std::string_view magic, int version, std::string_view body);
// The body of a checked text, or nullopt when the header, version, length or checksum is wrong.
std::optional<std::string_view> checked_body(std::string_view text, std::string_view magic, int version);

// "no config can run this call (reason; ...)": each configs' reason (a stage's "pruned: " prefix
// left out) said once, the first three and a count of the rest.
std::string no_config_can_run(const std::vector<std::string>& reasons);

// A config's params (and library name) as a JSON object.
nlohmann::json config_json(const Config& c);

inline double log2_of(int64_t v) { return std::log2(static_cast<double>(v < 1 ? 1 : v)); }

// L1 distance over log2 of key values (paired in order).
inline double log2_distance(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += std::abs(log2_of(a[i]) - log2_of(b[i]));
  return d;
}
inline double log2_distance(const std::vector<std::pair<std::string, int64_t>>& a,
                            const std::vector<std::pair<std::string, int64_t>>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += std::abs(log2_of(a[i].second) - log2_of(b[i].second));
  return d;
}

// Indices of `points` by log2 distance from `key`, nearest first; ties go
// to the larger point (the larger sum of log2 values), then the later one.
std::vector<size_t> by_log2_distance(const std::vector<std::vector<int64_t>>& points, const std::vector<int64_t>& key);

}  // namespace kiln
