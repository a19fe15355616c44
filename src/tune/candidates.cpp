#include "tune/candidates.hpp"

namespace kiln {

Config candidate(const KernelSpec& spec, size_t i) {
  if (i < spec.space.size()) return spec.space.at(i);
  Config c;
  c.library = spec.libraries.at(i - spec.space.size());
  return c;
}

Candidates prune(const CallView& call, const std::optional<TuningRecord>& rec, const BinaryKeyer* keyer,
                 Backend& backend) {
  const KernelSpec& spec = call.spec;
  Candidates p;
  const size_t n = spec.space.size(), total = n + spec.libraries.size();
  p.pruned.resize(total);
  p.unavailable.assign(total, false);
  std::map<std::string, const ConfigResult*> by_binary;
  if (rec)
    for (const auto& c : rec->configs)
      // Pruned results with a binary key were judged for this key's call
      // (after compiling, or before it by a register sibling): kept too.
      if (!c.binary.empty() && c.kind != FailKind::unavailable) by_binary[c.binary] = &c;
  auto reuse = [&](size_t i, const Config& c) {
    if (!rec || !keyer) return;
    auto it = by_binary.find(keyer->hex(c));
    if (it == by_binary.end()) return;
    ConfigResult r = *it->second;
    r.config = c;
    p.reused[i] = std::move(r);
  };
  for (size_t i = n; i < total; ++i) {
    Config c = candidate(spec, i);
    if (std::string why = backend.library_unavailable(c.library); !why.empty()) {
      p.pruned[i] = why;
      p.unavailable[i] = true;
      continue;
    }
    if (backend.library_plans_per_shape(c.library))
      if (std::string why = Tuner::bucket_refusal(spec, call.slot_data()); !why.empty()) {
        p.pruned[i] = why;
        continue;
      }
    p.libraries.push_back(i);
    reuse(i, c);
  }
  for (size_t i = 0; i < n; ++i) {
    Config c = spec.space.at(i);
    p.pruned[i] = Tuner::why_not(spec, c, call.slot_data(), call.limits);
    if (!p.pruned[i].empty()) continue;
    p.runnable.push_back(i);
    reuse(i, c);
  }
  return p;
}

bool complete(const Candidates& p, const TuningRecord& rec, const KernelSpec& spec, SearchKind wanted) {
  for (size_t i : p.libraries)
    if (!p.reused.count(i)) return false;
  for (size_t i : p.runnable) {
    if (p.reused.count(i)) continue;
    // A config the record's search chose not to evaluate is not missing;
    // one that is new to the spec is. Asked for every config, a record of a
    // partial search is missing some.
    if (rec.method != SearchMethod::exhaustive && wanted != SearchKind::exhaustive &&
        rec.space.index_of(spec.space.at(i)))
      continue;
    return false;
  }
  return true;
}

}  // namespace kiln
