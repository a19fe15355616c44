// WorkerPool: N kiln-worker processes, started on first use or ahead of time
// (warm), each in a process group of its own. A worker that dies (signal,
// exit) or misses its deadline is killed at once with SIGKILL, with all it
// started, and replaced. What happens to the request depends on whose fault
// it was (see WorkerFault):
//   - a fault of the request (a kernel's own crash or time-out while
//     benchmarking, when Request::request_faults is set; its code calling
//     exit, or closing the worker's connection, counts as a crash) is deterministic:
//     it is not retried unless the request asks, and the error says so;
//   - a fault of the machine (a worker killed from outside, a broken socket,
//     a worker that died before it took the request) is retried once on a
//     fresh worker.
// The error names what was being done, what happened, and how to reproduce
// it in-process. Workers exit when the pool goes away, and by themselves
// when its process dies (they watch their socket).
//
// Thread-safe: call, warm, quiesce and pids may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/error.hpp"

namespace kiln {

class WorkerPool {
 public:
  WorkerPool(std::filesystem::path exe, int size);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts every worker now and waits until each answers a ping.
  void warm();
  // Stops idle workers; the next request (or wakeup) starts them again.
  void quiesce();
  // Nothing waits for this pool's work any more (its runtime is going away):
  // busy workers are killed, and a request in flight or made later throws
  // Error(Errc::cancelled) instead of being retried.
  void abandon();
  void wakeup() { warm(); }

  struct Request {
    nlohmann::json msg;
    int fd = -1;              // passed along with the message
    double timeout_s = 60;    // from send to reply
    std::string what;         // "compiling kernel 'matmul' (config BM=32)", for errors
    std::string reproduce;    // "KILN_COMPILE_THREADS=1 KILN_COMPILE_MODE=threads", for errors
    // A crash or time-out while the worker runs this request is the
    // request's own fault (a kernel being benchmarked)...
    bool request_faults = false;
    // ...and is retried once anyway (a compiler that crashed, as the design
    // asks), or not (a kernel: deterministic, a retry doubles its cost).
    bool retry_request_faults = true;
  };
  // Runs a request on an idle worker (waiting for one). Returns the reply,
  // which may itself report a failed request (ok = false). Throws
  // WorkerError when the worker failed it (see above).
  nlohmann::json call(const Request& r);

  std::vector<pid_t> pids();  // live workers (dead idle ones are reaped first), for tests and tools
  int size() const { return static_cast<int>(slots_.size()); }
  bool abandoned() const { return abandoned_.load(); }
  const std::filesystem::path& exe() const { return exe_; }

  struct Counters {
    size_t spawned = 0, calls = 0, crashed = 0, timed_out = 0, lost = 0, retried = 0;
  };
  Counters counters() const;

  // Finds kiln-worker: `configured` if set, else beside the running
  // executable, else in the build tree kiln came from. Throws if none exists.
  static std::filesystem::path find_exe(const std::filesystem::path& configured);

 private:
  struct Slot {
    std::atomic<pid_t> pid{-1};  // written by the thread holding the slot, read by pids()
    pid_t signal_pid = -1;       // what abandon() may signal: set after a spawn, cleared before a reap (pid_m_)
    UniqueFd sock;
    UniqueFd pidfd;
    // The worker's TMPDIR, made by the pool and removed once the worker is
    // reaped: the compile folders of a worker killed mid-compile go with it.
    std::unique_ptr<TempDir> tmp;
    bool busy = false;
    bool ready = false;  // its first frame (it started) has been read
  };
  void spawn(Slot& s);
  void stop(Slot& s, bool polite);  // ends and reaps the worker
  bool alive(Slot& s);              // reaps it if it has died
  void reap_idle();                 // alive() on every idle slot; holds m_
  // One attempt: true on success (reply in `out`), else what went wrong in
  // `fault` and `what`.
  bool attempt(Slot& s, const Request& r, nlohmann::json& out, WorkerFault& fault, std::string& what);
  void kill_and_reap(Slot& s, int* status);

  std::filesystem::path exe_;
  mutable std::mutex m_;
  std::mutex pid_m_;  // guards Slot::signal_pid; taken after m_ where both are
  std::atomic<bool> abandoned_{false};
  std::condition_variable free_;
  std::vector<Slot> slots_;
  Counters counters_;
};

}  // namespace kiln
