#include "core/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "core/format.hpp"

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

ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s) {
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
  int rc = ::posix_spawnp(&pid, args[0], &fa.fa, &attr.at, args.data(), environ);
  if (rc != 0) fail(Errc::io, "cannot start '{}': {}", argv[0], errno_text(rc));
  wr.reset();

  ProcessResult r;
  r.timeout_s = timeout_s;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[16384];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd pf{rd.get(), POLLIN, 0};
    int n = ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) continue;
    ssize_t got = ::read(rd.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    r.output.append(buf, static_cast<size_t>(got));
  }
  if (r.timed_out) ::kill(-pid, SIGKILL);
  int status = reap(pid);
  if (!r.timed_out) {
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    else if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  }
  return r;
}

SpawnedChild spawn_with_socket(const std::vector<std::string>& argv) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    fail(Errc::worker, "socketpair: {}", errno_text(errno));
  UniqueFd parent(sv[0]), child(sv[1]);
  FileActions fa;
  posix_spawn_file_actions_addopen(&fa.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa.fa, child.get(), 3);  // dup2 clears close-on-exec
  SpawnAttr attr;
  reset_signals(attr, 0);
  pid_t pid = -1;
  auto args = c_argv(argv);
  int rc = ::posix_spawn(&pid, args[0], &fa.fa, &attr.at, args.data(), environ);
  if (rc != 0) fail(Errc::worker, "cannot start worker '{}': {}", argv[0], errno_text(rc));
  return SpawnedChild{pid, std::move(parent)};
}

std::string self_exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return p.parent_path().string();
}

}  // namespace kiln
