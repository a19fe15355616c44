// The threads that run a cpu grid's program instances.
//
// Grids from different calling threads run at once: each call publishes its
// job, pool threads take chunks of any job that has some left, and the
// calling thread works on its own job until it is done (so a call always
// makes progress, whatever else the pool is doing). An idle pool thread
// spins briefly (kSpin) before it sleeps, so back-to-back launches do not
// pay a wake-up each, and an idle process burns nothing after that.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
  static constexpr std::chrono::microseconds kSpin{50};

  // `threads` counts a caller: threads - 1 pool threads are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn over [0, n) in chunks of `chunk`; returns when every chunk is
  // done. Safe to call from several threads at once.
  void parallel_for(int64_t n, int64_t chunk, RangeFn fn, void* ctx);

 private:
  struct Job {
    RangeFn fn;
    void* ctx;
    int64_t n, chunk;
    std::atomic<int64_t> next{0};   // the first item no one has claimed
    std::atomic<int64_t> done{0};   // items finished
    std::atomic<int> users{0};      // pool threads working on it
  };
  static void run_chunks(Job& j);
  Job* take_job();  // a job with work left (its users counted), or nullptr; holds m_
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable wake_;
  std::vector<Job*> jobs_;           // jobs in flight; guarded by m_
  std::atomic<uint64_t> generation_{0};  // bumped when a job is published
  int sleepers_ = 0;                 // guarded by m_
  bool stop_ = false;                // guarded by m_
};

}  // namespace kiln
