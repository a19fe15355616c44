// What a hostile program file gives kiln: names that carry code, values the
// emitted C++ would write differently, trees deep enough to overflow a
// stack, calls whose buffers no longer match, sizes past 64 bits, i32
// arguments that wrap, guards that divide by zero. Each is refused, named,
// or computed the same by `kiln run` (Program) and by `kiln emit`'s C++,
// which these tests compile and run against the build's libkiln.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/args.hpp"
#include "kiln/program.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct HostileTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.workers = 1;
    opts.first_call = FirstCall::wait;
  }
  // Runs kiln in `cwd`; stdout and stderr together, and the exit code (128 + signal when killed).
  std::pair<int, std::string> kiln(const std::string& args, const fs::path& cwd = {}) const {
    fs::path o = dir.path() / "kiln-output";
    std::string cmd = "KILN_CACHE_DIR='" + (dir.path() / "cache").string() + "' KILN_BENCH_BUDGET_MS=2 " +
                      test::kiln_exe() + " " + args + " >'" + o.string() + "' 2>&1";
    if (!cwd.empty()) cmd = "cd '" + cwd.string() + "' && " + cmd;
    ProcessResult r = run_process({"bash", "-c", cmd}, 300);
    return {r.signal ? 128 + r.signal : r.exit_code, read_file(o).value_or("")};
  }
  std::string error_of(const std::string& program_text) const {
    try {
      parse_program(program_text, dir.path() / "p.toml");
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  }
};


// A program over the built-in rmsnorm, its name and extra text given.
std::string rms_program(const std::string& name, const std::string& top, const std::string& rest) {
  return "kind = \"program\"\nversion = 1\nname = " + name +
         "\nbackend = \"cpu\"\nconstants = { H = 8 }\nsymbols = [\"T\"]\n" + top + R"(
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
)" + rest;
}
const char* kRmsStep = "[[steps]]\nlaunch = \"rms\"\nargs = [\"x\", \"g\", \"y\", \"T\", \"H\", \"1e-5\"]\n";

// A kernel with an i32 size: out[i] = i for i < n.
void write_fill32(const fs::path& d) {
  test::write(d / "fill32.toml", R"(name = "fill32"
backend = "cpu"
source = "fill32.cpp"
entry = "fill32"
grid = ["1"]
args = [ { name = "out", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i32" } ]
[params]
B = [1]
)");
  test::write(d / "fill32.cpp",
              "void fill32(kiln::program_id, float* out, int32_t n) { for (int32_t i = 0; i < n * B; ++i) out[i] = "
              "static_cast<float>(i); }\n");
}

// The compiler flags of an application built against this build's libkiln
// (sanitized like it when it is), or "" when this build has no libkiln.so.
std::string app_flags() {
  fs::path lib = fs::path(KILN_BINARY_DIR) / "libkiln.so";
  if (!fs::exists(lib)) return "";
  std::string f = std::string("-std=c++20 -I") + KILN_SOURCE_DIR + "/include -I" + KILN_BINARY_DIR + "/include -L" +
                  KILN_BINARY_DIR + " -Wl,-rpath," + KILN_BINARY_DIR + " -lkiln";
#ifdef KILN_TEST_SANITIZED
  f += " -fsanitize=address,undefined";
#endif
  return f;
}

// An application over an emitted header: reads x and g from files, runs the
// program at T, writes its two outputs to a file; a kiln::Error is printed
// and exits 3.
const char* kHostileApp = R"(#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>
#include "hostile_program.hpp"
int main(int argc, char** argv) {
  const long long T = std::atoll(argv[2]);
  const long long H = 8;
  std::vector<float> x(T > 0 ? T * H : 1), g(H), a(T > 0 ? T * H : 1), d(T > 0 ? T * H : 1);
  std::ifstream(argv[3], std::ios::binary).read(reinterpret_cast<char*>(x.data()), x.size() * 4);
  std::ifstream(argv[4], std::ios::binary).read(reinterpret_cast<char*>(g.data()), g.size() * 4);
  try {
    kiln::Runtime rt;
    hostile_program::Program p(rt, argv[1]);
    p(x.data(), g.data(), a.data(), d.data(), T);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
  std::ofstream o(argv[5], std::ios::binary);
  o.write(reinterpret_cast<const char*>(a.data()), a.size() * 4);
  o.write(reinterpret_cast<const char*>(d.data()), d.size() * 4);
  return 0;
}
)";

}  // namespace

// E1: every name is an identifier that is not a C++ keyword, the program's own included.
TEST_F(HostileTest, NamesThatCarryCodeOrKeywordsAreRefused) {
  EXPECT_CONTAINS(error_of(rms_program("\"p\\nint main() { return system(\\\"id\\\"); }\"", "", kRmsStep)),
                  "program name \"p\\nint main()");
  EXPECT_CONTAINS(error_of(rms_program("\"int\"", "", kRmsStep)), "program name \"int\" is not a name");
  EXPECT_CONTAINS(error_of(rms_program("\"p\"", "", kRmsStep)), "(accepted)");
  std::string keyword_buffer = rms_program("\"p\"", "", kRmsStep);
  keyword_buffer.replace(keyword_buffer.find("name = \"y\""), 10, "name = \"class\"");
  EXPECT_CONTAINS(error_of(keyword_buffer), "buffer \"class\" is not a name");
  std::string keyword_constant = rms_program("\"p\"", "", kRmsStep);
  keyword_constant.replace(keyword_constant.find("{ H = 8 }"), 9, "{ H = 8, and = 2 }");
  EXPECT_CONTAINS(error_of(keyword_constant), "constant \"and\" is not a name");
  std::string keyword_kernel = rms_program("\"p\"", "", "[[steps]]\nlaunch = \"delete\"\nargs = []\n");
  keyword_kernel.replace(keyword_kernel.find("rms = \""), 7, "delete = \"");
  EXPECT_CONTAINS(error_of(keyword_kernel), "kernel \"delete\" is not a name");
}

// E1 (paths), E2, E7, E13: the emitted C++ of a program whose names are the
// old emitter's own locals, whose kernel spec lies in a folder with a '"' in
// its name, with a float argument "inf" beside a constant named inf and a
// guard that divides by zero at T = 10, computes bit for bit what Program
// computes, and fails where Program fails, with an error instead of a signal.
TEST_F(HostileTest, EmittedCppComputesAndChecksWhatProgramDoes) {
  const std::string flags = app_flags();
  if (flags.empty()) GTEST_SKIP() << "this build has no libkiln.so (a portable build): nothing to link an application to";
  const fs::path weird = dir.path() / "spec \"dir\"";
  for (const char* f : {"rmsnorm.toml", "rmsnorm.cpp"}) {
    fs::create_directories(weird);
    fs::copy_file(fs::path(test::kernels()) / "cpu" / f, weird / f);
  }
  const fs::path prog_dir = dir.path() / "prog";
  test::write(prog_dir / "hostile.toml", R"(kind = "program"
version = 1
name = "hostile"
backend = "cpu"
constants = { H = 8, inf = 3, rt = 1 }
symbols = ["T"]
guards = ["T // (T - 10) >= -1"]
[[inputs]]
name = "stream"
dtype = "f32"
shape = ["T", "H"]
[[inputs]]
name = "params"
dtype = "f32"
shape = ["H"]
[[outputs]]
name = "arena"
dtype = "f32"
shape = ["T", "H"]
[[outputs]]
name = "dev"
dtype = "f32"
shape = ["T", "H"]
[[buffers]]
name = "a1"
dtype = "f32"
shape = ["T", "H"]
[[buffers]]
name = "plan"
dtype = "f32"
shape = ["T", "H * rt"]
[kernels]
rms = "../spec \"dir\"/rmsnorm.toml"
[[steps]]
launch = "rms"
args = ["stream", "params", "a1", "T", "H", "1e-5"]
[[steps]]
launch = "rms"
args = ["a1", "params", "plan", "T", "H * rt", 1e-5]
[[steps]]
launch = "rms"
args = ["plan", "params", "arena", "T", "H", "inf"]
[[steps]]
launch = "rms"
args = ["a1", "params", "dev", "T", "H", "0.3"]
)");
  const fs::path gen = dir.path() / "gen";
  fs::create_directories(gen);
  // Written from inside the program's folder: the paths in it are the same from anywhere.
  auto [code, out] = kiln("emit hostile.toml -o '" + (gen / "hostile_program.hpp").string() + "'", prog_dir);
  ASSERT_EQ(code, 0) << out;
  const std::string header = read_file(gen / "hostile_program.hpp").value();
  EXPECT_CONTAINS(header, "std::numeric_limits<double>::infinity()");
  test::write(gen / "app.cpp", kHostileApp);
  ProcessResult built = run_process({"bash", "-c",
                                     "c++ -o '" + (gen / "app").string() + "' '" + (gen / "app.cpp").string() + "' -I'" +
                                         gen.string() + "' " + flags + " 2>'" + (gen / "build.log").string() + "'"},
                                    300);
  ASSERT_EQ(built.exit_code, 0) << read_file(gen / "build.log").value_or("");

  ProgramSpec spec = load_program(prog_dir / "hostile.toml");
  Runtime rt(opts);
  Program prog(rt, spec);
  const int64_t H = 8;
  std::vector<float> g(H);
  fill_random(DType::f32, std::as_writable_bytes(std::span(g)), 2);
  test::write(gen / "g.bin", std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
  for (int64_t T : {int64_t{3}, int64_t{10}, int64_t{12}}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    std::vector<float> x(T * H), a(T * H, -7), d(T * H, -7);
    fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 10 + T);
    test::write(gen / "x.bin", std::string(reinterpret_cast<const char*>(x.data()), x.size() * 4));
    std::string program_error;
    try {
      prog.run({{x.data(), {T, H}}, {g.data(), {H}}}, {{a.data(), {T, H}}, {d.data(), {T, H}}});
    } catch (const Error& e) {
      program_error = e.what();
    }
    const fs::path result = gen / "out.bin";
    fs::remove(result);
    ProcessResult r = run_process({"bash", "-c",
                                   "KILN_CACHE_DIR='" + (dir.path() / "app-cache").string() + "' KILN_FIRST_CALL=wait '" +
                                       (gen / "app").string() + "' '" + prog_dir.string() + "' " + std::to_string(T) +
                                       " '" + (gen / "x.bin").string() + "' '" + (gen / "g.bin").string() + "' '" +
                                       result.string() + "' 2>'" + (gen / "app.log").string() + "'"},
                                  300);
    const std::string app_log = read_file(gen / "app.log").value_or("");
    if (T == 10) {
      EXPECT_CONTAINS(program_error, "division by zero");
      EXPECT_EQ(r.signal, 0) << "the emitted code must throw, not die of a signal";
      EXPECT_EQ(r.exit_code, 3) << app_log;
      EXPECT_CONTAINS(app_log, "division by zero");
      continue;
    }
    ASSERT_EQ(program_error, "");
    ASSERT_EQ(r.exit_code, 0) << app_log;
    const std::string got = read_file(result).value_or("");
    ASSERT_EQ(got.size(), 2 * x.size() * 4);
    EXPECT_EQ(std::memcmp(got.data(), a.data(), a.size() * 4), 0) << "output 'arena' differs (eps = inf: zeros)";
    EXPECT_EQ(std::memcmp(got.data() + a.size() * 4, d.data(), d.size() * 4), 0) << "output 'dev' differs";
    for (float v : a) EXPECT_EQ(v, 0.0f) << "rmsnorm with eps = +inf is 0 everywhere";
  }
}

// E3: flat chains of ~300,000 terms are an error at parse time, so no
// walker (printing, compiling, emitting, destroying) recurses through them.
TEST_F(HostileTest, FlatChainsTooDeepForAWalkerAreRefused) {
  for (const char* op : {" + ", " * ", " && "}) {
    std::string e = "T";
    e.reserve(300000 * 6);
    for (int i = 0; i < 300000; ++i) e += std::string(op) + "T";
    try {
      Expr::parse(e);
      ADD_FAILURE() << "accepted a chain of 300,000 '" << op << "'";
    } catch (const ExprError& x) {
      EXPECT_CONTAINS(x.what_only(), "more than 100 operators deep");
    }
    const fs::path p = dir.path() / "deep.toml";
    test::write(p, rms_program("\"p\"", "guards = [\"" + e + " >= 0\"]\n", kRmsStep));
    for (const std::string& cmd : {"emit '" + p.string() + "'", "run '" + p.string() + "' --set T=2",
                                  "compile '" + p.string() + "'"}) {
      auto [code, out] = kiln(cmd);
      EXPECT_LT(code, 128) << cmd.substr(0, 8) << " died of a signal: " << out.substr(0, 300);
      EXPECT_NE(out.find("operators deep"), std::string::npos) << cmd.substr(0, 8) << ": " << out.substr(0, 300);
    }
  }
  // A chain within the bound parses and evaluates.
  std::string ok = "1";
  for (int i = 0; i < 90; ++i) ok += " + 1";
  EXPECT_EQ(CompiledExpr::compile(Expr::parse(ok), [](std::string_view) { return std::nullopt; }).eval(nullptr), 91);
}

// E6: every call is checked, not only a shape's first: a later call whose
// output is smaller than the program says is refused before anything runs.
TEST_F(HostileTest, EveryCallIsCheckedNotOnlyAShapesFirst) {
  ProgramSpec p = parse_program(rms_program("\"p\"", "", kRmsStep), dir.path() / "p.toml");
  Runtime rt(opts);
  Program prog(rt, p);
  std::vector<float> x(32), g(8), y(32), small(8);
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 1);
  ASSERT_NO_THROW(prog.run({{x.data(), {4, 8}}, {g.data(), {8}}}, {{y.data(), {4, 8}}}));
  try {
    prog.run({{x.data(), {4, 8}}, {g.data(), {8}}}, {{small.data(), {1, 8}}});
    ADD_FAILURE() << "a call with a 1 x 8 output for T = 4 was run";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "output 'y' dimension 0 is 1, but the program says T = 4");
  }
  EXPECT_THROW(prog.run({{x.data(), {4, 8}}, {g.data(), {8}}}, {}), Error);
  EXPECT_THROW(prog.run({{x.data(), {4, 8}}, {g.data(), {7}}}, {{y.data(), {4, 8}}}), Error);
  EXPECT_THROW(prog.run({{x.data(), {4, 8}}, {g.data(), {8}}}, {{y.data(), {4, 8, 1}}}), Error);
}

// E8: a size past 64 bits is named, never a negative count.
TEST_F(HostileTest, SizesPast64BitsAreNamed) {
  std::string text = rms_program("\"p\"", "", kRmsStep);
  text.replace(text.find("shape = [\"T\", \"H\"]"), 18, "shape = [\"T\", \"T\"]");
  ProgramSpec p = parse_program(text, dir.path() / "p.toml");
  Runtime rt(opts);
  Program prog(rt, p);
  std::vector<float> g(8), y(8);
  const int64_t T = 3037000500;  // T * T passes 2^63
  try {
    prog.run({{y.data(), {T, T}}, {g.data(), {8}}}, {{y.data(), {T, 8}}});
    ADD_FAILURE() << "ran";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "'x' of shape [T, T] has more elements than 64 bits count");
  }
  test::write(dir.path() / "big.toml", text);
  auto [code, out] = kiln("run '" + (dir.path() / "big.toml").string() + "' --set T=3037000500");
  EXPECT_NE(code, 0);
  EXPECT_CONTAINS(out, "more elements than 64 bits count");
  EXPECT_EQ(out.find("negative"), std::string::npos) << out;
}

// E10: malformed TOML is an error in every parser, never an abort.
TEST_F(HostileTest, MalformedTomlIsAnErrorNotAnAbort) {
  EXPECT_CONTAINS(error_of("kind = \"program\"\nversion = 1\n[[\n"), "p.toml");
  for (const char* cmd : {"emit", "run", "compile", "tune"}) {
    test::write(dir.path() / "bad.toml", "kind = \"program\"\nversion = 1\n[[\n");
    auto [code, out] = kiln(std::string(cmd) + " '" + (dir.path() / "bad.toml").string() + "'");
    EXPECT_LT(code, 128) << cmd << " died of a signal: " << out;
    EXPECT_NE(code, 0) << cmd;
  }
}

// E12: an i32 argument that does not fit is an error naming the step and
// the argument (the kernel would get the truncated value while the size
// check saw the whole one); so is an i32 --set value.
TEST_F(HostileTest, I32ArgumentsThatDoNotFitAreNamed) {
  write_fill32(dir.path());
  const std::string text = R"(kind = "program"
version = 1
name = "wrap"
backend = "cpu"
symbols = ["T"]
[[inputs]]
name = "x"
dtype = "f32"
shape = ["T"]
[[outputs]]
name = "y"
dtype = "f32"
shape = ["T"]
[kernels]
fill = "fill32.toml"
[[steps]]
launch = "fill"
args = ["y", "T + 1000 - 4294967296"]
)";
  ProgramSpec p = parse_program(text, dir.path() / "wrap.toml");
  Runtime rt(opts);
  Program prog(rt, p);
  std::vector<float> x(10), y(10);
  try {
    prog.run({{x.data(), {10}}}, {{y.data(), {10}}});
    ADD_FAILURE() << "ran";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "step 1 (fill): argument 'n' = T + 1000 - 4294967296 is -4294966286, which does not fit an i32");
  }
  auto [code, out] = kiln("report '" + (dir.path() / "fill32.toml").string() + "' --set n=4294967296");
  EXPECT_EQ(code, 2) << out;
  EXPECT_CONTAINS(out, "out of range for i32");
  std::tie(code, out) = kiln("tune '" + (dir.path() / "fill32.toml").string() + "' --set n=-2147483649");
  EXPECT_EQ(code, 2) << out;
  EXPECT_CONTAINS(out, "out of range for i32");
}

// A kernel spec given where a program is read (kiln run, kiln emit) is named
// as a kernel spec, with the commands that take one, not reported as a
// program with an unknown key.
TEST_F(HostileTest, AKernelSpecGivenToKilnRunIsNamedAsOne) {
  auto [code, out] = kiln("run '" + test::kernels() + "/cpu/linear.toml'");
  EXPECT_NE(code, 0);
  EXPECT_LT(code, 128) << out;
  EXPECT_CONTAINS(out, "is a kernel spec");
  EXPECT_CONTAINS(out, "kiln tune");
  EXPECT_EQ(out.find("unknown key"), std::string::npos) << out;
}

// An integer input's fill whose values its dtype cannot hold (kiln's
// generator draws -100..100, times the scale) is refused when the program is
// read, rather than converted differently on the host and on a GPU.
TEST_F(HostileTest, AnIntegerFillPastItsDtypeIsRefused) {
  const std::string idx = "[[inputs]]\nname = \"ids\"\ndtype = \"i32\"\nshape = [\"T\"]\nfill = { ";
  EXPECT_CONTAINS(error_of(rms_program("\"p\"", "", idx + "constant = 3e9 }\n" + kRmsStep)),
                  "constant 3000000000 makes values past what i32 holds");
  EXPECT_CONTAINS(error_of(rms_program("\"p\"", "", idx + "scale = 3e7 }\n" + kRmsStep)), "past what i32 holds");
  // Within range: read (the program is refused later, or not, for what else it says).
  EXPECT_EQ(error_of(rms_program("\"p\"", "", idx + "scale = 2e7 }\n" + kRmsStep)).find("past what"),
            std::string::npos);
}
