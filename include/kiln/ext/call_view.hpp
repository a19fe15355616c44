// A call decoded once: its integer scalars, the tuning key they make, the
// backend's launch limits and the length of the sums it checks with. Built
// by the first call of a shape and passed, unchanged, through the tuning,
// the safe choices, the trial run of an unproven config and the copy a
// background tuning works on.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/ext/backend.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

struct CallView {
  // Reads `params` (the call's arguments, as Kernel::launch takes them) for
  // `spec` on `backend`. The spec and params must outlive the view.
  CallView(const KernelSpec& spec, Backend& backend, void* const* params);

  const KernelSpec& spec;
  void* const* params;
  std::vector<int64_t> slots;  // per argument: an integer scalar's value, else 0
  TuningKey key;               // the tuning key of the call (its values: the spec's [tuning] key)
  LaunchLimits limits;         // the backend's
  int64_t reduction = 0;       // the spec's [tuning] reduction for this call; 0: not given

  const int64_t* slot_data() const { return slots.data(); }
  // The same call on other arguments of the same sizes (a copy of its buffers).
  CallView on(void* const* other) const {
    CallView v = *this;
    v.params = other;
    return v;
  }
};

}  // namespace kiln
