#include "kiln/memory_plan.hpp"

#include <algorithm>

namespace kiln {

MemoryPlan plan_memory(const std::vector<int64_t>& bytes, const std::vector<std::pair<int, int>>& live, int64_t align) {
  MemoryPlan plan;
  const size_t n = bytes.size();
  plan.bytes = bytes;
  plan.offset.assign(n, 0);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<size_t> placed;
  auto up = [&](int64_t x) { return (x + align - 1) / align * align; };
  for (size_t i : order) {
    plan.sum += bytes[i];
    // The address ranges of placed buffers whose lives overlap this one's, by start.
    std::vector<std::pair<int64_t, int64_t>> taken;
    for (size_t j : placed)
      if (!(live[j].second < live[i].first || live[i].second < live[j].first))
        taken.push_back({plan.offset[j], plan.offset[j] + bytes[j]});
    std::sort(taken.begin(), taken.end());
    int64_t at = 0;
    for (const auto& [b, e] : taken) {
      if (at + bytes[i] <= b) break;  // fits in the gap before this range
      at = std::max(at, up(e));
    }
    plan.offset[i] = at;
    plan.arena = std::max(plan.arena, at + bytes[i]);
    placed.push_back(i);
  }
  plan.arena = up(plan.arena);
  return plan;
}

}  // namespace kiln
