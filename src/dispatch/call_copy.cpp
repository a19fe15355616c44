#include "dispatch/call_copy.hpp"

#include <cstring>

#include "core/format.hpp"
#include "kiln/args.hpp"

namespace kiln {

CallCopy::CallCopy(const KernelSpec& spec, void* const* params, Device& dev, Stream stream) : dev_(dev) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  init(spec, params, slots.data(), stream);
}

CallCopy::CallCopy(const CallView& call, Device& dev, Stream stream) : dev_(dev) {
  init(call.spec, call.params, call.slot_data(), stream);
}

void CallCopy::init(const KernelSpec& spec, void* const* params, const int64_t* slots, Stream stream) {
  Device& dev = dev_;
  const size_t n = spec.args.size();
  ptrs_.assign(n, nullptr);
  scalars_.assign(n, 0);
  params_.assign(n, nullptr);
  try {
    for (size_t i = 0; i < n; ++i) {
      const ArgSpec& a = spec.args[i];
      if (!a.pointer) {
        std::memcpy(&scalars_[i], params[i], dtype_size(a.dtype));
        params_[i] = &scalars_[i];
        continue;
      }
      const void* orig = *static_cast<void* const*>(params[i]);
      for (size_t j = 0; j < i && !ptrs_[i]; ++j)
        if (spec.args[j].pointer && *static_cast<void* const*>(params[j]) == orig) ptrs_[i] = ptrs_[j];
      if (!ptrs_[i]) {
        const int64_t count = compile_expr(spec, a.size, nullptr).eval(slots);
        const size_t bytes = buffer_bytes(a.dtype, count, fmt::format("kernel '{}': argument '{}'", spec.name, a.name));
        const size_t offset = reinterpret_cast<uintptr_t>(orig) % 256;
        std::byte* base = static_cast<std::byte*>(dev.alloc(bytes + 256));
        allocs_.push_back(base);
        ptrs_[i] = base + offset;
        // Every argument that is this buffer reads it: copied whatever its intent here.
        bool read = false;
        for (size_t j = i; j < n; ++j)
          if (spec.args[j].pointer && *static_cast<void* const*>(params[j]) == orig)
            read = read || spec.args[j].intent != Intent::out;
        if (read && bytes > 0) dev.copy(ptrs_[i], orig, bytes, stream);
      }
      params_[i] = &ptrs_[i];
    }
    dev.sync(stream);
  } catch (...) {
    for (void* p : allocs_) dev.free(p);
    throw;
  }
}

CallCopy::~CallCopy() {
  for (void* p : allocs_) dev_.free(p);
}

}  // namespace kiln
