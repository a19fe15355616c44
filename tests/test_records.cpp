// Tuning records that never answer wrong: what is in the key, what a record
// reuses, how a record is validated, and what a tuning never stores.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/args.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"
#include "worker/worker_pool.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const char* kSpec = test::kTwiceSpec;
const char* kSource = test::kTwiceSource;

struct RecordTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.bench_timeout_s = 10;
    opts.workers = 1;
  }
  KernelSpec spec(const std::string& toml, const std::string& src = kSource) {
    return test::spec_in(dir.path(), toml, "twice.cpp", src);
  }
  static std::string with(std::string toml, const std::string& from, const std::string& to) {
    size_t at = toml.find(from);
    if (at == std::string::npos) throw std::runtime_error("no '" + from + "' in the spec");
    return toml.replace(at, from.size(), to);
  }
  TuneOutcome tune(Runtime& rt, const KernelSpec& s, int64_t n, TuneOptions o = {}) {
    HostArgs a(s, parse_scalars(s, {{"n", std::to_string(n)}}));
    a.fill_random(1);
    return rt.tune(s, a.params(), o);
  }
};

// A record's text with one edit to its body (the first mention of `from`,
// or the last), its header's checksum and length made to fit: it reads back
// only if what the edit made still validates.
bool reads_after_edit(const std::string& text, const TuningKey& key, const std::string& from, const std::string& to,
                      bool last = false) {
  std::string body = text.substr(text.find('\n') + 1);
  size_t at = last ? body.rfind(from) : body.find(from);
  if (at == std::string::npos) throw std::runtime_error("no " + from);
  body.replace(at, from.size(), to);
  std::string head = fmt::format("kiln-tuning-record {} {:016x} {}\n", TuningRecord::kSchema,
                                 hash64(body.data(), body.size()), body.size());
  return record_from_text(head + body, key).has_value();
}

}  // namespace

// Every field that can change which config wins, or whether one is valid,
// changes the key; the config space does not (a new config is timed alone).
TEST_F(RecordTest, EveryFieldThatChangesTheAnswerChangesTheKey) {
  const std::string base = kSpec;
  std::string k0 = make_tuning_key(spec(base), "dev", "tc", {{"n", 8}}).base_hex();
  auto key_of = [&](const std::string& toml) { return make_tuning_key(spec(toml), "dev", "tc", {{"n", 8}}).base_hex(); };
  EXPECT_EQ(k0, key_of(base));
  struct Edit {
    const char* what;
    std::string toml;
  };
  std::vector<Edit> edits = {
      {"a constraint", with(base, "[params]", "constraints = [\"MODE <= 1\"]\n[params]")},
      {"compile flags", with(base, "[params]", "cflags = [\"-O0\"]\n[params]")},
      {"the grid", with(base, "grid = [\"1\"]", "grid = [\"2\"]")},
      {"an argument's size", with(base, "size = \"n\", intent = \"out\"", "size = \"n + 1\", intent = \"out\"")},
      {"an argument's intent", with(base, "intent = \"out\"", "intent = \"inout\"")},
      {"rtol", with(base, "key = [\"n\"]", "key = [\"n\"]\nrtol = 0.5")},
      {"atol", with(base, "key = [\"n\"]", "key = [\"n\"]\natol = 0.5")},
      {"the reference", with(base, "key = [\"n\"]", "key = [\"n\"]\nreference = { MODE = 2 }")},
  };
  for (const auto& e : edits) EXPECT_NE(k0, key_of(e.toml)) << e.what << " does not change the key";
  EXPECT_NE(k0, make_tuning_key(spec(base), "dev", "another compiler", {{"n", 8}}).base_hex()) << "toolchain";
  EXPECT_NE(k0, make_tuning_key(spec(base), "another device", "tc", {{"n", 8}}).base_hex()) << "device";
  EXPECT_NE(k0, make_tuning_key(spec(base, std::string(kSource) + "\n"), "dev", "tc", {{"n", 8}}).base_hex())
      << "source";
  // Not in the key: the config space (its results are kept by binary key instead).
  EXPECT_EQ(k0, key_of(with(base, "MODE = [0, 1, 2]", "MODE = [0, 1, 2, 3]")));

  // The compiler's identity comes from the backend: KILN_CXX=clang++ is another key.
  Options clang = opts;
  clang.cxx = "clang++";
  Runtime gcc_rt(opts), clang_rt(clang);
  KernelSpec s = spec(base);
  EXPECT_NE(make_tuning_key(s, gcc_rt.backend("cpu"), {{"n", 8}}).base_hex(),
            make_tuning_key(s, clang_rt.backend("cpu"), {{"n", 8}}).base_hex());
}

// A spec tuned with a constraint, then edited to another: the old choice
// (which the spec now forbids) is never the answer.
TEST_F(RecordTest, AnEditedConstraintIsNeverAnsweredFromTheOldRecord) {
  Runtime rt(opts);
  KernelSpec s1 = spec(with(kSpec, "[params]", "constraints = [\"MODE == 1\"]\n[params]"));
  TuneOutcome a = tune(rt, s1, 5000);
  ASSERT_TRUE(a.choice);
  EXPECT_EQ(a.choice->str(), "MODE=1");
  KernelSpec s2 = spec(with(kSpec, "[params]", "constraints = [\"MODE == 2\"]\n[params]"));
  TuneOutcome b = tune(rt, s2, 5000);
  EXPECT_FALSE(b.from_cache);
  ASSERT_TRUE(b.choice);
  EXPECT_EQ(b.choice->str(), "MODE=2");
  // Compile flags added after tuning: the old timings were of other binaries.
  KernelSpec s3 = spec(with(kSpec, "[params]", "cflags = [\"-O0\"]\n[params]"));
  tune(rt, spec(kSpec), 100000);
  EXPECT_FALSE(tune(rt, s3, 5000).from_cache);
}

// Adding a config to a spec times only it (with the leaders re-timed beside
// it); removing one costs nothing.
TEST_F(RecordTest, ANewConfigIsTimedAloneAndARemovedOneCostsNothing) {
  Runtime rt(opts);
  TuneOutcome first = tune(rt, spec(kSpec), 100000);
  EXPECT_EQ(first.timed_now, 3u);
  EXPECT_TRUE(tune(rt, spec(kSpec), 100000).from_cache);

  KernelSpec four = spec(with(kSpec, "MODE = [0, 1, 2]", "MODE = [0, 1, 2, 3]"));
  TuneOutcome added = tune(rt, four, 100000);
  EXPECT_FALSE(added.from_cache);
  EXPECT_EQ(added.timed_now, 1u) << "only the new config is timed";
  // MODE 3 does what 1 and 2 do: it races the leaders side by side, unless a
  // loaded machine timed it clearly slower (out of the 15% window by median
  // and by minimum), when nothing is re-timed: the record's own times show it was.
  // (Timed clearly faster than the record's older times, it races the runner-up.)
  if (added.retimed_now == 0) {
    const ConfigResult* fresh = added.record.find(four.space.at(3));
    ASSERT_TRUE(fresh && fresh->ok());
    double best_ns = 0, best_min = 0;
    for (const auto& c : added.record.configs)
      if (c.ok()) {
        if (best_ns == 0 || *c.ns < best_ns) best_ns = *c.ns;
        if (c.min_ns > 0 && (best_min == 0 || c.min_ns < best_min)) best_min = c.min_ns;
      }
    EXPECT_GT(*fresh->ns, best_ns * 1.15) << "a new config in the window was not re-timed: " << record_to_json(added.record);
    EXPECT_GT(fresh->min_ns, best_min * 1.15) << "a new config in the window was not re-timed: " << record_to_json(added.record);
  } else {
    EXPECT_GE(added.retimed_now, 2u) << "the new config races the leaders side by side: " << record_to_json(added.record);
  }
  EXPECT_EQ(added.record.configs.size(), 4u);
  EXPECT_EQ(added.record.timed, 4u);

  // Remove whichever config won: the next best answers, nothing is timed.
  std::string winner = std::to_string(*added.choice->get("MODE"));
  std::string fewer = "MODE = [";
  for (int m : {0, 1, 2, 3})
    if (std::to_string(m) != winner) fewer += std::to_string(m) + ", ";
  fewer = fewer.substr(0, fewer.size() - 2) + "]";
  TuneOutcome removed = tune(rt, spec(with(kSpec, "MODE = [0, 1, 2]", fewer)), 100000);
  EXPECT_TRUE(removed.from_cache) << "removing a config must not re-tune";
  ASSERT_TRUE(removed.choice);
  EXPECT_NE(removed.choice->str(), added.choice->str());
}

// Red-team 1: no [tuning] key, a constraint on a scalar: the default key
// holds every integer scalar the launch shape, constraints and sizes use, so
// a choice made at one size is never launched at another where it is invalid.
TEST_F(RecordTest, AChoiceIsNeverLaunchedWhereItCannotRun) {
  const char* toml = R"SPEC(name = "blk"
backend = "cpu"
source = "blk.cpp"
entry = "blk"
grid = ["cdiv(N, BS)"]
args = [ { name = "x", type = "f32*", size = "N", intent = "in" },
         { name = "y", type = "f32*", size = "N", intent = "out" },
         { name = "N", type = "i64" } ]
constraints = ["N % BS == 0"]
[params]
BS = [4, 4096]
)SPEC";
  // Each program instance writes a whole block: run where BS does not divide N, it overflows y.
  const char* src = R"SRC(
void blk(kiln::program_id pid, const float* x, float* y, int64_t) {
  for (int64_t i = pid.x * BS; i < (pid.x + 1) * BS; ++i) y[i] = x[i] + 1;
}
)SRC";
  KernelSpec s = test::spec_in(dir.path(), toml, "blk.cpp", src);
  EXPECT_EQ(s.tuning.key, std::vector<std::string>{"N"});
  for (const char* keyed : {"default", "explicit, leaving N out"}) {
    KernelSpec k = s;
    if (std::string(keyed) != "default") {
      k.tuning.key.clear();
      k.tuning.key_given = true;
    }
    Options o = opts;
    o.cache_dir = dir.path() / ("cache-" + std::to_string(keyed[0]));
    Runtime rt(o);
    Kernel kern(rt, k);
    for (int64_t n : {65536, 100}) {
      std::vector<float> x(n), y(n);
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
      kern(x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] + 1) << keyed << ": N=" << n << " i=" << i;
    }
    // The CLI answers a valid config too.
    HostArgs a(k, parse_scalars(k, {{"N", "100"}}));
    TuneOutcome o2 = rt.tune(k, a.params());
    ASSERT_TRUE(o2.choice);
    EXPECT_EQ(o2.choice->str(), "BS=4") << keyed;
  }
}

// Red-team 4: a config that writes nothing leaves kiln's poison in its
// output; it must be rejected, never taken as the reference.
TEST_F(RecordTest, AConfigThatWritesNothingIsRejectedNotChosen) {
  std::string src = std::string("#if MODE == 0\nvoid twice(kiln::program_id, const float*, float*, int64_t) {}\n#else\n") +
                    kSource + "#endif\n";
  KernelSpec s = spec(kSpec, src);
  Runtime rt(opts);
  TuneOutcome o = tune(rt, s, 5000);
  ASSERT_TRUE(o.choice);
  EXPECT_NE(o.choice->str(), "MODE=0");
  const ConfigResult* noop = o.record.find(s.space.at(0));
  ASSERT_TRUE(noop);
  EXPECT_EQ(noop->kind, FailKind::wrong);
  EXPECT_NE(noop->error.find("left 5000 of the 5000 elements of 'y' unwritten"), std::string::npos) << noop->error;
  EXPECT_NE(o.record.reference, "MODE=0");
}

// ...and when the first config to run (the reference) disagrees with every
// other, kiln says so instead of choosing.
TEST_F(RecordTest, WhenTheReferenceDisagreesWithAllOthersNoneIsChosen) {
  std::string src = std::string(kSource);
  src.replace(src.find("x[i] * 2.0f"), 11, "x[i] * (MODE == 0 ? 3.0f : 2.0f)");
  KernelSpec s = spec(kSpec, src);
  Runtime rt(opts);
  TuneOutcome o = tune(rt, s, 5000);
  EXPECT_FALSE(o.choice);
  EXPECT_NE(o.record.verdict.find("disagrees with every other config that ran (2 of them)"), std::string::npos)
      << o.record.verdict;
  Kernel k(rt, s);
  std::vector<float> x(5000, 1.5f), y(5000);  // not zeros: 3x and 2x agree on zeros
  int64_t n = 5000;
  try {
    k(x.data(), y.data(), n);
    FAIL() << "a choice was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::tune);
    EXPECT_NE(std::string(e.what()).find("[tuning] reference"), std::string::npos) << e.what();
  }
  // A reference the spec names is trusted: the others are wrong.
  KernelSpec trusted = spec(with(kSpec, "key = [\"n\"]", "key = [\"n\"]\nreference = { MODE = 1 }"), src);
  TuneOutcome t = tune(rt, trusted, 5000);
  ASSERT_TRUE(t.choice);
  EXPECT_EQ(t.record.find(trusted.space.at(0))->kind, FailKind::wrong);
}

// Red-team 5: a worker killed from outside twice is the machine's fault: the
// tuning fails and stores nothing (never "crash" against a config).
TEST_F(RecordTest, FaultsThatAreNotTheConfigsAreNeverStored) {
  std::string src = std::string("#include <unistd.h>\n") + kSource;
  src.replace(src.find("const int reps"), 0, "usleep(200000);\n  ");
  KernelSpec s = spec(kSpec, src);
  Runtime rt(opts);
  auto pool = rt.worker_pool();
  std::atomic<bool> stop{false};
  std::thread killer([&] {
    while (!stop) {
      for (pid_t p : pool->pids()) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(50ms);
    }
  });
  try {
    tune(rt, s, 5000);
    ADD_FAILURE() << "tuning succeeded while every worker was killed";
  } catch (const WorkerError& e) {
    EXPECT_FALSE(e.fault().of_request) << e.what();
    EXPECT_NE(std::string(e.what()).find("retried once"), std::string::npos) << e.what();
  }
  stop = true;
  killer.join();
  EXPECT_EQ(rt.tuning_cache()->count(), 0u);
}

// Red-team 7: a cache the record cannot be written to keeps the result.
TEST_F(RecordTest, ARecordThatCannotBeStoredStillGivesTheResult) {
  KernelSpec s = spec(kSpec);
  Runtime rt(opts);
  TuningKey key = make_tuning_key(s, rt.backend("cpu"), {{"n", 5000}});
  rt.tuning_cache();
  test::write(opts.cache_dir / "tune" / key.base_hex(), "not a folder");  // as a full or read-only disk
  TuneOutcome o = tune(rt, s, 5000);
  ASSERT_TRUE(o.choice);
  EXPECT_FALSE(o.stored);
}

// Red-team 8: records are checksummed and validated; tampering, a FIFO or a
// link in a record's place is a miss at once.
TEST_F(RecordTest, RecordsThatDoNotValidateAreMisses) {
  KernelSpec s = spec(kSpec);
  Runtime rt(opts);
  TuneOutcome o = tune(rt, s, 5000);
  const TuningKey& key = o.record.key;
  std::string text = record_to_text(o.record);
  ASSERT_TRUE(record_from_text(text, key));
  auto tampered = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    size_t at = t.find(from);
    if (at == std::string::npos) throw std::runtime_error("no " + from);
    t.replace(at, from.size(), to);
    return record_from_text(t, key).has_value();
  };
  EXPECT_FALSE(tampered("\"MODE\": 1", "\"MODE\": 2")) << "an edit the checksum must catch";
  EXPECT_FALSE(record_from_text(text.substr(0, text.size() / 2), key));
  // A consistent record (checksum recomputed) that does not validate.
  auto rebuilt = [&](const std::string& from, const std::string& to) { return reads_after_edit(text, key, from, to); };
  EXPECT_TRUE(rebuilt("\"when\"", "\"when\""));
  EXPECT_FALSE(rebuilt("\"schema\": 3", "\"schema\": 2")) << "a record of the schema before";
  EXPECT_FALSE(rebuilt("\"kiln_version\": \"" KILN_VERSION "\"", "\"kiln_version\": \"9.0.0\""));
  EXPECT_FALSE(rebuilt("\"MODE\": 1", "\"MODE\": 9")) << "not a point of the record's space";
  EXPECT_FALSE(rebuilt(key.semantics, "0123"));
  TuningKey other = key;
  other.device = "cpu elsewhere";
  EXPECT_FALSE(record_from_text(text, other));

  // In the cache: a FIFO or links in the record's place.
  fs::path p = opts.cache_dir / "tune" / key.base_hex() / (key.values_hex() + ".rec");
  ASSERT_TRUE(fs::exists(p));
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  EXPECT_FALSE(rt.tuning_cache()->get(key));
  fs::remove(p);
  fs::create_symlink("/dev/zero", p);
  EXPECT_FALSE(rt.tuning_cache()->get(key));
  fs::remove(p);
  test::write(p, std::string(TuningCache::kMaxRecordBytes + 1, ' '));
  EXPECT_FALSE(rt.tuning_cache()->get(key));
}

// Red-team 9: four processes tune one key at once: one tunes, three wait
// for its record and answer from it.
TEST_F(RecordTest, ConcurrentTuningsOfOneKeyTuneOnce) {
  test::write(dir.path() / "twice.cpp", kSource);
  test::write(dir.path() / "k.toml", kSpec);
  std::string env = "KILN_CACHE_DIR=" + (dir.path() / "shared").string() + " KILN_BENCH_BUDGET_MS=20 ";
  std::vector<std::thread> ts;
  std::vector<ProcessResult> rs(4);
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      rs[i] = run_process({"bash", "-c", env + test::kiln_exe() + " tune --json " + (dir.path() / "k.toml").string() +
                                             " --set n=200000"},
                          300);
    });
  for (auto& t : ts) t.join();
  int tuned = 0, cached = 0;
  nlohmann::json best;
  for (const auto& r : rs) {
    ASSERT_TRUE(r.ok()) << r.output;
    auto j = nlohmann::json::parse(r.output);
    (j["source"] == "tuned" ? tuned : cached)++;
    if (best.is_null()) best = j["best"];
    EXPECT_EQ(j["best"], best) << "processes disagree";
  }
  EXPECT_EQ(tuned, 1);
  EXPECT_EQ(cached, 3);
}

// Records carry the measured noise, and choose() treats configs within it
// (at most 3%) as equal, taking the earliest in the space: tunings agree.
TEST_F(RecordTest, ConfigsWithinTheNoiseCountAsEqualAndTheLibraryOrElseTheEarliestWins) {
  KernelSpec s = spec(kSpec);
  TuningRecord r;
  r.space = s.space;
  auto add = [&](int mode, double ns) {
    ConfigResult c;
    c.config = s.space.at(static_cast<size_t>(mode));
    c.binary = std::string(32, 'a');
    c.ns = ns;
    r.configs.push_back(c);
  };
  add(0, 102);
  add(1, 100);
  add(2, 101);
  int64_t slots[3] = {0, 0, 5000};
  LaunchLimits l;
  r.noise = 0.025;
  EXPECT_EQ(Tuner::choose(r, s, slots, l)->str(), "MODE=0");
  r.noise = 0.015;
  EXPECT_EQ(Tuner::choose(r, s, slots, l)->str(), "MODE=1");
  r.noise = 0.5;  // the window is capped at 3%
  r.configs[0].ns = 104;
  EXPECT_EQ(Tuner::choose(r, s, slots, l)->str(), "MODE=1");
  // Within the window a library choice wins; outside it, it does not.
  s.libraries = {"openblas_sgemm"};
  ConfigResult lib;
  lib.config.library = "openblas_sgemm";
  lib.binary = std::string(32, 'b');
  lib.ns = 101.5;
  r.configs.push_back(lib);
  r.noise = 0.025;
  EXPECT_EQ(Tuner::choose(r, s, slots, l)->str(), "library:openblas_sgemm");
  r.noise = 0.005;
  EXPECT_EQ(Tuner::choose(r, s, slots, l)->str(), "MODE=1");
  s.libraries.clear();
  r.configs.pop_back();
  // A real tuning measures and records it.
  Runtime rt(opts);
  TuneOutcome o = tune(rt, s, 100000);
  EXPECT_GT(o.record.noise, 0.0);
  EXPECT_LT(o.record.noise, 10.0);
}

// Alignment specialisation: a config specialised on 32-byte-aligned x (it
// traps when x is not) is chosen for aligned calls and never launched for a
// misaligned one, whichever came first; results are right either way.
TEST_F(RecordTest, AlignmentSpecialisedConfigsRunOnlyWhereTheCallAllowsThem) {
  const char* toml = R"SPEC(name = "al"
backend = "cpu"
source = "al.cpp"
entry = "al"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
constraints = ["ALIGNED == 0 || align_x % 32 == 0 && align_y % 32 == 0"]
[params]
ALIGNED = [0, 1]
)SPEC";
  // ALIGNED == 1 is much faster (it skips work), and traps on a misaligned x.
  const char* src = R"SRC(#include <cstdint>
void al(kiln::program_id, const float* x, float* y, int64_t n) {
  if (ALIGNED == 1 && (reinterpret_cast<uintptr_t>(x) % 32 != 0 || reinterpret_cast<uintptr_t>(y) % 32 != 0))
    __builtin_trap();
  const int reps = ALIGNED == 1 ? 1 : 30;
  for (int r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 3.0f;
  asm volatile("" ::: "memory");
}
)SRC";
  KernelSpec s = test::spec_in(dir.path(), toml, "al.cpp", src);
  EXPECT_EQ(s.tuning.key, std::vector<std::string>{"n"}) << "alignment is not in the default key";
  for (bool aligned_first : {true, false}) {
    Options o = opts;
    o.first_call = FirstCall::wait;  // each call's choice is read right after it
    o.cache_dir = dir.path() / (aligned_first ? "c1" : "c2");
    Runtime rt(o);
    Kernel k(rt, s);
    const int64_t n = 20000;
    std::vector<float> xs(n + 64), ys(n + 64);
    float* xa = xs.data();
    while (reinterpret_cast<uintptr_t>(xa) % 32) ++xa;
    float* ya = ys.data();
    while (reinterpret_cast<uintptr_t>(ya) % 32) ++ya;
    for (int64_t i = 0; i < n + 8; ++i) xa[i] = static_cast<float>(i % 97);
    auto call = [&](bool aligned) {
      float* x = aligned ? xa : xa + 1;
      float* y = aligned ? ya : ya + 1;
      int64_t nn = n;
      k(x, y, nn);
      for (int64_t i = 0; i < n; i += 101)
        if (y[i] != x[i] * 3.0f) {
          ADD_FAILURE() << (aligned ? "aligned" : "misaligned") << " call: y[" << i << "] = " << y[i];
          break;
        }
      void* params[] = {&x, &y, &nn};
      return k.choice(params).config.str();
    };
    std::string first = call(aligned_first), second = call(!aligned_first);
    EXPECT_EQ(aligned_first ? first : second, "ALIGNED=1") << "the aligned call runs the specialised config";
    EXPECT_EQ(aligned_first ? second : first, "ALIGNED=0");
    EXPECT_EQ(rt.tuning_cache()->count(), 1u) << "aligned and misaligned calls share one record";
  }
}

// A library choice with a rank (cuBLASLt's k-th algorithm) and what ran (its
// detail) survive the trip through the record's text: a record holding one
// answers the next process.
TEST_F(RecordTest, RankedLibraryChoicesAndTheirDetailRoundTrip) {
  Runtime rt(opts);
  KernelSpec s = spec(kSpec, kSource);
  TuneOutcome o = tune(rt, s, 1000);
  ASSERT_TRUE(o.choice);
  TuningRecord r = o.record;
  ConfigResult lib;
  lib.config.library = "cublaslt_bf16_nt#3";
  lib.binary = std::string(32, 'b');
  lib.ns = 1.0;  // the fastest: it becomes the best
  lib.reps = 3;
  lib.detail = "cuBLASLt algo 66 tile 501 stages 35 split-k 1";
  r.configs.push_back(lib);
  r.best = lib.config;
  r.best_ns = 1.0;
  std::optional<TuningRecord> back = record_from_text(record_to_text(r), r.key);
  ASSERT_TRUE(back) << "a ranked library choice made the record a miss";
  ASSERT_TRUE(back->best);
  EXPECT_EQ(back->best->library, "cublaslt_bf16_nt#3");
  ASSERT_TRUE(back->find(lib.config));
  EXPECT_EQ(back->find(lib.config)->detail, lib.detail);
  // A malformed rank is not a name kiln reads.
  r.best->library = r.configs.back().config.library = "cublaslt_bf16_nt#x";
  EXPECT_FALSE(record_from_text(record_to_text(r), r.key));
}

// Configs pruned before compiling are written by their index in the space,
// grouped by reason, and read back as they were; an index list that names a
// config twice, leaves the space or is not ascending makes the record a miss.
TEST_F(RecordTest, PrunedConfigsAreWrittenByIndexAndReadBackWhole) {
  Runtime rt(opts);
  KernelSpec s = spec(kSpec);
  TuneOutcome o = tune(rt, s, 1000);
  ASSERT_TRUE(o.choice);
  TuningRecord r = o.record;
  Param a{"A", {}}, b{"B", {}};
  for (int64_t v = 1; v <= 40; ++v) a.values.push_back(v);
  for (int64_t v = 1; v <= 25; ++v) b.values.push_back(v);
  r.space.params = {a, b};  // 1000 configs
  r.configs.clear();
  ConfigResult best;
  best.config = r.space.at(500);
  best.binary = std::string(32, 'a');
  best.ns = 10.0;
  best.reps = 5;
  r.configs.push_back(best);
  r.best = best.config;
  r.best_ns = 10.0;
  std::set<size_t> pruned;
  for (size_t i = 0; i < 1000; ++i) {
    if (i == 500 || (i % 7 != 0 && i % 3 != 0)) continue;
    ConfigResult c;
    c.config = r.space.at(i);
    c.kind = FailKind::pruned;
    c.error = i % 7 == 0 ? "pruned: constraint 'A % 7 == 1' is false" : "pruned: the grid is too large";
    if (i == 21) c.detail = "a pruned config with a detail is written whole";
    r.configs.push_back(c);
    pruned.insert(i);
  }
  const std::string text = record_to_text(r);
  EXPECT_LT(text.size(), 8000u) << "pruned configs are not written by index";
  std::optional<TuningRecord> back = record_from_text(text, r.key);
  ASSERT_TRUE(back);
  ASSERT_EQ(back->configs.size(), r.configs.size());
  for (const ConfigResult& c : r.configs) {
    const ConfigResult* got = back->find(c.config);
    ASSERT_TRUE(got) << c.config.str();
    EXPECT_EQ(got->kind, c.kind);
    EXPECT_EQ(got->error, c.error);
    EXPECT_EQ(got->detail, c.detail);
    EXPECT_EQ(got->ns, c.ns);
  }
  auto rebuilt = [&](const std::string& from, const std::string& to) { return reads_after_edit(text, r.key, from, to); };
  EXPECT_TRUE(rebuilt("\"at\": \"0 ", "\"at\": \"0 "));
  EXPECT_FALSE(rebuilt("\"at\": \"0 ", "\"at\": \"0 0 ")) << "a config twice";
  EXPECT_FALSE(rebuilt("\"at\": \"0 ", "\"at\": \"1000 ")) << "outside the space";
  EXPECT_FALSE(rebuilt("\"at\": \"0 ", "\"at\": \"5-2 ")) << "a range that runs backwards";
  EXPECT_FALSE(rebuilt("\"at\": \"0 ", "\"at\": \"x ")) << "not a number";
  EXPECT_FALSE(rebuilt("\"at\": \"0 ", "\"at\": \"99999999999999999999 ")) << "a number past any space";
  // The group's reason (its last mention: the config with a detail, written whole, comes first).
  EXPECT_FALSE(reads_after_edit(text, r.key, "pruned: constraint 'A % 7 == 1' is false", std::string(2000, 'x'), true))
      << "a reason that long would be copied into every config of its group";

  // A config listed twice is written once; a long reason is written whole.
  TuningRecord twice = r;
  twice.configs.push_back(twice.configs.back());
  ConfigResult wordy;
  wordy.config = r.space.at(1);
  wordy.kind = FailKind::pruned;
  wordy.error = std::string(2000, 'w');
  twice.configs.push_back(wordy);
  std::optional<TuningRecord> again = record_from_text(record_to_text(twice), r.key);
  ASSERT_TRUE(again) << "a repeated pruned config made the record unreadable";
  ASSERT_TRUE(again->find(wordy.config));
  EXPECT_EQ(again->find(wordy.config)->error, wordy.error);
}
