#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "compile/compile_pool.hpp"
#include "core/fsutil.hpp"
#include "kiln/args.hpp"
#include "kiln/kernel.hpp"
#include "kiln/runtime.hpp"
#include "tune/benchmarker.hpp"
#include "worker/protocol.hpp"
#include "util.hpp"
#include "worker/worker_pool.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

struct Proc {
  pid_t pid;
  pid_t ppid;
  char state;
  std::string comm;
};

// Every process whose parent is this one, read from /proc.
std::vector<Proc> children() {
  std::vector<Proc> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto stat = read_file(e.path() / "stat");
    if (!stat) continue;
    auto close = stat->rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat->substr(close + 2));
    auto open = stat->find('(');
    Proc p{std::stoi(name), 0, '?', stat->substr(open + 1, close - open - 1)};
    rest >> p.state >> p.ppid;
    if (p.ppid == ::getpid()) out.push_back(p);
  }
  return out;
}

bool exists(pid_t p) { return ::kill(p, 0) == 0 || errno != ESRCH; }

// No zombie among our children, and the live ones are exactly `expected`.
void expect_children_are(const std::vector<pid_t>& expected) {
  std::set<pid_t> want(expected.begin(), expected.end()), got;
  for (const auto& c : children()) {
    EXPECT_NE(c.state, 'Z') << "zombie " << c.pid << " (" << c.comm << ")";
    got.insert(c.pid);
  }
  EXPECT_EQ(want, got);
}

const char* kBadSpec = R"SPEC(name = "bad"
backend = "cpu"
source = "bad.cpp"
entry = "bad"
grid = ["1"]
args = [ { name = "out", type = "i64*", size = "n", intent = "out" },
         { name = "inp", type = "i64*", size = "n", intent = "in" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2, 3, 4, 5, 6, 7, 8]
)SPEC";

// MODE 0 works; 1 dereferences null; 2 loops forever; 3 aborts; 4 writes to
// its input; 5 forks a child that sleeps (holding the worker's socket), notes
// its pid in PIDFILE, then dereferences null; 6 works, slowly (0.3 s a run); 7 exits the
// process (code 3); 8 closes every descriptor past stderr (the worker's connection) and goes on.
const char* kBadSource = R"SRC(#include <cstdlib>
#include <cstdio>
#include <unistd.h>
void bad(kiln::program_id, int64_t* out, int64_t* inp, int64_t n) {
#if MODE == 1
  *static_cast<volatile int64_t*>(nullptr) = 1;
#elif MODE == 2
  for (volatile int i = 0;; i = i + 1) {}
#elif MODE == 3
  std::abort();
#elif MODE == 4
  inp[0] = 42;
#elif MODE == 5
  pid_t child = fork();
  if (child == 0) { sleep(120); _exit(0); }
  if (FILE* f = fopen(PIDFILE, "w")) { fprintf(f, "%d\n", (int)child); fclose(f); }
  *static_cast<volatile int64_t*>(nullptr) = 1;
#elif MODE == 6
  usleep(300000);
#elif MODE == 7
  _exit(3);
#elif MODE == 8
  for (int fd = 3; fd < 1024; ++fd) close(fd);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] * 2;
}
)SRC";

struct WorkerTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_timeout_s = 1;
    opts.workers = 1;
    opts.bench_budget_ms = 5;
  }
};

}  // namespace

// The timing settings reach the worker as they were set, KILN_BENCH_HOLD's included (a GPU
// worker then enqueues its timed runs behind a held stream); a request without it (an older
// peer's) is not held. The cpu device cannot hold a stream, and says so.
TEST_F(WorkerTest, TheTimingSettingsTravelToTheWorker) {
  BenchPlan p;
  p.settings.budget_ms = 7;
  p.settings.flush = true;
  p.settings.hold = true;
  p.settings.check = false;
  BenchPlan q = bench_plan_from_json(to_json(p));
  EXPECT_EQ(q.settings.budget_ms, 7);
  EXPECT_TRUE(q.settings.flush);
  EXPECT_TRUE(q.settings.hold);
  EXPECT_FALSE(q.settings.check);
  nlohmann::json j = to_json(p);
  j["settings"].erase("hold");
  EXPECT_FALSE(bench_plan_from_json(j).settings.hold);
  Options o = opts;
  o.cuda_bench_hold = true;
  Runtime rt(o);
  EXPECT_EQ(rt.backend("cpu").device().hold_stream(nullptr, 10), 0u);
}

TEST_F(WorkerTest, CrashingHangingAndAbortingKernelsAreContainedAndThePoolGoesOn) {
  test::write(dir.path() / "bad.cpp", kBadSource);
  test::write(dir.path() / "k.toml", kBadSpec);
  KernelSpec s = load_spec(dir.path() / "k.toml");
  s.cflags.push_back("-DPIDFILE=\"" + (dir.path() / "pid").string() + "\"");
  Runtime rt(opts);
  auto pool = rt.worker_pool();
  Benchmarker bench(pool, nullptr, opts, false);
  HostArgs args(s, parse_scalars(s, {{"n", "16"}}));
  args.fill_random(3);
  BenchInputs arena(s, args.params(), rt.backend("cpu").device(), false);
  auto run = [&](int mode) {
    Config c = s.space.at(static_cast<size_t>(mode));
    auto bin = rt.compile_pool("cpu").submit(make_compile_request(s, c)).get();
    return bench.run(*bin, nullptr, arena, LaunchDims{}, "kernel 'bad' (config " + c.str() + ")", bench.settings(),
                     opts.bench_timeout_s);
  };
  auto good = [&] {
    pool->warm();  // a worker replacing the one lost is started first: the 1 s deadline is the kernel's alone
    BenchResult r = run(0);
    EXPECT_GE(r.ns.size(), 3u);
    auto out = arena.result(0);
    auto* o = reinterpret_cast<const int64_t*>(out.data());
    auto* in = reinterpret_cast<const int64_t*>(args.buffer(1).data());
    for (int i = 0; i < 16; ++i) ASSERT_EQ(o[i], in[i] * 2);
  };
  auto expect_error = [&](int mode, Errc code, std::vector<std::string> words) {
    try {
      run(mode);
      ADD_FAILURE() << "mode " << mode << " did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << " in: " << e.what();
    }
    good();  // the pool still serves
  };
  good();
  // A kernel's own crash or time-out is deterministic: not retried.
  expect_error(1, Errc::worker, {"benchmarking kernel 'bad' (config MODE=1)", "killed by SIGSEGV", "not retried",
                                 "KILN_TUNE_IN_PROCESS=1"});
  expect_error(2, Errc::worker, {"config MODE=2", "timed out after 1s", "not retried"});
  expect_error(3, Errc::worker, {"config MODE=3", "killed by SIGABRT"});
  expect_error(4, Errc::launch, {"wrote to 'inp'"});  // a wrong kernel, not a crash: no retry
  // A kernel that ends its process, or cuts the worker's connection and goes on, is its own fault
  // too (before, each was taken for a lost worker, retried, and ended the whole tuning).
  expect_error(7, Errc::worker, {"config MODE=7", "exited with code 3 while running it", "not retried"});
  expect_error(8, Errc::worker, {"config MODE=8", "closed its connection to kiln while running it", "not retried"});
  auto c = pool->counters();
  EXPECT_EQ(c.crashed, 4u);
  EXPECT_EQ(c.timed_out, 1u);
  EXPECT_EQ(c.retried, 0u);
  expect_children_are(pool->pids());

  // A kernel that forks, then crashes: the child keeps the worker's socket
  // open, yet the crash is seen at once (not at the time-out), and the child
  // dies with the worker's process group.
  opts.bench_timeout_s = 30;
  auto t0 = std::chrono::steady_clock::now();
  try {
    run(5);
    ADD_FAILURE() << "mode 5 did not fail";
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.fault().kind, WorkerFault::Kind::crash) << e.what();
    EXPECT_TRUE(e.fault().of_request);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "the crash was seen only at the time-out";
  auto pidtext = read_file(dir.path() / "pid");
  ASSERT_TRUE(pidtext);
  pid_t forked = std::stoi(*pidtext);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    ::waitpid(forked, nullptr, WNOHANG);  // ours to reap if we are a subreaper
    std::string st;
    if (auto stat = read_file("/proc/" + std::to_string(forked) + "/stat")) {
      auto close = stat->rfind(')');
      gone = close != std::string::npos && (*stat)[close + 2] == 'Z';
    } else {
      gone = true;
    }
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(gone) << "the kernel's forked child " << forked << " outlived its worker";
  good();
  expect_children_are(pool->pids());
}

// A worker killed from outside is the machine's fault, not the kernel's: the
// benchmark is retried once on a fresh worker and succeeds.
TEST_F(WorkerTest, AWorkerKilledFromOutsideIsRetriedOnce) {
  test::write(dir.path() / "bad.cpp", kBadSource);
  test::write(dir.path() / "k.toml", kBadSpec);
  KernelSpec s = load_spec(dir.path() / "k.toml");
  s.cflags.push_back("-DPIDFILE=\"/dev/null\"");
  opts.bench_timeout_s = 30;
  opts.bench_budget_ms = 0;
  Runtime rt(opts);
  auto pool = rt.worker_pool();
  pool->warm();
  Benchmarker bench(pool, nullptr, opts, false);
  HostArgs args(s, parse_scalars(s, {{"n", "16"}}));
  args.fill_random(3);
  BenchInputs in(s, args.params(), rt.backend("cpu").device(), false);
  Config slow = s.space.at(6);
  auto bin = rt.compile_pool("cpu").submit(make_compile_request(s, slow)).get();
  pid_t victim = pool->pids().at(0);
  std::thread killer([&] {
    std::this_thread::sleep_for(400ms);
    ::kill(victim, SIGKILL);
  });
  BenchResult r = bench.run(*bin, nullptr, in, LaunchDims{}, "kernel 'bad' (config MODE=6)", bench.settings(), 30);
  killer.join();
  EXPECT_GE(r.ns.size(), 3u);
  auto c = pool->counters();
  EXPECT_EQ(c.lost, 1u);
  EXPECT_EQ(c.retried, 1u);
}

TEST_F(WorkerTest, ACompilerThatKillsItselfIsACompileErrorAndThePoolGoesOn) {
  fs::path script = dir.path() / "crashing-cxx";
  test::write(script, "#!/bin/sh\nif [ \"$1\" = --version ]; then exec c++ --version; fi\nkill -SEGV $$\n");
  ::chmod(script.c_str(), 0755);
  test::write(dir.path() / "fill.cpp", test::kFillSource);
  test::write(dir.path() / "k.toml", test::kFillSpec);
  KernelSpec s = load_spec(dir.path() / "k.toml");
  for (CompileMode mode : {CompileMode::subprocess, CompileMode::threads}) {
    Options o = opts;
    o.cxx = script.string();
    o.compile_mode = mode;
    o.no_cache = true;
    Runtime rt(o);
    try {
      rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get();
      ADD_FAILURE() << "compiled";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::compile) << e.what();
      EXPECT_NE(std::string(e.what()).find("the compiler killed by SIGSEGV"), std::string::npos) << e.what();
    }
    if (mode == CompileMode::subprocess) {
      WorkerPool::Request ping;
      ping.msg = {{"op", "ping"}};
      ping.timeout_s = 5;
      ping.what = "ping";
      auto reply = rt.worker_pool()->call(ping);
      EXPECT_TRUE(reply["ok"].get<bool>());
    }
  }
}

// Issue row L5: a compiler that crashes is tried once more per compile, as
// docs/workers.md says (3 configs, 6 compiler runs); one that crashes only
// sometimes then compiles.
TEST_F(WorkerTest, ACrashingCompilerIsRetriedOncePerCompile) {
  const fs::path calls = dir.path() / "calls";
  fs::path script = dir.path() / "flaky-cxx";
  // Every run is counted; with FLAKY, only every other one crashes.
  test::write(script, "#!/bin/sh\nif [ \"$1\" = --version ]; then exec c++ --version; fi\necho x >> '" +
                          calls.string() + "'\nn=$(wc -l < '" + calls.string() +
                          "')\nif [ -z \"$FLAKY\" ] || [ $((n % 2)) -eq 1 ]; then kill -SEGV $$; fi\nexec c++ \"$@\"\n");
  ::chmod(script.c_str(), 0755);
  test::write(dir.path() / "fill.cpp", test::kFillSource);
  test::write(dir.path() / "k.toml", test::kFillSpec);
  KernelSpec s = load_spec(dir.path() / "k.toml");
  for (bool flaky : {false, true}) {
    fs::remove(calls);
    if (flaky) ::setenv("FLAKY", "1", 1);
    Options o = opts;
    o.cxx = script.string();
    o.compile_mode = CompileMode::threads;
    o.compile_threads = 1;
    o.no_cache = true;
    Runtime rt(o);
    int failed = 0;
    for (size_t i = 0; i < 3; ++i) {
      try {
        rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(i))).get();
      } catch (const Error& e) {
        ++failed;
        EXPECT_NE(std::string(e.what()).find("retried once"), std::string::npos) << e.what();
      }
    }
    ::unsetenv("FLAKY");
    const std::string runs = read_file(calls).value_or("");
    EXPECT_EQ(std::count(runs.begin(), runs.end(), '\n'), 6) << (flaky ? "flaky" : "always crashing");
    EXPECT_EQ(failed, flaky ? 0 : 3);
  }
}

// A runtime going away abandons the compiles nothing waits for: those
// queued never start, a compiler running (on a pool thread, or in a worker)
// is killed. Here a compiler takes 2 s a config and 24 configs are queued
// for the background: the runtime is destroyed after the first starts, and
// at most one compile a compile thread ever began.
TEST_F(WorkerTest, ARuntimeGoingAwayAbandonsTheCompilesNothingWaitsFor) {
  const fs::path calls = dir.path() / "calls";
  fs::path script = dir.path() / "slow-cxx";
  test::write(script, "#!/bin/sh\nif [ \"$1\" = --version ]; then exec c++ --version; fi\necho x >> '" +
                          calls.string() + "'\nsleep 2\nexec c++ \"$@\"\n");
  ::chmod(script.c_str(), 0755);
  test::write(dir.path() / "fill.cpp", test::kFillSource);
  test::write(dir.path() / "k.toml", std::string(test::kFillSpec) + "OTHER = [1, 2, 3, 4, 5, 6, 7, 8]\n");
  KernelSpec s = load_spec(dir.path() / "k.toml");
  ASSERT_EQ(s.space.size(), 48u);
  for (CompileMode mode : {CompileMode::threads, CompileMode::subprocess}) {
    fs::remove(calls);
    Options o = opts;
    o.cxx = script.string();
    o.compile_mode = mode;
    o.compile_threads = 1;
    o.workers = 1;
    o.no_cache = true;
    const auto t0 = std::chrono::steady_clock::now();
    {
      Runtime rt(o);
      Kernel k(rt, s);  // queues the space's compiles for the background
      while (!fs::exists(calls) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double s_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string runs = read_file(calls).value_or("");
    EXPECT_EQ(std::count(runs.begin(), runs.end(), '\n'), 1)
        << (mode == CompileMode::threads ? "threads" : "workers") << ": compilers started; " << s_taken << " s";
    // No compiler of ours outlives the runtime.
    ProcessResult ps = run_process({"bash", "-c", "pgrep -af '" + dir.path().string() + "/[s]low-cxx' || true"}, 10);
    EXPECT_EQ(ps.output, "") << "a compiler still runs";
  }
}

TEST_F(WorkerTest, FiftyCompilesWhileWorkersAreKilledAtRandom) {
  // A TMPDIR of this test's own: a killed worker's compile folders must go
  // with it (each worker's TMPDIR is a folder the pool removes on reaping it).
  const fs::path tmp = dir.path() / "tmp";
  fs::create_directories(tmp);
  struct TmpDirGuard {
    std::string old;
    bool had;
    explicit TmpDirGuard(const fs::path& p) : had(std::getenv("TMPDIR") != nullptr) {
      if (had) old = std::getenv("TMPDIR");
      ::setenv("TMPDIR", p.c_str(), 1);
    }
    ~TmpDirGuard() { had ? (void)::setenv("TMPDIR", old.c_str(), 1) : (void)::unsetenv("TMPDIR"); }
  } tmp_guard(tmp);
  std::string params = "X = [";
  for (int i = 0; i < 50; ++i) params += std::to_string(i) + (i < 49 ? ", " : "]");
  test::write(dir.path() / "x.cpp", "void x(kiln::program_id, int64_t* out) { out[0] = X; }\n");
  test::write(dir.path() / "k.toml", "name = \"x\"\nbackend = \"cpu\"\nsource = \"x.cpp\"\nentry = \"x\"\ngrid = [\"1\"]\n"
                                      "args = [ { name = \"out\", type = \"i64*\", size = \"1\", intent = \"out\" } ]\n"
                                      "[params]\n" + params + "\n");
  KernelSpec s = load_spec(dir.path() / "k.toml");
  opts.compile_mode = CompileMode::subprocess;
  opts.no_cache = true;
  opts.workers = 2;
  opts.compile_threads = 2;
  Runtime rt(opts);
  auto pool = rt.worker_pool();
  std::vector<BinaryFuture> fs;
  for (const auto& c : s.space.all()) fs.push_back(rt.compile_pool("cpu").submit(make_compile_request(s, c)));

  std::atomic<bool> done{false};
  std::atomic<int> kills{0};
  std::vector<pid_t> killed;
  std::thread killer([&] {
    std::mt19937 rng(7);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 200));
      if (done) return;
      auto pids = pool->pids();
      if (pids.empty()) continue;
      pid_t victim = pids[rng() % pids.size()];
      if (::kill(victim, SIGKILL) == 0) {
        ++kills;
        killed.push_back(victim);
      }
    }
  });
  int ok = 0, failed = 0;
  for (size_t i = 0; i < fs.size(); ++i) {
    try {
      auto b = fs[i].get();
      EXPECT_EQ(b->config_text, s.space.at(i).str());
      auto k = rt.load(*b);  // a compile that "succeeded" must give a loadable binary
      int64_t out = -1, *p = &out;
      void* prm[] = {&p};
      k->launch(prm, LaunchDims{}, nullptr);
      EXPECT_EQ(out, static_cast<int64_t>(i));
      ++ok;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::worker) << e.what();
      EXPECT_NE(std::string(e.what()).find("killed by SIGKILL"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("KILN_COMPILE_THREADS=1"), std::string::npos) << e.what();
      ++failed;
    }
  }
  done = true;
  killer.join();
  // A SIGKILL takes effect a moment after kill() returns: wait until each victim has died
  // (it is then a zombie until the pool reaps it, or already gone).
  for (pid_t v : killed) {
    for (int i = 0; i < 500; ++i) {
      auto stat = read_file("/proc/" + std::to_string(v) + "/stat");
      if (!stat || stat->find(") Z ") != std::string::npos) break;
      std::this_thread::sleep_for(10ms);
    }
  }
  EXPECT_EQ(ok + failed, 50);
  EXPECT_GE(kills.load(), 3) << "the test must kill workers to mean anything";
  // A compile fails only when its attempt and its one retry were both killed:
  // at most one failure per two kills, however slow a loaded machine makes compiles.
  EXPECT_LE(2 * failed, kills.load()) << ok << " compiled, " << failed << " failed";
  EXPECT_GT(ok, 0);
  auto c = pool->counters();
  EXPECT_GE(c.lost, 1u);  // killed from outside: the machine's fault, retried
  WorkerPool::Request ping;
  ping.msg = {{"op", "ping"}};
  ping.timeout_s = 5;
  ping.what = "ping";
  auto reply = pool->call(ping);
  EXPECT_TRUE(reply["ok"].get<bool>());
  expect_children_are(pool->pids());
  size_t worker_dirs = 0;
  std::vector<std::string> left;
  for (const auto& e : fs::recursive_directory_iterator(tmp)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("kiln-worker-", 0) == 0) ++worker_dirs;
    if (name.rfind("kiln-cc-", 0) == 0) left.push_back(e.path().string());
  }
  EXPECT_GE(worker_dirs, 1u) << "the workers did not get a TMPDIR of the pool's";
  EXPECT_EQ(left, std::vector<std::string>{}) << "compile folders of killed workers were left behind";
}

TEST_F(WorkerTest, WarmQuiesceWakeupAndNoProcessOutlivesThePool) {
  std::vector<pid_t> pids;
  {
    WorkerPool pool(WorkerPool::find_exe({}), 3);
    EXPECT_TRUE(pool.pids().empty());
    pool.warm();
    pids = pool.pids();
    EXPECT_EQ(pids.size(), 3u);
    expect_children_are(pids);
    pool.quiesce();
    EXPECT_TRUE(pool.pids().empty());
    expect_children_are({});
    pool.wakeup();
    pids = pool.pids();
    EXPECT_EQ(pids.size(), 3u);
  }
  for (pid_t p : pids) EXPECT_FALSE(exists(p)) << p;
  expect_children_are({});
}

// When the pool's owner ends without its destructor (an uncaught exception,
// SIGKILL), its workers notice their socket closing and exit.
TEST_F(WorkerTest, WorkersExitWhenTheirOwnerEndsHoweverItEnds) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned workers become ours, so we can see them end
  std::string owner = std::string(KILN_BINARY_DIR) + "/tests/kiln_test_owner";
  for (std::string mode : {"exit", "throw", "hang"}) {
    SCOPED_TRACE(mode);
    fs::path pidfile = dir.path() / ("pids-" + mode), tmp = dir.path() / ("tmp-" + mode);
    fs::create_directories(tmp);
    SpawnedChild c = spawn_with_socket({owner, mode, pidfile.string()}, {"TMPDIR=" + tmp.string()});
    auto t0 = std::chrono::steady_clock::now();
    while (!fs::exists(pidfile) && std::chrono::steady_clock::now() - t0 < 20s) std::this_thread::sleep_for(10ms);
    std::vector<pid_t> workers;
    std::ifstream in(pidfile);
    for (pid_t p; in >> p;) workers.push_back(p);
    ASSERT_EQ(workers.size(), 2u);
    if (mode == "hang") ::kill(c.pid, SIGKILL);
    int status = reap(c.pid);
    if (mode == "exit") {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == (mode == "throw" ? SIGABRT : SIGKILL));
    }
    // Each worker is gone (the owner reaped it) or becomes our child and exits.
    for (pid_t w : workers) {
      bool ended = false;
      for (auto t = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t < 5s;) {
        int st;
        pid_t r = ::waitpid(w, &st, WNOHANG);
        if (r == w || (r < 0 && !exists(w))) {
          ended = true;
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_TRUE(ended) << "worker " << w << " outlived its owner (" << mode << ")";
    }
    // The TMPDIR folders the pool made for its workers went with them.
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(tmp)) left.push_back(e.path().filename().string());
    EXPECT_EQ(left, std::vector<std::string>{});
  }
  expect_children_are({});
}
