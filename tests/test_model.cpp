// A model as a program that runs another program as its steps (the whole-model
// issue): model_cpu.toml writes the cpu decoder layer once and runs it L times
// over rows of stacked weights and caches (buffer views, `name[index]`). The
// model is checked against its double-precision reference, and, independently
// of how programs are expanded, against the layer program run L times by hand
// with pointers the test computes; mistakes in a binding are refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "emit.hpp"
#include "kiln/args.hpp"
#include "kiln/program.hpp"
#include "kiln/runtime.hpp"
#include "util.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct ModelTest : ::testing::Test {
  TempDir dir{"kiln-model"};
  Options opts = test::options_in(dir.path());
  void SetUp() override {
    opts.bench_budget_ms = 2;
    opts.workers = 1;
    opts.first_call = FirstCall::wait;
  }
};

fs::path programs() { return fs::path(test::kernels()) / "programs"; }

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// model_cpu's sizes, and its inputs, stacked by layer, in host memory.
struct Model {
  static constexpr int64_t L = 3, H = 512, HQ = 4, HKV = 2, QKV = 1024, I = 1024, V = 1000;
  int64_t cap;
  std::vector<float> g1, wqkv, wo, g2, wg, wu, wd, kc, vc, gf, wlm;
  explicit Model(int64_t capacity) : cap(capacity) {
    auto fill = [](std::vector<float>& v, int64_t n, uint64_t seed, float scale, float shift) {
      v.resize(static_cast<size_t>(n));
      fill_random(DType::f32, std::as_writable_bytes(std::span(v)), seed);
      for (auto& x : v) x = x * scale + shift;
    };
    fill(g1, L * H, 1, 0.1f, 1), fill(g2, L * H, 2, 0.1f, 1), fill(gf, H, 3, 0.1f, 1);
    fill(wqkv, L * QKV * H, 4, 0.05f, 0), fill(wo, L * H * HQ * 128, 5, 0.05f, 0);
    fill(wg, L * I * H, 6, 0.05f, 0), fill(wu, L * I * H, 7, 0.05f, 0), fill(wd, L * H * I, 8, 0.05f, 0);
    fill(kc, L * cap * HKV * 128, 9, 1, 0), fill(vc, L * cap * HKV * 128, 10, 1, 0);
    fill(wlm, V * H, 11, 0.05f, 0);
  }
  std::vector<Tensor> inputs(std::vector<float>& x, int64_t T) {
    return {{x.data(), {T, H}},           {g1.data(), {L, H}},      {wqkv.data(), {L, QKV, H}},
            {wo.data(), {L, H, HQ * 128}}, {g2.data(), {L, H}},      {wg.data(), {L, I, H}},
            {wu.data(), {L, I, H}},        {wd.data(), {L, H, I}},   {kc.data(), {L, cap, HKV, 128}},
            {vc.data(), {L, cap, HKV, 128}}, {gf.data(), {H}},       {wlm.data(), {V, H}}};
  }
  // Layer l's inputs for decoder_cpu.toml: pointers into the stacks at offsets computed here.
  std::vector<Tensor> layer(float* x, int64_t T, int64_t l) {
    auto at = [&](std::vector<float>& v, int64_t per) { return v.data() + l * per; };
    const int64_t c = cap * HKV * 128;
    return {{x, {T, H}},
            {at(g1, H), {H}},
            {at(wqkv, QKV * H), {QKV, H}},
            {at(wo, H * HQ * 128), {H, HQ * 128}},
            {at(g2, H), {H}},
            {at(wg, I * H), {I, H}},
            {at(wu, I * H), {I, H}},
            {at(wd, H * I), {H, I}},
            {at(kc, c), {cap, HKV, 128}},
            {at(vc, c), {cap, HKV, 128}}};
  }
};

// A prefill of 5 tokens, then two decode steps: each call checked against the
// reference (logits and every layer's caches), and the same calls made by hand
// on a second copy of the caches, the layer program once a layer, then the
// final norm and the output projection in double: the caches agree to the bit,
// the logits within float rounding.
TEST_F(ModelTest, TheModelMatchesItsReferenceAndTheLayerRunLayerByLayer) {
  Runtime rt(opts);
  ProgramSpec spec = load_program(programs() / "model_cpu.toml");
  // The layer written once: 8 launches a layer, the norm and the projection; kernels not repeated.
  EXPECT_EQ(spec.steps.size(), static_cast<size_t>(8 * Model::L + 2));
  for (size_t a = 0; a < spec.kernels.size(); ++a)
    for (size_t b = a + 1; b < spec.kernels.size(); ++b) EXPECT_NE(spec.kernels[a].spec, spec.kernels[b].spec);
  Program model(rt, spec);
  Program layer(rt, load_program(programs() / "decoder_cpu.toml"));
  Model m(12), by_hand(12);  // the same seeds: the same weights and starting caches
  int64_t S = 0;
  for (int64_t T : {5, 1, 1}) {
    std::vector<float> x(static_cast<size_t>(T * Model::H)), logits(static_cast<size_t>(T * Model::V), -7);
    fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 100 + S);
    ProgramCheck c = model.check(m.inputs(x, T), {{logits.data(), {T, Model::V}}}, nullptr, {S});
    ASSERT_EQ(c.outputs.size(), 3u) << c.str();
    EXPECT_TRUE(c.ok()) << "T=" << T << " S=" << S << "\n" << c.str();
    if (S == 0) {
      // Each step is listed by its own name in the layer, also where its kernel shares a handle
      // with another of the same spec (the layer's o_proj and down; its qkv_proj and lm_head).
      const std::vector<std::string> ch = model.choices(m.inputs(x, T), {{logits.data(), {T, Model::V}}}, {S});
      ASSERT_EQ(ch.size(), spec.steps.size());
      const char* layer_steps[] = {"rmsnorm", "qkv_proj", "rope", "attention", "o_proj", "rmsnorm", "gate_up", "down"};
      for (size_t i = 0; i < ch.size() - 2; ++i) {
        const std::string own = fmt::format("decoder_cpu_{}", layer_steps[i % 8]);
        EXPECT_EQ(ch[i].rfind(own, 0), 0u) << "step " << i + 1 << ": " << ch[i];
        std::string want;  // what the step's name is followed by
        switch (i % 8) {
          case 0: case 5: want = " (handle rmsnorm): "; break;  // the model's own norm
          case 1: want = " (handle lm_head): "; break;           // the same linear spec
          case 2: case 3: case 6: want = ": "; break;            // kernels of their own
          default: break;                                        // o_proj and down: below
        }
        if (!want.empty()) {
          EXPECT_EQ(ch[i].rfind(own + want, 0), 0u) << "step " << i + 1 << ": " << ch[i];
        }
      }
      // o_proj and down have one spec: one of them is the handle, the other shares it
      EXPECT_NE(ch[4].find(" (handle ") == std::string::npos, ch[7].find(" (handle ") == std::string::npos)
          << ch[4] << "\n" << ch[7];
      EXPECT_EQ(ch[ch.size() - 2].rfind("rmsnorm: ", 0), 0u) << ch[ch.size() - 2];
      EXPECT_EQ(ch[ch.size() - 1].rfind("lm_head: ", 0), 0u) << ch.back();
    }

    std::vector<float> h0 = x, h1(x.size());
    for (int64_t l = 0; l < Model::L; ++l) {
      layer.run(by_hand.layer(h0.data(), T, l), {{h1.data(), {T, Model::H}}}, nullptr, {S});
      std::swap(h0, h1);
    }
    EXPECT_EQ(std::memcmp(m.kc.data(), by_hand.kc.data(), m.kc.size() * 4), 0) << "k caches differ, S=" << S;
    EXPECT_EQ(std::memcmp(m.vc.data(), by_hand.vc.data(), m.vc.size() * 4), 0) << "v caches differ, S=" << S;
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t k = 0; k < Model::H; ++k) ss += double(h0[t * Model::H + k]) * h0[t * Model::H + k];
      const double inv = 1 / std::sqrt(ss / Model::H + 1e-5);
      for (int64_t v = 0; v < Model::V; ++v) {
        double acc = 0;
        for (int64_t k = 0; k < Model::H; ++k)
          acc += h0[t * Model::H + k] * inv * by_hand.gf[k] * double(by_hand.wlm[v * Model::H + k]);
        worst = std::max(worst, std::abs(acc - logits[t * Model::V + v]) / (1e-3 + std::abs(acc)));
      }
    }
    EXPECT_LT(worst, 1e-3) << "logits against the layer run by hand, S=" << S;
    S += T;
  }
}

// One program called on two models' tensors in turn, and again on the first's (the
// same shape and S each time, then S moving within its bucket): each call reads and
// writes the tensors it is given, as a program made fresh for that call does.
TEST_F(ModelTest, AProgramCalledOnOtherTensorsReadsAndWritesThose) {
  Runtime rt(opts);
  const ProgramSpec spec = load_program(programs() / "model_cpu.toml");
  Program reused(rt, spec);
  Model a(12), b(12), a2(12), b2(12);  // a and a2 (b and b2) start the same
  for (auto* m : {&b, &b2})
    for (auto& w : m->wlm) w = -w;  // b's logits are not a's
  std::vector<float> x(static_cast<size_t>(Model::H));
  fill_random(DType::f32, std::as_writable_bytes(std::span(x)), 5);
  struct Call {
    Model* used;
    Model* fresh;
    int64_t S;
  };
  // S = 5 .. 8: one bucket (one plan, set again for each S).
  for (const Call& c : {Call{&a, &a2, 5}, Call{&b, &b2, 5}, Call{&a, &a2, 6}, Call{&a, &a2, 7}, Call{&b, &b2, 8}}) {
    std::vector<float> got(Model::V, -7), want(Model::V, -9);
    reused.run(c.used->inputs(x, 1), {{got.data(), {1, Model::V}}}, nullptr, {c.S});
    Program fresh(rt, spec);
    fresh.run(c.fresh->inputs(x, 1), {{want.data(), {1, Model::V}}}, nullptr, {c.S});
    EXPECT_EQ(got, want) << "S=" << c.S << (c.used == &a ? " on a's tensors" : " on b's tensors");
    EXPECT_EQ(c.used->kc, c.fresh->kc) << "S=" << c.S;
    EXPECT_EQ(c.used->vc, c.fresh->vc) << "S=" << c.S;
  }
  EXPECT_NE(a.kc, b.kc) << "each model's caches took its own calls";
  EXPECT_EQ(reused.stats().plans, 1u);
}

// The whole model packed (kiln pack PROGRAM at two token counts) and loaded by
// a process with an empty cache: its first call of each packed shape compiles
// nothing and times nothing, and its result passes the check against the
// reference program.
TEST_F(ModelTest, APackedModelRunsWithNothingCompiledOrTimed) {
  const std::string model = (programs() / "model_cpu.toml").string();
  const std::string artifact = (dir.path() / "model.kiln").string();
  auto kiln = [&](const std::string& cache, const std::string& env, const std::string& args) {
    ProcessResult r = run_process(
        {"bash", "-c", fmt::format("KILN_CACHE_DIR={} KILN_BENCH_BUDGET_MS=2 {} {} -q {} 2>&1",
                                   (dir.path() / cache).string(), env, test::kiln_exe(), args)},
        600);
    EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    return r.output;
  };
  std::string out = kiln("packer", "", fmt::format("pack {} --set T=1,3 --set S=2 --set CAP=8 -o {}", model, artifact));
  EXPECT_NE(out.find("packed"), std::string::npos) << out;
  for (const char* T : {"3", "1"}) {
    SCOPED_TRACE(std::string("T=") + T);
    out = kiln(std::string("app") + T, "KILN_ARTIFACT=" + artifact,
               fmt::format("run --first-only {} --set T={} --set S=2 --set CAP=8", model, T));
    EXPECT_NE(out.find(": 0 compiled, 0 configs timed"), std::string::npos) << out;
    out = kiln(std::string("app") + T, "KILN_ARTIFACT=" + artifact,
               fmt::format("run --check --reps 1 --calls 1 {} --set T={} --set S=2 --set CAP=8", model, T));
    EXPECT_NE(out.find("check passed"), std::string::npos) << out;
  }
  // With KILN_LOG=debug a process's start can be read off its log: each line says when it was
  // written, and the first call says what each step took and where its choice came from.
  out = kiln("app_debug", "KILN_ARTIFACT=" + artifact + " KILN_LOG=debug",
             fmt::format("run --first-only {} --set T=3 --set S=2 --set CAP=8", model));
  EXPECT_NE(out.find(": 0 compiled, 0 configs timed"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("kiln: debug: \\+[0-9]+\\.[0-9]{4} s: kernel '[a-z_0-9]+' at [^:]*: the "
                                                "caches looked up in [0-9.]+ ms \\(a record\\)")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("program 'model_cpu': [0-9]+ steps launched in [0-9.]+ ms"))) << out;
  // A shape not packed is compiled or tuned as usual: the artifact is not what made the counts zero.
  out = kiln("app5", "KILN_ARTIFACT=" + artifact,
             fmt::format("run --first-only {} --set T=5 --set S=2 --set CAP=8", model));
  EXPECT_EQ(out.find(": 0 compiled, 0 configs timed"), std::string::npos) << out;
}

// What a binding gets wrong is refused when the model is read, naming the step
// and the name; a row past the end of a buffer is refused at the call.
TEST_F(ModelTest, BindingMistakesAreRefusedWithTheReason) {
  const fs::path file = programs() / "model_cpu.toml";
  const std::string text = read_file(file).value();
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
    return t;
  };
  std::string m = message([&] { parse_program(edited(R"(w_o = "w_o[0]", )", ""), file); });
  EXPECT_NE(m.find("program 'decoder_cpu' takes 'w_o'; bind gives it nothing"), std::string::npos) << m;
  m = message([&] { parse_program(edited(R"(w_o = "w_o[0]")", R"(w_out = "w_o[0]")"), file); });
  EXPECT_NE(m.find("program 'decoder_cpu' has no input, output, symbol or scalar 'w_out'"), std::string::npos) << m;
  m = message([&] { parse_program(edited(R"(w_o = "w_o[0]")", R"(w_o = "w_o")"), file); });
  EXPECT_NE(m.find("bind.w_o: 'w_o' has 3 dimensions, but program 'decoder_cpu' takes 'w_o' with 2"),
            std::string::npos) << m;
  m = message([&] { parse_program(edited(R"(w_o = "w_o[0]")", R"(w_o = "w_lm")"), file); });
  EXPECT_NE(m.find("'w_o' is bound to 'w_lm', whose dimension 0 is V"), std::string::npos) << m;
  m = message([&] { parse_program(edited("H = 512", "H = 256"), file); });
  EXPECT_NE(m.find("is bound to 'x', whose dimension 1 is H, but program 'decoder_cpu' takes 512 there"),
            std::string::npos) << m;
  m = message([&] { parse_program(edited(R"(repeat  = "L - 1")", R"(repeat  = "T")"), file); });
  EXPECT_NE(m.find("repeat: 'T' is a count over the constants"), std::string::npos) << m;
  m = message([&] { parse_program(edited(R"(program = "decoder_cpu.toml")", R"(program = "no_such.toml")"), file); });
  EXPECT_NE(m.find("no program file"), std::string::npos) << m;
  {
    // A program that runs itself.
    std::string self = edited(R"(program = "decoder_cpu.toml")", R"(program = "self.toml")");
    for (size_t at; (at = self.find("\"../cpu/")) != std::string::npos;)
      self.replace(at, 8, "\"" + test::kernels() + "/cpu/");
    self.replace(self.find("model_reference.toml"), 20, (programs() / "model_reference.toml").string());
    test::write(dir.path() / "self.toml", self);
    m = message([&] { load_program(dir.path() / "self.toml"); });
    EXPECT_NE(m.find("self.toml runs itself (self.toml -> self.toml)"), std::string::npos) << m;
  }

  // kiln emit does not write views yet: it says so rather than writing a wrong program.
  m = message([&] { emit_program_cpp(load_program(file)); });
  EXPECT_NE(m.find("is a view of a row of a buffer ('g1[0]'), which kiln emit does not write yet"), std::string::npos)
      << m;

  // A constant row no step writes (h has rows 0 and 1; L = 3) is refused when the file is read.
  m = message([&] { parse_program(edited(R"(args   = ["h[L % 2]")", R"(args   = ["h[L]")"), file); });
  EXPECT_NE(m.find("kernel 'rmsnorm' reads 'h[L]', row 3 of 'h', before any step writes that row (rows written so "
                   "far: 0, 1)"),
            std::string::npos)
      << m;
  // A row past the buffer's end that only the call's sizes tell: refused at the call with the row and the rows there are.
  Runtime rt(opts);
  Program bad(rt, parse_program(edited(R"(args   = ["h[L % 2]")", R"(args   = ["h[T + 1]")"), file));
  Model w(8);
  const int64_t T = 2;
  std::vector<float> x(static_cast<size_t>(T * Model::H)), logits(static_cast<size_t>(T * Model::V));
  m = message([&] { bad.run(w.inputs(x, T), {{logits.data(), {T, Model::V}}}, nullptr, {0}); });
  EXPECT_NE(m.find("argument 'h[T + 1]' is row 3 of 'h', which has 2 rows"), std::string::npos) << m;
}

// What a hostile review found, each fixed: two intermediates of one program run
// as a step were once given one buffer (a name the outer program took pushed
// one onto the other's); a view of an intermediate planned for its bucket took
// the bucket's row stride where the kernels lay rows out at the exact size; a
// scalar naming an input's dimension crashed the load; and a count of 0, an
// index that shadows a buffer or selects a scalar, an empty index.
TEST_F(ModelTest, WhatAHostileReviewFound) {
  const std::string rms = "\"" + test::kernels() + "/cpu/rmsnorm.toml\"";
  const std::string lin = "\"" + test::kernels() + "/cpu/linear.toml:f32_nt_residual\"";
  auto tensor = [](const char* kind, const char* name, const char* shape) {
    return fmt::format("[[{}]]\nname = \"{}\"\ndtype = \"f32\"\nshape = [{}]\n", kind, name, shape);
  };
  // A block with two intermediates live at once, run by a program that has a buffer blk_t.
  test::write(dir.path() / "blk.toml",
              "kind = \"program\"\nversion = 1\nname = \"blk\"\nbackend = \"cpu\"\nconstants = { H = 8 }\n"
              "symbols = [\"T\"]\n" +
                  tensor("inputs", "x", "\"T\", \"H\"") + tensor("inputs", "g", "\"H\"") +
                  tensor("inputs", "w", "\"H\", \"H\"") + tensor("outputs", "y", "\"T\", \"H\"") +
                  tensor("buffers", "t", "\"T\", \"H\"") + tensor("buffers", "t2", "\"T\", \"H\"") +
                  "[kernels]\nrmsnorm = " + rms + "\nlin = " + lin +
                  "\n[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"x\", \"g\", \"t\", \"T\", \"H\", \"1e-5\"]\n"
                  "[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"x\", \"w\", \"t2\", \"T\", \"H\", \"1e-5\"]\n"
                  "[[steps]]\nlaunch = \"lin\"\nargs = [\"t\", \"w\", \"y\", \"t2\", \"T\", \"H\", \"H\"]\n");
  const std::string top =
      "kind = \"program\"\nversion = 1\nname = \"top\"\nbackend = \"cpu\"\nconstants = { H = 8 }\n"
      "symbols = [\"T\"]\n" +
      tensor("inputs", "x", "\"T\", \"H\"") + tensor("inputs", "g", "\"H\"") + tensor("inputs", "w", "\"H\", \"H\"") +
      tensor("outputs", "y", "\"T\", \"H\"") + tensor("outputs", "z", "\"T\", \"H\"") +
      tensor("buffers", "blk_t", "\"T\", \"H\"") + "[kernels]\nrmsnorm = " + rms +
      "\n[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"x\", \"g\", \"y\", \"T\", \"H\", \"1e-5\"]\n"
      "[[steps]]\nprogram = \"blk.toml\"\nbind = { x = \"x\", g = \"g\", w = \"w\", y = \"y\" }\n"
      "[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"y\", \"g\", \"blk_t\", \"T\", \"H\", \"1e-5\"]\n"
      "[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"blk_t\", \"g\", \"z\", \"T\", \"H\", \"1e-5\"]\n";
  ProgramSpec p = parse_program(top, dir.path() / "top.toml");
  ASSERT_EQ(p.steps.size(), 6u);
  const auto& l = p.steps[3];  // blk's lin: t and t2 are two buffers, neither the program's own blk_t
  EXPECT_NE(l.args[0].text, l.args[3].text);
  EXPECT_NE(l.args[0].text, "blk_t");
  EXPECT_NE(l.args[3].text, "blk_t");

  // A view of a bucketed intermediate: rows at the exact size, S = 3 in S's bucket 4.
  auto vb = [&](const char* name) {
    return fmt::format("kind = \"program\"\nversion = 1\nname = \"{}\"\nbackend = \"cpu\"\nconstants = {{ H = 8 }}\n"
                       "symbols = [\"T\"]\nscalars = [\"S\"]\n{}guards = [\"S >= 1\", \"T >= 2 * S\"]\n",
                       name, std::string(name) == "vb" ? "buckets = { S = \"pow2\" }\n" : "") +
           tensor("inputs", "xs", "\"T\", \"H\"") + tensor("inputs", "g", "\"H\"") +
           tensor("outputs", "y", "\"S\", \"H\"") + tensor("buffers", "buf", "\"2\", \"S\", \"H\"") +
           "[kernels]\nrmsnorm = " + rms +
           "\n[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"xs\", \"g\", \"buf\", \"2 * S\", \"H\", \"1e-5\"]\n"
           "[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"buf[1]\", \"g\", \"y\", \"S\", \"H\", \"1e-5\"]\n";
  };
  test::write(dir.path() / "vref.toml", vb("vref"));
  Runtime rt(opts);
  Program bucketed(rt, parse_program(vb("vb") + "[check]\nreference = \"vref.toml\"\n", dir.path() / "vb.toml"));
  for (int64_t S : {4, 3}) {
    std::vector<float> xs(16 * 8), g(8, 1), y(static_cast<size_t>(S * 8));
    fill_random(DType::f32, std::as_writable_bytes(std::span(xs)), 3);
    ProgramCheck c = bucketed.check({{xs.data(), {16, 8}}, {g.data(), {8}}}, {{y.data(), {S, 8}}}, nullptr, {S});
    EXPECT_TRUE(c.ok()) << "S=" << S << "\n" << c.str();
  }

  // A scalar that names an input's dimension: checked at the call, as any expression.
  Program scalar_dim(rt, parse_program("kind = \"program\"\nversion = 1\nname = \"p0\"\nbackend = \"cpu\"\n"
                                       "constants = { H = 8 }\nscalars = [\"S\"]\n" +
                                           tensor("inputs", "xs", "\"S\", \"H\"") + tensor("inputs", "g", "\"H\"") +
                                           tensor("outputs", "y", "\"S\", \"H\"") + "[kernels]\nrmsnorm = " + rms +
                                           "\n[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"xs\", \"g\", \"y\", \"S\", "
                                           "\"H\", \"1e-5\"]\n",
                                       dir.path() / "p0.toml"));
  std::vector<float> xs(16), g(8, 1), y(16);
  EXPECT_EQ(message([&] { scalar_dim.run({{xs.data(), {2, 8}}, {g.data(), {8}}}, {{y.data(), {2, 8}}}, nullptr, {2}); }),
            "no error");
  const std::string m = message(
      [&] { scalar_dim.run({{xs.data(), {2, 8}}, {g.data(), {8}}}, {{y.data(), {2, 8}}}, nullptr, {1}); });
  EXPECT_NE(m.find("input 'xs' dimension 0 is 2, but the program says S = 1"), std::string::npos) << m;

  // The model's own file: one layer (a count of 0), an index shadowing a buffer or selecting a scalar, an empty index.
  const fs::path file = programs() / "model_cpu.toml";
  const std::string text = read_file(file).value();
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  EXPECT_EQ(parse_program(edited("L = 3", "L = 1"), file).steps.size(), 10u);
  std::string e = message([&] { parse_program(edited(R"(repeat  = "L - 1")", "repeat  = \"L - 1\"\nindex = \"h\""), file); });
  EXPECT_NE(e.find("the repetition's index 'h' is also a buffer of the program"), std::string::npos) << e;
  e = message([&] { parse_program(edited(R"(y = "h[layer % 2]")", R"(y = "h[layer % 2]", S = "S + layer")"), file); });
  EXPECT_NE(e.find("bind.S: the repetition's index 'layer' selects rows of buffers only"), std::string::npos) << e;
  e = message([&] { parse_program(edited(R"(y = "h[layer % 2]")", R"(y = "h[]")"), file); });
  EXPECT_NE(e.find("bind.y: 'h[]' has an empty index"), std::string::npos) << e;

  // A view's row read before any step writes that row, though another row of the buffer was written:
  // refused when the file is read, naming the row and the rows written (once, only the whole buffer counted).
  auto rows = [&](const char* read) {
    return std::string("kind = \"program\"\nversion = 1\nname = \"rows\"\nbackend = \"cpu\"\nconstants = { H = 8 }\n"
                       "symbols = [\"T\"]\n") +
           tensor("inputs", "xs", "\"T\", \"H\"") + tensor("inputs", "g", "\"H\"") +
           tensor("outputs", "y", "\"T\", \"H\"") + tensor("buffers", "buf", "\"2\", \"T\", \"H\"") +
           "[kernels]\nrmsnorm = " + rms +
           "\n[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"xs\", \"g\", \"buf[0]\", \"T\", \"H\", \"1e-5\"]\n"
           "[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"" + read + "\", \"g\", \"y\", \"T\", \"H\", \"1e-5\"]\n";
  };
  e = message([&] { parse_program(rows("buf[1]"), dir.path() / "rows.toml"); });
  EXPECT_NE(e.find("kernel 'rmsnorm' reads 'buf[1]', row 1 of 'buf', before any step writes that row (rows "
                   "written so far: 0)"),
            std::string::npos)
      << e;
  EXPECT_EQ(message([&] { parse_program(rows("buf[2 - 2]"), dir.path() / "rows.toml"); }), "no error");
  EXPECT_EQ(message([&] { parse_program(rows("buf[T - 1]"), dir.path() / "rows.toml"); }), "no error");  // not constant

  // A launch writing a buffer it also reads (in place: the kernels read while they write, a wrong
  // answer), and an output whose rows are not all written: refused when the file is read.
  auto small = [&](const std::string& outputs, const std::string& steps) {
    return std::string("kind = \"program\"\nversion = 1\nname = \"small\"\nbackend = \"cpu\"\n"
                       "constants = { H = 8 }\nsymbols = [\"T\"]\n") +
           tensor("inputs", "xs", "\"T\", \"H\"") + tensor("inputs", "g", "\"H\"") +
           tensor("inputs", "w", "\"H\", \"H\"") + outputs + tensor("buffers", "h", "\"2\", \"T\", \"H\"") +
           "[kernels]\nrmsnorm = " + rms + "\nlin = " + lin + "\n" + steps;
  };
  const std::string norm_h = "[[steps]]\nlaunch = \"rmsnorm\"\nargs = [\"xs\", \"g\", \"h\", \"2 * T\", \"H\", \"1e-5\"]\n";
  const std::string y_out = tensor("outputs", "y", "\"T\", \"H\"");
  auto lin_step = [](const char* a, const char* c, const char* r) {
    return fmt::format("[[steps]]\nlaunch = \"lin\"\nargs = [\"{}\", \"w\", \"{}\", \"{}\", \"T\", \"H\", \"H\"]\n", a, c, r);
  };
  e = message([&] { parse_program(small(y_out, norm_h + lin_step("h[0]", "h[0]", "xs") + lin_step("h[0]", "y", "xs")),
                                  dir.path() / "small.toml"); });
  EXPECT_NE(e.find("kernel 'lin' writes 'h[0]' as 'C' and reads it as 'A' in the same launch"), std::string::npos) << e;
  e = message([&] { parse_program(small(y_out, norm_h + lin_step("h[1]", "h", "xs") + lin_step("h[0]", "y", "xs")),
                                  dir.path() / "small.toml"); });
  EXPECT_NE(e.find("writes 'h' as 'C' and reads it as 'A'"), std::string::npos) << e;  // the whole and a row
  EXPECT_EQ(message([&] { parse_program(small(y_out, norm_h + lin_step("h[1]", "h[0]", "h[1]") + lin_step("h[0]", "y", "xs")),
                                        dir.path() / "small.toml"); }),
            "no error");  // other rows of the same buffer
  e = message([&] { parse_program(small(tensor("outputs", "y", "\"2\", \"T\", \"H\""), norm_h + lin_step("h[0]", "y[0]", "xs")),
                                  dir.path() / "small.toml"); });
  EXPECT_NE(e.find("output 'y' has 2 rows, but no step writes row 1"), std::string::npos) << e;
}

}  // namespace
