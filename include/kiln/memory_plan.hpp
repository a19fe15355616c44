// Where a program's intermediates live: one arena per shape, planned by
// liveness (Program, and the C++ kiln emit writes).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kiln {

// The intermediates of one shape placed in one arena by liveness: buffers
// whose lives overlap never share bytes; others may.
struct MemoryPlan {
  std::vector<int64_t> offset;  // per buffer, bytes into the arena
  std::vector<int64_t> bytes;   // per buffer
  int64_t arena = 0;            // the arena's size: the peak
  int64_t sum = 0;              // the sizes added up (what one allocation each would take)
};
// `live[i]` = (first step, last step) buffer i is used in; `align`: each
// offset's alignment. Largest buffers are placed first, each at the lowest
// offset that no live-overlapping placed buffer covers.
MemoryPlan plan_memory(const std::vector<int64_t>& bytes, const std::vector<std::pair<int, int>>& live,
                       int64_t align = 256);

}  // namespace kiln
