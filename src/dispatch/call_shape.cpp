#include "dispatch/call_shape.hpp"

#include <cstring>

#include "core/format.hpp"

namespace kiln {

CallShape::CallShape(const std::string& kernel, const std::vector<ArgSpec>& args, const std::vector<std::string>& key)
    : kernel_(kernel), args_(args) {
  if (args.size() > static_cast<size_t>(kMaxArgs))
    fail(Errc::usage, "kernel '{}' has {} arguments; kiln dispatches at most {}", kernel, args.size(), kMaxArgs);
  if (key.size() > static_cast<size_t>(kMaxKey))
    fail(Errc::usage, "kernel '{}' has {} tuning-key names; kiln takes at most {}", kernel, key.size(), kMaxKey);
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& a = args[i];
    if (!a.pointer && !dtype_is_float(a.dtype)) int_args_.push_back({static_cast<int>(i), a.dtype == DType::i32});
    codes_.push_back(static_cast<uint8_t>(static_cast<int>(a.dtype) + (a.pointer ? 4 : 0)));
  }
  for (const auto& k : key) {
    int idx = -1;
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].name == k) idx = static_cast<int>(i);
    if (idx < 0) fail(Errc::usage, "kernel '{}': tuning key '{}' is not an argument", kernel, k);
    key_args_.push_back(idx);
  }
}

void CallShape::check_types(const uint8_t* codes, size_t n) const {
  if (n == codes_.size() && std::memcmp(codes, codes_.data(), n) == 0) return;
  if (n != codes_.size()) fail(Errc::usage, "kernel '{}' takes {} arguments, got {}", kernel_, codes_.size(), n);
  static const char* names[] = {"f32", "f64", "i32", "i64", "f32*", "f64*", "i32*", "i64*"};
  for (size_t i = 0; i < n; ++i)
    if (codes[i] != codes_[i])
      fail(Errc::usage, "kernel '{}': argument {} ('{}') is {} but the spec says {}", kernel_, i, args_[i].name,
           codes[i] < 8 ? names[codes[i]] : "a type kiln cannot pass", names[codes_[i]]);
}

}  // namespace kiln
