// What cuDNN's attention choice (cudnn.cpp) asks of kiln's driver side: kept apart
// from cudnn.cpp, which sees the CUDA headers cuDNN's frontend needs and not kiln's
// own driver declarations.
#include <string>

#include "backends/cuda/cuda_api.hpp"
#include "backends/cuda/cuda_libraries.hpp"

namespace kiln::cuda {

void* default_stream() { return per_thread_stream(); }

bool stream_capturing(void* stream) {
  std::string why;
  const Driver* d = Driver::get(&why);
  if (!d) return false;
  int status = 0;
  unsigned long long id = 0;
  CUgraph g = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t n = 0;
  return d->capture_info(static_cast<CUstream>(stream), &status, &id, &g, &deps, &n) == CUDA_SUCCESS && status != 0;
}

std::string toolkit_library_dir() {
  std::string why;
  const Nvrtc* nv = Nvrtc::get(&why);
  if (!nv || nv->path.empty()) return "";
  const size_t slash = nv->path.rfind('/');
  return slash == std::string::npos ? "" : nv->path.substr(0, slash);
}

}  // namespace kiln::cuda
