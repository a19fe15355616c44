#include "worker/arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <utility>

#include "core/format.hpp"

namespace kiln {

namespace {
std::byte* map_shared(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail(Errc::io, "mapping {} bytes of shared memory: {}", bytes, errno_text(errno));
  return static_cast<std::byte*>(p);
}
}  // namespace

SharedArena::SharedArena(size_t bytes) {
  size_ = bytes ? bytes : 1;
  fd_.reset(::memfd_create("kiln-arena", MFD_CLOEXEC));
  if (!fd_) fail(Errc::io, "memfd_create: {}", errno_text(errno));
  if (::ftruncate(fd_.get(), static_cast<off_t>(size_)) != 0)
    fail(Errc::io, "sizing shared memory to {} bytes: {}", size_, errno_text(errno));
  data_ = map_shared(fd_.get(), size_);
}

SharedArena SharedArena::attach(int fd, size_t bytes) {
  SharedArena a;
  a.fd_.reset(fd);
  a.size_ = bytes ? bytes : 1;
  a.data_ = map_shared(fd, a.size_);
  return a;
}

SharedArena::~SharedArena() {
  if (data_) ::munmap(data_, size_);
}

SharedArena::SharedArena(SharedArena&& o) noexcept
    : fd_(std::move(o.fd_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

SharedArena& SharedArena::operator=(SharedArena&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace kiln
