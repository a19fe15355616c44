// The parts of the CUDA driver API and NVRTC that kiln uses, opened with
// dlopen at run time, so kiln builds and runs (CPU-only) where CUDA is
// absent. The types and constants are the driver's ABI, declared here so no
// CUDA header is needed to build kiln. Only src/backends/cuda uses this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
using CUcontext = CUctx_st*;
struct CUstream_st;
using CUstream = CUstream_st*;
struct CUevent_st;
using CUevent = CUevent_st*;
struct CUlib_st;
using CUlibrary = CUlib_st*;
struct CUkern_st;
using CUkernel = CUkern_st*;
struct CUfunc_st;
using CUfunction = CUfunc_st*;
struct CUgraph_st;
using CUgraph = CUgraph_st*;
struct CUgraphExec_st;
using CUgraphExec = CUgraphExec_st*;
struct CUgraphNode_st;
using CUgraphNode = CUgraphNode_st*;
// The driver's kernel node parameters (CUDA_KERNEL_NODE_PARAMS_v2): with func null,
// kern is launched in the current context.
struct CudaKernelNodeParams {
  CUfunction func;
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void** kernelParams;
  void** extra;
  CUkernel kern;
  CUcontext ctx;
};
// The driver's extended launch (CUlaunchAttribute, CUlaunchConfig): one attribute is
// used, programmatic stream serialisation (a launch that may start before the previous
// kernel in its stream ends, the kernel waiting with griddepcontrol.wait).
struct alignas(8) CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_serialization_allowed;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8,
              "the driver's CUlaunchAttribute: the id, then the 64-byte value at 8");
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, hStream) == 32 &&
                  offsetof(CUlaunchConfig, attrs) == 40 && offsetof(CUlaunchConfig, numAttrs) == 48,
              "the driver's CUlaunchConfig layout");
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
// The driver's TMA descriptor (CUtensorMap): 128 opaque bytes.
struct alignas(128) CUtensorMap {
  unsigned long long opaque[16];
};
struct CUipcMemHandle {
  unsigned char data[64];
};

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_ALREADY_MAPPED = 208;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_INSUFFICIENT_DRIVER = 35;

// Errors after which a context cannot be used again (a kernel faulted).
inline bool sticky(CUresult r) {
  switch (r) {
    case 700: case 702: case 710: case 714: case 715: case 716: case 718: case 719: case 999: return true;
    default: return false;
  }
}

enum DeviceAttr : int {
  MAX_THREADS_PER_BLOCK = 1,
  MAX_BLOCK_DIM_X = 2,
  MAX_BLOCK_DIM_Y = 3,
  MAX_BLOCK_DIM_Z = 4,
  MAX_GRID_DIM_X = 5,
  MAX_GRID_DIM_Y = 6,
  MAX_GRID_DIM_Z = 7,
  MAX_REGISTERS_PER_BLOCK = 12,
  MULTIPROCESSOR_COUNT = 16,
  L2_CACHE_SIZE = 38,
  COMPUTE_CAPABILITY_MAJOR = 75,
  COMPUTE_CAPABILITY_MINOR = 76,
  MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};
enum FuncAttr : int {
  FUNC_MAX_THREADS_PER_BLOCK = 0,
  FUNC_SHARED_SIZE_BYTES = 1,
  FUNC_LOCAL_SIZE_BYTES = 3,
  FUNC_NUM_REGS = 4,
  FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  FUNC_REQUIRED_CLUSTER_WIDTH = 11,
  FUNC_REQUIRED_CLUSTER_HEIGHT = 12,
  FUNC_REQUIRED_CLUSTER_DEPTH = 13,
  FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
};
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1;
constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;
inline CUstream per_thread_stream() { return reinterpret_cast<CUstream>(0x2); }

// The driver (libcuda.so.1), or why it is not usable.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuLibraryLoadData)(CUlibrary*, const void*, void*, void**, unsigned, void*, void**, unsigned);
  CUresult (*cuLibraryUnload)(CUlibrary);
  CUresult (*cuLibraryGetKernel)(CUkernel*, CUlibrary, const char*);
  CUresult (*cuKernelGetAttribute)(int*, int, CUkernel, CUdevice);
  CUresult (*cuKernelSetAttribute)(int, int, CUkernel, CUdevice);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  // The extended launch (optional: without it no launch overlaps the one before it).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  // Pinned host memory the GPU reads (optional: without it no stream is held, KILN_BENCH_HOLD).
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  // (optional: without it a workspace cannot be made while this thread captures a graph)
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  // Graph updates in place (optional: without them a graph is captured anew instead).
  // (_v3, whose edge data keeps the query exact after a programmatic edge, else _v2 through
  // capture_info below)
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                        const void**, size_t*) = nullptr;
  CUresult (*cuStreamGetCaptureInfo)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                     size_t*) = nullptr;
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode, const CudaKernelNodeParams*) = nullptr;
  CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode*, size_t*) = nullptr;
  // A kernel parameter's offset and size (optional: without it every node is set on each update).
  CUresult (*cuKernelGetParamInfo)(CUkernel, size_t, size_t*, size_t*) = nullptr;
  // cuTensorMapEncodeTiled(map, data type, rank, address, dims, strides (bytes, rank - 1),
  // box, element strides, interleave, swizzle, L2 promotion, out-of-bounds fill)
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*, int, int, int, int);
  int version = 0;  // cuDriverGetVersion: 13000 for CUDA 13.0

  // The driver, opened once; nullptr with `why` set when there is none
  // (no libcuda, a missing symbol, a driver too old, cuInit failing).
  static const Driver* get(std::string* why);
  bool can_query_capture() const { return cuStreamGetCaptureInfo_v3 || cuStreamGetCaptureInfo; }
  CUresult capture_info(CUstream s, int* status, unsigned long long* id, CUgraph* g, const CUgraphNode** deps,
                        size_t* n) const {
    if (cuStreamGetCaptureInfo_v3) {
      const void* edges = nullptr;
      return cuStreamGetCaptureInfo_v3(s, status, id, g, deps, &edges, n);
    }
    return cuStreamGetCaptureInfo(s, status, id, g, deps, n);
  }
  std::string error_text(CUresult r) const;  // "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access...)"
};

using nvrtcProgram = struct _nvrtcProgram*;
using nvrtcResult = int;

// NVRTC (libnvrtc.so), or why it is not usable.
struct Nvrtc {
  nvrtcResult (*nvrtcVersion)(int*, int*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  // (optional: a pdl kernel's PTX is read for its wait where NVRTC has them)
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcAddNameExpression)(nvrtcProgram, const char*);
  nvrtcResult (*nvrtcGetLoweredName)(nvrtcProgram, const char*, const char**);
  int major = 0, minor = 0;
  std::string path;          // the library's file
  std::string include_dir;   // the toolkit's headers (cuda_fp16.h...), "" if not found

  static const Nvrtc* get(std::string* why);
};

}  // namespace kiln::cuda
