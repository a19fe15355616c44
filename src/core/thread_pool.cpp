#include "core/thread_pool.hpp"

namespace kiln {

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
    int64_t e = b + j.chunk < j.n ? b + j.chunk : j.n;
    j.fn(j.ctx, b, e);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t chunk, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  if (workers_.empty() || n <= chunk) {
    fn(ctx, 0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.chunk = chunk;
  {
    std::lock_guard<std::mutex> g(m_);
    job_ = &job;
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_chunks(job);
  std::unique_lock<std::mutex> lk(m_);
  done_.wait(lk, [this] { return busy_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    Job* j = nullptr;
    {
      std::unique_lock<std::mutex> lk(m_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      j = job_;
    }
    run_chunks(*j);
    std::lock_guard<std::mutex> g(m_);
    if (--busy_ == 0) done_.notify_one();
  }
}

}  // namespace kiln
