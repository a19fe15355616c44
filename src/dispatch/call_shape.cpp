#include "dispatch/call_shape.hpp"

#include <algorithm>
#include <cstring>

#include "core/format.hpp"
#include "kiln/kernel.hpp"

namespace kiln {

CallShape::CallShape(const std::string& kernel, const std::vector<ArgSpec>& args, const std::vector<std::string>& key,
                     const std::vector<std::string>& pow2)
    : kernel_(kernel), args_(args) {
  if (args.size() > static_cast<size_t>(kMaxArgs))
    fail(Errc::usage, "kernel '{}' has {} arguments; kiln dispatches at most {}", kernel, args.size(), kMaxArgs);
  if (key.size() > static_cast<size_t>(kMaxKey))
    fail(Errc::usage, "kernel '{}' has {} tuning-key names; kiln takes at most {}", kernel, key.size(), kMaxKey);
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& a = args[i];
    if (!a.pointer && !dtype_is_float(a.dtype)) int_args_.push_back({static_cast<int>(i), a.dtype == DType::i32});
    if (a.pointer) ptr_args_.push_back(static_cast<int>(i));
    codes_.push_back(static_cast<uint8_t>(static_cast<int>(a.dtype) + (a.pointer ? detail::kPointerCode : 0)));
  }
  for (const auto& k : key) {
    int idx = -1;
    std::string_view name = align_target(k).empty() ? std::string_view(k) : align_target(k);
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].name == name) idx = static_cast<int>(i);
    if (idx < 0) fail(Errc::usage, "kernel '{}': tuning key '{}' is not an argument", kernel, k);
    key_args_.push_back(idx);
    key_pow2_.push_back(std::find(pow2.begin(), pow2.end(), k) != pow2.end());
  }
}

bool arg_code_matches(uint8_t got, uint8_t want) {
  return got == want || (got == detail::kAnyPointer && want >= detail::kPointerCode && want != detail::kUnknown);
}

std::string arg_code_name(uint8_t code) {
  if (code == detail::kAnyPointer) return "a pointer of no element type (void* or a device address)";
  if (code == detail::kUnknown) return "a type kiln cannot pass";
  bool ptr = code >= detail::kPointerCode;
  int d = ptr ? code - detail::kPointerCode : code;
  if (d < 0 || d >= static_cast<int>(std::size(kAllDTypes))) return "a type kiln cannot pass";
  return std::string(dtype_name(static_cast<DType>(d))) + (ptr ? "*" : "");
}

std::vector<std::string> CallShape::memo_key(const KernelSpec& spec) {
  std::vector<std::string> k = spec.tuning.key;
  for (const auto& n : spec.unkeyed_launch_scalars()) k.push_back(n);
  return k;
}

void CallShape::check_types(const uint8_t* codes, size_t n) const {
  if (n == codes_.size() && std::memcmp(codes, codes_.data(), n) == 0) return;
  if (n == codes_.size()) {
    bool ok = true;
    for (size_t i = 0; i < n; ++i) ok = ok && arg_code_matches(codes[i], codes_[i]);
    if (ok) return;
  }
  if (n != codes_.size()) fail(Errc::usage, "kernel '{}' takes {} arguments, got {}", kernel_, codes_.size(), n);
  for (size_t i = 0; i < n; ++i)
    if (!arg_code_matches(codes[i], codes_[i]))
      fail(Errc::usage, "kernel '{}': argument {} ('{}') is {} but the spec says {}", kernel_, i, args_[i].name,
           arg_code_name(codes[i]), arg_code_name(codes_[i]));
}

}  // namespace kiln
