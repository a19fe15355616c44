// ShapeMemo: shape key → value, read without a lock and without allocating.
//
// The table is immutable once published: an insert (rare: the first call of a
// new shape, under a mutex) copies it into a new one and publishes that with
// a release store; readers load it with acquire and probe. Old tables and all
// values live until the memo does, so a reader never sees freed memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace kiln {

template <class V>
class ShapeMemo {
 public:
  static constexpr int kMaxKey = 8;

  explicit ShapeMemo(int key_len) : key_len_(key_len) { publish(std::make_unique<Table>(8, key_len)); }
  ShapeMemo(const ShapeMemo&) = delete;
  ShapeMemo& operator=(const ShapeMemo&) = delete;

  // The value for `key` (key_len values), or nullptr.
  V* find(const int64_t* key) const noexcept {
    const Table* t = current_.load(std::memory_order_acquire);
    size_t mask = t->cap - 1;
    for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      V* v = t->vals[i];
      if (!v) return nullptr;
      if (std::memcmp(&t->keys[i * key_len_], key, sizeof(int64_t) * key_len_) == 0) return v;
    }
  }

  // Inserts (or returns the existing value for) `key`. Callers serialize
  // inserts with mutex().
  V* insert(const int64_t* key, std::unique_ptr<V> value) {
    if (V* v = find(key)) return v;
    const Table* old = current_.load(std::memory_order_relaxed);
    size_t cap = old->cap;
    if ((old->count + 1) * 2 > cap) cap *= 2;
    auto t = std::make_unique<Table>(cap, key_len_);
    for (size_t i = 0; i < old->cap; ++i)
      if (old->vals[i]) t->put(&old->keys[i * key_len_], old->vals[i], hash(&old->keys[i * key_len_]));
    V* v = value.get();
    values_.push_back(std::move(value));
    t->put(key, v, hash(key));
    publish(std::move(t));
    return v;
  }

  size_t size() const { return current_.load(std::memory_order_acquire)->count; }
  std::mutex& mutex() { return insert_mutex_; }
  // Every value, in insertion order (for reports).
  const std::vector<std::unique_ptr<V>>& values() const { return values_; }

 private:
  struct Table {
    Table(size_t c, int key_len) : cap(c), keys(c * key_len, 0), vals(c, nullptr), key_len_(key_len) {}
    size_t cap;
    size_t count = 0;
    std::vector<int64_t> keys;
    std::vector<V*> vals;
    int key_len_;
    void put(const int64_t* key, V* v, uint64_t h) {
      size_t mask = cap - 1;
      size_t i = h & mask;
      while (vals[i]) i = (i + 1) & mask;
      std::memcpy(&keys[i * key_len_], key, sizeof(int64_t) * key_len_);
      vals[i] = v;
      ++count;
    }
  };

  uint64_t hash(const int64_t* key) const noexcept {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < key_len_; ++i) {
      h ^= static_cast<uint64_t>(key[i]) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdULL;
    }
    return h ^ (h >> 29);
  }

  void publish(std::unique_ptr<Table> t) {
    current_.store(t.get(), std::memory_order_release);
    tables_.push_back(std::move(t));
  }

  int key_len_;
  std::atomic<const Table*> current_{nullptr};
  std::vector<std::unique_ptr<Table>> tables_;  // every table ever published
  std::vector<std::unique_ptr<V>> values_;
  std::mutex insert_mutex_;
};

}  // namespace kiln
