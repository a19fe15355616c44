// Content hashing (XXH3-128) with length-prefixed fields, so that
// ("ab","c") and ("a","bc") never hash alike.
// Thread-safety: Hasher is a value used by one thread; the free functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  std::string hex() const;  // 32 lower-case hex digits
  bool operator==(const Hash128&) const = default;
};

class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  // Each field is written as (tag, length, bytes).
  Hasher& add(std::string_view tag, std::string_view bytes);
  Hasher& add(std::string_view tag, int64_t value);
  Hash128 digest() const;

 private:
  void raw(const void* p, size_t n);
  struct State;
  std::unique_ptr<State> s_;
};

Hash128 hash_bytes(const void* data, size_t n);
inline Hash128 hash_bytes(std::string_view s) { return hash_bytes(s.data(), s.size()); }
uint64_t hash64(const void* data, size_t n);

}  // namespace kiln
