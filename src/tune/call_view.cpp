#include "kiln/ext/call_view.hpp"

#include "kiln/args.hpp"

namespace kiln {

namespace {
std::vector<int64_t> slots_of(const KernelSpec& spec, void* const* params) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  return slots;
}
}  // namespace

CallView::CallView(const KernelSpec& s, Backend& backend, void* const* p)
    : spec(s), params(p), slots(slots_of(s, p)), limits(backend.limits()) {
  std::vector<std::pair<std::string, int64_t>> values;
  for (const auto& name : spec.tuning.key)
    values.push_back({name, spec.tuning.key_value(name, slots[spec.arg_index(name)])});
  key = make_tuning_key(spec, backend, std::move(values));
  if (spec.tuning.reduction) reduction = compile_expr(spec, *spec.tuning.reduction, nullptr).eval(slots.data());
}

}  // namespace kiln
