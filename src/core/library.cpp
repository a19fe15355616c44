#include "kiln/library.hpp"

#include <cctype>
#include <charconv>

#include "core/format.hpp"

namespace kiln {

namespace {

constexpr std::pair<GemmEpilogue, const char*> kEpilogues[] = {
    {GemmEpilogue::bias_gelu, "bias_gelu"}, {GemmEpilogue::bias, "bias"}, {GemmEpilogue::residual, "residual"},
    {GemmEpilogue::silu, "silu"},           {GemmEpilogue::gelu, "gelu"}, {GemmEpilogue::gated, "gated"}};

const char* epilogue_text(GemmEpilogue e) {
  for (const auto& [k, t] : kEpilogues)
    if (k == e) return t;
  return "";
}

std::string upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

// A problem's arguments as (type, intent) pairs.
std::vector<std::pair<std::string, Intent>> types_and_intents(const std::vector<ProblemArg>& args) {
  std::vector<std::pair<std::string, Intent>> out;
  for (const ProblemArg& a : args) out.push_back({a.type, a.intent});
  return out;
}

}  // namespace

// "bf16_nt_bias", "f16_nn", "sgemm".
std::optional<GemmProblem> parse_gemm_problem(std::string_view s) {
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
  if (rest.substr(0, 7) == "rmsnorm") {
    p.rmsnorm = true;
    rest.remove_prefix(7);
    if (rest.empty()) return p;
    if (rest[0] != '_') return std::nullopt;
    rest.remove_prefix(1);
  }
  for (const auto& [e, t] : kEpilogues)
    if (rest == t) {
      p.epilogue = e;
      return p;
    }
  return std::nullopt;
}


std::string GemmProblem::text() const {
  if (dtype == DType::f32 && layout == GemmLayout::nn && epilogue == GemmEpilogue::none && !rmsnorm) return "sgemm";
  return member_text();
}

std::string GemmProblem::member_text() const {
  std::string t = fmt::format("{}_{}", dtype_name(dtype), layout == GemmLayout::nn ? "nn" : "nt");
  if (rmsnorm) t += "_rmsnorm";
  if (epilogue != GemmEpilogue::none) t += std::string("_") + epilogue_text(epilogue);
  return t;
}

std::vector<ProblemArg> GemmProblem::arguments() const {
  const std::string t = std::string(dtype_name(dtype)) + "*";
  const std::string b_size = layout == GemmLayout::nn ? "K*N" : "N*K";
  std::vector<ProblemArg> a = {{"A", t, "M*K", Intent::in}};
  if (rmsnorm) a.push_back({"g", t, "K", Intent::in});
  if (weights() == 2) {
    a.push_back({"Bg", t, b_size, Intent::in});
    a.push_back({"Bu", t, b_size, Intent::in});
  } else {
    a.push_back({"B", t, b_size, Intent::in});
  }
  a.push_back({"C", t, "M*N", Intent::out});
  if (epilogue == GemmEpilogue::residual) a.push_back({"R", t, "M*N", Intent::in});
  else if (has_extra()) a.push_back({"bias", t, "N", Intent::in});
  for (const char* n : {"M", "N", "K"}) a.push_back({n, "i64", "", Intent::in});
  if (rmsnorm) a.push_back({"eps", "f32", "", Intent::in});
  return a;
}

std::vector<std::pair<std::string, Intent>> GemmProblem::args() const { return types_and_intents(arguments()); }

std::string GemmProblem::what() const {
  const std::string b = layout == GemmLayout::nn ? "K,N" : "N,K";
  const std::string w = weights() == 2 ? fmt::format("Bg[{}], Bu[{}]", b, b) : fmt::format("B[{}]", b);
  std::string f = layout == GemmLayout::nn ? "A @ B" : "A @ B^T";
  switch (epilogue) {
    case GemmEpilogue::none: break;
    case GemmEpilogue::bias: f += " + bias[N]"; break;
    case GemmEpilogue::residual: f += " + R[M,N]"; break;
    case GemmEpilogue::silu: f = "silu(" + f + ")"; break;
    case GemmEpilogue::gelu: f = "gelu(" + f + ")"; break;
    case GemmEpilogue::bias_gelu: f = "gelu(" + f + " + bias[N])"; break;
    case GemmEpilogue::gated:
      f = layout == GemmLayout::nn ? "silu(A @ Bg) * (A @ Bu)" : "silu(A @ Bg^T) * (A @ Bu^T)";
      break;
  }
  if (rmsnorm) f += ", A's rows first RMS-normalised (+ eps) and scaled by g[K]";
  std::string names;
  for (const ProblemArg& a : arguments()) names += (names.empty() ? "" : ", ") + a.name;
  return fmt::format("C[M,N] = {}, A[M,K], {}, row-major {} (args {})", f, w, dtype_name(dtype), names);
}

std::vector<std::string> GemmProblem::defines() const {
  std::vector<std::string> d;
  int i = 1;
  for (DType t : kAllDTypes)
    if (dtype_is_float(t)) d.push_back(fmt::format("-DGEMM_DTYPE_{}={}", upper(dtype_name(t)), i++));
  d.push_back("-DGEMM_LAYOUT_NN=1");
  d.push_back("-DGEMM_LAYOUT_NT=2");
  for (int e = 0; e <= static_cast<int>(GemmEpilogue::gated); ++e) {
    const auto ep = static_cast<GemmEpilogue>(e);
    d.push_back(fmt::format("-DGEMM_EPI_{}={}", ep == GemmEpilogue::none ? "NONE" : upper(epilogue_text(ep)), e + 1));
  }
  d.push_back(fmt::format("-DGEMM_DTYPE=GEMM_DTYPE_{}", upper(dtype_name(dtype))));
  d.push_back(layout == GemmLayout::nn ? "-DGEMM_LAYOUT=GEMM_LAYOUT_NN" : "-DGEMM_LAYOUT=GEMM_LAYOUT_NT");
  d.push_back(fmt::format("-DGEMM_EPILOGUE=GEMM_EPI_{}",
                          epilogue == GemmEpilogue::none ? "NONE" : upper(epilogue_text(epilogue))));
  d.push_back(fmt::format("-DGEMM_RMSNORM={}", rmsnorm ? 1 : 0));
  return d;
}

const std::vector<std::string>& gemm_operand_names() {
  static const std::vector<std::string> names = {"A", "g", "B", "Bg", "Bu", "C", "bias", "R"};
  return names;
}

GemmOperands gemm_operands(const GemmProblem& p, void* const* params) {
  GemmOperands o;
  int at = 0;
  o.a = *static_cast<const void* const*>(params[at++]);
  if (p.rmsnorm) o.g = *static_cast<const void* const*>(params[at++]);
  o.b = *static_cast<const void* const*>(params[at++]);
  if (p.weights() == 2) o.b2 = *static_cast<const void* const*>(params[at++]);
  o.c = *static_cast<void* const*>(params[at++]);
  if (p.has_extra()) o.extra = *static_cast<const void* const*>(params[at++]);
  const int s = at;  // where the sizes start
  o.m = *static_cast<const int64_t*>(params[s]);
  o.n = *static_cast<const int64_t*>(params[s + 1]);
  o.k = *static_cast<const int64_t*>(params[s + 2]);
  if (p.rmsnorm) o.eps = *static_cast<const float*>(params[s + 3]);
  return o;
}

std::string AttentionProblem::text() const { return fmt::format("attn_{}", dtype_name(dtype)); }

std::optional<AttentionProblem> parse_attention_problem(std::string_view s) {
  if (s == "attn_bf16") return AttentionProblem{};
  return std::nullopt;
}

std::vector<ProblemArg> AttentionProblem::arguments() const {
  const std::string t = std::string(dtype_name(dtype)) + "*";
  std::vector<ProblemArg> a = {{"q", t, "T*HQ*128", Intent::in},
                               {"k_cache", t, "CAP*HKV*128", Intent::in},
                               {"v_cache", t, "CAP*HKV*128", Intent::in},
                               {"o", t, "T*HQ*128", Intent::out}};
  for (const char* n : {"T", "S", "CAP", "HQ", "HKV"}) a.push_back({n, "i64", "", Intent::in});
  return a;
}

std::vector<std::pair<std::string, Intent>> AttentionProblem::args() const { return types_and_intents(arguments()); }

std::string AttentionProblem::what() const {
  return fmt::format("o[T,HQ,128] = causal attention of q[T,HQ,128] at positions S .. S+T-1 over the first S+T rows of "
                     "k_cache and v_cache[CAP,HKV,128] (grouped-query), {} (args q, k_cache, v_cache, o, T, S, CAP, HQ, "
                     "HKV)",
                     dtype_name(dtype));
}

AttentionOperands attention_operands(void* const* params) {
  AttentionOperands o;
  o.q = *static_cast<const void* const*>(params[0]);
  o.k = *static_cast<const void* const*>(params[1]);
  o.v = *static_cast<const void* const*>(params[2]);
  o.o = *static_cast<void* const*>(params[3]);
  o.t = *static_cast<const int64_t*>(params[4]);
  o.s = *static_cast<const int64_t*>(params[5]);
  o.cap = *static_cast<const int64_t*>(params[6]);
  o.hq = *static_cast<const int64_t*>(params[7]);
  o.hkv = *static_cast<const int64_t*>(params[8]);
  return o;
}

std::vector<std::pair<std::string, Intent>> LibraryChoice::args() const {
  return attention ? attention->args() : problem.args();
}

std::string LibraryChoice::what() const { return attention ? attention->what() : problem.what(); }

std::string LibraryChoice::name() const {
  std::string n = library + "_" + (attention ? attention->text() : problem.text());
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
  if (auto a = parse_attention_problem(base.substr(u + 1))) {
    c.attention = *a;
    return c;
  }
  auto p = parse_gemm_problem(base.substr(u + 1));
  if (!p)
    return no(fmt::format("'{}' is not a problem kiln knows: sgemm, <f32|f64|f16|bf16>_<nn|nt>[_rmsnorm][_bias|"
                          "_residual|_silu|_gelu|_bias_gelu|_gated], or attn_bf16",
                          base.substr(u + 1)));
  c.problem = *p;
  return c;
}

}  // namespace kiln
