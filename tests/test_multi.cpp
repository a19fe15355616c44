#include <gtest/gtest.h>

#include <cmath>

#include "core/fsutil.hpp"
#include "kiln/args.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "dispatch/shape_memo.hpp"
#include "util.hpp"

#include <thread>

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct MultiTest : ::testing::Test {
  TempDir dir{"kiln-test"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.workers = 1;
  }
};

void softmax_ref(const std::vector<float>& x, std::vector<double>& y, int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < N; ++j) m = std::max(m, double(x[r * N + j]));
    for (int64_t j = 0; j < N; ++j) s += std::exp(x[r * N + j] - m);
    for (int64_t j = 0; j < N; ++j) y[r * N + j] = std::exp(x[r * N + j] - m) / s;
  }
}

void expect_softmax(MultiKernel& k, int64_t M, int64_t N) {
  std::vector<float> x(M * N), y(M * N, -1);
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), static_cast<uint64_t>(M * 7 + N));
  k(x.data(), y.data(), M, N);
  std::vector<double> ref(M * N);
  softmax_ref(x, ref, M, N);
  for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(y[i], ref[i], 1e-5) << i;
}

// The multi-kernel's choice for a softmax call of M x N (its buffers made for the call).
MultiKernel::Pick pick_at(MultiKernel& k, int64_t M, int64_t N) {
  std::vector<float> x(static_cast<size_t>(M * N)), y(static_cast<size_t>(M * N));
  float *px = x.data(), *py = y.data();
  void* params[] = {&px, &py, &M, &N};
  return k.pick(params);
}

// x (inout) is doubled: variant 0 copies src → dst (passed x twice), variant 1 works in place,
// variant 2 (only in the "wrong" spec) triples.
void write_scale_specs(const fs::path& d, bool with_wrong) {
  test::write(d / "scale.cpp", R"SRC(
void scale_copy(kiln::program_id, const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * 2.0f;
}
void scale_inplace(kiln::program_id, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * FACTOR;
}
)SRC");
  test::write(d / "copy.toml", R"SPEC(name = "scale_copy"
backend = "cpu"
source = "scale.cpp"
entry = "scale_copy"
grid = ["1"]
args = [ { name = "src", type = "f32*", size = "n", intent = "in" },
         { name = "dst", type = "f32*", size = "n", intent = "out" }, { name = "n", type = "i64" } ]
[params]
FACTOR = [2]
)SPEC");
  for (int f : {2, 3})
    test::write(d / ("inplace" + std::to_string(f) + ".toml"), R"SPEC(name = "scale_inplace"
backend = "cpu"
source = "scale.cpp"
entry = "scale_inplace"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "inout" }, { name = "n", type = "i64" } ]
[params]
FACTOR = [)SPEC" + std::to_string(f) + "]\n");
  std::string multi = R"SPEC(name = "scale"
kind = "multi"
args = [ { name = "x", type = "f32*", size = "n", intent = "inout" }, { name = "n", type = "i64" } ]
[tuning]
key = ["n"]
[[variants]]
spec = "copy.toml"
args = ["x", "x", "n"]
[[variants]]
spec = "inplace2.toml"
args = ["x", "n"]
)SPEC";
  if (with_wrong) multi += "[[variants]]\nspec = \"inplace3.toml\"\nargs = [\"x\", \"n\"]\n";
  test::write(d / "scale.toml", multi);
}

}  // namespace

TEST_F(MultiTest, SoftmaxVariantsAreBenchmarkedOnceAKeyAndRemembered) {
  fs::path spec = test::kernels() + "/cpu/softmax_multi.toml";
  ASSERT_TRUE(is_multi_spec(spec));
  MultiKernelSpec ms = load_multi_spec(spec);
  ASSERT_EQ(ms.variants.size(), 2u);
  opts.first_call = FirstCall::wait;  // the benchmark on the first call itself is under test
  {
    Runtime rt(opts);
    MultiKernel k(rt, ms);
    expect_softmax(k, 64, 256);
    MultiKernel::Pick p = pick_at(k, 64, 256);
    EXPECT_EQ(p.source, ChoiceSource::benchmarked);
    expect_softmax(k, 64, 256);  // memoised
    expect_softmax(k, 3, 5000);
    // Rows longer than 16384 rule the whole-row variant out (its constraint): the two-pass one runs.
    expect_softmax(k, 2, 20000);
    EXPECT_EQ(pick_at(k, 2, 20000).variant, 1u);
  }
  Runtime rt2(opts);
  MultiKernel k2(rt2, ms);
  EXPECT_EQ(pick_at(k2, 64, 256).source, ChoiceSource::cache);
}

TEST_F(MultiTest, ForcingAVariantAndItsScratchBuffer) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cpu/softmax_multi.toml");
  for (int v : {0, 1}) {
    opts.force_variant = v;
    Runtime rt(opts);
    MultiKernel k(rt, ms);
    expect_softmax(k, 33, 1000);
    MultiKernel::Pick p = pick_at(k, 33, 1000);
    EXPECT_EQ(p.variant, static_cast<size_t>(v));
    EXPECT_EQ(p.source, ChoiceSource::forced);
  }
  opts.force_variant = 2;
  Runtime rt(opts);
  try {
    MultiKernel k(rt, ms);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_FORCE_VARIANT=2 but multi-kernel 'softmax_multi' has 2 variants"),
              std::string::npos)
        << e.what();
  }
}

// A multi-kernel's spec that declares a buffer or a scratch buffer smaller than a variant's
// step touches: that variant never runs (it would write past the buffer), the error names the
// step, the argument and both sizes; a variant that fits is chosen. (Before, the forced
// variant wrote past its scratch and the process crashed.)
TEST_F(MultiTest, AVariantWhoseStepReachesPastADeclaredBufferNeverRuns) {
  const fs::path d = dir.path();
  std::string text = *read_file(test::kernels() + "/cpu/softmax_multi.toml");
  const std::string scratch = "size = \"2*M\"";
  ASSERT_NE(text.find(scratch), std::string::npos);
  text.replace(text.find(scratch), scratch.size(), "size = \"1\"");
  for (const auto& e : fs::directory_iterator(test::kernels() + "/cpu"))  // the variants' specs and sources
    if (e.path().filename().string().rfind("softmax", 0) == 0) fs::copy_file(e.path(), d / e.path().filename());
  test::write(d / "small.toml", text);
  MultiKernelSpec ms = load_multi_spec(d / "small.toml");
  {
    opts.force_variant = 1;
    Runtime rt(opts);
    MultiKernel k(rt, ms);
    std::vector<float> x(300 * 8, 1.f), y(300 * 8);
    try {
      k(x.data(), y.data(), int64_t{300}, int64_t{8});
      ADD_FAILURE() << "the forced variant ran past its scratch";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::launch) << e.what();
      for (const char* w : {"variant 1", "'stats' touches 600 elements", "holds 1", "its size '1'"})
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << " in: " << e.what();
    }
  }
  opts.force_variant.reset();
  Runtime rt(opts);
  MultiKernel k(rt, ms);
  expect_softmax(k, 300, 8);
  EXPECT_EQ(pick_at(k, 300, 8).variant, 0u);
}

// The call path keeps scratch per thread. A multi-kernel that dies, with its
// runtime, must leave nothing a later one (made where it was, or evicting its
// slot) reads or frees. The scratch is 2*M floats in 256-byte steps: M = 64r
// takes 512r bytes, and M = 64r + 3 a step more, so each round grows its slot;
// a thread has 8 slots, so the later rounds evict the earlier ones'.
TEST_F(MultiTest, ScratchOutlivesNoMultiKernel) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cpu/softmax_multi.toml");
  opts.force_variant = 1;  // the variant with scratch
  for (int64_t round = 1; round <= 12; ++round) {
    Runtime rt(opts);
    MultiKernel k(rt, ms);
    expect_softmax(k, 64 * round, 16);
    expect_softmax(k, 64 * round + 3, 16);
  }
}

// More live multi-kernels than a thread has slots, called in turn (each call
// evicts another's slot from the thread's cache, which loses no buffer), a
// buffer outgrown (kept: a graph captured with it may still run it), and
// threads that call some and end (giving theirs back): every result right;
// under ASan, no buffer used or freed twice.
TEST_F(MultiTest, ScratchSlotsEvictedAndThreadsEnding) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cpu/softmax_multi.toml");
  opts.force_variant = 1;
  Runtime rt(opts);
  std::vector<std::unique_ptr<MultiKernel>> ks;
  for (int i = 0; i < 10; ++i) ks.push_back(std::make_unique<MultiKernel>(rt, ms));
  auto out = [&] {
    size_t n = 0;
    for (const auto& k : ks) n += k->scratch_buffers();
    return n;
  };
  for (int pass = 0; pass < 3; ++pass)
    for (size_t i = 0; i < ks.size(); ++i) expect_softmax(*ks[i], 5 + static_cast<int64_t>(i), 16);
  EXPECT_EQ(out(), 10u) << "one buffer each for this thread, though 10 take turns in 8 slots";
  expect_softmax(*ks[0], 200, 16);  // needs more than its 256 bytes
  EXPECT_EQ(ks[0]->scratch_buffers(), 2u) << "the outgrown buffer is kept";
  expect_softmax(*ks[0], 5, 16);
  EXPECT_EQ(ks[0]->scratch_buffers(), 2u);
  const size_t mine0 = ks[0]->scratch_buffers(), mine1 = ks[1]->scratch_buffers();
  for (int t = 0; t < 4; ++t) {
    std::thread th([&] {
      expect_softmax(*ks[0], 40 + t, 16);
      expect_softmax(*ks[1], 90 + t, 16);
      EXPECT_EQ(ks[0]->scratch_buffers(), mine0 + 1);
    });
    th.join();
    EXPECT_EQ(ks[0]->scratch_buffers(), mine0) << "the ended thread gave its buffers back";
    EXPECT_EQ(ks[1]->scratch_buffers(), mine1);
  }
  ks.resize(3);  // the other seven die; this thread's slots of them stay, unmatched
  for (int i = 0; i < 12; ++i) expect_softmax(*ks[static_cast<size_t>(i % 3)], 7 + i, 16);
  EXPECT_EQ(out(), 4u);
}

// A program captures a graph only where every step is settled, and nothing may
// be allocated while a graph is captured: a multi-kernel's choice is settled
// for a call only once the calling thread's scratch for it is in place, so a
// new thread, or a larger size, is launched once outside a capture first.
TEST_F(MultiTest, SettledOnlyWhereTheThreadsScratchIsInPlace) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cpu/softmax_multi.toml");
  opts.force_variant = 1;  // the variant with scratch (2 * M floats)
  Runtime rt(opts);
  MultiKernel k(rt, ms);
  auto settled = [&](int64_t M) {
    std::vector<float> x(static_cast<size_t>(M * 16)), y(x.size());
    float* xp = x.data();
    float* yp = y.data();
    int64_t m = M, n = 16;
    void* params[] = {&xp, &yp, &m, &n};
    return k.settled(params);
  };
  EXPECT_FALSE(settled(64)) << "no scratch yet on this thread";
  expect_softmax(k, 64, 16);
  EXPECT_TRUE(settled(64));
  EXPECT_FALSE(settled(640)) << "ten times the scratch: more than this thread holds";
  expect_softmax(k, 640, 16);
  EXPECT_TRUE(settled(640));
  EXPECT_TRUE(settled(64)) << "the larger buffer serves the smaller size";
  std::thread([&] { EXPECT_FALSE(settled(64)) << "another thread has no scratch of its own yet"; }).join();
}

TEST_F(MultiTest, AnArgumentPassedTwiceAndAWrongVariant) {
  write_scale_specs(dir.path(), true);
  opts.first_call = FirstCall::wait;  // the benchmark on the first call itself is under test
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(dir.path() / "scale.toml"));
  std::vector<float> x(1000);
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 4);
  std::vector<float> orig = x;
  int64_t n = 1000;
  k(x.data(), n);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], orig[i] * 2) << i;  // one launch on the caller's data
  float* px = x.data();
  void* params[] = {&px, &n};
  EXPECT_NE(k.pick(params).variant, 2u);
  // The pick says why variant 2 lost.
  MultiKernel::Pick p = k.pick(params);
  EXPECT_EQ(p.source, ChoiceSource::benchmarked);
  ASSERT_EQ(p.results.size(), 3u);
  EXPECT_TRUE(p.results[0].ns && p.results[1].ns);
  EXPECT_EQ(p.results[2].kind, FailKind::wrong);
  EXPECT_NE(p.results[2].error.find("variant 2 disagrees with variant 0 in 'x'"), std::string::npos)
      << p.results[2].error;
  // A new runtime reads the same from the cache.
  Runtime rt2(opts);
  MultiKernel k2(rt2, load_multi_spec(dir.path() / "scale.toml"));
  MultiKernel::Pick p2 = k2.pick(params);
  EXPECT_EQ(p2.source, ChoiceSource::cache);
  EXPECT_EQ(p2.variant, p.variant);
  EXPECT_EQ(p2.results[2].kind, FailKind::wrong);
}

TEST_F(MultiTest, ASingleVariantRunsWithoutBenchmarking) {
  write_scale_specs(dir.path(), false);
  std::string one = *read_file(dir.path() / "scale.toml");
  one = one.substr(0, one.find("[[variants]]\nspec = \"inplace2.toml\""));
  test::write(dir.path() / "one.toml", one);
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(dir.path() / "one.toml"));
  std::vector<float> x(10, 1.5f);
  int64_t n = 10;
  k(x.data(), n);
  EXPECT_EQ(x[3], 3.0f);
  float* px = x.data();
  void* params[] = {&px, &n};
  EXPECT_EQ(k.pick(params).source, ChoiceSource::only_variant);
}

TEST_F(MultiTest, MultiSpecErrorsNameFileAndKey) {
  write_scale_specs(dir.path(), false);
  std::string good = *read_file(dir.path() / "scale.toml");
  auto error_of = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    test::write(dir.path() / "bad.toml", t);
    try {
      load_multi_spec(dir.path() / "bad.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("args = [\"x\", \"x\", \"n\"]", "args = [\"x\", \"n\"]").find("2 names for the 3 arguments"), std::string::npos);
  EXPECT_NE(error_of("args = [\"x\", \"x\", \"n\"]", "args = [\"x\", \"y\", \"n\"]").find("'y' is neither an argument nor a scratch buffer"), std::string::npos);
  EXPECT_NE(error_of("intent = \"inout\" }, { name = \"n\"", "intent = \"in\" }, { name = \"n\"").find("the variant writes 'x'"), std::string::npos);
  EXPECT_NE(error_of("args = [\"x\", \"x\", \"n\"]", "args = [\"x\", \"x\", \"x\"]").find("'x' (f32*) passed as 'n' (i64)"), std::string::npos);
  EXPECT_NE(error_of("key = [\"n\"]", "key = [\"x\"]").find("'x' is not an integer scalar argument"), std::string::npos);
  EXPECT_NE(error_of("spec = \"copy.toml\"", "spec = \"nope.toml\"").find("nope.toml: cannot read the spec file"), std::string::npos);
  EXPECT_NE(error_of("kind = \"multi\"\n", "").find("not a multi-kernel spec"), std::string::npos);
  // A kernel spec loader refuses a multi-kernel spec, clearly.
  try {
    load_spec(dir.path() / "scale.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a multi-kernel spec"), std::string::npos);
  }
}

// ---- variants of several launches ----

namespace {

// y[r] = the sum of row r of x (M x K). Variant 0 is one launch, and runs
// only where K % 8 == 0 (as a template that needs aligned rows); variant 1
// pads x to rows of cdiv(K, 8) * 8 in scratch, then sums those (the padded
// form); variant 2 sums each row's halves into scratch, then adds them (an
// unfused form, with an i32 scalar computed from K); variant 3 (only in the
// "wrong" spec) sums the padded rows as if they were K long.
void write_rows_specs(const fs::path& d, bool with_wrong) {
  test::write(d / "rows.cpp", R"SRC(
void rowsum(kiln::program_id, const float* x, float* y, int64_t M, int64_t K) {
  for (int64_t r = 0; r < M; ++r) {
    float acc = 0;
    for (int64_t c = 0; c < K; ++c) acc += x[r * K + c];
    y[r] = acc;
  }
}
void pad(kiln::program_id, const float* x, float* p, int64_t M, int64_t K, int64_t Kp) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < Kp; ++c) p[r * Kp + c] = c < K ? x[r * K + c] : 0.0f;
}
void halves(kiln::program_id, const float* x, float* t, int64_t M, int64_t K, int32_t half) {
  for (int64_t r = 0; r < M; ++r) {
    float a = 0, b = 0;
    for (int64_t c = 0; c < half; ++c) a += x[r * K + c];
    for (int64_t c = half; c < K; ++c) b += x[r * K + c];
    t[2 * r] = a, t[2 * r + 1] = b;
  }
}
void add2(kiln::program_id, const float* t, float* y, int64_t M) {
  for (int64_t r = 0; r < M; ++r) y[r] = t[2 * r] + t[2 * r + 1];
}
void slowsum(kiln::program_id, const float* x, float* y, int64_t M, int64_t K) {
  for (int rep = 0; rep < 50; ++rep)
    for (int64_t r = 0; r < M; ++r) {
      float acc = 0;
      for (int64_t c = 0; c < K; ++c) acc += x[r * K + c];
      y[r] = acc;
    }
}
)SRC");
  auto kernel = [&](const std::string& file, const std::string& name, const std::string& args,
                    const std::string& extra) {
    test::write(d / file, "name = \"" + name + "\"\nbackend = \"cpu\"\nsource = \"rows.cpp\"\nentry = \"" + name +
                              "\"\ngrid = [\"1\"]\nargs = [" + args + "]\n" + extra + "[params]\nU = [1, 2]\n");
  };
  const std::string xy = R"({ name = "x", type = "f32*", size = "M*K", intent = "in" },
         { name = "y", type = "f32*", size = "M", intent = "out" }, { name = "M", type = "i64" }, { name = "K", type = "i64" })";
  kernel("rowsum8.toml", "rowsum", xy, "constraints = [\"K % 8 == 0\"]\n");
  kernel("rowsum.toml", "rowsum", xy, "");
  kernel("rowsum_a64.toml", "rowsum", xy, "constraints = [\"align_x % 64 == 0\"]\n");
  kernel("slowsum.toml", "slowsum", xy, "");
  kernel("pad.toml", "pad", R"({ name = "x", type = "f32*", size = "M*K", intent = "in" },
         { name = "p", type = "f32*", size = "M*Kp", intent = "out" }, { name = "M", type = "i64" },
         { name = "K", type = "i64" }, { name = "Kp", type = "i64" })", "");
  kernel("halves.toml", "halves", R"({ name = "x", type = "f32*", size = "M*K", intent = "in" },
         { name = "t", type = "f32*", size = "2*M", intent = "out" }, { name = "M", type = "i64" },
         { name = "K", type = "i64" }, { name = "half", type = "i32" })", "");
  kernel("add2.toml", "add2", R"({ name = "t", type = "f32*", size = "2*M", intent = "in" },
         { name = "y", type = "f32*", size = "M", intent = "out" }, { name = "M", type = "i64" })", "");
  std::string multi = R"SPEC(name = "rows"
kind = "multi"
args = [ { name = "x", type = "f32*", size = "M*K", intent = "in" },
         { name = "y", type = "f32*", size = "M", intent = "out" }, { name = "M", type = "i64" }, { name = "K", type = "i64" } ]
scratch = [ { name = "P", type = "f32*", size = "M * (cdiv(K, 8) * 8)" }, { name = "T", type = "f32*", size = "2 * M" } ]
[tuning]
key = ["M", "K"]
[[variants]]
spec = "rowsum8.toml"
args = ["x", "y", "M", "K"]
[[variants]]
steps = [ { spec = "pad.toml", args = ["x", "P", "M", "K", "cdiv(K, 8) * 8"] },
          { spec = "rowsum.toml", args = ["P", "y", "M", "cdiv(K, 8) * 8"] } ]
[[variants]]
steps = [ { spec = "halves.toml", args = ["x", "T", "M", "K", "K // 2"] },
          { spec = "add2.toml", args = ["T", "y", "M"] } ]
)SPEC";
  if (with_wrong)
    multi += R"SPEC([[variants]]
steps = [ { spec = "pad.toml", args = ["x", "P", "M", "K", "cdiv(K, 8) * 8"] },
          { spec = "rowsum.toml", args = ["P", "y", "M", "K"] } ]
)SPEC";
  test::write(d / "rows.toml", multi);
  // One variant of three launches through both scratch buffers: pad, halves of the padded rows, add.
  std::string both = multi.substr(0, multi.find("[[variants]]"));
  both.replace(both.find("name = \"rows\""), 13, "name = \"rows2\"");
  both += R"SPEC([[variants]]
steps = [ { spec = "pad.toml", args = ["x", "P", "M", "K", "cdiv(K, 8) * 8"] },
          { spec = "halves.toml", args = ["P", "T", "M", "cdiv(K, 8) * 8", "cdiv(K, 8) * 4"] },
          { spec = "add2.toml", args = ["T", "y", "M"] } ]
)SPEC";
  test::write(d / "rows2.toml", both);
  // A fast variant that needs x 64-byte aligned, and a slow one that does not.
  std::string al = multi.substr(0, multi.find("[[variants]]"));
  al.replace(al.find("name = \"rows\""), 13, "name = \"rows3\"");
  al += "[[variants]]\nspec = \"rowsum_a64.toml\"\nargs = [\"x\", \"y\", \"M\", \"K\"]\n"
        "[[variants]]\nspec = \"slowsum.toml\"\nargs = [\"x\", \"y\", \"M\", \"K\"]\n";
  test::write(d / "rows3.toml", al);
  // Two variants of the same kernel: a tie.
  std::string tie = multi.substr(0, multi.find("[[variants]]"));
  tie.replace(tie.find("name = \"rows\""), 13, "name = \"rows4\"");
  tie += "[[variants]]\nspec = \"rowsum.toml\"\nargs = [\"x\", \"y\", \"M\", \"K\"]\n"
         "[[variants]]\nspec = \"rowsum.toml\"\nargs = [\"x\", \"y\", \"M\", \"K\"]\n";
  test::write(d / "rows4.toml", tie);
}

void expect_rows(MultiKernel& k, int64_t M, int64_t K) {
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M), -1.0f);
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), static_cast<uint64_t>(M * 31 + K));
  k(x.data(), y.data(), M, K);
  for (int64_t r = 0; r < M; ++r) {
    double want = 0;
    for (int64_t c = 0; c < K; ++c) want += x[static_cast<size_t>(r * K + c)];
    ASSERT_NEAR(y[static_cast<size_t>(r)], want, 1e-4 * (1 + std::abs(want))) << "M " << M << " K " << K << " row " << r;
  }
}

// What a rows multi-kernel runs at (M, K), asked with buffers of that shape
// (their contents do not matter; these specs' choices do not follow alignment).
MultiKernel::Pick pick_rows(MultiKernel& k, int64_t M, int64_t K) {
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M));
  float *px = x.data(), *py = y.data();
  void* params[] = {&px, &py, &M, &K};
  return k.pick(params);
}

}  // namespace

TEST_F(MultiTest, AVariantOfSeveralLaunchesIsTimedAsAWholeAndRunsItsSteps) {
  write_rows_specs(dir.path(), true);
  MultiKernelSpec ms = load_multi_spec(dir.path() / "rows.toml");
  ASSERT_EQ(ms.variants.size(), 4u);
  EXPECT_EQ(ms.variants[1].steps.size(), 2u);
  EXPECT_EQ(ms.variants[1].name(), "pad + rowsum");
  opts.first_call = FirstCall::wait;  // the benchmark on the first call itself is under test
  Runtime rt(opts);
  MultiKernel k(rt, ms);
  // K = 13: variant 0 cannot run; the two forms of several launches are timed,
  // and variant 3 (the wrong one) disagrees with the first that ran (variant 1).
  expect_rows(k, 37, 13);
  std::vector<float> x(37 * 13), y(37);
  float *px = x.data(), *py = y.data();
  int64_t M = 37, K = 13;
  void* params[] = {&px, &py, &M, &K};
  MultiKernel::Pick p = k.pick(params);
  EXPECT_EQ(p.source, ChoiceSource::benchmarked);
  ASSERT_EQ(p.results.size(), 4u);
  EXPECT_EQ(p.results[0].kind, FailKind::wrong);  // no config of rowsum8 can run K = 13
  EXPECT_TRUE(p.results[1].ns && p.results[2].ns) << p.results[1].error << p.results[2].error;
  EXPECT_EQ(p.results[3].kind, FailKind::wrong);
  EXPECT_NE(p.results[3].error.find("variant 3 disagrees with variant 1 in 'y'"), std::string::npos)
      << p.results[3].error;
  EXPECT_TRUE(p.variant == 1 || p.variant == 2) << p.variant;
  EXPECT_EQ(p.steps.size(), 2u);
  EXPECT_EQ(p.config, p.steps[0]);
  // Each step was tuned on its own: its records are the steps' own.
  EXPECT_NE(k.running(params).what.find(" ; "), std::string::npos) << k.running(params).what;
  // Memoised calls, other shapes (K % 8 == 0 lets variant 0 in), and odd sizes.
  expect_rows(k, 37, 13);
  expect_rows(k, 5, 64);
  expect_rows(k, 1, 1);
  expect_rows(k, 200, 1001);
  // Each form forced computes the same (the scratch of the call path, the computed scalars).
  for (int v : {1, 2}) {
    Options o = opts;
    o.force_variant = v;
    Runtime rf(o);
    MultiKernel kf(rf, ms);
    expect_rows(kf, 37, 13);
    expect_rows(kf, 64, 9);
    expect_rows(kf, 3, 1);
    EXPECT_EQ(kf.pick(params).source, ChoiceSource::forced);
    EXPECT_EQ(kf.pick(params).variant, static_cast<size_t>(v));
  }
  // A new runtime takes the variant from the cache, and each step's config from its own record.
  Runtime rt2(opts);
  MultiKernel k2(rt2, ms);
  MultiKernel::Pick p2 = k2.pick(params);
  EXPECT_EQ(p2.source, ChoiceSource::cache);
  EXPECT_EQ(p2.variant, p.variant);
  EXPECT_EQ(p2.steps, p.steps);
  expect_rows(k2, 37, 13);
}

TEST_F(MultiTest, AVariantOfSeveralLaunchesIsNeverTheSafeChoice) {
  // Under KILN_FIRST_CALL=swap a shape that no one-launch variant can run is
  // tuned before the call returns; one that variant 0 can run starts on it.
  write_rows_specs(dir.path(), false);
  opts.first_call = FirstCall::swap;
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(dir.path() / "rows.toml"));
  expect_rows(k, 20, 11);
  EXPECT_EQ(pick_rows(k, 20, 11).source, ChoiceSource::benchmarked);
  EXPECT_NE(pick_rows(k, 20, 11).variant, 0u);
  expect_rows(k, 20, 16);
  MultiKernel::Pick p = pick_rows(k, 20, 16);
  EXPECT_TRUE(p.source == ChoiceSource::safe || p.source == ChoiceSource::tuned) << choice_source_name(p.source);
}

// A variant through two scratch buffers on a thread whose 8 slots are full,
// one of them a dead owner's: the launch's second buffer never evicts its
// first (they would alias, and the sums come out wrong).
TEST_F(MultiTest, AVariantsScratchBuffersNeverEvictEachOther) {
  write_rows_specs(dir.path(), false);
  Options so = opts;
  so.force_variant = 1;  // softmax's variant with scratch
  Runtime rs(so);
  MultiKernelSpec soft = load_multi_spec(test::kernels() + "/cpu/softmax_multi.toml");
  std::vector<std::unique_ptr<MultiKernel>> ks;
  for (int i = 0; i < 8; ++i) {
    ks.push_back(std::make_unique<MultiKernel>(rs, soft));
    expect_softmax(*ks.back(), 4, 16);  // slot i of this thread
  }
  ks[1].reset();
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(dir.path() / "rows2.toml"));
  for (int64_t K : {13, 100, 1001, 7}) expect_rows(k, 33, K);
  for (size_t i = 0; i < ks.size(); ++i)
    if (ks[i]) expect_softmax(*ks[i], 6, 16);
  expect_rows(k, 50, 3000);
}

// A choice made for an aligned buffer is not reused for the same shape with
// the buffer aligned less: the call is decided again (the record's variant
// cannot run it, so the variants are benchmarked on it).
TEST_F(MultiTest, AChoiceForAlignedBuffersIsNotReusedForLessAlignedOnes) {
  write_rows_specs(dir.path(), false);
  opts.first_call = FirstCall::wait;
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(dir.path() / "rows3.toml"));
  const int64_t M = 40, K = 300;
  std::vector<float> store(M * K + 64), y(M);
  float* aligned = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(store.data()) + 255) / 256 * 256);
  fill_random(DType::f32, std::as_writable_bytes(std::span(aligned, M * K + 1)), 5);
  auto run = [&](float* x) {
    int64_t m = M, kk = K;
    float* py = y.data();
    void* params[] = {&x, &py, &m, &kk};
    k.launch(params);
    for (int64_t r = 0; r < M; ++r) {
      double want = 0;
      for (int64_t c = 0; c < K; ++c) want += x[r * K + c];
      EXPECT_NEAR(y[static_cast<size_t>(r)], want, 1e-3 * (1 + std::abs(want))) << r;
    }
    return k.pick(params).variant;
  };
  EXPECT_EQ(run(aligned), 0u) << "the fast variant, 50 times faster";
  EXPECT_EQ(run(aligned + 1), 1u) << "x 4-byte aligned: the variant that needs 64 bytes cannot run";
  EXPECT_EQ(run(aligned), 0u);
}

// Timed with a cache flush before each run, variants within 2% of the fastest
// are timed again with a warm cache, which decides among them; each says so in
// its result's detail, and the choice is one of them.
TEST_F(MultiTest, VariantsTiedAfterAFlushAreToldApartWithAWarmCache) {
  write_rows_specs(dir.path(), false);
  opts.first_call = FirstCall::wait;
  opts.bench_flush = true;
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(dir.path() / "rows4.toml"));
  int ties = 0;
  for (int64_t M : {64, 100, 200, 300, 400, 500}) {
    expect_rows(k, M, 2000);
    MultiKernel::Pick p = pick_rows(k, M, 2000);
    ASSERT_EQ(p.results.size(), 2u);
    ASSERT_TRUE(p.results[0].ns && p.results[1].ns);
    const double a = *p.results[0].ns, b = *p.results[1].ns, fast = std::min(a, b);
    const bool tied = std::max(a, b) <= fast * 1.02;
    for (const auto& r : p.results)
      EXPECT_EQ(r.detail.find("with a warm cache") != std::string::npos, tied) << a << " " << b << " " << r.detail;
    if (tied) ++ties;
    else EXPECT_EQ(*p.results[p.variant].ns, fast) << "no tie: the fastest after a flush";
  }
  std::cout << "[ INFO     ] " << ties << " of 6 shapes tied within 2%\n";
}

TEST_F(MultiTest, StepSpecErrors) {
  write_rows_specs(dir.path(), false);
  std::string good = *read_file(dir.path() / "rows.toml");
  auto error_of = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    EXPECT_NE(t.find(from), std::string::npos) << from;
    t.replace(t.find(from), from.size(), to);
    test::write(dir.path() / "bad.toml", t);
    try {
      load_multi_spec(dir.path() / "bad.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A step reads scratch no earlier step wrote.
  EXPECT_NE(error_of(R"({ spec = "add2.toml", args = ["T", "y", "M"] })", R"({ spec = "add2.toml", args = ["P", "y", "M"] })")
                .find("scratch 'P' passed as 't', which the kernel reads; scratch starts undefined (no earlier step writes it)"),
            std::string::npos);
  // An expression where a buffer goes; a bad expression; an unknown symbol in one.
  EXPECT_NE(error_of(R"(args = ["x", "T", "M", "K", "K // 2"])", R"(args = ["x", "K + 1", "M", "K", "K // 2"])")
                .find("'K + 1' is neither an argument nor a scratch buffer"),
            std::string::npos);
  EXPECT_NE(error_of(R"("K // 2"])", R"("K // "])").find("nor an expression of the integer scalars"),
            std::string::npos);
  EXPECT_NE(error_of(R"("K // 2"])", R"("Q // 2"])").find("Q"), std::string::npos);
  // A step reads our output before any step writes it.
  EXPECT_NE(error_of(R"({ spec = "add2.toml", args = ["T", "y", "M"] })", R"({ spec = "add2.toml", args = ["y", "y", "M"] })")
                .find("'y' (intent = \"out\") passed as 't', which the kernel reads, and no earlier step writes it"),
            std::string::npos);
  // steps beside spec, and empty steps.
  EXPECT_NE(error_of("[[variants]]\nsteps = [ { spec = \"halves.toml\"", "[[variants]]\nspec = \"x.toml\"\nsteps = [ { spec = \"halves.toml\"")
                .find("lists them under steps alone"),
            std::string::npos);
  EXPECT_NE(error_of(R"(steps = [ { spec = "halves.toml", args = ["x", "T", "M", "K", "K // 2"] },
          { spec = "add2.toml", args = ["T", "y", "M"] } ])", "steps = []").find("steps is empty"),
            std::string::npos);
}

// ---- size hints ----

namespace {

const char* kMM = R"SPEC(name = "mm"
backend = "cpu"
source = "mm.cpp"
entry = "mm"
grid = ["cdiv(M, BM)"]
args = [ { name = "A", type = "f32*", size = "M*K", intent = "in" },
         { name = "B", type = "f32*", size = "K*N", intent = "in" },
         { name = "C", type = "f32*", size = "M*N", intent = "out" },
         { name = "M", type = "i64" }, { name = "N", type = "i64" }, { name = "K", type = "i64" } ]
[params]
BM = [1, 8]
[tuning]
key = ["M", "N", "K"]
hints = { M = [16, 64], N = [16, 64], K = [16, 64] }
)SPEC";

const char* kMMSource = R"SRC(
void mm(kiln::program_id pid, const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
  for (int64_t i = pid.x * BM; i < (pid.x + 1) * BM && i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += A[i * K + k] * B[k * N + j];
      C[i * N + j] = acc;
    }
}
)SRC";

}  // namespace

TEST_F(MultiTest, SizeHintsPickTheNearestHintPointWithoutBenchmarkingOnTheCallPath) {
  test::write(dir.path() / "mm.cpp", kMMSource);
  test::write(dir.path() / "mm.toml", kMM);
  KernelSpec s = load_spec(dir.path() / "mm.toml");
  Runtime rt(opts);
  SizeHintMultiKernel k(rt, s);
  k.prepare();
  ASSERT_EQ(k.hint_points().size(), 2u);
  EXPECT_EQ(k.hint_points()[1].values, (std::vector<int64_t>{64, 64, 64}));
  EXPECT_EQ(k.nearest({16, 16, 16}), 0u);
  EXPECT_EQ(k.nearest({20, 20, 20}), 0u);
  EXPECT_EQ(k.nearest({40, 40, 40}), 1u);
  EXPECT_EQ(k.nearest({32, 32, 32}), 1u);   // a tie goes to the larger hint point
  EXPECT_EQ(k.nearest({8, 8, 500}), 0u);    // L1 over log2: 3 * 1 for 16 vs 2 * 3 + 3 for 64
  EXPECT_EQ(k.nearest({1, 1, 4096}), 0u);
  EXPECT_EQ(k.nearest({64, 64, 1}), 1u);   // 0 + 0 + 6 vs 2 + 2 + 4
  size_t records = rt.tuning_cache()->count();
  for (int64_t n : {5, 20, 33, 64, 90}) {
    std::vector<float> A(n * n), B(n * n), C(n * n);
    fill_random(DType::f32, std::as_writable_bytes(std::span(A)), 1);
    fill_random(DType::f32, std::as_writable_bytes(std::span(B)), 2);
    k(A.data(), B.data(), C.data(), n, n, n);
    for (int64_t i = 0; i < n; i += 3) {
      double ref = 0;
      for (int64_t x = 0; x < n; ++x) ref += double(A[i * n + x]) * B[x * n + (i % n)];
      ASSERT_NEAR(C[i * n + (i % n)], ref, 1e-3);
    }
    float *a = A.data(), *b = B.data(), *c = C.data();
    void* params[] = {&a, &b, &c, &n, &n, &n};
    EXPECT_EQ(k.config_for(params), k.hint_points()[k.nearest({n, n, n})].config);
  }
  EXPECT_EQ(rt.tuning_cache()->count(), records) << "a call tuned something";
  EXPECT_EQ(k.retuned(), 0u);
}

TEST_F(MultiTest, GridHintPointsAndBackgroundRetuningOfAHotShape) {
  test::write(dir.path() / "mm.cpp", kMMSource);
  std::string toml = kMM;
  toml += "hint_points = \"grid\"\n";
  test::write(dir.path() / "mm.toml", toml);
  KernelSpec s = load_spec(dir.path() / "mm.toml");
  Runtime rt(opts);
  SizeHintOptions o;
  o.retune_after = 3;
  SizeHintMultiKernel k(rt, s, o);
  EXPECT_EQ(k.hint_points().size(), 8u);
  EXPECT_EQ(k.nearest({16, 64, 16}), 2u);
  int64_t n = 24;
  std::vector<float> A(n * n, 1), B(n * n, 1), C(n * n);
  for (int call = 0; call < 5; ++call) {
    k(A.data(), B.data(), C.data(), n, n, n);
    ASSERT_EQ(C[n + 1], static_cast<float>(n));
  }
  EXPECT_EQ(k.retuned(), 1u);  // waits for the background tuning
  // The shape now runs its own exactly tuned config.
  HostArgs exact(s, parse_scalars(s, {{"M", "24"}, {"N", "24"}, {"K", "24"}}));
  TuneOutcome t = rt.tune(s, exact.params());
  EXPECT_TRUE(t.from_cache);
  float *a = A.data(), *b = B.data(), *c = C.data();
  void* params[] = {&a, &b, &c, &n, &n, &n};
  EXPECT_EQ(k.config_for(params), *t.record.best);
  k(A.data(), B.data(), C.data(), n, n, n);
  EXPECT_EQ(C[n + 1], static_cast<float>(n));
}

// The memo holds a fixed number of shapes: over many distinct shapes it
// evicts, stays within its capacity, and every lookup that answers answers
// right, also while another thread inserts.
TEST(ShapeMemo, StaysWithinItsCapacityAndAnswersRightUnderInserts) {
  ShapeMemo<const int64_t*> memo(2, 256);
  static int64_t values[100000];
  for (int64_t i = 0; i < 100000; ++i) values[i] = i;
  std::atomic<bool> stop{false};
  std::atomic<long> wrong{0}, hits{0};
  std::thread reader([&] {
    int64_t k[2];
    while (!stop) {
      for (int64_t i = 0; i < 100000; i += 7) {
        k[0] = i;
        k[1] = -i;
        const int64_t* v;
        if (memo.find(k, &v)) {
          ++hits;
          if (*v != i) ++wrong;
        }
      }
    }
  });
  for (int64_t i = 0; i < 100000; ++i) {
    int64_t k[2] = {i, -i};
    std::lock_guard<std::mutex> g(memo.mutex());
    memo.insert(k, &values[i]);
  }
  stop = true;
  reader.join();
  std::lock_guard<std::mutex> g(memo.mutex());
  EXPECT_LE(memo.size(), memo.capacity());
  EXPECT_GE(memo.evictions(), 100000u - memo.capacity());
  EXPECT_EQ(wrong.load(), 0);
  int64_t last[2] = {99999, -99999};
  const int64_t* v;
  ASSERT_TRUE(memo.find(last, &v));
  EXPECT_EQ(*v, 99999);
}

// A size-hint multi-kernel over many shapes remembers a bounded number and
// re-decides an evicted one, the same way.
TEST_F(MultiTest, ManyShapesThroughOneHandleStayBounded) {
  test::write(dir.path() / "mm.cpp", kMMSource);
  test::write(dir.path() / "mm.toml", kMM);
  KernelSpec s = load_spec(dir.path() / "mm.toml");
  opts.memo_capacity = 64;
  Runtime rt(opts);
  SizeHintMultiKernel k(rt, s);
  std::vector<float> A(4 * 4, 1), B(4 * 4, 1), C(4 * 4);
  for (int64_t n = 1; n <= 3000; ++n) {
    int64_t M = 1 + n % 4, N = 1 + n % 3, K = n;  // distinct shapes; K only sizes B and A
    A.resize(M * K, 1), B.resize(K * N, 1), C.resize(M * N);
    k(A.data(), B.data(), C.data(), M, N, K);
    ASSERT_EQ(C[0], static_cast<float>(K));
  }
  EXPECT_EQ(rt.tuning_cache()->count(), 2u) << "only the hint points were tuned";
}

// Red-team 1 for the size-hint handle: the nearest hint's config cannot run
// a shape (its constraint is false there): another is picked, never launched wrong.
TEST_F(MultiTest, ASizeHintPickIsCheckedAgainstTheCall) {
  test::write(dir.path() / "blk.cpp", R"SRC(
void blk(kiln::program_id pid, const float* x, float* y, int64_t) {
  for (int64_t i = pid.x * BS; i < (pid.x + 1) * BS; ++i) y[i] = x[i] + 1;
}
)SRC");
  test::write(dir.path() / "blk.toml", R"SPEC(name = "blk"
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
[tuning]
key = ["N"]
hints = { N = [65536] }
)SPEC");
  KernelSpec s = load_spec(dir.path() / "blk.toml");
  Runtime rt(opts);
  SizeHintMultiKernel k(rt, s);
  for (int64_t n : {65536, 100, 12}) {
    std::vector<float> x(n), y(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
    k(x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] + 1) << "N=" << n;
  }
}

// KILN_FIRST_CALL=swap on a multi-kernel: the first call runs a variant's
// safe choice at once; the variants are tuned and benchmarked behind it, and
// the winner replaces it exactly once; every result is right meanwhile.
TEST_F(MultiTest, AMultiKernelRunsASafeVariantWhileItsVariantsAreTuned) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cpu/softmax_multi.toml");
  opts.first_call = FirstCall::swap;
  Runtime rt(opts);
  MultiKernel k(rt, ms);
  std::vector<float> x(64 * 512), y(64 * 512);
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 11);
  int64_t M = 64, N = 512;
  float *px = x.data(), *py = y.data();
  void* params[] = {&px, &py, &M, &N};
  expect_softmax(k, 64, 512);
  EXPECT_EQ(k.pick(params).source, ChoiceSource::safe);
  ChoiceSource last = ChoiceSource::safe;
  int changes = 0;
  while (rt.tunings_pending() > 0) {
    expect_softmax(k, 64, 512);
    ChoiceSource now = k.pick(params).source;
    if (now != last) ++changes, last = now;
  }
  rt.wait_tuned();
  expect_softmax(k, 64, 512);
  if (k.pick(params).source != last) ++changes;
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(k.pick(params).source, ChoiceSource::tuned);
  Runtime rt2(opts);
  MultiKernel k2(rt2, ms);
  EXPECT_EQ(k2.pick(params).source, ChoiceSource::cache);
}
