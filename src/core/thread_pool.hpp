// The threads that run a cpu grid's program instances. The calling thread
// takes part; one grid runs at a time (callers queue on a mutex).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);

  // `threads` counts the caller: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn over [0, n) in chunks of `chunk`; returns when every chunk is done.
  void parallel_for(int64_t n, int64_t chunk, RangeFn fn, void* ctx);

 private:
  struct Job {
    RangeFn fn;
    void* ctx;
    int64_t n, chunk;
    std::atomic<int64_t> next{0};
  };
  static void run_chunks(Job& j);
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time
  std::mutex m_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  Job* job_ = nullptr;
};

}  // namespace kiln
