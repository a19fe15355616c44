// ShapeMemo: shape key → value, read without a lock and without allocating,
// in a fixed amount of memory.
//
// A set-associative table of `capacity` slots (sets of kWays). A key lives
// in one set; a lookup probes at most kWays slots. Each slot is guarded by a
// sequence counter (a seqlock): a writer makes it odd, writes the key and
// value, and makes it even again; a reader retries a slot whose counter
// changed while it read. Inserts (rare: the first call of a shape) are
// serialised by mutex(); when a set is full, a clock hand evicts a slot not
// used since the hand last passed. An evicted shape is decided again when
// it comes back. Values must be trivially copyable and small (a pointer):
// they are copied out under the seqlock, never referenced in place.
//
// Each slot also has a counter a caller may bump (calls of a shape); it is
// reset when the slot takes a new key.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kiln {

template <class V>
class ShapeMemo {
  static_assert(std::is_trivially_copyable_v<V> && sizeof(V) <= 8, "ShapeMemo values are small and trivially copyable");

 public:
  static constexpr int kMaxKey = 16;
  static constexpr size_t kWays = 8;

  ShapeMemo(int key_len, size_t capacity) : key_len_(key_len < 1 ? 1 : key_len) {
    size_t sets = 1;
    while (sets * kWays < capacity) sets *= 2;
    sets_mask_ = sets - 1;
    n_ = sets * kWays;
    seq_ = std::make_unique<std::atomic<uint32_t>[]>(n_);
    used_ = std::make_unique<std::atomic<uint8_t>[]>(n_);
    count_ = std::make_unique<std::atomic<uint32_t>[]>(n_);
    keys_ = std::make_unique<std::atomic<int64_t>[]>(n_ * static_cast<size_t>(key_len_));
    vals_ = std::make_unique<std::atomic<V>[]>(n_);
    hands_ = std::make_unique<uint8_t[]>(sets);
  }
  ShapeMemo(const ShapeMemo&) = delete;
  ShapeMemo& operator=(const ShapeMemo&) = delete;

  // The value for `key` (key_len values) in *out; false when absent. When
  // `counter` is given, it points at the slot's call counter.
  bool find(const int64_t* key, V* out, std::atomic<uint32_t>** counter = nullptr) const noexcept {
    const size_t base = (hash(key) & sets_mask_) * kWays;
    for (size_t w = 0; w < kWays; ++w) {
      const size_t i = base + w;
      for (;;) {
        uint32_t s1 = seq_[i].load(std::memory_order_acquire);
        if (s1 == 0) return false;  // slots fill in order and never empty: nothing further
        if (s1 & 1) {
          pause();
          continue;
        }
        bool match = true;
        const std::atomic<int64_t>* k = &keys_[i * key_len_];
        for (int j = 0; j < key_len_; ++j) match &= k[j].load(std::memory_order_relaxed) == key[j];
        V v = vals_[i].load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (seq_[i].load(std::memory_order_relaxed) != s1) continue;  // written meanwhile: read again
        if (!match) break;
        if (!used_[i].load(std::memory_order_relaxed)) used_[i].store(1, std::memory_order_relaxed);
        *out = v;
        if (counter) *counter = &count_[i];
        return true;
      }
    }
    return false;
  }

  // Inserts or replaces `key`'s value. Callers hold mutex().
  void insert(const int64_t* key, V value) {
    const size_t set = hash(key) & sets_mask_;
    const size_t base = set * kWays;
    size_t slot = n_;
    for (size_t w = 0; w < kWays && slot == n_; ++w) {
      const size_t i = base + w;
      if (seq_[i].load(std::memory_order_relaxed) == 0) {
        slot = i;
        ++size_;
        break;
      }
      bool match = true;
      for (int j = 0; j < key_len_; ++j) match &= keys_[i * key_len_ + j].load(std::memory_order_relaxed) == key[j];
      if (match) {
        write(i, key, value, false);
        return;
      }
    }
    if (slot == n_) {
      // The set is full: the clock hand evicts the first slot not used since it last passed.
      uint8_t& hand = hands_[set];
      for (;;) {
        const size_t i = base + hand;
        hand = static_cast<uint8_t>((hand + 1) % kWays);
        if (used_[i].exchange(0, std::memory_order_relaxed)) continue;
        slot = i;
        ++evictions_;
        break;
      }
    }
    write(slot, key, value, true);
  }

  size_t size() const { return size_; }            // live entries; callers hold mutex()
  size_t evictions() const { return evictions_; }  // callers hold mutex()
  size_t capacity() const { return n_; }
  std::mutex& mutex() { return insert_mutex_; }

 private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  void write(size_t i, const int64_t* key, V value, bool fresh) {
    uint32_t s = seq_[i].load(std::memory_order_relaxed);
    seq_[i].store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (int j = 0; j < key_len_; ++j) keys_[i * key_len_ + j].store(key[j], std::memory_order_relaxed);
    vals_[i].store(value, std::memory_order_relaxed);
    if (fresh) {
      count_[i].store(0, std::memory_order_relaxed);
      used_[i].store(1, std::memory_order_relaxed);
    }
    seq_[i].store(s + 2, std::memory_order_release);
  }

  uint64_t hash(const int64_t* key) const noexcept {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < key_len_; ++i) {
      h ^= static_cast<uint64_t>(key[i]) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdULL;
    }
    return h ^ (h >> 29);
  }

  int key_len_;
  size_t sets_mask_ = 0, n_ = 0;
  std::unique_ptr<std::atomic<uint32_t>[]> seq_;
  std::unique_ptr<std::atomic<uint8_t>[]> used_;
  std::unique_ptr<std::atomic<uint32_t>[]> count_;
  std::unique_ptr<std::atomic<int64_t>[]> keys_;
  std::unique_ptr<std::atomic<V>[]> vals_;
  std::unique_ptr<uint8_t[]> hands_;
  size_t size_ = 0, evictions_ = 0;
  std::mutex insert_mutex_;
};

}  // namespace kiln
