// kiln run PROGRAM --set T=...: runs a program on random inputs and prints
// per-step times; kiln emit PROGRAM -o file.hpp: C++ with its steps unrolled.
#include <charconv>
#include <chrono>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/format.hpp"
#include "kiln/memory_plan.hpp"
#include "kiln/device_args.hpp"
#include "kiln/fill.hpp"
#include "kiln/program.hpp"
#include "emit.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace {

struct RunArgs {
  std::string program;
  std::vector<std::string> sets;
  std::string loop;  // NAME=N: N calls, scalar NAME growing by one a call (a decode loop)
  int reps = 20;
  int calls = 200;
  bool show = false, json = false, wide = false, first_only = false, check = false;
  uint64_t seed = 0;
};

void run_program(const RunArgs& a, Globals& g) {
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  ProgramSpec spec = load_program(a.program);
  if (a.show && !a.json) std::fprintf(out(), "%s\n", spec.str().c_str());  // with --json, in the object
  std::map<std::string, int64_t> values;
  const std::vector<std::string> names = spec.all_symbols();
  for (const auto& [n, v] : split_sets(a.sets)) {
    if (std::find(names.begin(), names.end(), n) == names.end())
      fail(Errc::usage, "--set {}: '{}' is not a symbol or scalar of program '{}' (they are: {})", n, n, spec.name,
           fmt::join(names, ", "));
    int64_t x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size()) fail(Errc::usage, "--set {}={}: not an integer", n, v);
    values[n] = x;
  }
  for (const auto& s : names)
    if (!values.count(s)) fail(Errc::usage, "symbol '{}' needs a value: --set {}=...", s, s);
  std::vector<int64_t> scalars;  // the call's, in the spec's order
  for (const auto& s : spec.scalars) scalars.push_back(values.at(s));
  if (a.check && a.first_only) fail(Errc::usage, "--check needs the inputs --first-only leaves zero: use one or the other");
  if (!a.loop.empty() && a.first_only)
    fail(Errc::usage, "--loop times calls after the first; --first-only makes the first alone: use one or the other");
  if (a.check && spec.check.reference.empty())
    fail(Errc::usage, "--check: program '{}' names no reference to check it against ([check] reference = \"file.toml\" "
                      "in {}; docs/program.md)", spec.name, a.program);
  Runtime rt(opts);
  Device& dev = rt.device(spec.backend);
  // Random inputs and empty outputs in the device's memory.
  std::vector<DeviceBuffer> held;
  InputFiller filler(rt, spec.backend);  // on a GPU, a kernel fills its memory
  auto make = [&](const ProgramTensor& t, bool fill, uint64_t seed) {
    const std::vector<int64_t> shape = spec.dims(t, values);
    const int64_t n = spec.elements(t, values);
    const size_t bytes = buffer_bytes(t.dtype, n, t.name);
    held.emplace_back(dev, bytes ? bytes : 1);
    if (fill && !a.first_only) filler.fill(t, held.back().get(), bytes, seed, a.wide);
    return Tensor{held.back().get(), shape};
  };
  held.reserve(spec.inputs.size() + spec.outputs.size());
  std::vector<Tensor> in, outs;
  for (size_t i = 0; i < spec.inputs.size(); ++i) in.push_back(make(spec.inputs[i], true, input_seed(a.seed, i)));
  for (const auto& t : spec.outputs) outs.push_back(make(t, false, 0));
  dev.sync(nullptr);
  // What the program compiled, not counting the input fill's kernel.
  const uint64_t fill_compiled = rt.stats().compiled;

  auto t0 = std::chrono::steady_clock::now();
  Program prog(rt, spec);
  prog.run(in, outs, nullptr, scalars);
  dev.sync(nullptr);
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.first_only) {
    Runtime::Stats rs = rt.stats();
    if (a.json) {
      nlohmann::json j = {{"program", spec.name}, {"backend", spec.backend}, {"first_call_s", first_s},
                          {"compiled", rs.compiled - fill_compiled}, {"configs_timed", rs.configs_timed}};
      if (a.show) j["show"] = spec.str();
      std::fprintf(out(), "%s\n", j.dump(2).c_str());
    } else {
      std::fprintf(out(), "first call %.4f s: %llu compiled, %llu configs timed\n", first_s,
                   static_cast<unsigned long long>(rs.compiled - fill_compiled),
                   static_cast<unsigned long long>(rs.configs_timed));
    }
    return;  // the runtime drops the tunings the first call queued
  }
  rt.wait_tuned();
  const double tuned_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> step_ns = prog.time_steps(in, outs, a.reps, scalars);
  std::vector<std::string> choices = prog.choices(in, outs, scalars);
  // Whole calls, back to back, without synchronising between them.
  for (int i = 0; i < 3; ++i) prog.run(in, outs, nullptr, scalars);
  dev.sync(nullptr);
  auto timer = dev.timer();
  timer->start(nullptr);
  auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.calls; ++i) prog.run(in, outs, nullptr, scalars);
  const double host_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - h0).count() / a.calls;
  timer->stop(nullptr);
  const double call_ns = timer->elapsed_ns() / a.calls;
  const double handles_ns = prog.host_ns_handles_only(in, outs, a.calls, scalars);
  MemoryPlan mem = prog.memory(values);
  // A decode loop: N calls back to back, the scalar growing by one a call, twice over
  // the same values: the first pass tunes and captures what each bucket needs, the
  // second is timed (host time a call, the device's time a call, and what the graphs did).
  struct Loop {
    std::string name;
    int64_t from = 0, n = 0;
    double host_ns = 0, call_ns = 0;
    Program::Stats first, second;  // what each pass added
  };
  std::optional<Loop> loop;
  if (!a.loop.empty()) {
    auto [n, v] = split_sets({a.loop}, "--loop").at(0);
    auto it = std::find(spec.scalars.begin(), spec.scalars.end(), n);
    if (it == spec.scalars.end())
      fail(Errc::usage, "--loop {}: '{}' is not a scalar of program '{}' (scalars: {})", a.loop, n, spec.name,
           fmt::join(spec.scalars, ", "));
    Loop l;
    l.name = n;
    l.from = values.at(n);
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), l.n);
    if (ec != std::errc() || p != v.data() + v.size() || l.n < 1) fail(Errc::usage, "--loop {}: N is a count, 1 or more", a.loop);
    const size_t idx = static_cast<size_t>(it - spec.scalars.begin());
    std::vector<int64_t> sc = scalars;
    auto diff = [](const Program::Stats& x, const Program::Stats& y) {
      Program::Stats d;
      d.calls = x.calls - y.calls;
      d.graph_captures = x.graph_captures - y.graph_captures;
      d.graph_replays = x.graph_replays - y.graph_replays;
      d.graph_updates = x.graph_updates - y.graph_updates;
      d.graph_update_ns = x.graph_update_ns - y.graph_update_ns;
      d.cell_calls = x.cell_calls - y.cell_calls;
      return d;
    };
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 0 && !opts.quiet)
        std::fprintf(stderr, "decode loop: %lld calls, %s from %lld (a first pass tunes what it needs)\n",
                     static_cast<long long>(l.n), n.c_str(), static_cast<long long>(l.from));
      dev.sync(nullptr);
      if (pass == 1) rt.wait_tuned();
      const Program::Stats s0 = prog.stats();
      timer->start(nullptr);
      auto l0 = std::chrono::steady_clock::now();
      for (int64_t k = 0; k < l.n; ++k) {
        sc[idx] = l.from + k;
        prog.run(in, outs, nullptr, sc);
      }
      const double h = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - l0).count();
      timer->stop(nullptr);
      (pass == 0 ? l.first : l.second) = diff(prog.stats(), s0);
      if (pass == 1) {
        l.host_ns = h / static_cast<double>(l.n);
        l.call_ns = timer->elapsed_ns() / static_cast<double>(l.n);
      }
    }
    loop = l;
  }
  // The result of the tuned program (graphs replayed where they are) against its reference.
  std::optional<ProgramCheck> checked;
  double check_s = 0;
  if (a.check) {
    auto c0 = std::chrono::steady_clock::now();
    checked = prog.check(in, outs, nullptr, scalars);
    check_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    if (!checked->ok()) g.exit_code = 3;
  }
  Program::Stats st = prog.stats();
  Runtime::Stats rs = rt.stats();

  if (a.json) {
    nlohmann::json steps = nlohmann::json::array();
    for (size_t i = 0; i < step_ns.size(); ++i) steps.push_back({{"step", i + 1}, {"ns", step_ns[i]}, {"choice", choices[i]}});
    nlohmann::json j = {{"program", spec.name},   {"backend", spec.backend},      {"symbols", values},
                        {"first_call_s", first_s}, {"tuned_s", tuned_s},          {"steps", steps},
                        {"call_ns", call_ns},      {"host_ns_per_call", host_ns}, {"host_ns_handles_only", handles_ns}, {"arena_bytes", mem.arena},
                        {"intermediate_bytes", mem.sum}, {"graph_captures", st.graph_captures},
                        {"graph_replays", st.graph_replays}, {"graph_updates", st.graph_updates}, {"compiled", rs.compiled - fill_compiled}, {"configs_timed", rs.configs_timed}};
    if (loop)
      j["loop"] = {{"scalar", loop->name}, {"from", loop->from}, {"calls", loop->n}, {"host_ns_per_call", loop->host_ns},
                   {"call_ns", loop->call_ns}, {"graph_captures", loop->second.graph_captures},
                   {"graph_updates", loop->second.graph_updates}, {"graph_replays", loop->second.graph_replays},
                   {"graph_update_ns_per_call", loop->second.graph_update_ns / static_cast<double>(loop->n)},
                   {"cell_calls", loop->second.cell_calls}, {"cells_refusal", prog.cells_refusal()},
                   {"first_pass_graph_captures", loop->first.graph_captures}};
    if (a.show) j["show"] = spec.str();
    if (checked) {
      nlohmann::json outs_j = nlohmann::json::array();
      for (const auto& o : checked->outputs)
        outs_j.push_back({{"name", o.name}, {"compared", o.compared}, {"bad", o.bad}, {"max_error", o.max_error},
                          {"worst", o.worst}, {"rtol", o.rtol}, {"atol", o.atol}});
      j["check"] = {{"ok", checked->ok()}, {"reference", checked->reference}, {"rows", checked->rows},
                    {"outputs", outs_j}, {"seconds", check_s}};
    }
    std::fprintf(out(), "%s\n", j.dump(1).c_str());
    return;
  }
  std::string sym;
  for (const auto& [n, v] : values) sym += fmt::format("{}{}={}", sym.empty() ? "" : " ", n, v);
  std::fprintf(out(), "program %s (%s) at %s: first call %s, every step tuned %s\n", spec.name.c_str(),
               spec.backend.c_str(), sym.c_str(), seconds_text(first_s).c_str(), seconds_text(tuned_s).c_str());
  Table t({"step", "time", "share", "runs"}, {true, true, true, false});
  double sum = 0;
  for (double x : step_ns) sum += x;
  for (size_t i = 0; i < step_ns.size(); ++i)
    t.row({std::to_string(i + 1), seconds_text(step_ns[i] * 1e-9), fmt::format("{:.0f}%", 100 * step_ns[i] / sum),
           choices[i]});
  std::fprintf(out(), "%s", t.str().c_str());
  std::fprintf(out(), "steps one at a time: %s; whole calls back to back: %s a call on the device, %s of host time\n",
               seconds_text(sum * 1e-9).c_str(), seconds_text(call_ns * 1e-9).c_str(),
               seconds_text(host_ns * 1e-9).c_str());
  const std::string peak = fmt::format("{:.2f} MiB", mem.arena / 1048576.0);
  const std::string all = fmt::format("{:.2f} MiB", mem.sum / 1048576.0);
  std::fprintf(out(), "intermediates: %s in one arena (peak) for %s in all; graphs captured %llu, replayed %llu\n",
               peak.c_str(), all.c_str(), static_cast<unsigned long long>(st.graph_captures),
               static_cast<unsigned long long>(st.graph_replays));
  if (loop)
    std::fprintf(out(),
                 "decode loop: %lld calls, %s = %lld .. %lld: %s of host time a call (%s of it setting graphs in "
                 "place), %s a call on the device; "
                 "graphs captured %llu, updated in place %llu, replayed %llu (the first pass captured %llu); "
                 "%llu calls sized for their bucket, the exact value in a cell\n",
                 static_cast<long long>(loop->n), loop->name.c_str(), static_cast<long long>(loop->from),
                 static_cast<long long>(loop->from + loop->n - 1), seconds_text(loop->host_ns * 1e-9).c_str(),
                 seconds_text(loop->second.graph_update_ns / static_cast<double>(loop->n) * 1e-9).c_str(),
                 seconds_text(loop->call_ns * 1e-9).c_str(), static_cast<unsigned long long>(loop->second.graph_captures),
                 static_cast<unsigned long long>(loop->second.graph_updates),
                 static_cast<unsigned long long>(loop->second.graph_replays),
                 static_cast<unsigned long long>(loop->first.graph_captures),
                 static_cast<unsigned long long>(loop->second.cell_calls));
  if (loop && !prog.cells_refusal().empty())
    std::fprintf(out(), "no cells: %s (docs/program.md, \"Cells\")\n", prog.cells_refusal().c_str());
  if (checked) std::fprintf(out(), "%s(checked in %s)\n", checked->str().c_str(), seconds_text(check_s).c_str());
}

}  // namespace

void add_program(CLI::App& app, Globals& g) {
  auto a = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand(
      "run", "Run a program (kind = \"program\") on random inputs: the first call (compiling and tuning what it "
             "needs), then each step's time, whole calls back to back, the memory plan");
  run->add_option("program", a->program, "The program file (.toml)")->required()->check(CLI::ExistingFile);
  run->add_option("--set", a->sets, "A symbol's value, NAME=VALUE (each symbol needs one)")
      ->allow_extra_args(false);  // one value an occurrence: the program file after it is not taken as one
  run->add_option("--reps", a->reps, "Timed runs of each step (the median is shown)")->check(CLI::Range(1, 100000))
      ->capture_default_str();
  run->add_option("--calls", a->calls, "Whole calls timed back to back")->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  run->add_option("--seed", a->seed, "Seed of the random inputs")->check(Seed)->capture_default_str();
  run->add_flag("--wide", a->wide, "Inputs of a large dynamic range (as kiln tune --inputs wide)");
  run->add_option("--loop", a->loop,
                  "NAME=N: then N calls back to back with scalar NAME growing by one a call from its --set value "
                  "(a decode loop), twice: the second pass is timed (host time a call, graphs captured and updated, "
                  "calls sized for their bucket with NAME in a cell, or why not: KILN_PROGRAM_CELLS, docs/program.md)");
  run->add_flag("--show", a->show, "Print the program first, its allocations and frees made explicit (with --json: as the object's \"show\")");
  run->add_flag("--first-only", a->first_only,
                "Make the first call only, say how long it took, and exit (tunings it started are dropped; the "
                "inputs are left zero: this times loading and the first call, not the kernels)");
  run->add_flag("--check", a->check,
                "Then run the tuned program once more and check its outputs against its reference program ([check] "
                "in the program file): each output's worst element is named; exit code 3 when the check fails");
  run->add_flag("--json", a->json, "Print one JSON object");
  run->callback([a, &g] { run_program(*a, g); });

  auto path = std::make_shared<std::string>();
  auto dest = std::make_shared<std::string>();
  auto* emit = app.add_subcommand("emit", "Write C++ that loads and runs a program through libkiln, its steps "
                                          "unrolled (a header to include; see examples/program_app)");
  emit->add_option("program", *path, "The program file (.toml)")->required()->check(CLI::ExistingFile);
  emit->add_option("-o,--output", *dest, "Where to write it (default: standard output)");
  emit->callback([path, dest] {
    std::string code = emit_program_cpp(load_program(*path));
    if (dest->empty()) {
      std::fprintf(out(), "%s", code.c_str());
      return;
    }
    std::ofstream f(*dest, std::ios::binary);
    if (!f) fail(Errc::io, "emit: cannot write {}", *dest);
    f << code;
    if (!f) fail(Errc::io, "emit: writing {} failed", *dest);
  });
}

}  // namespace kiln::cli
