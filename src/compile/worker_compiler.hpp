// WorkerCompiler: a Compiler that compiles in a kiln-worker process, so a
// compiler that crashes or hangs (NVRTC runs inside the process that calls
// it) cannot take the caller down.
#pragma once

#include <functional>
#include <mutex>

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

// A compiler that runs inside the process (NVRTC) on a thread of its own,
// for speed, with a worker process kept for what a thread cannot do: a
// compile still running after KILN_COMPILE_TIMEOUT is left to finish on its
// thread (nothing can stop it; its result is dropped) and the request is
// compiled in a kiln-worker instead, where the deadline kills it. A crash
// inside the compiler is not contained this way: KILN_COMPILE_MODE=subprocess
// compiles every request in a worker (docs/workers.md).
class ThreadedCompiler final : public Compiler {
 public:
  // `fallback` makes the worker compiler when a compile first needs it (never
  // where no compile outruns its deadline: threads mode needs no kiln-worker).
  ThreadedCompiler(std::shared_ptr<Backend> backend, std::function<std::shared_ptr<Compiler>()> fallback,
                   double timeout_s)
      : backend_(std::move(backend)), make_fallback_(std::move(fallback)), timeout_s_(timeout_s) {}
  Binary compile(const CompileRequest& req, const std::string& key) override;

 private:
  std::shared_ptr<Backend> backend_;
  std::function<std::shared_ptr<Compiler>()> make_fallback_;
  std::mutex m_;
  std::shared_ptr<Compiler> fallback_;  // made on first use, under m_
  double timeout_s_;
};

// The options a worker needs to act as this process would.
nlohmann::json worker_options(const Options& o);
// Throws the error a worker reported for a request (ok = false).
[[noreturn]] void rethrow_worker_error(const nlohmann::json& reply);

}  // namespace kiln
