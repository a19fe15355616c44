#include <gtest/gtest.h>
#include <sys/stat.h>

#include "compile/compile_pool.hpp"
#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/ext/binary_key.hpp"
#include "compile/code_cache.hpp"
#include "kiln/runtime.hpp"
#include "nlohmann/json.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

Binary sample(const std::string& key) {
  Binary b;
  b.key = key;
  b.backend = "cpu";
  b.kernel = "k";
  b.config_text = "A=1";
  b.entry = "k";
  b.meta.symbol = "kiln_entry";
  for (int i = 0; i < 1000; ++i) b.bytes.push_back(static_cast<uint8_t>(i * 7));
  return b;
}

const std::string kKey = "0123456789abcdef0123456789abcdef";

fs::path entry_path(const fs::path& root, const std::string& key) {
  return root / "code" / key.substr(0, 2) / (key + ".kbin");
}

}  // namespace

TEST(CodeCache, RoundTripsAndCreatesAPrivateFolder) {
  TempDir d("kiln-test");
  CodeCache c(d.path() / "cache");
  struct stat st;
  ASSERT_EQ(::stat((d.path() / "cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_FALSE(c.get(kKey));
  c.put(sample(kKey));
  auto b = c.get(kKey);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->bytes, sample(kKey).bytes);
  EXPECT_EQ(b->config_text, "A=1");
  EXPECT_EQ(c.stats().entries, 1u);
  EXPECT_EQ(c.clear(), 1u);
  EXPECT_FALSE(c.get(kKey));
}

TEST(CodeCache, CorruptTruncatedOrMisplacedEntriesAreMisses) {
  TempDir d("kiln-test");
  CodeCache c(d.path() / "cache");
  c.put(sample(kKey));
  fs::path p = entry_path(d.path() / "cache", kKey);
  std::string good = *read_file(p);

  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 1;
  write_file_atomic(p, flipped);
  EXPECT_FALSE(c.get(kKey));
  EXPECT_FALSE(fs::exists(p)) << "a corrupt entry is removed so it gets rewritten";
  EXPECT_EQ(c.corrupt_seen(), 1u);

  write_file_atomic(p, good.substr(0, good.size() / 2));
  EXPECT_FALSE(c.get(kKey));
  write_file_atomic(p, "");
  EXPECT_FALSE(c.get(kKey));

  // An intact entry under another key's name.
  std::string other = "ffffffffffffffffffffffffffffffff";
  fs::create_directories(entry_path(d.path() / "cache", other).parent_path());
  write_file_atomic(entry_path(d.path() / "cache", other), good);
  EXPECT_FALSE(c.get(other));
}

TEST(CodeCache, RefusesAFolderOthersCanWrite) {
  TempDir d("kiln-test");
  fs::create_directories(d.path() / "open");
  ::chmod((d.path() / "open").c_str(), 0777);
  try {
    CodeCache c(d.path() / "open");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::cache);
    EXPECT_NE(std::string(e.what()).find("can be written by other users (mode 0777)"), std::string::npos) << e.what();
  }
}

// A parent folder another user could write (without the sticky bit) lets
// them rename the cache away and plant their own: refused, naming it.
TEST(CodeCache, RefusesAFolderInsideOneOthersCanWriteUnlessItIsSticky) {
  TempDir d("kiln-test");
  fs::path team = d.path() / "team";
  fs::create_directories(team);
  ::chmod(team.c_str(), 0777);
  try {
    CodeCache c(team / "mine" / "cache");
    FAIL() << "accepted a cache inside a folder anyone can write";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::cache);
    std::string m = e.what();
    EXPECT_NE(m.find(team.string()), std::string::npos) << m;
    EXPECT_NE(m.find("without the sticky bit"), std::string::npos) << m;
  }
  ::chmod(team.c_str(), 01777);  // as /tmp: others cannot rename what is not theirs
  CodeCache ok(team / "mine" / "cache");
  ok.put(sample(kKey));
  EXPECT_TRUE(ok.get(kKey));
}

// Once open, the cache is used through its folder's descriptor: replacing
// the folder (or a parent) with another does not redirect reads or writes.
TEST(CodeCache, ReplacingTheFolderWhileOpenRedirectsNothing) {
  TempDir d("kiln-test");
  fs::path root = d.path() / "cache";
  CodeCache c(root);
  c.put(sample(kKey));
  fs::rename(root, d.path() / "moved");
  // An attacker's folder in its place, with a forged entry under the same key.
  CodeCache forged(root);
  Binary evil = sample(kKey);
  evil.bytes.assign(10, 0xEE);
  forged.put(evil);
  auto b = c.get(kKey);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->bytes, sample(kKey).bytes) << "read the replacement folder's entry";
  std::string other = "ffffffffffffffffffffffffffffffff";
  c.put(sample(other));
  EXPECT_TRUE(fs::exists(entry_path(d.path() / "moved", other)));
  EXPECT_FALSE(fs::exists(entry_path(root, other)));
}

// A FIFO, a link to /dev/zero, or an oversized file in an entry's place is a
// miss at once: no hang, no memory eaten.
TEST(CodeCache, EntriesThatAreNotRegularFilesAreMisses) {
  TempDir d("kiln-test");
  fs::path root = d.path() / "cache";
  CodeCache c(root);
  c.put(sample(kKey));
  fs::path p = entry_path(root, kKey);
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  EXPECT_FALSE(c.get(kKey));
  fs::remove(p);
  fs::create_symlink("/dev/zero", p);
  EXPECT_FALSE(c.get(kKey));
  fs::remove(p);
  fs::create_symlink("/proc/self/environ", p);
  EXPECT_FALSE(c.get(kKey));
}

// The cache folder is not created by reading its stats.
TEST(CodeCache, OpeningForReadingCreatesNothing) {
  TempDir d("kiln-test");
  auto c = CodeCache::open_existing(d.path() / "nothing-here");
  EXPECT_EQ(c->stats().entries, 0u);
  EXPECT_FALSE(c->get(kKey));
  EXPECT_FALSE(fs::exists(d.path() / "nothing-here"));
}

// A cache that cannot be written (read-only, full: here, a file where the
// entry's folder must go, which fails the same way for root too) costs the
// cache, never the compile.
TEST(CompilePool, ACacheThatCannotBeWrittenStillCompiles) {
  TempDir d("kiln-test");
  test::write(d.path() / "fill.cpp", test::kFillSource);
  test::write(d.path() / "k.toml", test::kFillSpec);
  KernelSpec s = load_spec(d.path() / "k.toml");
  Options o = test::options_in(d.path());
  Runtime rt(o);
  CompileRequest req = make_compile_request(s, s.space.at(0));
  std::string key = make_binary_key(req, rt.backend("cpu")).hex();
  rt.code_cache();  // creates the folders
  test::write(o.cache_dir / "code" / key.substr(0, 2), "not a folder");
  auto b = rt.compile_pool("cpu").submit(req, key).get();
  EXPECT_FALSE(b->from_cache);
  EXPECT_FALSE(b->bytes.empty());
  rt.load(*b);
}

// A cache folder kiln may use but cannot write (no permission; root can
// write a 0500 folder, so as root the tool runs without the privilege that
// lets it): kiln compiles, tunes and runs without a cache, and says so once.
// The same folder made writable again is used.
TEST(CompilePool, AFolderThatCannotBeWrittenMeansNoCacheAndOneWarning) {
  TempDir d("kiln-test");
  test::write(d.path() / "fill.cpp", test::kFillSource);
  test::write(d.path() / "k.toml", test::kFillSpec);
  std::string prefix;
  if (::geteuid() == 0) {
    if (run_process({"bash", "-c", "command -v setpriv"}, 10).exit_code != 0)
      GTEST_SKIP() << "running as root without setpriv: a folder root cannot write needs a read-only mount";
    prefix = "setpriv --bounding-set=-dac_override,-dac_read_search --inh-caps=-dac_override,-dac_read_search ";
  }
  const fs::path fresh = d.path() / "fresh", used = d.path() / "used";
  fs::create_directories(fresh);
  // One never used (its subfolders cannot be made) and one used before (they exist, but nothing can be written in them).
  ProcessResult warm = run_process(
      {"bash", "-c", "KILN_CACHE_DIR='" + used.string() + "' KILN_BENCH_BUDGET_MS=2 KILN_NOISE_BOUND=10 " + test::kiln_exe() + " tune '" +
                         (d.path() / "k.toml").string() + "' --set N=100 2>&1"},
      120);
  ASSERT_TRUE(warm.ok()) << warm.output;
  for (const fs::path& root : {fresh, used}) {
    std::vector<fs::path> folders{root};
    for (const char* sub : {"code", "tune", "locks"})
      if (fs::exists(root / sub)) folders.push_back(root / sub);
    for (const auto& f : folders) fs::permissions(f, fs::perms::owner_read | fs::perms::owner_exec);
    ProcessResult r = run_process(
        {"bash", "-c", prefix + "env KILN_CACHE_DIR='" + root.string() + "' KILN_BENCH_BUDGET_MS=2 KILN_NOISE_BOUND=10 " +
                           test::kiln_exe() + " tune --json '" + (d.path() / "k.toml").string() + "' --set N=100 2>&1"},
        120);
    EXPECT_TRUE(r.ok()) << root << ": " << r.describe() << "\n" << r.output;
    // What the folder holds is still read: the record tuned before answers.
    const std::string source = root == used ? "\"source\": \"cache\"" : "\"source\": \"tuned\"";
    EXPECT_NE(r.output.find(source), std::string::npos)
        << root << ": " << r.output << "\n(the run that filled it said: " << warm.output << ")";
    size_t warnings = 0;
    for (size_t at = r.output.find("without keeping anything"); at != std::string::npos;
         at = r.output.find("without keeping anything", at + 1))
      ++warnings;
    EXPECT_EQ(warnings, 1u) << root << ": " << r.output;
    for (const auto& f : folders) fs::permissions(f, fs::perms::owner_all);
  }
}

TEST(CompilePool, IdenticalRequestsInFlightShareOneCompile) {
  TempDir d("kiln-test");
  test::write(d.path() / "fill.cpp", test::kFillSource);
  test::write(d.path() / "k.toml", test::kFillSpec);
  KernelSpec s = load_spec(d.path() / "k.toml");
  Options o = test::options_in(d.path());
  o.compile_threads = 4;
  Runtime rt(o);
  CompilePool& pool = rt.compile_pool("cpu");
  CompileRequest req = make_compile_request(s, s.space.at(0));
  std::vector<std::thread> ts;
  std::vector<BinaryFuture> futures(100);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = t; i < 100; i += 4) futures[i] = pool.submit(req);
    });
  for (auto& t : ts) t.join();
  for (auto& f : futures) EXPECT_EQ(f.get()->key, futures[0].get()->key);
  auto c = pool.counters();
  EXPECT_EQ(c.submitted, 100u);
  EXPECT_EQ(c.compiled, 1u);
  EXPECT_EQ(c.deduped, 99u);
}

TEST(CompilePool, AWarmCacheAnswersInANewRuntime) {
  TempDir d("kiln-test");
  test::write(d.path() / "fill.cpp", test::kFillSource);
  test::write(d.path() / "k.toml", test::kFillSpec);
  KernelSpec s = load_spec(d.path() / "k.toml");
  Options o = test::options_in(d.path());
  for (int round = 0; round < 2; ++round) {
    Runtime rt(o);
    std::vector<BinaryFuture> fs;
    for (const auto& c : s.space.all()) fs.push_back(rt.compile_pool("cpu").submit(make_compile_request(s, c)));
    for (auto& f : fs) f.get();
    auto c = rt.compile_pool("cpu").counters();
    EXPECT_EQ(c.compiled, round == 0 ? 6u : 0u);
    EXPECT_EQ(c.cache_hits, round == 0 ? 0u : 6u);
  }
  // KILN_NO_CACHE: nothing is read.
  o.no_cache = true;
  Runtime rt(o);
  rt.compile_pool("cpu").submit(make_compile_request(s, s.space.at(0))).get();
  EXPECT_EQ(rt.compile_pool("cpu").counters().compiled, 1u);
}

// Several processes compile the same kernels into one cache at once: all
// succeed, each key is compiled once in all, and no entry is torn.
TEST(CompilePool, ConcurrentProcessesShareOneCacheWithoutTornEntries) {
  TempDir d("kiln-test");
  fs::path cache = d.path() / "cache";
  std::string spec = test::kernels() + "/cpu/softmax.toml";
  std::string cmd = "KILN_CACHE_DIR=" + cache.string() + " KILN_COMPILE_THREADS=2 " + test::kiln_exe() +
                    " compile --json " + spec + " > " + d.path().string() + "/out.$i.json";
  ProcessResult r = run_process({"bash", "-c", "for i in 0 1 2 3; do (" + cmd + ") & done; wait"}, 600);
  ASSERT_TRUE(r.ok()) << r.describe() << r.output;
  size_t compiled = 0, cached = 0;
  for (int i = 0; i < 4; ++i) {
    auto text = read_file(d.path() / ("out." + std::to_string(i) + ".json"));
    ASSERT_TRUE(text);
    auto j = nlohmann::json::parse(*text);
    EXPECT_EQ(j["totals"]["failed"], 0);
    compiled += j["totals"]["compiled"].get<size_t>();
    cached += j["totals"]["cached"].get<size_t>();
  }
  EXPECT_EQ(compiled, 8u) << "each of the 8 configs compiled once across the 4 processes";
  EXPECT_EQ(cached, 24u);
  CodeCache c(cache);
  EXPECT_EQ(c.stats().entries, 8u);
  KernelSpec s = load_spec(spec);
  Options o = test::options_in(d.path());
  Runtime rt(o);
  for (const auto& cfg : s.space.all()) {
    auto b = rt.compile_pool("cpu").submit(make_compile_request(s, cfg)).get();
    EXPECT_TRUE(b->from_cache);
    rt.load(*b);  // every entry loads
  }
  EXPECT_EQ(c.corrupt_seen(), 0u);
}

// A failed compile is not remembered for the process's life: submitting it
// again compiles again (once the failure is done).
TEST(CompilePool, AFailedCompileIsRetriedWhenSubmittedAgain) {
  TempDir d("kiln-test");
  test::write(d.path() / "fill.cpp", std::string("#include \"flag.h\"\n") + test::kFillSource);
  test::write(d.path() / "flag.h", "#error not yet\n");
  test::write(d.path() / "k.toml", test::kFillSpec);
  KernelSpec s = load_spec(d.path() / "k.toml");
  Options o = test::options_in(d.path());
  o.no_cache = true;
  Runtime rt(o);
  CompileRequest req = make_compile_request(s, s.space.at(0));
  std::string key = make_binary_key(req, rt.backend("cpu")).hex();
  EXPECT_THROW(rt.compile_pool("cpu").submit(req, key).get(), Error);
  // The same key (as if the failure were transient): compiled again, not answered from memory.
  test::write(d.path() / "flag.h", "\n");
  auto b = rt.compile_pool("cpu").submit(req, key).get();
  EXPECT_FALSE(b->bytes.empty());
  EXPECT_EQ(rt.compile_pool("cpu").counters().failed, 1u);
  EXPECT_EQ(rt.compile_pool("cpu").counters().compiled, 1u);
}
