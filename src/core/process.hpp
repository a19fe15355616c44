// Child processes, started with posix_spawn (never a bare fork of a threaded
// process), and file descriptors held in RAII types.
#pragma once

#include <atomic>
#include <functional>
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace kiln {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

struct ProcessResult {
  int exit_code = -1;   // valid when signal == 0 and !timed_out
  int signal = 0;       // the signal that ended it, if any
  bool timed_out = false;
  std::string output;   // stdout and stderr together
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
  std::string describe() const;  // "exit code 1", "killed by SIGSEGV", "timed out after 3s"
  double timeout_s = 0;
};

// Runs argv (argv[0] is looked up in PATH), capturing its output. The child
// runs in its own process group; at the time-out the whole group is killed.
// Throws Error(Errc::io) when it cannot be started at all, and
// Error(Errc::cancelled) when this thread's cancel flag (below) is set
// while it runs (the group is killed at once, within 20 ms).
ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s);
// The flag that cancels run_process calls made on this thread (nullptr: none).
// A compile pool's threads set their pool's, so that a runtime going away
// stops the compilers it no longer needs instead of waiting for them.
void set_thread_cancel_flag(const std::atomic<bool>* flag) noexcept;

// A spawned child whose fd `child_fd` (in the child) is `parent_end`'s peer.
struct SpawnedChild {
  pid_t pid = -1;
  UniqueFd sock;   // the parent's end of a socketpair
  UniqueFd pidfd;  // readable once the child has ended (-1 where the kernel has no pidfd)
};
// Spawns argv with one end of a new socketpair as fd 3 in the child, in a
// session (and so a process group) of its own: whatever it forks can be
// killed with its group, and what it starts in groups of their own (a
// compiler, by run_process) with its session (kill_session). stdin is /dev/null; stdout goes to the parent's stderr, so nothing the
// child prints can mix into the parent's standard output; stderr is inherited.
// `env` entries (NAME=VALUE) replace or join the parent's environment.
SpawnedChild spawn_with_socket(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// SIGKILL to every process of session `sid` (a child spawned by
// spawn_with_socket, and all it started, whatever process group), then
// waits up to `wait_s` for them to be gone. For a child killed from outside:
// the compilers it was running outlive it otherwise, writing into its folders.
void kill_session(pid_t sid, double wait_s = 2.0) noexcept;

// A descriptor that becomes readable when `pid` ends; -1 when unsupported.
int open_pidfd(pid_t pid);

// Process groups of children kiln is running (compilers, workers). The kiln
// tool kills them all when it is interrupted; registering is lock-free and
// safe from any thread.
void register_child_group(pid_t pgid) noexcept;
void unregister_child_group(pid_t pgid) noexcept;
void kill_child_groups() noexcept;  // SIGKILL to each; no child is started after it (stopping() is true)
// SIGTERM to every registered group, so that a worker can end what it started
// and remove its folders; SIGKILL to whatever still runs after `grace_s`.
void stop_child_groups(double grace_s) noexcept;

// For a program's main(), before it starts any thread: on SIGINT, SIGTERM or
// SIGHUP, stop every registered child group (stop_child_groups), remove registered temporary
// folders (core/fsutil.hpp), then end by that signal. A thread waits for the
// signals, so the clean-up runs outside a signal handler.
void install_interrupt_cleanup();
// Blocks SIGINT, SIGTERM and SIGHUP in this thread (call it before starting
// others, so they inherit the mask) and runs `fn(signal)` on a thread of its
// own when the first of them arrives, outside any signal handler.
void on_stop_signals(std::function<void(int)> fn);
// True once the clean-up above has begun: a main() about to return should
// wait instead, so that the process ends by the signal, not by a result
// computed from compilers that were being killed.
bool stopping() noexcept;

// "SIGSEGV"; "signal 42" for ones without a name.
std::string signal_name(int sig);

// Reaps `pid` (blocking). Returns the wait status.
int reap(pid_t pid);

// The folder holding the running executable.
std::string self_exe_dir();

}  // namespace kiln
