// Dispatch plans: the cover they keep, the rule they dispatch by, their
// record, and a handle dispatching by one with nothing tuned.
#include <gtest/gtest.h>

#include "core/fsutil.hpp"
#include "kiln/args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/plan.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;

namespace {

const char* kSpec = R"SPEC(name = "twice"
backend = "cpu"
source = "twice.cpp"
entry = "twice"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
constraints = ["MODE != 3 || n % 2 == 0"]
[params]
MODE = [0, 1, 2, 3]
[tuning]
key = ["n"]
)SPEC";

const char* kSource = R"SRC(
void twice(kiln::program_id, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f;
}
)SRC";

struct PlanTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  KernelSpec spec = test::spec_in(dir.path(), kSpec, "twice.cpp", kSource);
  TuningKey base = make_tuning_key(spec, "dev", "tc", {{"n", 0}});
  // A record at n whose config i took times[i] ns (0: failed).
  TuningRecord record(int64_t n, std::vector<double> times) {
    TuningRecord r;
    r.kernel = "twice";
    r.key = make_tuning_key(spec, "dev", "tc", {{"n", n}});
    r.space = spec.space;
    for (size_t i = 0; i < times.size(); ++i) {
      ConfigResult c;
      c.config = spec.space.at(i);
      c.binary = std::string(32, 'a' + static_cast<char>(i));
      if (times[i] > 0) c.ns = times[i];
      else c.kind = FailKind::crash;
      r.configs.push_back(c);
    }
    return r;
  }
};

}  // namespace

// MODE=0 is best small, MODE=2 best large, MODE=1 within 5% of the best
// everywhere: one config covers all, and the plan keeps only it.
TEST_F(PlanTest, KeepsTheSmallestSetWithinSlack) {
  std::vector<TuningRecord> recs{record(16, {100, 104, 150, 300}), record(256, {200, 205, 198, 300}),
                                 record(4096, {900, 840, 800, 0})};
  DispatchPlan p = build_plan(spec, base, recs, 1.05, 8);
  ASSERT_EQ(p.kept, 1u);
  EXPECT_EQ(p.configs[0].str(), "MODE=1");
  EXPECT_TRUE(p.uncovered.empty());
  // A tighter slack needs two: MODE=0 small, MODE=2 large (MODE=2 is within 1% at 256).
  DispatchPlan q = build_plan(spec, base, recs, 1.01, 8);
  ASSERT_EQ(q.kept, 2u);
  EXPECT_EQ(q.configs[q.points[0].config].str(), "MODE=0");
  EXPECT_EQ(q.configs[q.points[2].config].str(), "MODE=2");
  // Capped at one config: the shapes it cannot cover are listed.
  DispatchPlan r = build_plan(spec, base, recs, 1.01, 1);
  EXPECT_EQ(r.kept, 1u);
  EXPECT_FALSE(r.uncovered.empty());
}

// A call runs the kept config that is fastest, relative to the best, over its
// nearest training points (weighted by closeness), among those that can run it.
TEST_F(PlanTest, PicksTheNearestPointsConfigThatCanRunTheCall) {
  std::vector<TuningRecord> recs{record(16, {100, 200, 200, 50}), record(4096, {900, 840, 800, 900})};
  DispatchPlan p = build_plan(spec, base, recs, 1.0, 8);
  int64_t even[3] = {0, 0, 20}, odd[3] = {0, 0, 21};
  LaunchLimits lim;
  EXPECT_EQ(p.pick(spec, {20}, even, lim)->str(), "MODE=3");
  EXPECT_EQ(p.pick(spec, {21}, odd, lim)->str(), "MODE=2") << "MODE=3 cannot run an odd n: the next nearest point's";
  EXPECT_EQ(p.pick(spec, {3000}, even, lim)->str(), "MODE=2");
}

TEST_F(PlanTest, ItsRecordRoundTripsAndAStaleOrDamagedOneIsAMiss) {
  DispatchPlan p = build_plan(spec, base, {record(16, {100, 200, 200, 50}), record(4096, {900, 840, 800, 900})}, 1.0, 8);
  std::string text = plan_to_text(p);
  auto back = plan_from_text(text, base, spec);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->configs, p.configs);
  std::string flipped = text;
  flipped[text.size() - 10] ^= 1;
  EXPECT_FALSE(plan_from_text(flipped, base, spec));
  TuningKey other = make_tuning_key(spec, "another device", "tc", {{"n", 0}});
  EXPECT_FALSE(plan_from_text(text, other, spec));
  // The spec lost MODE=3: the plan names a config it no longer has.
  std::string toml = kSpec;
  toml.replace(toml.find("MODE = [0, 1, 2, 3]"), 19, "MODE = [0, 1, 2]");
  KernelSpec smaller = test::spec_in(dir.path(), toml, "twice.cpp", kSource);
  EXPECT_FALSE(plan_from_text(text, base, smaller));
}

// A size-hint multi-kernel given a plan dispatches by it, tuning nothing.
TEST_F(PlanTest, AHandleDispatchesByAPlanWithNothingTuned) {
  Options o = test::options_in(dir.path());
  o.workers = 1;
  Runtime rt(o);
  DispatchPlan p = build_plan(spec, plan_base_key(spec, rt.backend("cpu")),
                              {record(16, {100, 200, 200, 50}), record(4096, {900, 840, 800, 900})}, 1.0, 8);
  SizeHintOptions so;
  so.plan = p;
  SizeHintMultiKernel k(rt, spec, so);
  std::vector<float> x(21, 1.0f), y(21, 0);
  int64_t n = 21;
  k(x.data(), y.data(), n);
  EXPECT_EQ(y[20], 2.0f);
  void* params[3] = {x.data(), y.data(), &n};
  EXPECT_EQ(k.config_for(params).str(), "MODE=2");
  n = 20;
  EXPECT_EQ(k.config_for(params).str(), "MODE=3");
  EXPECT_EQ(rt.stats().configs_timed, 0u);
  // Stored, and found by use_plan.
  rt.tuning_cache()->put_plan(p.base, plan_to_text(p));
  SizeHintOptions so2;
  so2.use_plan = true;
  SizeHintMultiKernel k2(rt, spec, so2);
  EXPECT_EQ(k2.config_for(params).str(), "MODE=3");
  EXPECT_EQ(rt.stats().configs_timed, 0u);
}
