// Attention over a KV cache (the decoder-layer issue): the decode attention multi-kernel
// (a split over the cache, then a combination) against a plain double-precision
// computation, on the cpu (CI) and, where there is a GPU, its bf16 cuda form.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <functional>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/fsutil.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/library.hpp"
#include "kiln/library.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/program.hpp"
#include "kiln/program_spec.hpp"
#include "kiln/tuning.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;

namespace {

struct AttentionTest : ::testing::Test {
  TempDir dir{"kiln-attn"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.workers = 1;
    opts.first_call = FirstCall::wait;
  }
};

constexpr int64_t kD = 128;

// o[i, hq] = softmax_j(q[i, hq] . k[j, hq / G] / sqrt(128)) v[j, hq / G] over j <= S + i.
std::vector<double> attention_ref(const std::vector<double>& q, const std::vector<double>& kc,
                                  const std::vector<double>& vc, int64_t T, int64_t S, int64_t HQ, int64_t HKV) {
  const int64_t G = HQ / HKV;
  std::vector<double> o(static_cast<size_t>(T * HQ * kD));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t hq = 0; hq < HQ; ++hq) {
      const int64_t h = hq / G, n = S + i + 1;
      std::vector<double> s(static_cast<size_t>(n));
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t e = 0; e < kD; ++e) d += q[(i * HQ + hq) * kD + e] * kc[(j * HKV + h) * kD + e];
        s[j] = d / std::sqrt(double(kD));
        m = std::max(m, s[j]);
      }
      for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
      for (int64_t e = 0; e < kD; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += s[j] * vc[(j * HKV + h) * kD + e];
        o[(i * HQ + hq) * kD + e] = acc / sum;
      }
    }
  return o;
}

struct Shape {
  int64_t T, S, HQ, HKV;
};
// Decode (T = 1) at an empty and a long cache, a few tokens over a cache (causal, bottom
// right), more tokens than keys before them, one KV head for all, and S across a split's edge.
const Shape kShapes[] = {{1, 0, 8, 2}, {1, 300, 8, 2}, {3, 100, 8, 2}, {16, 5, 8, 2}, {2, 63, 4, 1}, {4, 256, 8, 8}};

}  // namespace

TEST_F(AttentionTest, DecodeAttentionOnTheCpuMatchesAPlainComputationInEveryVariant) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + "/cpu/attention_decode_f32.toml");
  ASSERT_EQ(ms.variants.size(), 3u);
  for (int forced = -1; forced < 3; ++forced) {
    Options o = opts;
    if (forced >= 0) o.force_variant = forced;
    Runtime rt(o);
    MultiKernel k(rt, ms);
    for (const Shape& sh : kShapes) {
      SCOPED_TRACE(testing::Message() << "variant " << forced << " T=" << sh.T << " S=" << sh.S << " HQ=" << sh.HQ
                                      << " HKV=" << sh.HKV);
      const int64_t CAP = sh.S + sh.T + 3;
      std::vector<float> q(sh.T * sh.HQ * kD), kc(CAP * sh.HKV * kD), vc(CAP * sh.HKV * kD), out(sh.T * sh.HQ * kD, -7);
      fill_random(DType::f32, std::as_writable_bytes(std::span(q)), static_cast<uint64_t>(sh.S * 3 + sh.T), true);
      fill_random(DType::f32, std::as_writable_bytes(std::span(kc)), static_cast<uint64_t>(sh.S * 5 + 1), true);
      fill_random(DType::f32, std::as_writable_bytes(std::span(vc)), static_cast<uint64_t>(sh.S * 7 + 2));
      k(q.data(), kc.data(), vc.data(), out.data(), sh.T, sh.S, CAP, sh.HQ, sh.HKV);
      if (forced >= 0) {
        float *pq = q.data(), *pk = kc.data(), *pv = vc.data(), *po = out.data();
        int64_t T = sh.T, S = sh.S, cap = CAP, HQ = sh.HQ, HKV = sh.HKV;
        void* params[] = {&pq, &pk, &pv, &po, &T, &S, &cap, &HQ, &HKV};
        EXPECT_EQ(k.pick(params).variant, static_cast<size_t>(forced));
      }
      const std::vector<double> want = attention_ref(std::vector<double>(q.begin(), q.end()),
                                                     std::vector<double>(kc.begin(), kc.end()),
                                                     std::vector<double>(vc.begin(), vc.end()), sh.T, sh.S, sh.HQ, sh.HKV);
      size_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (!(std::abs(out[i] - want[i]) <= 1e-4 * (1 + std::abs(want[i]))) && bad++ < 3)
          ADD_FAILURE() << "o[" << i << "] = " << out[i] << ", want " << want[i];
      EXPECT_EQ(bad, 0u);
    }
  }
}

// A decode loop (T = 1, S growing by one a call): the multi-kernel's records, and its
// choice, are kept by the power of two at or above S ([tuning] buckets), so the loop
// times the variants once a doubling of the cache, not once a step (the bucket's record,
// its variants' times, is the one its first call wrote); every step still attends over
// its own S + 1 keys exactly.
TEST_F(AttentionTest, ADecodeLoopTunesOnceABucketOfTheCacheLength) {
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(test::kernels() + "/cpu/attention_decode_f32.toml"));
  const int64_t HQ = 4, HKV = 1, CAP = 160;
  std::vector<float> kc(CAP * HKV * kD), vc(CAP * HKV * kD), q(HQ * kD), o(HQ * kD);
  fill_random(DType::f32, std::as_writable_bytes(std::span(kc)), 1);
  fill_random(DType::f32, std::as_writable_bytes(std::span(vc)), 2);
  std::vector<double> first_times;  // the bucket's record: each variant's time
  for (int64_t S = 100; S <= 140; ++S) {
    fill_random(DType::f32, std::as_writable_bytes(std::span(q)), static_cast<uint64_t>(S));
    k(q.data(), kc.data(), vc.data(), o.data(), int64_t{1}, S, CAP, HQ, HKV);
    float *pq = q.data(), *pk = kc.data(), *pv = vc.data(), *po = o.data();
    int64_t T = 1, s = S, cap = CAP, hq = HQ, hkv = HKV;
    void* params[] = {&pq, &pk, &pv, &po, &T, &s, &cap, &hq, &hkv};
    const MultiKernel::Pick p = k.pick(params);
    EXPECT_EQ(p.source, ChoiceSource::benchmarked) << "S=" << S;
    std::vector<double> times;
    for (const auto& r : p.results) times.push_back(r.ns.value_or(-1));
    ASSERT_EQ(times.size(), 3u) << "S=" << S;
    if (S == 100 || S == 129) {
      if (S == 129) {
        EXPECT_NE(times, first_times) << "S=129 opens the bucket of 256: timed anew";
      }
      first_times = times;
    } else {
      EXPECT_EQ(times, first_times) << "S=" << S << " (bucket " << pow2_bucket(S) << ") was timed again";
    }
    const std::vector<double> want = attention_ref(std::vector<double>(q.begin(), q.end()),
                                                   std::vector<double>(kc.begin(), kc.end()),
                                                   std::vector<double>(vc.begin(), vc.end()), 1, S, HQ, HKV);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(o[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "S=" << S << " o[" << i << "]";
  }
}

TEST_F(AttentionTest, ACallWhoseTokensOverrunTheCacheIsRefused) {
  Runtime rt(opts);
  MultiKernel k(rt, load_multi_spec(test::kernels() + "/cpu/attention_decode_f32.toml"));
  const int64_t T = 2, S = 10, CAP = 11, HQ = 4, HKV = 1;
  std::vector<float> q(T * HQ * kD), kc(CAP * HKV * kD), vc(CAP * HKV * kD), o(T * HQ * kD);
  try {
    k(q.data(), kc.data(), vc.data(), o.data(), T, S, CAP, HQ, HKV);
    FAIL() << "S + T > CAP ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("S + T <= CAP"), std::string::npos) << e.what();
  }
}

// An attention output in bf16 against the double-precision one, at bf16's tolerance.
void expect_attention_close(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 8e-3 * std::abs(want[i]) + 4e-3) && bad++ < 3)
      ADD_FAILURE() << "o[" << i << "] = " << got[i] << ", want " << want[i];
  EXPECT_EQ(bad, 0u);
}

// One call of an attention handle (the arguments q, k_cache, v_cache, o, T, S, CAP, HQ, HKV)
// in bf16 on the GPU, against the double-precision computation on its bf16 inputs. The caches
// hold 5 rows past S + T; with nan_rows, that many rows past S + T instead, all NaN (a cache's
// rows not yet written may hold anything: they must not reach the output).
using LaunchFn = std::function<void(void* const*)>;
void check_gpu_call(Device& dev, const LaunchFn& launch, const std::string& name,
                    const std::vector<ArgSpec>& spec_args, const Shape& sh, int64_t nan_rows = 0) {
  ASSERT_EQ(spec_args.size(), 9u) << name << ": q, k_cache, v_cache, o, T, S, CAP, HQ, HKV";
  KernelSpec shape;
  shape.name = name;
  shape.args = spec_args;
  std::vector<ScalarValue> scalars(spec_args.size());
  const int64_t vals[] = {sh.T, sh.S, sh.S + sh.T + (nan_rows > 0 ? nan_rows : 5), sh.HQ, sh.HKV};
  for (size_t i = 4; i < spec_args.size(); ++i) scalars[i].i = vals[i - 4];
  DeviceArgs args(shape, scalars, dev);
  args.fill_random(static_cast<uint64_t>(sh.S * 11 + sh.T));
  if (nan_rows > 0) {
    const size_t row = static_cast<size_t>(sh.HKV * kD * 2), at = static_cast<size_t>(sh.S + sh.T) * row;
    std::vector<uint16_t> nan(static_cast<size_t>(nan_rows * sh.HKV * kD), 0x7FC0);  // bf16 quiet NaN
    for (size_t c : {1u, 2u})
      dev.to_device(static_cast<std::byte*>(args.buffer(c)) + at, nan.data(), nan.size() * 2, nullptr);
  }
  launch(args.params());
  dev.sync(nullptr);
  auto host = [&](size_t i) { return test::bf16_doubles(args.read(i)); };
  expect_attention_close(host(3), attention_ref(host(0), host(1), host(2), sh.T, sh.S, sh.HQ, sh.HKV));
}

void check_gpu_call(Device& dev, Launchable& k, const std::string& name, const std::vector<ArgSpec>& spec_args,
                    const Shape& sh, int64_t nan_rows = 0) {
  check_gpu_call(dev, [&](void* const* p) { k.launch(p); }, name, spec_args, sh, nan_rows);
}

// The bf16 cuda forms, each variant forced, against the double-precision computation on
// the bf16 inputs. `runs(v, shape)`: whether variant v takes the shape (those that do not
// are passed over when forced).
void check_gpu_attention(const Options& opts, const std::string& spec, const std::vector<Shape>& shapes,
                         const std::function<bool(size_t, const Shape&)>& runs) {
  MultiKernelSpec ms = load_multi_spec(test::kernels() + spec);
  for (int forced = -1; forced < static_cast<int>(ms.variants.size()); ++forced) {
    Options o = opts;
    if (forced >= 0) o.force_variant = forced;
    Runtime rt(o);
    Device& dev = rt.backend("cuda").device();
    MultiKernel k(rt, ms);
    for (const Shape& sh : shapes) {
      if (forced >= 0 && !runs(static_cast<size_t>(forced), sh)) continue;
      SCOPED_TRACE(testing::Message() << spec << " variant " << forced << " T=" << sh.T << " S=" << sh.S
                                      << " HQ=" << sh.HQ << " HKV=" << sh.HKV);
      check_gpu_call(dev, k, ms.name, ms.args, sh);
    }
  }
}

// Llama-3-8B's heads (32 query heads, 8 KV heads), up to a 3000-token cache.
TEST_F(AttentionTest, DecodeAttentionOnTheGpuMatchesAPlainComputationInEveryVariant) {
  std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  check_gpu_attention(opts, "/cuda/attention_decode_bf16.toml",
                      {{1, 0, 32, 8}, {1, 1024, 32, 8}, {4, 3000, 32, 8}, {16, 100, 32, 8}, {3, 70, 8, 2}},
                      [](size_t, const Shape&) { return true; });
}

// The whole attention handle, the tensor-core split and prefill included: a token over an
// empty and a long cache, a KV head's rows exactly one m16 tile (4 x 4, 2 x 8), a tile's
// edge (64, 65), tiles over a cache (S not a multiple of the key tile), more query heads
// per KV head, a block's rows past T, and a prompt over a long cache (an empty cache leaves
// most blocks of the one-launch split's clusters without keys), and a long cache (S = 8192:
// the tensor-core split's chunks of 1024 keys, whose tunings compare the configs' partial
// rows; undivided by their sums, those differed past the tolerance and the tuning chose
// none). Variants 0-4 (the split on
// the cuda cores) take T <= 16; 5-9 (the split on the tensor cores, 9 in one launch)
// T HQ / HKV <= 16.
TEST_F(AttentionTest, AttentionOnTheGpuMatchesAPlainComputationForAnyTokenCount) {
  std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  check_gpu_attention(opts, "/cuda/attention_bf16.toml",
                      {{1, 0, 32, 8}, {1, 5000, 32, 8}, {4, 777, 32, 8}, {2, 63, 8, 1}, {7, 100, 32, 8},
                       {16, 5, 8, 2}, {64, 0, 32, 8}, {65, 37, 32, 8}, {300, 0, 8, 1}, {129, 1000, 32, 8},
                       {1000, 0, 4, 2}, {1, 8192, 32, 8}},
                      [](size_t v, const Shape& sh) {
                        return v < 5 ? sh.T <= 16 : v < 10 ? sh.T * (sh.HQ / sh.HKV) <= 16 : true;
                      });
}

// The tensor-core split in one launch with its products transposed (TR = 1: the rows on the
// mma's n8 side, for T HQ / HKV <= 8; TR = 2: the same with K and V loaded into registers, one
// tile or two at a time: the two-launch split's form, outside this spec's space, checked through
// this entry, which shares its warp code), each config alone (the spec's space narrowed to it, so no tuning can
// pass it over), against the double-precision computation: one token over an empty, a short
// and a long cache, 8 rows (2 tokens of 4 heads; 1 token of 8 heads a KV head), one query head
// a KV head, and keys not a whole number of tiles; the caches' 130 rows past S + T NaN (a
// slice's last tile must not bring them into P V).
TEST_F(AttentionTest, TheTransposedSplitMatchesAPlainComputationInEveryConfig) {
  std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  if (const std::string arch = dev.info().arch; arch < "sm_90" && arch.size() == 5)
    GTEST_SKIP() << "the GPU is " << arch << ": the one-launch split's clusters need sm_90 or newer";
  for (const char* cfg :
       {"NW = [2]\nBN = [32]\nTR = [1]\nRB = [2]\nCL = [8]", "NW = [4]\nBN = [16]\nTR = [1]\nRB = [2]\nCL = [16]",
        "NW = [8]\nBN = [16]\nTR = [1]\nRB = [2]\nCL = [2]", "NW = [4]\nBN = [32]\nTR = [1]\nRB = [2]\nCL = [4]",
        "NW = [4]\nBN = [16]\nTR = [2]\nRB = [1]\nCL = [8]", "NW = [2]\nBN = [16]\nTR = [2]\nRB = [2]\nCL = [16]",
        "NW = [4]\nBN = [32]\nTR = [2]\nRB = [1]\nCL = [4]", "NW = [4]\nBN = [16]\nTR = [2]\nRB = [2]\nCL = [2]"}) {
    KernelSpec spec;
    ASSERT_NO_FATAL_FAILURE(test::one_config_spec("attn_split_cluster_bf16.toml", std::string(cfg) + "\n", spec));
    Kernel k(rt, spec);
    // (The last two, a lane's two rows in two tokens: 8 tokens of one head a KV head, and 3 of 2
    // (6 rows), were added after the run on the GPU that measured TR = 1.)
    for (const Shape& sh : std::vector<Shape>{{1, 0, 32, 8}, {1, 5000, 32, 8}, {2, 63, 8, 2}, {1, 777, 8, 1},
                                              {1, 100, 4, 4}, {1, 8192, 32, 8}, {8, 40, 8, 8}, {3, 50, 6, 3}}) {
      SCOPED_TRACE(testing::Message() << cfg << " T=" << sh.T << " S=" << sh.S << " HQ=" << sh.HQ << " HKV=" << sh.HKV);
      check_gpu_call(dev, k, spec.name, spec.args, sh, 130);
    }
  }
}

// The prefill on wgmma (attn_prefill_wg_bf16.toml), each config alone (the spec's space narrowed
// to it, so no tuning can pass it over), against the double-precision computation: one token, a
// query tile's edge (64, 65, 129), a tile of keys not whole (S = 37), a prompt over a long cache,
// one KV head for all, and a block's rows past T. The caches' 130 rows past S + T are NaN, so a
// last tile of keys that reads them (and does not mask their scores and zero their values
// before P V) gives NaN.
TEST_F(AttentionTest, ThePrefillOnWgmmaMatchesAPlainComputationInEveryConfig) {
  std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  Runtime rt(opts);
  Device& dev = rt.backend("cuda").device();
  if (const std::string arch = dev.info().arch; arch != "sm_90")
    GTEST_SKIP() << "the GPU is " << arch << ": the wgmma prefill is compiled for sm_90a alone";
  const KernelSpec whole = load_spec(test::kernels() + "/cuda/attn_prefill_wg_bf16.toml");
  size_t ran = 0;
  for (const Config& c : whole.space.all()) {
    if (!statically_pruned(whole, c, rt.backend("cuda").limits()).empty()) continue;
    std::string cfg;
    for (const auto& [name, value] : c.values) cfg += name + " = [" + std::to_string(value) + "]\n";
    KernelSpec spec;
    ASSERT_NO_FATAL_FAILURE(test::one_config_spec("attn_prefill_wg_bf16.toml", cfg, spec));
    Kernel k(rt, spec);
    for (const Shape& sh : std::vector<Shape>{{1, 0, 32, 8}, {64, 0, 8, 2}, {65, 37, 8, 2}, {129, 1000, 32, 8},
                                              {300, 0, 4, 1}, {260, 300, 8, 8}}) {
      SCOPED_TRACE(testing::Message() << c.str() << " T=" << sh.T << " S=" << sh.S << " HQ=" << sh.HQ << " HKV=" << sh.HKV);
      check_gpu_call(dev, k, spec.name, spec.args, sh, 130);
    }
    ++ran;
  }
  EXPECT_GE(ran, 5u) << "configs of the wgmma prefill checked";
}

// cuDNN's fused attention (the cudnn_attn_bf16 library choice of attn_prefill_wg_bf16.toml), loaded
// alone, against the double-precision computation: the wgmma prefill's shapes and a prompt over
// an empty cache, first with the caches' rows past S + T holding numbers, then NaN (a cache's
// rows not yet written may hold anything: they must not reach the output). A launch given S as
// a cell (a program's launch sized for a larger S of its bucket) is refused: cuDNN reads S from
// the call, and a program keeps exact launches for a shape whose choice is a library's.
TEST_F(AttentionTest, CudnnAttentionMatchesAPlainComputationInAndOutOfGraphsAndRefusesACell) {
  std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  Runtime rt(opts);
  Backend& be = rt.backend("cuda");
  Device& dev = be.device();
  if (std::string no = be.library_unavailable("cudnn_attn_bf16"); !no.empty())
    GTEST_SKIP() << "cuDNN's attention cannot run here: " << no;
  std::cout << "cuDNN: " << be.library_identity("cudnn_attn_bf16") << "\n";
  const KernelSpec spec = load_spec(test::kernels() + "/cuda/attn_prefill_wg_bf16.toml");
  const std::optional<LibraryChoice> choice = parse_library_choice("cudnn_attn_bf16");
  ASSERT_TRUE(choice);
  std::shared_ptr<LoadedKernel> lib = be.library("cudnn")->load("cudnn-test", KernelMeta{}, *choice);
  const std::vector<Shape> shapes = {{1, 0, 32, 8},  {64, 0, 8, 2},    {65, 37, 8, 2},  {129, 1000, 32, 8},
                                     {300, 0, 4, 1}, {260, 300, 8, 8}, {1000, 0, 4, 2}, {777, 4000, 8, 2}};
  for (int64_t nan_rows : {0, 130})
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(testing::Message() << "cudnn T=" << sh.T << " S=" << sh.S << " HQ=" << sh.HQ << " HKV=" << sh.HKV
                                      << " NaN rows past S+T: " << nan_rows);
      check_gpu_call(
          dev,
          [&](void* const* p) {
            ASSERT_EQ(lib->can_implement(p), "");
            const auto t0 = std::chrono::steady_clock::now();
            lib->launch(p, LaunchDims{}, nullptr);
            if (nan_rows == 0)
              std::cout << "T=" << sh.T << " S=" << sh.S << ": the first launch (its graph built) took "
                        << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
                        << " ms\n";
          },
          spec.name, spec.args, sh, nan_rows);
    }
  // Captured into a graph: a (T, S) not seen before is refused inside a capture (its plan is
  // made outside one); once made, the captured launch replays to the same result.
  {
    const Shape sh{200, 50, 8, 2};
    SCOPED_TRACE("cudnn in a graph: T=200 S=50");
    check_gpu_call(
        dev,
        [&](void* const* p) {
          EXPECT_THROW(dev.capture([&](Stream cs) { lib->launch(p, LaunchDims{}, cs); }), Error);
          lib->launch(p, LaunchDims{}, nullptr);
          dev.sync(nullptr);
          std::unique_ptr<Graph> g = dev.capture([&](Stream cs) { lib->launch(p, LaunchDims{}, cs); });
          ASSERT_TRUE(g);
          g->launch(nullptr);
        },
        spec.name, spec.args, sh);
  }
  // S as a cell: refused, nothing run.
  void* word = dev.alloc(4);
  int64_t t = 65, s = 40, cap = 200, hq = 8, hkv = 2;
  void* buf = dev.alloc(static_cast<size_t>(cap * hq * kD * 2));
  void* params[] = {&buf, &buf, &buf, &buf, &t, &s, &cap, &hq, &hkv};
  const CellBinding b{s, word};
  {
    CellScope scope(&b, 1);
    try {
      lib->launch(params, LaunchDims{}, nullptr);
      ADD_FAILURE() << "a launch given S as a cell ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("takes S from the call, not from a cell"), std::string::npos) << e.what();
    }
  }
  dev.free(buf);
  dev.free(word);
}

// A handle remembers its choice by a bucket of S (a power of two), and the cache's bound
// S + T <= CAP is a constraint of its kernels: a call past the cache in a bucket an earlier call
// decided must still be refused, not run past the buffers (the RoPE kernel writes rows S .. S+T-1
// of the caches). Both handles: a kernel (rope_cache_f32) and a multi-kernel (the decode attention).
TEST_F(AttentionTest, ACallPastTheCacheIsRefusedInABucketAnEarlierCallDecided) {
  Runtime rt(opts);
  const int64_t T = 1, CAP = 160, HQ = 4, HKV = 1;
  std::vector<float> qkv(T * (HQ + 2 * HKV) * kD, 0.5f), q(T * HQ * kD), kc(CAP * HKV * kD), vc(CAP * HKV * kD);
  Kernel rope(rt, load_spec(test::kernels() + "/cpu/rope_cache_f32.toml"));
  rope(qkv.data(), q.data(), kc.data(), vc.data(), T, int64_t{130}, CAP, HQ, HKV, 500000.f);  // bucket 256
  try {
    rope(qkv.data(), q.data(), kc.data(), vc.data(), T, int64_t{200}, CAP, HQ, HKV, 500000.f);  // same bucket
    FAIL() << "rope_cache_f32 wrote row 200 of a 160-row cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("S + T <= CAP"), std::string::npos) << e.what();
  }
  MultiKernel attn(rt, load_multi_spec(test::kernels() + "/cpu/attention_decode_f32.toml"));
  std::vector<float> o(T * HQ * kD);
  attn(q.data(), kc.data(), vc.data(), o.data(), T, int64_t{130}, CAP, HQ, HKV);
  try {
    attn(q.data(), kc.data(), vc.data(), o.data(), T, int64_t{200}, CAP, HQ, HKV);
    FAIL() << "the decode attention read row 200 of a 160-row cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("S + T <= CAP"), std::string::npos) << e.what();
  }
  // ... and the calls inside the cache in that bucket still run.
  rope(qkv.data(), q.data(), kc.data(), vc.data(), T, int64_t{159}, CAP, HQ, HKV, 500000.f);
  attn(q.data(), kc.data(), vc.data(), o.data(), T, int64_t{159}, CAP, HQ, HKV);
}

// What a call in a bucket an earlier call decided is checked against includes its steps'
// constraints on a buffer's alignment: the address this call passes is read, not a slot left
// from another (on a GPU, the layer's attention was refused at its second call, 16-byte
// aligned caches said not to be). The cpu decode attention with its partial-rows step asking
// for a 64-byte aligned q: aligned calls in the bucket run, and a call with q 4 bytes past is
// refused (the alignment the constraint reads is part of the handle's key: a call of another
// alignment is decided on its own, and no config of any variant takes it), saying why.
TEST_F(AttentionTest, ACallInADecidedBucketIsCheckedAgainstTheAlignmentOfItsOwnBuffers) {
  const std::string dir = test::kernels() + "/cpu/";
  auto text = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream b;
    b << f.rdbuf();
    return b.str();
  };
  auto reader = [&](const std::filesystem::path& p) -> std::optional<std::string> {
    if (!std::filesystem::exists(p)) return std::nullopt;
    return text(p);
  };
  MultiKernelSpec ms =
      parse_multi_spec(text(dir + "attention_decode_f32.toml"), dir + "attention_decode_f32.toml",
                       [&](const std::filesystem::path& p) {
                         std::string t = text(p);
                         if (p.filename() == "attn_part_f32.toml") {
                           const size_t c = t.find("constraints = [");
                           EXPECT_NE(c, std::string::npos);
                           if (c != std::string::npos) t.insert(c + 15, "\"align_q % 64 == 0\", ");
                         }
                         return parse_spec(t, p, reader);
                       });
  Runtime rt(opts);
  MultiKernel attn(rt, ms);
  const int64_t T = 1, CAP = 160, HQ = 4, HKV = 1;
  std::vector<float> room(T * HQ * kD + 32, 0.25f), kc(CAP * HKV * kD, 0.5f), vc(CAP * HKV * kD, 0.5f), o(T * HQ * kD);
  float* q = room.data();
  while (reinterpret_cast<uintptr_t>(q) % 64 != 0) ++q;
  attn(q, kc.data(), vc.data(), o.data(), T, int64_t{130}, CAP, HQ, HKV);  // decides bucket 256
  for (int64_t S : {int64_t{131}, int64_t{150}, int64_t{159}}) {
    SCOPED_TRACE(testing::Message() << "S=" << S);
    attn(q, kc.data(), vc.data(), o.data(), T, S, CAP, HQ, HKV);
  }
  try {
    attn(q + 1, kc.data(), vc.data(), o.data(), T, int64_t{140}, CAP, HQ, HKV);
    FAIL() << "a step that asks for a 64-byte aligned q ran with q 4 bytes past";
  } catch (const Error& e) {
    // (Each variant's line says why no config can run it: the constraint on q.)
    EXPECT_NE(std::string(e.what()).find("its one config cannot run this call (constraint 'align_q % 64 == 0' is false)"),
              std::string::npos)
        << e.what();
  }
  // ... and the record stored under the key (the alignment is not in it) still holds the choice:
  // the refused call's record, which holds none, did not replace it (it did, and a later
  // process benchmarked the variants again). A new process's handle runs an aligned call.
  size_t multi_records = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(opts.resolved_cache_dir()))
    if (e.path().extension() == ".rec") {
      const std::string r = text(e.path());
      if (r.find("\"kernel\": \"" + ms.name + "\"") == std::string::npos) continue;
      ++multi_records;
      EXPECT_EQ(r.find("\"best\": null"), std::string::npos) << e.path() << "\n" << r.substr(0, 400);
      EXPECT_NE(r.find("\"best\": {"), std::string::npos) << e.path() << "\n" << r.substr(0, 400);
    }
  EXPECT_EQ(multi_records, 1u);
  Runtime rt2(opts);
  MultiKernel attn2(rt2, ms);
  attn2(q, kc.data(), vc.data(), o.data(), T, int64_t{150}, CAP, HQ, HKV);
}

// cuDNN's attention inside a program. cuDNN builds a graph for each (T, S), so it is no
// choice for a bucket of S that holds many values (Library::plans_per_shape): a first tuning at
// S = 70 (the bucket up to 128) leaves it out with the reason, and where a record from before
// that rule timed it fastest, a fresh process runs kiln's own config there, with S in a cell (a
// graph set in place for each S, no plan per S). At S = 0, a bucket of one value, a record that
// times it fastest makes it the choice: a library reads S from the call, so the program keeps
// exact launches there. Every call is checked against float64, with NaN in the caches' rows past
// S + T: a launch left at another S of the bucket would read them.
TEST_F(AttentionTest, AProgramPassesOverCudnnForABucketOfManySAndRunsItExactlyAtSZero) {
  std::string why = make_backend("cuda", Options::from_env())->unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "no GPU here (" << why << "); this test runs on the GPU machine";
  {
    Runtime probe(opts);
    if (std::string no = probe.backend("cuda").library_unavailable("cudnn_attn_bf16"); !no.empty())
      GTEST_SKIP() << "cuDNN's attention cannot run here: " << no;
    if (std::string arch = probe.backend("cuda").device().info().arch; arch != "sm_90")
      GTEST_SKIP() << "the GPU is " << arch << ": the wgmma prefill beside cuDNN is compiled for sm_90a alone";
  }
  const std::string spec_path = test::kernels() + "/cuda/attn_prefill_wg_bf16.toml";
  const std::string text = R"(kind = "program"
version = 1
name = "attn_cudnn"
backend = "cuda"
constants = { HQ = 8, HKV = 2 }
symbols = ["T", "CAP"]
scalars = ["S"]
buckets = { S = "pow2" }
guards  = ["T >= 1", "S >= 0", "S + T <= CAP"]
[[inputs]]
name = "q"
dtype = "bf16"
shape = ["T", "HQ * 128"]
[[inputs]]
name = "k_cache"
dtype = "bf16"
shape = ["CAP", "HKV", "128"]
[[inputs]]
name = "v_cache"
dtype = "bf16"
shape = ["CAP", "HKV", "128"]
[[outputs]]
name = "o"
dtype = "bf16"
shape = ["T", "HQ * 128"]
[kernels]
attention = ")" + spec_path + R"("
[[steps]]
launch = "attention"
args   = ["q", "k_cache", "v_cache", "o", "T", "S", "CAP", "HQ", "HKV"]
)";
  const ProgramSpec p = parse_program(text, dir.path() / "attn.toml");
  const int64_t T = 96, CAP = 300, HQ = 8, HKV = 2;
  const size_t qn = static_cast<size_t>(T * HQ * kD), cn = static_cast<size_t>(CAP * HKV * kD);
  struct Buffers {
    Device& dev;
    DeviceBuffer q, k, v, o;
    std::vector<std::byte> hq, hk, hv;
    Buffers(Device& d, size_t qn, size_t cn)
        : dev(d), q(d, qn * 2), k(d, cn * 2), v(d, cn * 2), o(d, qn * 2), hq(qn * 2), hk(cn * 2), hv(cn * 2) {}
    // Fresh inputs for a call at S: rows past S + T of the caches NaN.
    void fill(int64_t S, uint64_t seed) {
      fill_random(DType::bf16, hq, seed);
      fill_random(DType::bf16, hk, seed + 1);
      fill_random(DType::bf16, hv, seed + 2);
      for (std::vector<std::byte>* c : {&hk, &hv})
        for (size_t i = static_cast<size_t>((S + T) * HKV * kD); i < c->size() / 2; ++i) {
          const uint16_t nan = 0x7FC0;
          std::memcpy(c->data() + 2 * i, &nan, 2);
        }
      dev.to_device(q.get(), hq.data(), hq.size(), nullptr);
      dev.to_device(k.get(), hk.data(), hk.size(), nullptr);
      dev.to_device(v.get(), hv.data(), hv.size(), nullptr);
    }
    std::vector<Tensor> in() { return {{q.get(), {T, HQ * 128}}, {k.get(), {CAP, HKV, 128}}, {v.get(), {CAP, HKV, 128}}}; }
    std::vector<Tensor> out() { return {{o.get(), {T, HQ * 128}}}; }
  };
  // A first process tunes the step at S = 70 (bucket 128) and at S = 0; cuDNN's timings are then
  // set below the others' (at 128 as a record from before the rule would hold it).
  {
    Runtime rt(opts);
    Buffers b(rt.backend("cuda").device(), qn, cn);
    Program prog(rt, p);
    for (int64_t S : {int64_t{70}, int64_t{0}}) {
      b.fill(S, 1);
      prog.run(b.in(), b.out(), nullptr, {S});
      rt.wait_tuned();
      b.dev.sync(nullptr);
    }
    const KernelSpec spec = load_spec(spec_path);
    std::shared_ptr<TuningCache> tc = rt.tuning_cache();
    ASSERT_TRUE(tc);
    const TuningKey any = make_tuning_key(spec, rt.backend("cuda"), {{"T", T}, {"S", 128}, {"HQ", HQ}, {"HKV", HKV}});
    std::vector<TuningRecord> recs = tc->all(any);
    bool at0 = false, at128 = false;
    for (TuningRecord& r : recs) {
      const int64_t S = r.key.values.at(1).second;
      if (S != 0 && S != 128) continue;
      (S == 0 ? at0 : at128) = true;
      ConfigResult* lib = nullptr;
      double fastest = 0;
      for (ConfigResult& c : r.configs) {
        if (c.config.library == "cudnn_attn_bf16") lib = &c;
        if (c.ok() && (fastest == 0 || *c.ns < fastest)) fastest = *c.ns;
      }
      ASSERT_TRUE(lib) << "no result of cuDNN in the record:\n" << record_to_text(r);
      if (S == 128) {
        EXPECT_EQ(lib->kind, FailKind::pruned) << record_to_text(r);
        EXPECT_NE(lib->error.find("builds a plan for each shape, and the bucket of S = "),
                  std::string::npos) << lib->error;
        lib->kind = FailKind::none;
        lib->error.clear();
      } else {
        ASSERT_TRUE(lib->ok()) << "cuDNN did not agree with the reference at S = 0:\n" << record_to_text(r);
      }
      lib->ns = lib->min_ns = lib->max_ns = fastest / 2;
      r.best = lib->config;
      r.best_ns = *lib->ns;
      tc->put(r);
    }
    ASSERT_TRUE(at0 && at128) << "the first process wrote no record at S = 0 or in the bucket of 128";
  }
  Runtime rt(opts);
  Buffers b(rt.backend("cuda").device(), qn, cn);
  Program prog(rt, p);
  const int64_t calls[] = {70, 70, 100, 100, 128, 65, 0, 0, 0};
  uint64_t seed = 10;
  Program::Stats before0{};
  for (int64_t S : calls) {
    SCOPED_TRACE(testing::Message() << "S=" << S << " (call " << prog.stats().calls + 1 << ")");
    if (S == 0 && before0.calls == 0) before0 = prog.stats();
    b.fill(S, seed += 3);
    prog.run(b.in(), b.out(), nullptr, {S});
    b.dev.sync(nullptr);
    std::vector<std::byte> ho(qn * 2);
    b.dev.to_host(ho.data(), b.o.get(), ho.size(), nullptr);
    expect_attention_close(test::bf16_doubles(ho),
                           attention_ref(test::bf16_doubles(b.hq), test::bf16_doubles(b.hk), test::bf16_doubles(b.hv), T, S, HQ, HKV));
  }
  std::vector<std::string> ch = prog.choices(b.in(), b.out(), {100});
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(ch[0].find("cudnn"), std::string::npos) << ch[0];
  ch = prog.choices(b.in(), b.out(), {0});
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_NE(ch[0].find("cudnn_attn_bf16"), std::string::npos) << ch[0];
  const Program::Stats st = prog.stats();
  EXPECT_GE(before0.cell_calls, 4u) << "the bucket of 128 ran its calls sized for its bound, S in a cell";
  EXPECT_LE(before0.graph_captures, 1u) << "one graph for the bucket of 128";
  EXPECT_EQ(st.cell_calls, before0.cell_calls) << "a call at S = 0 ran with S in a cell";
  EXPECT_GE(st.graph_captures, before0.graph_captures + 1) << "a graph at S = 0, cuDNN's launch in it";
  std::cout << "program stats: " << st.calls << " calls, " << st.graph_captures << " captures, " << st.graph_replays
            << " replays, " << st.graph_updates << " updates, " << st.cell_calls << " with cells\n";
  std::cout << "before S = 0: " << before0.graph_captures << " captures, " << before0.cell_calls << " with cells\n";
}
