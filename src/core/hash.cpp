#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>

#include "kiln/hash.hpp"

namespace kiln {

std::string Hash128::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

struct Hasher::State {
  XXH3_state_t st;
};

Hasher::Hasher() : s_(std::make_unique<State>()) { XXH3_128bits_reset(&s_->st); }
Hasher::~Hasher() = default;

void Hasher::raw(const void* p, size_t n) { XXH3_128bits_update(&s_->st, p, n); }

Hasher& Hasher::add(std::string_view tag, std::string_view bytes) {
  uint64_t n = tag.size();
  raw(&n, sizeof n);
  raw(tag.data(), tag.size());
  n = bytes.size();
  raw(&n, sizeof n);
  raw(bytes.data(), bytes.size());
  return *this;
}

Hasher& Hasher::add(std::string_view tag, int64_t value) {
  return add(tag, std::string_view(reinterpret_cast<const char*>(&value), sizeof value));
}

Hash128 Hasher::digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(&s_->st);
  return {h.low64, h.high64};
}

Hash128 hash_bytes(const void* data, size_t n) {
  XXH128_hash_t h = XXH3_128bits(data, n);
  return {h.low64, h.high64};
}

uint64_t hash64(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace kiln
