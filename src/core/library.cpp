#include "kiln/library.hpp"

#include <cctype>
#include <charconv>

#include "core/format.hpp"

namespace kiln {

namespace {

constexpr std::pair<GemmEpilogue, const char*> kEpilogues[] = {
    {GemmEpilogue::bias_gelu, "bias_gelu"}, {GemmEpilogue::bias, "bias"}, {GemmEpilogue::residual, "residual"},
    {GemmEpilogue::gelu, "gelu"}};

const char* epilogue_text(GemmEpilogue e) {
  for (const auto& [k, t] : kEpilogues)
    if (k == e) return t;
  return "";
}

// "bf16_nt_bias", "f16_nn", "sgemm".
std::optional<GemmProblem> parse_problem(std::string_view s) {
  if (s == "sgemm") return GemmProblem{};
  GemmProblem p;
  const size_t u = s.find('_');
  if (u == std::string_view::npos) return std::nullopt;
  auto dt = dtype_from_name(s.substr(0, u));
  if (!dt || *dt == DType::i32 || *dt == DType::i64) return std::nullopt;
  p.dtype = *dt;
  std::string_view rest = s.substr(u + 1);
  if (rest.substr(0, 2) == "nn") p.layout = GemmLayout::nn;
  else if (rest.substr(0, 2) == "nt") p.layout = GemmLayout::nt;
  else return std::nullopt;
  rest.remove_prefix(2);
  if (rest.empty()) return p;
  if (rest[0] != '_') return std::nullopt;
  rest.remove_prefix(1);
  for (const auto& [e, t] : kEpilogues)
    if (rest == t) {
      p.epilogue = e;
      return p;
    }
  return std::nullopt;
}

}  // namespace

std::string GemmProblem::text() const {
  if (dtype == DType::f32 && layout == GemmLayout::nn && epilogue == GemmEpilogue::none) return "sgemm";
  std::string t = fmt::format("{}_{}", dtype_name(dtype), layout == GemmLayout::nn ? "nn" : "nt");
  if (epilogue != GemmEpilogue::none) t += std::string("_") + epilogue_text(epilogue);
  return t;
}

std::vector<std::pair<std::string, Intent>> GemmProblem::args() const {
  const std::string t = std::string(dtype_name(dtype)) + "*";
  std::vector<std::pair<std::string, Intent>> a = {{t, Intent::in}, {t, Intent::in}, {t, Intent::out}};
  if (has_extra()) a.push_back({t, Intent::in});
  for (int i = 0; i < 3; ++i) a.push_back({"i64", Intent::in});
  return a;
}

std::string GemmProblem::what() const {
  const std::string b = layout == GemmLayout::nn ? "B[K,N]" : "B[N,K] (a linear layer's weight: A @ B^T)";
  const std::string e = epilogue == GemmEpilogue::bias        ? " + bias[N]"
                        : epilogue == GemmEpilogue::residual  ? " + R[M,N]"
                        : epilogue == GemmEpilogue::gelu      ? ", then GELU (tanh)"
                        : epilogue == GemmEpilogue::bias_gelu ? " + bias[N], then GELU (tanh)"
                                                              : "";
  const std::string extra = epilogue == GemmEpilogue::residual ? ", R" : has_extra() ? ", bias" : "";
  return fmt::format("C[M,N] = A[M,K] @ {}{}, row-major {} (args A, B, C{}, M, N, K)", b, e, dtype_name(dtype),
                     extra);
}

GemmOperands gemm_operands(const GemmProblem& p, void* const* params) {
  GemmOperands o;
  o.a = *static_cast<const void* const*>(params[0]);
  o.b = *static_cast<const void* const*>(params[1]);
  o.c = *static_cast<void* const*>(params[2]);
  const int s = p.has_extra() ? 4 : 3;  // where the sizes start
  if (p.has_extra()) o.extra = *static_cast<const void* const*>(params[3]);
  o.m = *static_cast<const int64_t*>(params[s]);
  o.n = *static_cast<const int64_t*>(params[s + 1]);
  o.k = *static_cast<const int64_t*>(params[s + 2]);
  return o;
}

std::string LibraryChoice::name() const {
  std::string n = library + "_" + problem.text();
  if (rank >= 0) n += "#" + std::to_string(rank);
  return n;
}

std::optional<LibraryChoice> parse_library_choice(std::string_view name, std::string* why) {
  auto no = [&](std::string w) -> std::optional<LibraryChoice> {
    if (why) *why = std::move(w);
    return std::nullopt;
  };
  LibraryChoice c;
  std::string_view base = name;
  if (const size_t hash = name.rfind('#'); hash != std::string_view::npos) {
    const std::string_view digits = name.substr(hash + 1);
    int k = -1;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size() || k < 0 || k >= kLibraryRanks)
      return no(fmt::format("'#{}' is not a rank from 0 to {}", digits, kLibraryRanks - 1));
    c.rank = k;
    base = name.substr(0, hash);
  }
  const size_t u = base.find('_');
  if (u == 0 || u == std::string_view::npos)
    return no("a library choice is <library>_<problem>, such as cublaslt_bf16_nt_bias or openblas_sgemm");
  for (char ch : base.substr(0, u))
    if (!std::isalnum(static_cast<unsigned char>(ch))) return no("a library's name is letters and digits");
  c.library = std::string(base.substr(0, u));
  auto p = parse_problem(base.substr(u + 1));
  if (!p)
    return no(fmt::format("'{}' is not a problem kiln knows: sgemm, or <f32|f64|f16|bf16>_<nn|nt>[_bias|_residual|"
                          "_gelu|_bias_gelu]",
                          base.substr(u + 1)));
  c.problem = *p;
  return c;
}

}  // namespace kiln
