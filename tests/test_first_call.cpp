// The first call of a shape with no tuning record (KILN_FIRST_CALL): a safe
// choice at once, the tuning behind it, the winner swapped in.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/args.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// y = 2x. MODE 0: right, with 30 times the work; 1: right; 2: off by one;
// 3: a null dereference; 4: right, and slower than 1.
const char* kSpec = R"SPEC(name = "stair"
backend = "cpu"
source = "stair.cpp"
entry = "stair"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2, 3, 4]
[tuning]
key = ["n"]
reference = { MODE = 0 }
default = { MODE = 0 }
)SPEC";

const char* kSource = R"SRC(
void stair(kiln::program_id, const float* x, float* y, int64_t n) {
#if MODE == 3
  *static_cast<volatile int*>(nullptr) = 0;
#endif
  const int reps = MODE == 0 ? 30 : MODE == 4 ? 4 : 1;
  for (int r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f + (MODE == 2 ? 1.0f : 0.0f) + r * 0.0f;
  asm volatile("" ::: "memory");
}
)SRC";

std::string with(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("no '" + from + "' in the spec");
  return s.replace(at, from.size(), to);
}

struct FirstCallTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 5;
    opts.bench_timeout_s = 5;
    opts.workers = 1;
    opts.first_call = FirstCall::swap;
  }
  KernelSpec spec(const std::string& toml = kSpec) { return test::spec_in(dir.path(), toml, "stair.cpp", kSource); }

  struct Call {
    std::vector<float> x, y;
    int64_t n;
    float *xp, *yp;
    void* params[3];
    explicit Call(int64_t count) : x(count), y(count), n(count) {
      fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 7);
      xp = x.data(), yp = y.data();
      params[0] = &xp, params[1] = &yp, params[2] = &n;
    }
    // Runs the handle and checks every element.
    void run(Kernel& k) {
      std::fill(y.begin(), y.end(), -1.0f);
      k(xp, yp, n);
      for (int64_t i = 0; i < n; ++i)
        if (y[i] != x[i] * 2.0f) {
          ADD_FAILURE() << "y[" << i << "] = " << y[i] << ", expected " << x[i] * 2.0f << " (config "
                        << k.choice(params).config.str() << ", " << k.choice(params).source << ")";
          return;
        }
    }
  };
};

}  // namespace

// Issue target: a handle called in a loop while its shape tunes behind it.
// Every result is right, and the choice changes exactly once: from the safe
// choice to the tuned one.
TEST_F(FirstCallTest, CallsGoOnWhileTheShapeTunesAndTheChoiceChangesExactlyOnce) {
  Runtime rt(opts);
  Kernel k(rt, spec());
  Call c(4096);
  c.run(k);
  const Choice* first = &k.choice(c.params);
  EXPECT_EQ(first->source, ChoiceSource::safe);
  EXPECT_EQ(first->config.str(), "MODE=0") << "the spec's default";
  size_t changes = 0, during = 0;
  const Choice* last = first;
  while (rt.tunings_pending() > 0) {
    c.run(k);
    ++during;
    const Choice* now = &k.choice(c.params);
    if (now != last) ++changes, last = now;
  }
  rt.wait_tuned();
  for (int i = 0; i < 20; ++i) {
    c.run(k);
    const Choice* now = &k.choice(c.params);
    if (now != last) ++changes, last = now;
  }
  EXPECT_GT(during, 0u) << "no call ran while the tuning did";
  EXPECT_EQ(changes, 1u);
  EXPECT_EQ(last->source, ChoiceSource::tuned);
  EXPECT_NE(last->config.str(), "MODE=0") << "the slow safe choice was swapped out";
  EXPECT_NE(last->config.str(), "MODE=2");
  EXPECT_EQ(rt.stats().background_tunings, 1u);
  // The record is there for the next process: its first call takes it.
  bool noisy = false;  // timed on a busy machine: the next process re-measures it behind its calls
  if (std::shared_ptr<TuningCache> tc = rt.tuning_cache())
    if (std::optional<TuningRecord> r = tc->get(make_tuning_key(spec(), rt.backend("cpu"), {{"n", 4096}})))
      noisy = r->noisy;
  Runtime rt2(opts);
  Kernel k2(rt2, spec());
  c.run(k2);
  EXPECT_EQ(k2.choice(c.params).source, ChoiceSource::cache);
  EXPECT_EQ(k2.choice(c.params).config, last->config);
  if (!noisy) {
    EXPECT_EQ(rt2.tunings_pending(), 0u) << "a quiet record was tuned again";
  }
}

TEST_F(FirstCallTest, WaitTunesBeforeTheFirstCallReturns) {
  opts.first_call = FirstCall::wait;
  Runtime rt(opts);
  Kernel k(rt, spec());
  Call c(2048);
  c.run(k);
  EXPECT_EQ(k.choice(c.params).source, ChoiceSource::tuned);
  EXPECT_EQ(rt.tunings_pending(), 0u);
  EXPECT_GT(rt.stats().configs_timed, 0u);
}

TEST_F(FirstCallTest, ServeRunsTheSafeChoiceAndNeverTunes) {
  opts.first_call = FirstCall::serve;
  Runtime rt(opts);
  Kernel k(rt, spec());
  Call c(2048);
  c.run(k);
  c.run(k);
  EXPECT_EQ(k.choice(c.params).source, ChoiceSource::safe);
  rt.wait_tuned();
  EXPECT_EQ(rt.stats().configs_timed, 0u);
  EXPECT_EQ(rt.stats().background_tunings, 0u);
  EXPECT_EQ(rt.serving_misses(), 1u);
  EXPECT_EQ(rt.tuning_cache()->count(), 0u);
}

TEST_F(FirstCallTest, TheNearestTunedKeysChoiceRunsFirst) {
  {
    Options w = opts;
    w.first_call = FirstCall::wait;
    Runtime rt(w);
    Kernel k(rt, spec());
    Call c(4096);
    c.run(k);
  }
  Runtime rt(opts);
  KernelSpec s = spec();
  Call near(5000);
  std::vector<SafeChoice> safe = safe_choices(s, near.params, rt.backend("cpu"), rt.tuning_cache().get());
  ASSERT_FALSE(safe.empty());
  EXPECT_TRUE(safe[0].proven);
  EXPECT_NE(safe[0].how.find("nearest tuned key n=4096"), std::string::npos) << safe[0].how;
  Kernel k(rt, s);
  near.run(k);
  EXPECT_EQ(k.choice(near.params).source, ChoiceSource::safe);
  EXPECT_EQ(k.choice(near.params).config, safe[0].config);
  rt.wait_tuned();
  EXPECT_EQ(k.choice(near.params).source, ChoiceSource::tuned);
}

// A safe choice nothing has checked runs once in a worker first: one that
// crashes there, or computes something else than the reference, is passed
// over, and this process never runs it.
TEST_F(FirstCallTest, AnUncheckedSafeChoiceThatCrashesOrIsWrongIsPassedOver) {
  for (const char* bad : {"MODE = 3", "MODE = 2"}) {
    Options o = opts;
    o.cache_dir = dir.path() / bad;
    Runtime rt(o);
    Kernel k(rt, spec(with(kSpec, "default = { MODE = 0 }", std::string("default = { ") + bad + " }")));
    Call c(1024);
    c.run(k);
    EXPECT_EQ(k.choice(c.params).source, ChoiceSource::safe);
    EXPECT_EQ(k.choice(c.params).config.str(), "MODE=0") << "after " << bad << ": the cheap rule's pick";
    rt.wait_tuned();
  }
}

// Issue row E4: a spec with neither a reference nor a library, whose
// default config computes wrongly. No call is answered by a config checked
// against nothing: the first call waits until two configs agree, and a
// second process (whose predecessor dropped its tuning) does the same.
TEST_F(FirstCallTest, WithNothingToCheckAgainstNoCallIsAnsweredByAnUncheckedConfig) {
  const std::string no_reference = with(with(kSpec, "reference = { MODE = 0 }", ""), "default = { MODE = 0 }",
                                        "default = { MODE = 2 }");
  for (int process = 0; process < 2; ++process) {
    Runtime rt(opts);
    Kernel k(rt, spec(no_reference));
    Call c(1024);
    c.run(k);  // checks every element: MODE=2 is off by one
    EXPECT_NE(k.choice(c.params).config.str(), "MODE=2") << "process " << process;
    // Dropped mid-tuning or not, nothing of MODE=2 is kept as an answer.
  }
  // And where the spec has a reference, a first call still answers at once with its checked default.
  Runtime rt(opts);
  Kernel k(rt, spec());
  Call c(1024);
  c.run(k);
  EXPECT_EQ(k.choice(c.params).source, ChoiceSource::safe);
  rt.wait_tuned();
}

// The cheap rule, where no record is near and the spec names no default:
// the config that fills the device with the fewest programs.
TEST_F(FirstCallTest, TheCheapRuleFillsTheDeviceWithTheFewestPrograms) {
  Runtime rt(opts);
  KernelSpec s = test::spec_in(dir.path(), test::kFillSpec, "fill.cpp", test::kFillSource);
  const int64_t units = rt.backend("cpu").device().info().multiprocessors;
  for (int64_t n : {int64_t{1}, int64_t{5}, units * 3, int64_t{100000}}) {
    std::vector<int64_t> out(static_cast<size_t>(n));
    int64_t* p = out.data();
    void* params[] = {&p, &n};
    std::vector<SafeChoice> safe = safe_choices(s, params, rt.backend("cpu"), nullptr);
    ASSERT_FALSE(safe.empty());
    // The expected pick, worked out here from the grid cdiv(n, BLOCK), BLOCK in {1, 4, 16}.
    int64_t best_block = 0, best_programs = 0;
    for (int64_t b : {1, 4, 16}) {
      int64_t programs = (n + b - 1) / b;
      bool fills = programs >= units, best_fills = best_programs >= units;
      if (!best_block || (fills && !best_fills) || (fills && best_fills && programs < best_programs) ||
          (!fills && !best_fills && programs > best_programs))
        best_block = b, best_programs = programs;
    }
    EXPECT_NE(safe[0].how.find("cheap rule"), std::string::npos) << safe[0].how;
    EXPECT_EQ(safe[0].config.str(), "BLOCK=" + std::to_string(best_block) + " SCALE=1") << "n = " << n;
    EXPECT_FALSE(safe[0].proven);
  }
}

TEST_F(FirstCallTest, SpacesWithManyRunnableConfigsAreSearchedQuicklyUnlessAskedOtherwise) {
  opts.quick_above = 3;
  opts.first_call = FirstCall::wait;
  std::string no_default = with(kSpec, "default = { MODE = 0 }", "");
  for (int round = 0; round < 3; ++round) {
    Options o = opts;
    o.cache_dir = dir.path() / ("c" + std::to_string(round));
    Runtime rt(o);
    KernelSpec s = spec(round == 1 ? with(no_default, "key = [\"n\"]", "key = [\"n\"]\nsearch = \"exhaustive\"")
                                   : no_default);
    Call c(512);
    TuneOptions to;
    if (round == 2) to.effort = Effort::full;
    TuneOutcome out = rt.tune(s, c.params, to);
    EXPECT_EQ(out.record.method, round == 0 ? SearchMethod::budgeted : SearchMethod::exhaustive) << "round " << round;
  }
}

TEST_F(FirstCallTest, ARuntimeGoingAwayStopsItsBackgroundTuning) {
  opts.bench_budget_ms = 200;
  for (int i = 0; i < 3; ++i) {
    Runtime rt(opts);
    Kernel k(rt, spec());
    Call c(8192);
    c.run(k);
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-tuning
  }
  SUCCEED() << "destroyed while tuning, without a hang or a fault";
}

// A warm first call opens no library its choice does not need. Each case is
// a fresh process (this test binary, filtered to the child below), so that
// nothing an earlier test opened counts.
TEST(FirstCallChild, OneWarmCall) {
  const char* dirv = std::getenv("KILN_TEST_CHILD_DIR");
  if (!dirv) GTEST_SKIP() << "run by FirstCallTest.AWarmFirstCallOpensNoLibraryItsChoiceDoesNotNeed";
  Options o = test::options_in(dirv);
  Runtime rt(o);
  Kernel k(rt, load_spec(test::kernels() + "/cpu/matmul.toml"));
  int64_t M = 64, N = 48, K = 32;
  std::vector<float> A(M * K, 1.0f), B(K * N, 1.0f), C(M * N);
  k(A.data(), B.data(), C.data(), M, N, K);
  std::ifstream maps("/proc/self/maps");
  std::stringstream ss;
  ss << maps.rdbuf();
  float *a = A.data(), *b = B.data(), *c = C.data();
  void* params[] = {&a, &b, &c, &M, &N, &K};
  std::printf("CHILD choice=%s source=%s openblas=%d\n", k.choice(params).config.str().c_str(),
              choice_source_name(k.choice(params).source), ss.str().find("libopenblas") != std::string::npos ? 1 : 0);
}

TEST_F(FirstCallTest, AWarmFirstCallOpensNoLibraryItsChoiceDoesNotNeed) {
  auto child = [&](const std::string& extra) {
    ProcessResult r = run_process({"bash", "-c",
                                   "KILN_TEST_CHILD_DIR='" + dir.path().string() + "' " + extra + " exec '" +
                                       (test::exe_dir() / "kiln_tests").string() +
                                       "' --gtest_filter=FirstCallChild.OneWarmCall"},
                                  300);
    auto at = r.output.find("CHILD ");
    EXPECT_NE(at, std::string::npos) << r.output;
    return at == std::string::npos ? std::string() : r.output.substr(at, r.output.find('\n', at) - at);
  };
  child("KILN_FIRST_CALL=wait");  // tunes, OpenBLAS among the choices
  std::string warm = child("");
  EXPECT_NE(warm.find("source=cache"), std::string::npos) << warm;
  const bool library = warm.find("choice=library:openblas_sgemm") != std::string::npos;
  EXPECT_NE(warm.find(library ? "openblas=1" : "openblas=0"), std::string::npos)
      << warm << ": OpenBLAS is opened where, and only where, the choice is OpenBLAS";
}

// A handle tuned on templates only (TuneOptions::libraries = false) never runs
// a library choice, not even as its first call's safe choice.
TEST_F(FirstCallTest, ATemplatesOnlyHandleGetsNoLibraryAsItsSafeChoice) {
  KernelSpec s = load_spec(test::kernels() + "/cpu/matmul.toml");
  ASSERT_FALSE(s.libraries.empty());
  Runtime rt(opts);
  Backend& be = rt.backend("cpu");
  HostArgs a(s, parse_scalars(s, {{"M", "96"}, {"N", "80"}, {"K", "64"}}));
  std::vector<SafeChoice> all = safe_choices(s, a.params(), be, nullptr, true);
  std::vector<SafeChoice> templates = safe_choices(s, a.params(), be, nullptr, false);
  ASSERT_FALSE(templates.empty());
  for (const auto& c : templates) EXPECT_TRUE(c.config.library.empty()) << c.config.str();
  if (be.library_unavailable(s.libraries[0]).empty()) {
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(all[0].config.library, s.libraries[0]) << "with libraries, the library comes first";
  }
  TuneOptions to;
  to.libraries = false;
  Kernel k(rt, s, to);
  a.fill_random(5);
  k.launch(a.params());
  EXPECT_TRUE(k.choice(a.params()).config.library.empty()) << k.choice(a.params()).config.str();
  rt.wait_tuned();
  EXPECT_TRUE(k.choice(a.params()).config.library.empty()) << k.choice(a.params()).config.str();
}
