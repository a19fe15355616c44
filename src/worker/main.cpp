// kiln-worker: runs compile and benchmark requests for a WorkerPool, so that
// a compiler or kernel that crashes or hangs takes down this process, not the
// caller's. It speaks the protocol in worker/protocol.hpp on fd 3 and exits
// when the other end goes away, even while a kernel is running.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "worker/bench_executor.hpp"
#include "worker/arena.hpp"
#include "worker/protocol.hpp"

using namespace kiln;
using nlohmann::json;

namespace {

// Ends this worker and whatever its kernels started (its process group,
// when it leads one, as the pool starts it), at once: a worker has nothing to
// flush, and exit-time work such as a sanitizer's leak check would keep the
// pool waiting and could be SIGKILLed halfway.
// Compilers run in groups of their own, so they go first, with the folders
// this worker made for them.
[[noreturn]] void leave() {
  kill_child_groups();
  remove_registered_temp_dirs();
  if (::getpgrp() == ::getpid()) ::kill(0, SIGKILL);
  ::_exit(0);
}

// SIGTERM, SIGINT or SIGHUP (kiln stopping its workers when it is
// interrupted): leave as above, outside a signal handler.
void leave_on_signals() {
  on_stop_signals([](int) { leave(); });
}

// Where this worker's end of the socket was closed inside it (a kernel being
// run closed descriptors it does not own): exits with kExitConnectionClosedInside,
// so the pool tells the request's fault from a lost worker (the pool then kills
// what the worker's group started).
[[noreturn]] void leave_closed_inside() {
  kill_child_groups();
  remove_registered_temp_dirs();
  ::_exit(wire::kExitConnectionClosedInside);
}

// Leaves when the pool's end of the socket closes (its owner exited or was
// killed), whatever the main thread is doing.
void watch_parent(int sock) {
  for (;;) {
    pollfd pf{sock, POLLRDHUP, 0};
    int r = ::poll(&pf, 1, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (pf.revents & POLLNVAL)) leave_closed_inside();
    if (r > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) leave();
  }
}

Options options_from(const json& j) {
  Options o = Options::from_env();
  if (j.contains("cxx")) o.cxx = j["cxx"].get<std::string>();
  if (j.contains("compile_timeout_s")) o.compile_timeout_s = j["compile_timeout_s"].get<double>();
  if (j.contains("launch_threads")) o.launch_threads = j["launch_threads"].get<int>();
  if (j.contains("cuda_device")) o.cuda_device = j["cuda_device"].get<int>();
  if (j.contains("cuda_arch")) o.cuda_arch = j["cuda_arch"].get<std::string>();
  if (j.contains("bench_flush")) o.bench_flush = j["bench_flush"].get<bool>();
  if (j.contains("cuda_flush_l2")) o.cuda_flush_l2 = j["cuda_flush_l2"].get<bool>();
  if (j.contains("cuda_flush_read")) o.cuda_flush_read = j["cuda_flush_read"].get<bool>();
  if (j.contains("cuda_pdl")) o.cuda_pdl = j["cuda_pdl"].get<bool>();
  // A worker readies no library beside its device: that work would overlap its timings.
  // It opens cuBLASLt only where it times one of its choices.
  o.cuda_warm_libraries = false;
  return o;
}

struct Worker {
  std::map<std::string, std::shared_ptr<Backend>> backends;  // by backend + options
  std::map<std::string, std::unique_ptr<BenchExecutor>> executors;  // by backend + options
  std::map<std::string, std::shared_ptr<LoadedKernel>> loaded;

  static std::string id_of(const std::string& name, const Options& o) {
    return fmt::format("{}|{}|{}|{}|{}|{}|{}", name, o.cxx, o.launch_threads, o.cuda_device, o.cuda_arch, o.cuda_pdl,
                       o.cuda_flush_read);
  }
  Backend& backend(const std::string& name, const Options& o) {
    std::string id = id_of(name, o);
    auto it = backends.find(id);
    if (it != backends.end()) return *it->second;
    return *backends.emplace(id, make_backend(name, o)).first->second;
  }
  BenchExecutor& executor(const std::string& name, const Options& o) {
    std::string id = id_of(name, o);
    auto& e = executors[id];
    if (!e) e = std::make_unique<BenchExecutor>(backend(name, o).device());
    return *e;
  }

  std::string device_fault() {
    for (auto& [id, e] : executors) {
      auto it = backends.find(id);
      if (it != backends.end()) {
        std::string f = it->second->device().fault();
        if (!f.empty()) return f;
      }
    }
    return "";
  }

  json handle(const json& req, int fd) {
    const std::string op = req.at("op").get<std::string>();
    if (op == "ping") return {{"ok", true}, {"pid", ::getpid()}};
    if (op == "shutdown") return {{"ok", true}};
    Options o = options_from(req.value("options", json::object()));
    if (op == "compile") {
      CompileRequest r = compile_request_from_json(req.at("request"));
      Binary b = backend(r.backend, o).compile(r, req.at("key").get<std::string>());
      return {{"ok", true}, {"binary", wire::binary_to_json(b)}};
    }
    if (op == "bench") {
      if (fd < 0) fail(Errc::worker, "a bench request came without its arena");
      BenchPlan plan = bench_plan_from_json(req.at("plan"));
      SharedArena arena = SharedArena::attach(fd, plan.arena_bytes);
      Binary b = wire::binary_from_json(req.at("binary"));
      std::shared_ptr<LoadedKernel>& k = loaded[b.key];
      if (!k) k = backend(b.backend, o).load(b);
      BenchResult res = executor(b.backend, o).run(*k, plan, arena.data());
      return {{"ok", true}, {"result", to_json(res)}};
    }
    fail(Errc::worker, "unknown request '{}'", op);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int sock = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--socket-fd") == 0 && i + 1 < argc) {
      sock = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--tmp-dir") == 0 && i + 1 < argc) {
      // The TMPDIR its pool made for it: removed when it leaves (the pool
      // removes it too once it has reaped a worker that was killed).
      std::filesystem::path t = argv[++i];
      const char* env = std::getenv("TMPDIR");
      if (t.is_absolute() && env && t == std::filesystem::path(env) &&
          t.lexically_normal() == t && t.filename().string().rfind("kiln-worker-", 0) == 0)
        register_temp_dir(t);
    } else if (std::strcmp(argv[i], "--help") == 0) {
      std::printf("kiln-worker: started by kiln to compile and benchmark kernels in a process of their own.\n"
                  "It is not meant to be run by hand. Usage: kiln-worker --socket-fd N [--tmp-dir PATH]\n");
      return 0;
    }
  }
  if (::fcntl(sock, F_GETFD) < 0) {
    std::fprintf(stderr, "kiln-worker: fd %d is not open; kiln-worker is started by kiln, not by hand\n", sock);
    return 2;
  }
  leave_on_signals();
  std::thread(watch_parent, sock).detach();
  Worker w;
  // Started: said once, so that the pool tells a worker that could not start from one that a
  // request ended.
  if (!wire::send(sock, {{"ready", true}})) leave();
  for (;;) {
    json req;
    int fd = -1;
    wire::Recv r;
    try {
      r = wire::recv(sock, req, &fd, -1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln-worker: %s\n", e.what());
      return 1;
    }
    // The pool closed its end: leave at once.
    if (r != wire::Recv::ok) leave();
    json reply;
    try {
      reply = w.handle(req, fd);
    } catch (const Error& e) {
      reply = {{"ok", false}, {"error", {{"code", errc_name(e.code())}, {"message", e.what()}}}};
    } catch (const std::exception& e) {
      reply = {{"ok", false}, {"error", {{"code", "internal"}, {"message", e.what()}}}};
    }
    // A kernel that faulted on a GPU took this process's context down: say
    // so (the fault is the request's), then leave, to be replaced.
    std::string fault = w.device_fault();
    bool stop = req.value("op", "") == "shutdown" || !fault.empty();
    if (!fault.empty()) {
      std::string msg = reply.value("ok", false) ? fault : reply["error"].value("message", fault);
      reply = {{"ok", false}, {"error", {{"code", "device-fault"}, {"message", msg}}}};
    }
    if (!wire::send(sock, reply)) {
      // The request closed this end (kiln never does): its fault, told apart by the exit code.
      if (::fcntl(sock, F_GETFD) < 0 && errno == EBADF) leave_closed_inside();
      leave();
    }
    if (stop) leave();
  }
}

// Built with AddressSanitizer, let a kernel's fault end the worker by its
// signal, as it does without, so the pool reports what really happened.
extern "C" const char* __asan_default_options() {
  return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:handle_abort=0";
}
