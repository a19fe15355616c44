// The libraries of the cuda backend, one file each (kiln/ext/library.hpp),
// all opened with dlopen: absent, their choices are unavailable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kiln/ext/library.hpp"

namespace kiln {

// What a library of the cuda backend asks of it.
struct CudaLibraryHost {
  std::function<std::string()> unavailable;  // "" when there is a GPU to run on, else why not
  std::function<Device&()> device;           // the backend's device (made on first use)
  std::function<std::string()> arch;         // "sm_90", or "no device": part of a library's identity
};

// Whether a graph is being updated in place on stream `s` (Graph::update): a
// library's launch then declines (the graph cannot be set to it) and runs nothing.
bool cuda_graph_update_declines(Stream s);

namespace cuda {
// cuBLASLt opened (dlopen, no device needed): whether it is installed.
bool open_cublaslt();
// cuBLASLt's one-time work done now: a handle and its heuristic (no context of
// kiln's needed: the library's runtime takes GPU 0 then, so `device_first` for
// another GPU waits for the device and binds its context first), then a small
// product on the calling thread's stream on the device `device_when_made`
// returns (it may block until the device is made; nullptr: none). Errors are
// logged at debug, never thrown.
void ready_cublaslt(const std::function<Device*()>& device_when_made, bool device_first);
// Marks cuBLASLt as being readied in the background (`begun`: before the thread
// that opens and readies it starts) and no longer (when that thread is done,
// or could not start). Its Library::readying() is true in between.
void cublaslt_readying(bool begun);

// For cuDNN's attention (cudnn.cpp, which sees cuDNN's headers and not kiln's driver
// declarations; cudnn_support.cpp):
// The stream a launch given none runs on (the calling thread's).
void* default_stream();
// Whether work launched on `stream` is being captured into a graph now.
bool stream_capturing(void* stream);
// The directory of the CUDA toolkit's libraries NVRTC was found in, or "".
std::string toolkit_library_dir();
}  // namespace cuda

std::unique_ptr<Library> make_cublas(const CudaLibraryHost& host);    // cublas.cpp: cublas_sgemm
std::unique_ptr<Library> make_cublaslt(const CudaLibraryHost& host);  // cublaslt.cpp: bf16 and f16, ranked
std::unique_ptr<Library> make_cudnn(const CudaLibraryHost& host);     // cudnn.cpp: attention (attn_bf16)

}  // namespace kiln
