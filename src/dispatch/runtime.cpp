#include "kiln/runtime.hpp"

#include "compile/worker_compiler.hpp"
#include "core/format.hpp"
#include "tune/benchmarker.hpp"
#include "tune/remote_cache.hpp"
#include "worker/worker_pool.hpp"

namespace kiln {

struct Runtime::BackendState {
  std::shared_ptr<Backend> backend;
  std::unique_ptr<CompilePool> pool;
  std::unique_ptr<Benchmarker> bench;
  std::mutex loaded_m;
  std::map<std::string, std::weak_ptr<LoadedKernel>> loaded;
};

Runtime::Runtime(Options opts) : opts_(std::move(opts)) {
  // A malformed address is the user's mistake: said now, not on the first miss.
  if (!opts_.remote_cache.empty())
    remote_ = std::make_shared<RemoteCache>(RemoteCache::Settings{opts_.remote_cache, opts_.remote_timeout_s});
}
Runtime::~Runtime() = default;

Runtime::BackendState& Runtime::state(const std::string& name) {
  std::lock_guard<std::mutex> g(m_);
  auto it = backends_.find(name);
  if (it != backends_.end()) return *it->second;
  auto st = std::make_unique<BackendState>();
  st->backend = make_backend(name, opts_);
  return *backends_.emplace(name, std::move(st)).first->second;
}

Backend& Runtime::backend(const std::string& name) { return *state(name).backend; }

std::shared_ptr<CodeCache> Runtime::code_cache() {
  std::lock_guard<std::mutex> g(m_);
  if (!code_cache_ && !opts_.no_cache) code_cache_ = std::make_shared<CodeCache>(opts_.resolved_cache_dir());
  return code_cache_;
}

CompileMode Runtime::compile_mode(const std::string& name) {
  if (opts_.compile_mode != CompileMode::automatic) return opts_.compile_mode;
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
    else c = std::make_shared<DirectCompiler>(st.backend);
    if (cache) c = std::make_shared<CachingCompiler>(c, cache);
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
    tuning_cache_ = std::make_shared<TuningCache>(opts_.resolved_cache_dir());
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

TuneOutcome Runtime::tune(const KernelSpec& spec, void* const* params, const TuneOptions& o) {
  BackendState& st = state(spec.backend);
  CompilePool& pool = compile_pool(spec.backend);
  std::shared_ptr<TuningCache> cache = tuning_cache();
  benchmarker(spec.backend);
  Tuner t({st.backend.get(), &pool, st.bench.get(), cache.get(), [this](const Binary& b) { return load(b); }, opts_});
  TuneOutcome out = t.tune(spec, params, o);
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
