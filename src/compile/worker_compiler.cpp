#include "compile/worker_compiler.hpp"

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "worker/protocol.hpp"

namespace kiln {

nlohmann::json worker_options(const Options& o) {
  return {{"cxx", o.cxx},
          {"compile_timeout_s", o.compile_timeout_s},
          {"launch_threads", o.resolved_launch_threads()},
          {"cuda_device", o.cuda_device},
          {"cuda_arch", o.cuda_arch},
          {"bench_flush", o.bench_flush},
          {"cuda_flush_l2", o.cuda_flush_l2}};
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

}  // namespace kiln
