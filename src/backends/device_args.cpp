#include "kiln/device_args.hpp"

#include <cstring>

#include "core/format.hpp"

namespace kiln {

DeviceArgs::DeviceArgs(const KernelSpec& spec, const std::vector<ScalarValue>& scalars, Device& dev) : dev_(dev) {
  const size_t n = spec.args.size();
  if (scalars.size() != n) fail(Errc::internal, "DeviceArgs: {} scalar slots for {} args", scalars.size(), n);
  // The scalars as the kernel takes them, through HostArgs' conversions.
  std::vector<int64_t> slots(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (!spec.args[i].pointer) slots[i] = scalars[i].i;
  ptrs_.assign(n, nullptr);
  scalar_.assign(n, 0);
  params_.assign(n, nullptr);
  buffers_.reserve(n);
  // Every buffer's size first: one the call's values make wrong is refused before any is allocated.
  elements_ = buffer_elements(spec, slots.data());
  for (size_t i = 0; i < n; ++i) {
    const ArgSpec& a = spec.args[i];
    args_.push_back({a.dtype, a.intent, a.pointer});
    if (a.pointer) {
      // (the bytes checked by buffer_elements)
      buffers_.emplace_back(dev, static_cast<size_t>(elements_[i]) * dtype_size(a.dtype));
      ptrs_[i] = buffers_.back().get();
      params_[i] = &ptrs_[i];
    } else {
      switch (a.dtype) {
        case DType::f32: { float v = static_cast<float>(scalars[i].f); std::memcpy(&scalar_[i], &v, 4); break; }
        case DType::f64: std::memcpy(&scalar_[i], &scalars[i].f, 8); break;
        case DType::i32: { int32_t v = static_cast<int32_t>(scalars[i].i); std::memcpy(&scalar_[i], &v, 4); break; }
        case DType::i64: std::memcpy(&scalar_[i], &scalars[i].i, 8); break;
        case DType::f16: { uint16_t h = f32_to_f16_bits(static_cast<float>(scalars[i].f)); std::memcpy(&scalar_[i], &h, 2); break; }
        case DType::bf16: { uint16_t h = f32_to_bf16_bits(static_cast<float>(scalars[i].f)); std::memcpy(&scalar_[i], &h, 2); break; }
      }
      params_[i] = &scalar_[i];
    }
  }
}

void DeviceArgs::fill_random(uint64_t seed, bool wide) {
  for (size_t i = 0; i < args_.size(); ++i) {
    if (!ptrs_[i] || args_[i].intent == Intent::out) continue;
    std::vector<std::byte> host(static_cast<size_t>(elements_[i]) * dtype_size(args_[i].dtype));
    kiln::fill_random(args_[i].dtype, host, seed + 0x1000 * (i + 1), wide);
    dev_.to_device(ptrs_[i], host.data(), host.size(), nullptr);
  }
  dev_.sync(nullptr);
}

std::vector<std::byte> DeviceArgs::read(size_t arg) const {
  std::vector<std::byte> out(static_cast<size_t>(elements_[arg]) * dtype_size(args_[arg].dtype));
  if (ptrs_[arg]) dev_.to_host(out.data(), ptrs_[arg], out.size(), nullptr);
  return out;
}

}  // namespace kiln
