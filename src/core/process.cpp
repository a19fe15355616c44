#include "core/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>
#include <thread>

#include "core/format.hpp"
#include "core/fsutil.hpp"

extern char** environ;

namespace kiln {

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGPIPE: return "SIGPIPE";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGXCPU: return "SIGXCPU";
    default: {
      const char* d = ::sigdescr_np(sig);
      return d ? fmt::format("signal {} ({})", sig, d) : fmt::format("signal {}", sig);
    }
  }
}

std::string ProcessResult::describe() const {
  if (timed_out) return fmt::format("timed out after {:g}s", timeout_s);
  if (signal) return "killed by " + signal_name(signal);
  return fmt::format("exit code {}", exit_code);
}

int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

struct FileActions {
  posix_spawn_file_actions_t fa;
  FileActions() { posix_spawn_file_actions_init(&fa); }
  ~FileActions() { posix_spawn_file_actions_destroy(&fa); }
};
struct SpawnAttr {
  posix_spawnattr_t at;
  SpawnAttr() { posix_spawnattr_init(&at); }
  ~SpawnAttr() { posix_spawnattr_destroy(&at); }
};

// Children start with default signal handling and an empty mask, whatever the
// parent (a test harness, a sanitizer) has installed.
void reset_signals(SpawnAttr& attr, short extra_flags) {
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr.at, &all);
  posix_spawnattr_setsigmask(&attr.at, &none);
  posix_spawnattr_setflags(&attr.at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | extra_flags);
}

}  // namespace

namespace {
constexpr int kMaxGroups = 1024;
std::atomic<pid_t> g_groups[kMaxGroups];
std::atomic<bool> g_stopping{false};
std::atomic<int> g_spawning{0};

// Held from before a child is started until its group is registered, so that
// stopping waits for a child it could not yet see. Refuses to start one once
// kiln is stopping.
struct SpawnGuard {
  SpawnGuard() {
    g_spawning.fetch_add(1);
    if (g_stopping.load()) {
      g_spawning.fetch_sub(1);
      fail(Errc::io, "kiln is stopping: no new process is started");
    }
  }
  ~SpawnGuard() { g_spawning.fetch_sub(1); }
  SpawnGuard(const SpawnGuard&) = delete;
  SpawnGuard& operator=(const SpawnGuard&) = delete;
};
}  // namespace

namespace {
thread_local const std::atomic<bool>* t_cancel = nullptr;
}
void set_thread_cancel_flag(const std::atomic<bool>* flag) noexcept { t_cancel = flag; }

ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s) {
  if (t_cancel && t_cancel->load()) fail(Errc::cancelled, "'{}' not started: what asked for it is going away", argv[0]);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) fail(Errc::io, "pipe: {}", errno_text(errno));
  UniqueFd rd(p[0]), wr(p[1]);
  FileActions fa;
  posix_spawn_file_actions_addopen(&fa.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa.fa, wr.get(), 1);
  posix_spawn_file_actions_adddup2(&fa.fa, wr.get(), 2);
  SpawnAttr attr;
  reset_signals(attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr.at, 0);
  pid_t pid = -1;
  auto args = c_argv(argv);
  {
    SpawnGuard guard;
    int rc = ::posix_spawnp(&pid, args[0], &fa.fa, &attr.at, args.data(), environ);
    if (rc != 0) fail(Errc::io, "cannot start '{}': {}", argv[0], errno_text(rc));
    register_child_group(pid);
  }
  wr.reset();
  struct Unregister {
    pid_t p;
    ~Unregister() { unregister_child_group(p); }
  } unregister{pid};

  ProcessResult r;
  r.timeout_s = timeout_s;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[16384];
  bool cancelled = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      break;
    }
    if (t_cancel && t_cancel->load()) {
      cancelled = true;
      break;
    }
    pollfd pf{rd.get(), POLLIN, 0};
    const int64_t wait_ms = std::min<int64_t>(left.count(), t_cancel ? 20 : (1 << 30));
    int n = ::poll(&pf, 1, static_cast<int>(wait_ms));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) continue;
    ssize_t got = ::read(rd.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    r.output.append(buf, static_cast<size_t>(got));
  }
  // The group goes too: whatever the command started must not outlive it.
  ::kill(-pid, SIGKILL);
  int status = reap(pid);
  if (cancelled) fail(Errc::cancelled, "'{}' stopped: what asked for it is going away", argv[0]);
  if (!r.timed_out) {
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    else if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  }
  return r;
}

namespace {
// The session and state of process `pid` from /proc (false when it is gone).
bool session_of(pid_t pid, pid_t* sid, char* state) {
  std::optional<std::string> stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  // "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return false;
  char st = 0;
  long ppid = 0, pgrp = 0, session = 0;
  if (std::sscanf(stat->c_str() + close + 1, " %c %ld %ld %ld", &st, &ppid, &pgrp, &session) != 4) return false;
  *sid = static_cast<pid_t>(session);
  *state = st;
  return true;
}
}  // namespace

void kill_session(pid_t sid, double wait_s) noexcept {
  if (sid <= 1) return;
  try {
    std::vector<pid_t> killed;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(name));
      pid_t s = 0;
      char st = 0;
      if (pid == ::getpid() || !session_of(pid, &s, &st) || s != sid) continue;
      ::kill(pid, SIGKILL);
      killed.push_back(pid);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    for (pid_t pid : killed) {
      pid_t s = 0;
      char st = 0;
      // Gone, a zombie (it holds no files), or its pid taken by another session.
      while (session_of(pid, &s, &st) && s == sid && st != 'Z' && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } catch (...) {
    // best effort: a folder left behind is what it costs
  }
}

SpawnedChild spawn_with_socket(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    fail(Errc::worker, "socketpair: {}", errno_text(errno));
  UniqueFd parent(sv[0]), child(sv[1]);
  FileActions fa;
  posix_spawn_file_actions_addopen(&fa.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa.fa, 2, 1);           // stdout → our stderr
  posix_spawn_file_actions_adddup2(&fa.fa, child.get(), 3);  // dup2 clears close-on-exec
  SpawnAttr attr;
  reset_signals(attr, POSIX_SPAWN_SETSID);
  pid_t pid = -1;
  auto args = c_argv(argv);
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string_view v(*e);
    bool replaced = false;
    for (const auto& x : env) replaced = replaced || v.substr(0, v.find('=') + 1) == x.substr(0, x.find('=') + 1);
    if (!replaced) vars.emplace_back(v);
  }
  vars.insert(vars.end(), env.begin(), env.end());
  auto envp = c_argv(vars);
  {
    SpawnGuard guard;
    int rc = ::posix_spawn(&pid, args[0], &fa.fa, &attr.at, args.data(), envp.data());
    if (rc != 0) fail(Errc::worker, "cannot start worker '{}': {}", argv[0], errno_text(rc));
    register_child_group(pid);
  }
  SpawnedChild c{pid, std::move(parent), UniqueFd(open_pidfd(pid))};
  return c;
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#endif
  static_cast<void>(pid);
  return -1;
}


void register_child_group(pid_t pgid) noexcept {
  for (auto& g : g_groups) {
    pid_t none = 0;
    if (g.compare_exchange_strong(none, pgid)) break;
  }
  // Checked after the insert (both sequentially consistent): either the
  // stopping thread sees this group, or this sees it stopping.
  if (g_stopping.load()) ::kill(-pgid, SIGKILL);
}

void unregister_child_group(pid_t pgid) noexcept {
  for (auto& g : g_groups) {
    pid_t want = pgid;
    if (g.compare_exchange_strong(want, 0)) return;
  }
}

void kill_child_groups() noexcept {
  // No child starts after this (a compile retried because its compiler was
  // just killed would otherwise outlive us), and one being started now is
  // registered, and so killed, before we go on.
  g_stopping.store(true);
  for (int i = 0; i < 2000 && g_spawning.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
  for (auto& g : g_groups) {
    pid_t p = g.load();
    if (p > 0) ::kill(-p, SIGKILL);
  }
}

namespace {
// True while `pid` runs: gone or a zombie counts as ended.
bool running(pid_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');
  return close_paren && close_paren[1] == ' ' && close_paren[2] != 'Z' && close_paren[2] != 'X';
}
}  // namespace

bool stopping() noexcept { return g_stopping.load(); }

void stop_child_groups(double grace_s) noexcept {
  g_stopping.store(true);
  // A child being started now is registered (and killed) before we go on.
  for (int i = 0; i < 2000 && g_spawning.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
  for (auto& g : g_groups) {
    pid_t p = g.load();
    if (p > 0) ::kill(-p, SIGTERM);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (std::chrono::steady_clock::now() < until) {
    bool any = false;
    for (auto& g : g_groups) {
      pid_t p = g.load();
      if (p > 0 && running(p)) any = true;
    }
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill_child_groups();
}

void on_stop_signals(std::function<void(int)> fn) {
  static sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([fn = std::move(fn)] {
    int sig = 0;
    while (::sigwait(&set, &sig) != 0) {
    }
    fn(sig);
  }).detach();
}

void install_interrupt_cleanup() {
  on_stop_signals([](int sig) {
    stop_child_groups(0.5);
    remove_registered_temp_dirs();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    ::signal(sig, SIG_DFL);
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    ::kill(::getpid(), sig);
    ::_exit(128 + sig);
  });
}

std::string self_exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return p.parent_path().string();
}

}  // namespace kiln
