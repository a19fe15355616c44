#include "core/fsutil.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/format.hpp"

namespace kiln {

namespace fs = std::filesystem;

std::optional<std::string> read_file(const fs::path& p) {
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void write_file_atomic(const fs::path& p, std::string_view data) {
  std::string tmpl = (p.parent_path() / (".tmp-" + p.filename().string() + "-XXXXXX")).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) fail(Errc::io, "cannot create a temporary file beside '{}': {}", p.string(), errno_text(errno));
  UniqueFd f(fd);
  ::fchmod(fd, 0600);
  const char* d = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, d, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::unlink(tmpl.c_str());
      fail(Errc::io, "cannot write '{}': {}", tmpl, errno_text(err));
    }
    d += n;
    left -= static_cast<size_t>(n);
  }
  f.reset();
  if (::rename(tmpl.c_str(), p.c_str()) != 0) {
    int err = errno;
    ::unlink(tmpl.c_str());
    fail(Errc::io, "cannot rename '{}' to '{}': {}", tmpl, p.string(), errno_text(err));
  }
}

void ensure_private_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (dir.has_parent_path() && dir.parent_path() != dir && !fs::exists(dir.parent_path(), ec)) {
      fs::create_directories(dir.parent_path(), ec);
      if (ec) fail(Errc::cache, "cannot create folder '{}': {}", dir.parent_path().string(), ec.message());
    }
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      fail(Errc::cache, "cannot create cache folder '{}': {}", dir.string(), errno_text(errno));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    fail(Errc::cache, "cannot read cache folder '{}': {}", dir.string(), errno_text(errno));
  if (!S_ISDIR(st.st_mode)) fail(Errc::cache, "cache folder '{}' is not a folder", dir.string());
  if (st.st_uid != ::geteuid())
    fail(Errc::cache,
         "cache folder '{}' belongs to user {}, not to you ({}); kiln only uses a cache folder of "
         "your own: set KILN_CACHE_DIR",
         dir.string(), st.st_uid, ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    fail(Errc::cache,
         "cache folder '{}' can be written by other users (mode {:04o}); kiln refuses it, since "
         "anyone could plant code in it: run 'chmod 700 {}' or set KILN_CACHE_DIR",
         dir.string(), st.st_mode & 07777, dir.string());
}

FileLock::FileLock(const fs::path& p) {
  fd_.reset(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd_) fail(Errc::io, "cannot open lock file '{}': {}", p.string(), errno_text(errno));
  while (::flock(fd_.get(), LOCK_EX) != 0) {
    if (errno != EINTR) fail(Errc::io, "cannot lock '{}': {}", p.string(), errno_text(errno));
  }
}

FileLock::~FileLock() {
  if (fd_) ::flock(fd_.get(), LOCK_UN);
}

TempDir::TempDir(std::string_view prefix) {
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / (std::string(prefix) + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) fail(Errc::io, "cannot create a temporary folder in '{}': {}", base.string(), errno_text(errno));
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace kiln
