// Programs: the file format and its errors, liveness planning, the cpu MLP
// block against a plain computation, graphs against plain launches (GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <fmt/format.h>

#include "core/fsutil.hpp"
#include "kiln/memory_plan.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/fill.hpp"
#include "kiln/kernel.hpp"
#include "kiln/program.hpp"
#include "emit.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::string examples() { return test::kernels() + "/programs"; }

struct ProgramTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.workers = 1;
  }
};

// The block in double: n = rmsnorm(x) * g; y = x + Wd (silu(Wg n) * (Wu n)).
std::vector<double> mlp_reference(const std::vector<float>& x, const std::vector<float>& g, const std::vector<float>& wg,
                                  const std::vector<float>& wu, const std::vector<float>& wd, int64_t T, int64_t H,
                                  int64_t I) {
  std::vector<double> y(T * H);
  std::vector<double> n(H), h(I);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t k = 0; k < H; ++k) ss += double(x[t * H + k]) * x[t * H + k];
    const double inv = 1 / std::sqrt(ss / H + 1e-5);
    for (int64_t k = 0; k < H; ++k) n[k] = x[t * H + k] * inv * g[k];
    for (int64_t i = 0; i < I; ++i) {
      double a = 0, b = 0;
      for (int64_t k = 0; k < H; ++k) a += wg[i * H + k] * n[k], b += wu[i * H + k] * n[k];
      h[i] = a / (1 + std::exp(-a)) * b;
    }
    for (int64_t j = 0; j < H; ++j) {
      double s = x[t * H + j];
      for (int64_t i = 0; i < I; ++i) s += wd[j * I + i] * h[i];
      y[t * H + j] = s;
    }
  }
  return y;
}

// A cpu program over the built-in rmsnorm, written out for the error cases.
std::string rms_program(const std::string& extra_top, const std::string& steps) {
  return R"(kind = "program"
version = 1
name = "p"
backend = "cpu"
constants = { H = 8 }
symbols = ["T"]
)" + extra_top + R"(
[[inputs]]
name = "x"
dtype = "f32"
shape = ["T", "H"]
[[inputs]]
name = "g"
dtype = "f32"
shape = ["H"]
[[outputs]]
name = "y"
dtype = "f32"
shape = ["T", "H"]
[kernels]
rms = ")" + test::kernels() + R"(/cpu/rmsnorm.toml"
)" + steps;
}

const char* kRmsStep = R"(
[[steps]]
launch = "rms"
args = ["x", "g", "y", "T", "H", "1e-5"]
)";

}  // namespace

TEST_F(ProgramTest, TheCpuMlpBlockMatchesItsPlainComputation) {
  ProgramSpec spec = load_program(examples() + "/mlp_cpu.toml");
  const int64_t H = 256, I = 704;
  std::vector<float> g(H), wg(I * H), wu(I * H), wd(H * I);
  fill_random(DType::f32, std::as_writable_bytes(std::span(g)), 1);
  fill_random(DType::f32, std::as_writable_bytes(std::span(wg)), 2);
  fill_random(DType::f32, std::as_writable_bytes(std::span(wu)), 3);
  fill_random(DType::f32, std::as_writable_bytes(std::span(wd)), 4);
  for (auto* w : {&wg, &wu, &wd})
    for (auto& v : *w) v *= 0.1f;
  for (FirstCall mode : {FirstCall::swap, FirstCall::wait}) {
    Options o = opts;
    o.first_call = mode;
    o.cache_dir = dir.path() / (mode == FirstCall::swap ? "swap" : "wait");
    Runtime rt(o);
    Program prog(rt, spec);
    for (int64_t T : {int64_t{1}, int64_t{37}, int64_t{100}, int64_t{37}}) {
      std::vector<float> x(T * H), y(T * H, -1);
      fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 10 + T);
      std::vector<double> ref = mlp_reference(x, g, wg, wu, wd, T, H, I);
      for (int call = 0; call < 2; ++call) {
        prog.run({{x.data(), {T, H}}, {g.data(), {H}}, {wg.data(), {I, H}}, {wu.data(), {I, H}}, {wd.data(), {H, I}}},
                 {{y.data(), {T, H}}});
        double err = 0, norm = 0;
        for (int64_t i = 0; i < T * H; ++i) err += (y[i] - ref[i]) * (y[i] - ref[i]), norm += ref[i] * ref[i];
        EXPECT_LT(std::sqrt(err / norm), 1e-5) << "T = " << T << ", call " << call;
        rt.wait_tuned();
      }
    }
    EXPECT_EQ(prog.stats().plans, 3u) << "a memory plan per shape, kept";
    // Both intermediates are live at the gated step: the arena holds both.
    MemoryPlan m = prog.memory({{"T", 37}});
    EXPECT_EQ(m.sum, 37 * H * 4 + 37 * I * 4);
    EXPECT_GE(m.arena, m.sum);
    EXPECT_LE(m.arena, m.sum + 2 * 256) << "no more than each buffer's rounding to the 256-byte alignment";
    EXPECT_NE(m.offset[0], m.offset[1]) << "live together: never the same memory";
  }
}

// Views that move within a bucket of S: a row of an input chosen by S and a row of an
// intermediate whose rows are S. Calls of one bucket (S = 5, 6, 7, 8) on the same tensors,
// then on other tensors, then on the first again: each result is a fresh program's.
TEST_F(ProgramTest, ViewsThatMoveWithinABucketFollowEachCall) {
  const std::string text = R"(kind = "program"
version = 1
name = "moving_views"
backend = "cpu"
symbols = ["N"]
scalars = ["S"]
buckets = { S = "pow2" }
guards = ["S >= 1"]
[[inputs]]
name = "x"
dtype = "f64"
shape = ["3", "N"]
[[inputs]]
name = "w"
dtype = "f64"
shape = ["N"]
[[outputs]]
name = "y"
dtype = "f64"
shape = ["N"]
[[buffers]]
name = "t"
dtype = "f64"
shape = ["S", "N"]
[kernels]
add = ")" + test::kernels() + R"(/cpu/ref_add_f64.toml"
[[steps]]
launch = "add"
args = ["x[S % 3]", "w", "t[S - 1]", "N"]
[[steps]]
launch = "add"
args = ["t[S - 1]", "w", "y", "N"]
)";
  Runtime rt(opts);
  const ProgramSpec spec = parse_program(text, dir.path() / "p.toml");
  Program reused(rt, spec);
  constexpr int64_t N = 6;
  std::vector<double> xa(3 * N), xb(3 * N), w(N);
  for (int64_t i = 0; i < 3 * N; ++i) xa[i] = static_cast<double>(i), xb[i] = 100.0 + static_cast<double>(i);
  for (int64_t i = 0; i < N; ++i) w[i] = 0.5 * static_cast<double>(i + 1);
  struct Call {
    std::vector<double>* x;
    int64_t S;
  };
  for (const Call& c : {Call{&xa, 5}, Call{&xa, 6}, Call{&xa, 7}, Call{&xb, 8}, Call{&xa, 8}, Call{&xa, 6}}) {
    std::vector<double> got(N, -1), want(N, -2);
    reused.run({{c.x->data(), {3, N}}, {w.data(), {N}}}, {{got.data(), {N}}}, nullptr, {c.S});
    Program fresh(rt, spec);
    fresh.run({{c.x->data(), {3, N}}, {w.data(), {N}}}, {{want.data(), {N}}}, nullptr, {c.S});
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(want[i], (*c.x)[(c.S % 3) * N + i] + 2 * w[i]) << "S=" << c.S;
    EXPECT_EQ(got, want) << "S=" << c.S << (c.x == &xa ? " on xa" : " on xb");
  }
  EXPECT_EQ(reused.stats().plans, 1u) << "S = 5 .. 8: one bucket, one plan";
}

TEST_F(ProgramTest, BadProgramsAreRefusedWithTheReason) {
  struct Case {
    std::string text, expect;
  };
  const std::string ok_steps = kRmsStep;
  std::vector<Case> cases = {
      {[&] {
         std::string t = rms_program("", ok_steps);
         return t.replace(t.find("version = 1"), 11, "version = 2");
       }(),
       "this kiln reads program files of version 1"},
      {[&] {
         std::string t = rms_program("", ok_steps);
         return t.replace(t.find("kind = \"program\""), 16, "");
       }(),
       "kind = \"program\""},
      {rms_program("colour = \"red\"", ok_steps), "unknown key 'colour'"},
      {[&] {
         std::string t = rms_program("", ok_steps);
         return t.replace(t.find("shape = [\"H\"]"), 13, "shape = [\"Q\"]");
       }(),
       "'Q' is not a symbol or constant"},
      {rms_program("", "[[steps]]\nlaunch = \"nope\"\nargs = []\n"), "kernel 'nope' is not one of the program's kernels"},
      {rms_program("", "[[steps]]\nlaunch = \"rms\"\nargs = [\"x\", \"g\", \"y\"]\n"), "takes 6 arguments"},
      {rms_program("", "[[steps]]\nlaunch = \"rms\"\nargs = [\"x\", \"g\", \"x\", \"T\", \"H\", \"1e-5\"]\n"),
       "inputs are read only"},
      {rms_program("", "[[steps]]\nlaunch = \"rms\"\nargs = [\"x\", \"g\", \"y\", \"T\", \"H\", \"huge\"]\n"),
       "'huge' is not a number"},
      {rms_program("", "[[steps]]\nlaunch = \"rms\"\nargs = [\"x\", \"g\", \"y\", \"T + Z\", \"H\", \"1e-5\"]\n"),
       "'Z' is not a symbol or constant"},
      {[&] {
         std::string t = rms_program("", ok_steps);
         return t.replace(t.find("name = \"y\"\ndtype = \"f32\""), 24, "name = \"y\"\ndtype = \"f64\"");
       }(),
       "'y' is f64, but kernel 'rms' takes f32*"},
      {[&] {
         std::string t = rms_program("", ok_steps);
         return t.replace(t.find("shape = [\"T\", \"H\"]"), 18, "shape = [\"T + 1\", \"H\"]");
       }(),
       "symbol 'T' is bound by no input"},
      {rms_program("[[buffers]]\nname = \"t\"\ndtype = \"f32\"\nshape = [\"T\", \"H\"]\n",
                   "[[steps]]\nlaunch = \"rms\"\nargs = [\"t\", \"g\", \"y\", \"T\", \"H\", \"1e-5\"]\n"),
       "reads 't' before any step writes it"},
  };
  for (const auto& c : cases) {
    try {
      parse_program(c.text, dir.path() / "p.toml");
      ADD_FAILURE() << "accepted; expected: " << c.expect;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::spec);
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(parse_program(rms_program("", ok_steps), dir.path() / "p.toml"));
}

TEST_F(ProgramTest, ShapesAndGuardsAreCheckedAtTheCallAndNamed) {
  ProgramSpec p = parse_program(rms_program("guards = [\"T >= 2\", \"T % 2 == 0\"]", kRmsStep), dir.path() / "p.toml");
  Runtime rt(opts);
  Program prog(rt, p);
  std::vector<float> x(64), g(8), y(64);
  auto run = [&](int64_t T, int64_t gd, int64_t yt) {
    prog.run({{x.data(), {T, 8}}, {g.data(), {gd}}}, {{y.data(), {yt, 8}}});
  };
  auto expect = [&](auto f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::usage);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect([&] { run(1, 8, 1); }, "guard 'T >= 2' does not hold for T=1");
  expect([&] { run(3, 8, 3); }, "guard 'T % 2 == 0' does not hold for T=3");
  expect([&] { run(4, 5, 4); }, "input 'g' dimension 0 is 5, but the program says H = 8");
  expect([&] { run(4, 8, 6); }, "output 'y' dimension 0 is 6, but the program says T = 4");
  EXPECT_NO_THROW(run(4, 8, 4));
  EXPECT_EQ(prog.bind({{x.data(), {6, 8}}, {g.data(), {8}}}).at("T"), 6);
}

TEST_F(ProgramTest, TheBuilderMakesWhatTheFileSays) {
  ProgramSpec file = load_program(examples() + "/mlp_cpu.toml");
  const std::string k = test::kernels() + "/cpu/";
  ProgramSpec built = ProgramBuilder("mlp_cpu", "cpu")
                          .constant("H", 256)
                          .constant("I", 704)
                          .symbol("T")
                          .guard("T >= 1")
                          .guard("T <= 1048576")
                          .input("x", DType::f32, {"T", "H"})
                          .input("g", DType::f32, {"H"})
                          .input("w_gate", DType::f32, {"I", "H"})
                          .input("w_up", DType::f32, {"I", "H"})
                          .input("w_down", DType::f32, {"H", "I"})
                          .output("y", DType::f32, {"T", "H"})
                          .buffer("n", DType::f32, {"T", "H"})
                          .buffer("h", DType::f32, {"T", "I"})
                          .kernel("rmsnorm", k + "rmsnorm.toml")
                          .kernel("gate_up", k + "linear.toml:f32_nt_gated")
                          .kernel("down", k + "linear.toml:f32_nt_residual")
                          .launch("rmsnorm", {"x", "g", "n", "T", "H", "1e-5"})
                          .launch("gate_up", {"n", "w_gate", "w_up", "h", "T", "I", "H"})
                          .launch("down", {"h", "w_down", "y", "x", "T", "H", "I"})
                          .build();
  // The same program, but for where each kernel's spec was found.
  auto body = [](const ProgramSpec& p) {
    std::string s = p.str();
    std::string out;
    std::istringstream in(s);
    for (std::string line; std::getline(in, line);)
      if (line.find("  kernel ") != 0) out += line + "\n";
    return out;
  };
  EXPECT_EQ(body(built), body(file));
  EXPECT_THROW(ProgramBuilder("b", "cpu").symbol("T").build(), Error);
  // The builder makes the spec itself: its errors name what was given.
  try {
    ProgramBuilder("b", "cpu").symbol("T").guard("T >");
    ADD_FAILURE() << "a malformed guard was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("program 'b': guards:"), std::string::npos) << e.what();
  }
  try {
    ProgramBuilder("b", "cpu").symbol("class").launch("k", {}).build();
    ADD_FAILURE() << "a keyword was taken as a symbol";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("symbol \"class\" is not a name"), std::string::npos) << e.what();
  }
}

// Liveness planning over random programs: buffers whose lives overlap never
// share a byte; offsets are aligned; the arena holds every buffer.
TEST(MemoryPlan, LiveBuffersNeverOverlapOverRandomPrograms) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3000; ++round) {
    const int n = 1 + static_cast<int>(rng() % 12), steps = 1 + static_cast<int>(rng() % 10);
    std::vector<int64_t> bytes(n);
    std::vector<std::pair<int, int>> live(n);
    for (int i = 0; i < n; ++i) {
      bytes[i] = static_cast<int64_t>(rng() % 5000);
      int a = static_cast<int>(rng() % steps), b = static_cast<int>(rng() % steps);
      live[i] = {std::min(a, b), std::max(a, b)};
    }
    MemoryPlan p = plan_memory(bytes, live, 256);
    int64_t peak_live = 0;
    for (int s = 0; s < steps; ++s) {
      int64_t at = 0;
      for (int i = 0; i < n; ++i)
        if (live[i].first <= s && s <= live[i].second) at += bytes[i];
      peak_live = std::max(peak_live, at);
    }
    ASSERT_GE(p.arena, peak_live) << "round " << round;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(p.offset[i] % 256, 0);
      ASSERT_LE(p.offset[i] + bytes[i], p.arena);
      for (int j = i + 1; j < n; ++j) {
        const bool together = !(live[i].second < live[j].first || live[j].second < live[i].first);
        const bool share = p.offset[i] < p.offset[j] + bytes[j] && p.offset[j] < p.offset[i] + bytes[i] &&
                           bytes[i] > 0 && bytes[j] > 0;
        ASSERT_FALSE(together && share) << "round " << round << ": buffers " << i << " and " << j;
      }
    }
  }
  // Buffers that are never live together share their bytes.
  MemoryPlan p = plan_memory({1000, 1000, 1000}, {{0, 0}, {1, 1}, {2, 2}});
  EXPECT_EQ(p.arena, 1024);
  EXPECT_EQ(p.sum, 3000);
}

TEST_F(ProgramTest, EmittedCppNamesEveryStepAndTheArena) {
  std::string code = emit_program_cpp(load_program(examples() + "/mlp_cpu.toml"));
  for (const char* s : {"struct Program", "kiln::plan_memory", "k_rmsnorm.launch", "k_gate_up.launch", "k_down.launch",
                        "guard 'T >= 1' does not hold", "const float* b_x", "float* b_y", "int64_t s_T"})
    EXPECT_NE(code.find(s), std::string::npos) << s;
  // (scripts/test-install.sh compiles it against an installed kiln and runs it.)
}

// A cuda program's graph replay computes what its plain launches compute.
TEST_F(ProgramTest, GraphReplayEqualsPlainLaunchesOnTheGpu) {
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  const std::string text = R"(kind = "program"
version = 1
name = "twice_normed"
backend = "cuda"
constants = { H = 1024 }
symbols = ["T"]
[[inputs]]
name = "x"
dtype = "bf16"
shape = ["T", "H"]
[[inputs]]
name = "g"
dtype = "bf16"
shape = ["H"]
[[outputs]]
name = "y"
dtype = "bf16"
shape = ["T", "H"]
[[buffers]]
name = "n"
dtype = "bf16"
shape = ["T", "H"]
[kernels]
rms = ")" + test::kernels() + R"(/cuda/rmsnorm_bf16.toml"
[[steps]]
launch = "rms"
args = ["x", "g", "n", "T", "H", "1e-5"]
[[steps]]
launch = "rms"
args = ["n", "g", "y", "T", "H", "1e-5"]
)";
  ProgramSpec p = parse_program(text, dir.path() / "p.toml");
  std::vector<std::vector<std::byte>> results;
  for (bool graphs : {false, true}) {
    Options o = opts;
    o.program_graphs = graphs;
    Runtime rt(o);
    Device& dev = rt.backend("cuda").device();
    const int64_t T = 77, H = 1024;
    DeviceBuffer x(dev, T * H * 2), g(dev, H * 2), y(dev, T * H * 2);
    std::vector<std::byte> hx(T * H * 2), hg(H * 2);
    fill_random(DType::bf16, hx, 3);
    fill_random(DType::bf16, hg, 4);
    dev.to_device(x.get(), hx.data(), hx.size(), nullptr);
    dev.to_device(g.get(), hg.data(), hg.size(), nullptr);
    Program prog(rt, p);
    for (int i = 0; i < 6; ++i) {
      if (i == 5) {  // the last call alone writes what is compared: a replay that launched nothing would show
        dev.sync(nullptr);
        std::vector<std::byte> zero(T * H * 2);
        dev.to_device(y.get(), zero.data(), zero.size(), nullptr);
      }
      prog.run({{x.get(), {T, H}}, {g.get(), {H}}}, {{y.get(), {T, H}}});
      if (i == 1) rt.wait_tuned();
    }
    dev.sync(nullptr);
    std::vector<std::byte> out(T * H * 2);
    dev.to_host(out.data(), y.get(), out.size(), nullptr);
    results.push_back(out);
    if (graphs) {
      EXPECT_GE(prog.stats().graph_captures, 1u);
      EXPECT_GT(prog.stats().graph_replays, prog.stats().graph_captures) << "a captured graph was replayed later";
    } else {
      EXPECT_EQ(prog.stats().graph_replays, 0u);
    }
  }
  EXPECT_EQ(results[0], results[1]);
}

// A kernel that does not compile is named with the program's step.
TEST_F(ProgramTest, ACompileErrorNamesTheProgramStep) {
  test::write(dir.path() / "bad.cpp", "void bad(kiln::program_id, const float* x, float* y, int64_t n) { oops; }\n");
  test::write(dir.path() / "bad.toml", R"(name = "bad"
backend = "cpu"
source = "bad.cpp"
entry = "bad"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
)");
  const std::string text = R"(kind = "program"
version = 1
name = "p"
backend = "cpu"
symbols = ["N"]
[[inputs]]
name = "x"
dtype = "f32"
shape = ["N"]
[[outputs]]
name = "y"
dtype = "f32"
shape = ["N"]
[kernels]
bad = "bad.toml"
[[steps]]
launch = "bad"
args = ["x", "y", "N"]
)";
  test::write(dir.path() / "p.toml", text);
  Runtime rt(opts);
  Program prog(rt, load_program(dir.path() / "p.toml"));
  std::vector<float> x(16), y(16);
  try {
    prog.run({{x.data(), {16}}}, {{y.data(), {16}}});
    FAIL() << "it ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("program 'p', step 1 (bad)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("oops"), std::string::npos) << e.what();
  }
}

// kiln run --check's library side: the cpu MLP block passes against its
// reference program (plain kernels in double, a different wiring: no fusion)
// at a small T and, rows sampled, at a larger one; the same block with the
// gate and up weights of its fused step swapped (the reference untouched)
// fails, naming the output and its worst element.
TEST_F(ProgramTest, TheCheckPassesTheBlockAndFailsItWithTwoArgumentsSwapped) {
  const std::string text = read_file(examples() + "/mlp_cpu.toml").value();
  std::string swapped = text;
  const std::string step = R"(args   = ["n", "w_gate", "w_up", "h", "T", "I", "H"])";
  ASSERT_NE(swapped.find(step), std::string::npos);
  swapped.replace(swapped.find(step), step.size(), R"(args   = ["n", "w_up", "w_gate", "h", "T", "I", "H"])");
  const int64_t H = 256, I = 704;
  std::vector<float> g(H), wg(I * H), wu(I * H), wd(H * I);
  fill_random(DType::f32, std::as_writable_bytes(std::span(g)), 1);
  fill_random(DType::f32, std::as_writable_bytes(std::span(wg)), 2);
  fill_random(DType::f32, std::as_writable_bytes(std::span(wu)), 3);
  fill_random(DType::f32, std::as_writable_bytes(std::span(wd)), 4);
  opts.first_call = FirstCall::wait;
  Runtime rt(opts);
  for (bool swap : {false, true}) {
    // Written beside the original, so its reference and kernels are found the same way.
    const fs::path file = fs::path(examples()) / "mlp_cpu.toml";
    ProgramSpec spec = parse_program(swap ? swapped : text, file);
    ASSERT_FALSE(spec.check.reference.empty());
    Program prog(rt, spec);
    for (int64_t T : {int64_t{5}, int64_t{150}}) {
      std::vector<float> x(T * H), y(T * H, -1);
      fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 10 + T);
      ProgramCheck c = prog.check(
          {{x.data(), {T, H}}, {g.data(), {H}}, {wg.data(), {I, H}}, {wu.data(), {I, H}}, {wd.data(), {H, I}}},
          {{y.data(), {T, H}}});
      ASSERT_EQ(c.outputs.size(), 1u);
      EXPECT_EQ(c.outputs[0].name, "y");
      EXPECT_EQ(c.outputs[0].compared, static_cast<size_t>(std::min<int64_t>(T, 64) * H)) << c.str();
      EXPECT_NE(c.rows.find(T > 64 ? "64 of the 150 rows of T" : "all 5 rows"), std::string::npos) << c.rows;
      if (!swap) {
        EXPECT_TRUE(c.ok()) << c.str();
        continue;
      }
      EXPECT_FALSE(c.ok()) << c.str();
      EXPECT_GT(c.outputs[0].bad, 0u);
      EXPECT_EQ(c.outputs[0].worst.rfind("y[", 0), 0u) << c.outputs[0].worst;
      EXPECT_NE(c.str().find("check FAILED"), std::string::npos);
      // The worst element is named where it is in the block's output, and holds what the block wrote there.
      const std::string w = c.outputs[0].worst;
      const int64_t row = std::stoll(w.substr(2)), col = std::stoll(w.substr(w.find(", ") + 2));
      ASSERT_LT(row, T);
      char got[64];
      std::snprintf(got, sizeof got, "= %.6g where", static_cast<double>(y[row * H + col]));
      EXPECT_NE(w.find(got), std::string::npos) << w;
    }
  }
  // A program with no reference cannot be checked, and says so.
  ProgramSpec none = parse_program(rms_program("", kRmsStep), dir.path() / "p.toml");
  Program p(rt, none);
  std::vector<float> x(16), g8(8), y(16);
  EXPECT_THROW(p.check({{x.data(), {2, 8}}, {g8.data(), {8}}}, {{y.data(), {2, 8}}}), Error);
}

// A graph captured with a multi-kernel's scratch replays after the calling
// thread's scratch was outgrown by a larger shape: the outgrown buffer is kept
// for it, so the replay writes nothing it does not own (a buffer allocated
// after the growth keeps its bytes) and gives the same result as before.
TEST_F(ProgramTest, AGraphReplaysAfterItsScratchWasOutgrown) {
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  const std::string text = R"(kind = "program"
version = 1
name = "gated"
backend = "cuda"
constants = { H = 256, I = 512 }
symbols = ["T"]
[[inputs]]
name = "x"
dtype = "bf16"
shape = ["T", "H"]
[[inputs]]
name = "wg"
dtype = "bf16"
shape = ["I", "H"]
[[inputs]]
name = "wu"
dtype = "bf16"
shape = ["I", "H"]
[[outputs]]
name = "h"
dtype = "bf16"
shape = ["T", "I"]
[kernels]
gate_up = ")" + test::kernels() + R"(/cuda/mlp_gate_up_bf16.toml"
[[steps]]
launch = "gate_up"
args = ["x", "wg", "wu", "h", "T", "I", "H"]
)";
  ProgramSpec p = parse_program(text, dir.path() / "p.toml");
  Options o = opts;
  o.force_variant = 2;  // the unfused form: two GEMMs into scratch, then silu * mul
  o.first_call = FirstCall::wait;
  Runtime rt(o);
  Device& dev = rt.backend("cuda").device();
  const int64_t H = 256, I = 512, Tbig = 512;
  DeviceBuffer x(dev, Tbig * H * 2), wg(dev, I * H * 2), wu(dev, I * H * 2), h(dev, Tbig * I * 2);
  for (auto [buf, n, seed] : {std::tuple{&x, Tbig * H, 1}, {&wg, I * H, 2}, {&wu, I * H, 3}}) {
    std::vector<std::byte> b(static_cast<size_t>(n) * 2);
    fill_random(DType::bf16, b, static_cast<uint64_t>(seed));
    dev.to_device(buf->get(), b.data(), b.size(), nullptr);
  }
  Program prog(rt, p);
  auto run = [&](int64_t T) { prog.run({{x.get(), {T, H}}, {wg.get(), {I, H}}, {wu.get(), {I, H}}}, {{h.get(), {T, I}}}); };
  auto out = [&](int64_t T) {
    dev.sync(nullptr);
    std::vector<std::byte> b(static_cast<size_t>(T * I * 2));
    dev.to_host(b.data(), h.get(), b.size(), nullptr);
    return b;
  };
  for (int i = 0; i < 4; ++i) run(8);  // tuned, captured, replayed
  const std::vector<std::byte> first = out(8);
  for (int i = 0; i < 4; ++i) run(Tbig);  // the thread's scratch grows past T = 8's
  dev.sync(nullptr);
  // Memory allocated now may land where a freed buffer was.
  std::vector<DeviceBuffer> fresh;
  std::vector<std::byte> pattern(8 * I * 2, std::byte{0x3c});
  for (int i = 0; i < 8; ++i) {
    fresh.emplace_back(dev, pattern.size());
    dev.to_device(fresh.back().get(), pattern.data(), pattern.size(), nullptr);
  }
  const uint64_t replays = prog.stats().graph_replays;
  std::vector<std::byte> zero(8 * I * 2);
  dev.to_device(h.get(), zero.data(), zero.size(), nullptr);
  run(8);
  EXPECT_GT(prog.stats().graph_replays, replays) << "T = 8 ran its graph";
  EXPECT_EQ(out(8), first);
  for (auto& f : fresh) {
    std::vector<std::byte> b(pattern.size());
    dev.to_host(b.data(), f.get(), b.size(), nullptr);
    EXPECT_EQ(b, pattern) << "the replay wrote into memory allocated after the growth";
  }
}

// The overlap tests' consumers copy what the producer writes (out[i] = i + 1): the number of
// the n out[i] that are not, once the device is done.
static int64_t stale_count(Device& dev, void* out, int64_t n) {
  std::vector<int32_t> h(static_cast<size_t>(n));
  dev.sync(nullptr);
  dev.to_host(h.data(), out, static_cast<size_t>(n) * 4, nullptr);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += h[static_cast<size_t>(i)] != static_cast<int32_t>(i + 1);
  return bad;
}

// Overlapping launches (a spec's pdl): a consumer launched to overlap a slow producer reads
// what the producer wrote when it waits for it (kiln_wait_prior), and stale data when it does
// not, launched alone, and in a program's steps, plainly and as a graph; with overlapping
// turned off (KILN_PDL=0) the consumer without the wait is correct too. The stale reads are
// the proof that the launches overlapped: a test that passed without them would prove nothing.
TEST_F(ProgramTest, AnOverlappedConsumerReadsStaleDataWithoutTheWait) {
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  {
    Runtime probe(opts);
    const std::string arch = probe.backend("cuda").device().info().arch;
    if (arch < "sm_90" && arch.size() == 5)
      GTEST_SKIP() << "the GPU is " << arch << ": launches overlap on sm_90 or newer only";
  }
  const std::string fx = test::source_dir() + "/tests/fixtures/pdl";
  const int64_t n = 1 << 20;
  const int64_t spin = 4000000;  // clock cycles, about 2 ms: the consumer has long ended by then
  auto stale = [&](Device& dev, void* out) { return stale_count(dev, out, n); };
  for (bool pdl : {true, false}) {
    Options o = opts;
    o.cuda_pdl = pdl;
    Runtime rt(o);
    Device& dev = rt.backend("cuda").device();
    DeviceBuffer zeros(dev, n * 4), mid(dev, n * 4), out(dev, n * 4);
    const std::vector<int32_t> z(n, 0);
    dev.to_device(zeros.get(), z.data(), n * 4, nullptr);
    auto* pm = static_cast<int32_t*>(mid.get());
    auto* po = static_cast<int32_t*>(out.get());
    Kernel produce(rt, load_spec(fx + "/produce.toml"));
    for (int wait : {0, 1}) {
      SCOPED_TRACE(fmt::format("launched alone, KILN_PDL={}, consumer {} the wait", pdl, wait ? "with" : "without"));
      Kernel consume(rt, load_spec(fx + fmt::format("/consume_wait{}.toml", wait)));
      // The first call of a handle may do more than launch (compile, check): its stale read is
      // not asked for.
      for (int rep = 0; rep < 4; ++rep) {
        dev.to_device(mid.get(), z.data(), n * 4, nullptr);
        dev.to_device(out.get(), z.data(), n * 4, nullptr);
        dev.sync(nullptr);
        produce(pm, n, spin);
        consume(static_cast<const int32_t*>(pm), po, n);
        const int64_t bad = stale(dev, out.get());
        if (wait || !pdl) {
          EXPECT_EQ(bad, 0) << "the consumer read data the producer had not written";
        } else if (rep > 0) {
          EXPECT_GT(bad, 0) << "the consumer without the wait read only fresh data: the launches did not overlap";
        }
      }
    }
    // The same chain as a program's steps: x (zeros) copied into mid, the producer over it,
    // the consumer to y; run plainly (graphs off), then captured and replayed.
    for (int wait : {0, 1})
      for (bool graphs : {false, true}) {
        SCOPED_TRACE(fmt::format("a program, graphs {}, KILN_PDL={}, consumer {} the wait", graphs, pdl,
                                 wait ? "with" : "without"));
        const std::string text = fmt::format(R"(kind = "program"
version = 1
name = "overlap"
backend = "cuda"
constants = {{ SPIN = {} }}
symbols = ["N"]
[[inputs]]
name = "x"
dtype = "i32"
shape = ["N"]
[[outputs]]
name = "y"
dtype = "i32"
shape = ["N"]
[[buffers]]
name = "m"
dtype = "i32"
shape = ["N"]
[kernels]
copy = "{}/consume_wait1.toml"
produce = "{}/produce.toml"
consume = "{}/consume_wait{}.toml"
[[steps]]
launch = "copy"
args = ["x", "m", "N"]
[[steps]]
launch = "produce"
args = ["m", "N", "SPIN"]
[[steps]]
launch = "consume"
args = ["m", "y", "N"]
)",
                                             spin, fx, fx, fx, wait);
        ProgramSpec p = parse_program(text, dir.path() / "overlap.toml");
        Options po_ = o;
        po_.program_graphs = graphs;
        Runtime prt(po_);
        Device& pdev = prt.backend("cuda").device();
        DeviceBuffer x(pdev, n * 4), y(pdev, n * 4);
        pdev.to_device(x.get(), z.data(), n * 4, nullptr);
        Program prog(prt, p);
        for (int call = 0; call < 5; ++call) {
          pdev.to_device(y.get(), z.data(), n * 4, nullptr);
          pdev.sync(nullptr);
          prog.run({{x.get(), {n}}}, {{y.get(), {n}}});
          const int64_t bad = stale(pdev, y.get());
          if (wait || !pdl) {
            EXPECT_EQ(bad, 0) << "call " << call << ": the consumer read data the producer had not written";
          } else if (call > 0) {  // (not the steps' first calls, as above)
            EXPECT_GT(bad, 0) << "call " << call << ": the consumer without the wait read only fresh data";
          }
        }
        if (graphs) {
          EXPECT_GE(prog.stats().graph_replays, 1u) << "the program was never replayed as a graph";
        }
      }
  }
}

// Reads before the wait: consume_stamp reads `in` before its wait (its spec's early_reads),
// so kiln overlaps it with the kernel before it only where nothing that may still run writes
// `in`. Each case checks the result (a stale read shows as out[i] != i + 1) and whether the
// launch overlapped (the consumer's time in its wait: about the producer's 2 ms spin where it
// did, next to nothing where it did not). Forced to overlap a producer of `in` through a scope
// that vouches for it wrongly, the consumer does read stale data: the check can fail.
TEST_F(ProgramTest, AKernelThatReadsBeforeItsWaitOverlapsOnlyWhereNothingWritesWhatItReads) {
  const std::string fx = test::source_dir() + "/tests/fixtures/pdl";
  const int64_t n = 1 << 20, spin = 4000000;  // clock cycles, about 2 ms
  // The programs: the consumer reads x or an intermediate m; `produce_x_first`: the caller runs
  // the producer over x just before each call; `expect_overlap`: whether kiln may overlap it.
  struct Case {
    const char* what;
    const char* extra;  // more declarations
    const char* steps;
    bool x_state, x_is_p, produce_x_first, expect_overlap;
    bool has_p;  // an output p, which the producer writes
  };
  const Case cases[] = {
      // x is an input no step writes, written by the caller's producer just before the call: the
      // call's first step waits for it, and the consumer may then overlap the step before it.
      {"an input no step writes", "",
       "[[steps]]\nlaunch = \"produce\"\nargs = [\"p\", \"N\", \"SPIN\"]\n"
       "[[steps]]\nlaunch = \"consume\"\nargs = [\"x\", \"y\", \"gap\", \"N\"]\n",
       false, false, true, true, true},
      // ... the consumer the call's first step: it waits for the caller's producer whole (were it
      // to overlap it, reading x early, it would read x before the producer wrote it).
      {"an input no step writes, as the first step", "",
       "[[steps]]\nlaunch = \"consume\"\nargs = [\"x\", \"y\", \"gap\", \"N\"]\n",
       false, false, true, false, false},
      // The consumer reads an intermediate the step before it writes.
      {"an intermediate", "[[buffers]]\nname = \"m\"\ndtype = \"i32\"\nshape = [\"N\"]\n",
       "[[steps]]\nlaunch = \"copy\"\nargs = [\"x\", \"m\", \"N\"]\n"
       "[[steps]]\nlaunch = \"produce\"\nargs = [\"m\", \"N\", \"SPIN\"]\n"
       "[[steps]]\nlaunch = \"consume\"\nargs = [\"m\", \"y\", \"gap\", \"N\"]\n",
       false, false, false, false, false},
      // ... a state input the step before it writes.
      {"a state input", "",
       "[[steps]]\nlaunch = \"produce\"\nargs = [\"x\", \"N\", \"SPIN\"]\n"
       "[[steps]]\nlaunch = \"consume\"\nargs = [\"x\", \"y\", \"gap\", \"N\"]\n",
       true, false, false, false, false},
      // ... an input the caller gave as the output the step before it writes (the same memory).
      {"an input that is an output", "",
       "[[steps]]\nlaunch = \"produce\"\nargs = [\"p\", \"N\", \"SPIN\"]\n"
       "[[steps]]\nlaunch = \"consume\"\nargs = [\"x\", \"y\", \"gap\", \"N\"]\n",
       false, true, false, false, true},
  };
  auto program_text = [&](const Case& c) {
    return fmt::format(R"(kind = "program"
version = 1
name = "early"
backend = "cuda"
constants = {{ SPIN = {} }}
symbols = ["N"]
[[inputs]]
name = "x"
dtype = "i32"
shape = ["N"]
state = {}
[[outputs]]
name = "y"
dtype = "i32"
shape = ["N"]
[[outputs]]
name = "gap"
dtype = "i64"
shape = ["1"]
{}{}
[kernels]
copy = "{}/consume_wait1.toml"
produce = "{}/produce.toml"
consume = "{}/consume_stamp.toml"
{})",
                                           spin, c.x_state ? "true" : "false",
                                           c.has_p ? "[[outputs]]\nname = \"p\"\ndtype = \"i32\"\nshape = [\"N\"]\n" : "",
                                           c.extra, fx, fx, fx, c.steps);
  };
  for (const Case& c : cases) {  // (read here too, where there is no GPU)
    SCOPED_TRACE(c.what);
    ASSERT_NO_THROW(parse_program(program_text(c), dir.path() / "early.toml"));
  }
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  {
    Runtime probe(opts);
    const std::string arch = probe.backend("cuda").device().info().arch;
    if (arch < "sm_90" && arch.size() == 5)
      GTEST_SKIP() << "the GPU is " << arch << ": launches overlap on sm_90 or newer only";
  }
  const int64_t overlapped_ns = 1000000;      // a wait this long: the launch overlapped the spin
  const std::vector<int32_t> z(n, 0);
  auto stale = [&](Device& dev, void* out) { return stale_count(dev, out, n); };
  auto gap_of = [&](Device& dev, void* gap) {
    int64_t g = 0;
    dev.sync(nullptr);
    dev.to_host(&g, gap, 8, nullptr);
    return g;
  };
  {
    Runtime rt(opts);
    Device& dev = rt.backend("cuda").device();
    DeviceBuffer mid(dev, n * 4), out(dev, n * 4), gap(dev, 8);
    auto* pm = static_cast<int32_t*>(mid.get());
    Kernel produce(rt, load_spec(fx + "/produce.toml"));
    Kernel consume(rt, load_spec(fx + "/consume_stamp.toml"));
    const std::vector<EarlyReadRange> wrong = {{reinterpret_cast<uintptr_t>(pm), reinterpret_cast<uintptr_t>(pm + n)}};
    for (int forced : {0, 1})
      for (int rep = 0; rep < 4; ++rep) {
        SCOPED_TRACE(fmt::format("launched alone{}, call {}", forced ? " in a scope that vouches for `in`" : "", rep));
        dev.to_device(mid.get(), z.data(), n * 4, nullptr);
        dev.to_device(out.get(), z.data(), n * 4, nullptr);
        dev.sync(nullptr);
        produce(pm, n, spin);
        {
          std::optional<EarlyReadScope> scope;
          if (forced) scope.emplace(&wrong, nullptr, false);
          consume(static_cast<const int32_t*>(pm), static_cast<int32_t*>(out.get()), static_cast<int64_t*>(gap.get()), n);
        }
        const int64_t bad = stale(dev, out.get()), g = gap_of(dev, gap.get());
        if (!forced) {
          EXPECT_EQ(bad, 0) << "the consumer overlapped the producer of what it reads before its wait";
          EXPECT_LT(g, overlapped_ns);
        } else if (rep > 0) {  // (a handle's first call may compile and check before it launches)
          EXPECT_GT(bad, 0) << "forced to overlap, the consumer still read only fresh data";
          EXPECT_GE(g, overlapped_ns);
        }
      }
  }
  // The programs, run.
  for (const Case& c : cases)
    for (bool graphs : {false, true}) {
      SCOPED_TRACE(fmt::format("the consumer reads {}, graphs {}", c.what, graphs));
      const ProgramSpec p = parse_program(program_text(c), dir.path() / "early.toml");
      Options po = opts;
      po.program_graphs = graphs;
      Runtime rt(po);
      Device& dev = rt.backend("cuda").device();
      DeviceBuffer x(dev, n * 4), y(dev, n * 4), pb(dev, n * 4), gap(dev, 8);
      Kernel produce(rt, load_spec(fx + "/produce.toml"));
      Program prog(rt, p);
      void* xp = c.x_is_p ? pb.get() : x.get();
      for (int call = 0; call < 5; ++call) {
        dev.to_device(y.get(), z.data(), n * 4, nullptr);
        dev.to_device(xp, z.data(), n * 4, nullptr);
        if (c.x_is_p || !c.produce_x_first) dev.to_device(pb.get(), z.data(), n * 4, nullptr);
        dev.sync(nullptr);
        if (c.produce_x_first) produce(static_cast<int32_t*>(xp), n, spin);
        std::vector<Tensor> outs = {{y.get(), {n}}, {gap.get(), {1}}};
        if (c.has_p) outs.push_back({pb.get(), {n}});
        prog.run({{xp, {n}}}, outs);
        const int64_t bad = stale(dev, y.get()), g = gap_of(dev, gap.get());
        EXPECT_EQ(bad, 0) << "call " << call << ": the consumer read data not yet written";
        if (!c.expect_overlap) {
          EXPECT_LT(g, overlapped_ns) << "call " << call << ": the consumer overlapped the writer of what it reads early";
        } else if (call > 0) {  // (not the steps' first calls)
          EXPECT_GE(g, overlapped_ns) << "call " << call << ": the consumer did not overlap the step before it";
        }
      }
      if (graphs) {
        EXPECT_GE(prog.stats().graph_replays, 1u) << "the program was never replayed as a graph";
      }
    }
}

// The inputs kiln makes (kiln run, kiln pack, the model's logits check) are
// the generator kiln/fill.hpp defines, element by element from the seed, so
// that another implementation can make the same model: checked here against
// the definition written out again, on both sides of the parallel fill's
// chunks, for a scaled bf16 input, a scaled f32 one and a constant.
TEST(Fill, AnInputIsTheDocumentedCounterBasedGeneratorFromItsSeed) {
  auto defined = [](uint64_t seed, uint64_t j) {
    uint64_t z = seed + (j + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return 2 * (static_cast<double>(z >> 11) * 0x1p-53) - 1;
  };
  const size_t n = (size_t{1} << 23) + 77;  // two chunks and a part
  ProgramTensor w{"w", DType::bf16, {}, false, 0.02, std::nullopt};
  std::vector<std::byte> host(n * 2);
  const uint64_t seed = input_seed(5, 3);
  EXPECT_EQ(seed, 5u + 977 * 4);
  fill_input(w, host, seed);
  const auto* bits = reinterpret_cast<const uint16_t*>(host.data());
  size_t checked = 0;
  for (size_t j : {size_t{0}, size_t{1}, (size_t{1} << 22) - 1, size_t{1} << 22, (size_t{1} << 22) + 1, n / 3,
                   (size_t{1} << 23) - 1, size_t{1} << 23, n - 1}) {
    const float v = bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(defined(seed, j))));
    const uint16_t want = f32_to_bf16_bits(static_cast<float>(static_cast<double>(v) * 0.02));
    EXPECT_EQ(bits[j], want) << "element " << j;
    ++checked;
  }
  EXPECT_EQ(checked, 9u);

  ProgramTensor f{"f", DType::f32, {}, false, 0.5, std::nullopt};
  std::vector<std::byte> fh((size_t{1} << 22) * 4 + 40);
  fill_input(f, fh, 11);
  for (size_t j : {size_t{0}, (size_t{1} << 22) - 1, size_t{1} << 22, (size_t{1} << 22) + 9}) {
    float got;
    std::memcpy(&got, fh.data() + 4 * j, 4);
    EXPECT_EQ(got, static_cast<float>(static_cast<double>(static_cast<float>(defined(11, j))) * 0.5)) << j;
  }

  // f64 scaled in double; f16 as bf16; integers r % 201 - 100, a scale truncated toward zero.
  auto raw = [](uint64_t seed, uint64_t j) {
    uint64_t z = seed + (j + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  ProgramTensor d{"d", DType::f64, {}, false, 0.25, std::nullopt};
  ProgramTensor h{"h", DType::f16, {}, false, 3, std::nullopt};
  ProgramTensor i{"i", DType::i32, {}, false, 0.5, std::nullopt};
  std::vector<std::byte> dh(64 * 8), hh(64 * 2), ih(64 * 4);
  fill_input(d, dh, 21), fill_input(h, hh, 22), fill_input(i, ih, 23);
  for (size_t j = 0; j < 64; ++j) {
    double dv;
    std::memcpy(&dv, dh.data() + 8 * j, 8);
    EXPECT_EQ(dv, defined(21, j) * 0.25) << j;
    const float hv = f16_bits_to_f32(f32_to_f16_bits(static_cast<float>(defined(22, j))));
    EXPECT_EQ(reinterpret_cast<const uint16_t*>(hh.data())[j], f32_to_f16_bits(static_cast<float>(hv * 3.0))) << j;
    int32_t iv;
    std::memcpy(&iv, ih.data() + 4 * j, 4);
    EXPECT_EQ(iv, static_cast<int32_t>((static_cast<int64_t>(raw(23, j) % 201) - 100) * 0.5)) << j;
  }

  ProgramTensor g{"g", DType::bf16, {}, false, 1, 1.0};
  std::vector<std::byte> gh(4096 * 2);
  fill_input(g, gh, 1);
  for (size_t j = 0; j < 4096; ++j) ASSERT_EQ(reinterpret_cast<const uint16_t*>(gh.data())[j], 0x3f80) << j;
}

// InputFiller on the cpu backend fills the buffer in place with exactly
// fill_input's values (kiln run and kiln pack fill through it).
TEST(Fill, TheFillerOfACpuBackendFillsInPlaceAsTheHostGeneratorDoes) {
  TempDir dir("kiln-test");
  Runtime rt(test::options_in(dir.path()));
  InputFiller filler(rt, "cpu");
  EXPECT_FALSE(filler.on_device());
  for (DType t : kAllDTypes) {
    for (int mode = 0; mode < 3; ++mode) {
      ProgramTensor x{"x", t, {}, false, mode == 1 ? 0.02 : 1, mode == 2 ? std::optional<double>(-3.0) : std::nullopt};
      const size_t bytes = 1000 * dtype_size(t);
      DeviceBuffer buf(rt.device("cpu"), bytes);
      filler.fill(x, buf.get(), bytes, 99);
      const std::vector<std::byte> want = filled_input(x, bytes, 99);
      EXPECT_EQ(std::memcmp(buf.get(), want.data(), bytes), 0) << dtype_name(t) << " mode " << mode;
    }
  }
}
