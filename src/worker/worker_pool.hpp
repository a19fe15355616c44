// WorkerPool: N kiln-worker processes, started on first use or ahead of time
// (warm). A worker that dies (signal, exit) or misses its deadline is killed
// at once with SIGKILL and replaced; the request is retried once on a fresh
// worker, then fails with an error naming what was being done, what happened,
// and how to reproduce it in-process. Workers exit when the pool goes away,
// and by themselves when its process dies (they watch their socket).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/process.hpp"

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
  void wakeup() { warm(); }

  struct Request {
    nlohmann::json msg;
    int fd = -1;              // passed along with the message
    double timeout_s = 60;    // from send to reply
    std::string what;         // "compiling kernel 'matmul' (config BM=32)", for errors
    std::string reproduce;    // "KILN_COMPILE_THREADS=1 KILN_COMPILE_MODE=threads", for errors
  };
  // Runs a request on an idle worker (waiting for one). Returns the reply,
  // which may itself report a failed request (ok = false). Throws
  // Error(Errc::worker) when the worker crashed or hung twice.
  nlohmann::json call(const Request& r);

  std::vector<pid_t> pids();  // live workers (dead idle ones are reaped first), for tests and tools
  int size() const { return static_cast<int>(slots_.size()); }
  const std::filesystem::path& exe() const { return exe_; }

  struct Counters {
    size_t spawned = 0, calls = 0, crashed = 0, timed_out = 0, retried = 0;
  };
  Counters counters() const;

  // Finds kiln-worker: `configured` if set, else beside the running
  // executable, else in the build tree kiln came from. Throws if none exists.
  static std::filesystem::path find_exe(const std::filesystem::path& configured);

 private:
  struct Slot {
    std::atomic<pid_t> pid{-1};  // written by the thread holding the slot, read by pids()
    UniqueFd sock;
    bool busy = false;
  };
  void spawn(Slot& s);
  void stop(Slot& s, bool polite);  // ends and reaps the worker
  bool alive(Slot& s);              // reaps it if it has died
  void reap_idle();                 // alive() on every idle slot; holds m_
  // One attempt: "" on success (reply in `out`), else what went wrong.
  std::string attempt(Slot& s, const Request& r, nlohmann::json& out);

  std::filesystem::path exe_;
  mutable std::mutex m_;
  std::condition_variable free_;
  std::vector<Slot> slots_;
  Counters counters_;
};

}  // namespace kiln
