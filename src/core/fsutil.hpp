// File helpers: whole-file reads, atomic writes (temp file + rename in the
// same folder), private folders, and advisory locks between processes.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/process.hpp"

namespace kiln {

std::optional<std::string> read_file(const std::filesystem::path& p);
// Writes `data` to a temporary file beside `p`, then renames it over `p`.
// Readers see the old file or the new one, never a part. Throws Error(Errc::io).
void write_file_atomic(const std::filesystem::path& p, std::string_view data);

// Creates `dir` (and missing parents) with mode 0700. Throws Error(Errc::cache)
// when it exists but belongs to another user or others can write to it.
void ensure_private_dir(const std::filesystem::path& dir);

// An exclusive flock on a file, held until destruction.
class FileLock {
 public:
  FileLock() = default;
  explicit FileLock(const std::filesystem::path& p);  // blocks until held
  FileLock(FileLock&&) = default;
  FileLock& operator=(FileLock&&) = default;
  ~FileLock();

 private:
  UniqueFd fd_;
};

// A temporary folder removed (with its contents) on destruction.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace kiln
