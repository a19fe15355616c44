#include "core/thread_pool.hpp"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_PAUSE() _mm_pause()
#else
#define KILN_PAUSE() std::this_thread::yield()
#endif

namespace kiln {

using Clock = std::chrono::steady_clock;

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(Job& j) {
  for (;;) {
    int64_t b = j.next.fetch_add(j.chunk, std::memory_order_relaxed);
    if (b >= j.n) return;
    int64_t e = std::min(b + j.chunk, j.n);
    j.fn(j.ctx, b, e);
    if (j.done.fetch_add(e - b, std::memory_order_acq_rel) + (e - b) == j.n) j.done.notify_all();
  }
}

ThreadPool::Job* ThreadPool::take_job() {
  for (Job* j : jobs_)
    if (j->next.load(std::memory_order_relaxed) < j->n) {
      j->users.fetch_add(1, std::memory_order_relaxed);
      return j;
    }
  return nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t chunk, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  if (workers_.empty() || n <= chunk) {
    fn(ctx, 0, n);
    return;
  }
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.chunk = chunk;
  bool notify;
  {
    std::lock_guard<std::mutex> g(m_);
    jobs_.push_back(&job);
    generation_.fetch_add(1, std::memory_order_release);
    notify = sleepers_ > 0;
  }
  if (notify) wake_.notify_all();
  run_chunks(job);
  // Others may still be finishing chunks of this job: spin a little, then sleep.
  auto until = Clock::now() + kSpin;
  for (int64_t d; (d = job.done.load(std::memory_order_acquire)) != n;) {
    if (Clock::now() < until) KILN_PAUSE();
    else job.done.wait(d, std::memory_order_acquire);
  }
  {
    std::lock_guard<std::mutex> g(m_);
    jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job));
  }
  // A pool thread may have just taken the job and found it finished.
  while (job.users.load(std::memory_order_acquire) != 0) KILN_PAUSE();
}

void ThreadPool::worker_loop() {
  uint64_t seen = generation_.load(std::memory_order_acquire);
  for (;;) {
    Job* j;
    {
      std::lock_guard<std::mutex> g(m_);
      if (stop_) return;
      j = take_job();
    }
    if (j) {
      run_chunks(*j);
      j->users.fetch_sub(1, std::memory_order_release);
      continue;
    }
    // Nothing to do: spin briefly for the next job, then sleep.
    auto until = Clock::now() + kSpin;
    bool fresh = false;
    while (Clock::now() < until) {
      uint64_t g = generation_.load(std::memory_order_acquire);
      if (g != seen) {
        seen = g;
        fresh = true;
        break;
      }
      KILN_PAUSE();
    }
    if (fresh) continue;
    std::unique_lock<std::mutex> lk(m_);
    if (stop_) return;
    bool work = false;
    for (Job* x : jobs_)
      if (x->next.load(std::memory_order_relaxed) < x->n) work = true;
    if (work) continue;
    ++sleepers_;
    wake_.wait(lk, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
    --sleepers_;
    seen = generation_.load(std::memory_order_acquire);
  }
}

}  // namespace kiln
