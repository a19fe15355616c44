// The first safe choice of a call that can run it (KILN_FIRST_CALL=swap and
// serve), shared by Kernel and MultiKernel. See docs/dispatch.md.
#include "dispatch/first_call.hpp"

#include <mutex>
#include <set>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"

namespace kiln {

namespace {

// Whether every output of two runs of a spec agrees, by the tuning's rules.
bool agree(const KernelSpec& spec, void* const* params, const std::vector<std::vector<std::byte>>& a,
           const std::vector<std::vector<std::byte>>& b) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  const int64_t reduction =
      spec.tuning.reduction ? compile_expr(spec, *spec.tuning.reduction, nullptr).eval(slots.data()) : 0;
  for (size_t i = 0; i < spec.args.size() && i < a.size() && i < b.size(); ++i) {
    if (a[i].empty() || spec.args[i].intent == Intent::in) continue;
    if (a[i].size() != b[i].size() || Tuner::compare(spec.args[i].dtype, a[i], b[i], spec.tuning, reduction))
      return false;
  }
  return true;
}

// True the first time it is asked of a kernel's name in this process.
bool said_once(const std::string& kernel) {
  static std::mutex m;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> g(m);
  return said.insert(kernel).second;
}

}  // namespace

std::optional<SafeChoice> first_safe_choice(Runtime& rt, const KernelSpec& spec, void* const* params, Stream stream,
                                            bool libraries,
                                            const std::function<const LoadedKernel&(const Config&)>& load,
                                            std::string* failures) {
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
    if (std::string why = load(c.config).can_implement(params); !why.empty()) {
      *failures += fmt::format("\n  {}: {}", c.config.str(), why);
      return false;
    }
    return true;
  };
  for (const auto& s : safe_choices(spec, params, be, rt.tuning_cache().get(), libraries)) {
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
      if (std::string why = rt.try_config(spec, s.config, params, stream, &outs, &checked); !why.empty()) {
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
        if (agree(spec, params, u.outputs, outs)) {
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

}  // namespace kiln
