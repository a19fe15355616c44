// Library choices as typed values: a choice names a library and a problem it
// implements, "<library>_<problem>[#k]" (cublaslt_bf16_nt_bias#3). The
// problem is a GEMM: its dtype, the layout of B, the epilogue; it decides the
// arguments a spec must have, in order, and where each operand is in a
// call's params. Which libraries exist, which problems each implements and
// how is the business of the backend that owns them (kiln/ext/library.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

// B as K x N (nn) or N x K (nt: a linear layer's weight, C = A . B^T).
enum class GemmLayout : uint8_t { nn, nt };
// What the GEMM adds after the product: a bias per column, a residual M x N
// input, GELU (tanh form), or the bias then GELU.
enum class GemmEpilogue : uint8_t { none, bias, residual, gelu, bias_gelu };

// C[M,N] = epilogue(A[M,K] . B), row-major, accumulated in fp32 (f64 in f64).
struct GemmProblem {
  DType dtype = DType::f32;
  GemmLayout layout = GemmLayout::nn;
  GemmEpilogue epilogue = GemmEpilogue::none;

  bool operator==(const GemmProblem&) const = default;
  // Its spelling in a choice's name: "bf16_nt_bias"; f32 nn is "sgemm", as BLAS names it.
  std::string text() const;
  // The bias or residual input: an argument between C and M.
  bool has_extra() const { return epilogue == GemmEpilogue::bias || epilogue == GemmEpilogue::residual ||
                                  epilogue == GemmEpilogue::bias_gelu; }
  // The arguments a call of it takes, in order: A, B, C[, bias | R], M, N, K.
  std::vector<std::pair<std::string, Intent>> args() const;
  // What it computes, for messages and docs.
  std::string what() const;
};

// A call's operands, found by the problem's argument list (never by guessing positions).
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* extra = nullptr;  // the bias or residual; null without one
  int64_t m = 0, n = 0, k = 0;
};
GemmOperands gemm_operands(const GemmProblem& p, void* const* params);

constexpr int kLibraryRanks = 16;

// A library choice read from its name: the library, the problem, and the
// rank (-1: the library's own pick; k: the k-th algorithm of a library that
// ranks them).
struct LibraryChoice {
  std::string library;  // "cublaslt"
  GemmProblem problem;
  int rank = -1;

  // The name it was read from: "<library>_<problem>[#k]".
  std::string name() const;
};

// Reads a choice's name; nullopt with `why` when it is not of the grammar
// (a library name of letters and digits, a problem kiln knows, #k with
// 0 <= k < kLibraryRanks).
std::optional<LibraryChoice> parse_library_choice(std::string_view name, std::string* why = nullptr);

}  // namespace kiln
