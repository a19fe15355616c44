// CodeCache: compiled binaries on disk, addressed by binary key.
// Layout: <root>/code/<key[0:2]>/<key>.kbin. Each entry is written to a
// temporary file and renamed into place, and carries a checksum; an entry
// that does not validate is a miss (and is removed so it gets rewritten).
#pragma once

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>

#include "kiln/backend.hpp"

namespace kiln {

class FileLock;

class CodeCache {
 public:
  // Creates <root> and <root>/code with mode 0700; throws Error(Errc::cache)
  // for a folder that others can write.
  explicit CodeCache(std::filesystem::path root);

  std::optional<Binary> get(const std::string& key);
  void put(const Binary& b);

  // Holds an exclusive, cross-process lock on one key while it is compiled.
  std::unique_ptr<FileLock> lock(const std::string& key);

  struct Stats {
    size_t entries = 0;
    size_t bytes = 0;
  };
  Stats stats() const;
  size_t clear();  // removes every entry; returns how many
  size_t corrupt_seen() const { return corrupt_.load(); }

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path path_of(const std::string& key) const;

  // The on-disk encoding, exposed for tests.
  static std::string encode(const Binary& b);
  static std::optional<Binary> decode(std::string_view data, const std::string& expect_key);

 private:
  std::filesystem::path root_, code_, locks_;
  std::atomic<size_t> corrupt_{0};
};

}  // namespace kiln
