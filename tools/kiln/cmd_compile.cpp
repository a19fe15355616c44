// kiln compile SPEC: compiles every config of a spec, in parallel, through the cache.
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "compile/compile_pool.hpp"
#include "commands.hpp"
#include "backends/serialize.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/program_spec.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace {

nlohmann::json params_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [n, v] : c.values) j[n] = v;
  return j;
}

// Compiles one kernel spec; prints its table (or returns its JSON object).
nlohmann::json compile_spec(Globals& g, Runtime& rt, const KernelSpec& spec, bool json, bool explain) {
  const Options& opts = rt.options();
  CompilePool& pool = rt.compile_pool(spec.backend);
  // Configs no call can run (a constraint over params alone, a block or
  // shared memory beyond the device) are not compiled.
  std::vector<Config> configs;
  std::vector<std::pair<Config, std::string>> pruned;
  const LaunchLimits limits = rt.backend(spec.backend).limits();
  for (const auto& c : spec.space.all()) {
    std::string why = statically_pruned(spec, c, limits);
    if (why.empty()) configs.push_back(c);
    else pruned.push_back({c, why});
  }

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> keys;
  std::vector<BinaryFuture> futures;
  std::vector<nlohmann::json> explained;
  BinaryKeyer keyer(spec, rt.backend(spec.backend));
  auto submit = [&](const Config& c) {
    CompileRequest req = make_compile_request(spec, c);
    BinaryKey key = keyer.key(c);
    if (explain && !json) std::fprintf(out(), "config %s\n%s\n\n", c.str().c_str(), key.to_string().c_str());
    if (explain && json)
      explained.push_back({{"format", BinaryKey::kFormatVersion},
                           {"backend", key.backend},
                           {"toolchain", key.toolchain},
                           {"entry", key.entry},
                           {"source", key.source.hex()},
                           {"defines", key.defines},
                           {"args", key.args},
                           {"cflags", key.cflags},
                           {"includes_found", key.includes_found},
                           {"includes_toolchain", key.includes_external}});
    keys.push_back(key.hex());
    futures.push_back(pool.submit(req, keys.back()));
  };
  const bool show = !opts.quiet && !json && stderr_is_terminal();
  size_t by_registers = 0;
  if (!spec.tuning.registers_by.empty()) {
    // Registers known for a sibling ([tuning] registers_by): one config of
    // each sibling class is compiled first; the others whose block would
    // need more registers than the device has are pruned before compiling.
    std::vector<Config> first, rest;
    std::set<std::string> classes;
    for (const auto& c : configs) (classes.insert(register_sibling_key(spec, c)).second ? first : rest).push_back(c);
    for (const auto& c : first) submit(c);
    wait_all(futures, "compiling " + spec.name + " (one of each register sibling class)", show);
    std::map<std::string, std::pair<int, std::string>> regs;
    for (size_t k = 0; k < first.size(); ++k) {
      try {
        if (int r = learned_registers(rt.backend(spec.backend), futures[k].get()->meta); r > 0)
          regs[register_sibling_key(spec, first[k])] = {r, first[k].str()};
      } catch (const Error&) {
      }
    }
    configs = first;
    for (const auto& c : rest) {
      auto it = regs.find(register_sibling_key(spec, c));
      std::string why = it == regs.end() ? "" : pruned_by_sibling_registers(rt.backend(spec.backend), spec, c,
                                                                             it->second.first, it->second.second);
      if (!why.empty()) {
        pruned.push_back({c, "before compiling: " + why});
        ++by_registers;
        continue;
      }
      configs.push_back(c);
      submit(c);
    }
  } else {
    for (const auto& c : configs) submit(c);
  }
  wait_all(futures, "compiling " + spec.name, show);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<CompileRecord> records = pool.records();
  auto record_of = [&](const std::string& key) -> const CompileRecord* {
    for (const auto& r : records)
      if (r.key == key && !r.deduped) return &r;
    for (const auto& r : records)
      if (r.key == key) return &r;
    return nullptr;
  };

  size_t compiled = 0, cached = 0, failed = 0;
  double compiler_seconds = 0;
  nlohmann::json rows = nlohmann::json::array();
  const bool gpu = spec.backend == "cuda";
  Table table(gpu ? std::vector<std::string>{"config", "key", "time", "regs", "smem", "local", "spill", "result"}
                  : std::vector<std::string>{"config", "key", "time", "result"},
              gpu ? std::vector<bool>{false, false, true, true, true, true, true, false}
                  : std::vector<bool>{false, false, true, false});
  std::vector<std::string> errors;
  // The compilers' messages (warnings, ptxas' advisories such as serialized wgmmas), each text
  // once, with the configs that gave it.
  std::vector<std::pair<std::string, std::vector<std::string>>> messages;
  for (size_t i = 0; i < configs.size(); ++i) {
    const CompileRecord* r = record_of(keys[i]);
    bool ok = r && r->ok;
    bool hit = r && r->cache_hit;
    double secs = r ? r->seconds : 0;
    if (!ok) ++failed;
    else if (hit) ++cached;
    else {
      ++compiled;
      compiler_seconds += secs;
    }
    std::string result = !ok ? "FAILED" : hit ? "cached" : "compiled";
    KernelMeta meta;
    std::string log;
    if (ok) {
      const auto bin = futures[i].get();
      meta = bin->meta;
      log = bin->log;
    }
    if (!log.empty()) {
      auto it = std::find_if(messages.begin(), messages.end(), [&](const auto& m) { return m.first == log; });
      if (it == messages.end()) it = messages.insert(messages.end(), {log, {}});
      it->second.push_back(configs[i].str());
    }
    if (gpu)
      table.row({configs[i].str(), keys[i].substr(0, 12), seconds_text(secs), std::to_string(meta.registers),
                 std::to_string(meta.static_shared), std::to_string(meta.local_bytes), std::to_string(meta.spill_bytes),
                 result});
    else
      table.row({configs[i].str(), keys[i].substr(0, 12), seconds_text(secs), result});
    if (!ok && r) errors.push_back(r->error);
    rows.push_back({{"params", params_json(configs[i])},
                    {"key", keys[i]},
                    {"seconds", secs},
                    {"cached", hit},
                    {"ok", ok},
                    {"bytes", r ? r->bytes : 0},
                    {"registers", meta.registers},
                    {"static_shared", meta.static_shared},
                    {"local_bytes", meta.local_bytes},
                    {"spill_bytes", meta.spill_bytes},
                    {"log", log},
                    {"error", ok || !r ? nlohmann::json(nullptr) : nlohmann::json(r->error)}});
    if (explain && json) rows.back()["explain"] = explained[i];
  }
  if (failed) g.exit_code = 1;
  if (json) {
    nlohmann::json result = {{"kernel", spec.name},
                          {"backend", spec.backend},
                          {"threads", pool.threads()},
                          {"wall_seconds", wall},
                          {"configs", rows},
                          {"pruned", pruned.size()},
                          {"pruned_by_registers", by_registers},
                          {"totals",
                           {{"configs", configs.size()},
                            {"compiled", compiled},
                            {"cached", cached},
                            {"failed", failed},
                            {"compiler_seconds", compiler_seconds}}}};
    return result;
  }
  std::fprintf(out(), "%s", table.str().c_str());
  std::fprintf(out(), "%zu configs of %s: %zu compiled, %zu cached, %zu failed in %s (%s of compiling, %d threads); "
               "%zu pruned (no call can run them%s)\n",
               configs.size(), spec.name.c_str(), compiled, cached, failed, seconds_text(wall).c_str(),
               seconds_text(compiler_seconds).c_str(), pool.threads(), pruned.size(),
               by_registers ? fmt::format("; {} by a sibling's registers, before compiling", by_registers).c_str() : "");
  for (const auto& [c, why] : pruned)
    if (why.rfind("before compiling: ", 0) == 0) std::fprintf(out(), "  %s: pruned %s\n", c.str().c_str(), why.c_str());
  for (const auto& [text, which] : messages) {
    std::string names = which.size() <= 3 ? fmt::format("{}", fmt::join(which, "; "))
                                          : fmt::format("{}; {} and {} more", which[0], which[1], which.size() - 2);
    std::fprintf(out(), "the compiler's messages for %zu config%s (%s):\n", which.size(), which.size() == 1 ? "" : "s",
                 names.c_str());
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) std::fprintf(out(), "  %s\n", l.c_str());
  }
  for (const auto& e : errors) std::fprintf(stderr, "\nkiln: error: %s\n", e.c_str());
  return nullptr;
}

void run_compile(Globals& g, const std::string& spec_path, bool json, bool explain) {
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  Runtime rt(opts);
  if (is_program_file(spec_path)) {
    // A program: every kernel it launches (each variant of a multi-kernel).
    ProgramSpec p = load_program(spec_path);
    nlohmann::json kernels = nlohmann::json::array();
    bool first = true;
    for (const auto& k : p.kernels) {
      std::vector<const KernelSpec*> specs;
      if (k.kind == ProgramKernel::Kind::multi) {
        for (const auto& v : k.multi.variants)
          for (const auto& st : v.steps)
            if (std::none_of(specs.begin(), specs.end(),
                             [&](const KernelSpec* x) { return x->path_text() == st.kernel.path_text(); }))
              specs.push_back(&st.kernel);
      } else {
        specs.push_back(&k.kernel);
      }
      for (const KernelSpec* s : specs) {
        if (!json) std::fprintf(out(), "%skernel %s: %s\n", first ? "" : "\n", k.name.c_str(), s->path_text().c_str());
        first = false;
        kernels.push_back(compile_spec(g, rt, *s, json, explain));
      }
    }
    if (json) std::fprintf(out(), "%s\n", dump_json(nlohmann::json({{"program", p.name}, {"kernels", kernels}}), 2).c_str());
    return;
  }
  if (!is_multi_spec(spec_path)) {
    nlohmann::json result = compile_spec(g, rt, load_spec(spec_path), json, explain);
    if (json) std::fprintf(out(), "%s\n", dump_json(result, 2).c_str());
    return;
  }
  // A multi-kernel: every variant's config space.
  MultiKernelSpec m = load_multi_spec(spec_path);
  nlohmann::json variants = nlohmann::json::array();
  std::vector<std::string> done;  // a spec two variants launch is compiled once
  for (size_t i = 0; i < m.variants.size(); ++i) {
    const auto& steps = m.variants[i].steps;
    nlohmann::json per_step = nlohmann::json::array();
    for (size_t k = 0; k < steps.size(); ++k) {
      const KernelSpec& ks = steps[k].kernel;
      std::string label = steps.size() > 1 ? fmt::format("variant {}, step {}", i, k) : fmt::format("variant {}", i);
      const bool again = std::find(done.begin(), done.end(), ks.path_text()) != done.end();
      if (!json)
        std::fprintf(out(), "%s%s: %s%s\n", i || k ? "\n" : "", label.c_str(), ks.path_text().c_str(),
                     again ? " (compiled above)" : "");
      if (again) {
        per_step.push_back({{"spec", ks.path_text()}, {"compiled_above", true}});
        continue;
      }
      done.push_back(ks.path_text());
      per_step.push_back(compile_spec(g, rt, ks, json, explain));
    }
    variants.push_back(steps.size() > 1 ? nlohmann::json({{"steps", per_step}}) : per_step[0]);
  }
  if (json) std::fprintf(out(), "%s\n", dump_json(nlohmann::json({{"multi_kernel", m.name}, {"variants", variants}}), 2).c_str());
}

}  // namespace

void add_compile(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("compile", "Compile every config of a kernel spec, of each variant of a "
                                            "multi-kernel spec, or of every kernel a program launches (in parallel, "
                                            "through the cache)");
  auto spec = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto explain = std::make_shared<bool>(false);
  cmd->add_option("spec", *spec,
                  "The kernel's spec file, a family's member (file.toml:member), a multi-kernel spec or a program "
                  "(.toml)")
      ->required()
      ->check(SpecFile);
  cmd->add_flag("--json", *json, "Print one JSON object instead of the table");
  cmd->add_flag("--explain", *explain, "Print every field of each config's binary key");
  cmd->callback([&g, spec, json, explain] { run_compile(g, *spec, *json, *explain); });
}

}  // namespace kiln::cli
