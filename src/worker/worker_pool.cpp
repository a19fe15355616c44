#include "worker/worker_pool.hpp"

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
  fs::path beside = fs::path(self_exe_dir()) / "kiln-worker";
  if (ok(beside)) return beside;
#ifdef KILN_WORKER_BUILD_PATH
  if (ok(KILN_WORKER_BUILD_PATH)) return KILN_WORKER_BUILD_PATH;
#endif
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
  SpawnedChild c = spawn_with_socket({exe_.string(), "--socket-fd", "3"});
  s.pid = c.pid;
  s.sock = std::move(c.sock);
  std::lock_guard<std::mutex> g(m_);
  ++counters_.spawned;
}

void WorkerPool::stop(Slot& s, bool polite) {
  if (s.pid < 0) return;
  if (polite) {
    // Closing our end is the request to exit: the worker sees end of input.
    s.sock.reset();
    for (int i = 0; i < 200; ++i) {
      int status;
      pid_t r = ::waitpid(s.pid, &status, WNOHANG);
      if (r == s.pid || (r < 0 && errno == ECHILD)) {
        s.pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ::kill(s.pid, SIGKILL);
  reap(s.pid);
  s.pid = -1;
  s.sock.reset();
}

bool WorkerPool::alive(Slot& s) {
  if (s.pid < 0) return false;
  int status;
  pid_t r = ::waitpid(s.pid, &status, WNOHANG);
  if (r == 0) return true;
  s.pid = -1;  // died while idle (or was killed from outside): reaped now
  s.sock.reset();
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
      std::string what = attempt(*s, Request{{{"op", "ping"}}, -1, 10, "ping", ""}, reply);
      if (!what.empty() && err.empty()) err = what;
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

std::string WorkerPool::attempt(Slot& s, const Request& r, nlohmann::json& out) {
  auto died = [&](const char* when) {
    int status = reap(s.pid);
    s.pid = -1;
    s.sock.reset();
    std::lock_guard<std::mutex> g(m_);
    ++counters_.crashed;
    if (WIFSIGNALED(status))
      return fmt::format("was killed by {} {}", signal_name(WTERMSIG(status)), when);
    if (WIFEXITED(status)) return fmt::format("exited with code {} {}", WEXITSTATUS(status), when);
    return fmt::format("was lost {}", when);
  };
  if (!wire::send(s.sock.get(), r.msg, r.fd)) {
    ::kill(s.pid, SIGKILL);
    return died("before it took the request");
  }
  int timeout_ms = static_cast<int>(std::min(r.timeout_s * 1000.0, 2.0e9));
  wire::Recv got;
  try {
    got = wire::recv(s.sock.get(), out, nullptr, timeout_ms);
  } catch (const Error& e) {
    ::kill(s.pid, SIGKILL);
    return died(fmt::format("after a malformed reply ({})", e.what()).c_str());
  }
  if (got == wire::Recv::ok) return "";
  if (got == wire::Recv::timeout) {
    ::kill(s.pid, SIGKILL);
    reap(s.pid);
    s.pid = -1;
    s.sock.reset();
    std::lock_guard<std::mutex> g(m_);
    ++counters_.timed_out;
    return fmt::format("timed out after {:g}s and was killed", r.timeout_s);
  }
  return died("while running it");
}

nlohmann::json WorkerPool::call(const Request& r) {
  Slot* s = nullptr;
  {
    std::unique_lock<std::mutex> lk(m_);
    ++counters_.calls;
    reap_idle();
    for (;;) {
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
    std::string what = attempt(*s, r, reply);
    if (what.empty()) return reply;
    if (attempt_no == 0) {
      first = what;
      {
        std::lock_guard<std::mutex> g(m_);
        ++counters_.retried;
      }
      log::info("{}: the worker {}; retrying once on a fresh worker", r.what, what);
      continue;
    }
    fail(Errc::worker,
         "{}: the worker {}; retried once on a fresh worker, which {} too.{}{}", r.what, first, what,
         r.reproduce.empty() ? "" : " To reproduce in this process: ", r.reproduce);
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
