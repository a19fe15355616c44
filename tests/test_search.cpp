// The budgeted search: a surrogate model picks what to time; the record
// says how the choice was found and how much of the space was timed.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/args.hpp"
#include "kiln/runtime.hpp"
#include "tune/search.hpp"
#include "tune/surrogate.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// 64 configs; the work grows with the distance of (log2 A, log2 B, C) from
// (2, 1, 1): A=4 B=2 C=1 does 1 unit, its neighbours 11 or more.
const char* kSpec = R"SPEC(name = "bowl"
backend = "cpu"
source = "bowl.cpp"
entry = "bowl"
grid = ["1"]
args = [ { name = "y", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
[params]
A = [1, 2, 4, 8]
B = [1, 2, 4, 8]
C = [1, 2, 3, 4]
[tuning]
key = ["n"]
)SPEC";

const char* kSource = R"SRC(
static constexpr int la = A == 1 ? 0 : A == 2 ? 1 : A == 4 ? 2 : 3;
static constexpr int lb = B == 1 ? 0 : B == 2 ? 1 : B == 4 ? 2 : 3;
static constexpr int units = 1 + 10 * ((la - 2) * (la - 2) + (lb - 1) * (lb - 1) + (C - 1));
void bowl(kiln::program_id, float* y, int64_t n) {
  float acc = 0;
  for (int u = 0; u < units; ++u)
    for (int64_t i = 0; i < 4000; ++i) {
      acc = acc * 0.999f + static_cast<float>(i);
      asm volatile("" : "+x"(acc));
    }
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f + 0.0f * acc;
}
)SRC";

struct SearchTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  KernelSpec spec = test::spec_in(dir.path(), kSpec, "bowl.cpp", kSource);
  Options opts() {
    Options o = test::options_in(dir.path());
    o.bench_budget_ms = 2;
    o.workers = 1;
    return o;
  }
  TuneOutcome tune(Runtime& rt, TuneOptions to, int64_t n = 8) {
    HostArgs a(spec, parse_scalars(spec, {{"n", std::to_string(n)}}));
    return rt.tune(spec, a.params(), to);
  }
};

int units(const Config& c) {
  auto lg = [](int64_t v) { return v == 1 ? 0 : v == 2 ? 1 : v == 4 ? 2 : 3; };
  int64_t a = 0, b = 0, cc = 0;
  for (const auto& [n, v] : c.values) (n == "A" ? a : n == "B" ? b : cc) = v;
  return 1 + 10 * ((lg(a) - 2) * (lg(a) - 2) + (lg(b) - 1) * (lg(b) - 1) + static_cast<int>(cc - 1));
}

}  // namespace

TEST_F(SearchTest, QuickEffortTimesPartOfTheSpaceAndFindsTheBowlsBottom) {
  Runtime rt(opts());
  TuneOptions to;
  to.effort = Effort::quick;
  to.max_configs = 40;
  TuneOutcome o = tune(rt, to);
  ASSERT_TRUE(o.choice);
  EXPECT_EQ(o.record.method, SearchMethod::budgeted);
  EXPECT_LE(o.timed_now, 40u);
  EXPECT_LT(o.timed_now, 64u);
  EXPECT_NE(o.record.start.find("surrogate xgboost"), std::string::npos) << o.record.start;
  EXPECT_NE(o.record.start.find("runnable configs timed"), std::string::npos) << o.record.start;
  EXPECT_LE(units(*o.choice), 11) << o.choice->str() << " (the best does 1 unit, its neighbours 11)";
  // Asked for everything, the partial record is not enough: the rest is timed.
  TuneOptions full;
  full.effort = Effort::full;
  TuneOutcome f = tune(rt, full);
  EXPECT_EQ(f.record.method, SearchMethod::exhaustive);
  EXPECT_EQ(f.timed_now, 64u - o.timed_now);
  EXPECT_EQ(units(*f.choice), 1);
}

TEST_F(SearchTest, ATimeBudgetStopsTheSearch) {
  Runtime rt(opts());
  TuneOptions to;
  to.budget_seconds = 0.01;  // spent by the first batch
  TuneOutcome o = tune(rt, to, 16);
  ASSERT_TRUE(o.choice);
  EXPECT_EQ(o.record.method, SearchMethod::budgeted);
  EXPECT_LT(o.timed_now, 64u);
  EXPECT_NE(o.record.start.find("budget 0.01 s"), std::string::npos) << o.record.start;
}

TEST_F(SearchTest, WithoutXgboostTheRoundsAreRandomAndTheRecordSaysWhy) {
  fs::path out = dir.path() / "out.json";
  ProcessResult r = run_process(
      {"bash", "-c",
       fmt::format("KILN_XGBOOST_LIB=/nonexistent/libxgboost.so KILN_CACHE_DIR={} KILN_BENCH_BUDGET_MS=2 {} tune {} "
                   "--set n=8 --effort quick --max-configs 16 --json > {}",
                   (dir.path() / "cache2").string(), test::kiln_exe(), (dir.path() / "k.toml").string(), out.string())},
      120);
  ASSERT_TRUE(r.ok()) << r.describe() << r.output;
  auto j = nlohmann::json::parse(read_file(out).value());
  EXPECT_EQ(j["method"], "budgeted");
  EXPECT_NE(j["start"].get<std::string>().find("random draws (libxgboost cannot be opened"), std::string::npos)
      << j["start"];
}

// The budgeted search replayed against measurements: each fixture in
// tests/fixtures/search (made by bench/search/run.sh) holds every runnable
// config of a kernel whose space has at least 10,000 points, timed at one
// shape by an exhaustive tuning. The search sees the recorded times instead
// of timing anything, so this checks what it would choose and how much of
// the space it would time, for several seeds, with no timing in the test.
TEST(SearchFixture, TheBudgetedSearchFindsWithin2PercentOfTheBestTimingAFifthOrLess) {
  std::string why;
  if (!Surrogate::make(&why)) GTEST_SKIP() << "no surrogate model here: " << why;
  const fs::path dir = fs::path(test::source_dir()) / "tests/fixtures/search";
  int fixtures = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ++fixtures;
    SCOPED_TRACE(entry.path().filename().string());
    auto j = nlohmann::json::parse(read_file(entry.path()).value());
    KernelSpec spec = load_spec(fs::path(test::source_dir()) / j["spec"].get<std::string>());
    EXPECT_GE(spec.space.size(), 10000u);
    std::map<size_t, ConfigResult> truth;
    double best = INFINITY;
    for (const auto& c : j["configs"]) {
      Config cfg;
      for (const auto& p : spec.space.params) cfg.values.push_back({p.name, c["params"].at(p.name).get<int64_t>()});
      auto idx = spec.space.index_of(cfg);
      ASSERT_TRUE(idx) << cfg.str() << " is not in the spec's space: the fixture is for another spec";
      ConfigResult r;
      r.config = cfg;
      if (c["result"] == "ok" && c["ns"].is_number()) {
        r.ns = c["ns"].get<double>();
        best = std::min(best, *r.ns);
      } else {
        r.kind = FailKind::crash;
      }
      truth[*idx] = r;
    }
    std::vector<size_t> runnable;
    for (const auto& [i, r] : truth) runnable.push_back(i);
    ASSERT_GE(runnable.size(), 100u);
    std::optional<size_t> start;
    if (spec.tuning.default_config) start = spec.space.index_of(*spec.tuning.default_config);
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      auto search = make_budgeted_search(start, seed, true);
      std::map<size_t, ConfigResult> seen;
      for (;;) {
        SearchState st{spec.space, runnable,
                       [&](size_t i) -> const ConfigResult* {
                         auto it = seen.find(i);
                         return it == seen.end() ? nullptr : &it->second;
                       },
                       SIZE_MAX};
        std::vector<size_t> batch = search->next(st);
        if (batch.empty()) break;
        for (size_t i : batch) {
          ASSERT_TRUE(truth.count(i)) << "the search proposed a config that cannot run";
          seen[i] = truth[i];
        }
      }
      double found = INFINITY;
      for (const auto& [i, r] : seen)
        if (r.ok()) found = std::min(found, *r.ns);
      EXPECT_LE(found, best * 1.02) << "seed " << seed << ": " << seen.size() << " timed";
      EXPECT_LE(seen.size(), runnable.size() / 5) << "seed " << seed << ": found " << found / best << "x the best";
      std::printf("  %s seed %llu: %zu of %zu runnable timed (%.1f%%), best found %.4fx the best of all\n",
                  entry.path().filename().c_str(), static_cast<unsigned long long>(seed), seen.size(), runnable.size(),
                  100.0 * static_cast<double>(seen.size()) / static_cast<double>(runnable.size()), found / best);
    }
  }
  EXPECT_GE(fixtures, 1) << "no fixtures in " << dir;
}

// kiln tune --plot draws the search just made into a PNG; kiln plot draws
// saved --json outputs; input that is not a tuning's output is refused
// with nothing written.
TEST_F(SearchTest, TheSearchCurveIsDrawnIntoAPng) {
  const fs::path png = dir.path() / "curve.png", json = dir.path() / "quick.json", png2 = dir.path() / "both.png";
  const std::string env = fmt::format("KILN_CACHE_DIR={} KILN_BENCH_BUDGET_MS=2", (dir.path() / "cache3").string());
  const std::string spec = (dir.path() / "k.toml").string();
  ProcessResult r = run_process(
      {"bash", "-c",
       fmt::format("{} {} -q tune {} --set n=8 --effort quick --max-configs 24 --plot {} --json > {}", env,
                   test::kiln_exe(), spec, png.string(), json.string())},
      120);
  const bool can_draw = r.output.find("built without PLplot") == std::string::npos;
  if (!can_draw) {
    // Refused before tuning, saying why.
    EXPECT_FALSE(r.ok());
    EXPECT_FALSE(fs::exists(png));
    GTEST_SKIP() << "this kiln was built without PLplot: " << r.output;
  }
  ASSERT_TRUE(r.ok()) << r.describe() << r.output;
  auto png_magic = [](const fs::path& p) { return read_file(p).value_or("").substr(0, 4) == "\x89PNG"; };
  EXPECT_TRUE(png_magic(png));
  r = run_process({test::kiln_exe(), "plot", "-o", png2.string(), json.string(), json.string()}, 60);
  ASSERT_TRUE(r.ok()) << r.describe() << r.output;
  EXPECT_NE(r.output.find("2 curves"), std::string::npos) << r.output;
  EXPECT_TRUE(png_magic(png2));
  const fs::path bad = dir.path() / "bad.json", png3 = dir.path() / "bad.png";
  std::ofstream(bad) << "{\"not\": \"a tuning\"}";
  r = run_process({test::kiln_exe(), "plot", "-o", png3.string(), bad.string()}, 60);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("is not the output of kiln tune --json"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(png3));
}
