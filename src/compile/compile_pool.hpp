// Compiling, as layers around one interface:
//   DirectCompiler   runs Backend::compile in this process;
//   (WorkerCompiler  runs it in a kiln-worker process, see worker_pool.hpp);
//   CachingCompiler  answers from the CodeCache, compiling under a per-key
//                    cross-process lock on a miss.
// CompilePool runs requests on threads, returns futures, and shares one
// compile among identical requests in flight.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ext/backend.hpp"
#include "compile/code_cache.hpp"

namespace kiln {

class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual Binary compile(const CompileRequest& req, const std::string& key) = 0;
  // The binary of `key` if a cache this compiler reads holds it (no compile,
  // no lock, no other process): how a call that waits for one config is
  // answered on its own thread.
  virtual std::optional<Binary> cached(const std::string& key) {
    static_cast<void>(key);
    return std::nullopt;
  }
};

class DirectCompiler final : public Compiler {
 public:
  explicit DirectCompiler(std::shared_ptr<Backend> b) : backend_(std::move(b)) {}
  Binary compile(const CompileRequest& req, const std::string& key) override {
    return backend_->compile(req, key);
  }

 private:
  std::shared_ptr<Backend> backend_;
};

class RemoteCache;

// With `remote` (KILN_REMOTE_BINARIES=1), a local miss asks Redis before
// compiling, and a compiled binary is shared there. Content-addressed:
// kiln:b<fmt>:bin:<binary key> names the xxh3-128 of the entry's bytes,
// kiln:b<fmt>:blob:<that hash> holds them; a blob whose bytes do not hash to
// its name, or that does not decode as the entry of the key asked for, is
// rejected and the kernel compiled here.
class CachingCompiler final : public Compiler {
 public:
  CachingCompiler(std::shared_ptr<Compiler> inner, std::shared_ptr<CodeCache> cache,
                  std::shared_ptr<RemoteCache> remote = nullptr)
      : inner_(std::move(inner)), cache_(std::move(cache)), remote_(std::move(remote)) {}
  Binary compile(const CompileRequest& req, const std::string& key) override;
  std::optional<Binary> cached(const std::string& key) override;

 private:
  std::optional<Binary> from_remote(const std::string& key);
  void to_remote(const Binary& b);
  std::shared_ptr<Compiler> inner_;
  std::shared_ptr<CodeCache> cache_;
  std::shared_ptr<RemoteCache> remote_;
};

using BinaryFuture = std::shared_future<std::shared_ptr<const Binary>>;

// One finished request, for `kiln compile` and metrics.
struct CompileRecord {
  std::string kernel, config, key;
  double seconds = 0;     // wall time from start to finish of this request
  bool ok = false;
  bool cache_hit = false;
  bool deduped = false;   // shared the compile of an identical request
  size_t bytes = 0;
  std::string error;
};

// Thread-safe: submit, counters and records may be called from any thread.
class CompilePool {
 public:
  // Finished compiles kept for identical submits (no disk cache needed); a
  // failed one is dropped once done, so submitting it again compiles again.
  static constexpr size_t kKeepDone = 1024;
  static constexpr size_t kKeepRecords = 4096;

  CompilePool(std::shared_ptr<Backend> backend, std::shared_ptr<Compiler> compiler, int threads);
  ~CompilePool();  // finishes queued work (or, after abandon(), cancels it), then stops
  // Nothing waits for this pool's work any more (its runtime is going away):
  // compiles not started fail at once with Error(Errc::cancelled), and
  // compilers running in processes are killed (run_process's cancel flag).
  void abandon();
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;

  // Computes the request's binary key now, then compiles on a pool thread.
  // An identical request already submitted shares its future.
  BinaryFuture submit(const CompileRequest& req);
  // `urgent`: a call waits for it. A binary the code cache holds is read on
  // the caller's thread; otherwise it runs on a thread kept for urgent work
  // (an identical request still queued is moved there), and while urgent
  // work is pending, no background compile starts: it compiles alone.
  BinaryFuture submit(const CompileRequest& req, const std::string& key, bool urgent = false);
  // One config of a spec: a template config is compiled as above; a library
  // choice gets its stand-in binary at once (or its reason for being unavailable).
  BinaryFuture submit(const KernelSpec& spec, const Config& config, bool urgent = false);
  // Whether submitting `config` would compile nothing: its binary was made in
  // this pool, or a cache its compiler reads holds it (the code cache, an
  // artifact's binaries). A library choice always is.
  bool at_hand(const KernelSpec& spec, const Config& config);

  struct Counters {
    size_t submitted = 0, deduped = 0, cache_hits = 0, compiled = 0, failed = 0;
  };
  Counters counters() const;
  std::vector<CompileRecord> records() const;
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void run();
  void run_urgent();
  void work(bool urgent_only);
  // Parts of submit(), holding m_: a binary the code cache held; an
  // identical request's future; the compile itself (on a pool thread).
  BinaryFuture answer_cached(const CompileRequest& req, const std::string& key, Binary hit);
  BinaryFuture share(const CompileRequest& req, const std::string& key, BinaryFuture f, bool urgent);
  void compile(const CompileRequest& req, const std::string& key,
               std::promise<std::shared_ptr<const Binary>>& promise);
  void record(CompileRecord r);  // holds m_
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<Compiler> compiler_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::function<void()>>> queue_;   // (key, task)
  std::deque<std::pair<std::string, std::function<void()>>> urgent_;  // run by urgent_thread_
  size_t urgent_pending_ = 0;  // urgent tasks queued or running: background compiles wait meanwhile
  void finished(const std::string& key, bool ok);  // holds m_
  std::map<std::string, BinaryFuture> futures_;  // by key: in flight, or done and kept
  std::deque<std::string> done_order_;           // done keys, oldest first
  std::deque<CompileRecord> records_;
  Counters counters_;
  bool stop_ = false;
  std::atomic<bool> cancel_{false};
  std::vector<std::thread> threads_;
  std::thread urgent_thread_;
};

// A progress bar on stderr: drawn only when `show` (callers pass: stderr is
// a terminal and not --quiet), redrawn on each set() and at most every 100 ms
// by tick(); cleared when destroyed.
class ProgressBar {
 public:
  ProgressBar(std::string label, size_t total, bool show);
  ~ProgressBar();
  void set(size_t done);
  void tick();  // redraws the clock

 private:
  void draw();
  std::string label_;
  size_t total_, done_ = 0;
  bool show_;
  std::chrono::steady_clock::time_point start_, last_;
};

// Waits for every future, drawing a progress bar when `show`.
void wait_all(const std::vector<BinaryFuture>& futures, const std::string& label, bool show);
bool stderr_is_terminal();

}  // namespace kiln
