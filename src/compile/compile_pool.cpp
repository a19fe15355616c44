#include "compile/remote_cache.hpp"
#include "compile/compile_pool.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"
#include "core/process.hpp"
#include "kiln/ext/binary_key.hpp"

namespace kiln {

Binary CachingCompiler::compile(const CompileRequest& req, const std::string& key) {
  if (std::optional<Binary> b = cache_->get(key)) {
    b->from_cache = true;
    return std::move(*b);
  }
  // Another process may be compiling the same key: wait for it, then look again.
  return cache_->with_lock(key, [&] {
    if (std::optional<Binary> b = cache_->get(key)) {
      b->from_cache = true;
      return std::move(*b);
    }
    if (remote_)
      if (std::optional<Binary> b = from_remote(key)) {
        try {
          cache_->put(*b);
        } catch (const Error& e) {
          log::debug("cannot keep a remote binary locally: {}", e.what());
        }
        b->from_cache = true;
        return std::move(*b);
      }
    Binary b = inner_->compile(req, key);
    try {
      cache_->put(b);
    } catch (const Error& e) {
      // A full or read-only disk costs the cache, not the compile.
      log::warn("compiled kernel '{}' (config {}) but could not store it in the code cache: {}", req.kernel,
                req.config_text, e.what());
    }
    if (remote_) to_remote(b);
    return b;
  });
}

std::optional<Binary> CachingCompiler::cached(const std::string& key) {
  std::optional<Binary> b = cache_->get(key);
  if (b) b->from_cache = true;
  return b;
}

namespace {
std::string bin_prefix() { return fmt::format("kiln:b{}:", BinaryKey::kFormatVersion); }
constexpr size_t kMaxRemoteBinaryBytes = 16u << 20;
}  // namespace

std::optional<Binary> CachingCompiler::from_remote(const std::string& key) {
  std::optional<std::string> content = remote_->get(bin_prefix() + "bin:" + key);
  if (!content) return std::nullopt;
  std::optional<std::string> blob = remote_->get(bin_prefix() + "blob:" + *content);
  std::optional<Binary> b;
  if (blob && hash_bytes(*blob).hex() == *content) b = CodeCache::decode(*blob, key);
  if (!b) {
    log::warn("remote cache: the binary of key {} does not verify (its bytes do not match its hash, or it is another "
              "kernel's); compiling it here",
              key.substr(0, 12));
    return std::nullopt;
  }
  return b;
}

void CachingCompiler::to_remote(const Binary& b) {
  std::string entry = CodeCache::encode(b);
  if (entry.size() > kMaxRemoteBinaryBytes) return;
  std::string content = hash_bytes(entry).hex();
  if (remote_->set(bin_prefix() + "blob:" + content, entry)) remote_->set(bin_prefix() + "bin:" + b.key, content);
}


CompilePool::CompilePool(std::shared_ptr<Backend> backend, std::shared_ptr<Compiler> compiler, int threads)
    : backend_(std::move(backend)), compiler_(std::move(compiler)) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  urgent_thread_ = std::thread([this] { run_urgent(); });
}

void CompilePool::abandon() {
  cancel_ = true;
  cv_.notify_all();
}

CompilePool::~CompilePool() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  urgent_thread_.join();
}

// Pool threads take urgent work first, and start no background compile
// while urgent work is pending; the urgent thread takes urgent work only, so
// a call never waits for a busy pool.
void CompilePool::run() { work(false); }
void CompilePool::run_urgent() { work(true); }

void CompilePool::work(bool urgent_only) {
  set_thread_cancel_flag(&cancel_);
  for (;;) {
    std::function<void()> task;
    bool was_urgent = false;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] {
        return stop_ || !urgent_.empty() || (!urgent_only && !queue_.empty() && urgent_pending_ == 0);
      });
      if (!urgent_.empty()) {
        task = std::move(urgent_.front().second);
        urgent_.pop_front();
        was_urgent = true;
      } else if (!urgent_only && !queue_.empty()) {
        task = std::move(queue_.front().second);
        queue_.pop_front();
      } else {
        return;  // stopping, nothing left for this thread
      }
    }
    task();
    if (was_urgent) {
      {
        std::lock_guard<std::mutex> g(m_);
        --urgent_pending_;
      }
      cv_.notify_all();
    }
  }
}

BinaryFuture CompilePool::submit(const CompileRequest& req) {
  return submit(req, make_binary_key(req, *backend_).hex());
}

BinaryFuture CompilePool::submit(const KernelSpec& spec, const Config& config, bool urgent) {
  if (config.library.empty()) {
    CompileRequest req = make_compile_request(spec, config);
    return submit(req, make_binary_key(req, *backend_).hex(), urgent);
  }
  std::promise<std::shared_ptr<const Binary>> p;
  try {
    std::string why = backend_->library_unavailable(config.library);
    if (!why.empty()) throw Error(Errc::compile, fmt::format("library call '{}' is unavailable: {}", config.library, why));
    p.set_value(std::make_shared<const Binary>(
        library_binary(backend_->name(), config.library, spec.name, library_key(*backend_, config.library))));
  } catch (...) {
    p.set_exception(std::current_exception());
  }
  return p.get_future().share();
}

bool CompilePool::at_hand(const KernelSpec& spec, const Config& config) {
  if (!config.library.empty()) return true;
  const CompileRequest req = make_compile_request(spec, config);
  const std::string key = make_binary_key(req, *backend_).hex();
  {
    std::lock_guard<std::mutex> g(m_);
    auto it = futures_.find(key);
    if (it != futures_.end()) {
      if (it->second.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
      try {
        return it->second.get() != nullptr;
      } catch (...) {
        return false;  // it failed to compile
      }
    }
  }
  std::optional<Binary> hit;
  try {
    hit = compiler_->cached(key);
  } catch (const Error&) {
    return false;  // the cache's trouble: not at hand
  }
  if (!hit) return false;
  // Kept as this pool's finished compile: the submit that follows shares it,
  // and the cache is not read twice.
  std::lock_guard<std::mutex> g(m_);
  if (!futures_.count(key)) answer_cached(req, key, std::move(*hit));
  return true;
}

BinaryFuture CompilePool::submit(const CompileRequest& req, const std::string& key, bool urgent) {
  std::optional<Binary> hit;
  if (urgent) {
    bool known;
    {
      std::lock_guard<std::mutex> g(m_);
      known = futures_.count(key) > 0;
    }
    // A call is waiting: the code cache is read here, not after a hop to a
    // pool thread that may be busy.
    if (!known) {
      try {
        hit = compiler_->cached(key);
      } catch (const Error&) {
        // the cache's trouble: compiled as usual below
      }
    }
  }
  std::unique_lock<std::mutex> g(m_);
  ++counters_.submitted;
  auto it = futures_.find(key);
  if (it == futures_.end() && hit) return answer_cached(req, key, std::move(*hit));
  if (it != futures_.end()) return share(req, key, it->second, urgent);
  auto promise = std::make_shared<std::promise<std::shared_ptr<const Binary>>>();
  BinaryFuture fut = promise->get_future().share();
  futures_.emplace(key, fut);
  auto task = [this, req, key, promise] { compile(req, key, *promise); };
  if (urgent) {
    urgent_.emplace_back(key, std::move(task));
    ++urgent_pending_;
  } else {
    queue_.emplace_back(key, std::move(task));
  }
  g.unlock();
  cv_.notify_all();
  return fut;
}

void CompilePool::record(CompileRecord r) {
  records_.push_back(std::move(r));
  if (records_.size() > kKeepRecords) records_.pop_front();
}

BinaryFuture CompilePool::answer_cached(const CompileRequest& req, const std::string& key, Binary hit) {
  std::promise<std::shared_ptr<const Binary>> p;
  p.set_value(std::make_shared<const Binary>(std::move(hit)));
  BinaryFuture f = p.get_future().share();
  futures_.emplace(key, f);
  ++counters_.cache_hits;
  CompileRecord r;
  r.kernel = req.kernel;
  r.config = req.config_text;
  r.key = key;
  r.ok = r.cache_hit = true;
  r.bytes = f.get()->bytes.size();
  record(std::move(r));
  finished(key, true);
  return f;
}

// An identical request submitted before: its future. An urgent one still
// queued moves to the urgent thread.
BinaryFuture CompilePool::share(const CompileRequest& req, const std::string& key, BinaryFuture f, bool urgent) {
  ++counters_.deduped;
  if (urgent)
    for (auto q = queue_.begin(); q != queue_.end(); ++q)
      if (q->first == key) {
        auto task = std::move(*q);
        queue_.erase(q);
        urgent_.push_back(std::move(task));
        ++urgent_pending_;
        cv_.notify_all();
        break;
      }
  CompileRecord r;
  r.kernel = req.kernel;
  r.config = req.config_text;
  r.key = key;
  r.deduped = true;
  if (f.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    try {
      r.bytes = f.get()->bytes.size();
      r.ok = true;
      r.cache_hit = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
  } else {
    r.ok = true;  // shares a compile in flight; its own record tells how that went
  }
  record(std::move(r));
  return f;
}

void CompilePool::compile(const CompileRequest& req, const std::string& key,
                          std::promise<std::shared_ptr<const Binary>>& promise) {
  auto t0 = std::chrono::steady_clock::now();
  CompileRecord r;
  r.kernel = req.kernel;
  r.config = req.config_text;
  r.key = key;
  try {
    if (cancel_) throw Error(Errc::cancelled, fmt::format("kernel '{}' (config {}): not compiled: the runtime that "
                                                          "asked for it is going away", req.kernel, req.config_text));
    auto b = std::make_shared<const Binary>(compiler_->compile(req, key));
    r.ok = true;
    r.cache_hit = b->from_cache;
    r.bytes = b->bytes.size();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      // Recorded before the future is fulfilled: a waiter reads the records next.
      std::lock_guard<std::mutex> g(m_);
      (r.cache_hit ? counters_.cache_hits : counters_.compiled)++;
      record(std::move(r));
      finished(key, true);
    }
    promise.set_value(std::move(b));
  } catch (const std::exception& e) {
    r.error = e.what();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> g(m_);
      ++counters_.failed;
      record(std::move(r));
      finished(key, false);
    }
    promise.set_exception(std::current_exception());
  }
}

void CompilePool::finished(const std::string& key, bool ok) {
  if (!ok) {
    futures_.erase(key);
    return;
  }
  done_order_.push_back(key);
  while (done_order_.size() > kKeepDone) {
    futures_.erase(done_order_.front());
    done_order_.pop_front();
  }
}

CompilePool::Counters CompilePool::counters() const {
  std::lock_guard<std::mutex> g(m_);
  return counters_;
}

std::vector<CompileRecord> CompilePool::records() const {
  std::lock_guard<std::mutex> g(m_);
  return {records_.begin(), records_.end()};
}

bool stderr_is_terminal() { return ::isatty(2) == 1; }

ProgressBar::ProgressBar(std::string label, size_t total, bool show)
    : label_(std::move(label)), total_(total), show_(show), start_(std::chrono::steady_clock::now()), last_(start_) {
  draw();
}

ProgressBar::~ProgressBar() {
  if (show_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

void ProgressBar::set(size_t done) {
  done_ = done;
  draw();
}

void ProgressBar::tick() {
  if (std::chrono::steady_clock::now() - last_ >= std::chrono::milliseconds(100)) draw();
}

void ProgressBar::draw() {
  if (!show_) return;
  last_ = std::chrono::steady_clock::now();
  constexpr size_t width = 30;
  size_t fill = total_ ? width * done_ / total_ : width;
  std::string bar(fill, '#');
  bar.resize(width, '.');
  double secs = std::chrono::duration<double>(last_ - start_).count();
  std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s %.1fs", bar.c_str(), done_, total_, label_.c_str(), secs);
  std::fflush(stderr);
}

void wait_all(const std::vector<BinaryFuture>& futures, const std::string& label, bool show) {
  ProgressBar bar(label, futures.size(), show);
  size_t done = 0;
  for (const auto& f : futures) {
    while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) bar.tick();
    bar.set(++done);
  }
}

}  // namespace kiln
