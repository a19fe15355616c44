// The first call of a shape with no record (KILN_FIRST_CALL=swap and serve),
// shared by Kernel and MultiKernel. See first_call.hpp and docs/dispatch.md.
#include "dispatch/first_call.hpp"

#include "compile/compile_pool.hpp"

#include <chrono>
#include <mutex>
#include <thread>
#include <set>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/library.hpp"
#include "tune/benchmarker.hpp"

namespace kiln {

namespace {

// Whether every output of two runs of a call agrees, by the tuning's rules.
bool agree(const CallView& call, const std::vector<std::vector<std::byte>>& a,
           const std::vector<std::vector<std::byte>>& b) {
  const KernelSpec& spec = call.spec;
  for (size_t i = 0; i < spec.args.size() && i < a.size() && i < b.size(); ++i) {
    if (a[i].empty() || spec.args[i].intent == Intent::in) continue;
    if (a[i].size() != b[i].size() || Tuner::compare(spec.args[i].dtype, a[i], b[i], spec.tuning, call.reduction))
      return false;
  }
  return true;
}

// What each argument holds after a run (empty for inputs and scalars).
std::vector<std::vector<std::byte>> outputs_of(const KernelSpec& spec, const BenchInputs& in) {
  std::vector<std::vector<std::byte>> out;
  for (size_t i = 0; i < spec.args.size(); ++i) {
    auto o = in.result(i);
    out.emplace_back(o.begin(), o.end());
  }
  return out;
}

// True the first time it is asked of a kernel's name in this process.
bool said_once(const std::string& kernel) {
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> g(m);
  return said.insert(kernel).second;
}

}  // namespace

std::optional<Config> reference_for(Runtime& rt, const CallView& call, const Config& config) {
  const KernelSpec& spec = call.spec;
  Backend& be = rt.backend(spec.backend);
  // The spec's reference config, else its first library choice that is here (what a tuning trusts).
  if (spec.tuning.reference_config && !(*spec.tuning.reference_config == config) &&
      Tuner::why_not(spec, *spec.tuning.reference_config, call.slot_data(), call.limits).empty())
    return spec.tuning.reference_config;
  for (const auto& lib : spec.libraries)
    if (lib != config.library && be.library_unavailable(lib).empty()) {
      Config c;
      c.library = lib;
      return c;
    }
  return std::nullopt;
}

std::string try_config(Runtime& rt, const CallView& call, const Config& config, Stream stream,
                       std::vector<std::vector<std::byte>>* outputs, bool* checked) {
  if (checked) *checked = false;
  const KernelSpec& spec = call.spec;
  Backend& be = rt.backend(spec.backend);
  Benchmarker& bench = rt.benchmarker(spec.backend);
  // What its outputs are compared with (reference_for); else nothing here (a
  // crash, a hang, an unwritten output or a written input still fail it, and
  // the caller may compare `outputs` with another config's).
  std::optional<Config> ref = reference_for(rt, call, config);
  BenchInputs in(call, be.device(), bench.in_process(), stream);
  BenchSettings st = bench.settings();
  st.time = false;
  // One checking run: "" or why it failed; throws for faults that are not the config's.
  auto run = [&](const Config& c) -> std::string {
    std::shared_ptr<const Binary> bin = rt.compile_pool(spec.backend).submit(spec, c, /*urgent=*/true).get();
    LaunchDims dims = c.library.empty() ? LaunchPlan(spec, c, call.limits).eval(call.slot_data()) : LaunchDims{};
    if (c.library.empty())
      if (std::string why = be.check_resources(bin->meta, dims); !why.empty()) return "pruned: " + why;
    std::shared_ptr<LoadedKernel> loaded = bench.in_process() ? rt.load(*bin) : nullptr;
    const std::string what = fmt::format("kernel '{}' (config {})", spec.name, c.str());
    try {
      BenchResult r = bench.run(*bin, loaded.get(), in, dims, what, st, rt.options().bench_timeout_s);
      for (size_t i = 0; i < r.unwritten.size() && i < spec.args.size(); ++i)
        if (r.unwritten[i] > 0)
          return fmt::format("it left {} elements of '{}' unwritten", r.unwritten[i], spec.args[i].name);
    } catch (const WorkerError& e) {
      if (!e.fault().of_request) throw;
      return e.what();
    } catch (const Error& e) {
      if (e.code() != Errc::launch) throw;
      return e.what();
    }
    return "";
  };
  std::vector<std::vector<std::byte>> expect;
  if (ref) {
    std::string why;
    try {
      why = run(*ref);
    } catch (const Error& e) {
      if (e.code() != Errc::compile) throw;
      why = e.what();
    }
    if (why.empty()) {
      expect = outputs_of(spec, in);
    } else {
      log::info("kernel '{}': the reference {} did not run ({}); {} is checked without it", spec.name, ref->str(),
                why, config.str());
      ref.reset();
    }
  }
  if (std::string why = run(config); !why.empty()) return why;
  if (outputs) *outputs = outputs_of(spec, in);
  if (ref)
    for (size_t i = 0; i < spec.args.size(); ++i) {
      auto out = in.result(i);
      if (out.empty()) continue;
      if (auto bad = Tuner::compare(spec.args[i].dtype, out, expect[i], spec.tuning, call.reduction))
        return fmt::format("wrong result in '{}' against {}: {}", spec.args[i].name, ref->str(), *bad);
    }
  if (checked) *checked = ref.has_value();
  return "";
}

std::optional<SafeChoice> first_safe_choice(Runtime& rt, const CallView& call, Stream stream, bool libraries,
                                            const std::function<const LoadedKernel&(const Config&)>& load,
                                            std::string* failures) {
  const KernelSpec& spec = call.spec;
  Backend& be = rt.backend(spec.backend);
  // Unproven configs that ran cleanly where nothing could check them: a
  // result is given only once two of them agree.
  struct Unchecked {
    SafeChoice choice;
    std::vector<std::vector<std::byte>> outputs;
  };
  std::vector<Unchecked> unchecked;
  bool said = false;
  auto loads = [&](const SafeChoice& c) {
    if (std::string why = load(c.config).can_implement(call.params); !why.empty()) {
      *failures += fmt::format("\n  {}: {}", c.config.str(), why);
      return false;
    }
    return true;
  };
  for (const auto& s : safe_choices(call, be, rt.tuning_cache().get(), libraries)) {
    try {
      if (s.proven) {
        if (loads(s)) return s;
        continue;
      }
      // A config nothing has checked runs once in a worker first, against
      // the reference where there is one (the spec's reference itself is
      // what is trusted): a crash or a hang there costs the worker, not this
      // process; a wrong result costs the config.
      std::vector<std::vector<std::byte>> outs;
      bool checked = false;
      if (std::string why = try_config(rt, call, s.config, stream, &outs, &checked); !why.empty()) {
        *failures += fmt::format("\n  {}: {}", s.config.str(), why);
        continue;
      }
      const bool is_reference = spec.tuning.reference_config && *spec.tuning.reference_config == s.config;
      if (checked || is_reference) {
        if (loads(s)) return s;
        continue;
      }
      // Nothing checked its result (neither a reference config nor a library
      // choice here, or the reference did not run): none is given until two
      // configs agree (else the caller tunes the call before it returns).
      if (!said && said_once(spec.name))
        log::warn("kernel '{}' has no reference here that runs (neither a reference config nor a library choice): "
                  "a first call waits until two configs agree on its result (name one you trust as [tuning] "
                  "reference to answer at once)",
                  spec.name);
      said = true;
      for (const auto& u : unchecked)
        if (agree(call, u.outputs, outs)) {
          SafeChoice earlier = u.choice, now = s;
          earlier.how += fmt::format(", which {} agrees with", s.config.str());
          now.how += fmt::format(", which agrees with {}", u.choice.config.str());
          if (loads(earlier)) return earlier;
          if (loads(now)) return now;
        }
      unchecked.push_back({s, std::move(outs)});
      *failures += fmt::format("\n  {}: ran, but agrees with no other config run so far", s.config.str());
    } catch (const Error& e) {
      if (e.code() != Errc::compile && e.code() != Errc::launch) throw;
      *failures += fmt::format("\n  {}: {}", s.config.str(), e.what());
    }
  }
  return std::nullopt;
}

Library* readying_library(Runtime& rt, const std::string& backend, const Config& choice) {
  if (choice.library.empty()) return nullptr;
  std::optional<LibraryChoice> c = parse_library_choice(choice.library);
  if (!c) return nullptr;
  Library* l = rt.backend(backend).library(c->library);
  return l && l->readying() ? l : nullptr;
}

void wait_readied(const Library& lib, const std::atomic<bool>& stop) {
  while (lib.readying() && !stop) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

std::optional<std::pair<Config, double>> own_choice_at_hand(Runtime& rt, const CallView& call,
                                                            const TuningRecord& record) {
  // Binaries looked for: a record whose own configs' binaries are not kept
  // (a pack without them) is not read through from end to end on a first call.
  constexpr int kProbes = 8;
  int probes = 0;
  CompilePool& pool = rt.compile_pool(call.spec.backend);
  for (const ConfigResult* r : record.ranked()) {
    if (!r->config.library.empty() || !Tuner::why_not(call.spec, r->config, call.slot_data(), call.limits).empty())
      continue;
    if (pool.at_hand(call.spec, r->config)) return std::make_pair(r->config, *r->ns);
    if (++probes == kProbes) break;
  }
  return std::nullopt;
}

}  // namespace kiln
