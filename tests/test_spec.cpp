#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "kiln/device.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/spec.hpp"
#include "util.hpp"

using namespace kiln;

namespace {

const char* kGood = R"SPEC(name    = "matmul"
backend = "cpu"
source  = "matmul.cpp"
entry   = "matmul"
grid    = ["cdiv(M, BM)", "cdiv(N, BN)"]
args = [
  { name = "A", type = "f32*", size = "M*K", intent = "in" },
  { name = "B", type = "f32*", size = "K*N", intent = "in" },
  { name = "C", type = "f32*", size = "M*N", intent = "out" },
  { name = "M", type = "i64" }, { name = "N", type = "i64" }, { name = "K", type = "i64" },
]
[params]
BM = [16, 32, 64]
BN = [16, 32]
BK = [8]
[tuning]
key   = ["M", "N", "K"]
hints = { M = [64, 256], N = [64, 256], K = [64, 256] }
)SPEC";

SourceReader reader() {
  return [](const std::filesystem::path& p) -> std::optional<std::string> {
    if (p.filename() == "matmul.cpp") return std::string("void matmul() {}");
    return std::nullopt;
  };
}

KernelSpec parse(const std::string& text) { return parse_spec(text, "k/matmul.toml", reader()); }

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::spec) << e.what();
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}


}  // namespace

TEST(Spec, ParsesTheExample) {
  KernelSpec s = parse(kGood);
  EXPECT_EQ(s.name, "matmul");
  EXPECT_EQ(s.args.size(), 6u);
  EXPECT_TRUE(s.args[0].pointer);
  EXPECT_EQ(s.args[2].intent, Intent::out);
  EXPECT_EQ(s.args[0].size.str(), "M * K");
  ASSERT_EQ(s.space.params.size(), 3u);
  EXPECT_EQ(s.space.params[0].name, "BM");  // file order, not key order
  EXPECT_EQ(s.space.params[1].name, "BN");
  EXPECT_EQ(s.space.size(), 6u);
  EXPECT_EQ(s.source_path, std::filesystem::path("k/matmul.cpp"));
  EXPECT_EQ(s.tuning.key, (std::vector<std::string>{"M", "N", "K"}));
  auto pts = s.tuning.hint_point_list();
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_EQ(pts[1], (std::vector<int64_t>{256, 256, 256}));
}

TEST(Spec, GridHintPointsTakeEveryCombination) {
  KernelSpec s = parse(replace(kGood, "hints = {", "hint_points = \"grid\"\nhints = {"));
  EXPECT_EQ(s.tuning.hint_point_list().size(), 8u);
}

TEST(Spec, ConfigSpaceEnumeratesAndIndexes) {
  KernelSpec s = parse(kGood);
  auto all = s.space.all();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0].str(), "BM=16 BN=16 BK=8");
  EXPECT_EQ(all[1].str(), "BM=16 BN=32 BK=8");
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(s.space.index_of(all[i]), i);
  KernelSpec t = parse(replace(kGood, "BK = [8]", "BK = [8, 16]"));
  EXPECT_NE(s.space.hash(), t.space.hash());
}

TEST(Spec, ErrorsNameFileLineColumnAndKey) {
  EXPECT_CONTAINS(error_of(replace(kGood, "entry   =", "colour = 1\nentry   =")), "k/matmul.toml:4:1: unknown key 'colour'");
  EXPECT_CONTAINS(error_of(replace(kGood, "\"matmul.cpp\"", "\"nope.cpp\"")), "k/matmul.toml:3:11: source file 'nope.cpp' not found");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "BK = []")), "params.BK has no values");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "BK = [8, 8]")), "k/matmul.toml:15:10: params.BK: duplicate value 8");
  // The column points into the expression inside the string.
  EXPECT_CONTAINS(error_of(replace(kGood, "\"cdiv(N, BN)\"", "\"cdiv(N, BN\"")), "k/matmul.toml:5:38: grid[1]: expected ',' or ')'");
  EXPECT_CONTAINS(error_of(replace(kGood, "\"cdiv(N, BN)\"", "\"cdiv(N, Q)\"")), "grid[1]: unknown symbol 'Q'");
  EXPECT_CONTAINS(error_of(replace(kGood, "\"cdiv(N, BN)\"", "\"cdiv(N, Q)\"")), "k/matmul.toml:5:36:");
  EXPECT_CONTAINS(error_of(replace(kGood, "type = \"f32*\", size = \"M*K\"", "type = \"f8*\", size = \"M*K\"")), "unknown type 'f8*'");
  EXPECT_CONTAINS(error_of(replace(kGood, "{ name = \"K\", type = \"i64\" }", "{ name = \"M\", type = \"i64\" }")), "duplicate name 'M'");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "K = [8]")), "duplicate name 'K'");
  EXPECT_CONTAINS(error_of(replace(kGood, "{ name = \"M\", type = \"i64\" }", "{ name = \"M\", type = \"i64\", size = \"4\" }")), "a size expression on a scalar");
  EXPECT_CONTAINS(error_of(replace(kGood, ", size = \"M*K\"", "")), "a pointer needs 'size'");
  EXPECT_CONTAINS(error_of(replace(kGood, "name    = \"matmul\"\n", "")), "missing required key 'name'");
  EXPECT_CONTAINS(error_of(replace(kGood, "backend = \"cpu\"", "backend = \"tpu\"")), "unknown backend 'tpu'");
  EXPECT_CONTAINS(error_of(replace(kGood, "grid    = [\"cdiv(M, BM)\", \"cdiv(N, BN)\"]", "grid = []")), "'grid' needs 1 to 3 expressions");
  EXPECT_CONTAINS(error_of(replace(kGood, "size = \"M*K\"", "size = \"M*A\"")), "'A' is a pointer argument");
  EXPECT_CONTAINS(error_of(replace(kGood, "size = \"M*K\"", "size = \"M*BK\"")), "argument sizes may use scalars only");
  EXPECT_CONTAINS(error_of(replace(kGood, "BM = [16, 32, 64]", "BM = [16, \"x\"]")), "'params.BM' must be an integer");
  EXPECT_CONTAINS(error_of(replace(kGood, "key   = [\"M\", \"N\", \"K\"]", "key   = [\"M\", \"N\", \"A\"]")), "'A' is not an integer scalar");
  EXPECT_CONTAINS(error_of(replace(kGood, "K = [64, 256] }", "K = [64] }")), "diagonal hint points need the same number");
  EXPECT_CONTAINS(error_of(replace(kGood, "hints = {", "default = { BM = 48, BN = 16, BK = 8 }\nhints = {")), "BM = 48 is not one of the param's values");
  EXPECT_CONTAINS(error_of(replace(kGood, "intent = \"out\"", "intent = \"write\"")), "unknown intent 'write'");
  EXPECT_CONTAINS(error_of(replace(kGood, "[params]", "[params\n")), "k/matmul.toml:12:8:");  // TOML syntax
  EXPECT_CONTAINS(error_of(replace(kGood, "name    = \"matmul\"", "name    = \"mat mul\"")), "is not an identifier");
}

// cell (an i64 scalar the kernel may read from a word on the device, docs/program.md) is a
// boolean of i64 scalars, never of a pointer, a float or a spec with library choices.
TEST(Spec, ACellIsABooleanOfAnI64Scalar) {
  const std::string m = "{ name = \"M\", type = \"i64\" }";
  EXPECT_TRUE(parse(replace(kGood, m, "{ name = \"M\", type = \"i64\", cell = true }")).args[3].cell);
  EXPECT_FALSE(parse(replace(kGood, m, "{ name = \"M\", type = \"i64\", cell = false }")).args[3].cell);
  EXPECT_FALSE(parse(kGood).args[3].cell);
  EXPECT_CONTAINS(error_of(replace(kGood, m, "{ name = \"M\", type = \"i64\", cell = 1 }")), "'cell' is true or false");
  EXPECT_CONTAINS(error_of(replace(kGood, m, "{ name = \"M\", type = \"i32\", cell = true }")),
                  "args[3] 'M': a cell is an i64 scalar");
  EXPECT_CONTAINS(error_of(replace(kGood, "intent = \"out\"", "intent = \"out\", cell = true")),
                  "args[2] 'C': a cell is an i64 scalar");
}

// pdl (a launch that may overlap the kernel before it) is a boolean of cuda kernels.
TEST(Spec, PdlIsABooleanOfCudaKernels) {
  EXPECT_CONTAINS(error_of(replace(kGood, "entry   =", "pdl = true\nentry   =")),
                  "k/matmul.toml:4:7: 'pdl' (a launch that may overlap the kernel before it) is for the cuda backend");
  std::string cuda = replace(kGood, "backend = \"cpu\"", "backend = \"cuda\"");
  EXPECT_CONTAINS(error_of(replace(cuda, "entry   =", "pdl = 1\nentry   =")), "k/matmul.toml:4:7: 'pdl' is true or false");
  EXPECT_FALSE(parse(cuda).pdl);
  EXPECT_TRUE(parse(replace(cuda, "entry   =", "pdl = true\nentry   =")).pdl);
}

// early_reads (buffers a pdl kernel reads before its wait) names input buffers of a pdl kernel;
// a launch plan marks their positions, and a family's members keep the operands they have.
TEST(Spec, EarlyReadsAreInputBuffersOfAPdlKernel) {
  const std::string cuda = replace(kGood, "backend = \"cpu\"", "backend = \"cuda\"");
  auto with = [](const std::string& spec, const std::string& keys) {
    return replace(spec, "entry   =", keys + "\nentry   =");
  };
  EXPECT_CONTAINS(error_of(with(kGood, "early_reads = [\"A\"]")),
                  "'early_reads' (buffers read before kiln_wait_prior()) is for the cuda backend");
  EXPECT_CONTAINS(error_of(with(cuda, "early_reads = [\"A\"]")), "needs pdl = true");
  const std::string pdl = with(cuda, "pdl = true");
  EXPECT_CONTAINS(error_of(with(pdl, "early_reads = [\"M\"]")),
                  "early_reads: 'M' is not an input buffer argument (intent in)");
  EXPECT_CONTAINS(error_of(with(pdl, "early_reads = [\"C\"]")),
                  "early_reads: 'C' is not an input buffer argument (intent in)");
  EXPECT_CONTAINS(error_of(with(pdl, "early_reads = [\"Z\"]")), "early_reads: 'Z' is not an input buffer argument");
  EXPECT_CONTAINS(error_of(with(pdl, "early_reads = [\"A\", \"A\"]")), "early_reads: 'A' appears twice");
  EXPECT_CONTAINS(error_of(with(pdl, "early_reads = \"A\"")), "early_reads");
  EXPECT_TRUE(parse(pdl).early_reads.empty());
  const KernelSpec s = parse(with(pdl, "early_reads = [\"B\", \"A\"]"));
  EXPECT_EQ(s.early_reads, (std::vector<std::string>{"B", "A"}));
  const int64_t slots[6] = {0, 0, 0, 64, 64, 64};
  EXPECT_EQ(LaunchPlan(s, s.space.at(0), LaunchLimits{}).eval(slots).early, 0b11u);  // A and B: arguments 0 and 1
  // A family's members keep the operands they have (the decode GEMM's file with the weights
  // listed: each member its own).
  const std::filesystem::path fam = std::filesystem::path(test::kernels()) / "cuda/gemm_decode.toml";
  const auto reader = [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream f(p);
    if (!f) return std::nullopt;
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string text = *reader(fam);
  const std::string pdl_line = "pdl     = true\n";
  ASSERT_NE(text.find(pdl_line), std::string::npos);
  const std::string listed = replace(text, pdl_line, pdl_line + "early_reads = [\"B\", \"Bg\", \"Bu\"]\n");
  const auto member = [&](const std::string& m) { return parse_spec(listed, fam, reader, m).early_reads; };
  EXPECT_EQ(member("bf16_nt"), (std::vector<std::string>{"B"}));
  EXPECT_EQ(member("bf16_nt_rmsnorm"), (std::vector<std::string>{"B"}));
  EXPECT_EQ(member("bf16_nt_gated"), (std::vector<std::string>{"Bg", "Bu"}));
  // The repository's decode GEMM asks L2 for its first weights before its wait: no early reads.
  EXPECT_TRUE(load_spec(fam.string() + ":bf16_nt_gated").early_reads.empty());
}

// may_overlap: a launch with early reads overlaps only within an EarlyReadScope, on its
// stream, where every early-read pointer lies in its ranges; a serial scope's first launch on
// its stream (whatever it is) does not overlap.
TEST(Spec, AnEarlyReadScopeVouchesForItsRangesOnItsStream) {
  alignas(8) static unsigned char mem[256];
  const auto base = reinterpret_cast<uintptr_t>(mem);
  void* a = mem + 16;   // in the first range
  void* b = mem + 200;  // in the second range
  void* c = mem + 100;  // in neither
  int64_t m = 0;
  void* params_ab[] = {&a, &b, &m};
  void* params_ac[] = {&a, &c, &m};
  LaunchDims plain, early;
  early.early = 0b11;
  const std::vector<EarlyReadRange> ranges = {{base, base + 64}, {base + 192, base + 256}};
  Stream s1 = reinterpret_cast<Stream>(0x10), s2 = reinterpret_cast<Stream>(0x20);
  EXPECT_TRUE(may_overlap(params_ab, plain, s1));
  EXPECT_FALSE(may_overlap(params_ab, early, s1)) << "outside any scope";
  {
    EarlyReadScope scope(&ranges, s1, /*serial_first=*/true);
    EXPECT_FALSE(may_overlap(params_ab, early, s2)) << "another stream (and its launch does not take the first)";
    EXPECT_FALSE(may_overlap(params_ab, plain, s1)) << "the scope's first launch";
    EXPECT_TRUE(may_overlap(params_ab, plain, s1));
    EXPECT_TRUE(may_overlap(params_ab, early, s1));
    EXPECT_FALSE(may_overlap(params_ac, early, s1)) << "an early read outside the ranges";
    {
      EarlyReadScope inner(nullptr, s2, false);
      EXPECT_FALSE(may_overlap(params_ab, early, s2)) << "a scope that vouches for nothing";
    }
    EXPECT_TRUE(may_overlap(params_ab, early, s1)) << "the outer scope again";
  }
  EXPECT_FALSE(may_overlap(params_ab, early, s1)) << "after the scope";
}

// workspace (device memory kiln keeps for a cuda kernel) is an expression of params, scalars
// and SM_COUNT; a launch plan evaluates it, and a kernel without one passes none (-1).
TEST(Spec, AWorkspaceIsAnExpressionOfCudaKernels) {
  EXPECT_CONTAINS(error_of(replace(kGood, "entry   =", "workspace = \"64\"\nentry   =")),
                  "k/matmul.toml:4:13: 'workspace' (device memory kiln keeps for the kernel) is for the cuda backend");
  std::string cuda = replace(kGood, "backend = \"cpu\"", "backend = \"cuda\"");
  EXPECT_CONTAINS(error_of(replace(cuda, "entry   =", "workspace = \"Q * 4\"\nentry   =")),
                  "workspace: unknown symbol 'Q'");
  EXPECT_CONTAINS(error_of(replace(cuda, "entry   =", "workspace = \"A\"\nentry   =")), "'A' is a pointer argument");
  EXPECT_FALSE(parse(cuda).workspace.has_value());
  const KernelSpec s = parse(replace(cuda, "entry   =", "workspace = \"SM_COUNT * BM * 4 + M\"\nentry   ="));
  ASSERT_TRUE(s.workspace.has_value());
  EXPECT_TRUE(make_compile_request(s, s.space.at(0)).workspace);
  EXPECT_FALSE(make_compile_request(parse(cuda), parse(cuda).space.at(0)).workspace);
  LaunchLimits limits;
  limits.multiprocessors = 132;
  limits.block[0] = 1024;
  limits.block_threads = 1024;
  limits.grid[0] = limits.grid[1] = limits.grid[2] = 1 << 30;
  std::vector<int64_t> slots(s.args.size());
  slots[static_cast<size_t>(s.arg_index("M"))] = 10;
  slots[static_cast<size_t>(s.arg_index("N"))] = 20;
  slots[static_cast<size_t>(s.arg_index("K"))] = 30;
  const Config c = s.space.at(0);
  const LaunchDims d = LaunchPlan(s, c, limits).eval(slots.data());
  EXPECT_EQ(d.workspace, 132 * *c.get("BM") * 4 + 10);
  EXPECT_EQ(d.nargs, static_cast<int>(s.args.size()));
  EXPECT_EQ(LaunchPlan(parse(cuda), c, limits).eval(slots.data()).workspace, -1);
}

TEST(Spec, LoadsTheBuiltInKernels) {
  for (const char* k : {"matmul", "softmax"}) {
    KernelSpec s = load_spec(std::filesystem::path(test::kernels()) / "cpu" / (std::string(k) + ".toml"));
    EXPECT_EQ(s.name, k);
    EXPECT_FALSE(s.source_text.empty());
  }
}

// The cuda matmul declares hints 64, 256, 4096 on the diagonal, and its grid
// form (every combination) is one line away.
TEST(Spec, TheCudaMatmulHintsOnTheDiagonalAndAsAGrid) {
  std::filesystem::path file = std::filesystem::path(test::kernels()) / "cuda/matmul.toml";
  KernelSpec s = load_spec(file);
  EXPECT_EQ(s.tuning.hint_point_list(),
            (std::vector<std::vector<int64_t>>{{64, 64, 64}, {256, 256, 256}, {4096, 4096, 4096}}));
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text = replace(text, "[tuning]\n", "[tuning]\nhint_points = \"grid\"\n");
  KernelSpec g = parse_spec(text, file, [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream f(p);
    if (!f) return std::nullopt;
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  });
  auto pts = g.tuning.hint_point_list();
  EXPECT_EQ(pts.size(), 27u);
  EXPECT_NE(std::find(pts.begin(), pts.end(), std::vector<int64_t>{64, 4096, 256}), pts.end());
}

TEST(Spec, MissingSpecFileIsAClearError) {
  try {
    load_spec("/nonexistent/k.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "/nonexistent/k.toml: cannot read the spec file");
  }
}

TEST(Spec, NonAsciiOutsideStringsAndCommentsIsRefusedWithItsPosition) {
  // toml++ 3.3.0 reaches __builtin_unreachable() on this input; kiln refuses it first.
  EXPECT_CONTAINS(error_of(replace(kGood, "[tuning]\n", "[tuning]\ndefault\xcf\xbc { BM = 16 }\n")),
                  "k/matmul.toml:17:8: a non-ASCII character outside a string or comment");
  // Inside comments and strings it is fine.
  KernelSpec s = parse(replace(kGood, "[params]", "# caf\xc3\xa9 \xcf\xbc\n[params]"));
  EXPECT_EQ(s.name, "matmul");
  s = parse(replace(kGood, "[params]", "description = \"\\\"caf\xc3\xa9\\\" \xcf\xbc\"\n[params]"));
  EXPECT_EQ(s.name, "matmul");
}

TEST(Spec, NonAsciiStringsSurviveAndPositionsStayTrue) {
  // A literal string with a quote, a backslash and non-ASCII text, rewritten for toml++ and read back alike.
  KernelSpec s = parse(replace(kGood, "[params]", "cflags = ['-DNAME=\"caf\xc3\xa9\"', 'a\\b', \"\xf0\x9f\x94\xa5\"]\n[params]"));
  ASSERT_EQ(s.cflags.size(), 3u);
  EXPECT_EQ(s.cflags[0], "-DNAME=\"caf\xc3\xa9\"");
  EXPECT_EQ(s.cflags[1], "a\\b");
  EXPECT_EQ(s.cflags[2], "\xf0\x9f\x94\xa5");
  // An error after non-ASCII text on the same line names the original column.
  EXPECT_CONTAINS(error_of(replace(kGood, "backend = \"cpu\"", "backend = \"cpu\xc3\xa9\xc3\xa9\"")), "k/matmul.toml:2:11: unknown backend");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "BK = ['\xc3\xa9\xc3\xa9', 8, 8]")), "k/matmul.toml:15:7: 'params.BK' must be an integer");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "BK = ['\xc3\xa9\xc3\xa9', ]\nx = 1 2")), "k/matmul.toml:16:7:");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "BK = [8]\xff")), "invalid UTF-8");
  EXPECT_CONTAINS(error_of(replace(kGood, "BK = [8]", "BK = [\"\\\xc3\xa9\"]")), "not a valid escape");
}

TEST(Spec, InputThatBreaksTheTomlParsersAssumptionsIsAnError) {
  // toml++ 3.3.0 asserts (or, built with NDEBUG under clang, assumes) something "[[[" breaks.
  EXPECT_CONTAINS(error_of("[[["), "k/matmul.toml: not valid TOML");
}

// Tuner::why_not keeps what it compiled for a config with the spec, never an answer: each
// call's scalars and each device's limits are checked anew, and a spec's copy or assignment
// answers by its own expressions.
TEST(Spec, WhyNotKeepsItsCompiledChecksWithTheSpecAndAnswersEachCall) {
  KernelSpec s = parse(replace(kGood, "[params]", "constraints = [\"M % BM == 0\"]\n[params]"));
  const Config c = s.space.at(0);  // BM = 16, BN = 16
  LaunchLimits l;
  int64_t fits[6] = {0, 0, 0, 64, 64, 64}, odd[6] = {0, 0, 0, 65, 64, 64};
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(Tuner::why_not(s, c, fits, l), "");
    EXPECT_CONTAINS(Tuner::why_not(s, c, odd, l), "constraint 'M % BM == 0' is false");
  }
  LaunchLimits narrow;
  narrow.grid[0] = 2;  // cdiv(64, 16) = 4 blocks: past it
  EXPECT_NE(Tuner::why_not(s, c, fits, narrow), "");
  EXPECT_EQ(Tuner::why_not(s, c, fits, l), "");
  // A spec changed in place after it was checked answers by what it says now.
  {
    KernelSpec u = s;
    int64_t m80[6] = {0, 0, 0, 80, 64, 64};
    EXPECT_EQ(Tuner::why_not(u, c, m80, l), "");  // 80 % 16 == 0
    u.space.params[0].values = {32, 64, 16};      // index 0 is BM = 32 now
    EXPECT_CONTAINS(Tuner::why_not(u, u.space.at(0), m80, l), "constraint 'M % BM == 0' is false");
    u.constraints[0] = Expr::parse("BN == 32");
    EXPECT_CONTAINS(Tuner::why_not(u, u.space.at(0), fits, l), "constraint 'BN == 32' is false");
    u.constraints.clear();
    EXPECT_EQ(Tuner::why_not(u, u.space.at(0), odd, l), "") << "no constraint is left";
    u.grid[0] = Expr::parse("cdiv(M, BM) * 0");
    EXPECT_CONTAINS(Tuner::why_not(u, u.space.at(0), fits, l), "empty grid");
  }
  // A copy changed after its original was checked answers by its own constraint.
  KernelSpec t = s;
  t.constraints = {Expr::parse("BM == 64")};
  EXPECT_CONTAINS(Tuner::why_not(t, c, fits, l), "constraint 'BM == 64' is false");
  EXPECT_EQ(Tuner::why_not(s, c, fits, l), "");
  // And an assignment over a checked spec too.
  s = t;
  EXPECT_CONTAINS(Tuner::why_not(s, c, fits, l), "constraint 'BM == 64' is false");
  // A config that is no point of the space is checked as well.
  Config outside = c;
  outside.values[0].second = 48;
  EXPECT_CONTAINS(Tuner::why_not(s, outside, fits, l), "constraint 'BM == 64' is false");
}
