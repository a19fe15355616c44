// CodeCache: compiled binaries on disk, addressed by binary key.
// Layout: <root>/code/<key[0:2]>/<key>.kbin. The folder is opened once and
// checked (see SafeDir in docs/workers.md: the user's own, no parent others
// can write); each entry is written to a temporary file and renamed into
// place, and carries a checksum; an entry that does not validate is a miss
// (and is removed so it gets rewritten).
//
// Thread-safe: get, put, lock and stats may be called from any thread.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ext/backend.hpp"

namespace kiln {

class CodeCache {
 public:
  // Opens (creating, 0700) <root> and <root>/code; throws Error(Errc::cache)
  // for a folder kiln must not use.
  explicit CodeCache(std::filesystem::path root);
  // The cache at `root` for reading only: nothing is created; a missing
  // folder reads as empty.
  static std::unique_ptr<CodeCache> open_existing(const std::filesystem::path& root);
  // The same, for a folder kiln cannot write: what it holds is read, and
  // put() keeps nothing, silently (the runtime said so once).
  static std::unique_ptr<CodeCache> open_read_only(const std::filesystem::path& root);
  ~CodeCache();

  std::optional<Binary> get(const std::string& key);
  // Binaries held in memory (from a packed artifact), answered before the
  // disk and never written to it. Each was validated by decode().
  void add_overlay(std::vector<Binary> bins);
  // Throws Error(Errc::io) when the entry cannot be written (a full or
  // read-only disk); callers treat that as a warning.
  void put(const Binary& b);

  // Runs `fn` holding an exclusive, cross-process lock on one key.
  template <class F>
  auto with_lock(const std::string& key, F&& fn) {
    auto held = lock_key(key);
    return fn();
  }

  struct Stats {
    size_t entries = 0;
    size_t bytes = 0;
  };
  Stats stats() const;
  size_t clear();  // removes every entry; returns how many
  size_t corrupt_seen() const { return corrupt_.load(); }

  const std::filesystem::path& root() const { return root_; }

  // The on-disk encoding, exposed for tests.
  static std::string encode(const Binary& b);
  static std::optional<Binary> decode(std::string_view data, const std::string& expect_key);
  static constexpr size_t kMaxEntryBytes = size_t{1} << 30;

 private:
  CodeCache() = default;
  struct Held;
  std::shared_ptr<Held> lock_key(const std::string& key);
  struct Dirs;
  std::unique_ptr<Dirs> dirs_;
  std::filesystem::path root_;
  std::atomic<size_t> corrupt_{0};
  bool discard_writes_ = false;
};

}  // namespace kiln
