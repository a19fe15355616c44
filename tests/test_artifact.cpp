// Packed artifacts (kiln pack; loaded by a Runtime at start) and serving mode.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <sys/stat.h>

#include <chrono>
#include <vector>

#include "compile/compile_pool.hpp"
#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/args.hpp"
#include "kiln/artifact.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

const char* kSpec = R"SPEC(name = "twice"
backend = "cpu"
source = "twice.cpp"
entry = "twice"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2]
[tuning]
key = ["n"]
hints = { n = [256, 4096] }
)SPEC";

const char* kSource = R"SRC(#include "scale.h"
void twice(kiln::program_id, const float* x, float* y, int64_t n) {
  const int reps = MODE == 0 ? 20 : 1;
  for (int r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * SCALE;
  asm volatile("" ::: "memory");
}
)SRC";

struct ArtifactTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  fs::path packed = dir.path() / "app.kiln";
  void SetUp() override {
    test::write(dir.path() / "src" / "scale.h", "#define SCALE 2.0f\n");
    test::write(dir.path() / "src" / "twice.cpp", kSource);
    test::write(dir.path() / "src" / "k.toml", kSpec);
    ProcessResult r = pack("packer", "", "-q", "-o " + packed.string() + " --unpacked " + (dir.path() / "unpacked").string());
    ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  }
  // Packed by the tool, in a process of its own, from its own cache (named
  // `cache` in the test's folder), at the spec's hints; stderr into output.
  ProcessResult pack(const std::string& cache, const std::string& env, const std::string& flags,
                     const std::string& out) {
    return run_process({"bash", "-c",
                        fmt::format("KILN_CACHE_DIR={} KILN_BENCH_BUDGET_MS=2 {} {} {} pack {} --hints {} 2>&1",
                                    (dir.path() / cache).string(), env, test::kiln_exe(), flags,
                                    (dir.path() / "src" / "k.toml").string(), out)},
                       120);
  }
  Options fresh(const std::string& name) {
    Options o = test::options_in(dir.path() / name);
    o.bench_budget_ms = 2;
    o.workers = 1;
    return o;
  }
  std::string error_of(const Options& o) {
    try {
      Runtime rt(o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::artifact) << e.what();
      return e.what();
    }
    return "";
  }
};

}  // namespace

// The application's view: a fresh machine, an empty cache, the artifact.
// Every packed shape runs with nothing compiled and nothing tuned; the spec
// itself comes from the artifact's sources.
TEST_F(ArtifactTest, APackedShapeCompilesAndTunesNothing) {
  for (const char* where : {"app.kiln", "unpacked"}) {
    Options o = fresh(std::string("run-") + where);
    o.artifact = dir.path() / where;
    Runtime rt(o);
    Artifact art = Artifact::read(o.artifact);
    TempDir sources{"kiln-test-src"};
    KernelSpec spec = art.spec("twice", sources.path());
    Kernel k(rt, spec);
    for (int64_t n : {256, 4096}) {
      std::vector<float> x(n), y(n, -1);
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
      k(x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 2.0f * i) << where;
    }
    CompilePool::Counters c = rt.compile_pool("cpu").counters();
    EXPECT_EQ(c.compiled, 0u) << where;
    EXPECT_EQ(rt.tuning_cache()->stats().artifact_hits, 2u) << where;
    EXPECT_EQ(rt.tuning_cache()->count(), 0u) << "nothing written to the local cache";
  }
}

// A record packed on a busy machine stays flagged noisy, but an application
// does not re-measure what it ships with: nothing compiled, nothing timed,
// however strict its own noise bound. (The packed kernel makes its own noise: its
// runs take one pass or eight in turn, so its timings spread however quiet the
// machine is; with equal timings a bound of 0 was not passed and nothing was noisy.)
TEST_F(ArtifactTest, ANoisyPackedRecordIsNotReMeasuredByTheApplication) {
  test::write(dir.path() / "src" / "twice.cpp", R"SRC(#include "scale.h"
void twice(kiln::program_id, const float* x, float* y, int64_t n) {
  static int calls = 0;
  const int reps = MODE == 0 ? 20 : ++calls % 2 ? 1 : 8;
  for (int r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * SCALE;
  asm volatile("" ::: "memory");
}
)SRC");
  const fs::path noisy = dir.path() / "noisy.kiln";
  ProcessResult r = pack("packer-noisy", "KILN_NOISE_BOUND=0", "", "-o " + noisy.string());
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  ASSERT_NE(r.output.find("timed on a busy machine, packed as it is"), std::string::npos) << r.output;
  Options o = fresh("run-noisy");
  o.artifact = noisy;
  o.noise_bound = 0;
  o.first_call = FirstCall::swap;
  Runtime rt(o);
  TempDir sources{"kiln-test-src"};
  Kernel k(rt, Artifact::read(noisy).spec("twice", sources.path()));
  for (int64_t n : {256, 4096}) {
    std::vector<float> x(n, 1.0f), y(n, -1);
    k(x.data(), y.data(), n);
    ASSERT_EQ(y[n - 1], 2.0f);
  }
  ASSERT_TRUE(rt.wait_tuned(60));
  Runtime::Stats st = rt.stats();
  EXPECT_EQ(st.compiled, 0u);
  EXPECT_EQ(st.configs_timed, 0u);
  EXPECT_EQ(st.records_artifact, 2u);
}

TEST_F(ArtifactTest, AFlippedByteATruncationOrAnotherFormatLoadsNothing) {
  std::string good = read_file(packed).value();
  Options o = fresh("bad");
  o.artifact = dir.path() / "bad.kiln";
  std::string flipped = good;
  flipped[good.size() * 2 / 3] ^= 0x01;
  write_file_atomic(o.artifact, flipped);
  EXPECT_NE(error_of(o).find("damaged"), std::string::npos) << error_of(o);
  write_file_atomic(o.artifact, good.substr(0, good.size() - 100));
  EXPECT_NE(error_of(o).find("truncated"), std::string::npos) << error_of(o);
  std::string other = good;
  other.replace(other.find(" 1 "), 3, " 9 ");
  write_file_atomic(o.artifact, other);
  EXPECT_NE(error_of(o).find("format 9"), std::string::npos) << error_of(o);
  // A format number past int's range is named as written (it read as another number).
  other = good;
  other.replace(other.find(" 1 "), 3, " 99999999999 ");
  write_file_atomic(o.artifact, other);
  EXPECT_NE(error_of(o).find("it is of artifact format 99999999999;"), std::string::npos) << error_of(o);
  write_file_atomic(o.artifact, "not an artifact at all\n");
  EXPECT_NE(error_of(o).find("not a kiln artifact"), std::string::npos) << error_of(o);
  // An unpacked folder with an edited file.
  fs::path unpacked = dir.path() / "unpacked";
  std::string rec;
  for (const auto& e : fs::recursive_directory_iterator(unpacked))
    if (e.path().extension() == ".rec") {
      test::write(e.path(), read_file(e.path()).value() + " ");
      break;
    }
  o.artifact = unpacked;
  EXPECT_NE(error_of(o).find("damaged"), std::string::npos) << error_of(o);
}

// An unpacked folder from elsewhere: an entry that is a FIFO, a link (to
// /dev/zero, or to a file of the right contents), or inside a linked folder
// is refused at once, and names the entry; nothing of it is loaded.
TEST_F(ArtifactTest, AFifoOrALinkInAnUnpackedFolderIsRefusedAtOnce) {
  fs::path unpacked = dir.path() / "unpacked";
  fs::path rec;
  for (const auto& e : fs::recursive_directory_iterator(unpacked))
    if (e.path().extension() == ".rec") rec = e.path();
  ASSERT_FALSE(rec.empty());
  const std::string rec_text = read_file(rec).value();
  auto expect_refused = [&](const std::string& what, const std::string& says) {
    Options o = fresh("fifo");
    o.artifact = unpacked;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string err = error_of(o);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10) << what;
    EXPECT_NE(err.find(says), std::string::npos) << what << ": " << err;
    EXPECT_NE(err.find("nothing of it was loaded"), std::string::npos) << err;
    // The tool too: kiln inspect answers, with an error, instead of hanging.
    ProcessResult r = run_process({"bash", "-c", test::kiln_exe() + " inspect '" + unpacked.string() + "' 2>&1"}, 60);
    EXPECT_FALSE(r.timed_out) << what;
    EXPECT_NE(r.exit_code, 0) << what << ": " << r.output;
  };
  fs::remove(rec);
  ASSERT_EQ(::mkfifo(rec.c_str(), 0600), 0);
  expect_refused("a FIFO", "not a regular file");
  fs::remove(rec);
  fs::create_symlink("/dev/zero", rec);
  expect_refused("a link to /dev/zero", "is a link");
  fs::remove(rec);
  test::write(dir.path() / "elsewhere.rec", rec_text);
  fs::create_symlink(dir.path() / "elsewhere.rec", rec);
  expect_refused("a link to a good copy", "is a link");
  // A linked folder above the entry.
  fs::remove(rec);
  test::write(rec, rec_text);
  const fs::path folder = rec.parent_path(), moved = dir.path() / "moved-folder";
  fs::rename(folder, moved);
  fs::create_directory_symlink(moved, folder);
  expect_refused("a linked folder", "is a link");
  fs::remove(folder);
  fs::rename(moved, folder);
  Options o = fresh("fifo-fixed");
  o.artifact = unpacked;
  EXPECT_EQ(error_of(o), "") << "put back as it was, it loads";
}

// An artifact from another "device" is refused with what differs; with
// KILN_ARTIFACT_MISMATCH=sources it gives its sources only, and its kernels
// are tuned here.
TEST_F(ArtifactTest, AnArtifactForAnotherDeviceIsRefusedOrUsedForItsSources) {
  Artifact art = Artifact::read(packed);
  art.manifest().targets.at(0).device = "cpu Some Other Processor threads=64";
  fs::path other = dir.path() / "other.kiln";
  art.write(other);
  Options o = fresh("other");
  o.artifact = other;
  std::string why = error_of(o);
  EXPECT_NE(why.find("packed for cpu device 'cpu Some Other Processor threads=64'"), std::string::npos) << why;
  EXPECT_NE(why.find("KILN_ARTIFACT_MISMATCH=sources"), std::string::npos) << why;
  o.artifact_sources_only = true;
  Runtime rt(o);
  TempDir sources{"kiln-test-src"};
  KernelSpec spec = Artifact::read(other).spec("twice", sources.path());
  HostArgs a(spec, parse_scalars(spec, {{"n", "256"}}));
  a.fill_random(1);
  TuneOutcome out = rt.tune(spec, a.params());
  EXPECT_GT(out.timed_now, 0u);
  EXPECT_EQ(rt.tuning_cache()->stats().artifact_hits, 0u);
}

// Serving mode never benchmarks: a packed key runs its choice; another runs
// the nearest tuned key's, and the miss is counted and kept for `kiln report --misses`.
TEST_F(ArtifactTest, ServingModeUsesCachedChoicesOnlyAndCountsMisses) {
  Options o = fresh("serving");
  o.artifact = packed;
  o.serving = true;
  Runtime rt(o);
  TempDir sources{"kiln-test-src"};
  KernelSpec spec = Artifact::read(packed).spec("twice", sources.path());
  Kernel k(rt, spec);
  for (int64_t n : {256, 4096, 3000, 3000, 100}) {
    std::vector<float> x(n, 1.5f), y(n, 0);
    k(x.data(), y.data(), n);
    EXPECT_EQ(y[n - 1], 3.0f);
  }
  EXPECT_EQ(rt.serving_misses(), 2u);  // 3000 and 100, each decided once
  TuningKey base = make_tuning_key(spec, rt.backend("cpu"), {{"n", 0}});
  auto misses = rt.tuning_cache()->serving_misses(base);
  ASSERT_EQ(misses.size(), 2u);
  EXPECT_EQ(misses[0].first, "n=3000");
  EXPECT_EQ(rt.tuning_cache()->count(), 0u) << "nothing was tuned";
}
