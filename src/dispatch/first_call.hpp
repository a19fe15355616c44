// The first safe choice of a call that can run it (KILN_FIRST_CALL=swap and
// serve): shared by Kernel and MultiKernel. See docs/dispatch.md.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kiln/ext/tuner.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

// Walks safe_choices() for the call: an unproven one is run once in a worker
// first (Runtime::try_config); `load` loads a config (throwing Errc::compile
// or Errc::launch when it cannot) and the loaded kernel must accept the call
// (can_implement). Returns the first that passes, or nullopt with
// `failures` saying why each did not. `libraries`: as safe_choices'.
std::optional<SafeChoice> first_safe_choice(Runtime& rt, const KernelSpec& spec, void* const* params, Stream stream,
                                            bool libraries,
                                            const std::function<const LoadedKernel&(const Config&)>& load,
                                            std::string* failures);

}  // namespace kiln
