// The first call of a shape with no record (KILN_FIRST_CALL=swap and serve),
// in one place for Kernel and MultiKernel (docs/dispatch.md):
//   1. a safe choice that can run the call: proven ones as they are, others
//      run once in a worker first (try_config) and checked;
//   2. with swap, the shape is tuned in the background on a copy of the
//      call's arguments while its calls run the safe choice (Swaps);
//   3. the winner replaces the safe choice in the shape memo.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/shape_memo.hpp"
#include "kiln/ext/call_view.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

// How a first call with no record is answered: serving mode waits (it never
// tunes, Runtime::tune answers with a safe choice), else the options'.
inline FirstCall first_call_mode(Runtime& rt) {
  return rt.options().serving ? FirstCall::wait : rt.options().first_call;
}

// Runs `config` once on the call's arguments (read, never written), in a
// worker unless KILN_TUNE_IN_PROCESS=1, as a tuning's checking run does:
// "" when it ran cleanly, wrote every output and no input, and agreed with
// the reference (reference_for) where there is one; else why not. Throws
// Error(Errc::compile) when it does not compile, and for faults that are
// not the config's. `outputs`, when given, receives what each argument
// holds after the run (empty for inputs and scalars), for comparing two
// configs where there is no reference; `checked`, when given, says whether
// the outputs were compared with a reference.
std::string try_config(Runtime& rt, const CallView& call, const Config& config, Stream stream,
                       std::vector<std::vector<std::byte>>* outputs = nullptr, bool* checked = nullptr);

// What try_config compares `config` with: the spec's reference config where
// it can run the call, else its first library choice available here;
// nullopt when there is neither.
std::optional<Config> reference_for(Runtime& rt, const CallView& call, const Config& config);

// Walks safe_choices() for the call: an unproven one is run once in a worker
// first (try_config); `load` loads a config (throwing Errc::compile or
// Errc::launch when it cannot) and the loaded kernel must accept the call
// (can_implement). Returns the first that passes, or nullopt with
// `failures` saying why each did not. `libraries`: as safe_choices'.
std::optional<SafeChoice> first_safe_choice(Runtime& rt, const CallView& call, Stream stream, bool libraries,
                                            const std::function<const LoadedKernel&(const Config&)>& load,
                                            std::string* failures);

// A record's choice that calls a library being readied in the background
// (Library::readying: a call of it now would wait for that): the library;
// null for any other choice.
Library* readying_library(Runtime& rt, const std::string& backend, const Config& choice);
// Returns once `lib` is no longer readying, or `stop` is set (a runtime going away).
void wait_readied(const Library& lib, const std::atomic<bool>& stop);

// What a first call runs instead of a readying library's choice: the fastest
// config of `record` (the call's own record) that names no library, can run
// the call (Tuner::why_not) and needs no compile (CompilePool::at_hand),
// with its median time; nullopt when none is.
std::optional<std::pair<Config, double>> own_choice_at_hand(Runtime& rt, const CallView& call,
                                                            const TuningRecord& record);

// The shapes of a handle that are tuned in the background, with the safe
// choice their calls run meanwhile. Every member is called holding the
// memo's mutex, except from the background job itself.
template <class Choice>
class Swaps {
 public:
  using Key = std::vector<int64_t>;
  // What a background tuning gives: the winner, or null to keep the safe choice.
  using Tune = std::function<const Choice*(const std::atomic<bool>& stop)>;

  // The safe choice a shape's calls run while it is tuned (a shape evicted
  // from the memo meanwhile gets it again), or null.
  const Choice* running(const Key& shape) const {
    auto it = pending_.find(shape);
    return it == pending_.end() ? nullptr : it->second;
  }

  // For a shape whose tuning key (`group`: a bucketed key's, shared by other
  // shapes) is already being tuned: that tuning's safe choice, to run without
  // starting a tuning of its own (a decode loop's new cache lengths, one a
  // call, would each copy the cache for one otherwise). Null when none is.
  // The caller does not memoise it: the shape is decided again at its next
  // call, from the record once the tuning has written it.
  const Choice* join(const std::string& group) const {
    auto it = groups_.find(group);
    if (it == groups_.end()) return nullptr;
    auto p = pending_.find(it->second);
    return p == pending_.end() ? nullptr : p->second;
  }

  // Queues the shape's tuning on the runtime's background thread; when
  // `tune` returns a winner, it replaces `safe` in `memo`. A tuning that
  // throws or chooses nothing leaves the safe choice in place (a later
  // process tunes the shape). `owner` keeps `memo` and this alive until the
  // job has run. `group`: the tuning key, which shapes join (join()).
  void start(Runtime& rt, ShapeMemo<const Choice*>& memo, std::shared_ptr<void> owner, Key shape, const Choice* safe,
             std::string what, Tune tune, std::string group = {}) {
    pending_[shape] = safe;
    if (!group.empty()) groups_[group] = shape;
    rt.run_in_background(std::move(what), [this, &memo, owner = std::move(owner), shape = std::move(shape),
                                           tune = std::move(tune), group](const std::atomic<bool>& stop) {
      const Choice* winner = nullptr;
      auto done = [&] {
        pending_.erase(shape);
        if (!group.empty()) groups_.erase(group);
      };
      try {
        winner = tune(stop);
      } catch (...) {
        std::lock_guard<std::mutex> g(memo.mutex());
        done();
        throw;
      }
      std::lock_guard<std::mutex> g(memo.mutex());
      if (winner) memo.insert(shape.data(), winner);
      done();
    });
  }

 private:
  std::map<Key, const Choice*> pending_;
  std::map<std::string, Key> groups_;  // tuning key: the shape whose tuning is running
};

}  // namespace kiln
