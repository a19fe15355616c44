// File helpers: whole-file reads, atomic writes (temp file + rename in the
// same folder), private folders opened once and worked in by descriptor,
// and advisory locks between processes.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/process.hpp"
#include "kiln/error.hpp"

namespace kiln {

std::optional<std::string> read_file(const std::filesystem::path& p);
// Files from elsewhere (an unpacked artifact, a file the user names): read
// only if a regular file (opened O_NONBLOCK, so a FIFO or a device is refused
// at once instead of blocking or streaming forever) of at most `max_bytes`.
// read_regular_file follows a link at `p` itself (the user's own choice);
// read_entry opens every component of `rel` inside `dir` with O_NOFOLLOW,
// so a link planted anywhere in the folder is refused. Both return nullopt
// for a file that does not exist and throw Error(Errc::io) saying why
// anything else cannot be read.
std::optional<std::string> read_regular_file(const std::filesystem::path& p, size_t max_bytes);
std::optional<std::string> read_entry(const std::filesystem::path& dir, std::string_view rel, size_t max_bytes);
// Writes `data` to a temporary file beside `p`, then renames it over `p`.
// Readers see the old file or the new one, never a part. Throws Error(Errc::io).
// `mode`: the new file's permissions (0600: kiln's own cache files).
void write_file_atomic(const std::filesystem::path& p, std::string_view data, unsigned mode = 0600);
// A file kiln writes for others to read (an artifact): 0666 less the process's umask.
unsigned shared_file_mode();

// An exclusive flock on a file, held until destruction.
class FileLock {
 public:
  FileLock() = default;
  explicit FileLock(const std::filesystem::path& p);  // blocks until held
  explicit FileLock(UniqueFd fd, const std::string& what);  // locks an open file; blocks
  FileLock(FileLock&&) = default;
  FileLock& operator=(FileLock&&) = default;
  ~FileLock();

 private:
  UniqueFd fd_;
};

// A cache folder kiln may use but cannot write (a read-only mount, no
// permission, a full disk): the caller runs without a cache, saying so once.
struct FolderNotWritable : Error {
  using Error::Error;
};

// A folder of the user's own, opened once and then used only through its
// descriptor (openat and friends), so that renaming or replacing it, or any
// of its parents, while kiln runs changes nothing kiln reads or writes.
//
// Opening checks, as ssh's StrictModes does, that the folder and every
// folder above it belong to the user or to root and that no one else can
// write to them (a folder others can write is accepted only with the sticky
// bit, as /tmp has, since then no one can rename what is not theirs); the
// folder itself must be the user's and 0700-private. Each component is
// opened with O_NOFOLLOW from the one above it.
//
// Files are read only if they are regular files of the user's (O_NOFOLLOW,
// O_NONBLOCK, so a FIFO or a link planted in the cache is refused at once)
// and no larger than the cap given. Writes go to a fresh temporary file and
// are renamed into place.
class SafeDir {
 public:
  SafeDir() = default;
  // Opens `path` (creating it and missing parents 0700 when `create`).
  // Throws Error(Errc::cache) saying what is wrong and how to fix it; with
  // create = false, a folder that does not exist gives an empty SafeDir.
  static SafeDir open(const std::filesystem::path& path, bool create);

  explicit operator bool() const { return fd_ != nullptr; }
  const std::filesystem::path& path() const { return path_; }
  int fd() const;

  // A folder inside (created 0700 when `create`); empty when absent and not created.
  SafeDir sub(std::string_view name, bool create) const;
  // A file's contents, or nullopt when absent, not a regular file of the
  // user's, or larger than `max_bytes` (each of which is logged at debug).
  std::optional<std::string> read(std::string_view name, size_t max_bytes) const;
  // Atomically replaces `name` with `data` (temp + rename). Throws Error(Errc::io).
  void write(std::string_view name, std::string_view data) const;
  bool remove(std::string_view name) const;
  // Removes everything inside (recursively, never following links); returns
  // how many regular files it removed.
  size_t clear() const;
  // Names in the folder (not . and ..), unsorted.
  std::vector<std::string> list() const;
  struct Entry {
    std::string name;
    bool dir = false, file = false;
    uint64_t bytes = 0;
  };
  std::vector<Entry> entries() const;
  // An exclusive lock on the file `name` (created 0600), blocking until held.
  FileLock lock(std::string_view name) const;
  // Throws FolderNotWritable when no file can be created in the folder
  // (creates one and removes it).
  void check_writable() const;

 private:
  std::shared_ptr<UniqueFd> fd_;
  std::filesystem::path path_;
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

// Names of files kiln removes on SIGINT or SIGTERM in its own tool (see
// core/process.hpp's interrupt handling): temporary folders register here.
void register_temp_dir(const std::filesystem::path& p);
void unregister_temp_dir(const std::filesystem::path& p);
// Removes them all; after it, making a TempDir fails (the process is ending).
void remove_registered_temp_dirs() noexcept;

}  // namespace kiln
