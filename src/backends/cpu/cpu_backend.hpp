// The cpu backend: C++ kernels compiled by the system compiler into shared
// objects, loaded with dlopen from memory, run over a thread pool.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "core/thread_pool.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/library.hpp"

namespace kiln {

class CpuDevice;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Options& opts);
  ~CpuBackend() override;
  const char* name() const override { return "cpu"; }
  std::string unavailable_reason() override;
  std::string toolchain_identity() override;
  std::string device_identity() override;
  Binary compile(const CompileRequest& req, const std::string& key) override;
  Device& device() override;
  std::shared_ptr<LoadedKernel> load(const Binary& bin) override;
  bool compiles_out_of_process() const override { return true; }
  LaunchLimits limits() override;
  std::vector<Library*> libraries() override;

  // The C++ file kiln compiles for a request: prelude, parameter defines, the
  // user's source (with #line so messages name it), and the generated entry.
  // `key` is embedded, and checked when the binary is loaded.
  static std::string generate_source(const CompileRequest& req, const std::string& key);

 private:
  struct Toolchain {
    std::string path;     // the compiler as found
    std::string version;  // its --version output
    bool clang = false;
    std::vector<std::string> flags;
  };
  const Toolchain& toolchain();

  Options opts_;
  std::once_flag toolchain_once_;
  Toolchain toolchain_;
  std::string toolchain_error_;
  std::shared_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuDevice> device_;
  std::vector<std::unique_ptr<Library>> libraries_;
};

// The host as a Device: buffers are host memory, the timer is the steady
// clock, streams are ignored.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads);
  const DeviceInfo& info() override { return info_; }
  bool host_addressable() const override { return true; }
  void* alloc(size_t bytes) override;
  void free(void* p) noexcept override;
  void to_device(void* dst, const void* src, size_t bytes, Stream) override;
  void to_host(void* dst, const void* src, size_t bytes, Stream) override;
  void copy(void* dst, const void* src, size_t bytes, Stream) override;
  void fill(void* dst, uint32_t pattern, int pattern_bytes, size_t count, Stream) override;
  void sync(Stream) override {}
  std::unique_ptr<Timer> timer() override;
  size_t flush_caches(Stream) override;
  std::string export_buffer(const void*, std::string* why) override;
  void* import_buffer(const std::string& handle) override;
  void close_import(void*) noexcept override {}
  void bind() override {}

 private:
  DeviceInfo info_;
  std::vector<char> junk_;
  std::mutex junk_m_;
};

// The CPU's model and a hash of its feature flags: "Intel(R) Xeon(R) ... (flags 1a2b...)".
std::string cpu_model();

}  // namespace kiln
