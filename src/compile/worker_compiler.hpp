// WorkerCompiler: a Compiler that compiles in a kiln-worker process, so a
// compiler that crashes or hangs (NVRTC runs inside the process that calls
// it) cannot take the caller down.
#pragma once

#include <memory>

#include "compile/compile_pool.hpp"
#include "worker/worker_pool.hpp"

namespace kiln {

class WorkerCompiler final : public Compiler {
 public:
  WorkerCompiler(std::shared_ptr<WorkerPool> pool, const Options& opts) : pool_(std::move(pool)), opts_(opts) {}
  Binary compile(const CompileRequest& req, const std::string& key) override;

 private:
  std::shared_ptr<WorkerPool> pool_;
  Options opts_;
};

// The options a worker needs to act as this process would.
nlohmann::json worker_options(const Options& o);
// Throws the error a worker reported for a request (ok = false).
[[noreturn]] void rethrow_worker_error(const nlohmann::json& reply);

}  // namespace kiln
