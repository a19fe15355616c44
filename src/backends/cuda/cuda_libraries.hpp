// The libraries of the cuda backend, one file each (kiln/ext/library.hpp),
// all opened with dlopen: absent, their choices are unavailable.
#pragma once

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

std::unique_ptr<Library> make_cublas(const CudaLibraryHost& host);    // cublas.cpp: cublas_sgemm
std::unique_ptr<Library> make_cublaslt(const CudaLibraryHost& host);  // cublaslt.cpp: bf16 and f16, ranked

}  // namespace kiln
