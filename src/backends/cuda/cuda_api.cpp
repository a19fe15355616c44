#include "backends/cuda/cuda_api.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "core/format.hpp"

namespace kiln::cuda {

namespace fs = std::filesystem;

namespace {

// A dlopen'd library. The driver and NVRTC stay loaded for the life of the
// process (their handles live in function-local statics that are never
// destroyed): unloading them while other static destructors may still call
// in is worse than not unloading them.
class Library {
 public:
  explicit Library(void* h) : h_(h) {}
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* get() const { return h_; }

 private:
  void* h_;
};

template <class F>
bool bind(void* lib, F& out, const char* name, std::string* missing) {
  out = reinterpret_cast<F>(::dlsym(lib, name));
  if (!out && missing && missing->empty()) *missing = name;
  return out != nullptr;
}

// Folders where a CUDA toolkit may be: CUDA_HOME, CUDA_PATH, the one nvcc
// is in, /usr/local/cuda.
std::vector<fs::path> toolkit_roots() {
  std::vector<fs::path> out;
  for (const char* v : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* e = std::getenv(v); e && *e) out.push_back(e);
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      fs::path dir = p.substr(start, end - start);
      std::error_code ec;
      if (!dir.empty() && fs::exists(dir / "nvcc", ec)) out.push_back(dir.parent_path());
      start = end + 1;
    }
  }
  out.push_back("/usr/local/cuda");
  return out;
}

}  // namespace

std::string Driver::error_text(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &text);
  if (!name) return fmt::format("CUDA error {}", r);
  return text ? fmt::format("{} ({})", name, text) : std::string(name);
}

const Driver* Driver::get(std::string* why) {
  static std::once_flag once;
  static Driver* driver = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = ::dlerror();
      reason = fmt::format("no CUDA driver: libcuda.so.1 cannot be opened ({}); is the NVIDIA driver installed?",
                           e ? e : "not found");
      return;
    }
    static Library lib(h);
    auto* d = new Driver();
    std::string missing;
    bind(h, d->cuInit, "cuInit", &missing);
    bind(h, d->cuDriverGetVersion, "cuDriverGetVersion", &missing);
    bind(h, d->cuGetErrorName, "cuGetErrorName", &missing);
    bind(h, d->cuGetErrorString, "cuGetErrorString", &missing);
    bind(h, d->cuDeviceGetCount, "cuDeviceGetCount", &missing);
    bind(h, d->cuDeviceGet, "cuDeviceGet", &missing);
    bind(h, d->cuDeviceGetName, "cuDeviceGetName", &missing);
    bind(h, d->cuDeviceGetAttribute, "cuDeviceGetAttribute", &missing);
    bind(h, d->cuDeviceTotalMem, "cuDeviceTotalMem_v2", &missing);
    bind(h, d->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", &missing);
    bind(h, d->cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", &missing);
    bind(h, d->cuCtxSetCurrent, "cuCtxSetCurrent", &missing);
    bind(h, d->cuCtxGetCurrent, "cuCtxGetCurrent", &missing);
    bind(h, d->cuCtxSynchronize, "cuCtxSynchronize", &missing);
    bind(h, d->cuLibraryLoadData, "cuLibraryLoadData", &missing);
    bind(h, d->cuLibraryUnload, "cuLibraryUnload", &missing);
    bind(h, d->cuLibraryGetKernel, "cuLibraryGetKernel", &missing);
    bind(h, d->cuKernelGetAttribute, "cuKernelGetAttribute", &missing);
    bind(h, d->cuKernelSetAttribute, "cuKernelSetAttribute", &missing);
    bind(h, d->cuLaunchKernel, "cuLaunchKernel", &missing);
    bind(h, d->cuLaunchKernelEx, "cuLaunchKernelEx", nullptr);
    bind(h, d->cuMemAlloc, "cuMemAlloc_v2", &missing);
    bind(h, d->cuMemHostAlloc, "cuMemHostAlloc", nullptr);
    bind(h, d->cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", nullptr);
    bind(h, d->cuMemFreeHost, "cuMemFreeHost", nullptr);
    bind(h, d->cuMemFree, "cuMemFree_v2", &missing);
    bind(h, d->cuMemGetAddressRange, "cuMemGetAddressRange_v2", &missing);
    bind(h, d->cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", &missing);
    bind(h, d->cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", &missing);
    bind(h, d->cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", &missing);
    bind(h, d->cuMemsetD8Async, "cuMemsetD8Async", &missing);
    bind(h, d->cuMemsetD16Async, "cuMemsetD16Async", &missing);
    bind(h, d->cuMemsetD32Async, "cuMemsetD32Async", &missing);
    bind(h, d->cuStreamCreate, "cuStreamCreate", &missing);
    bind(h, d->cuStreamDestroy, "cuStreamDestroy_v2", &missing);
    bind(h, d->cuStreamSynchronize, "cuStreamSynchronize", &missing);
    bind(h, d->cuEventCreate, "cuEventCreate", &missing);
    bind(h, d->cuEventDestroy, "cuEventDestroy_v2", &missing);
    bind(h, d->cuEventRecord, "cuEventRecord", &missing);
    bind(h, d->cuEventSynchronize, "cuEventSynchronize", &missing);
    bind(h, d->cuEventElapsedTime, "cuEventElapsedTime_v2", nullptr) ||
        bind(h, d->cuEventElapsedTime, "cuEventElapsedTime", &missing);
    bind(h, d->cuIpcGetMemHandle, "cuIpcGetMemHandle", &missing);
    bind(h, d->cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", &missing);
    bind(h, d->cuIpcCloseMemHandle, "cuIpcCloseMemHandle", &missing);
    bind(h, d->cuStreamBeginCapture, "cuStreamBeginCapture_v2", &missing);
    bind(h, d->cuStreamEndCapture, "cuStreamEndCapture", &missing);
    bind(h, d->cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", nullptr);
    bind(h, d->cuGraphInstantiate, "cuGraphInstantiateWithFlags", &missing);
    bind(h, d->cuGraphLaunch, "cuGraphLaunch", &missing);
    bind(h, d->cuGraphExecDestroy, "cuGraphExecDestroy", &missing);
    bind(h, d->cuGraphDestroy, "cuGraphDestroy", &missing);
    bind(h, d->cuStreamGetCaptureInfo_v3, "cuStreamGetCaptureInfo_v3", nullptr);
    bind(h, d->cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo_v2", nullptr);
    bind(h, d->cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2", nullptr);
    bind(h, d->cuGraphGetNodes, "cuGraphGetNodes", nullptr);
    bind(h, d->cuKernelGetParamInfo, "cuKernelGetParamInfo", nullptr);
    bind(h, d->cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled", &missing);
    if (!missing.empty()) {
      reason = fmt::format("the CUDA driver is too old: libcuda.so.1 lacks {} (kiln needs a driver for CUDA 12.0 "
                           "or newer)",
                           missing);
      return;
    }
    d->cuDriverGetVersion(&d->version);
    if (d->version < 12000) {
      reason = fmt::format("the CUDA driver is too old: it supports CUDA {}.{}, kiln needs 12.0 or newer",
                           d->version / 1000, d->version % 1000 / 10);
      return;
    }
    CUresult r = d->cuInit(0);
    if (r != CUDA_SUCCESS) {
      reason = r == CUDA_ERROR_NO_DEVICE ? "no GPU: the CUDA driver found no device"
               : r == CUDA_ERROR_STUB_LIBRARY
                   ? "no CUDA driver: libcuda.so.1 is the toolkit's stub, not a driver"
                   : "the CUDA driver failed to start: " + d->error_text(r);
      return;
    }
    driver = d;
  });
  if (!driver && why) *why = reason;
  return driver;
}

const Nvrtc* Nvrtc::get(std::string* why) {
  static std::once_flag once;
  static Nvrtc* nvrtc = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    void* h = nullptr;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
      tried.push_back(name);
      if ((h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!h)
      for (const auto& root : toolkit_roots())
        for (const char* name : {"lib64/libnvrtc.so", "lib/libnvrtc.so", "targets/x86_64-linux/lib/libnvrtc.so"}) {
          fs::path p = root / name;
          tried.push_back(p.string());
          if (!h) h = ::dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
        }
    if (!h) {
      reason = fmt::format("no NVRTC: libnvrtc cannot be opened (tried {}); install the CUDA toolkit or set CUDA_HOME",
                           fmt::join(tried, ", "));
      return;
    }
    static Library lib(h);
    auto* n = new Nvrtc();
    std::string missing;
    bind(h, n->nvrtcVersion, "nvrtcVersion", &missing);
    bind(h, n->nvrtcGetErrorString, "nvrtcGetErrorString", &missing);
    bind(h, n->nvrtcCreateProgram, "nvrtcCreateProgram", &missing);
    bind(h, n->nvrtcDestroyProgram, "nvrtcDestroyProgram", &missing);
    bind(h, n->nvrtcCompileProgram, "nvrtcCompileProgram", &missing);
    bind(h, n->nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", &missing);
    bind(h, n->nvrtcGetProgramLog, "nvrtcGetProgramLog", &missing);
    bind(h, n->nvrtcGetCUBINSize, "nvrtcGetCUBINSize", &missing);
    bind(h, n->nvrtcGetCUBIN, "nvrtcGetCUBIN", &missing);
    bind(h, n->nvrtcGetPTXSize, "nvrtcGetPTXSize", nullptr);
    bind(h, n->nvrtcGetPTX, "nvrtcGetPTX", nullptr);
    bind(h, n->nvrtcAddNameExpression, "nvrtcAddNameExpression", &missing);
    bind(h, n->nvrtcGetLoweredName, "nvrtcGetLoweredName", &missing);
    if (!missing.empty()) {
      reason = fmt::format("NVRTC is too old: it lacks {} (kiln needs NVRTC 11.1 or newer)", missing);
      return;
    }
    n->nvrtcVersion(&n->major, &n->minor);
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(n->nvrtcVersion), &info) && info.dli_fname) {
      std::error_code ec;
      n->path = fs::canonical(info.dli_fname, ec).string();
      if (ec) n->path = info.dli_fname;
    }
    // The toolkit's headers, for cuda_fp16.h and the like: beside the library, else a toolkit root.
    std::vector<fs::path> candidates;
    if (!n->path.empty()) {
      fs::path lib_dir = fs::path(n->path).parent_path();
      candidates.push_back(lib_dir.parent_path() / "include");
      candidates.push_back(lib_dir.parent_path().parent_path() / "include");
    }
    for (const auto& root : toolkit_roots()) candidates.push_back(root / "include");
    for (const auto& c : candidates) {
      std::error_code ec;
      if (fs::exists(c / "cuda_fp16.h", ec)) {
        n->include_dir = fs::canonical(c, ec).string();
        break;
      }
    }
    nvrtc = n;
  });
  if (!nvrtc && why) *why = reason;
  return nvrtc;
}

}  // namespace kiln::cuda
