// A model program's outputs over a prompt and then decode steps, saved for a
// comparison with another implementation of the same model (the whole-model
// issue: logits against PyTorch in float32 on the same weights).
//
// Usage: kiln_bench_model_logits PROGRAM --out DIR [--prompt 128] [--chunk 0] [--steps 16] [--seed 0]
//
// The program must have the symbols T (new tokens, bound from its first input
// x [T, H]) and CAP (the caches' capacity), the one scalar S (the tokens the
// caches hold) and an output named logits, as kernels/programs/model_*.toml
// have. Its inputs are filled as `kiln run --seed` fills them (kiln/fill.hpp),
// with CAP = prompt + chunk + steps. Call 0 is the prompt (T = prompt, S = 0);
// with --chunk C, call 1 is a second part of the prompt (T = C, S = prompt: new
// tokens over a cache, the causal mask aligned bottom-right); then each decode
// step (T = 1, S growing by one). Call k's x is filled with seed
// input_seed(seed, 0) + k * 2^32. Writes DIR/call<k>.<output>.bin (each
// output's bytes as the device holds them) and, once every call is done,
// DIR/meta.json: the calls and what each step ran, every input's dtype, shape,
// seed, scale or constant, and a few of its values (so that a
// reimplementation of the generator can check itself before it compares).
// The inputs are filled where the program runs (on a GPU by a kernel:
// kiln::InputFiller). With BENCH_EXEC_NS set to the wall clock's nanoseconds
// when the process was started (`BENCH_EXEC_NS=$(date +%s%N) kiln_bench_...`),
// it also says how long after that the first call's outputs were ready (the
// start to the first token, bench/gpu/warm_start.sh).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/fill.hpp"
#include "kiln/program.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {


// A few of a filled buffer's values (`bytes` of the device's memory at `data`): its first,
// some at the host generator's chunk boundaries and the device fill's block and grid strides,
// its last.
nlohmann::json samples(Device& dev, DType t, const void* data, size_t bytes) {
  const size_t size = dtype_size(t), n = bytes / size;
  nlohmann::json out = nlohmann::json::array();
  std::byte v[8];
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{255}, size_t{256}, size_t{1} << 22, (size_t{1} << 22) + 1,
                   size_t{3} << 22, n / 2, n - 1})
    if (i < n) {
      dev.to_host(v, static_cast<const std::byte*>(data) + i * size, size, nullptr);
      dev.sync(nullptr);
      out.push_back({{"index", i}, {"value", element_value(t, v, 0)}});
    }
  return out;
}

// Seconds since BENCH_EXEC_NS (the wall clock when the process was started), or -1 without it.
double after_exec() {
  const char* e = std::getenv("BENCH_EXEC_NS");
  if (!e) return -1;
  return (static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()) -
          std::strtod(e, nullptr)) /
         1e9;
}

int usage(const std::string& why) {
  std::fprintf(stderr,
               "kiln_bench_model_logits: %s\nusage: kiln_bench_model_logits PROGRAM --out DIR [--prompt 128] "
               "[--chunk 0] [--steps 16] [--seed 0]\n",
               why.c_str());
  return 2;
}

// A whole non-negative integer, at most `most`.
template <typename T>
bool parse(const char* text, T most, T& out) {
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, out);
  if (ec != std::errc() || p != end || end == text || out > most) return false;
  if constexpr (std::is_signed_v<T>) return out >= 0;
  return true;
}

void write_file(const fs::path& f, const void* data, size_t bytes) {
  std::ofstream o(f, std::ios::binary);
  o.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  o.close();
  if (!o) throw std::runtime_error("cannot write " + f.string());
}

int run(int argc, char** argv) {
  std::vector<std::pair<const char*, double>> stages = {{"main", after_exec()}};  // (what was done, s after exec)
  if (argc < 2 || argv[1][0] == '-') return usage("no program given");
  const fs::path program = argv[1];
  fs::path out_dir;
  int64_t prompt = 128, chunk = 0, steps = 16;
  uint64_t seed = 0;
  constexpr int64_t kMost = int64_t{1} << 24;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage("missing the value of " + a);
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--out") out_dir = v;
    else if (a == "--prompt") ok = parse(v, kMost, prompt) && prompt >= 1;
    else if (a == "--chunk") ok = parse(v, kMost, chunk);
    else if (a == "--steps") ok = parse(v, kMost, steps);
    else if (a == "--seed") ok = parse(v, ~uint64_t{0}, seed);
    else return usage("unknown option " + a);
    if (!ok)
      return usage(a + " " + v + ": not a whole number" + (a == "--prompt" ? " from 1" : " from 0") +
                   (a == "--seed" ? "" : " to 2^24"));
  }
  if (out_dir.empty()) return usage("--out DIR is required");
  // The runtime, and a GPU's context where there is one, made on a thread while the
  // program is read (an engine starts its device beside reading its model, as here).
  std::unique_ptr<Runtime> made;
  std::exception_ptr made_error;
  std::thread maker([&] {
    try {
      made = std::make_unique<Runtime>(Options::from_env());
    } catch (...) {
      made_error = std::current_exception();
      return;
    }
    try {
      if (made->backend("cuda").unavailable_reason().empty()) made->device("cuda");
    } catch (...) {
      // Said below, where the program's backend is asked for its device.
    }
  });
  ProgramSpec spec;
  try {
    spec = load_program(program);
  } catch (...) {
    maker.join();
    throw;
  }
  const double read_at = after_exec();
  maker.join();
  stages.push_back({"program read", read_at});
  if (made_error) std::rethrow_exception(made_error);
  auto has = [](const std::vector<std::string>& v, const char* n) { return std::find(v.begin(), v.end(), n) != v.end(); };
  const bool has_logits = std::any_of(spec.outputs.begin(), spec.outputs.end(),
                                      [](const ProgramTensor& t) { return t.name == "logits"; });
  if (!has(spec.symbols, "T") || !has(spec.symbols, "CAP") || spec.scalars != std::vector<std::string>{"S"} ||
      spec.inputs.empty() || spec.inputs[0].name != "x" || spec.inputs[0].shape.size() != 2 || !has_logits)
    return usage("program '" + spec.name + "' is not a model program: it needs symbols T and CAP, the one scalar S, "
                 "x [T, H] as its first input and an output named logits");
  fs::create_directories(out_dir);
  fs::remove(out_dir / "meta.json");  // a run cut short leaves none to be taken for its results

  Runtime& rt = *made;
  stages.push_back({"runtime", after_exec()});
  Device& dev = rt.device(spec.backend);
  stages.push_back({"device", after_exec()});
  const int64_t cap = prompt + chunk + steps;
  // Buffers whose size follows T are made for the largest call (the prompt or the chunk).
  std::map<std::string, int64_t> at_prompt{{"T", std::max(prompt, chunk)}, {"CAP", cap}, {"S", 0}};
  nlohmann::json meta = {{"program", spec.name}, {"file", program.string()}, {"seed", seed},
                         {"prompt", prompt},     {"chunk", chunk},          {"steps", steps}, {"CAP", cap}};
  // The program is made before its weights (what it reads ahead of its first call,
  // on the runtime's thread, overlaps their making).
  Program prog(rt, spec);
  stages.push_back({"program made", after_exec()});
  std::vector<DeviceBuffer> held;
  held.reserve(spec.inputs.size() + spec.outputs.size());
  std::vector<Tensor> in, outs;
  InputFiller filler(rt, spec.backend);
  auto t_fill = std::chrono::steady_clock::now();
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const ProgramTensor& t = spec.inputs[i];
    const std::vector<int64_t> shape = spec.dims(t, at_prompt);
    const size_t bytes = buffer_bytes(t.dtype, spec.elements(t, at_prompt), t.name);
    held.emplace_back(dev, bytes ? bytes : 1);
    nlohmann::json m = {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", shape},
                        {"seed", input_seed(seed, i)}, {"state", t.state}};
    if (t.constant) m["constant"] = *t.constant;
    else m["scale"] = t.scale;
    if (i > 0) {  // x is filled at each call
      filler.fill(t, held.back().get(), bytes, input_seed(seed, i));
      dev.sync(nullptr);
      m["samples"] = samples(dev, t.dtype, held.back().get(), bytes);
    }
    meta["inputs"].push_back(m);
    in.push_back({held.back().get(), shape});
  }
  for (const auto& t : spec.outputs) {
    const size_t bytes = buffer_bytes(t.dtype, spec.elements(t, at_prompt), t.name);
    held.emplace_back(dev, bytes ? bytes : 1);
    outs.push_back({held.back().get(), spec.dims(t, at_prompt)});
    meta["outputs"].push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}});
  }
  const double fill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fill).count();
  std::fprintf(stderr, "inputs filled in %.3f s (%s)\n", fill_s, filler.on_device() ? "on the device" : "on the host");

  stages.push_back({"inputs", after_exec()});
  std::vector<std::pair<int64_t, int64_t>> calls = {{prompt, 0}};  // (T, S)
  if (chunk > 0) calls.push_back({chunk, prompt});
  for (int64_t k = 0; k < steps; ++k) calls.push_back({1, prompt + chunk + k});
  double first_token_at = -1;
  for (size_t k = 0; k < calls.size(); ++k) {
    const auto [T, S] = calls[k];
    const std::map<std::string, int64_t> now{{"T", T}, {"CAP", cap}, {"S", S}};
    const ProgramTensor& xt = spec.inputs[0];
    in[0].shape = spec.dims(xt, now);
    const uint64_t xseed = input_seed(seed, 0) + (static_cast<uint64_t>(k) << 32);
    const size_t xbytes = buffer_bytes(xt.dtype, spec.elements(xt, now), "x");
    filler.fill(xt, in[0].data, xbytes, xseed);
    for (size_t o = 0; o < outs.size(); ++o) outs[o].shape = spec.dims(spec.outputs[o], now);
    dev.sync(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    prog.run(in, outs, nullptr, {S});
    dev.sync(nullptr);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k == 0) {
      // The first token is known once the last row of the logits is on the host (an engine
      // samples it); the rest of this call's outputs are read back and written after.
      for (size_t o = 0; o < outs.size(); ++o) {
        const ProgramTensor& ot = spec.outputs[o];
        if (ot.name != "logits") continue;
        const size_t bytes = buffer_bytes(ot.dtype, spec.elements(ot, now), ot.name);
        const size_t row = outs[o].shape.empty() || outs[o].shape[0] == 0 ? bytes : bytes / outs[o].shape[0];
        std::vector<std::byte> last(row);
        dev.to_host(last.data(), static_cast<const std::byte*>(outs[o].data) + (bytes - row), row, nullptr);
        dev.sync(nullptr);
      }
      first_token_at = after_exec();
    }
    // The first call of each shape includes its compiles and tunings.
    nlohmann::json call = {{"T", T}, {"S", S}, {"x_seed", xseed}, {"seconds", s}, {"x_samples", samples(dev, xt.dtype, in[0].data, xbytes)}};
    for (size_t o = 0; o < outs.size(); ++o) {
      const ProgramTensor& ot = spec.outputs[o];
      std::vector<std::byte> host(buffer_bytes(ot.dtype, spec.elements(ot, now), ot.name));
      dev.to_host(host.data(), outs[o].data, host.size(), nullptr);
      dev.sync(nullptr);
      const fs::path f = out_dir / ("call" + std::to_string(k) + "." + ot.name + ".bin");
      write_file(f, host.data(), host.size());
      call["outputs"][ot.name] = {{"file", f.filename().string()}, {"shape", outs[o].shape}};
    }
    call["choices"] = prog.choices(in, outs, {S});  // what each step ran: "kernel: config (source)"
    meta["calls"].push_back(call);
    if (const double after = first_token_at; k == 0 && after >= 0) {
      stages.push_back({"first token", after});
      std::string text;
      for (const auto& [what, at] : stages) text += fmt::format("{}{} {:.3f}", text.empty() ? "" : ", ", what, at);
      std::fprintf(stderr, "first token %.3f s after exec (inputs filled in %.3f s, first call %.3f s)\n", after,
                   fill_s, s);
      std::fprintf(stderr, "stages, s after exec: %s\n", text.c_str());
      meta["first_token_after_exec_s"] = after;
    }
    const bool new_shape = std::none_of(calls.begin(), calls.begin() + static_cast<std::ptrdiff_t>(k),
                                        [&](const auto& c) { return c.first == T; });
    std::fprintf(stderr, "call %zu: T=%lld S=%lld in %.3f s%s\n", k, static_cast<long long>(T),
                 static_cast<long long>(S), s, new_shape ? " (the first of this shape: it compiles and tunes what the caches lack)" : "");
  }
  const std::string text = meta.dump(1) + "\n";
  write_file(out_dir / "meta.json.part", text.data(), text.size());
  fs::rename(out_dir / "meta.json.part", out_dir / "meta.json");
  std::printf("%zu calls of %s written to %s\n", calls.size(), spec.name.c_str(), out_dir.string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench_model_logits: %s\n", e.what());
    return 1;
  }
}
