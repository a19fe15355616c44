// Child processes, started with posix_spawn (never a bare fork of a threaded
// process), and file descriptors held in RAII types.
#pragma once

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
// Throws Error(Errc::io) when it cannot be started at all.
ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s);

// A spawned child whose fd `child_fd` (in the child) is `parent_end`'s peer.
struct SpawnedChild {
  pid_t pid = -1;
  UniqueFd sock;  // the parent's end of a socketpair
};
// Spawns argv with one end of a new socketpair as fd 3 in the child.
// stdin is /dev/null; stdout and stderr are inherited.
SpawnedChild spawn_with_socket(const std::vector<std::string>& argv);

// "SIGSEGV"; "signal 42" for ones without a name.
std::string signal_name(int sig);

// Reaps `pid` (blocking). Returns the wait status.
int reap(pid_t pid);

// The folder holding the running executable.
std::string self_exe_dir();

}  // namespace kiln
