#include "compile/code_cache.hpp"
#include "compile/compile_pool.hpp"
#include "kiln/runtime.hpp"

#include "compile/worker_compiler.hpp"
#include "core/log.hpp"
#include <cmath>
#include "kiln/args.hpp"
#include "kiln/artifact.hpp"
#include "core/format.hpp"
#include "tune/benchmarker.hpp"
#include "compile/remote_cache.hpp"
#include "tune/record_io.hpp"
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
  if (opts_.remote_binaries && opts_.remote_cache.empty())
    fail(Errc::usage, "KILN_REMOTE_BINARIES=1 needs KILN_REMOTE_CACHE (a redis:// address)");
  // A malformed address is the user's mistake: said now, not on the first miss.
  if (!opts_.remote_cache.empty())
    remote_ = std::make_shared<RemoteCache>(RemoteCache::Settings{opts_.remote_cache, opts_.remote_timeout_s});
  // A packed artifact: all of it, or (refused) nothing of it.
  if (!opts_.artifact.empty()) log::info("{}", load_artifact(*this, opts_.artifact, opts_.artifact_sources_only));
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

// Serving mode: cached choices only. A key with no record of its own runs
// the choice of the nearest tuned key (log2 distance over the key values)
// that can run it, else the spec's default, else the first config that can;
// the miss is counted, logged once per key and kept for `kiln report --misses`.
TuneOutcome Runtime::serve(const KernelSpec& spec, void* const* params) {
  Backend& be = backend(spec.backend);
  std::shared_ptr<TuningCache> cache = tuning_cache();
  TuningKey key = make_tuning_key(spec, be, params);
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  const LaunchLimits limits = be.limits();
  TuneOutcome out;
  out.record.kernel = spec.name;
  out.record.key = key;
  if (cache)
    if (auto rec = cache->get(key))
      if (auto c = Tuner::choose(*rec, spec, slots.data(), limits)) {
        out.choice = c;
        out.from_cache = true;
        out.record = std::move(*rec);
        return out;
      }
  std::string how;
  if (cache) {
    std::vector<std::pair<double, TuningRecord>> near;
    for (auto& r : cache->all(key)) {
      if (!r.best || r.key.values.size() != key.values.size()) continue;
      double d = log2_distance(key.values, r.key.values);
      near.emplace_back(d, std::move(r));
    }
    std::stable_sort(near.begin(), near.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [d, r] : near)
      if (auto c = Tuner::choose(r, spec, slots.data(), limits)) {
        out.choice = c;
        how = fmt::format("the choice of the nearest tuned key {}", r.key.values_text());
        break;
      }
  }
  if (!out.choice && spec.tuning.default_config &&
      Tuner::why_not(spec, *spec.tuning.default_config, slots.data(), limits).empty()) {
    out.choice = spec.tuning.default_config;
    how = "the spec's default config";
  }
  for (size_t i = 0; !out.choice && i < spec.space.size(); ++i)
    if (Tuner::why_not(spec, spec.space.at(i), slots.data(), limits).empty()) {
      out.choice = spec.space.at(i);
      how = "the first config that can run it";
    }
  serving_misses_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> g(m_);
    if (missed_.insert(key.base_hex() + "/" + key.values_hex()).second) {
      log::warn("serving: kernel '{}' has no tuned choice at {}; running {} ({}); `kiln report {} --misses` lists "
                "such keys",
                spec.name, key.values_text(), out.choice ? out.choice->str() : std::string("nothing"),
                how.empty() ? "no config can run it" : how, spec.spec_path.string());
      if (cache) cache->note_serving_miss(key);
    }
  }
  if (!out.choice) out.record.verdict = "serving mode: no tuned choice and no config can run this call";
  return out;
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
  return st;
}

uint64_t Runtime::serving_misses() const { return serving_misses_.load(std::memory_order_relaxed); }

TuneOutcome Runtime::tune(const KernelSpec& spec, void* const* params, const TuneOptions& o) {
  if (opts_.serving) return serve(spec, params);
  BackendState& st = state(spec.backend);
  CompilePool& pool = compile_pool(spec.backend);
  std::shared_ptr<TuningCache> cache = tuning_cache();
  benchmarker(spec.backend);
  Tuner t({st.backend.get(), &pool, st.bench.get(), cache.get(), [this](const Binary& b) { return load(b); }, opts_});
  TuneOutcome out = t.tune(spec, params, o);
  configs_timed_.fetch_add(out.timed_now, std::memory_order_relaxed);
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
