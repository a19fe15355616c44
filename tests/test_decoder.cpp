// The decoder layer as a program (the decoder-layer issue): two sizes (T bound
// from x, CAP from the cache), a scalar given at each call (S, the tokens the
// cache holds), the KV cache as state the program updates in place; the cpu
// layer checked against its double-precision reference over a prefill and a
// decode loop, a wrongly wired layer caught, bad calls refused with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/fsutil.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/kernel.hpp"
#include "kiln/program.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct DecoderTest : ::testing::Test {
  TempDir dir{"kiln-decoder"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.workers = 1;
    opts.first_call = FirstCall::wait;
  }
};

fs::path layer_file() { return fs::path(test::kernels()) / "programs" / "decoder_cpu.toml"; }

// The layer's inputs at the cpu form's width, host memory (the cpu device's).
struct Layer {
  static constexpr int64_t H = 512, HQ = 4, HKV = 2, QKV = 1024, I = 1024;
  int64_t cap;
  std::vector<float> g1, wqkv, wo, g2, wg, wu, wd, kc, vc;
  explicit Layer(int64_t capacity) : cap(capacity) {
    auto fill = [](std::vector<float>& v, size_t n, uint64_t seed, float scale) {
      v.resize(n);
      fill_random(DType::f32, std::as_writable_bytes(std::span(v)), seed);
      for (auto& x : v) x *= scale;
    };
    fill(g1, H, 1, 1), fill(g2, H, 2, 1);
    fill(wqkv, QKV * H, 3, 0.05f), fill(wo, H * HQ * 128, 4, 0.05f);
    fill(wg, I * H, 5, 0.05f), fill(wu, I * H, 6, 0.05f), fill(wd, H * I, 7, 0.05f);
    fill(kc, cap * HKV * 128, 8, 1), fill(vc, cap * HKV * 128, 9, 1);  // rows past S: stale, never read
  }
  std::vector<Tensor> inputs(std::vector<float>& x, int64_t T) {
    return {{x.data(), {T, H}},          {g1.data(), {H}},     {wqkv.data(), {QKV, H}},
            {wo.data(), {H, HQ * 128}},  {g2.data(), {H}},     {wg.data(), {I, H}},
            {wu.data(), {I, H}},         {wd.data(), {H, I}},  {kc.data(), {cap, HKV, 128}},
            {vc.data(), {cap, HKV, 128}}};
  }
};

// A prefill of 9 tokens, then decode steps (T = 1, S growing by one), then 4
// tokens more: every call checked against the reference (y and both caches as
// the call left them), the cache carried from call to call as an engine does.
TEST_F(DecoderTest, TheCpuLayerMatchesItsReferenceOverAPrefillAndADecodeLoop) {
  Runtime rt(opts);
  Program prog(rt, load_program(layer_file()));
  Layer L(40);
  int64_t S = 0;
  for (int64_t T : {9, 1, 1, 1, 4}) {
    std::vector<float> x(static_cast<size_t>(T * Layer::H)), y(x.size(), -7);
    fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 100 + S);
    ProgramCheck c = prog.check(L.inputs(x, T), {{y.data(), {T, Layer::H}}}, nullptr, {S});
    ASSERT_EQ(c.outputs.size(), 3u) << c.str();  // y, k_cache, v_cache
    EXPECT_EQ(c.outputs[1].name, "k_cache");
    EXPECT_TRUE(c.ok()) << "T=" << T << " S=" << S << "\n" << c.str();
    EXPECT_NE(y[0], -7.0f);
    S += T;
  }
  EXPECT_EQ(S, 16);
  // Shapes by bucket of S: (T 9, S 0), then T 1 at S 9, 10, 11 (one plan: S's bucket is 16), T 4 at 12.
  EXPECT_EQ(prog.stats().plans, 3u);
}

// The same layer with the RoPE step told the wrong position (S + 1): the keys
// land one row late and turn by the wrong angle; the check names the cache and
// the output, not a pass.
TEST_F(DecoderTest, TheCheckCatchesALayerWritingTheCacheAtTheWrongPosition) {
  std::string text = read_file(layer_file()).value();
  const std::string step = R"(args   = ["qkv", "q", "k_cache", "v_cache", "T", "S", "CAP", "HQ", "HKV", "500000"])";
  ASSERT_NE(text.find(step), std::string::npos);
  text.replace(text.find(step), step.size(),
               R"(args   = ["qkv", "q", "k_cache", "v_cache", "T", "S + 1", "CAP", "HQ", "HKV", "500000"])");
  Runtime rt(opts);
  Program prog(rt, parse_program(text, layer_file()));
  Layer L(16);
  const int64_t T = 3, S = 5;
  std::vector<float> x(static_cast<size_t>(T * Layer::H)), y(x.size());
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 5);
  ProgramCheck c = prog.check(L.inputs(x, T), {{y.data(), {T, Layer::H}}}, nullptr, {S});
  EXPECT_FALSE(c.ok()) << c.str();
  ASSERT_EQ(c.outputs.size(), 3u);
  EXPECT_GT(c.outputs[0].bad, 0u) << c.str();  // y: attention saw a stale key where the new one belongs
  EXPECT_GT(c.outputs[1].bad, 0u) << c.str();  // k_cache
  EXPECT_EQ(c.outputs[1].worst.rfind("k_cache[", 0), 0u) << c.outputs[1].worst;
  EXPECT_GT(c.outputs[2].bad, 0u) << c.str();  // v_cache: the values one row late
}

// Cells (docs/program.md, "Cells"): a decode loop whose calls run sized for their bucket of
// S (KILN_PROGRAM_CELLS=always: also without graphs, as on the cpu), the exact S in a word the
// kernels read, gives the exact launches' outputs and caches to the bit, call by call, over
// three buckets (the last one's bound cut by the guard S + T <= CAP); a kernel that read the
// bound instead would write the cache at the wrong row. Its check against the reference passes.
TEST_F(DecoderTest, ADecodeLoopWithCellsMatchesExactLaunchesToTheBit) {
  Runtime rt(opts);
  const ProgramSpec spec = load_program(layer_file());
  ProgramOptions cells, exact;
  cells.cells = ProgramCells::always;
  exact.cells = ProgramCells::off;
  Program a(rt, spec, cells), b(rt, spec, exact);
  Layer La(24), Lb(24);
  for (int64_t S = 5; S <= 20; ++S) {
    std::vector<float> x(static_cast<size_t>(Layer::H)), ya(x.size(), -7), yb(x.size(), -9);
    fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 200 + static_cast<uint64_t>(S));
    a.run(La.inputs(x, 1), {{ya.data(), {1, Layer::H}}}, nullptr, {S});
    b.run(Lb.inputs(x, 1), {{yb.data(), {1, Layer::H}}}, nullptr, {S});
    ASSERT_EQ(ya, yb) << "S=" << S;
  }
  EXPECT_EQ(La.kc, Lb.kc);
  EXPECT_EQ(La.vc, Lb.vc);
  EXPECT_EQ(a.stats().cell_calls, 16u) << "every call at its bucket's bound: 8, 16, then 23 (CAP - T)";
  EXPECT_EQ(a.stats().plans, 3u);
  // Back to earlier buckets, and a second cache beside the first, calls alternating: each
  // shape keeps its own bound (the rows written are the call's S, not another shape's bound).
  Layer La2(24), Lb2(24);
  int n = 0;
  for (int64_t S : {6, 12, 5, 21, 7, 13}) {
    for (int which = 0; which < 2; ++which, ++n) {
      Layer& A = which ? La2 : La;
      Layer& B = which ? Lb2 : Lb;
      std::vector<float> x(static_cast<size_t>(Layer::H)), ya(x.size(), -7), yb(x.size(), -9);
      fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 500 + static_cast<uint64_t>(n));
      a.run(A.inputs(x, 1), {{ya.data(), {1, Layer::H}}}, nullptr, {S});
      b.run(B.inputs(x, 1), {{yb.data(), {1, Layer::H}}}, nullptr, {S});
      ASSERT_EQ(ya, yb) << "S=" << S << ", cache " << which;
    }
  }
  EXPECT_EQ(La.kc, Lb.kc);
  EXPECT_EQ(La2.kc, Lb2.kc);
  EXPECT_EQ(La2.vc, Lb2.vc);
  EXPECT_EQ(a.stats().cell_calls, 28u);
  EXPECT_EQ(b.stats().cell_calls, 0u);
  EXPECT_EQ(a.cells_refusal(), "");
  EXPECT_EQ(b.cells_refusal(), "cells are off (ProgramOptions::cells)");
  {
    // A call the guard refuses (S + T > CAP) says so and leaves the bucket at its bound.
    std::vector<float> x(static_cast<size_t>(Layer::H)), y(x.size());
    try {
      a.run(La.inputs(x, 1), {{y.data(), {1, Layer::H}}}, nullptr, {24});
      ADD_FAILURE() << "S = 24 with CAP = 24 was run";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("guard 'S + T <= CAP' does not hold"), std::string::npos) << e.what();
    }
    fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 8);
    std::vector<float> yb(x.size());
    a.run(La.inputs(x, 1), {{y.data(), {1, Layer::H}}}, nullptr, {22});
    b.run(Lb.inputs(x, 1), {{yb.data(), {1, Layer::H}}}, nullptr, {22});
    EXPECT_EQ(y, yb);
    EXPECT_EQ(a.stats().cell_calls, 29u);
  }
  const int64_t S = 21;
  std::vector<float> x(static_cast<size_t>(Layer::H)), y(x.size());
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 7);
  ProgramCheck c = a.check(La.inputs(x, 1), {{y.data(), {1, Layer::H}}}, nullptr, {S});
  EXPECT_TRUE(c.ok()) << c.str();
  EXPECT_EQ(a.stats().cell_calls, 30u);
}

// A cell argument (kiln_cell) is its value, or, within a CellScope that binds that value,
// the word the binding names; a value the scope does not bind is itself, and a negative one is
// refused at the launch rather than read as an address.
TEST_F(DecoderTest, ACellArgumentIsItsValueOrTheBoundWordAndNeverNegative) {
  const KernelSpec s = test::spec_in(
      dir.path() / "cellk",
      "name = \"cellk\"\nbackend = \"cpu\"\nsource = \"cellk.cpp\"\nentry = \"cellk\"\ngrid = [\"1\"]\nargs = [\n"
      "  { name = \"out\", type = \"f32*\", size = \"1\", intent = \"out\" },\n"
      "  { name = \"S\", type = \"i64\", cell = true },\n]\n",
      "cellk.cpp",
      "void cellk(kiln::program_id, float* out, int64_t S) { out[0] = static_cast<float>(kiln_cell(S)); }\n");
  Runtime rt(opts);
  Kernel k(rt, s);
  float out = 0;
  float* po = &out;
  int64_t S = 3;
  void* params[] = {&po, &S};
  k.launch(params);
  EXPECT_EQ(out, 3.0f);
  int32_t word = 9;
  const CellBinding b{3, &word};
  {
    CellScope scope(&b, 1);
    k.launch(params);
    EXPECT_EQ(out, 9.0f) << "the word, not the value the launch was sized for";
    S = 4;
    k.launch(params);
    EXPECT_EQ(out, 4.0f) << "a value the scope does not bind is itself";
  }
  S = 3;
  k.launch(params);
  EXPECT_EQ(out, 3.0f) << "out of the scope: the value";
  S = -4;
  try {
    k.launch(params);
    ADD_FAILURE() << "a negative cell argument was launched";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a cell argument is never negative"), std::string::npos) << e.what();
  }
}

// A kernel that takes the bucketed scalar but reads no cell (its spec's S without
// `cell = true`) keeps the program's launches exact: no call runs sized for its bucket,
// and the results are right.
TEST_F(DecoderTest, AKernelThatReadsNoCellKeepsTheLaunchesExact) {
  const fs::path cpu = fs::path(test::kernels()) / "cpu";
  std::string rope = read_file(cpu / "rope_cache_f32.toml").value();
  const std::string cell = R"({ name = "S", type = "i64", cell = true })";
  ASSERT_NE(rope.find(cell), std::string::npos);
  rope.replace(rope.find(cell), cell.size(), R"({ name = "S", type = "i64" })");
  fs::copy_file(cpu / "rope.cpp", dir.path() / "rope.cpp");
  write_file_atomic(dir.path() / "rope_cache_f32.toml", rope);
  std::string text = read_file(layer_file()).value();
  const std::string line = R"(rope      = "../cpu/rope_cache_f32.toml")";
  ASSERT_NE(text.find(line), std::string::npos);
  text.replace(text.find(line), line.size(), "rope = \"" + (dir.path() / "rope_cache_f32.toml").string() + "\"");
  Runtime rt(opts);
  ProgramOptions cells;
  cells.cells = ProgramCells::always;
  Program prog(rt, parse_program(text, layer_file()), cells);
  Layer L(16);
  for (int64_t S : {5, 6}) {
    std::vector<float> x(static_cast<size_t>(Layer::H)), y(x.size());
    fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 300 + static_cast<uint64_t>(S));
    ProgramCheck c = prog.check(L.inputs(x, 1), {{y.data(), {1, Layer::H}}}, nullptr, {S});
    EXPECT_TRUE(c.ok()) << "S=" << S << "\n" << c.str();
  }
  EXPECT_EQ(prog.stats().cell_calls, 0u);
  EXPECT_EQ(prog.cells_refusal(), "kernel 'rope_cache_f32' takes a bucketed scalar that it reads from no cell");
}

// A call without its scalar, a cache too short for S + T, and a program whose
// step writes an input not declared state are refused, each saying why.
TEST_F(DecoderTest, BadCallsAndSpecsAreRefusedWithTheReason) {
  Runtime rt(opts);
  Program prog(rt, load_program(layer_file()));
  Layer L(8);
  const int64_t T = 2;
  std::vector<float> x(static_cast<size_t>(T * Layer::H)), y(x.size());
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { prog.run(L.inputs(x, T), {{y.data(), {T, Layer::H}}}); });
  EXPECT_NE(m.find("takes 1 scalars (S)"), std::string::npos) << m;
  m = message([&] { prog.run(L.inputs(x, T), {{y.data(), {T, Layer::H}}}, nullptr, {7}); });
  EXPECT_NE(m.find("guard 'S + T <= CAP' does not hold"), std::string::npos) << m;
  EXPECT_NE(m.find("S=7"), std::string::npos) << m;
  // The same call in bounds runs.
  EXPECT_EQ(message([&] { prog.run(L.inputs(x, T), {{y.data(), {T, Layer::H}}}, nullptr, {6}); }), "no error");
  // S = 7 shares S = 6's bucket (8), so its shape is found and set again for it: refused the
  // same way, twice (a call refused half way leaves nothing to run stale arguments with).
  for (int i = 0; i < 2; ++i) {
    m = message([&] { prog.run(L.inputs(x, T), {{y.data(), {T, Layer::H}}}, nullptr, {7}); });
    EXPECT_NE(m.find("guard 'S + T <= CAP' does not hold"), std::string::npos) << m;
  }
  EXPECT_EQ(message([&] { prog.run(L.inputs(x, T), {{y.data(), {T, Layer::H}}}, nullptr, {5}); }), "no error");

  std::string text = read_file(layer_file()).value();
  const std::string state = "shape = [\"CAP\", \"HKV\", \"128\"]\nstate = true\n";
  ASSERT_NE(text.find(state), std::string::npos);
  text.replace(text.find(state), state.size(), "shape = [\"CAP\", \"HKV\", \"128\"]\n");
  m = message([&] { parse_program(text, layer_file()); });
  EXPECT_NE(m.find("writes 'k_cache' ('k_cache'), an input of the program; inputs are read only"), std::string::npos)
      << m;
  std::string fill = read_file(layer_file()).value();
  fill.replace(fill.find("fill = { scale = 0.05 }"), 23, "fill = { scale = -1 }");
  m = message([&] { parse_program(fill, layer_file()); });
  EXPECT_NE(m.find("fill: a finite number, more than 0"), std::string::npos) << m;
}

}  // namespace

namespace {

// RoPE with the cache write, then attention over the cache, on the GPU (8 query heads,
// 2 KV heads): S bucketed by powers of two. The attention is the whole handle the decoder
// uses (attention_bf16.toml). cuDNN, which builds a plan per (T, S) and reads S from the call,
// is no choice for these buckets of many S (Library::plans_per_shape): before that rule its
// tuning chose cuDNN at T = 1 for S up to 128 on an H200, and this test captured a graph each S.
std::string attention_program() {
  std::string t = R"(kind = "program"
version = 1
name = "rope_attention"
backend = "cuda"
constants = { HQ = 8, HKV = 2 }
symbols = ["T", "CAP"]
scalars = ["S"]
buckets = { S = "pow2" }
guards = ["S + T <= CAP"]
[[inputs]]
name = "qkv"
dtype = "bf16"
shape = ["T", "(HQ + 2 * HKV) * 128"]
[[inputs]]
name = "k_cache"
dtype = "bf16"
shape = ["CAP", "HKV", "128"]
state = true
[[inputs]]
name = "v_cache"
dtype = "bf16"
shape = ["CAP", "HKV", "128"]
state = true
[[outputs]]
name = "o"
dtype = "bf16"
shape = ["T", "HQ * 128"]
[[buffers]]
name = "q"
dtype = "bf16"
shape = ["T", "HQ * 128"]
[kernels]
rope = "KERNELS/cuda/rope_cache_bf16.toml"
attention = "KERNELS/cuda/attention_bf16.toml"
[[steps]]
launch = "rope"
args = ["qkv", "q", "k_cache", "v_cache", "T", "S", "CAP", "HQ", "HKV", "500000"]
[[steps]]
launch = "attention"
args = ["q", "k_cache", "v_cache", "o", "T", "S", "CAP", "HQ", "HKV"]
)";
  for (size_t at; (at = t.find("KERNELS")) != std::string::npos;) t.replace(at, 7, test::kernels());
  return t;
}

}  // namespace

// A decode loop (T = 1, S from 5 to 70, then back to 6, 40, 12 and 66) with graphs, beside
// the same program without them, on the same inputs. With cells off, within a bucket of S the graph is set to each
// call's S in place (no capture: one a bucket at most, five buckets), and every step's
// output and the caches it leaves are the plain launches' to the bit. With cells (the
// default), the graph is sized for the bucket and a call sets one word: the caches are the
// plain launches' to the bit, the output within bf16's rounding (a split of the cache made
// for the bucket's largest S may sum in another order).
TEST_F(DecoderTest, ADecodeLoopUpdatesOneGraphABucketAndMatchesPlainLaunches) {
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  const ProgramSpec spec = parse_program(attention_program(), dir.path() / "p.toml");
  ProgramOptions plain, updated, celled;
  plain.graphs = false;
  updated.cells = ProgramCells::off;
  celled.cells = ProgramCells::graphs;
  Program cells(rt, spec, celled), with(rt, spec, updated), without(rt, spec, plain);
  const int64_t CAP = 80, W = (8 + 2 * 2) * 128, CB = CAP * 2 * 128 * 2, OB = 8 * 128 * 2;
  std::vector<std::byte> cache(static_cast<size_t>(CB));
  fill_random(DType::bf16, cache, 1);
  DeviceBuffer qkv(dev, W * 2), k1(dev, CB), v1(dev, CB), k2(dev, CB), v2(dev, CB), o1(dev, OB), o2(dev, OB);
  DeviceBuffer k3(dev, CB), v3(dev, CB), o3(dev, OB);
  for (void* p : {k1.get(), v1.get(), k2.get(), v2.get(), k3.get(), v3.get()})
    dev.to_device(p, cache.data(), cache.size(), nullptr);
  std::vector<std::byte> x(static_cast<size_t>(W * 2)), r1(OB), r2(OB), r3(OB);
  double worst = 0;
  std::vector<int64_t> Ss;
  for (int64_t S = 5; S <= 70; ++S) Ss.push_back(S);
  for (int64_t S : {6, 40, 12, 66}) Ss.push_back(S);  // back to earlier buckets: each keeps its own bound
  for (int64_t S : Ss) {
    fill_random(DType::bf16, x, static_cast<uint64_t>(S));
    dev.to_device(qkv.get(), x.data(), x.size(), nullptr);
    with.run({{qkv.get(), {1, W}}, {k1.get(), {CAP, 2, 128}}, {v1.get(), {CAP, 2, 128}}}, {{o1.get(), {1, 8 * 128}}},
             nullptr, {S});
    without.run({{qkv.get(), {1, W}}, {k2.get(), {CAP, 2, 128}}, {v2.get(), {CAP, 2, 128}}},
                {{o2.get(), {1, 8 * 128}}}, nullptr, {S});
    cells.run({{qkv.get(), {1, W}}, {k3.get(), {CAP, 2, 128}}, {v3.get(), {CAP, 2, 128}}},
              {{o3.get(), {1, 8 * 128}}}, nullptr, {S});
    dev.to_host(r1.data(), o1.get(), r1.size(), nullptr);
    dev.to_host(r2.data(), o2.get(), r2.size(), nullptr);
    dev.to_host(r3.data(), o3.get(), r3.size(), nullptr);
    ASSERT_EQ(r1, r2) << "S=" << S;
    for (size_t i = 0; i < r2.size(); i += 2) {
      uint16_t a = 0, b = 0;
      std::memcpy(&a, &r2[i], 2);
      std::memcpy(&b, &r3[i], 2);
      const double d = std::abs(static_cast<double>(bf16_bits_to_f32(a)) - bf16_bits_to_f32(b));
      worst = std::max(worst, d);
      ASSERT_LE(d, 2e-2) << "S=" << S << ", element " << i / 2;
    }
  }
  std::vector<std::byte> c1(cache.size()), c2(cache.size()), c3(cache.size());
  for (auto [a, b] : {std::pair{k1.get(), k3.get()}, std::pair{v1.get(), v3.get()}}) {
    dev.to_host(c1.data(), a, c1.size(), nullptr);
    dev.to_host(c3.data(), b, c3.size(), nullptr);
    EXPECT_EQ(c1, c3);
  }
  dev.to_host(c1.data(), k1.get(), c1.size(), nullptr);
  dev.to_host(c2.data(), k2.get(), c2.size(), nullptr);
  EXPECT_EQ(c1, c2);
  const Program::Stats st = with.stats(), sc = cells.stats();
  EXPECT_LE(st.graph_captures, 5u) << "buckets 8, 16, 32, 64 and 128 of S: one capture each at most";
  EXPECT_GE(st.graph_updates, 40u);
  EXPECT_GE(st.graph_replays, st.graph_updates);
  EXPECT_EQ(st.cell_calls, 0u);
  EXPECT_EQ(without.stats().graph_replays, 0u);
  EXPECT_LE(sc.graph_captures, 5u);
  EXPECT_GE(sc.cell_calls, 55u) << "the first call of each bucket decides; the rest run sized for it";
  EXPECT_GE(sc.graph_updates, 40u) << "a word set for each new S";
  // at most one cell call a bucket runs outside a graph: a multi-kernel's choice at the bound is
  // made by a launch outside a capture first (run on an H200: 65 cell calls, 64 replays)
  EXPECT_GE(sc.graph_replays + sc.graph_captures, sc.cell_calls);
  std::cout << "[  NOTE    ] 70 calls: " << st.graph_captures << " graphs captured, " << st.graph_updates
            << " updated in place, " << st.graph_replays << " replayed; with cells " << sc.graph_captures
            << " captured, " << sc.cell_calls << " calls sized for their bucket, " << sc.graph_updates
            << " words set; the largest difference from plain launches " << worst << "\n";
}

namespace {

// got within bf16's rounding of want (twice its half ulp), and a little more for fp32's sums.
::testing::AssertionResult bf16_close(double got, double want) {
  if (std::abs(got - want) <= std::abs(want) * 0x1p-7 + 1e-4) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want;
}

}  // namespace

// RoPE with the cache write (rope_cache_bf16.toml) on the GPU, each config alone (its space
// narrowed to it, so no tuning can pass it over), against the computation in double on the same
// bf16 inputs: one token over an empty and a long cache, a prompt of 130 tokens, a position past
// 10^5 (the angle reduced in double), one KV head for all, and head counts a block's heads do
// not divide (24 and 12 heads a token: blocks with idle threads). The queries and the turned
// keys within bf16's rounding, the values copied to the bit, every other row of the caches left
// as it was.
TEST_F(DecoderTest, RopeOnTheGpuMatchesAPlainComputationInEveryConfig) {
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  struct Shape {
    int64_t T, S, HQ, HKV;
  };
  const double theta = 500000;
  for (int V : {0, 1})
    for (int HB : {1, 4, 8, 16, 32}) {
      if (V == 1 && HB % 8 != 0) continue;  // the spec's constraint: eight heads a round
      const std::string cfg = "HB = [" + std::to_string(HB) + "]\nV = [" + std::to_string(V) + "]\n";
      KernelSpec spec;
      ASSERT_NO_FATAL_FAILURE(test::one_config_spec("rope_cache_bf16.toml", cfg, spec));
      Kernel k(rt, spec);
      for (const Shape& sh : std::vector<Shape>{
               {1, 0, 32, 8}, {1, 1023, 32, 8}, {3, 5, 8, 2}, {130, 7, 32, 8}, {2, 100000, 4, 1}, {1, 0, 8, 8},
               {5, 40, 6, 3}}) {
        SCOPED_TRACE(testing::Message() << "HB=" << HB << " V=" << V << " T=" << sh.T << " S=" << sh.S
                                        << " HQ=" << sh.HQ << " HKV=" << sh.HKV);
        const int64_t CAP = sh.S + sh.T + 3, heads = sh.HQ + 2 * sh.HKV;
        std::vector<ScalarValue> sc(spec.args.size());
        const int64_t vals[] = {sh.T, sh.S, CAP, sh.HQ, sh.HKV};
        for (size_t i = 4; i < 9; ++i) sc[i].i = vals[i - 4];
        sc[9].f = theta;
        DeviceArgs args(spec, sc, dev);
        args.fill_random(static_cast<uint64_t>(sh.T * 7 + sh.S));
        const std::vector<std::byte> k0 = args.read(2), v0 = args.read(3);
        k.launch(args.params());
        dev.sync(nullptr);
        const std::vector<std::byte> qkv_bytes = args.read(0);
        const std::vector<double> qkv = test::bf16_doubles(qkv_bytes), q = test::bf16_doubles(args.read(1));
        const std::vector<std::byte> k1 = args.read(2), v1 = args.read(3);
        const std::vector<double> kc = test::bf16_doubles(k1);
        const size_t row = static_cast<size_t>(sh.HKV * 128 * 2), first = static_cast<size_t>(sh.S) * row,
                     last = static_cast<size_t>(sh.S + sh.T) * row;
        // the rows before S and past S + T - 1 left as they were; the values copied
        EXPECT_TRUE(std::equal(k1.begin(), k1.begin() + first, k0.begin()));
        EXPECT_TRUE(std::equal(k1.begin() + last, k1.end(), k0.begin() + last));
        EXPECT_TRUE(std::equal(v1.begin(), v1.begin() + first, v0.begin()));
        EXPECT_TRUE(std::equal(v1.begin() + last, v1.end(), v0.begin() + last));
        size_t bad = 0;
        for (int64_t t = 0; t < sh.T; ++t) {
          const int64_t pos = sh.S + t;
          for (int64_t h = 0; h < heads; ++h) {
            const size_t in = static_cast<size_t>((t * heads + h) * 128);
            if (h >= sh.HQ + sh.HKV) {  // a value head
              const size_t at = static_cast<size_t>((pos * sh.HKV + h - sh.HQ - sh.HKV) * 128);
              bad += !std::equal(v1.begin() + 2 * at, v1.begin() + 2 * at + 256, qkv_bytes.begin() + 2 * in);
              continue;
            }
            const size_t out = h < sh.HQ ? static_cast<size_t>((t * sh.HQ + h) * 128)
                                         : static_cast<size_t>((pos * sh.HKV + h - sh.HQ) * 128);
            const std::vector<double>& o = h < sh.HQ ? q : kc;
            for (int d = 0; d < 64; ++d) {
              const double a = static_cast<double>(pos) * std::pow(theta, -d / 64.0);
              const double x0 = qkv[in + d], x1 = qkv[in + d + 64];
              const double w0 = x0 * std::cos(a) - x1 * std::sin(a), w1 = x1 * std::cos(a) + x0 * std::sin(a);
              for (auto [got, want] : {std::pair{o[out + d], w0}, std::pair{o[out + d + 64], w1}}) {
                const auto r = bf16_close(got, want);
                if (!r && bad++ < 5) ADD_FAILURE() << "token " << t << " head " << h << " dim " << d << ": " << r.message();
              }
            }
          }
        }
        EXPECT_EQ(bad, 0u);
      }
    }
}

// The RMSNorm (rmsnorm_bf16.toml) on the GPU, each config that can run a shape alone, against
// the computation in double: one row and several, a row a block's threads cover in one piece or
// in several, a row whose last piece is short of a whole RR (H = 4104: the register form's guard),
// and rows far smaller than a block.
TEST_F(DecoderTest, TheRmsNormOnTheGpuMatchesAPlainComputationInEveryConfig) {
  if (std::string why = make_backend("cuda", Options::from_env())->unavailable_reason(); !why.empty())
    GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  const double eps = 1e-5;
  size_t ran_rr = 0;
  for (int NT : {128, 256, 512})
    for (int VEC : {1, 8})
      for (int RR : {0, 1, 2, 4, 8}) {
        if (RR > 0 && VEC != 8) continue;
        KernelSpec spec;
        ASSERT_NO_FATAL_FAILURE(test::one_config_spec(
            "rmsnorm_bf16.toml",
            "NT = [" + std::to_string(NT) + "]\nVEC = [" + std::to_string(VEC) + "]\nRR = [" + std::to_string(RR) + "]\n",
            spec));
        std::unique_ptr<Kernel> k;
        for (auto [T, H] : std::vector<std::pair<int64_t, int64_t>>{{1, 4096}, {3, 4104}, {5, 520}, {7, 4096}, {2, 8}}) {
          if (RR > 0 && !(H % 8 == 0 && H <= NT * 8 * RR && 2 * H > NT * 8 * RR)) continue;  // the spec's constraint
          if (!k) k = std::make_unique<Kernel>(rt, spec);
          ran_rr += RR > 0;
          SCOPED_TRACE(testing::Message() << "NT=" << NT << " VEC=" << VEC << " RR=" << RR << " T=" << T << " H=" << H);
          std::vector<ScalarValue> sc(spec.args.size());
          sc[3].i = T, sc[4].i = H, sc[5].f = eps;
          DeviceArgs args(spec, sc, dev);
          args.fill_random(static_cast<uint64_t>(T * 13 + H));
          k->launch(args.params());
          dev.sync(nullptr);
          const std::vector<double> x = test::bf16_doubles(args.read(0)), g = test::bf16_doubles(args.read(1)),
                                    y = test::bf16_doubles(args.read(2));
          size_t bad = 0;
          for (int64_t t = 0; t < T; ++t) {
            double ss = 0;
            for (int64_t h = 0; h < H; ++h) ss += x[t * H + h] * x[t * H + h];
            const double inv = 1 / std::sqrt(ss / static_cast<double>(H) + eps);
            for (int64_t h = 0; h < H; ++h) {
              const auto r = bf16_close(y[t * H + h], x[t * H + h] * inv * g[h]);
              if (!r && bad++ < 5) ADD_FAILURE() << "row " << t << " element " << h << ": " << r.message();
            }
          }
          EXPECT_EQ(bad, 0u);
        }
      }
  EXPECT_GE(ran_rr, 10u) << "the register form ran at too few (config, shape) pairs";
}
