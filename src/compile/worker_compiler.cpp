#include "compile/worker_compiler.hpp"

#include <chrono>
#include <future>
#include <thread>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "core/log.hpp"
#include "worker/protocol.hpp"

namespace kiln {

nlohmann::json worker_options(const Options& o) {
  return {{"cxx", o.cxx},
          {"compile_timeout_s", o.compile_timeout_s},
          {"launch_threads", o.resolved_launch_threads()},
          {"cuda_device", o.cuda_device},
          {"cuda_arch", o.cuda_arch},
          {"bench_flush", o.bench_flush},
          {"cuda_flush_l2", o.cuda_flush_l2},
          {"cuda_flush_read", o.cuda_flush_read},
          {"cuda_pdl", o.cuda_pdl}};
}

void rethrow_worker_error(const nlohmann::json& reply) {
  const auto& e = reply.at("error");
  throw Error(errc_from_name(e.at("code").get<std::string>()), e.at("message").get<std::string>());
}

Binary WorkerCompiler::compile(const CompileRequest& req, const std::string& key) {
  WorkerPool::Request r;
  r.msg = {{"op", "compile"}, {"request", to_json(req)}, {"key", key}, {"options", worker_options(opts_)}};
  // The compiler has its own time-out inside the worker; this one catches a worker that hangs.
  r.timeout_s = opts_.compile_timeout_s + 30;
  r.what = fmt::format("compiling kernel '{}' (config {})", req.kernel, req.config_text);
  r.reproduce = "KILN_COMPILE_MODE=threads KILN_COMPILE_THREADS=1";
  r.request_faults = true;  // a compiler crashing on this source; retried once, as any worker fault
  r.retry_request_faults = true;
  nlohmann::json reply = pool_->call(r);
  if (!reply.value("ok", false)) rethrow_worker_error(reply);
  return wire::binary_from_json(reply.at("binary"));
}

Binary ThreadedCompiler::compile(const CompileRequest& req, const std::string& key) {
  auto done = std::make_shared<std::promise<Binary>>();
  std::future<Binary> result = done->get_future();
  std::thread([backend = backend_, req, key, done] {
    try {
      done->set_value(backend->compile(req, key));
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(timeout_s_)) == std::future_status::ready) return result.get();
  log::warn("kernel '{}' (config {}): the compiler ran past KILN_COMPILE_TIMEOUT ({:g} s) in this process; it is "
            "left to finish and the kernel is compiled in a kiln-worker, where the deadline holds",
            req.kernel, req.config_text, timeout_s_);
  std::shared_ptr<Compiler> fallback;
  {
    std::lock_guard<std::mutex> g(m_);
    if (!fallback_) fallback_ = make_fallback_();
    fallback = fallback_;
  }
  return fallback->compile(req, key);
}

}  // namespace kiln
