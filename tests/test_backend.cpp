#include <gtest/gtest.h>
#include <pthread.h>

#include <fstream>
#include <set>

#include "compile/compile_pool.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "core/fsutil.hpp"
#include "core/memory.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct Fixture : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());

  KernelSpec spec(const std::string& toml, const std::string& src_name, const std::string& src) {
    return test::spec_in(dir.path(), toml, src_name, src);
  }
};

bool mapped(const std::string& needle) {
  auto maps = read_file("/proc/self/maps");
  return maps && maps->find(needle) != std::string::npos;
}

}  // namespace

TEST_F(Fixture, CompilesLoadsAndRunsEveryProgramInstanceOnce) {
  KernelSpec s = spec(R"SPEC(name = "ids"
backend = "cpu"
source = "ids.cpp"
entry = "ids"
grid = ["X", "Y", "Z"]
args = [ { name = "out", type = "i64*", size = "X*Y*Z", intent = "out" },
         { name = "X", type = "i64" }, { name = "Y", type = "i64" }, { name = "Z", type = "i32" } ]
)SPEC",
                      "ids.cpp", R"SRC(
void ids(kiln::program_id p, int64_t* out, int64_t X, int64_t Y, int32_t Z) {
  out[(p.z * Y + p.y) * X + p.x] += 1 + (p.nx == X && p.ny == Y && p.nz == Z ? 0 : 100);
}
)SRC");
  Runtime rt(opts);
  Config cfg = s.space.at(0);
  auto bin = rt.compile_pool("cpu").submit(make_compile_request(s, cfg)).get();
  auto k = rt.load(*bin);
  HostArgs args(s, parse_scalars(s, {{"X", "7"}, {"Y", "5"}, {"Z", "3"}}));
  std::vector<int64_t> slots(s.args.size());
  read_int_slots(s, args.params(), slots.data());
  LaunchDims g = LaunchPlan(s, cfg, LaunchLimits{}).eval(slots.data());
  EXPECT_EQ(g.grid, (Grid{7, 5, 3}));
  k->launch(args.params(), g, nullptr);
  auto* out = reinterpret_cast<int64_t*>(args.buffer(0).data());
  for (int i = 0; i < 7 * 5 * 3; ++i) ASSERT_EQ(out[i], 1) << "program " << i;
  // A grid with a zero dimension launches nothing.
  k->launch(args.params(), LaunchDims{Grid{0, 5, 3}, {}, 0}, nullptr);
  for (int i = 0; i < 7 * 5 * 3; ++i) ASSERT_EQ(out[i], 1);
}

// A host buffer larger than the memory the machine has free is refused at once with the
// figures, not zeroed until the kernel's out-of-memory killer ends the process (as a tuning
// whose inputs outgrew the machine was, with no word). Twice the machine's memory never fits.
TEST_F(Fixture, AHostBufferLargerThanTheFreeMemoryIsRefusedWithTheFigures) {
  Runtime rt(opts);
  Device& dev = rt.device("cpu");
  const size_t bytes = static_cast<size_t>(dev.info().memory_bytes) * 2;
  try {
    void* p = dev.alloc(bytes);
    dev.free(p);
    ADD_FAILURE() << "allocated " << bytes << " bytes";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(std::string(e.what()).find("cannot allocate " + std::to_string(bytes) + " bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("GiB are available"), std::string::npos) << e.what();
  }
  void* small = dev.alloc(1 << 20);  // and what fits is given
  ASSERT_NE(small, nullptr);
  dev.free(small);
}

// The room a memory-limited control group leaves (a container, a service): cgroup v2 and v1
// trees as the kernel lays them out, made here; the least room of the group and those above it,
// with the page cache (given back before anything is killed) not counted as held.
TEST(CgroupMemory, TheRoomUnderTheTightestLimitAboveTheProcess) {
  TempDir d{"kiln-cgroup"};
  auto put = [&](const fs::path& rel, const std::string& text) {
    fs::create_directories((d.path() / rel).parent_path());
    test::write(d.path() / rel, text);
  };
  // v2: the service's group allows 8 GiB with 3 GiB charged, 1 GiB of it page cache;
  // its parent allows 5 GiB with 4 GiB charged (the tighter).
  const int64_t G = int64_t{1} << 30;
  put("v2/memory.max", "max\n");
  put("v2/app.slice/memory.max", std::to_string(5 * G) + "\n");
  put("v2/app.slice/memory.current", std::to_string(4 * G) + "\n");
  put("v2/app.slice/memory.stat", "anon 1\nfile 0\n");
  put("v2/app.slice/svc/memory.max", std::to_string(8 * G) + "\n");
  put("v2/app.slice/svc/memory.current", std::to_string(3 * G) + "\n");
  put("v2/app.slice/svc/memory.stat", "anon 5\nfile " + std::to_string(G) + "\nactive_file 7\ninactive_file 9\n");
  EXPECT_EQ(cgroup_memory_room("0::/app.slice/svc\n", d.path() / "v2"), 1 * G);
  put("v2/app.slice/memory.max", "max\n");
  EXPECT_EQ(cgroup_memory_room("0::/app.slice/svc\n", d.path() / "v2"), 6 * G);  // 8 - (3 - 1)
  // A path of another namespace (the container's group is mounted at the root): the root's limit.
  put("v2/memory.max", std::to_string(2 * G) + "\n");
  put("v2/memory.current", std::to_string(G / 2) + "\n");
  EXPECT_EQ(cgroup_memory_room("0::/not/here\n", d.path() / "v2"), 2 * G - G / 2);
  // v1: the memory controller's line, among others; "no limit" is 2^63 rounded to a page.
  put("v1/memory/docker/abc/memory.limit_in_bytes", std::to_string(3 * G) + "\n");
  put("v1/memory/docker/abc/memory.usage_in_bytes", std::to_string(2 * G) + "\n");
  put("v1/memory/docker/abc/memory.stat", "cache 9\ninactive_file 5\ntotal_cache " + std::to_string(G / 2) + "\n");
  put("v1/memory/docker/memory.limit_in_bytes", "9223372036854771712\n");
  put("v1/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(cgroup_memory_room("12:pids:/x\n4:cpu,memory:/docker/abc\n0::/\n", d.path() / "v1"),
            3 * G - (2 * G - G / 2));
  // No limit anywhere, no memory line, unreadable: -1 (MemAvailable alone then).
  put("v1/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(cgroup_memory_room("4:memory:/docker/abc\n", d.path() / "v1"), -1);
  EXPECT_EQ(cgroup_memory_room("", d.path() / "v1"), -1);
  EXPECT_EQ(cgroup_memory_room("0::/\n", d.path() / "nowhere"), -1);
  // Charged past the limit (it can be, briefly): no room, not a negative one.
  put("v2/memory.current", std::to_string(3 * G) + "\n");
  EXPECT_EQ(cgroup_memory_room("0::/\n", d.path() / "v2"), 0);
  EXPECT_GE(available_memory_bytes(), 0);  // this machine's, whatever its limits
}

TEST_F(Fixture, AGridOfOneRunsOnTheCallingThread) {
  KernelSpec s = spec(R"SPEC(name = "who"
backend = "cpu"
source = "who.cpp"
entry = "who"
grid = ["1"]
args = [ { name = "out", type = "i64*", size = "1", intent = "out" } ]
)SPEC",
                      "who.cpp", "#include <pthread.h>\nvoid who(kiln::program_id, int64_t* out) { out[0] = (int64_t)pthread_self(); }\n");
  Runtime rt(opts);
  auto k = rt.load(*rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get());
  int64_t out = 0;
  int64_t* p = &out;
  void* params[] = {&p};
  k->launch(params, LaunchDims{}, nullptr);
  EXPECT_EQ(out, static_cast<int64_t>(pthread_self()));
}

TEST_F(Fixture, CompileErrorsNameTheUsersFileAndLine) {
  KernelSpec s = spec(test::kFillSpec, "fill.cpp", "void fill(kiln::program_id, int64_t* out, int64_t n) {\n  out[0] = n;\n  this is not c++;\n}\n");
  Runtime rt(opts);
  try {
    rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get();
    FAIL() << "compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::compile);
    std::string m = e.what();
    EXPECT_NE(m.find("fill.cpp:3:"), std::string::npos) << m;
    EXPECT_NE(m.find("kernel 'fill' (config BLOCK=1 SCALE=1) failed to compile"), std::string::npos) << m;
    EXPECT_EQ(m.find("kernel.cpp:"), std::string::npos) << "names the generated file: " << m;
  }
}

TEST_F(Fixture, ASignatureThatDoesNotMatchTheSpecIsReportedAtTheEntry) {
  KernelSpec s = spec(test::kFillSpec, "fill.cpp", "void fill(kiln::program_id, float* out) { out[0] = 1; }\n");
  Runtime rt(opts);
  try {
    rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get();
    FAIL() << "compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("<kiln entry for fill>"), std::string::npos) << e.what();
  }
}

TEST_F(Fixture, TheSameKeyGivesTheSameLoadedKernelAndTheLastUserUnloadsIt) {
  KernelSpec s = spec(test::kFillSpec, "fill.cpp", test::kFillSource);
  Runtime rt(opts);
  auto bin = rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get();
  std::string tag = "kiln-" + bin->key.substr(0, 16);
  auto a = rt.load(*bin);
  auto b = rt.load(*bin);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_TRUE(mapped(tag));
  a.reset();
  EXPECT_TRUE(mapped(tag));
  b.reset();
  EXPECT_FALSE(mapped(tag)) << "still mapped after the last user let go";
  auto c = rt.load(*bin);  // loads again
  EXPECT_TRUE(mapped(tag));
}

TEST_F(Fixture, EveryFieldOfTheBinaryKeyChangesIt) {
  KernelSpec s = spec(R"SPEC(name = "fill"
backend = "cpu"
source = "fill.cpp"
entry = "fill"
grid = ["cdiv(N, BLOCK)"]
args = [ { name = "out", type = "i64*", size = "N", intent = "out" }, { name = "N", type = "i64" } ]
include_dirs = ["inc"]
[params]
BLOCK = [1, 4, 16]
SCALE = [1, 3]
)SPEC",
                      "fill.cpp", std::string("#include \"helper.h\"\n#include <vector>\n") + test::kFillSource);
  test::write(dir.path() / "inc/helper.h", "// v1\n");
  CpuBackend gcc(opts);
  auto key = [&](const CompileRequest& r, Backend& b) { return make_binary_key(r, b).hex(); };
  CompileRequest base = make_compile_request(s, s.space.at(0));
  std::string k0 = key(base, gcc);
  EXPECT_EQ(k0, key(base, gcc));
  auto bk = make_binary_key(base, gcc);
  ASSERT_EQ(bk.includes_found.size(), 1u);
  EXPECT_EQ(bk.includes_external, (std::vector<std::string>{"vector"}));

  EXPECT_NE(k0, key(make_compile_request(s, s.space.at(1)), gcc));  // defines
  CompileRequest r = base;
  r.source_text += "\n";
  EXPECT_NE(k0, key(r, gcc));  // source
  r = base;
  r.entry = "fill2";
  EXPECT_NE(k0, key(r, gcc));  // entry
  r = base;
  r.cflags.push_back("-DX=1");
  EXPECT_NE(k0, key(r, gcc));  // flags
  r = base;
  r.args[1].dtype = DType::i32;
  EXPECT_NE(k0, key(r, gcc));  // argument list
  test::write(dir.path() / "inc/helper.h", "// v2\n");
  EXPECT_NE(k0, key(base, gcc));  // an included file's content
  test::write(dir.path() / "inc/helper.h", "// v1\n");
  EXPECT_EQ(k0, key(base, gcc));

  Options o2 = opts;
  o2.cxx = "clang++";
  CpuBackend clang(o2);
  EXPECT_NE(k0, key(base, clang)) << "a new compiler must be a miss";
  // The source's location is not part of the key: a moved project still hits.
  r = base;
  r.source_name = "/elsewhere/fill.cpp";
  EXPECT_EQ(k0, key(r, gcc));
}

TEST_F(Fixture, AnUnusableCompilerIsAClearError) {
  KernelSpec s = spec(test::kFillSpec, "fill.cpp", test::kFillSource);
  opts.cxx = "/nonexistent/c++";
  Runtime rt(opts);
  try {
    rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CXX=/nonexistent/c++"), std::string::npos) << e.what();
  }
}

// Regression: loads reused one path name, and dlopen answers a name it has
// loaded already with that object, so a second kernel ran the first's code.
TEST_F(Fixture, KernelsLoadedTogetherEachRunTheirOwnCode) {
  KernelSpec s = spec(test::kFillSpec, "fill.cpp", test::kFillSource);
  Runtime rt(opts);
  std::vector<std::shared_ptr<LoadedKernel>> held;
  for (const auto& c : s.space.all()) held.push_back(rt.load(*rt.compile_pool("cpu").submit(make_compile_request(s, c)).get()));
  for (size_t i = 0; i < held.size(); ++i) {
    Config c = s.space.at(i);
    int64_t out[8] = {}, n = 8, *p = out;
    void* params[] = {&p, &n};
    held[i]->launch(params, LaunchDims{Grid{8, 1, 1}, {}, 0}, nullptr);
    for (int j = 0; j < 8; ++j) ASSERT_EQ(out[j], j * *c.get("SCALE")) << c.str();
  }
}

// Headers found through cflags = ["-I..."] are part of the key: editing one
// must not reuse a stale binary.
TEST_F(Fixture, HeadersFoundThroughCflagIncludeFoldersAreHashed) {
  fs::path inc = dir.path() / "elsewhere";
  test::write(inc / "scale.h", "#define EXTRA 0\n");
  std::string toml = std::string(test::kFillSpec);
  toml.insert(toml.find("[params]"), "cflags = [\"-I" + inc.string() + "\"]\n");
  KernelSpec s = spec(toml, "fill.cpp", std::string("#include \"scale.h\"\n") + test::kFillSource);
  CpuBackend gcc(opts);
  CompileRequest r = make_compile_request(s, s.space.at(0));
  BinaryKey before = make_binary_key(r, gcc);
  ASSERT_EQ(before.includes_found.size(), 1u) << before.to_string();
  test::write(inc / "scale.h", "#define EXTRA 1\n");
  EXPECT_NE(before.hex(), make_binary_key(r, gcc).hex());
  // The tuning record's key follows the header too.
  test::write(inc / "scale.h", "#define EXTRA 0\n");
  TuningKey t0 = make_tuning_key(s, "dev", "tc", {{"N", 8}});
  test::write(inc / "scale.h", "#define EXTRA 2\n");
  EXPECT_NE(t0.base_hex(), make_tuning_key(s, "dev", "tc", {{"N", 8}}).base_hex());
}

// A folder whose name holds a quote or a newline must not break the #line
// directive kiln writes, with or without the cache.
TEST_F(Fixture, AFolderNameWithAQuoteOrANewlineCompiles) {
  for (const char* name : {"with \"quote", "with\nnewline", "back\\slash"}) {
    fs::path d = dir.path() / name;
    KernelSpec s = test::spec_in(d, test::kFillSpec, "fill.cpp", test::kFillSource);
    for (bool cache : {true, false}) {
      Options o = opts;
      o.no_cache = !cache;
      Runtime rt(o);
      auto k = rt.load(*rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get());
      int64_t out[4] = {}, n = 4, *p = out;
      void* params[] = {&p, &n};
      k->launch(params, LaunchDims{Grid{4, 1, 1}, {}, 0}, nullptr);
      EXPECT_EQ(out[3], 3) << name;
    }
  }
}

// HostArgs keeps what it needs of the spec: one built from a temporary spec
// must not read freed memory (AddressSanitizer checks this).
TEST_F(Fixture, HostArgsOutliveTheSpecTheyWereMadeFrom) {
  HostArgs a = [&] {
    KernelSpec tmp = spec(test::kFillSpec, "fill.cpp", test::kFillSource);
    return HostArgs(tmp, parse_scalars(tmp, {{"N", "100"}}));
  }();
  a.fill_random(3);  // `out` is intent out: not filled
  EXPECT_EQ(a.buffer(0).size(), 100 * sizeof(int64_t));
  EXPECT_EQ(a.elements(0), 100);
}

TEST_F(Fixture, BufferSizesThatOverflowAreErrorsNotEmptyBuffers) {
  KernelSpec s = spec(R"SPEC(name = "big"
backend = "cpu"
source = "big.cpp"
entry = "big"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
)SPEC",
                      "big.cpp", "void big(kiln::program_id, float*, int64_t) {}\n");
  try {
    HostArgs a(s, parse_scalars(s, {{"n", std::to_string(int64_t{1} << 62)}}));
    FAIL() << "allocated " << a.buffer(0).size() << " bytes";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
}

TEST_F(Fixture, AGridThatOverflowsIsAnErrorNotAnEmptyLaunch) {
  KernelSpec s = spec(R"SPEC(name = "g"
backend = "cpu"
source = "g.cpp"
entry = "g"
grid = ["n", "n"]
args = [ { name = "x", type = "f32*", size = "1", intent = "out" }, { name = "n", type = "i64" } ]
)SPEC",
                      "g.cpp", "void g(kiln::program_id, float* x, int64_t) { x[0] = 1; }\n");
  CpuBackend cpu(opts);
  LaunchPlan plan(s, s.space.at(0), cpu.limits());
  int64_t slots[2] = {0, int64_t{1} << 32};
  try {
    plan.eval(slots);
    FAIL() << "a 2^32 x 2^32 grid was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::launch);
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
}

// Grids from two calling threads run at once: each program instance of one
// launch waits (bounded) to see the other launch running. Were grids run one
// at a time, neither would ever see the other.
TEST_F(Fixture, GridsFromTwoThreadsRunAtTheSameTime) {
  KernelSpec s = spec(R"SPEC(name = "meet"
backend = "cpu"
source = "meet.cpp"
entry = "meet"
grid = ["2"]
args = [ { name = "flags", type = "i64*", size = "2", intent = "inout" },
         { name = "me", type = "i64" }, { name = "seen", type = "i64*", size = "2", intent = "out" } ]
)SPEC",
                      "meet.cpp", R"SRC(#include <atomic>
#include <chrono>
void meet(kiln::program_id pid, int64_t* flags, int64_t me, int64_t* seen) {
  std::atomic_ref<int64_t>(flags[me]).store(1);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!std::atomic_ref<int64_t>(flags[1 - me]).load() && std::chrono::steady_clock::now() < until) {}
  seen[pid.x] = std::atomic_ref<int64_t>(flags[1 - me]).load();
}
)SRC");
  opts.launch_threads = 2;
  CpuBackend cpu(opts);
  auto k = cpu.load(cpu.compile(make_compile_request(s, s.space.at(0)), make_binary_key(make_compile_request(s, s.space.at(0)), cpu).hex()));
  alignas(8) int64_t flags[2] = {0, 0};
  int64_t seen[2][2] = {{0, 0}, {0, 0}};
  auto call = [&](int64_t me) {
    int64_t* f = flags;
    int64_t* sp = seen[me];
    void* params[] = {&f, &me, &sp};
    k->launch(params, LaunchDims{Grid{2, 1, 1}, {}, 0}, nullptr);
  };
  std::thread a(call, 0), b(call, 1);
  a.join();
  b.join();
  for (int me = 0; me < 2; ++me)
    for (int p = 0; p < 2; ++p) EXPECT_EQ(seen[me][p], 1) << "launch " << me << " never saw the other running";
}

// A kernel whose thread_local object has a destructor still due on a live thread (this one)
// stays loaded past its handle: the loader keeps it. The next kernel loaded must still be its
// own, though its memory file may take the number the first one's had: dlopen answers a name it
// has loaded before ("/proc/self/fd/N") with that library, and the load failed with "loading
// binary A gave binary B" (seen in a long test process, and in any process that drops kernels).
TEST_F(Fixture, AKernelTheLoaderKeepsDoesNotAnswerForTheNextOneLoaded) {
  KernelSpec kept = spec(R"SPEC(name = "kept"
backend = "cpu"
source = "kept.cpp"
entry = "kept"
grid = ["1"]
args = [ { name = "out", type = "i64*", size = "1", intent = "out" } ]
)SPEC",
                         "kept.cpp", R"SRC(#include <vector>
void kept(kiln::program_id, int64_t* out) {
  thread_local std::vector<int64_t> scratch(4, 1);
  out[0] = static_cast<int64_t>(scratch.size());
}
)SRC");
  KernelSpec next = spec(R"SPEC(name = "next"
backend = "cpu"
source = "next.cpp"
entry = "next"
grid = ["1"]
args = [ { name = "out", type = "i64*", size = "1", intent = "out" } ]
)SPEC",
                         "next.cpp", "void next(kiln::program_id, int64_t* out) { out[0] = 7; }\n");
  CpuBackend cpu(opts);
  auto binary = [&](const KernelSpec& s) {
    const CompileRequest req = make_compile_request(s, s.space.at(0));
    return cpu.compile(req, make_binary_key(req, cpu).hex());
  };
  const Binary a = binary(kept), b = binary(next);
  int64_t out = 0;
  int64_t* p = &out;
  void* params[] = {&p};
  auto ka = cpu.load(a);
  ka->launch(params, LaunchDims{}, nullptr);  // on this thread: its thread_local is made here
  EXPECT_EQ(out, 4);
  ka.reset();  // unloaded as far as kiln is concerned; the loader keeps it while this thread lives
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<LoadedKernel> kb;
    ASSERT_NO_THROW(kb = cpu.load(b));
    out = 0;
    kb->launch(params, LaunchDims{}, nullptr);
    EXPECT_EQ(out, 7);
  }
}
