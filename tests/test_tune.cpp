#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cmath>
#include <fstream>
#include <sstream>
#include <limits>
#include <thread>

#include "compile/compile_pool.hpp"
#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"
#include "util.hpp"
#include "worker/worker_pool.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// MODE 0: correct, with 40 times the work; 1: correct; 2: off by one; 3: null dereference.
const char* kSelSpec = R"SPEC(name = "sel"
backend = "cpu"
source = "sel.cpp"
entry = "sel"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2, 3]
[tuning]
key = ["n"]
reference = { MODE = 0 }
)SPEC";

const char* kSelSource = R"SRC(
void sel(kiln::program_id, const float* x, float* y, int64_t n) {
#if MODE == 3
  *static_cast<volatile int*>(nullptr) = 0;
#endif
  const int reps = MODE == 0 ? 40 : 1;
  for (int r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f + (MODE == 2 ? 1.0f : 0.0f) + r * 0.0f;
  asm volatile("" ::: "memory");
}
)SRC";

struct TuneTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 5;
    opts.bench_timeout_s = 5;
    opts.workers = 1;
  }
  KernelSpec spec(const std::string& toml, const std::string& src_name, const std::string& src) {
    return test::spec_in(dir.path(), toml, src_name, src);
  }
  const ConfigResult& result_of(const TuningRecord& r, const std::string& cfg) {
    for (const auto& c : r.configs)
      if (c.config.str() == cfg) return c;
    throw std::runtime_error("no result for " + cfg);
  }
};

}  // namespace

TEST_F(TuneTest, PicksTheFastestCorrectConfigAndRecordsEveryFailure) {
  KernelSpec s = spec(kSelSpec, "sel.cpp", kSelSource);
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "20000"}}));
  args.fill_random(1);
  std::vector<std::byte> before(args.buffer(1).begin(), args.buffer(1).end());
  TuneOutcome o = rt.tune(s, args.params());
  EXPECT_FALSE(o.from_cache);
  const TuningRecord& r = o.record;
  ASSERT_TRUE(r.best);
  EXPECT_EQ(r.best->str(), "MODE=1");
  EXPECT_EQ(r.reference, "MODE=0");
  EXPECT_EQ(r.method, SearchMethod::exhaustive);
  EXPECT_EQ(result_of(r, "MODE=2").kind, FailKind::wrong);
  EXPECT_NE(result_of(r, "MODE=2").error.find("max error 1 "), std::string::npos) << result_of(r, "MODE=2").error;
  EXPECT_EQ(result_of(r, "MODE=3").kind, FailKind::crash);
  EXPECT_NE(result_of(r, "MODE=3").error.find("SIGSEGV"), std::string::npos);
  EXPECT_TRUE(result_of(r, "MODE=0").ns.has_value());
  // Tuning never writes the caller's buffers.
  EXPECT_TRUE(std::equal(before.begin(), before.end(), args.buffer(1).begin()));

  // A crash is the config's own: not retried.
  EXPECT_EQ(rt.worker_pool()->counters().retried, 0u);
  // Run again: the record answers, nothing is re-run (the crashing config is not retried).
  size_t crashes = rt.worker_pool()->counters().crashed;
  TuneOutcome again = rt.tune(s, args.params());
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.record.best->str(), "MODE=1");
  EXPECT_EQ(result_of(again.record, "MODE=3").kind, FailKind::crash);
  EXPECT_EQ(rt.worker_pool()->counters().crashed, crashes);
  // A new process (runtime) reads the same record; --force tunes again.
  Runtime rt2(opts);
  EXPECT_TRUE(rt2.tune(s, args.params()).from_cache);
  TuneOptions force;
  force.force = true;
  EXPECT_FALSE(rt2.tune(s, args.params(), force).from_cache);
}

TEST_F(TuneTest, InProcessTuningGivesTheSameAnswerForWellBehavedConfigs) {
  std::string toml = kSelSpec;
  toml.replace(toml.find("MODE = [0, 1, 2, 3]"), 19, "MODE = [0, 1, 2]");
  KernelSpec s = spec(toml, "sel.cpp", kSelSource);
  opts.tune_in_process = true;
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "20000"}}));
  args.fill_random(2);
  TuneOutcome o = rt.tune(s, args.params());
  ASSERT_TRUE(o.record.best);
  EXPECT_EQ(o.record.best->str(), "MODE=1");
  EXPECT_EQ(result_of(o.record, "MODE=2").kind, FailKind::wrong);
}

TEST_F(TuneTest, PrunesConfigsThatCannotRunBeforeCompiling) {
  KernelSpec s = spec(R"SPEC(name = "p"
backend = "cpu"
source = "p.cpp"
entry = "p"
grid = ["cdiv(n, B) - S"]
args = [ { name = "y", type = "i64*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
constraints = ["B <= n"]
[params]
B = [4, 64]
S = [0, 1]
[tuning]
key = ["n"]
)SPEC",
                      "p.cpp", R"SRC(
void p(kiln::program_id pid, int64_t* y, int64_t n) {
  for (int64_t i = pid.x * B; i < (pid.x + 1) * B && i < n; ++i) y[i] = i;
  for (int64_t i = (pid.nx) * B; i < n; ++i) y[i] = i;
}
)SRC");
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "8"}}));
  TuningRecord r = rt.tune(s, args.params()).record;
  EXPECT_EQ(result_of(r, "B=64 S=0").kind, FailKind::pruned);
  EXPECT_NE(result_of(r, "B=64 S=0").error.find("constraint 'B <= n' is false"), std::string::npos);
  EXPECT_EQ(result_of(r, "B=64 S=1").kind, FailKind::pruned);
  EXPECT_EQ(result_of(r, "B=4 S=0").kind, FailKind::none);
  EXPECT_EQ(result_of(r, "B=4 S=1").kind, FailKind::none);  // grid 1: runs
  HostArgs small(s, parse_scalars(s, {{"n", "4"}}));  // B=4 S=1: grid 0
  TuningRecord r2 = rt.tune(s, small.params()).record;
  EXPECT_NE(result_of(r2, "B=4 S=1").error.find("empty grid (0, 1, 1)"), std::string::npos);
  // Nothing pruned was compiled.
  EXPECT_EQ(rt.compile_pool("cpu").counters().compiled, 2u);
  for (const auto& rec : rt.compile_pool("cpu").records()) EXPECT_EQ(rec.config.find("B=64"), std::string::npos);
}

// A spec narrowed to a config that cannot run the call, at a key where the record of another
// space (the same kernel with other params) was stored: the error names the constraint, not
// "no config survived tuning" (the record, none of whose configs is in this space, has nothing
// to say), and that record stays (a tuning of the narrowed space would have replaced it with its
// pruned configs alone). Seen with one-config specs cut from a GPU kernel's space in a test.
TEST_F(TuneTest, ASpaceThatCannotRunTheCallSaysWhyWhereAnotherSpacesRecordIsStored) {
  const std::string body = R"SPEC(name = "narrow"
backend = "cpu"
source = "n.cpp"
entry = "n"
grid = ["1"]
args = [ { name = "y", type = "i64*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
constraints = ["B <= n"]
[tuning]
key = ["n"]
[params]
)SPEC";
  const std::string src = R"SRC(
void n(kiln::program_id, int64_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = i * B;
}
)SRC";
  Runtime rt(opts);
  KernelSpec fits = spec(body + "B = [4]\n", "n.cpp", src);
  HostArgs args(fits, parse_scalars(fits, {{"n", "8"}}));
  TuningRecord r = rt.tune(fits, args.params()).record;
  ASSERT_TRUE(r.best);
  KernelSpec too_big = spec(body + "B = [64]\n", "n.cpp", src);
  try {
    Kernel k(rt, too_big);
    std::vector<int64_t> y(8);
    k(y.data(), int64_t{8});
    FAIL() << "a config pruned by its constraint ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("constraint 'B <= n' is false"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("no config survived"), std::string::npos) << e.what();
  }
  // ... and the record at that key, which the first space's calls use, is left as it was.
  TuneOutcome again = rt.tune(fits, args.params());
  EXPECT_TRUE(again.from_cache);
  ASSERT_TRUE(again.choice);
  EXPECT_EQ(again.choice->str(), "B=4");
}

TEST_F(TuneTest, InoutArgumentsAreRestoredBeforeEveryRun) {
  // If restoring failed, configs timed a different number of times would disagree.
  KernelSpec s = spec(R"SPEC(name = "acc"
backend = "cpu"
source = "acc.cpp"
entry = "acc"
grid = ["1"]
args = [ { name = "x", type = "f64*", size = "n", intent = "inout" }, { name = "n", type = "i64" } ]
[params]
U = [1, 2, 3]
[tuning]
key = ["n"]
)SPEC",
                      "acc.cpp", "void acc(kiln::program_id, double* x, int64_t n) { for (int64_t i = 0; i < n; ++i) x[i] = x[i] * 2 + U * 0; }\n");
  opts.bench_budget_ms = 1;
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "1000"}}));
  args.fill_random(5);
  std::vector<double> orig(1000);
  std::memcpy(orig.data(), args.buffer(0).data(), 8000);
  TuningRecord r = rt.tune(s, args.params()).record;
  for (const auto& c : r.configs) EXPECT_TRUE(c.ok()) << c.config.str() << ": " << c.error;
  // The handle's first call tunes (from the record now) and then runs once on the caller's data.
  Kernel k(rt, s);
  int64_t n = 1000;
  k(reinterpret_cast<double*>(args.buffer(0).data()), n);
  auto* x = reinterpret_cast<const double*>(args.buffer(0).data());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(x[i], orig[i] * 2);
}

TEST_F(TuneTest, CoordinateDescentWalksToTheBestWithoutTryingEverything) {
  // Work doubles with each step of distance of (P, Q) from (5, 2): descent walks there.
  std::string vals = "[0, 1, 2, 3, 4, 5, 6, 7]";
  KernelSpec s = spec(R"SPEC(name = "bowl"
backend = "cpu"
source = "bowl.cpp"
entry = "bowl"
grid = ["1"]
args = [ { name = "y", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
[params]
P = )SPEC" + vals + "\nQ = " + vals + R"SPEC(
[tuning]
key = ["n"]
search = "coordesc"
default = { P = 0, Q = 0 }
)SPEC",
                      "bowl.cpp", R"SRC(
void bowl(kiln::program_id, float* y, int64_t n) {
  const int d = (P > 5 ? P - 5 : 5 - P) + (Q > 2 ? Q - 2 : 2 - Q);
  for (int r = 0; r < (1 << d); ++r)
    for (int64_t i = 0; i < n; ++i) { y[i] = static_cast<float>(i); asm volatile("" ::: "memory"); }
}
)SRC");
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "20000"}}));
  TuningRecord r = rt.tune(s, args.params()).record;
  ASSERT_TRUE(r.best);
  auto tried = [](const TuningRecord& t) {
    std::string out;
    for (const auto& c : t.configs)
      if (c.ns)
        out += fmt::format("\n  {}: median {:.0f} ns, min {:.0f} ns", c.config.str(), *c.ns, c.min_ns);
      else
        out += fmt::format("\n  {}: {}", c.config.str(), c.error);
    return out;
  };
  EXPECT_EQ(r.best->str(), "P=5 Q=2") << tried(r);
  EXPECT_EQ(r.method, SearchMethod::coordesc);
  EXPECT_NE(r.start.find("P=0 Q=0 (the spec's default)"), std::string::npos) << r.start;
  EXPECT_LT(r.configs.size(), 40u) << "descent tried most of the 64 configs";

  // Without a default, descent starts from the best of the nearest cached key.
  std::string toml = *read_file(dir.path() / "k.toml");
  toml.replace(toml.find("default = { P = 0, Q = 0 }"), 26, "");
  test::write(dir.path() / "k.toml", toml);
  KernelSpec s2 = load_spec(dir.path() / "k.toml");
  HostArgs other(s2, parse_scalars(s2, {{"n", "25000"}}));
  TuningRecord r2 = rt.tune(s2, other.params()).record;
  EXPECT_NE(r2.start.find("P=5 Q=2 (the best of the nearest cached key, n=20000)"), std::string::npos) << r2.start;
  EXPECT_EQ(r2.best->str(), "P=5 Q=2") << tried(r2);

  // A cap on configs tried.
  TuneOptions capped;
  capped.force = true;
  capped.max_configs = 3;
  capped.search = SearchKind::exhaustive;
  TuningRecord r3 = rt.tune(s2, other.params(), capped).record;
  EXPECT_EQ(r3.timed, 3u);
  size_t ran = 0;
  for (const auto& c : r3.configs) ran += c.kind != FailKind::pruned;
  EXPECT_EQ(ran, 3u);
}

TEST_F(TuneTest, WhenEveryConfigFailsTheErrorListsEachFailureAndIsRemembered) {
  std::string toml = kSelSpec;
  toml.replace(toml.find("MODE = [0, 1, 2, 3]"), 19, "MODE = [3, 4]");
  toml.replace(toml.find("reference = { MODE = 0 }"), 24, "");
  KernelSpec s = spec(toml, "sel.cpp", std::string("#if MODE == 4\n#error no such mode\n#endif\n") + kSelSource);
  opts.first_call = FirstCall::wait;  // the tuning on the first call itself is under test
  Runtime rt(opts);
  Kernel k(rt, s);
  std::vector<float> x(100), y(100);
  int64_t n = 100;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      k(x.data(), y.data(), n);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::tune);
      std::string m = e.what();
      EXPECT_NE(m.find("no config survived tuning"), std::string::npos) << m;
      EXPECT_NE(m.find("MODE=3: benchmarking kernel 'sel' (config MODE=3): the worker was killed by SIGSEGV while "
                       "running it (not retried"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("MODE=4: kernel 'sel' (config MODE=4) failed to compile"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(rt.worker_pool()->counters().crashed, 1u) << "a crash is not retried, and the second call must answer "
                                                        "from the record";
}

TEST_F(TuneTest, TheKernelHandleTunesOnceAKeyAndChecksArgumentTypes) {
  opts.first_call = FirstCall::wait;  // the tuning on the first call itself is under test
  Runtime rt(opts);
  KernelSpec s = load_spec(test::kernels() + "/cpu/matmul.toml");
  Kernel k(rt, s);
  auto run = [&](int64_t M, int64_t N, int64_t K) {
    std::vector<float> A(M * K), B(K * N), C(M * N, -1);
    fill_random(DType::f32, std::as_writable_bytes(std::span(A)), 1);
    fill_random(DType::f32, std::as_writable_bytes(std::span(B)), 2);
    k(A.data(), B.data(), C.data(), M, N, K);
    for (int64_t i = 0; i < M; i += 7)
      for (int64_t j = 0; j < N; j += 5) {
        double ref = 0;
        for (int64_t x = 0; x < K; ++x) ref += double(A[i * K + x]) * B[x * N + j];
        ASSERT_NEAR(C[i * N + j], ref, 1e-3);
      }
  };
  opts.bench_budget_ms = 1;
  run(40, 24, 16);
  EXPECT_EQ(k.shapes_seen(), 1u);
  run(40, 24, 16);
  EXPECT_EQ(k.shapes_seen(), 1u);
  run(33, 65, 17);
  EXPECT_EQ(k.shapes_seen(), 2u);
  EXPECT_EQ(rt.tuning_cache()->count(), 2u);
  // A new handle in a new runtime takes the choice from the cache.
  Runtime rt2(opts);
  Kernel k2(rt2, s);
  std::vector<float> A(40 * 16), B(16 * 24), C(40 * 24);
  int64_t M = 40, N = 24, K = 16;
  void* params[] = {&A, &B, &C, &M, &N, &K};
  float *a = A.data(), *b = B.data(), *c = C.data();
  params[0] = &a, params[1] = &b, params[2] = &c;
  EXPECT_EQ(k2.choice(params).source, ChoiceSource::cache);
  // Wrong types are refused before anything runs.
  double* d = nullptr;
  EXPECT_THROW(k(d, B.data(), C.data(), M, N, K), Error);
  EXPECT_THROW(k(A.data(), B.data(), C.data(), 40, N, K), Error);  // an int where i64 is due
  EXPECT_THROW(k(A.data(), B.data(), C.data(), M, N), Error);
}

TEST_F(TuneTest, EditingAnIncludedHeaderInvalidatesTuningRecords) {
  test::write(dir.path() / "helper.h", "#define WORK 1\n");
  KernelSpec s = spec(kSelSpec, "sel.cpp", std::string("#include \"helper.h\"\n") + kSelSource);
  TuningKey before = make_tuning_key(s, "cpu test", "tc", {{"n", 10}});
  test::write(dir.path() / "helper.h", "#define WORK 2\n");
  TuningKey after = make_tuning_key(s, "cpu test", "tc", {{"n", 10}});
  EXPECT_NE(before.base_hex(), after.base_hex());
  test::write(dir.path() / "helper.h", "#define WORK 1\n");
  EXPECT_EQ(before.base_hex(), make_tuning_key(s, "cpu test", "tc", {{"n", 10}}).base_hex());
}

TEST_F(TuneTest, TheCliTunesReportsAndAnswersFromTheCache) {
  // (No record flagged noisy: a busy machine's noisy record is re-measured by the next `kiln tune`,
  // whose answer is then "tuned", not "cache"; the noise rule has tests of its own.)
  std::string env = "KILN_CACHE_DIR=" + (dir.path() / "cache").string() + " KILN_BENCH_BUDGET_MS=2 KILN_NOISE_BOUND=10 ";
  std::string spec = test::kernels() + "/cpu/softmax.toml";
  auto run = [&](const std::string& args) {
    // JSON on stdout alone: a busy machine's noise warning (stderr) must not break its parse.
    const bool json = args.find("--json") != std::string::npos;
    return run_process({"bash", "-c", env + test::kiln_exe() + " " + args + (json ? " 2>/dev/null" : " 2>&1")}, 300);
  };
  ProcessResult missing = run("report " + spec + " --set M=64 --set N=256");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("no tuning record for kernel 'softmax' at M=64 N=256"), std::string::npos) << missing.output;
  ProcessResult first = run("tune --json " + spec + " --set M=64 --set N=256");
  ASSERT_TRUE(first.ok()) << first.output;
  auto j = nlohmann::json::parse(first.output);
  EXPECT_EQ(j["kernel"], "softmax");
  EXPECT_EQ(j["source"], "tuned");
  EXPECT_EQ(j["key"]["M"], 64);
  EXPECT_EQ(j["configs"].size(), 8u);
  EXPECT_TRUE(j["best"].is_object());
  EXPECT_GT(j["best_ns"].get<double>(), 0);
  ProcessResult second = run("tune --json " + spec + " --set M=64 --set N=256");
  auto j2 = nlohmann::json::parse(second.output);
  EXPECT_EQ(j2["source"], "cache");
  EXPECT_EQ(j2["best"], j["best"]);
  ProcessResult rep = run("report " + spec + " --set M=64 --set N=256");
  ASSERT_TRUE(rep.ok()) << rep.output;
  EXPECT_NE(rep.output.find("chose "), std::string::npos) << rep.output;
  // N = 20000 prunes the whole-row variant (WHOLE * N <= 16384).
  ProcessResult big = run("tune " + spec + " --set M=2 --set N=20000");
  ASSERT_TRUE(big.ok()) << big.output;
  EXPECT_NE(big.output.find("pruned: constraint 'WHOLE * N <= 16384' is false"), std::string::npos) << big.output;
  ProcessResult bad = run("tune " + spec + " --set M=2");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("missing N"), std::string::npos) << bad.output;
}

TEST(Summarize, MedianMinMaxOfTimedRuns) {
  BenchResult odd = summarize({5, 1, 3});
  EXPECT_EQ(odd.median_ns, 3);
  BenchResult even = summarize({4, 1, 3, 2});
  EXPECT_EQ(even.median_ns, 2.5);  // the mean of the middle two
  EXPECT_EQ(even.min_ns, 1);
  EXPECT_EQ(even.max_ns, 4);
  EXPECT_EQ(even.ns, (std::vector<double>{4, 1, 3, 2}));  // runs kept in order
}

// Issue 10's planted run, small: null dereferences and endless loops among
// good configs. Each bad config is recorded with its signal or the deadline
// it missed, none is retried, and the loops are cut at the adaptive deadline
// (the fastest config's time, times 20, here with a short floor), not at
// the ceiling.
TEST_F(TuneTest, FaultyConfigsAreCutAtTheAdaptiveDeadlineAndNotRetried) {
  KernelSpec s = spec(R"SPEC(name = "planted"
backend = "cpu"
source = "planted.cpp"
entry = "planted"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2, 3, 4, 5]
[tuning]
key = ["n"]
)SPEC",
                      "planted.cpp", R"SRC(
void planted(kiln::program_id, const float* x, float* y, int64_t n) {
#if MODE == 2 || MODE == 3
  *static_cast<volatile int*>(nullptr) = 0;
#elif MODE == 4 || MODE == 5
  for (volatile int i = 0;; i = i + 1) {}
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + MODE * 0.0f;
}
)SRC");
  opts.bench_timeout_s = 60;           // the ceiling: far above what the test may take
  opts.bench_deadline_floor_s = 3;     // the floor, short for the test (a fresh worker starts within it on a busy machine)
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "1000"}}));
  args.fill_random(1);
  auto t0 = std::chrono::steady_clock::now();
  TuneOutcome o = rt.tune(s, args.params());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(o.choice);
  EXPECT_LT(*o.choice->get("MODE"), 2);
  for (int m : {2, 3}) {
    const ConfigResult& r = result_of(o.record, "MODE=" + std::to_string(m));
    EXPECT_EQ(r.kind, FailKind::crash) << r.error;
    EXPECT_NE(r.error.find("SIGSEGV"), std::string::npos) << r.error;
  }
  for (int m : {4, 5}) {
    const ConfigResult& r = result_of(o.record, "MODE=" + std::to_string(m));
    EXPECT_EQ(r.kind, FailKind::timeout) << r.error;
    EXPECT_NE(r.error.find("ran past its deadline of"), std::string::npos) << r.error;
    EXPECT_EQ(r.error.find("ceiling"), std::string::npos) << "cut at the ceiling: " << r.error;
  }
  auto c = rt.worker_pool()->counters();
  EXPECT_EQ(c.retried, 0u);
  EXPECT_EQ(c.timed_out, 2u);
  EXPECT_EQ(c.crashed, 2u);
  // Not a timing assertion: far below the ceiling, so the deadline was not it.
  EXPECT_LT(secs, 60) << "a loop waited for the ceiling";
}

// Compile on load: a handle starts compiling its config space when it is
// made; a first call after that finished runs no compiler, it only tunes.
TEST_F(TuneTest, AFirstCallAfterTheBackgroundCompileRunsNoCompiler) {
  Runtime rt(opts);
  KernelSpec s = load_spec(test::kernels() + "/cpu/matmul.toml");
  Kernel k(rt, s);
  k.prepare();  // waits for the background compile the constructor started
  auto before = rt.compile_pool("cpu").counters();
  EXPECT_EQ(before.compiled, s.space.size());
  std::vector<float> A(32 * 32, 1), B(32 * 32, 1), C(32 * 32);
  k(A.data(), B.data(), C.data(), int64_t{32}, int64_t{32}, int64_t{32});
  EXPECT_EQ(C[5], 32.0f);
  auto after = rt.compile_pool("cpu").counters();
  EXPECT_EQ(after.compiled, before.compiled) << "the first call ran the compiler";
  // With background compiling off, nothing compiles until the first call.
  Options o = opts;
  o.background_compile = false;
  o.cache_dir = dir.path() / "cache2";
  Runtime rt2(o);
  Kernel k2(rt2, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(rt2.compile_pool("cpu").counters().submitted, 0u);
}

// Making a handle costs its caller nothing (its compiles are queued on the
// runtime's thread for work ahead of the calls), and a kernel whose records
// the tuning cache holds on this device compiles nothing ahead: its first
// calls are answered by them (a warm process), so compiling the rest of its
// space would only compete with them.
TEST_F(TuneTest, AKernelWithRecordsHereCompilesNothingAheadAndOneWithoutCompilesItsSpace) {
  opts.first_call = FirstCall::wait;
  KernelSpec s = load_spec(test::kernels() + "/cpu/matmul.toml");
  std::vector<float> A(32 * 32, 1), B(32 * 32, 1), C(32 * 32);
  {
    Runtime rt(opts);
    Kernel k(rt, s);
    k(A.data(), B.data(), C.data(), int64_t{32}, int64_t{32}, int64_t{32});  // tuned: a record
    EXPECT_EQ(C[5], 32.0f);
  }
  Runtime rt(opts);
  Kernel warm(rt, s);
  KernelSpec other = load_spec(test::kernels() + "/cpu/softmax.toml");
  Kernel cold(rt, other);  // no record: its space compiled ahead, after `warm`'s job (one queue, in order)
  const uint64_t want = other.space.size();
  const auto t0 = std::chrono::steady_clock::now();
  while (rt.compile_pool("cpu").counters().submitted < want &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(rt.compile_pool("cpu").counters().submitted, want)
      << "the kernel with records here compiled ahead, or the other did not compile its space";
  // Its first call takes the record.
  float *a = A.data(), *b = B.data(), *c = C.data();
  int64_t m = 32, n = 32, k = 32;
  void* params[] = {&a, &b, &c, &m, &n, &k};
  warm.launch(params, nullptr);
  EXPECT_EQ(warm.choice(params).source, ChoiceSource::cache);
}

// A kernel that accumulates into its output (split-K style) with the spec's
// `zero`: kiln zeroes the output before each launch, in a worker too, and
// the split configs agree with the unsplit one.
TEST_F(TuneTest, OutputsListedInZeroAreZeroedBeforeEachLaunch) {
  KernelSpec s = spec(R"SPEC(name = "splitsum"
backend = "cpu"
source = "splitsum.cpp"
entry = "splitsum"
grid = ["SPLIT"]
args = [ { name = "x", type = "f32*", size = "n * k", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" }, { name = "k", type = "i64" } ]
zero = ["y"]
zero_when = "SPLIT > 1"
[params]
SPLIT = [1, 2, 4]
[tuning]
key = ["n", "k"]
reference = { SPLIT = 1 }
)SPEC",
                      "splitsum.cpp", R"SRC(#include <atomic>
// y[i] = sum over j of x[i * k + j]; SPLIT program instances each add a slice of j.
void splitsum(kiln::program_id pid, const float* x, float* y, int64_t n, int64_t k) {
  const int64_t per = (k + SPLIT - 1) / SPLIT, j0 = pid.x * per, j1 = j0 + per < k ? j0 + per : k;
  for (int64_t i = 0; i < n; ++i) {
    float s = 0;
    for (int64_t j = j0; j < j1; ++j) s += x[i * k + j];
    if (SPLIT == 1) y[i] = s;
    else std::atomic_ref<float>(y[i]).fetch_add(s);
  }
}
)SRC");
  Runtime rt(opts);
  HostArgs args(s, parse_scalars(s, {{"n", "64"}, {"k", "1000"}}));
  args.fill_random(4);
  TuneOutcome o = rt.tune(s, args.params());
  for (const auto& c : o.record.configs) EXPECT_TRUE(c.ok()) << c.config.str() << ": " << c.error;
  // And through a handle, on the caller's (dirty) buffer.
  Kernel k(rt, s);
  auto* y = reinterpret_cast<float*>(args.buffer(1).data());
  std::fill(y, y + 64, 123.f);
  k.launch(args.params());
  const auto* x = reinterpret_cast<const float*>(args.buffer(0).data());
  double ref = 0;
  for (int j = 0; j < 1000; ++j) ref += x[5 * 1000 + j];
  EXPECT_NEAR(y[5], ref, 1e-3);
}

namespace {

// Issue row L1. MODE 0 is fast (a few microseconds), but until another
// config has run (MODES 1-5 leave a flag file on their first call) two of
// its calls in three sleep 2 ms: its first timing, as on a machine that a
// neighbour disturbs, has a slow median and a fast minimum, however long
// the machine takes between its calls. MODES 1-5 are reliably slow (a
// ~300 us spin) and alike, so by median they fill every place in the
// re-timing, which finds MODE 0 undisturbed.
const char* kPlantedSpec = R"SPEC(name = "planted"
backend = "cpu"
source = "planted.cpp"
entry = "planted"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2, 3, 4, 5]
[tuning]
key = ["n"]
reference = { MODE = 0 }
search = "exhaustive"
)SPEC";

std::string planted_source(const fs::path& flag) {
  return R"SRC(#include <chrono>
#include <cstdio>
#include <thread>
#include <unistd.h>
void planted(kiln::program_id, const float* x, float* y, int64_t n) {
  const char* flag = ")SRC" + flag.string() + R"SRC(";
#if MODE == 0
  static int calls = 0;
  if (::access(flag, F_OK) != 0 && ++calls % 3 != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
#else
  static const bool told = [&] {
    if (std::FILE* f = std::fopen(flag, "w")) std::fclose(f);
    return true;
  }();
  (void)told;
  using C = std::chrono::steady_clock;
  const C::time_point until = C::now() + std::chrono::microseconds(300);
  while (C::now() < until) {}
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f;
}
)SRC";
}

}  // namespace

// A config whose first timing was disturbed (a slow median, a fast
// minimum) is re-timed beside the leaders by median and wins there: noise
// never makes kiln keep a choice plainly slower than one timed beside it.
TEST_F(TuneTest, TheBestByMinimumIsReTimedBesideTheLeadersByMedian) {
  opts.bench_budget_ms = 20;
  Runtime rt(opts);
  KernelSpec s = spec(kPlantedSpec, "planted.cpp", planted_source(dir.path() / "others-ran"));
  HostArgs a(s, parse_scalars(s, {{"n", "64"}}));
  a.fill_random(1);
  TuneOutcome o = rt.tune(s, a.params(), {});
  ASSERT_TRUE(o.choice);
  const ConfigResult& fast = result_of(o.record, "MODE=0");
  EXPECT_EQ(o.choice->str(), "MODE=0") << "kept a config 100 times slower by its minimum; MODE=0: median "
                                       << fast.ns.value_or(0) << " ns, min " << fast.min_ns << " ns";
  EXPECT_GE(o.retimed_now, 2u);
}

namespace {

// Issue row L2. Two configs alike. While the flag file exists, a
// "neighbour" takes the core during a random half of the calls (each such
// spin takes three times as long): any timing of them is noise, side by
// side or not.
std::string jitter_source(const fs::path& flag) {
  return R"SRC(#include <chrono>
#include <random>
#include <unistd.h>
void jitter(kiln::program_id, const float* x, float* y, int64_t n) {
  using C = std::chrono::steady_clock;
  static std::mt19937 coin(std::random_device{}());
  int us = 200;
  if (::access(")SRC" + flag.string() + R"SRC(", F_OK) == 0 && coin() % 2 == 0) us = 600;
  const auto until = C::now() + std::chrono::microseconds(us);
  while (C::now() < until) {}
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f;
}
)SRC";
}

}  // namespace

// Timings whose spread passes the bound are taken again, then stored
// flagged; the flag shows in kiln report; the hot path uses the record as
// it is; the next tuning re-measures it and, quieter, clears the flag.
TEST_F(TuneTest, NoisyTimingsAreRetakenThenFlaggedAndReMeasuredWhenQuieter) {
  const fs::path flag = dir.path() / "noisy-now";
  test::write(flag, "");
  test::write(dir.path() / "k.toml", R"SPEC(name = "jitter"
backend = "cpu"
source = "jitter.cpp"
entry = "jitter"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1]
[tuning]
key = ["n"]
)SPEC");
  test::write(dir.path() / "jitter.cpp", jitter_source(flag));
  KernelSpec s = load_spec(dir.path() / "k.toml");
  opts.noise_bound = 0.10;
  opts.bench_budget_ms = 9;
  HostArgs a(s, parse_scalars(s, {{"n", "64"}}));
  a.fill_random(1);
  double noisy_noise = 0;
  {
    Runtime rt(opts);
    TuneOutcome o = rt.tune(s, a.params(), {});
    ASSERT_TRUE(o.choice);
    EXPECT_TRUE(o.record.noisy) << "noise " << o.record.noise;
    EXPECT_GT(o.record.noise, 0.10);
    noisy_noise = o.record.noise;
    // The hot path takes it as it is.
    TuneOptions cached;
    cached.cached_only = true;
    TuneOutcome hot = rt.tune(s, a.params(), cached);
    EXPECT_TRUE(hot.from_cache);
    EXPECT_EQ(hot.retimed_now, 0u);
  }
  ProcessResult report = run_process({"bash", "-c", "KILN_CACHE_DIR='" + opts.cache_dir.string() + "' " +
                                                        test::kiln_exe() + " report '" +
                                                        (dir.path() / "k.toml").string() + "' --set n=64 2>&1"},
                                     60);
  EXPECT_NE(report.output.find("noisy: timed on a busy machine"), std::string::npos) << report.output;
  fs::remove(flag);  // the machine is quiet again
  Runtime rt(opts);
  TuneOutcome plain = rt.tune(s, a.params(), {});  // a tuning that does not ask re-measures nothing
  EXPECT_TRUE(plain.from_cache);
  EXPECT_EQ(plain.retimed_now, 0u);
  TuneOptions re;
  re.remeasure_noisy = true;  // as kiln tune, kiln plan and a first call's background tuning ask
  TuneOutcome again = rt.tune(s, a.params(), re);
  ASSERT_TRUE(again.choice);
  EXPECT_EQ(again.timed_now, 0u) << "re-measured, not tuned from scratch";
  EXPECT_GT(again.retimed_now, 0u);
  EXPECT_EQ(again.record.remeasured, 1);
  EXPECT_LT(again.record.noise, noisy_noise);
  EXPECT_FALSE(again.record.noisy) << "noise " << again.record.noise;
}

// Outputs agree where both are the same infinity (a running max over no element is -inf
// in every config), and disagree where one is infinite and the other is not, or NaN.
TEST(TunerCompare, EqualInfinitiesAgreeAndEverythingElseIsCompared) {
  const float inf = std::numeric_limits<float>::infinity();
  auto cmp = [](std::vector<float> got, std::vector<float> ref) {
    return Tuner::compare(DType::f32, std::as_bytes(std::span(got)), std::as_bytes(std::span(ref)), TuningSpec{});
  };
  EXPECT_FALSE(cmp({1.f, -inf, inf}, {1.f, -inf, inf}));
  EXPECT_TRUE(cmp({1.f, -inf}, {1.f, inf}));
  EXPECT_TRUE(cmp({1.f, -inf}, {1.f, -3.f}));
  EXPECT_TRUE(cmp({1.f, std::nanf("")}, {1.f, -inf}));
  EXPECT_FALSE(cmp({std::nanf("")}, {std::nanf("")}));
}

// A call whose buffers only some configs can take (a constraint on a buffer's alignment), after
// calls that tuned the same sizes with aligned buffers: the alignment is not in the tuning key,
// so the record is the same, and the fastest configs cannot run this call. It runs one that
// can (here the only one: BM = BN = 32, BK = 128), from the record or tuned, and is right
// (the handle keys its choice by the alignment the constraint reads). Where no config takes
// the call, the error names the constraint.
TEST_F(TuneTest, AMisalignedCallRunsAConfigThatTakesItAfterAlignedCallsTunedItsSizes) {
  opts.first_call = FirstCall::wait;
  Runtime rt(opts);
  std::ifstream in(test::kernels() + "/cpu/matmul.toml");
  std::stringstream b;
  b << in.rdbuf();
  std::string t = b.str();
  const std::string lib = "library = [\"openblas_sgemm\"]";
  t.replace(t.find(lib), lib.size(), "constraints = [\"BM == 32 && BN == 32 && BK == 128 || align_A % 64 == 0\"]");
  std::ifstream src_file(test::kernels() + "/cpu/matmul.cpp");
  std::stringstream src;
  src << src_file.rdbuf();
  KernelSpec s = test::spec_in(dir.path(), t, "matmul.cpp", src.str());
  Kernel k(rt, s);
  const int64_t M = 96, N = 96, K = 64;
  std::vector<float> room(M * K + 64), B(K * N), C(M * N);
  float* A = room.data();
  while (reinterpret_cast<uintptr_t>(A) % 64 != 0) ++A;
  fill_random(DType::f32, std::as_writable_bytes(std::span(room)), 1);
  fill_random(DType::f32, std::as_writable_bytes(std::span(B)), 2);
  auto check = [&](const float* a) {
    for (int64_t i = 0; i < M; i += 7)
      for (int64_t j = 0; j < N; j += 5) {
        double ref = 0;
        for (int64_t x = 0; x < K; ++x) ref += double(a[i * K + x]) * B[x * N + j];
        ASSERT_NEAR(C[i * N + j], ref, 1e-3);
      }
  };
  k(static_cast<const float*>(A), B.data(), C.data(), M, N, K);
  check(A);
  k(static_cast<const float*>(A + 1), B.data(), C.data(), M, N, K);
  check(A + 1);
  Runtime rt2(opts);  // a new process, from the cache
  Kernel k2(rt2, s);
  k2(static_cast<const float*>(A + 1), B.data(), C.data(), M, N, K);
  check(A + 1);
  // Where no config takes such a call (every one asks for the alignment), the error says why.
  const std::string any = "BM == 32 && BN == 32 && BK == 128 || ";
  t.replace(t.find(any), any.size(), "");
  std::filesystem::create_directories(dir.path() / "strict");
  Kernel strict(rt2, test::spec_in(dir.path() / "strict", t, "matmul.cpp", src.str()));
  try {
    strict(static_cast<const float*>(A + 1), B.data(), C.data(), M, N, K);
    FAIL() << "a call no config can take ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no config can run this call (constraint 'align_A % 64 == 0' is false)"),
              std::string::npos)
        << e.what();
  }
}

// A library that builds a plan for each shape (cuDNN's attention: a graph per (T, S)) is no
// choice where the spec keeps a key name by bucket and the call's bucket holds more than one
// value: the bucket's choice would run every value of it, each a new plan. A record that timed
// it fastest (one from before the rule) then answers with the fastest config of kiln's own; at a
// bucket of one value (M <= 2 here), or for a library that plans nothing per shape, it stays the
// choice. (Where the library is no candidate, the tuning leaves it out with the reason:
// Tuner::bucket_refusal; the GPU test AttentionTest.AProgramPassesOverCudnn... checks both ends.)
TEST(TunerChoose, ALibraryThatPlansPerShapeIsNoChoiceForABucketOfManyValues) {
  KernelSpec s = load_spec(test::kernels() + "/cpu/matmul.toml");
  s.tuning.pow2 = {"M"};
  TuningRecord r;
  r.kernel = s.name;
  ConfigResult lib;
  lib.config.library = "openblas_sgemm";
  lib.ns = 1000;
  ConfigResult own;
  own.config = *s.tuning.default_config;
  own.ns = 1500;
  ConfigResult slower;
  slower.config = s.space.at(0) == own.config ? s.space.at(1) : s.space.at(0);
  slower.ns = 3000;
  r.configs = {lib, own, slower};
  const LaunchLimits limits;  // none
  auto slots_at = [&](int64_t m) {
    std::vector<int64_t> slots(s.args.size(), 256);  // the buffers' alignment
    slots[static_cast<size_t>(s.arg_index("M"))] = m;
    slots[static_cast<size_t>(s.arg_index("N"))] = 256;
    slots[static_cast<size_t>(s.arg_index("K"))] = 256;
    return slots;
  };
  auto plans = [](const std::string& choice) { return choice == "openblas_sgemm"; };
  auto none = [](const std::string&) { return false; };
  for (int64_t m : {int64_t{3}, int64_t{100}, int64_t{1024}, int64_t{1} << 40}) {
    SCOPED_TRACE(m);
    const std::vector<int64_t> sl = slots_at(m);
    const std::string why = Tuner::bucket_refusal(s, sl.data());
    EXPECT_NE(why.find(fmt::format("the bucket of M = {} holds more than one value", m)), std::string::npos) << why;
    std::optional<Config> c = Tuner::choose(r, s, sl.data(), limits, plans);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->str(), own.config.str()) << "the library's plan per shape chosen for a bucket of many values";
    c = Tuner::choose(r, s, sl.data(), limits, none);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->library, "openblas_sgemm");
    c = Tuner::choose(r, s, sl.data(), limits);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->library, "openblas_sgemm");
  }
  for (int64_t m : {int64_t{0}, int64_t{1}, int64_t{2}}) {
    SCOPED_TRACE(m);
    const std::vector<int64_t> sl = slots_at(m);
    EXPECT_EQ(Tuner::bucket_refusal(s, sl.data()), "");
    std::optional<Config> c = Tuner::choose(r, s, sl.data(), limits, plans);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->library, "openblas_sgemm") << "a bucket of one value: its plan is made once";
  }
  // A key kept exact has buckets of one value: the library stays the choice.
  s.tuning.pow2.clear();
  const std::vector<int64_t> sl = slots_at(1024);
  EXPECT_EQ(Tuner::bucket_refusal(s, sl.data()), "");
  EXPECT_EQ(Tuner::choose(r, s, sl.data(), limits, plans)->library, "openblas_sgemm");
}
