// CallShape: what the call path reads from a params array: the integer
// scalars and every buffer's alignment (slot i = argument i, for launch expressions and
// the constraints a call is checked against) and the shape key a
// handle memoises its choice by (the tuning key, then any integer scalar the
// launch shape or constraints use that the tuning key leaves out).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

class CallShape {
 public:
  static constexpr int kMaxArgs = 64;
  static constexpr int kMaxKey = 16;

  // Throws Error(Errc::usage) beyond kMaxArgs arguments or kMaxKey key names.
  // `pow2`: key names read by bucket (pow2_bucket): calls whose values share a
  // bucket share the key, so a handle decides once a bucket.
  CallShape(const std::string& kernel, const std::vector<ArgSpec>& args, const std::vector<std::string>& key,
            const std::vector<std::string>& pow2 = {});
  // The shape key of a kernel's calls: its tuning key, then its unkeyed launch scalars.
  static std::vector<std::string> memo_key(const KernelSpec& spec);

  // slots: kMaxArgs values; key: kMaxKey values. Allocates nothing.
  void read(void* const* params, int64_t* slots, int64_t* key) const noexcept {
    for (const auto& [i, is32] : int_args_)
      slots[i] = is32 ? *static_cast<const int32_t*>(params[i]) : *static_cast<const int64_t*>(params[i]);
    for (int i : ptr_args_) {
      auto v = *static_cast<const uint64_t*>(params[i]);
      uint64_t low = v & (~v + 1);
      slots[i] = v == 0 || low > 256 ? 256 : static_cast<int64_t>(low);
    }
    for (size_t k = 0; k < key_args_.size(); ++k)
      key[k] = key_pow2_[k] ? pow2_bucket(slots[key_args_[k]]) : slots[key_args_[k]];
  }
  size_t key_size() const { return key_args_.size(); }

  // Throws Error(Errc::usage) naming the first argument whose C++ type does
  // not match the spec (codes from detail::arg_code).
  void check_types(const uint8_t* codes, size_t n) const;

 private:
  std::string kernel_;
  std::vector<ArgSpec> args_;
  std::vector<std::pair<int, bool>> int_args_;  // (argument, is i32)
  std::vector<int> ptr_args_;                   // every buffer: its slot holds its alignment (align_<name>)
  std::vector<int> key_args_;
  std::vector<uint8_t> key_pow2_;  // per key entry: read by bucket
  std::vector<uint8_t> codes_;
};

}  // namespace kiln
