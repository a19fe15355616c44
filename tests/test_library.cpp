// Library choices as typed values: the name grammar, the problem's argument
// list, a real OpenBLAS call of each layout checked against a template, and
// an unknown library refused when the kernel is made.
#include <gtest/gtest.h>

#include <fstream>

#include "core/fsutil.hpp"
#include "compile/compile_pool.hpp"
#include "dispatch/first_call.hpp"
#include "kiln/artifact.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/library.hpp"
#include "kiln/kernel.hpp"
#include "kiln/library.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;

namespace {

// C = A . B (nn, B K x N) or A . B^T (nt, B N x K) in f64, one row of C a program.
const char* kGemmSource = R"SRC(
void gemm(kiln::program_id pid, const double* A, const double* B, double* C, int64_t M, int64_t N, int64_t K) {
  const int64_t i = pid.x;
  for (int64_t j = 0; j < N; ++j) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += A[i * K + k] * (NT ? B[j * K + k] : B[k * N + j]);
    C[i * N + j] = s;
  }
}
)SRC";

std::string gemm_spec(const std::string& library, int nt) {
  return "name = \"gemm\"\nbackend = \"cpu\"\nsource = \"gemm.cpp\"\nentry = \"gemm\"\ngrid = [\"M\"]\n"
         "cflags = [\"-DNT=" + std::to_string(nt) + "\"]\n"
         "args = [\n"
         "  { name = \"A\", type = \"f64*\", size = \"M*K\", intent = \"in\" },\n"
         "  { name = \"B\", type = \"f64*\", size = \"N*K\", intent = \"in\" },\n"
         "  { name = \"C\", type = \"f64*\", size = \"M*N\", intent = \"out\" },\n"
         "  { name = \"M\", type = \"i64\" }, { name = \"N\", type = \"i64\" }, { name = \"K\", type = \"i64\" },\n"
         "]\nlibrary = [\"" + library + "\"]\n[params]\nV = [1]\n[tuning]\nreference = { V = 1 }\n";
}

struct LibraryTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 5;
    opts.workers = 1;
  }
};

}  // namespace

TEST(LibraryChoiceTest, NamesReadAsALibraryAProblemAndARank) {
  auto c = parse_library_choice("cublaslt_bf16_nt_bias#3");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->library, "cublaslt");
  EXPECT_EQ(c->problem.dtype, DType::bf16);
  EXPECT_EQ(c->problem.layout, GemmLayout::nt);
  EXPECT_EQ(c->problem.epilogue, GemmEpilogue::bias);
  EXPECT_EQ(c->rank, 3);
  EXPECT_EQ(c->name(), "cublaslt_bf16_nt_bias#3");
  // The bias sits between C and the sizes.
  auto args = c->problem.args();
  ASSERT_EQ(args.size(), 7u);
  EXPECT_EQ(args[3].first, "bf16*");
  EXPECT_EQ(args[4].first, "i64");

  auto s = parse_library_choice("openblas_sgemm");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->problem, GemmProblem{});
  EXPECT_EQ(s->rank, -1);
  EXPECT_EQ(s->name(), "openblas_sgemm");
  EXPECT_EQ(parse_library_choice("cublaslt_f16_nn_bias_gelu")->problem.epilogue, GemmEpilogue::bias_gelu);

  std::string why;
  EXPECT_FALSE(parse_library_choice("openblas_bf61_nt", &why));
  EXPECT_NE(why.find("not a problem kiln knows"), std::string::npos) << why;
  EXPECT_FALSE(parse_library_choice("cublaslt_bf16_nt#16", &why));
  EXPECT_NE(why.find("rank from 0 to 15"), std::string::npos) << why;
  EXPECT_FALSE(parse_library_choice("sgemm", &why));
  EXPECT_FALSE(parse_library_choice("cu-blas_sgemm", &why));
  EXPECT_FALSE(parse_library_choice("openblas_i32_nn", &why));

  // The RMSNorm prologue comes before the epilogue in a problem's name; its gain follows A and
  // its eps the sizes.
  auto n = parse_gemm_problem("bf16_nt_rmsnorm_gated");
  ASSERT_TRUE(n);
  EXPECT_TRUE(n->rmsnorm);
  EXPECT_EQ(n->epilogue, GemmEpilogue::gated);
  EXPECT_EQ(n->member_text(), "bf16_nt_rmsnorm_gated");
  std::vector<std::string> names;
  for (const ProblemArg& a : n->arguments()) names.push_back(a.name);
  EXPECT_EQ(names, (std::vector<std::string>{"A", "g", "Bg", "Bu", "C", "M", "N", "K", "eps"}));
  EXPECT_EQ(n->arguments().back().type, "f32");
  EXPECT_TRUE(parse_gemm_problem("f32_nt_rmsnorm"));
  EXPECT_FALSE(parse_gemm_problem("f32_nt_gated_rmsnorm"));
  EXPECT_FALSE(parse_gemm_problem("f32_nt_rmsnormx"));
  EXPECT_FALSE(parse_gemm_problem("f32_nt_rmsnorm_"));
  EXPECT_NE(*parse_gemm_problem("f32_nn_rmsnorm"), GemmProblem{});  // never read as sgemm
  EXPECT_EQ(parse_gemm_problem("f32_nn_rmsnorm")->text(), "f32_nn_rmsnorm");
}

// An attention problem (cuDNN's fused attention): its name, arguments and operands, and that
// only its S may be a cell; no GEMM library implements it, and cuDNN implements no GEMM.
TEST(LibraryChoiceTest, AnAttentionProblemReadsAsOneAndOnlyItsSMayBeACell) {
  auto c = parse_library_choice("cudnn_attn_bf16");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->library, "cudnn");
  ASSERT_TRUE(c->attention);
  EXPECT_EQ(c->name(), "cudnn_attn_bf16");
  std::vector<std::string> names;
  for (const ProblemArg& a : c->attention->arguments()) names.push_back(a.name);
  EXPECT_EQ(names, (std::vector<std::string>{"q", "k_cache", "v_cache", "o", "T", "S", "CAP", "HQ", "HKV"}));
  EXPECT_EQ(c->args().size(), 9u);
  EXPECT_EQ(c->args()[3].second, Intent::out);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(c->may_be_cell(i), i == 5) << i;
  EXPECT_FALSE(parse_library_choice("cublaslt_bf16_nt")->may_be_cell(5));
  std::string why;
  EXPECT_FALSE(parse_library_choice("cudnn_attn_f64", &why));
  EXPECT_NE(why.find("or attn_bf16"), std::string::npos) << why;

  int64_t t = 3, sv = 7, cap = 20, hq = 8, hkv = 2;
  uint16_t q = 0, k = 0, v = 0, o = 0;
  void *pq = &q, *pk = &k, *pv = &v, *po = &o;
  void* params[] = {&pq, &pk, &pv, &po, &t, &sv, &cap, &hq, &hkv};
  const AttentionOperands a = attention_operands(params);
  EXPECT_EQ(a.q, &q);
  EXPECT_EQ(a.o, &o);
  EXPECT_EQ(a.s, 7);
  EXPECT_EQ(a.hkv, 2);

  const auto be = make_backend("cuda", Options{});
  EXPECT_NE(be->library_unavailable("cublaslt_attn_bf16#0").find("cublaslt implements no attention problem"),
            std::string::npos)
      << be->library_unavailable("cublaslt_attn_bf16#0");
  EXPECT_NE(be->library_unavailable("cudnn_bf16_nt").find("cuDNN for attention only"), std::string::npos);
}

TEST(LibraryChoiceTest, OperandsAreFoundByTheProblemNotByPosition) {
  int64_t m = 2, n = 3, k = 4;
  double a = 0, b = 0, c = 0, bias = 0;
  void *pa = &a, *pb = &b, *pc = &c, *pbias = &bias;
  void* with_bias[] = {&pa, &pb, &pc, &pbias, &m, &n, &k};
  GemmProblem p{DType::f64, GemmLayout::nt, GemmEpilogue::bias};
  GemmOperands o = gemm_operands(p, with_bias);
  EXPECT_EQ(o.extra, &bias);
  EXPECT_EQ(o.m, 2);
  EXPECT_EQ(o.k, 4);
  void* plain[] = {&pa, &pb, &pc, &m, &n, &k};
  o = gemm_operands(GemmProblem{}, plain);
  EXPECT_EQ(o.extra, nullptr);
  EXPECT_EQ(o.c, &c);
  EXPECT_EQ(o.n, 3);
  // With the RMSNorm prologue: the gain after A, eps after the sizes.
  double g = 0;
  float eps = 0.5f;
  void* pg = &g;
  void* normed[] = {&pa, &pg, &pb, &pc, &pbias, &m, &n, &k, &eps};
  GemmProblem pn{DType::f64, GemmLayout::nt, GemmEpilogue::residual};
  pn.rmsnorm = true;
  o = gemm_operands(pn, normed);
  EXPECT_EQ(o.g, &g);
  EXPECT_EQ(o.b, &b);
  EXPECT_EQ(o.extra, &bias);
  EXPECT_EQ(o.k, 4);
  EXPECT_EQ(o.eps, 0.5f);
}

// OpenBLAS's f64 nn and nt choices run for real, and each agrees with the
// template (the reference) or the tuning would record it wrong.
TEST_F(LibraryTest, OpenBlasOfEachLayoutAgreesWithTheTemplate) {
  Runtime rt(opts);
  if (!rt.backend("cpu").library_unavailable("openblas_f64_nn").empty())
    GTEST_SKIP() << "OpenBLAS is not installed here: " << rt.backend("cpu").library_unavailable("openblas_f64_nn");
  for (int nt : {0, 1}) {
    const std::string name = nt ? "openblas_f64_nt" : "openblas_f64_nn";
    KernelSpec s = test::spec_in(dir.path() / name, gemm_spec(name, nt), "gemm.cpp", kGemmSource);
    HostArgs args(s, parse_scalars(s, {{"M", "33"}, {"N", "47"}, {"K", "65"}}));
    args.fill_random(7);
    TuneOutcome o = rt.tune(s, args.params());
    const ConfigResult* lib = nullptr;
    for (const auto& c : o.record.configs)
      if (c.config.library == name) lib = &c;
    ASSERT_NE(lib, nullptr) << name;
    EXPECT_TRUE(lib->ok()) << name << ": " << fail_kind_name(lib->kind) << ": " << lib->error;
    EXPECT_EQ(o.record.reference, "V=1") << name;
  }
}

// Every epilogue of the cpu linear family has OpenBLAS's unfused form as a
// choice (the GEMM, two for the gated MLP, and the epilogue beside it): each
// runs for real at an odd shape and at one row, and agrees with the fused
// template (the reference), or the tuning would record it wrong.
TEST_F(LibraryTest, OpenBlasRunsEveryEpilogueUnfusedAndAgreesWithTheFusedTemplate) {
  Runtime rt(opts);
  if (!rt.backend("cpu").library_unavailable("openblas_f32_nt").empty())
    GTEST_SKIP() << "OpenBLAS is not installed here: " << rt.backend("cpu").library_unavailable("openblas_f32_nt");
  const std::string linear = test::kernels() + "/cpu/linear.toml";
  size_t checked = 0;
  for (const std::string& m : family_members(linear)) {
    if (parse_gemm_problem(m)->rmsnorm) continue;  // OpenBLAS has no RMSNorm prologue (no choice)
    KernelSpec s = load_spec(linear + ":" + m);
    for (const char* rows : {"7", "1"}) {
      SCOPED_TRACE(m + " M=" + rows);
      HostArgs args(s, parse_scalars(s, {{"M", rows}, {"N", "33"}, {"K", "19"}}));
      args.fill_random(11);
      TuneOutcome o = rt.tune(s, args.params());
      const ConfigResult* lib = nullptr;
      for (const auto& c : o.record.configs)
        if (c.config.library == "openblas_" + m) lib = &c;
      ASSERT_NE(lib, nullptr);
      EXPECT_TRUE(lib->ok()) << fail_kind_name(lib->kind) << ": " << lib->error;
      // Whichever ran first is the reference the others are checked against: the
      // templates agree with the library's result (a wrong one would fail them all).
      size_t templates_ok = 0, templates = 0;
      for (const auto& c : o.record.configs)
        if (c.config.library.empty()) templates += 1, templates_ok += c.ok();
      EXPECT_GT(templates, 0u);
      EXPECT_EQ(templates_ok, templates) << "reference " << o.record.reference;
      EXPECT_TRUE(o.choice);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 14u);
}

// A library call cannot read a cell (a word on the device holding a scalar, docs/program.md):
// a spec with library choices and a cell argument is refused, naming both.
TEST_F(LibraryTest, ASpecWithALibraryChoiceHasNoCellArgument) {
  std::string text = gemm_spec("openblas_f64_nt", 1);
  const std::string k = "{ name = \"K\", type = \"i64\" }";
  ASSERT_NE(text.find(k), std::string::npos);
  text.replace(text.find(k), k.size(), "{ name = \"K\", type = \"i64\", cell = true }");
  try {
    test::spec_in(dir.path() / "cell", text, "gemm.cpp", kGemmSource);
    ADD_FAILURE() << "a library choice beside a cell argument was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::spec);
    EXPECT_NE(std::string(e.what()).find("library: 'openblas_f64_nt' cannot read args[5] 'K' from a cell"),
              std::string::npos) << e.what();
  }
  // The wgmma prefill's spec, whose S is a cell, takes cuDNN's attention beside its configs.
  const KernelSpec wg = load_spec(test::kernels() + "/cuda/attn_prefill_wg_bf16.toml");
  EXPECT_EQ(wg.libraries, (std::vector<std::string>{"cudnn_attn_bf16"}));
  EXPECT_TRUE(wg.args[5].cell);
}

TEST_F(LibraryTest, AChoiceOfALibraryTheBackendDoesNotCallIsRefusedWhenTheKernelIsMade) {
  Runtime rt(opts);
  KernelSpec s = test::spec_in(dir.path(), gemm_spec("openblass_f64_nn", 0), "gemm.cpp", kGemmSource);
  try {
    Kernel k(rt, s);
    FAIL() << "a kernel was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::spec);
    EXPECT_NE(std::string(e.what()).find("calls no library 'openblass' (it calls: openblas)"), std::string::npos)
        << e.what();
  }
  // A problem the library does not implement is unavailable, with why.
  EXPECT_NE(rt.backend("cpu").library_unavailable("openblas_bf16_nt").find("OpenBLAS has no bf16_nt"),
            std::string::npos);
  EXPECT_NE(rt.backend("cpu").library_unavailable("openblas_f32_nt_rmsnorm").find("OpenBLAS has no RMSNorm prologue"),
            std::string::npos);
  EXPECT_NE(rt.backend("cpu").library_unavailable("openblas_sgemm#2").find("does not rank"), std::string::npos);
}

// A warm process's first call whose record chose a library still being
// readied in the background runs the record's fastest config of kiln's own
// whose binary is at hand (compiled, or kept by the code cache or an
// artifact), never one it would have to compile; kiln pack ships that config
// wherever a library is among what it ships. (OpenBLAS is never readied in
// the background: the swap itself runs with cuBLASLt on a GPU, see
// bench/gpu/warm_start.sh.)
TEST_F(LibraryTest, WhileALibraryIsReadiedAFirstCallRunsTheFastestOwnConfigAtHandAndPacksShipIt) {
  Options mine = opts;
  Runtime rt(mine);
  if (!rt.backend("cpu").library_unavailable("openblas_f64_nn").empty())
    GTEST_SKIP() << "OpenBLAS is not installed here: " << rt.backend("cpu").library_unavailable("openblas_f64_nn");
  std::string text = gemm_spec("openblas_f64_nn", 0);
  text.replace(text.find("V = [1]"), 7, "V = [1, 2, 3]");
  KernelSpec s = test::spec_in(dir.path() / "spec", text, "gemm.cpp", kGemmSource);
  HostArgs args(s, parse_scalars(s, {{"M", "33"}, {"N", "47"}, {"K", "65"}}));
  args.fill_random(3);
  TuningRecord rec = rt.tune(s, args.params()).record;
  std::vector<const ConfigResult*> own;
  const ConfigResult* lib = nullptr;
  for (const ConfigResult* c : rec.ranked()) (c->config.library.empty() ? own.push_back(c) : void(lib = c));
  ASSERT_EQ(own.size(), 3u);
  ASSERT_NE(lib, nullptr);
  EXPECT_EQ(readying_library(rt, "cpu", lib->config), nullptr);  // OpenBLAS starts with its first call
  EXPECT_EQ(readying_library(rt, "cpu", own[0]->config), nullptr);
  const CallView call(s, rt.backend("cpu"), args.params());
  // Every config was compiled by the tuning: the fastest of kiln's own.
  auto got = own_choice_at_hand(rt, call, rec);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->first, own[0]->config);
  EXPECT_EQ(got->second, *own[0]->ns);
  // Another process with an empty cache has none at hand, until one is compiled:
  // then that one, though it is the slowest.
  TempDir other{"kiln-test"};
  Runtime rt2(test::options_in(other.path()));
  const CallView call2(s, rt2.backend("cpu"), args.params());
  EXPECT_FALSE(rt2.compile_pool("cpu").at_hand(s, own[2]->config));
  EXPECT_TRUE(rt2.compile_pool("cpu").at_hand(s, lib->config));  // a library choice has no binary
  EXPECT_FALSE(own_choice_at_hand(rt2, call2, rec));
  rt2.compile_pool("cpu").submit(s, own[2]->config).get();
  EXPECT_TRUE(rt2.compile_pool("cpu").at_hand(s, own[2]->config));
  got = own_choice_at_hand(rt2, call2, rec);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->first, own[2]->config);
  // What kiln pack ships for the record, the library made the fastest: with no
  // runners-up, the choice is the library (no binary) and the fastest own config
  // is added; with the choice one of kiln's own, nothing more.
  for (ConfigResult& c : rec.configs)
    if (!c.config.library.empty()) c.ns = *own[0]->ns / 2;
  std::vector<Config> ship = artifact_configs(rec, lib->config, 0);
  ASSERT_EQ(ship.size(), 1u);
  EXPECT_EQ(ship[0], own[0]->config);
  ship = artifact_configs(rec, own[1]->config, 0);
  ASSERT_EQ(ship.size(), 1u);
  EXPECT_EQ(ship[0], own[1]->config);
  ship = artifact_configs(rec, own[1]->config, 1);  // its runner-up is the library: the fastest own beside it
  ASSERT_EQ(ship.size(), 2u);
  EXPECT_EQ(ship[0], own[1]->config);
  EXPECT_EQ(ship[1], own[0]->config);
  EXPECT_EQ(artifact_configs(rec, lib->config, 3).size(), 3u);  // the three own configs, the library left out
}
