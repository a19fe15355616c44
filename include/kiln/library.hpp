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
// input, SiLU, GELU, the bias then GELU, or the gated MLP (two weights Bg and
// Bu: C = silu(A . Bg) * (A . Bu)). Libraries implement some; kernel families
// (docs/families.md) may implement all.
enum class GemmEpilogue : uint8_t { none, bias, residual, silu, gelu, bias_gelu, gated };

// One argument of a problem's call, as a spec declares it.
struct ProblemArg {
  std::string name;  // "A"
  std::string type;  // "bf16*", "i64"
  std::string size;  // buffers: elements, as an expression of M, N, K ("M*K"); empty for scalars
  Intent intent = Intent::in;
};

// C[M,N] = epilogue(A'[M,K] . B), row-major, accumulated in fp32 (f64 in f64), where A' is A
// or, with the RMSNorm prologue, each row of A divided by its root mean square (plus eps)
// and multiplied by a gain g[K]: the RMSNorm before a linear layer, in the GEMM.
struct GemmProblem {
  DType dtype = DType::f32;
  GemmLayout layout = GemmLayout::nn;
  GemmEpilogue epilogue = GemmEpilogue::none;
  bool rmsnorm = false;  // the prologue: arguments g (after A) and eps (an f32, last)

  bool operator==(const GemmProblem&) const = default;
  // Its spelling in a choice's name: "bf16_nt_bias"; f32 nn is "sgemm", as BLAS names it.
  std::string text() const;
  // Its spelling as a kernel family's member: always <dtype>_<layout>[_rmsnorm][_<epilogue>] ("f32_nn", never "sgemm").
  std::string member_text() const;
  // The bias or residual input: an argument between C and M.
  bool has_extra() const { return epilogue == GemmEpilogue::bias || epilogue == GemmEpilogue::residual ||
                                  epilogue == GemmEpilogue::bias_gelu; }
  // The weight operands: 2 for the gated MLP (Bg, Bu), else 1 (B).
  int weights() const { return epilogue == GemmEpilogue::gated ? 2 : 1; }
  // The arguments a call of it takes, in order: A[, g], B (or Bg, Bu), C[, bias | R], M, N, K[, eps].
  std::vector<ProblemArg> arguments() const;
  // The same as (type, intent) pairs.
  std::vector<std::pair<std::string, Intent>> args() const;
  // What it computes, for messages and docs.
  std::string what() const;
  // The preprocessor definitions a kernel family's source is compiled with for
  // this problem: named constants for every dtype, layout and epilogue
  // (GEMM_DTYPE_BF16, GEMM_LAYOUT_NT, GEMM_EPI_BIAS, ...; none is 0, so a misspelt name
  // never matches) and the problem's own, GEMM_DTYPE, GEMM_LAYOUT and
  // GEMM_EPILOGUE, set to them, and GEMM_RMSNORM (0 or 1).
  std::vector<std::string> defines() const;
};

// Every operand name a GEMM problem may have: A, g, B, Bg, Bu, C, bias, R.
const std::vector<std::string>& gemm_operand_names();

// Reads "bf16_nt_bias", "f16_nn", "bf16_nt_rmsnorm_gated", "sgemm"; nullopt when it is not a problem kiln knows.
std::optional<GemmProblem> parse_gemm_problem(std::string_view s);

// A call's operands, found by the problem's argument list (never by guessing positions).
struct GemmOperands {
  const void* a = nullptr;
  const void* g = nullptr;  // the RMSNorm prologue's gain; null without one
  const void* b = nullptr;
  void* c = nullptr;
  const void* b2 = nullptr;     // gated: Bu (b is Bg); else null
  const void* extra = nullptr;  // the bias or residual; null without one
  int64_t m = 0, n = 0, k = 0;
  float eps = 0;  // the RMSNorm prologue's
};
GemmOperands gemm_operands(const GemmProblem& p, void* const* params);

// Attention over a KV cache, as kernels/cuda/attention_bf16.toml computes it: T new tokens
// at positions S .. S+T-1, each of HQ query heads over the S + T cached keys and values of
// its KV head (grouped-query: query head h reads KV head h / (HQ / HKV)), causal with the
// past offset S (token i sees keys 0 .. S+i), head dimension 128, softmax scale 1/sqrt(128),
// fp32 math. q and o are T x HQ x 128, the caches CAP x HKV x 128, row-major. Arguments
// q, k_cache, v_cache, o, then T, S, CAP, HQ, HKV; S may be a cell (a library that
// implements the problem reads it where a program keeps it on the device).
struct AttentionProblem {
  DType dtype = DType::bf16;

  bool operator==(const AttentionProblem&) const = default;
  // "attn_bf16"
  std::string text() const;
  std::vector<ProblemArg> arguments() const;
  std::vector<std::pair<std::string, Intent>> args() const;
  std::string what() const;
  // The argument a call may pass as a cell: S (index 5).
  static constexpr int kCellArg = 5;
};

// Reads "attn_bf16"; nullopt when it is not an attention problem kiln knows.
std::optional<AttentionProblem> parse_attention_problem(std::string_view s);

struct AttentionOperands {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  int64_t t = 0, s = 0, cap = 0, hq = 0, hkv = 0;  // s: the value passed, or a cell (negative)
};
AttentionOperands attention_operands(void* const* params);

constexpr int kLibraryRanks = 16;

// A library choice read from its name: the library, the problem, and the
// rank (-1: the library's own pick; k: the k-th algorithm of a library that
// ranks them).
struct LibraryChoice {
  std::string library;  // "cublaslt"
  GemmProblem problem;  // the GEMM it computes, unless `attention` is set
  std::optional<AttentionProblem> attention;
  int rank = -1;

  // The name it was read from: "<library>_<problem>[#k]".
  std::string name() const;
  // The problem's arguments (type, intent), what it computes, whether argument i may be a cell.
  std::vector<std::pair<std::string, Intent>> args() const;
  std::string what() const;
  bool may_be_cell(size_t i) const { return attention && i == static_cast<size_t>(AttentionProblem::kCellArg); }
};

// Reads a choice's name; nullopt with `why` when it is not of the grammar
// (a library name of letters and digits, a problem kiln knows, #k with
// 0 <= k < kLibraryRanks).
std::optional<LibraryChoice> parse_library_choice(std::string_view name, std::string* why = nullptr);

}  // namespace kiln
