// Arguments of a kernel in a device's memory: for tuning at a shape with
// seeded random inputs (kiln tune, size-hint points), benchmarks and tests.
// On the cpu backend the device's memory is host memory.
// Thread-safety: as HostArgs: const calls concurrently, writes alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/args.hpp"
#include "kiln/device.hpp"

namespace kiln {

// One allocation on a device, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(Device& dev, size_t bytes) : dev_(&dev), p_(dev.alloc(bytes)), bytes_(bytes) {}
  ~DeviceBuffer() {
    if (p_) dev_->free(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  Device* dev_;
  void* p_;
  size_t bytes_;
};

class DeviceArgs {
 public:
  // Allocates every buffer argument on `dev` (zeroed; sizes from the spec's
  // expressions) and stores the scalars. Throws Error(Errc::usage) for a
  // negative or overflowing size.
  DeviceArgs(const KernelSpec& spec, const std::vector<ScalarValue>& scalars, Device& dev);
  DeviceArgs(DeviceArgs&&) = delete;
  DeviceArgs(const DeviceArgs&) = delete;

  void* const* params() const { return params_.data(); }
  size_t count() const { return params_.size(); }
  void* buffer(size_t arg) const { return ptrs_[arg]; }
  int64_t elements(size_t arg) const { return elements_[arg]; }
  // Fills in and inout buffers with seeded random values (as HostArgs does).
  void fill_random(uint64_t seed, bool wide = false);
  // A buffer's bytes, copied to the host.
  std::vector<std::byte> read(size_t arg) const;

 private:
  struct Arg {
    DType dtype;
    Intent intent;
    bool pointer;
  };
  Device& dev_;
  std::vector<Arg> args_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<void*> ptrs_;
  std::vector<int64_t> elements_;
  std::vector<uint64_t> scalar_;
  std::vector<void*> params_;
};

}  // namespace kiln
