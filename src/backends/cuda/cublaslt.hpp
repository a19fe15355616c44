// cuBLASLt as library choices (opened with dlopen, as cuBLAS is): bf16 and
// fp16 matmuls with fp32 accumulation, row-major, with the epilogues
// cuBLASLt has (bias, GELU, bias then GELU) and a residual (beta = 1 over a
// separate C input). A choice named "cublaslt_<dt>_<nn|nt>[_<epi>]#k" runs
// the k-th algorithm cuBLASLt's heuristic offers for the call's problem;
// the heuristic is asked once per shape and remembered. See library_calls()
// in kiln/spec.hpp for the argument lists.
#pragma once

#include <memory>
#include <string>

#include "kiln/ext/backend.hpp"

namespace kiln::cuda {

// "" when cuBLASLt can be opened here, else why not.
std::string cublaslt_unavailable();
// "cuBLASLt 130100" (its version number), for library keys.
std::string cublaslt_version();
// Whether `name` is a cuBLASLt choice.
bool is_cublaslt(const std::string& name);

// The loaded choice `name` on `dev` (a CUDA device whose bind() makes its
// context current). Throws Error(Errc::launch) when cuBLASLt cannot be used.
std::shared_ptr<LoadedKernel> make_cublaslt_kernel(std::string key, KernelMeta meta, const std::string& name,
                                                   Device& dev);

}  // namespace kiln::cuda
