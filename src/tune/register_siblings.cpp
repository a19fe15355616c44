#include "tune/register_siblings.hpp"

#include <set>

#include "core/format.hpp"

namespace kiln {

RegisterSiblings::Batch RegisterSiblings::compile(const std::vector<size_t>& todo,
                                                  const std::function<Config(size_t)>& config_of, Session& s,
                                                  Backend& backend, const std::string& label) {
  const KernelSpec& spec = s.call().spec;
  std::vector<size_t> first, rest;
  std::set<std::string> classes;
  for (size_t i : todo) {
    const std::string k = register_sibling_key(spec, config_of(i));
    if (!known_.count(k) && classes.insert(k).second) first.push_back(i);
    else rest.push_back(i);
  }
  Batch b;
  for (size_t i : first) b.futures.push_back(s.compile(config_of(i)));
  if (!b.futures.empty())
    wait_all(b.futures, fmt::format("compiling {} {} (one of each register sibling class)", spec.name, label),
             s.show());
  for (size_t k = 0; k < first.size(); ++k) {
    try {
      const Config c = config_of(first[k]);
      if (int regs = learned_registers(backend, b.futures[k].get()->meta); regs > 0)
        known_[register_sibling_key(spec, c)] = {regs, c.str()};
    } catch (const Error&) {
      // a config that did not compile teaches nothing; it fails when it is evaluated
    }
  }
  b.kept = first;
  for (size_t i : rest) {
    const Config c = config_of(i);
    auto it = known_.find(register_sibling_key(spec, c));
    std::string why =
        it == known_.end() ? "" : pruned_by_sibling_registers(backend, spec, c, it->second.first, it->second.second);
    if (why.empty()) {
      b.kept.push_back(i);
      b.futures.push_back(s.compile(c));
      continue;
    }
    ConfigResult r;
    r.config = c;
    r.binary = s.keyer().hex(c);  // what a later tuning of this key reuses it by
    r.kind = FailKind::pruned;
    r.error = "pruned before compiling: " + why;
    b.pruned.emplace_back(i, std::move(r));
    ++pruned_;
  }
  return b;
}

}  // namespace kiln
