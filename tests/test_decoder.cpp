// The decoder layer as a program (the decoder-layer issue): two sizes (T bound
// from x, CAP from the cache), a scalar given at each call (S, the tokens the
// cache holds), the KV cache as state the program updates in place; the cpu
// layer checked against its double-precision reference over a prefill and a
// decode loop, a wrongly wired layer caught, bad calls refused with the reason.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/fsutil.hpp"
#include "kiln/args.hpp"
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
