#include "core/fsutil.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "core/format.hpp"
#include "core/log.hpp"

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

namespace {

// Reads an open file: a regular file of at most `max_bytes`, else Error(Errc::io) naming `what`.
std::string read_open_regular(int fd, const std::string& what, size_t max_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) fail(Errc::io, "{}: cannot read it: {}", what, errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail(Errc::io, "{}: not a regular file", what);
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    fail(Errc::io, "{}: {} bytes, more than the {} it may have", what, st.st_size, max_bytes);
  // The size may change under us: read at most one byte past the cap, and refuse that.
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) fail(Errc::io, "{}: it grew past the {} bytes it may have", what, max_bytes);
      out.resize(std::min(out.size() + 65536, max_bytes + 1));
      if (got == out.size()) break;
    }
    ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(Errc::io, "{}: cannot read it: {}", what, errno_text(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  if (got > max_bytes) fail(Errc::io, "{}: it grew past the {} bytes it may have", what, max_bytes);
  out.resize(got);
  return out;
}

}  // namespace

std::optional<std::string> read_regular_file(const fs::path& p, size_t max_bytes) {
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    fail(Errc::io, "{}: cannot open it: {}", p.string(), errno_text(errno));
  }
  return read_open_regular(fd.get(), p.string(), max_bytes);
}

std::optional<std::string> read_entry(const fs::path& dir, std::string_view rel, size_t max_bytes) {
  UniqueFd cur(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cur) fail(Errc::io, "{}: cannot open the folder: {}", dir.string(), errno_text(errno));
  const std::string what = (dir / std::string(rel)).string();
  size_t at = 0;
  for (;;) {
    const size_t slash = rel.find('/', at);
    const std::string part(rel.substr(at, slash == std::string_view::npos ? std::string_view::npos : slash - at));
    if (part.empty() || part == "." || part == "..") fail(Errc::io, "{}: not a plain relative name", what);
    const bool last = slash == std::string_view::npos;
    UniqueFd next(::openat(cur.get(), part.c_str(),
                           last ? O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC
                                : O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      if (errno == ENOENT) return std::nullopt;
      if (errno == ELOOP || errno == ENOTDIR) fail(Errc::io, "{}: '{}' is a link or not a folder; refused", what, part);
      fail(Errc::io, "{}: cannot open '{}': {}", what, part, errno_text(errno));
    }
    if (last) return read_open_regular(next.get(), what, max_bytes);
    cur = std::move(next);
    at = slash + 1;
  }
}

unsigned shared_file_mode() {
  // The umask read from /proc (umask(2) would set it, racing other threads); 022 where it cannot be.
  unsigned mask = 022;
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[128];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
    std::fclose(f);
  }
  return 0666u & ~mask;
}

void write_file_atomic(const fs::path& p, std::string_view data, unsigned mode) {
  std::string tmpl = (p.parent_path() / (".tmp-" + p.filename().string() + "-XXXXXX")).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) fail(Errc::io, "cannot create a temporary file beside '{}': {}", p.string(), errno_text(errno));
  UniqueFd f(fd);
  ::fchmod(fd, static_cast<mode_t>(mode));
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

FileLock::FileLock(const fs::path& p) {
  fd_.reset(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd_) fail(Errc::io, "cannot open lock file '{}': {}", p.string(), errno_text(errno));
  while (::flock(fd_.get(), LOCK_EX) != 0) {
    if (errno != EINTR) fail(Errc::io, "cannot lock '{}': {}", p.string(), errno_text(errno));
  }
}

FileLock::FileLock(UniqueFd fd, const std::string& what) : fd_(std::move(fd)) {
  while (::flock(fd_.get(), LOCK_EX) != 0) {
    if (errno != EINTR) fail(Errc::io, "cannot lock '{}': {}", what, errno_text(errno));
  }
}

FileLock::~FileLock() {
  if (fd_) ::flock(fd_.get(), LOCK_UN);
}

namespace {
std::mutex g_temp_m;
bool g_temp_closed = false;  // set once registered folders were removed
std::set<std::string>& temp_dirs() {
  static std::set<std::string> s;
  return s;
}
}  // namespace

TempDir::TempDir(std::string_view prefix) {
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / (std::string(prefix) + "-XXXXXX")).string();
  // Made and registered under one lock, so an interrupt's clean-up sees it.
  std::lock_guard<std::mutex> g(g_temp_m);
  if (g_temp_closed) fail(Errc::io, "kiln is stopping: no temporary folder is created");
  if (!::mkdtemp(tmpl.data())) fail(Errc::io, "cannot create a temporary folder in '{}': {}", base.string(), errno_text(errno));
  path_ = tmpl;
  temp_dirs().insert(path_.string());
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  unregister_temp_dir(path_);
}

void register_temp_dir(const fs::path& p) {
  std::lock_guard<std::mutex> g(g_temp_m);
  temp_dirs().insert(p.string());
}
void unregister_temp_dir(const fs::path& p) {
  std::lock_guard<std::mutex> g(g_temp_m);
  temp_dirs().erase(p.string());
}
void remove_registered_temp_dirs() noexcept {
  std::lock_guard<std::mutex> g(g_temp_m);
  g_temp_closed = true;
  for (const auto& d : temp_dirs()) {
    std::error_code ec;
    fs::remove_all(d, ec);
  }
  temp_dirs().clear();
}

// ---- SafeDir ----

namespace {

uint64_t random_u64() {
  static std::atomic<uint64_t> counter{0};
  uint64_t x = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ULL ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (counter.fetch_add(1) << 32);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  return x ^ (x >> 29);
}

std::string mode_text(mode_t m) { return fmt::format("{:04o}", m & 07777); }

// Why a folder (an ancestor, or the cache folder itself when `own`) is unsafe, or "".
std::string unsafe(const struct stat& st, bool own) {
  uid_t me = ::geteuid();
  if (!S_ISDIR(st.st_mode)) return "is not a folder";
  if (own) {
    if (st.st_uid != me) return fmt::format("belongs to user {}, not to you ({})", st.st_uid, me);
    if (st.st_mode & (S_IWGRP | S_IWOTH))
      return fmt::format("can be written by other users (mode {})", mode_text(st.st_mode));
    return "";
  }
  if (st.st_uid != me && st.st_uid != 0) return fmt::format("belongs to user {}, neither you nor root", st.st_uid);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
    return fmt::format("can be written by other users without the sticky bit (mode {}), so they could rename "
                       "what is inside",
                       mode_text(st.st_mode));
  return "";
}

}  // namespace

namespace {
// Why a folder or file cannot be made: FolderNotWritable where the cause is
// the folder's (no permission, a read-only mount, a full disk), else a cache error.
bool not_writable(int err) { return err == EACCES || err == EPERM || err == EROFS || err == ENOSPC || err == EDQUOT; }
[[noreturn]] void cannot_create(const fs::path& p, int err) {
  const std::string what = fmt::format("cannot create folder '{}': {}", p.string(), errno_text(err));
  if (not_writable(err)) throw FolderNotWritable(Errc::cache, what);
  fail(Errc::cache, "{}", what);
}
}  // namespace

int SafeDir::fd() const { return fd_ ? fd_->get() : -1; }

void SafeDir::check_writable() const {
  const std::string probe = fmt::format(".probe-{:016x}", random_u64());
  UniqueFd f(::openat(fd(), probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!f) {
    const int err = errno;
    const std::string what = fmt::format("cannot write in folder '{}': {}", path_.string(), errno_text(err));
    if (not_writable(err)) throw FolderNotWritable(Errc::cache, what);
    fail(Errc::cache, "{}", what);
  }
  ::unlinkat(fd(), probe.c_str(), 0);
}

SafeDir SafeDir::open(const fs::path& path, bool create) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) fail(Errc::cache, "cache folder '{}': {}", path.string(), ec.message());
  abs = abs.lexically_normal();
  // Resolve links in the part that exists, so a link in a parent (a home
  // folder reached through one) is checked where it leads.
  fs::path existing = abs, rest;
  while (!fs::exists(existing, ec) && existing.has_relative_path()) {
    rest = existing.filename() / rest;
    existing = existing.parent_path();
  }
  fs::path canon = fs::canonical(existing, ec);
  if (ec) fail(Errc::cache, "cache folder '{}': cannot resolve '{}': {}", path.string(), existing.string(), ec.message());
  canon = (canon / rest).lexically_normal();
  if (!canon.empty() && canon.filename().empty()) canon = canon.parent_path();

  UniqueFd cur(::open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!cur) fail(Errc::cache, "cannot open '/': {}", errno_text(errno));
  fs::path walked = "/";
  std::vector<std::string> parts;
  for (const auto& c : canon.relative_path()) parts.push_back(c.string());
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    struct stat st;
    if (::fstat(cur.get(), &st) != 0) fail(Errc::cache, "cannot read '{}': {}", walked.string(), errno_text(errno));
    std::string why = unsafe(st, false);
    if (!why.empty())
      fail(Errc::cache,
           "cache folder '{}' is inside '{}', which {}; kiln refuses a cache another user could replace "
           "(anyone who can, could make kiln load their code): set KILN_CACHE_DIR to a folder of your own",
           path.string(), walked.string(), why);
    walked /= parts[i];
    UniqueFd next(::openat(cur.get(), parts[i].c_str(), O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!next && errno == ENOENT) {
      if (!create) return SafeDir();
      if (::mkdirat(cur.get(), parts[i].c_str(), 0700) != 0 && errno != EEXIST) cannot_create(walked, errno);
      next.reset(::openat(cur.get(), parts[i].c_str(), O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!next) {
      int err = errno;
      std::error_code lec;
      if ((err == ELOOP || err == ENOTDIR) && fs::is_symlink(fs::symlink_status(walked, lec)) && !fs::exists(walked, lec))
        fail(Errc::cache, "cache folder '{}': '{}' is a symbolic link to '{}', which is not there", path.string(),
             walked.string(), fs::read_symlink(walked, lec).string());
      if (err == ELOOP || err == ENOTDIR)
        fail(Errc::cache, "cache folder '{}': '{}' is not a folder (or was replaced by a link while kiln opened it)",
             path.string(), walked.string());
      fail(Errc::cache, "cannot open folder '{}': {}", walked.string(), errno_text(err));
    }
    cur = std::move(next);
    if (last) {
      if (::fstat(cur.get(), &st) != 0) fail(Errc::cache, "cannot read '{}': {}", walked.string(), errno_text(errno));
      why = unsafe(st, true);
      if (!why.empty())
        fail(Errc::cache,
             "cache folder '{}' {}; kiln only uses a cache folder of your own that no one else can write, since "
             "anyone who could write it could plant code in it: run 'chmod 700 {}' or set KILN_CACHE_DIR",
             path.string(), why, path.string());
    }
  }
  if (parts.empty()) fail(Errc::cache, "the cache folder cannot be '/'");
  SafeDir d;
  d.fd_ = std::make_shared<UniqueFd>(std::move(cur));
  d.path_ = path;
  return d;
}

namespace {
// Whether `name` in the folder `dir` is a symbolic link (not followed).
bool is_link_at(int dir, const std::string& name) {
  struct stat st;
  return ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}
}  // namespace

SafeDir SafeDir::sub(std::string_view name, bool create) const {
  std::string n(name);
  if (n.empty() || n.find('/') != std::string::npos || n == "." || n == "..")
    fail(Errc::internal, "SafeDir::sub: bad name '{}'", n);
  UniqueFd f(::openat(fd(), n.c_str(), O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!f && !create && (errno == ENOENT || errno == ENOTDIR || errno == ELOOP || errno == EACCES)) {
    if (errno == EACCES) {
      // Said once a folder: every lookup of its kernel comes here.
      static std::mutex said_m;
      static std::set<std::string> said;
      std::lock_guard<std::mutex> g(said_m);
      if (said.insert((path_ / n).string()).second)
        log::warn("cache folder '{}' cannot be read (permission denied); ignored", (path_ / n).string());
    }
    else if (errno != ENOENT)
      log::warn("cache folder '{}' is {}; ignored", (path_ / n).string(),
                is_link_at(fd(), n) ? "a symbolic link (kiln follows none inside its cache)" : "not a folder");
    return SafeDir();
  }
  if (!f && errno == ENOENT) {
    if (::mkdirat(fd(), n.c_str(), 0700) != 0 && errno != EEXIST) cannot_create(path_ / n, errno);
    f.reset(::openat(fd(), n.c_str(), O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  }
  if (!f) {
    const int err = errno;
    if ((err == ENOTDIR || err == ELOOP) && is_link_at(fd(), n))
      fail(Errc::cache,
           "cache folder '{}' is a symbolic link: kiln follows no link inside its cache (one could lead it to code "
           "someone else wrote); make it a folder, or link the whole cache instead (KILN_CACHE_DIR may be a link)",
           (path_ / n).string());
    if (err == ENOTDIR) fail(Errc::cache, "cache folder '{}' is not a folder", (path_ / n).string());
    fail(Errc::cache, "cannot open folder '{}': {}", (path_ / n).string(), errno_text(err));
  }
  struct stat st;
  if (::fstat(f.get(), &st) != 0) fail(Errc::cache, "cannot read '{}': {}", (path_ / n).string(), errno_text(errno));
  std::string why = unsafe(st, true);
  if (!why.empty())
    fail(Errc::cache, "cache folder '{}' {}; kiln refuses it, since anyone who could write it could plant code in it{}",
         (path_ / n).string(), why,
         st.st_uid == ::geteuid() ? fmt::format(": run 'chmod 700 {}' or set KILN_CACHE_DIR", (path_ / n).string())
                                  : std::string(": set KILN_CACHE_DIR to a folder of your own"));
  SafeDir d;
  d.fd_ = std::make_shared<UniqueFd>(std::move(f));
  d.path_ = path_ / n;
  return d;
}

std::optional<std::string> SafeDir::read(std::string_view name, size_t max_bytes) const {
  if (!fd_) return std::nullopt;
  std::string n(name);
  UniqueFd f(::openat(fd(), n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!f) {
    if (errno != ENOENT) log::debug("cache entry '{}' cannot be opened: {}", (path_ / n).string(), errno_text(errno));
    return std::nullopt;
  }
  struct stat st;
  if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    log::warn("cache entry '{}' is not a regular file of yours; ignored", (path_ / n).string());
    return std::nullopt;
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    log::warn("cache entry '{}' is {} bytes, more than the {} an entry of its kind may have; ignored",
              (path_ / n).string(), st.st_size, max_bytes);
    return std::nullopt;
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::read(f.get(), out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

void SafeDir::write(std::string_view name, std::string_view data) const {
  std::string n(name);
  std::string tmp = fmt::format(".tmp-{}-{:016x}", n, random_u64());
  UniqueFd f(::openat(fd(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!f) fail(Errc::io, "cannot create a file in '{}': {}", path_.string(), errno_text(errno));
  const char* d = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t w = ::write(f.get(), d, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::unlinkat(fd(), tmp.c_str(), 0);
      fail(Errc::io, "cannot write '{}': {}", (path_ / n).string(), errno_text(err));
    }
    d += w;
    left -= static_cast<size_t>(w);
  }
  f.reset();
  if (::renameat(fd(), tmp.c_str(), fd(), n.c_str()) != 0) {
    int err = errno;
    ::unlinkat(fd(), tmp.c_str(), 0);
    fail(Errc::io, "cannot rename into '{}': {}", (path_ / n).string(), errno_text(err));
  }
}

bool SafeDir::remove(std::string_view name) const {
  if (!fd_) return false;
  std::string n(name);
  return ::unlinkat(fd(), n.c_str(), 0) == 0;
}

std::vector<SafeDir::Entry> SafeDir::entries() const {
  std::vector<Entry> out;
  if (!fd_) return out;
  int dup = ::fcntl(fd(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return out;
  DIR* d = ::fdopendir(dup);
  if (!d) {
    ::close(dup);
    return out;
  }
  ::rewinddir(d);
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    struct stat st;
    Entry en;
    en.name = n;
    if (::fstatat(fd(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      en.dir = S_ISDIR(st.st_mode);
      en.file = S_ISREG(st.st_mode);
      en.bytes = static_cast<uint64_t>(st.st_size);
    }
    out.push_back(std::move(en));
  }
  ::closedir(d);
  return out;
}

std::vector<std::string> SafeDir::list() const {
  std::vector<std::string> out;
  for (auto& e : entries()) out.push_back(std::move(e.name));
  return out;
}

size_t SafeDir::clear() const {
  size_t n = 0;
  for (const auto& e : entries()) {
    if (e.dir) {
      UniqueFd f(::openat(fd(), e.name.c_str(), O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (f) {
        SafeDir child;
        child.fd_ = std::make_shared<UniqueFd>(std::move(f));
        child.path_ = path_ / e.name;
        n += child.clear();
      }
      ::unlinkat(fd(), e.name.c_str(), AT_REMOVEDIR);
    } else {
      if (::unlinkat(fd(), e.name.c_str(), 0) == 0 && e.file) ++n;
    }
  }
  return n;
}

FileLock SafeDir::lock(std::string_view name) const {
  std::string n(name);
  UniqueFd f(::openat(fd(), n.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!f) fail(Errc::io, "cannot open lock file '{}': {}", (path_ / n).string(), errno_text(errno));
  return FileLock(std::move(f), (path_ / n).string());
}

}  // namespace kiln
