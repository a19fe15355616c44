// Tuning records shared through a real Redis server: two processes, four
// processes and a lease, a server stopped mid-run, servers that answer
// garbage or nothing, and remote values that must not be trusted.
#include <gtest/gtest.h>

#include <chrono>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/args.hpp"
#include "kiln/runtime.hpp"
#include "redis_server.hpp"
#include "compile/compile_pool.hpp"
#include "compile/remote_cache.hpp"
#include "kiln/ext/binary_key.hpp"
#include "tune/record_io.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const char* kSpec = test::kTwiceSpec;
const char* kSource = test::kTwiceSource;

#define NEED_REDIS(server)                                                                                 \
  if (!(server).running())                                                                                 \
  GTEST_SKIP() << "no redis-server here (apt-get install redis-server; make test installs it when root)"

struct RemoteTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  KernelSpec spec = test::spec_in(dir.path(), kSpec, "twice.cpp", kSource);
  Options options(const std::string& cache, const std::string& url, const std::string& bundle = "") {
    Options o = test::options_in(dir.path() / cache);
    o.bundle = bundle;
    o.bench_budget_ms = 2;
    o.workers = 1;
    o.remote_cache = url;
    o.remote_timeout_s = 5;  // a loaded test machine can stall a command past the 50 ms default
    // A record timed on a busy machine would be re-measured by the next process (not what is
    // tested here): the noise bound is wide, as for kiln_tune below.
    o.noise_bound = 10;
    return o;
  }
  TuneOutcome tune(Runtime& rt, int64_t n) {
    HostArgs a(spec, parse_scalars(spec, {{"n", std::to_string(n)}}));
    a.fill_random(1);
    return rt.tune(spec, a.params(), {});
  }
  // `kiln tune --json` in a process of its own, with its own local cache.
  nlohmann::json kiln_tune(const std::string& cache, const std::string& url, int64_t n, const std::string& extra = "") {
    fs::path out = dir.path() / (cache + ".json");
    ProcessResult r = run_process(
        {"bash", "-c",
         // A record timed on a busy machine is re-measured by the next tuning (not what is tested
         // here): the noise bound is wide, so a loaded test machine stores it as quiet.
         fmt::format("KILN_CACHE_DIR={} KILN_REMOTE_CACHE={} KILN_REMOTE_TIMEOUT=5 KILN_BENCH_BUDGET_MS=2 "
                     "KILN_NOISE_BOUND=10 {} {} tune {} --set n={} --json >{}",
                     (dir.path() / cache).string(), url, extra, test::kiln_exe(), (dir.path() / "k.toml").string(), n,
                     out.string())},
        120);
    EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    return nlohmann::json::parse(read_file(out).value_or("{}"));
  }
};

}  // namespace

TEST(RedisUrl, IsParsedStrictly) {
  RedisUrl u = parse_redis_url("redis://127.0.0.1:6380/2");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 6380);
  EXPECT_EQ(u.db, 2);
  EXPECT_EQ(parse_redis_url("redis://cache-1").port, 6379);
  for (const char* bad : {"http://x:1", "redis://", "redis://h:", "redis://h:99999", "redis://h:1/x",
                          "redis://user:pw@h:1", "redis://h h:1"})
    EXPECT_THROW(parse_redis_url(bad), Error) << bad;
  Options o;
  o.remote_cache = "redis:/oops";
  EXPECT_THROW(Runtime rt(o), Error);
}

TEST_F(RemoteTest, TwoProcessesWithSeparateLocalCachesShareARecord) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  nlohmann::json first = kiln_tune("a", redis.url(), 1000);
  EXPECT_EQ(first["source"], "tuned");
  EXPECT_GT(first["timed_now"].get<int>(), 0);
  EXPECT_EQ(first["records"]["remote_writes"], 1);
  nlohmann::json second = kiln_tune("b", redis.url(), 1000);
  EXPECT_EQ(second["source"], "remote");
  EXPECT_EQ(second["timed_now"], 0);
  EXPECT_EQ(second["best"], first["best"]);
  // Kept locally: a third process on the second machine needs no Redis.
  redis.stop();
  nlohmann::json third = kiln_tune("b", redis.url(), 1000);
  EXPECT_EQ(third["source"], "cache");
  EXPECT_EQ(third["timed_now"], 0);
}

// Four processes meet the same untuned key at once: one tunes (holding the
// lease), three wait for its record and reuse it.
TEST_F(RemoteTest, FourProcessesOneTunesThreeReuse) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  std::vector<nlohmann::json> outs(4);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] { outs[i] = kiln_tune("p" + std::to_string(i), redis.url(), 4096, "KILN_BENCH_BUDGET_MS=30"); });
  for (auto& t : ts) t.join();
  int tuned = 0, reused = 0, waited = 0;
  for (const auto& o : outs) {
    if (o["timed_now"].get<int>() > 0) ++tuned;
    else if (o["source"] == "remote") ++reused;
    waited += o["records"]["lease_waits"].get<int>();
    EXPECT_EQ(o["best"], outs[0]["best"]);
  }
  EXPECT_EQ(tuned, 1);
  EXPECT_EQ(reused, 3);
  // The tuner compiles and times for about a second; the others start
  // meanwhile, so at least one of them met the lease (not only the record).
  EXPECT_GE(waited, 1);
}

// A tuner killed while holding the lease leaves it to expire; the next
// process waits for that, then takes the lease and tunes.
TEST_F(RemoteTest, ALeaseLeftByADeadTunerExpiresAndAnotherTunes) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  Options o = options("a", redis.url());
  o.lease_ttl_s = 1;
  Runtime rt(o);
  TuningKey key = make_tuning_key(spec, rt.backend("cpu"), {{"n", 512}});
  RemoteCache raw({redis.url()});
  ASSERT_EQ(raw.try_lease(remote_key_prefix() + fmt::format("lease:{}/{}", key.base_hex(), key.values_hex()),
                          "a-dead-process", 1200),
            RemoteCache::Lease::acquired);
  TuneOutcome out = tune(rt, 512);
  EXPECT_GT(out.timed_now, 0u);
  TuningCache::Stats st = rt.tuning_cache()->stats();
  EXPECT_EQ(st.lease_waits, 1u);
  EXPECT_EQ(st.leases_taken, 1u);
}

// Issue row L3: a process waiting on another's lease misses a reply (the
// server stalls for four times the 250 ms deadline, and the client backs off
// for a second): it asks again within the lease's life instead of tuning the
// key itself, and takes the record the other process stores. (The deadline
// is far above a loaded machine's loopback round trip, so only the stall
// misses a reply.)
TEST_F(RemoteTest, AMissedReplyWhileWaitingOnALeaseIsAskedAgain) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  // The record "the other process" stores: tuned here, apart, with no remote.
  Options apart = test::options_in(dir.path() / "apart");
  apart.bench_budget_ms = 2;
  apart.workers = 1;
  std::string text;
  TuningKey key;
  {
    Runtime rt(apart);
    TuneOutcome out = tune(rt, 777);
    ASSERT_TRUE(out.choice);
    text = record_to_text(out.record);
    key = out.record.key;
  }
  Options o = options("waiter", redis.url());
  o.remote_timeout_s = 0.25;
  o.lease_ttl_s = 4;
  Runtime rt(o);
  RemoteCache raw({redis.url(), 5});
  const std::string prefix = remote_key_prefix();
  const std::string lease = prefix + "lease:" + key.base_hex() + "/" + key.values_hex();
  ASSERT_EQ(raw.try_lease(lease, "the-other-process", 8000), RemoteCache::Lease::acquired);
  std::thread other([&] {
    std::this_thread::sleep_for(400ms);
    // The server stalls for 1 s: the waiter's next command gets no reply in time.
    raw.command({"CLIENT", "PAUSE", "1000", "ALL"});
    std::this_thread::sleep_for(2500ms);
    raw.hset(prefix + "rec:" + key.base_hex(), key.values_hex(), text);
    raw.release_lease(lease, "the-other-process");
  });
  TuneOutcome out = tune(rt, 777);
  other.join();
  EXPECT_EQ(out.timed_now, 0u) << "the waiter tuned the key itself";
  EXPECT_GT(rt.remote_cache()->stats().failures, 0u) << "no reply was missed: the test did not test";
  EXPECT_EQ(rt.tuning_cache()->stats().lease_waits, 1u);
  EXPECT_EQ(rt.tuning_cache()->stats().remote_hits, 1u);
}

// Redis stopped in the middle of a run: tuning goes on locally; the outage
// costs one time-out, after which calls skip Redis until the back-off ends;
// when Redis is back, kiln uses it again.
TEST_F(RemoteTest, RedisStoppedMidRunCostsOneTimeOutAndIsUsedAgainWhenBack) {
  auto redis = std::make_unique<test::RedisServer>();
  NEED_REDIS(*redis);
  const int port = redis->port();
  Runtime rt(options("a", redis->url()));
  EXPECT_GT(tune(rt, 100).timed_now, 0u);
  auto remote = rt.remote_cache();
  RemoteCache::Stats before = remote->stats();
  EXPECT_EQ(before.failures, 0u);
  redis->stop();
  EXPECT_GT(tune(rt, 200).timed_now, 0u);  // tuned here, stored locally
  EXPECT_GT(tune(rt, 300).timed_now, 0u);
  RemoteCache::Stats down = remote->stats();
  EXPECT_EQ(down.failures, 1u) << "one failed attempt, then back-off";
  EXPECT_GT(down.skipped, 0u);
  redis = std::make_unique<test::RedisServer>(port);
  ASSERT_TRUE(redis->running());
  std::this_thread::sleep_for(1100ms);  // the first back-off
  EXPECT_GT(tune(rt, 400).timed_now, 0u);
  EXPECT_EQ(remote->stats().failures, 1u);
  RemoteCache raw({redis->url()});
  TuningKey key = make_tuning_key(spec, rt.backend("cpu"), {{"n", 400}});
  EXPECT_TRUE(raw.hget(remote_key_prefix() + "rec:" + key.base_hex(), key.values_hex()));
}

// Servers that answer garbage, an endless reply, a list of two billion elements, or nothing:
// each is a miss within the time-out, tuning goes on, and nothing from them is trusted. (The
// list's header alone made the client reserve 16 GB of address space and walk it for seconds
// when it gave the reply up: it is refused as it is read.)
TEST_F(RemoteTest, ServersThatAnswerGarbageOrNothingAreMisses) {
  for (std::string answer : {std::string("hello there\r\n"), std::string("$999999999\r\nabc"),
                             std::string("*3\r\n:1\r\n"), std::string(), std::string("*2147483647\r\n:1\r\n")}) {
    test::FakeServer fake(answer);
    Options o = options("f" + std::to_string(answer.size()), fake.url());
    o.remote_timeout_s = 0.05;
    Runtime rt(o);
    RemoteCache::Stats s0 = rt.remote_cache()->stats();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(rt.remote_cache()->hget("k", "f"));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "not cut off near its 50 ms time-out";
    EXPECT_EQ(rt.remote_cache()->stats().failures, s0.failures + 1);
    EXPECT_FALSE(rt.remote_cache()->hget("k", "f"));  // in back-off: not tried again
    EXPECT_EQ(rt.remote_cache()->stats().failures, s0.failures + 1);
    TuneOutcome out = tune(rt, 64);
    EXPECT_TRUE(out.choice);
    EXPECT_EQ(rt.tuning_cache()->stats().remote_hits, 0u);
  }
}

// Remote values that do not validate are misses: a flipped byte, a record
// of another key, and a record whose config space is not the spec's, whose
// choice must never be run.
TEST_F(RemoteTest, RemoteValuesThatDoNotValidateAreNeverTrusted) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  Runtime first(options("a", redis.url()));
  TuneOutcome tuned = tune(first, 256);
  ASSERT_TRUE(tuned.choice);
  RemoteCache raw({redis.url()});
  TuningKey key = make_tuning_key(spec, first.backend("cpu"), {{"n", 256}});
  const std::string hash = remote_key_prefix() + "rec:" + key.base_hex();
  std::string good = *raw.hget(hash, key.values_hex());

  // A flipped byte.
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x20;
  ASSERT_TRUE(raw.hset(hash, key.values_hex(), flipped));
  {
    Runtime rt(options("b", redis.url()));
    EXPECT_GT(tune(rt, 256).timed_now, 0u);
    EXPECT_GE(rt.tuning_cache()->stats().remote_rejected, 1u);  // each look is a miss
  }
  // A record of n=128 stored under n=256's field.
  Runtime other(options("c", redis.url()));
  tune(other, 128);
  TuningKey k128 = make_tuning_key(spec, first.backend("cpu"), {{"n", 128}});
  ASSERT_TRUE(raw.hset(hash, key.values_hex(), *raw.hget(hash, k128.values_hex())));
  {
    Runtime rt(options("d", redis.url()));
    EXPECT_GT(tune(rt, 256).timed_now, 0u);
    EXPECT_GE(rt.tuning_cache()->stats().remote_rejected, 1u);  // each look is a miss
  }
  // A record from another config space (MODE in {0, 1, 7}, best MODE=7):
  // valid as a record, but its choice is not a config of this spec, so it is
  // never run, and this spec's configs are timed.
  TuningRecord foreign = tuned.record;
  foreign.space = ConfigSpace{{Param{"MODE", {0, 1, 7}}}};
  Config seven;
  seven.values = {{"MODE", 7}};
  foreign.best = seven;
  foreign.configs = {ConfigResult{seven, std::string(32, 'a'), 1.0, 1, 1, 5, FailKind::none, "", ""}};
  ASSERT_TRUE(raw.hset(hash, key.values_hex(), record_to_text(foreign)));
  {
    Runtime rt(options("e", redis.url()));
    TuneOutcome out = tune(rt, 256);
    ASSERT_TRUE(out.choice);
    EXPECT_NE(out.choice->str(), "MODE=7");
    EXPECT_TRUE(spec.space.index_of(*out.choice).has_value());
    EXPECT_GT(out.timed_now, 0u);
  }
}

// A field longer than the reader takes (written by hand, or by something else) in a kernel's
// hash: the kernel's other records still come back in the one round trip, and the connection is
// not dropped for it.
TEST_F(RemoteTest, AnOversizedFieldHidesNoneOfAKernelsOtherRecords) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  {
    Runtime first(options("a", redis.url()));
    ASSERT_TRUE(tune(first, 256).choice);
    ASSERT_TRUE(tune(first, 512).choice);
  }
  Runtime rt(options("b", redis.url()));
  RemoteCache raw({redis.url(), 5});
  TuningKey key = make_tuning_key(spec, rt.backend("cpu"), {{"n", 256}});
  const std::string hash = remote_key_prefix() + "rec:" + key.base_hex();
  // 17 MiB is past the longest reply read; 64 MiB copied into the server's script took it past
  // the 50 ms time-out.
  ASSERT_TRUE(raw.hset(hash, "0000-a-field-of-17-MiB", std::string(17u << 20, 'x')));
  ASSERT_TRUE(raw.hset(hash, "0001-a-field-of-64-MiB", std::string(64u << 20, 'y')));
  TuneOutcome at256 = tune(rt, 256), at512 = tune(rt, 512);
  EXPECT_EQ(at256.timed_now, 0u) << "the record of n=256 was hidden";
  EXPECT_EQ(at512.timed_now, 0u) << "the record of n=512 was hidden";
  EXPECT_EQ(rt.tuning_cache()->stats().remote_hits, 2u);
  EXPECT_EQ(rt.remote_cache()->stats().failures, 0u) << "the long field cost the connection";
  // A hash crowded past what one fetch walks: the record asked for still comes back.
  std::vector<std::string> hset = {"HSET", hash};
  for (size_t i = 0; i <= TuningCache::kRemoteFetchFields; ++i) {
    hset.push_back(fmt::format("crowd-{}", i));
    hset.push_back("not a record");
  }
  ASSERT_TRUE(raw.command(hset));
  // (Not walked: the record asked for comes back alone.)
  auto alone = raw.hgetall_bounded(hash, key.values_hex(), TuningCache::kMaxRemoteRecordBytes,
                                   TuningCache::kRemoteFetchBudget, TuningCache::kRemoteFetchFields);
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].first, key.values_hex());
  Runtime crowded(options("c", redis.url()));
  EXPECT_EQ(tune(crowded, 256).timed_now, 0u) << "the record of n=256 was hidden in a crowded hash";
  EXPECT_EQ(crowded.remote_cache()->stats().failures, 0u);
}

// A bundle's copy of a record that does not validate: the kernel's own record answers, and the
// bundle's copy is written again with it.
TEST_F(RemoteTest, ADamagedRecordInABundleIsAnsweredByTheKernelsAndRepaired) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  {
    Runtime rt(options("a", redis.url(), "app-2"));
    ASSERT_TRUE(tune(rt, 256).choice);
  }
  RemoteCache raw({redis.url(), 5});
  const std::string bundle = remote_key_prefix() + "bundle:app-2";
  auto entries = raw.hgetall(bundle);
  ASSERT_EQ(entries.size(), 1u);
  const std::string field = entries[0].first, good = entries[0].second;
  std::string damaged = good;
  damaged[damaged.size() / 2] ^= 0x20;
  ASSERT_TRUE(raw.hset(bundle, field, damaged));
  {
    Runtime rt(options("b", redis.url(), "app-2"));
    EXPECT_EQ(tune(rt, 256).timed_now, 0u) << "a damaged bundle copy hid the kernel's record";
    EXPECT_EQ(rt.tuning_cache()->stats().remote_hits, 1u);
  }
  EXPECT_EQ(raw.hget(bundle, field), good) << "the bundle's copy was not repaired";
}

// A server that runs no scripts (an ACL, a proxy): a kernel's records still come back, by the
// plain fetch.
TEST_F(RemoteTest, AServerThatRunsNoScriptsStillSharesRecords) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  RemoteCache raw({redis.url(), 5});
  std::optional<RemoteCache::Reply> acl = raw.command({"ACL", "SETUSER", "default", "-eval", "-evalsha"});
  if (!acl || acl->kind != RemoteCache::Reply::status) GTEST_SKIP() << "this redis-server has no ACLs";
  ASSERT_EQ(raw.command({"EVAL", "return 1", "0"})->kind, RemoteCache::Reply::error);
  {
    Runtime first(options("a", redis.url()));
    ASSERT_GT(tune(first, 256).timed_now, 0u);
  }
  Runtime second(options("b", redis.url()));
  EXPECT_EQ(tune(second, 256).timed_now, 0u);
  EXPECT_EQ(second.tuning_cache()->stats().remote_hits, 1u);
}

// Kilns that would reject each other's records (another release, a fleet in a rolling upgrade)
// keep them under other keys: neither overwrites what the other tuned.
TEST_F(RemoteTest, KilnsOfAnotherReleaseKeepTheirRecordsApart) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  Runtime rt(options("a", redis.url()));
  TuningKey key = make_tuning_key(spec, rt.backend("cpu"), {{"n", 256}});
  const std::string ours = remote_key_prefix();
  EXPECT_NE(ours.find(fmt::format(":t{}:", TuningKey::kFormatVersion)), std::string::npos) << ours;
  const std::string theirs = fmt::format("kiln:t{}:v0.999:", TuningKey::kFormatVersion);
  ASSERT_NE(ours, theirs);
  RemoteCache raw({redis.url(), 5});
  ASSERT_TRUE(raw.hset(theirs + "rec:" + key.base_hex(), key.values_hex(), "a record of release 0.999"));
  TuneOutcome out = tune(rt, 256);
  ASSERT_TRUE(out.choice);
  EXPECT_GT(out.timed_now, 0u);
  EXPECT_EQ(raw.hget(theirs + "rec:" + key.base_hex(), key.values_hex()), "a record of release 0.999");
  std::optional<std::string> mine = raw.hget(ours + "rec:" + key.base_hex(), key.values_hex());
  ASSERT_TRUE(mine);
  std::optional<TuningRecord> r = record_from_text(*mine, key);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kiln_version, kiln_version());
}

// A named bundle: the records a process used, fetched by the next process
// in one round trip before it asks for any single one.
TEST_F(RemoteTest, ABundleCarriesTheRecordsAProcessUsed) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  {
    Runtime rt(options("a", redis.url(), "app-1"));
    for (int64_t n : {64, 128, 256}) tune(rt, n);
  }
  RemoteCache raw({redis.url()});
  EXPECT_EQ(raw.hgetall(remote_key_prefix() + "bundle:app-1").size(), 3u);
  Runtime rt(options("b", redis.url(), "app-1"));
  for (int64_t n : {64, 128, 256}) EXPECT_EQ(tune(rt, n).timed_now, 0u);
  auto cmds = rt.remote_cache()->stats().commands;
  // One HGETALL for the bundle, which holds every record: no other round trip.
  EXPECT_EQ(cmds, 1u);
  EXPECT_EQ(rt.tuning_cache()->stats().remote_hits, 3u);
}

// Binaries shared through Redis (opt-in): a second machine compiles nothing;
// a poisoned entry (bytes that do not match their hash, or another kernel's
// binary under this key) is rejected and the kernel compiled here.
TEST_F(RemoteTest, BinariesAreSharedContentAddressedAndAPoisonedOneIsRejected) {
  test::RedisServer redis;
  NEED_REDIS(redis);
  auto opts = [&](const std::string& cache) {
    Options o = options(cache, redis.url());
    o.remote_binaries = true;
    return o;
  };
  Config mode1, mode2;
  mode1.values = {{"MODE", 1}};
  mode2.values = {{"MODE", 2}};
  std::string key1, key2;
  {
    Runtime rt(opts("a"));
    key1 = rt.compile_pool("cpu").submit(spec, mode1).get()->key;
    key2 = rt.compile_pool("cpu").submit(spec, mode2).get()->key;
    EXPECT_EQ(rt.stats().compiled, 2u);
  }
  {
    Runtime rt(opts("b"));
    auto b = rt.compile_pool("cpu").submit(spec, mode1).get();
    EXPECT_EQ(rt.stats().compiled, 0u) << "fetched from Redis";
    EXPECT_EQ(b->key, key1);
    HostArgs a(spec, parse_scalars(spec, {{"n", "8"}}));
    a.fill_random(1);
    auto k = rt.load(*b);
    ASSERT_TRUE(k);
  }
  RemoteCache raw({redis.url()});
  const std::string p = fmt::format("kiln:b{}:", BinaryKey::kFormatVersion);
  // Another kernel's binary under key1: its hash verifies, its key does not.
  ASSERT_TRUE(raw.set(p + "bin:" + key1, *raw.get(p + "bin:" + key2)));
  {
    Runtime rt(opts("c"));
    rt.compile_pool("cpu").submit(spec, mode1).get();
    EXPECT_EQ(rt.stats().compiled, 1u) << "rejected, compiled here";
  }
  // Bytes that do not match the hash they are stored under.
  std::string content = *raw.get(p + "bin:" + key2);
  std::string blob = *raw.get(p + "blob:" + content);
  blob[blob.size() / 2] ^= 0x40;
  ASSERT_TRUE(raw.set(p + "blob:" + content, blob));
  {
    Runtime rt(opts("d"));
    rt.compile_pool("cpu").submit(spec, mode2).get();
    EXPECT_EQ(rt.stats().compiled, 1u) << "rejected, compiled here";
  }
}
