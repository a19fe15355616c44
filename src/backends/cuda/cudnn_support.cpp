// What cuDNN's attention choice (cudnn.cpp) asks of kiln's driver side: kept apart
// from cudnn.cpp, which sees the CUDA headers cuDNN's frontend needs and not kiln's
// own driver declarations.
#include <string>

#include "backends/cuda/cuda_api.hpp"
#include "backends/cuda/cuda_libraries.hpp"

namespace kiln::cuda {

void* default_stream() { return per_thread_stream(); }

std::string toolkit_library_dir() {
  std::string why;
  const Nvrtc* nv = Nvrtc::get(&why);
  if (!nv || nv->path.empty()) return "";
  const size_t slash = nv->path.rfind('/');
  return slash == std::string::npos ? "" : nv->path.substr(0, slash);
}

}  // namespace kiln::cuda
