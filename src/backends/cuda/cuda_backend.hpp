// The cuda backend: CUDA C++ kernels compiled by NVRTC into cubins (in a
// worker process by default, as NVRTC runs inside its caller), loaded
// through the driver's context-independent library API, launched with
// cuLaunchKernel on the caller's stream. NVRTC and libcuda are opened with
// dlopen: where either is missing, the backend says why in every error that
// needs it, and kiln runs CPU-only. Compiling needs no GPU (KILN_CUDA_ARCH).
#pragma once

#include <memory>
#include <optional>
#include <vector>
#include <nlohmann/json.hpp>

#include "kiln/ext/backend.hpp"

namespace kiln {

std::shared_ptr<Backend> make_cuda_backend(const Options& opts);

// The launch metadata of kernel `symbol` read from a cubin, or nullopt when
// the cubin does not hold it (exposed for tests).
std::optional<KernelMeta> cubin_meta(const std::vector<uint8_t>& cubin, const std::string& symbol);

// What `kiln backends` says of the cuda backend here: available or why not,
// the device, the NVRTC and driver versions.
nlohmann::json describe_cuda(const Options& opts);

}  // namespace kiln
