#include <dlfcn.h>
#include "worker/worker_pool.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/format.hpp"
#include "core/log.hpp"
#include "worker/protocol.hpp"

namespace kiln {

namespace fs = std::filesystem;

fs::path WorkerPool::find_exe(const fs::path& configured) {
  std::vector<fs::path> tried;
  auto ok = [&](const fs::path& p) {
    tried.push_back(p);
    return ::access(p.c_str(), X_OK) == 0;
  };
  if (!configured.empty()) {
    if (ok(configured)) return configured;
    fail(Errc::worker, "KILN_WORKER={} is not an executable", configured.string());
  }
  // Beside the program, one folder up (a test or benchmark below the build
  // folder), then beside the library that holds this code (libkiln.so,
  // wherever it was installed: lib/ -> ../bin, ../libexec/kiln). Nothing is
  // baked in at build time, so an installed tree can move.
  const fs::path exe = self_exe_dir();
  std::vector<fs::path> places{exe / "kiln-worker", exe.parent_path() / "kiln-worker"};
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&WorkerPool::find_exe), &info) && info.dli_fname) {
    std::error_code ec;
    fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec).parent_path();
    if (!ec && lib != exe) {
      places.push_back(lib / "kiln-worker");
      places.push_back(lib.parent_path() / "bin" / "kiln-worker");
      places.push_back(lib.parent_path() / "libexec" / "kiln" / "kiln-worker");
    }
  }
  for (const auto& p : places)
    if (ok(p)) return p;
  std::string list;
  for (const auto& t : tried) list += " " + t.string();
  fail(Errc::worker, "cannot find the kiln-worker executable (looked at{}); set KILN_WORKER", list);
}

WorkerPool::WorkerPool(fs::path exe, int size) : exe_(std::move(exe)), slots_(size < 1 ? 1 : size) {}

WorkerPool::~WorkerPool() {
  std::lock_guard<std::mutex> g(m_);
  for (auto& s : slots_) stop(s, true);
}

void WorkerPool::spawn(Slot& s) {
  std::unique_ptr<TempDir> tmp;
  try {
    tmp = std::make_unique<TempDir>("kiln-worker");
  } catch (const Error& e) {
    // No folder of its own (a full or read-only /tmp): it runs with the
    // environment's TMPDIR, as a compile in this process would.
    log::debug("worker: no temporary folder of its own: {}", e.what());
  }
  std::vector<std::string> argv{exe_.string(), "--socket-fd", "3"}, env;
  if (tmp) {
    const std::string dir = fs::absolute(tmp->path()).string();
    argv.insert(argv.end(), {"--tmp-dir", dir});
    env.push_back("TMPDIR=" + dir);
  }
  SpawnedChild c = spawn_with_socket(argv, env);
  s.tmp = std::move(tmp);
  s.ready = false;
  s.pid = c.pid;
  s.sock = std::move(c.sock);
  s.pidfd = std::move(c.pidfd);
  {
    std::lock_guard<std::mutex> g(pid_m_);
    s.signal_pid = c.pid;
    if (abandoned_) ::kill(c.pid, SIGTERM);  // abandoned while it started: it leaves at once
  }
  std::lock_guard<std::mutex> g(m_);
  ++counters_.spawned;
}

void WorkerPool::kill_and_reap(Slot& s, int* status) {
  pid_t pid = s.pid;
  {
    std::lock_guard<std::mutex> g(pid_m_);  // never signalled once it may be reaped (its pid reused)
    s.signal_pid = -1;
  }
  ::kill(-pid, SIGKILL);  // the worker and everything it started
  ::kill(pid, SIGKILL);
  kill_session(pid);  // and the compilers it ran in groups of their own, before its folder goes
  int st = reap(pid);
  if (status) *status = st;
  unregister_child_group(pid);
  s.pid = -1;
  s.sock.reset();
  s.pidfd.reset();
  s.tmp.reset();
}

void WorkerPool::stop(Slot& s, bool polite) {
  if (s.pid < 0) return;
  if (polite) {
    // Closing our end is the request to exit: the worker sees end of input.
    s.sock.reset();
    {
      std::lock_guard<std::mutex> g(pid_m_);
      s.signal_pid = -1;
    }
    for (int i = 0; i < 200; ++i) {
      int status;
      pid_t r = ::waitpid(s.pid, &status, WNOHANG);
      if (r == s.pid || (r < 0 && errno == ECHILD)) {
        ::kill(-s.pid, SIGKILL);  // anything it left behind
        unregister_child_group(s.pid);
        s.pid = -1;
        s.pidfd.reset();
        s.tmp.reset();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  kill_and_reap(s, nullptr);
}

bool WorkerPool::alive(Slot& s) {
  if (s.pid < 0) return false;
  int status;
  {
    std::lock_guard<std::mutex> g(pid_m_);  // reaped and forgotten at once, as abandon() sees it
    siginfo_t info{};
    // Seen dead without reaping it: its pid cannot be reused while its
    // session (the compilers it may have left running) is swept.
    if (::waitid(P_PID, static_cast<id_t>(s.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0)
      return true;
    kill_session(s.pid);
    ::waitpid(s.pid, &status, 0);
    s.signal_pid = -1;
  }
  // Died while idle (or was killed from outside): reaped now, with its group.
  ::kill(-s.pid, SIGKILL);
  unregister_child_group(s.pid);
  s.pid = -1;
  s.sock.reset();
  s.pidfd.reset();
  s.tmp.reset();
  return false;
}

void WorkerPool::warm() {
  std::vector<Slot*> mine;
  {
    std::unique_lock<std::mutex> lk(m_);
    for (auto& s : slots_)
      if (!s.busy) {
        s.busy = true;
        mine.push_back(&s);
      }
  }
  std::string err;
  for (Slot* s : mine) {
    try {
      if (!alive(*s)) spawn(*s);
      nlohmann::json reply;
      WorkerFault fault;
      std::string what;
      Request ping;
      ping.msg = {{"op", "ping"}};
      ping.timeout_s = 10;
      ping.what = "ping";
      if (!attempt(*s, ping, reply, fault, what) && err.empty()) err = what;
    } catch (const Error& e) {
      if (err.empty()) err = e.what();
    }
  }
  {
    std::lock_guard<std::mutex> g(m_);
    for (Slot* s : mine) s->busy = false;
  }
  free_.notify_all();
  if (!err.empty()) fail(Errc::worker, "starting kiln workers ({}): {}", exe_.string(), err);
}

void WorkerPool::quiesce() {
  std::lock_guard<std::mutex> g(m_);
  for (auto& s : slots_)
    if (!s.busy) stop(s, true);
}

namespace {
// Signals a process raises by itself when the code it runs faults.
bool self_raised(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT || sig == SIGTRAP ||
         sig == SIGSYS;
}
}  // namespace

bool WorkerPool::attempt(Slot& s, const Request& r, nlohmann::json& out, WorkerFault& fault, std::string& what) {
  fault = WorkerFault{};
  // A worker that exits by itself while running a request (the request's code called exit), or
  // shuts its end of the connection and keeps running (the request's code closed descriptors it
  // does not own), was ended by that request, as by a crash: the request is not retried.
  auto by_request = [&](const std::string& how) {
    fault.kind = WorkerFault::Kind::crash;
    fault.of_request = r.request_faults;
    ++counters_.crashed;
    what = how;
    return false;
  };
  // (A worker blamed below has said it started: an exit or a shut connection while it runs
  // the request is then the request's doing.)
  auto ended = [&](const char* when, bool running, bool shut_while_alive = false) {
    int status = 0;
    kill_and_reap(s, &status);
    std::lock_guard<std::mutex> g(m_);
    if (shut_while_alive)
      return by_request(fmt::format("closed its connection to kiln {} and was killed", when));
    if (running && WIFEXITED(status) && WEXITSTATUS(status) == wire::kExitConnectionClosedInside)
      // (The code the worker leaves with then; a kernel that called exit(71) itself reads the same.)
      return by_request(fmt::format("closed its connection to kiln {} (or exited with code {})", when,
                                    wire::kExitConnectionClosedInside));
    if (running && WIFEXITED(status))
      return by_request(fmt::format("exited with code {} {}", WEXITSTATUS(status), when));
    if (WIFSIGNALED(status)) {
      int sig = WTERMSIG(status);
      fault.signal = sig;
      if (running && self_raised(sig)) {
        fault.kind = WorkerFault::Kind::crash;
        fault.of_request = r.request_faults;
        ++counters_.crashed;
      } else {
        fault.kind = WorkerFault::Kind::lost;
        ++counters_.lost;
      }
      what = fmt::format("was killed by {} {}", signal_name(sig), when);
    } else {
      fault.kind = WorkerFault::Kind::lost;
      ++counters_.lost;
      what = WIFEXITED(status) ? fmt::format("exited with code {} {}", WEXITSTATUS(status), when)
                               : fmt::format("was lost {}", when);
    }
    return false;
  };
  if (!s.ready) {
    // Its first frame says it started: a worker that cannot start (a library it lacks, a bad
    // descriptor) ends before it, and is the machine's fault, never the request's.
    nlohmann::json hello;
    wire::Recv h = wire::Recv::eof;
    try {
      h = wire::recv(s.sock.get(), hello, nullptr, 30000, s.pidfd.get());
    } catch (const Error&) {
    }
    if (h != wire::Recv::ok || !hello.is_object() || !hello.value("ready", false)) {
      return ended(h == wire::Recv::timeout ? "before it started (30 s)" : "before it started", false);
    }
    s.ready = true;
  }
  if (!wire::send(s.sock.get(), r.msg, r.fd)) return ended("before it took the request", false);
  int timeout_ms = static_cast<int>(std::min(r.timeout_s * 1000.0, 2.0e9));
  wire::Recv got;
  try {
    got = wire::recv(s.sock.get(), out, nullptr, timeout_ms, s.pidfd.get());
  } catch (const Error& e) {
    bool r2 = ended("after a malformed reply", true);
    what += fmt::format(" ({})", e.what());
    return r2;
  }
  if (got == wire::Recv::ok) return true;
  if (got == wire::Recv::timeout) {
    kill_and_reap(s, nullptr);
    std::lock_guard<std::mutex> g(m_);
    ++counters_.timed_out;
    fault.kind = WorkerFault::Kind::timeout;
    fault.deadline_s = r.timeout_s;
    fault.of_request = r.request_faults;
    what = fmt::format("timed out after {:g}s and was killed", r.timeout_s);
    return false;
  }
  // The connection shut: a worker that is exiting closes it a moment before it is seen to
  // exit, so it is given 200 ms to be seen so before it is taken for one that shut it and runs on.
  bool shut_while_alive = false;
  if (got == wire::Recv::eof) {
    pollfd p{s.pidfd.get(), POLLIN, 0};
    shut_while_alive = s.pidfd.get() >= 0 && ::poll(&p, 1, 200) == 0;
  }
  return ended("while running it", true, shut_while_alive);
}

void WorkerPool::abandon() {
  std::lock_guard<std::mutex> g(m_);
  std::lock_guard<std::mutex> gp(pid_m_);
  abandoned_ = true;
  // SIGTERM: a worker leaves at once, killing first the compilers it runs
  // (in process groups of their own, which its own group's death would not
  // reach); its caller sees it die, reaps it, and stops.
  for (auto& s : slots_)
    if (s.busy && s.signal_pid > 0) ::kill(s.signal_pid, SIGTERM);
  free_.notify_all();
}

nlohmann::json WorkerPool::call(const Request& r) {
  auto gone = [&] {
    return Error(Errc::cancelled, fmt::format("{}: not done: the runtime that asked for it is going away", r.what));
  };
  Slot* s = nullptr;
  {
    std::unique_lock<std::mutex> lk(m_);
    ++counters_.calls;
    reap_idle();
    for (;;) {
      if (abandoned_) throw gone();
      for (auto& x : slots_)
        if (!x.busy && (!s || (s->pid < 0 && x.pid >= 0))) s = &x;  // prefer a started worker
      if (s) break;
      free_.wait(lk);
    }
    s->busy = true;
  }
  struct Release {
    WorkerPool& p;
    Slot& s;
    ~Release() {
      {
        std::lock_guard<std::mutex> g(p.m_);
        s.busy = false;
      }
      p.free_.notify_one();
    }
  } release{*this, *s};

  std::string first;
  for (int attempt_no = 0; attempt_no < 2; ++attempt_no) {
    if (!alive(*s)) spawn(*s);
    nlohmann::json reply;
    WorkerFault fault;
    std::string what;
    if (attempt(*s, r, reply, fault, what)) return reply;
    if (abandoned_) throw gone();
    const bool retry = attempt_no == 0 && (!fault.of_request || r.retry_request_faults);
    if (retry) {
      first = what;
      {
        std::lock_guard<std::mutex> g(m_);
        ++counters_.retried;
      }
      log::info("{}: the worker {}; retrying once on a fresh worker", r.what, what);
      continue;
    }
    std::string repro = r.reproduce.empty() ? "" : " To reproduce in this process: " + r.reproduce;
    if (attempt_no == 0)
      throw WorkerError(fault, fmt::format("{}: the worker {} (not retried: a {} while running the request is its "
                                           "own and would happen again).{}",
                                           r.what, what, worker_fault_name(fault.kind), repro));
    throw WorkerError(fault, fmt::format("{}: the worker {}; retried once on a fresh worker, which {} too.{}", r.what,
                                         first, what, repro));
  }
  fail(Errc::internal, "unreachable");
}

void WorkerPool::reap_idle() {
  for (auto& s : slots_)
    if (!s.busy) alive(s);
}

std::vector<pid_t> WorkerPool::pids() {
  std::lock_guard<std::mutex> g(m_);
  reap_idle();
  std::vector<pid_t> out;
  for (const auto& s : slots_)
    if (s.pid >= 0) out.push_back(s.pid);
  return out;
}

WorkerPool::Counters WorkerPool::counters() const {
  std::lock_guard<std::mutex> g(m_);
  return counters_;
}

}  // namespace kiln
