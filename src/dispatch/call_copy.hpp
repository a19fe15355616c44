// CallCopy: a call's arguments, copied so that a tuning can run on them
// after the call has returned (KILN_FIRST_CALL=swap). In and inout buffers
// are copied on the call's stream, which is then synchronised; out buffers
// are allocated, not copied. Each copy keeps its original's alignment (up to
// 256 bytes, what align_<buffer> sees) and its aliasing (a buffer passed
// twice is copied once). Scalars are copied by value.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/ext/backend.hpp"
#include "kiln/ext/call_view.hpp"

namespace kiln {

class CallCopy {
 public:
  // Throws what the device throws (Error(Errc::io) when memory runs out).
  CallCopy(const KernelSpec& spec, void* const* params, Device& dev, Stream stream);
  // The same for a call decoded already.
  CallCopy(const CallView& call, Device& dev, Stream stream);
  ~CallCopy();
  CallCopy(const CallCopy&) = delete;
  CallCopy& operator=(const CallCopy&) = delete;

  void* const* params() const { return params_.data(); }

 private:
  void init(const KernelSpec& spec, void* const* params, const int64_t* slots, Stream stream);
  Device& dev_;
  std::vector<void*> allocs_;     // what to free
  std::vector<void*> ptrs_;       // per argument: the copy's address (buffers)
  std::vector<uint64_t> scalars_; // per argument: the scalar's bytes
  std::vector<void*> params_;
};

}  // namespace kiln
