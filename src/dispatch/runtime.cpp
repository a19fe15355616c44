#include "compile/code_cache.hpp"
#include <condition_variable>
#include <deque>
#include <thread>
#include "compile/compile_pool.hpp"
#include "kiln/runtime.hpp"

#include "compile/worker_compiler.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"
#include <cmath>
#include "kiln/args.hpp"
#include "kiln/artifact.hpp"
#include "core/format.hpp"
#include "kiln/ext/tuner.hpp"
#include "tune/benchmarker.hpp"
#include "compile/remote_cache.hpp"
#include "tune/record_io.hpp"
#include "worker/worker_pool.hpp"

namespace kiln {

// A queue of background jobs and its thread (started on first use): the
// tunings', and the work ahead of the calls'.
struct Runtime::Background {
  explicit Background(const char* k) : kind(k) {}
  const char* kind;  // "tuning": for messages
  struct Job {
    std::string what;
    std::function<void(const std::atomic<bool>&)> fn;
  };
  std::mutex m;
  std::condition_variable cv, idle;
  std::deque<Job> queue;
  size_t running = 0;
  uint64_t finished = 0;
  std::atomic<bool> stop{false};
  std::thread thread;

  // Tunings not started are dropped; the running one is told to stop.
  void stop_now() {
    {
      std::lock_guard<std::mutex> g(m);
      stop = true;
      if (!queue.empty())
        log::info("{} background job(s) ({}) not started are dropped: the runtime is going away", queue.size(), kind);
      queue.clear();
    }
    cv.notify_all();
  }
  ~Background() {
    stop_now();
    if (thread.joinable()) thread.join();
  }

  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return stop.load() || !queue.empty(); });
        if (stop) return;
        job = std::move(queue.front());
        queue.pop_front();
        ++running;
      }
      try {
        job.fn(stop);
      } catch (const Error& e) {
        if (e.code() != Errc::cancelled) log::warn("background {} ({}) failed: {}", kind, job.what, e.what());
      } catch (const std::exception& e) {
        log::warn("background {} ({}) failed: {}", kind, job.what, e.what());
      }
      {
        std::lock_guard<std::mutex> g(m);
        --running;
        ++finished;
      }
      idle.notify_all();
    }
  }
};

struct Runtime::BackendState {
  std::shared_ptr<Backend> backend;
  std::unique_ptr<CompilePool> pool;
  std::unique_ptr<Benchmarker> bench;
  std::mutex loaded_m;
  std::map<std::string, std::weak_ptr<LoadedKernel>> loaded;
};

Runtime::Runtime(Options opts) : opts_(std::move(opts)) {
  if (opts_.remote_binaries && opts_.remote_cache.empty())
    fail(Errc::usage, "KILN_REMOTE_BINARIES=1 needs KILN_REMOTE_CACHE (a redis:// address)");
  // A malformed address is the user's mistake: said now, not on the first miss.
  if (!opts_.remote_cache.empty())
    remote_ = std::make_shared<RemoteCache>(RemoteCache::Settings{opts_.remote_cache, opts_.remote_timeout_s});
  // A packed artifact: all of it, or (refused) nothing of it.
  if (!opts_.artifact.empty()) log::info("{}", load_artifact(*this, opts_.artifact, opts_.artifact_sources_only));
}
// A runtime going away abandons what nothing will wait for: the background
// tunings (dropped, or stopped at their next step), the compiles queued or
// running (a compiler's process killed), the workers' requests (their
// workers killed). So a process ends promptly after its last result, not
// when the background work it started would have finished.
Runtime::~Runtime() {
  // The work ahead first: dropped, and the running job (which may make a compile
  // pool) joined before the pools are abandoned, so none is made after.
  {
    std::lock_guard<std::mutex> g(m_);
    if (ahead_) ahead_->stop_now();
  }
  ahead_.reset();
  {
    std::lock_guard<std::mutex> g(m_);
    if (background_) background_->stop_now();
    for (auto& [name, st] : backends_)
      if (st->pool) st->pool->abandon();
    if (workers_) workers_->abandon();
  }
  background_.reset();  // then joined: a running tuning uses everything below
}

void Runtime::enqueue(std::unique_ptr<Background>& slot, const char* kind, std::string what,
                      std::function<void(const std::atomic<bool>&)> job) {
  Background* b;
  {
    std::lock_guard<std::mutex> g(m_);
    if (!slot) slot = std::make_unique<Background>(kind);
    b = slot.get();
  }
  {
    std::lock_guard<std::mutex> g(b->m);
    if (b->stop) return;
    b->queue.push_back({std::move(what), std::move(job)});
    if (!b->thread.joinable()) b->thread = std::thread([b] { b->loop(); });
  }
  b->cv.notify_all();
}

void Runtime::run_in_background(std::string what, std::function<void(const std::atomic<bool>&)> job) {
  enqueue(background_, "tuning", std::move(what), std::move(job));
}

void Runtime::run_ahead(std::string what, std::function<void(const std::atomic<bool>&)> job) {
  enqueue(ahead_, "work ahead of the calls", std::move(what), std::move(job));
}

bool Runtime::wait_tuned(double timeout_s) {
  Background* b;
  {
    std::lock_guard<std::mutex> g(m_);
    b = background_.get();
  }
  if (!b) return true;
  std::unique_lock<std::mutex> lk(b->m);
  auto done = [&] { return b->queue.empty() && b->running == 0; };
  if (timeout_s < 0) {
    b->idle.wait(lk, done);
    return true;
  }
  return b->idle.wait_for(lk, std::chrono::duration<double>(timeout_s), done);
}

size_t Runtime::tunings_pending() const {
  std::lock_guard<std::mutex> g(m_);
  if (!background_) return 0;
  std::lock_guard<std::mutex> lk(background_->m);
  return background_->queue.size() + background_->running;
}

Runtime::BackendState& Runtime::state(const std::string& name) {
  std::lock_guard<std::mutex> g(m_);
  auto it = backends_.find(name);
  if (it != backends_.end()) return *it->second;
  auto st = std::make_unique<BackendState>();
  st->backend = make_backend(name, opts_);
  return *backends_.emplace(name, std::move(st)).first->second;
}

Backend& Runtime::backend(const std::string& name) { return *state(name).backend; }

Device& Runtime::device(const std::string& name) { return backend(name).device(); }

// A cache folder that cannot be written (a read-only mount, no permission,
// a full disk) is not an error: kiln compiles and tunes without a cache,
// and says so once. Called with m_ held.
void Runtime::without_cache(const std::string& why) {
  if (!cache_off_.empty()) return;
  cache_off_ = why;
  log::warn("{}: compiling and tuning without keeping anything for the next process (what the folder holds "
            "already, a packed artifact and a remote cache are still used); set KILN_CACHE_DIR to a folder you can "
            "write, or KILN_NO_CACHE=1 to say so",
            why);
}

std::shared_ptr<CodeCache> Runtime::code_cache() {
  std::lock_guard<std::mutex> g(m_);
  if (!code_cache_ && !opts_.no_cache) {
    if (cache_off_.empty()) {
      try {
        code_cache_ = std::make_shared<CodeCache>(opts_.resolved_cache_dir());
        return code_cache_;
      } catch (const FolderNotWritable& e) {
        without_cache(e.what());
      }
    }
    code_cache_ = CodeCache::open_read_only(opts_.resolved_cache_dir());
  }
  return code_cache_;
}

CompileMode Runtime::compile_mode(const std::string& name) {
  if (opts_.compile_mode != CompileMode::automatic) return opts_.compile_mode;
  // A system compiler is a process of its own already: threads. NVRTC runs
  // inside its caller: in kiln-worker processes, which contain its crashes
  // and hangs and, measured on 16 cores, compiled the cuda matmul space in
  // 4.4 s against 6.1 to 9.0 s on threads (docs/workers.md).
  return backend(name).compiles_out_of_process() ? CompileMode::threads : CompileMode::subprocess;
}

CompilePool& Runtime::compile_pool(const std::string& name) {
  BackendState& st = state(name);
  std::shared_ptr<CodeCache> cache = code_cache();
  CompileMode mode = compile_mode(name);
  std::shared_ptr<WorkerPool> workers = mode == CompileMode::subprocess ? worker_pool() : nullptr;
  std::lock_guard<std::mutex> g(m_);
  if (!st.pool) {
    std::shared_ptr<Compiler> c;
    if (workers) c = std::make_shared<WorkerCompiler>(workers, opts_);
    else if (st.backend->compiles_out_of_process()) c = std::make_shared<DirectCompiler>(st.backend);
    else  // in-process compilers on threads: a worker for compiles past their deadline, made when one is
      c = std::make_shared<ThreadedCompiler>(
          st.backend, [this] { return std::make_shared<WorkerCompiler>(worker_pool(), opts_); }, opts_.compile_timeout_s);
    if (cache) c = std::make_shared<CachingCompiler>(c, cache, opts_.remote_binaries ? remote_ : nullptr);
    st.pool = std::make_unique<CompilePool>(st.backend, c, opts_.resolved_compile_threads());
  }
  return *st.pool;
}

std::shared_ptr<WorkerPool> Runtime::worker_pool() {
  std::lock_guard<std::mutex> g(m_);
  if (!workers_) {
    int n = opts_.workers > 0 ? opts_.workers : opts_.resolved_compile_threads();
    workers_ = std::make_shared<WorkerPool>(WorkerPool::find_exe(opts_.worker_path), n);
  }
  return workers_;
}

std::shared_ptr<TuningCache> Runtime::tuning_cache() {
  std::lock_guard<std::mutex> g(m_);
  if (!tuning_cache_ && !opts_.no_cache) {
    if (cache_off_.empty()) {
      try {
        tuning_cache_ = std::make_shared<TuningCache>(opts_.resolved_cache_dir());
      } catch (const FolderNotWritable& e) {
        without_cache(e.what());
      }
    }
    if (!tuning_cache_) tuning_cache_ = TuningCache::open_read_only(opts_.resolved_cache_dir());
    if (remote_)
      tuning_cache_->attach_remote({remote_, opts_.lease_ttl_s, opts_.lease_wait_s, opts_.bundle});
  }
  return tuning_cache_;
}

Benchmarker& Runtime::benchmarker(const std::string& backend) {
  BackendState& st = state(backend);
  std::shared_ptr<WorkerPool> workers = opts_.tune_in_process ? nullptr : worker_pool();
  Device* dev = opts_.tune_in_process ? &st.backend->device() : nullptr;
  std::lock_guard<std::mutex> g(m_);
  if (!st.bench) st.bench = std::make_unique<Benchmarker>(workers, dev, opts_, backend == "cuda");
  return *st.bench;
}

// Serving mode: cached choices only. A key with no record of its own runs
// the first of its safe choices (safe_choices: the nearest tuned key's
// choice that can run it, the spec's default, the cheap rule); the miss is
// counted, logged once per key and kept for `kiln report --misses`.
TuneOutcome Runtime::serve(const CallView& call, bool libraries) {
  const KernelSpec& spec = call.spec;
  Backend& be = backend(spec.backend);
  std::shared_ptr<TuningCache> cache = tuning_cache();
  const TuningKey& key = call.key;
  TuneOutcome out;
  out.record.kernel = spec.name;
  out.record.key = key;
  if (cache)
    if (auto rec = cache->get(key)) {
      if (auto c = Tuner::choose(*rec, spec, call.slot_data(), call.limits, Tuner::plans_per_shape_of(be))) {
        out.choice = c;
        out.from_cache = true;
        out.record = std::move(*rec);
        return out;
      }
    }
  std::vector<SafeChoice> safe = safe_choices(call, be, cache.get(), libraries);
  if (!safe.empty()) out.choice = safe.front().config;
  note_miss(spec, key, out.choice ? out.choice->str() : std::string("nothing"),
            safe.empty() ? std::string("no config can run it") : safe.front().how);
  if (!out.choice) out.record.verdict = "serving mode: no tuned choice and no config can run this call";
  return out;
}

void Runtime::note_miss(const KernelSpec& spec, const TuningKey& key, const std::string& ran, const std::string& how) {
  serving_misses_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<TuningCache> cache = tuning_cache();
  std::lock_guard<std::mutex> g(m_);
  if (missed_.insert(key.base_hex() + "/" + key.values_hex()).second) {
    log::warn("serving: kernel '{}' has no tuned choice at {}; running {} ({}); `kiln report {} --misses` lists "
              "such keys",
              spec.name, key.values_text(), ran, how, spec.path_text());
    if (cache) cache->note_serving_miss(key);
  }
}

Runtime::Stats Runtime::stats() {
  Stats st;
  {
    std::lock_guard<std::mutex> g(m_);
    for (const auto& [name, b] : backends_)
      if (b->pool) {
        CompilePool::Counters c = b->pool->counters();
        st.compiled += c.compiled;
        st.compile_cache_hits += c.cache_hits;
      }
  }
  if (auto tc = tuning_cache()) {
    TuningCache::Stats t = tc->stats();
    st.records_local = t.local_hits;
    st.records_artifact = t.artifact_hits;
    st.records_remote = t.remote_hits;
  }
  st.configs_timed = configs_timed_.load(std::memory_order_relaxed);
  st.serving_misses = serving_misses();
  {
    std::lock_guard<std::mutex> g(m_);
    if (background_) {
      std::lock_guard<std::mutex> lk(background_->m);
      st.background_tunings = background_->finished;
    }
  }
  return st;
}

uint64_t Runtime::serving_misses() const { return serving_misses_.load(std::memory_order_relaxed); }

TuneOutcome Runtime::tune(const KernelSpec& spec, void* const* params, const TuneOptions& o) {
  return tune(CallView(spec, backend(spec.backend), params), o);
}

TuneOutcome Runtime::tune(const CallView& call, const TuneOptions& o) {
  const KernelSpec& spec = call.spec;
  if (opts_.serving) return serve(call, o.libraries);
  BackendState& st = state(spec.backend);
  CompilePool& pool = compile_pool(spec.backend);
  std::shared_ptr<TuningCache> cache = tuning_cache();
  benchmarker(spec.backend);
  Tuner t({st.backend.get(), &pool, st.bench.get(), cache.get(), [this](const Binary& b) { return load(b); }, opts_});
  TuneOutcome out = t.tune(call, o);
  configs_timed_.fetch_add(out.timed_now + out.retimed_now, std::memory_order_relaxed);
  if (cache && out.choice) cache->note_used(out.record);
  return out;
}

std::shared_ptr<RemoteCache> Runtime::remote_cache() { return remote_; }

std::shared_ptr<LoadedKernel> Runtime::load(const Binary& bin) {
  BackendState& st = state(bin.backend);
  std::lock_guard<std::mutex> g(st.loaded_m);
  auto it = st.loaded.find(bin.key);
  if (it != st.loaded.end())
    if (auto k = it->second.lock()) return k;
  std::shared_ptr<LoadedKernel> k = st.backend->load(bin);
  st.loaded[bin.key] = k;
  return k;
}

}  // namespace kiln
