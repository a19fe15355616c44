// SharedArena: anonymous memory (memfd) mapped shared, so a worker process
// can run a kernel on the very bytes the caller put there.
#pragma once

#include <cstddef>

#include "core/process.hpp"

namespace kiln {

class SharedArena {
 public:
  SharedArena() = default;
  explicit SharedArena(size_t bytes);            // creates and maps (zeroed)
  static SharedArena attach(int fd, size_t bytes);  // maps a received fd (takes ownership)
  ~SharedArena();
  SharedArena(SharedArena&& o) noexcept;
  SharedArena& operator=(SharedArena&& o) noexcept;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln
