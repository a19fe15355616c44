// The cpu backend: C++ kernels compiled by the system compiler into shared
// objects, loaded with dlopen from memory, run over a thread pool.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "core/fsutil.hpp"
#include "core/thread_pool.hpp"
#include "kiln/backend.hpp"

namespace kiln {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Options& opts);
  const char* name() const override { return "cpu"; }
  std::string toolchain_identity() override;
  std::string device_identity() override;
  Binary compile(const CompileRequest& req, const std::string& key) override;
  std::shared_ptr<LoadedKernel> load(const Binary& bin) override;
  bool compiles_out_of_process() const override { return true; }

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
  std::mutex load_mutex_;
  std::unique_ptr<TempDir> load_dir_;  // where binaries wait to be mapped
  uint64_t loads_ = 0;
};

}  // namespace kiln
