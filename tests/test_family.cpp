// Kernel families (docs/families.md): one spec and one source for the members
// of a problem family; SM_COUNT, the device's symbol; a family's constants.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "kiln/args.hpp"
#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/kernel.hpp"
#include "kiln/library.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;


namespace {

std::string linear() { return test::kernels() + "/cpu/linear.toml"; }

std::string load_error(const fs::path& p) {
  try {
    load_spec(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A family of one source in a temporary folder; `extra` is appended to its spec.
struct FamilyFiles {
  TempDir dir{"kiln-family"};
  fs::path write(const std::string& spec) {
    test::write(dir.path() / "f.cpp", "void f(kiln::program_id, const float*, const float*, float*, int64_t, int64_t, "
                                       "int64_t) {}\n");
    test::write(dir.path() / "f.toml", spec);
    return dir.path() / "f.toml";
  }
};

const char* kFamily = R"SPEC(kind = "family"
name = "f"
backend = "cpu"
source = "f.cpp"
entry = "f"
grid = ["cdiv(N, BN)"]
[family]
problem = "gemm"
members = ["f32_nt", "f32_nt_residual"]
[params]
BN = [16, 64]
)SPEC";

}  // namespace

TEST(Family, EachMemberIsTheSpecOfItsProblem) {
  const std::vector<std::string> members = family_members(linear());
  ASSERT_EQ(members.size(), 9u);
  for (const std::string& m : members) {
    KernelSpec s = load_spec(linear() + ":" + m);
    const GemmProblem p = *parse_gemm_problem(m);
    EXPECT_EQ(s.name, "linear_" + m);
    EXPECT_EQ(s.member, m);
    EXPECT_EQ(s.spec_path.filename(), "linear.toml");
    const auto want = p.arguments();
    ASSERT_EQ(s.args.size(), want.size()) << m;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(s.args[i].name, want[i].name) << m;
      EXPECT_EQ(s.args[i].type_text(), want[i].type) << m;
      if (s.args[i].pointer) {
        EXPECT_EQ(s.args[i].size.str(), Expr::parse(want[i].size).str()) << m;
      }
    }
    for (const std::string& d : p.defines())
      EXPECT_NE(std::find(s.cflags.begin(), s.cflags.end(), d), s.cflags.end()) << m << " lacks " << d;
    EXPECT_EQ(s.constant("WEIGHTS"), p.weights()) << m;
    // Each member's own table gives it the library choice, completed with its problem.
    if (p.rmsnorm) {  // OpenBLAS has no RMSNorm prologue
      EXPECT_TRUE(s.libraries.empty()) << m;
      EXPECT_EQ(s.constant("RMSNORM"), 1) << m;
    } else {
      EXPECT_EQ(s.libraries, std::vector<std::string>{"openblas_" + m}) << m;
      EXPECT_EQ(s.constant("RMSNORM"), 0) << m;
    }
  }
  // Members differ in name and flags, so their records and binaries are their own.
  EXPECT_NE(load_spec(linear() + ":f32_nt_gelu").cflags, load_spec(linear() + ":f32_nt_silu").cflags);
}

// Every member computes its problem: tuned on its first call (on the cpu
// backend, through the system compiler), each is checked here against a
// plain double-precision product with the epilogue applied.
TEST(Family, EveryMemberComputesItsProblem) {
  TempDir dir("kiln-family");
  Options o = test::options_in(dir.path());
  o.bench_budget_ms = 2;
  Runtime rt(o);
  const int64_t M = 5, N = 19, K = 37;
  for (const std::string& m : family_members(linear())) {
    SCOPED_TRACE(m);
    KernelSpec s = load_spec(linear() + ":" + m);
    const GemmProblem p = *parse_gemm_problem(m);
    std::vector<std::pair<std::string, std::string>> sizes = {{"M", "5"}, {"N", "19"}, {"K", "37"}};
    if (p.rmsnorm) sizes.push_back({"eps", "1e-5"});
    HostArgs args(s, parse_scalars(s, sizes));
    args.fill_random(7);
    Kernel k(rt, s);
    k.launch(args.params());
    rt.wait_tuned();
    auto buf = [&](const char* name) {
      const int i = s.arg_index(name);
      return i < 0 ? nullptr : reinterpret_cast<const float*>(args.buffer(static_cast<size_t>(i)).data());
    };
    const float *A = buf("A"), *B = p.weights() == 2 ? buf("Bg") : buf("B"), *Bu = buf("Bu"), *C = buf("C");
    const float *bias = buf("bias"), *R = buf("R"), *g = buf("g");
    double worst = 0;
    for (int64_t i = 0; i < M; ++i) {
      double r = 1;  // with the RMSNorm prologue, row i's scale; A[i, q] * r * g[q] is multiplied
      if (g) {
        double ss = 0;
        for (int64_t q = 0; q < K; ++q) ss += double(A[i * K + q]) * A[i * K + q];
        r = 1 / std::sqrt(ss / double(K) + 1e-5);
      }
      for (int64_t j = 0; j < N; ++j) {
        double v = 0, u = 0;
        for (int64_t q = 0; q < K; ++q) {
          const double a = double(A[i * K + q]) * r * (g ? g[q] : 1.0);
          v += a * B[j * K + q];
          if (Bu) u += a * Bu[j * K + q];
        }
        if (bias) v += bias[j];
        if (R) v += R[i * N + j];
        const double silu = v / (1 + std::exp(-v)), gelu = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        switch (p.epilogue) {
          case GemmEpilogue::silu: v = silu; break;
          case GemmEpilogue::gelu:
          case GemmEpilogue::bias_gelu: v = gelu; break;
          case GemmEpilogue::gated: v = silu * u; break;
          default: break;
        }
        worst = std::max(worst, std::abs(v - C[i * N + j]));
      }
    }
    EXPECT_LT(worst, 1e-4);
  }
}

// Every member of every built-in family (the cuda ones read here, with no GPU):
// what a handle checks a call against is arguments only, never a family's constants.
TEST(Family, EveryBuiltInMembersCallChecksAreArgumentsOnly) {
  size_t members = 0;
  for (const char* dir : {"/cpu", "/cuda"})
    for (const auto& e : fs::directory_iterator(test::kernels() + dir)) {
      if (e.path().extension() != ".toml") continue;
      for (const std::string& m : family_members(e.path())) {
        KernelSpec s = load_spec(e.path().string() + ":" + m);
        for (const std::string& n : s.unkeyed_launch_scalars()) {
          const std::string_view target = align_target(n).empty() ? std::string_view(n) : align_target(n);
          EXPECT_GE(s.arg_index(target), 0) << s.name << ": " << n;
        }
        ++members;
      }
    }
  EXPECT_EQ(members, 9u + 10u + 4u + 5u + 3u);
}

TEST(Family, ANameThatIsNotAMemberSaysWhichAreAndBadFamiliesAreRefused) {
  EXPECT_CONTAINS(load_error(linear()), "a kernel family (linear); name a member as");
  EXPECT_CONTAINS(load_error(linear()), "f32_nt_gated");
  EXPECT_CONTAINS(load_error(linear() + ":f32_nt_relu"), "the family 'linear' has no member 'f32_nt_relu'");
  EXPECT_CONTAINS(load_error(test::kernels() + "/cpu/matmul.toml:f32_nt"), "not a kernel family");
  FamilyFiles f;
  auto err = [&](const std::string& spec, const std::string& member = "f32_nt") {
    return load_error(f.write(spec).string() + ":" + member);
  };
  EXPECT_EQ(err(kFamily), "");
  EXPECT_CONTAINS(err("args = []\n" + std::string(kFamily)), "f.toml:1:1: unknown key 'args'");
  EXPECT_CONTAINS(err(std::string(kFamily) + "[member.f32_nt]\nentry = \"g\"\n"), "unknown key 'entry' in [member.f32_nt]");
  EXPECT_CONTAINS(err(std::string(kFamily) + "[member.f16_nn]\nlibrary = []\n"), "member.f16_nn: not one of family.members");
  std::string bad = kFamily;
  bad.replace(bad.find("\"f32_nt\", "), 10, "\"f32_tn\", ");
  EXPECT_CONTAINS(err(bad), "'f32_tn' is not a GEMM problem");
  bad = kFamily;
  bad.replace(bad.find("problem = \"gemm\""), 16, "problem = \"conv\"");
  EXPECT_CONTAINS(err(bad), "family.problem: unknown 'conv'");
  EXPECT_CONTAINS(err("library = [\"openblas_f32_nt\"]\n" + std::string(kFamily)),
                  "f.toml:1:12: library: 'openblas_f32_nt': a family's library entry names the library alone");
  // Errors in a member's own keys point into the file too.
  EXPECT_CONTAINS(err(std::string(kFamily) + "[member.f32_nt]\nparams = { BN = [] }\n"), "f.toml:13:17: params.BN has no values");
  // A plain spec has no members.
  EXPECT_TRUE(family_members(test::kernels() + "/cpu/softmax.toml").empty());
}

// A member's override of [params] and [tuning] replaces the keys it names and keeps the others.
TEST(Family, AMembersTableReplacesTheKeysItNames) {
  FamilyFiles f;
  const fs::path p = f.write(std::string(kFamily) + "[tuning]\nkey = [\"M\", \"N\", \"K\"]\n"
                                                    "[member.f32_nt_residual]\nparams = { BN = [8] }\n"
                                                    "tuning = { default = { BN = 8 } }\n");
  KernelSpec plain = load_spec(p.string() + ":f32_nt"), res = load_spec(p.string() + ":f32_nt_residual");
  EXPECT_EQ(plain.space.size(), 2u);
  EXPECT_EQ(res.space.size(), 1u);
  EXPECT_EQ(res.tuning.key, (std::vector<std::string>{"M", "N", "K"})) << "the family's tuning key stays";
  ASSERT_TRUE(res.tuning.default_config);
  EXPECT_EQ(res.tuning.default_config->str(), "BN=8");
  EXPECT_FALSE(plain.tuning.default_config);
}

// SM_COUNT reads the device's multiprocessors where an expression is compiled
// for a launch; a member's absent operand reads as aligned (256).
TEST(Family, SmCountIsTheDevicesAndAnAbsentOperandIsAligned) {
  FamilyFiles f;
  std::string spec = kFamily;
  spec.replace(spec.find("grid = [\"cdiv(N, BN)\"]"), 22,
               "grid = [\"min(cdiv(N, BN), SM_COUNT)\"]\nconstraints = [\"align_R % 16 == 0\", \"WEIGHTS == 1\"]");
  const fs::path p = f.write(spec);
  KernelSpec s = load_spec(p.string() + ":f32_nt");
  EXPECT_EQ(s.constant("align_R"), 256);
  EXPECT_EQ(s.constant("align_Bu"), 256);
  EXPECT_FALSE(s.constant("align_B"));
  LaunchLimits l;
  l.block_threads = 1;
  l.multiprocessors = 3;
  const Config c = s.space.at(0);  // BN = 16
  int64_t slots[6] = {256, 256, 256, 100, 1000, 10};
  EXPECT_EQ(Tuner::why_not(s, c, slots, l), "");
  EXPECT_EQ(LaunchPlan(s, c, l).eval(slots).grid.x, 3) << "min(cdiv(1000, 16), SM_COUNT = 3)";
  l.multiprocessors = 100;
  EXPECT_EQ(LaunchPlan(s, c, l).eval(slots).grid.x, 63);
  // The residual member has R: its alignment is the call's.
  KernelSpec r = load_spec(p.string() + ":f32_nt_residual");
  int64_t rslots[7] = {256, 256, 256, 8, 100, 1000, 10};
  EXPECT_CONTAINS(Tuner::why_not(r, r.space.at(0), rslots, l), "constraint 'align_R % 16 == 0' is false");
  // A constant is no call's scalar: a handle's memo key holds none, and the handle is made.
  EXPECT_TRUE(s.unkeyed_launch_scalars().empty());
  {
    TempDir d("kiln-family");
    Runtime rt(test::options_in(d.path()));
    EXPECT_NO_THROW(Kernel(rt, s));
  }
  // With no device to ask, SM_COUNT is an error, not a guess.
  EXPECT_THROW(compile_expr(s, s.grid[0], &c), Error);
  // Sizes are allocated before any device is asked: they may not use it; nor may a name take it.
  EXPECT_CONTAINS(load_error(f.write(std::string(kFamily) + "[member.f32_nt]\nparams = { SM_COUNT = [1] }\n")
                                 .string() + ":f32_nt"),
                  "is a name kiln gives expressions");
  test::write(f.dir.path() / "plain.toml", R"SPEC(name = "p"
backend = "cpu"
source = "f.cpp"
entry = "f"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "SM_COUNT", intent = "out" } ]
)SPEC");
  EXPECT_CONTAINS(load_error(f.dir.path() / "plain.toml"), "argument sizes may use scalars only");
}

// The TMA family's tile widths that are not a multiple of 64 are offered only at shapes whose
// tiles they spread over the device's waves better than every power-of-two width, by the
// spec's constraint (132 SMs): 512 x 3072 (96 tiles of 128 x 128, 48 of 128 x 256) takes
// 128 x 96 (128 tiles); 128 x 18944 takes 128 x 160 (119 tiles, against 148 and 74); the
// squares none (4096^2: 7.76 waves of 128 x 128 tiles, which no odd width betters by 1/16).
TEST(Family, TheTmaFamilyOffersOddTileWidthsOnlyWhereTheyFillTheWavesBetter) {
  const KernelSpec s = load_spec(test::kernels() + "/cuda/gemm_tma.toml:bf16_nt");
  LaunchLimits l;
  l.multiprocessors = 132;
  l.shared = 232448;
  l.block[0] = l.block_threads = 1024;
  auto widths = [&](int64_t M, int64_t N, int64_t K) {
    int64_t slots[6] = {256, 256, 256, M, N, K};
    std::set<int64_t> w;
    for (const Config& c : s.space.all())
      if (*c.get("BM") == 128 && *c.get("BN") % 64 != 0 && Tuner::why_not(s, c, slots, l).empty()) w.insert(*c.get("BN"));
    return w;
  };
  EXPECT_EQ(widths(512, 3072, 8192), (std::set<int64_t>{96}));
  EXPECT_EQ(widths(128, 18944, 3584), (std::set<int64_t>{160}));
  EXPECT_EQ(widths(4096, 4096, 4096), (std::set<int64_t>{}));
  EXPECT_EQ(widths(8192, 8192, 8192), (std::set<int64_t>{}));
  // and never with split K
  int64_t slots[6] = {256, 256, 256, 512, 3072, 8192};
  for (const Config& c : s.space.all()) {
    if (*c.get("BN") % 64 == 0 || *c.get("SPLIT") == 1) continue;
    EXPECT_NE(Tuner::why_not(s, c, slots, l), "") << c.str();
  }
}

// tensor_maps (docs/spec.md): a member keeps the maps of the operands it has, in order, and
// a launch plan gives each map's view for the call; bad entries are refused at load.
TEST(Family, TensorMapsFollowTheMembersOperandsAndTheCall) {
  const std::string file = test::kernels() + "/cuda/gemm_tma.toml";
  KernelSpec nt = load_spec(file + ":bf16_nt"), gated = load_spec(file + ":bf16_nt_gated");
  ASSERT_EQ(nt.tensor_maps.size(), 2u);
  EXPECT_EQ(nt.tensor_maps[0].of, "A");
  EXPECT_EQ(nt.tensor_maps[1].of, "B");
  ASSERT_EQ(gated.tensor_maps.size(), 3u);
  EXPECT_EQ(gated.tensor_maps[1].of, "Bg");
  EXPECT_EQ(gated.tensor_maps[2].of, "Bu");
  EXPECT_EQ(make_compile_request(gated, gated.space.at(0)).tensor_maps, 3);
  LaunchLimits l;
  l.multiprocessors = 132;
  l.shared = 232448;
  l.block[0] = l.block_threads = 1024;
  Config c = *nt.tuning.default_config;  // 128 x 256 tiles
  int64_t slots[6] = {256, 256, 256, 1000, 3000, 4096};  // A, B, C aligned; M, N, K
  EXPECT_EQ(LaunchPlan(nt, c, l).eval(slots).grid.x, 96) << "8 x 12 tiles";
  slots[4] = 8000;
  LaunchDims d = LaunchPlan(nt, c, l).eval(slots);
  EXPECT_EQ(d.grid.x, 132) << "persistent: min(8 x 32 tiles, SM_COUNT)";
  EXPECT_EQ(d.nargs, 6);
  ASSERT_EQ(d.ntmap, 2);
  EXPECT_EQ(d.tmap[0].arg, 0);
  EXPECT_EQ(d.tmap[0].rows, 1000);
  EXPECT_EQ(d.tmap[0].cols, 4096);
  EXPECT_EQ(d.tmap[0].pitch, 4096);
  EXPECT_EQ(d.tmap[0].box_rows, 128);
  EXPECT_EQ(d.tmap[0].box_cols, 64);
  EXPECT_EQ(d.tmap[0].swizzle, 128);
  EXPECT_EQ(d.tmap[1].arg, 1);
  EXPECT_EQ(d.tmap[1].rows, 8000);
  EXPECT_EQ(d.tmap[1].box_rows, 256);
  // A spec without tensor maps passes none.
  EXPECT_EQ(LaunchPlan(load_spec(test::kernels() + "/cuda/gemm_wgmma.toml:bf16_nt"), c, l).eval(slots).ntmap, 0);

  FamilyFiles f;
  auto with = [&](const std::string& maps) {
    std::string spec = kFamily;
    spec.replace(spec.find("[family]"), 8, "tensor_maps = [" + maps + "]\n[family]");
    return load_error(f.write(spec).string() + ":f32_nt");
  };
  EXPECT_CONTAINS(with("{ of = \"A\", rows = \"M\", cols = \"K\", box_rows = \"8\", box_cols = \"8\" }"),
                  "TMA tensor maps are for the cuda backend");
  FamilyFiles g;
  auto cuda_with = [&](const std::string& maps) {
    std::string spec = kFamily;
    spec.replace(spec.find("backend = \"cpu\""), 15, "backend = \"cuda\"");
    spec.replace(spec.find("[family]"), 8, "tensor_maps = [" + maps + "]\n[family]");
    return load_error(g.write(spec).string() + ":f32_nt");
  };
  EXPECT_EQ(cuda_with("{ of = \"A\", rows = \"M\", cols = \"K\", box_rows = \"BN\", box_cols = \"8\", swizzle = 32 }"), "");
  {  // a view past its buffer is refused when the call's launch is planned
    std::string spec = kFamily;
    spec.replace(spec.find("backend = \"cpu\""), 15, "backend = \"cuda\"");
    spec.replace(spec.find("[family]"), 8,
                 "tensor_maps = [{ of = \"A\", rows = \"M + 1\", cols = \"K\", box_rows = \"8\", box_cols = \"8\" }]\n[family]");
    KernelSpec past = load_spec(g.write(spec).string() + ":f32_nt");
    int64_t s6[6] = {256, 256, 256, 100, 1000, 10};
    try {
      LaunchPlan(past, past.space.at(0), l).eval(s6);
      ADD_FAILURE() << "a view of 101 rows of a 100-row buffer was planned";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "reaches past its buffer's 1000 elements");
    }
  }
  EXPECT_CONTAINS(cuda_with("{ of = \"M\", rows = \"M\", cols = \"K\", box_rows = \"8\", box_cols = \"8\" }"),
                  "'M' is not a buffer argument");
  EXPECT_CONTAINS(cuda_with("{ of = \"A\", rows = \"M\", cols = \"K\", box_rows = \"8\", box_cols = \"8\", swizzle = 16 }"),
                  "one of 0, 32, 64, 128");
  EXPECT_CONTAINS(cuda_with("{ of = \"A\", rows = \"Q\", cols = \"K\", box_rows = \"8\", box_cols = \"8\" }"),
                  "unknown symbol 'Q'");
  EXPECT_CONTAINS(cuda_with("{ of = \"A\", rows = \"M\", box_rows = \"8\", box_cols = \"8\" }"), "'cols'");
  std::string five;
  for (int i = 0; i < 5; ++i) five += "{ of = \"A\", rows = \"M\", cols = \"K\", box_rows = \"8\", box_cols = \"8\" },";
  EXPECT_CONTAINS(cuda_with(five), "at most 4");
}
