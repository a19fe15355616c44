#include "tune/search.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "core/format.hpp"
#include "kiln/ext/call_view.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/hash.hpp"
#include "tune/record_io.hpp"
#include "tune/surrogate.hpp"

#include <cmath>
#include <random>

namespace kiln {

namespace {

class Exhaustive final : public SearchStrategy {
 public:
  SearchMethod method() const override { return SearchMethod::exhaustive; }
  std::string start() const override { return stopped_ ? "exhaustive: stopped by its time budget" : ""; }
  std::vector<size_t> next(const SearchState& s) override {
    // Without a time budget, one batch: every compile runs in parallel.
    // With one, batches of kBatch, so that what was timed when the budget
    // runs out is kept, and tuning again times the rest.
    constexpr size_t kBatch = 256;
    const bool budgeted = s.seconds_left < 1e299;
    if (budgeted && s.seconds_left <= 0) {
      stopped_ = std::any_of(s.runnable.begin(), s.runnable.end(), [&](size_t i) { return !s.result(i); });
      return {};
    }
    if (!budgeted) {
      if (done_) return {};
      done_ = true;
      return s.runnable;
    }
    std::vector<size_t> out;
    for (size_t i : s.runnable)
      if (!s.result(i) && out.size() < kBatch) out.push_back(i);
    return out;
  }

 private:
  bool done_ = false, stopped_ = false;
};

class CoordDescent final : public SearchStrategy {
 public:
  CoordDescent(std::optional<size_t> start, std::string why) : start_(start), why_(std::move(why)) {}
  SearchMethod method() const override { return SearchMethod::coordesc; }
  std::string start() const override { return start_text_; }

  std::vector<size_t> next(const SearchState& s) override {
    auto ok = [&](size_t i) {
      const ConfigResult* r = s.result(i);
      return r && r->ok();
    };
    auto runnable = [&](size_t i) { return std::binary_search(s.runnable.begin(), s.runnable.end(), i); };
    if (!cur_) {
      // Find a starting point that runs.
      if (start_ && runnable(*start_) && !tried_start_) {
        tried_start_ = true;
        if (!s.result(*start_)) return {*start_};
      }
      if (start_ && ok(*start_)) {
        cur_ = start_;
        start_text_ = fmt::format("{} ({})", s.space.at(*start_).str(), why_);
      } else {
        for (; walk_ < s.runnable.size(); ++walk_) {
          size_t i = s.runnable[walk_];
          if (!s.result(i)) return {i};
          if (ok(i)) {
            cur_ = i;
            start_text_ = fmt::format("{} (the first config that runs)", s.space.at(i).str());
            break;
          }
        }
        if (!cur_) return {};
      }
    }
    // The neighbours of the current config.
    Config c = s.space.at(*cur_);
    std::vector<size_t> nb;
    for (size_t p = 0; p < s.space.params.size(); ++p) {
      const auto& vals = s.space.params[p].values;
      size_t at = static_cast<size_t>(std::find(vals.begin(), vals.end(), c.values[p].second) - vals.begin());
      for (int step : {-1, 1}) {
        if ((step < 0 && at == 0) || at + step >= vals.size()) continue;
        Config x = c;
        x.values[p].second = vals[at + step];
        size_t i = *s.space.index_of(x);
        if (runnable(i)) nb.push_back(i);
      }
    }
    std::vector<size_t> todo;
    for (size_t i : nb)
      if (!s.result(i)) todo.push_back(i);
    if (!todo.empty()) return todo;
    // Every neighbour has a result: move to the best not yet stood on, if it
    // gains 1% by its median or, failing that, by its minimum. A run that a
    // busy machine disturbed can double a median while the minimum still shows
    // what the config can do; moving on either signal costs a few more configs
    // at worst, and standing on each config once ends the walk.
    visited_.insert(*cur_);
    auto step = [&](auto score) -> std::optional<size_t> {
      std::optional<size_t> best;
      for (size_t i : nb)
        if (ok(i) && !visited_.count(i) && (!best || score(i) < score(*best))) best = i;
      if (best && score(*best) < score(*cur_) * 0.99) return best;
      return std::nullopt;
    };
    std::optional<size_t> to = step([&](size_t i) { return *s.result(i)->ns; });
    if (!to) to = step([&](size_t i) { return s.result(i)->min_ns > 0 ? s.result(i)->min_ns : *s.result(i)->ns; });
    if (!to) {
      if (confirmed_.insert(*cur_).second) {
        pending_ = {*cur_};
        for (size_t i : nb)
          if (ok(i)) pending_.push_back(i);
        if (pending_.size() < 2) pending_.clear();
      }
      return {};
    }
    cur_ = to;
    return next(s);
  }

  std::vector<size_t> confirm(const SearchState&) override { return std::exchange(pending_, {}); }

 private:
  std::optional<size_t> start_;
  std::string why_;
  std::optional<size_t> cur_;
  std::set<size_t> visited_, confirmed_;
  std::vector<size_t> pending_;
  bool tried_start_ = false;
  size_t walk_ = 0;
  std::string start_text_;
};

}  // namespace

std::unique_ptr<SearchStrategy> make_exhaustive_search() { return std::make_unique<Exhaustive>(); }

std::unique_ptr<SearchStrategy> make_coordesc_search(std::optional<size_t> start, std::string why) {
  return std::make_unique<CoordDescent>(start, std::move(why));
}

namespace {

class Budgeted final : public SearchStrategy {
 public:
  Budgeted(std::optional<size_t> start, uint64_t seed, bool until_settled)
      : start_(start), rng_(seed), settle_(until_settled) {
    std::string why;
    model_ = Surrogate::make(&why);
    text_ = model_ ? fmt::format("budgeted: surrogate {}", model_->name())
                   : fmt::format("budgeted: random draws ({})", why);
  }
  SearchMethod method() const override { return SearchMethod::budgeted; }
  std::string start() const override { return text_; }

  std::vector<size_t> next(const SearchState& s) override {
    // The first sample is timed however little time is left (a budget spent
    // before anything was timed, on a busy machine, would leave no answer).
    if (s.budget_left == 0 || (s.seconds_left <= 0 && round_ > 0)) return {};
    std::vector<size_t> left;
    for (size_t i : s.runnable)
      if (!s.result(i)) left.push_back(i);
    if (left.empty()) return {};
    const size_t n = s.runnable.size();
    // Sizes follow the space: a first sample and rounds of n/256 (at least
    // 8), and settled once n/32 configs (at least two rounds) in a row have
    // not improved the best by 1%.
    const size_t round = std::max<size_t>(8, n / 256);
    const size_t patience = std::max<size_t>(2 * round, n / 32);
    // How the best moved since the last round.
    double best = INFINITY;
    std::optional<size_t> best_i;
    for (size_t i : s.runnable)
      if (const ConfigResult* r = s.result(i); r && r->ok() && *r->ns < best) best = *r->ns, best_i = i;
    if (round_ > 0) {
      if (best < best_ * 0.99) {
        best_ = best;
        since_ = 0;
      } else {
        since_ += proposed_;
      }
      if (settle_ && since_ >= patience) return {};
    } else {
      best_ = best;
    }
    std::vector<size_t> out;
    auto take = [&](size_t i) {
      if (out.size() < round && std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
    };
    if (round_++ == 0) {
      if (start_ && std::find(left.begin(), left.end(), *start_) != left.end()) take(*start_);
      std::shuffle(left.begin(), left.end(), rng_);
      for (size_t i : left) take(i);
      proposed_ = out.size();
      return out;
    }
    // The untimed neighbours of the best (each param one step), a quarter of
    // the round: the model proposes where it expects speed, they refine
    // where speed was found.
    if (best_i) {
      std::vector<size_t> nb = neighbours(s, *best_i);
      std::shuffle(nb.begin(), nb.end(), rng_);
      for (size_t i : nb)
        if (out.size() < round / 4) take(i);
    }
    std::vector<size_t> ranked = left;
    if (model_ && rank(s, ranked)) {
      for (size_t i : ranked)
        if (out.size() < round - 1) take(i);
      // One random draw keeps the model honest where it knows nothing.
      std::vector<size_t> rest;
      for (size_t i : left)
        if (std::find(out.begin(), out.end(), i) == out.end()) rest.push_back(i);
      if (!rest.empty()) take(rest[std::uniform_int_distribution<size_t>(0, rest.size() - 1)(rng_)]);
    } else {
      std::shuffle(left.begin(), left.end(), rng_);
      for (size_t i : left) take(i);
    }
    proposed_ = out.size();
    return out;
  }

 private:
  // Runnable configs without a result one step from `i` in one param.
  static std::vector<size_t> neighbours(const SearchState& s, size_t i) {
    std::vector<size_t> out;
    const Config c = s.space.at(i);
    for (size_t p = 0; p < s.space.params.size(); ++p) {
      const auto& vals = s.space.params[p].values;
      const size_t at = static_cast<size_t>(std::find(vals.begin(), vals.end(), c.values[p].second) - vals.begin());
      for (int step : {-1, 1}) {
        if ((step < 0 && at == 0) || at + step >= vals.size()) continue;
        Config x = c;
        x.values[p].second = vals[at + step];
        auto j = s.space.index_of(x);
        if (j && std::binary_search(s.runnable.begin(), s.runnable.end(), *j) && !s.result(*j)) out.push_back(*j);
      }
    }
    return out;
  }
  static std::vector<float> features(const ConfigSpace& space, size_t i) {
    Config c = space.at(i);
    std::vector<float> f;
    for (const auto& [n, v] : c.values) f.push_back(static_cast<float>(std::log2(std::abs(static_cast<double>(v)) + 1)));
    return f;
  }
  // Sorts `left` by predicted time, fastest first; false when the model fails.
  bool rank(const SearchState& s, std::vector<size_t>& left) {
    const size_t cols = s.space.params.size();
    if (cols == 0) return false;
    std::vector<float> x, y;
    double worst = 0;
    for (size_t i : s.runnable)
      if (const ConfigResult* r = s.result(i); r && r->ok()) worst = std::max(worst, *r->ns);
    if (worst <= 0) return false;
    for (size_t i : s.runnable) {
      const ConfigResult* r = s.result(i);
      if (!r) continue;
      auto f = features(s.space, i);
      x.insert(x.end(), f.begin(), f.end());
      y.push_back(static_cast<float>(std::log(r->ok() ? *r->ns : worst * 4)));
    }
    if (y.size() < 4 || !model_->fit(x, cols, y)) return false;
    std::vector<float> q;
    for (size_t i : left) {
      auto f = features(s.space, i);
      q.insert(q.end(), f.begin(), f.end());
    }
    std::vector<float> p = model_->predict(q, cols);
    if (p.size() != left.size()) return false;
    std::vector<size_t> order(left.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
    std::vector<size_t> sorted;
    for (size_t k : order) sorted.push_back(left[k]);
    left = std::move(sorted);
    return true;
  }

  std::optional<size_t> start_;
  std::mt19937_64 rng_;
  bool settle_;
  std::unique_ptr<Surrogate> model_;
  std::string text_;
  int round_ = 0;
  size_t since_ = 0, proposed_ = 0;  // configs proposed since the best last gained 1%; in the last round
  double best_ = INFINITY;
};

}  // namespace

std::unique_ptr<SearchStrategy> make_budgeted_search(std::optional<size_t> start, uint64_t seed, bool until_settled) {
  return std::make_unique<Budgeted>(start, seed, until_settled);
}

std::unique_ptr<SearchStrategy> make_search(SearchKind kind, bool settle, const CallView& call,
                                            const std::vector<std::string>& pruned, TuningCache* cache) {
  const KernelSpec& spec = call.spec;
  std::optional<size_t> start;
  if (spec.tuning.default_config) start = spec.space.index_of(*spec.tuning.default_config);
  if (kind == SearchKind::exhaustive) return make_exhaustive_search();
  if (kind == SearchKind::budgeted)
    return make_budgeted_search(start, hash64(call.key.values_hex().data(), call.key.values_hex().size()), settle);
  std::string why = start ? "the spec's default" : "";
  if ((!start || !pruned[*start].empty()) && cache) {
    start.reset();
    why.clear();
    double best_d = INFINITY;
    for (const auto& r : cache->all(call.key)) {
      if (r.key.values == call.key.values) continue;
      auto c = Tuner::choose(r, spec, call.slot_data(), call.limits);
      if (!c) continue;
      double d = log2_distance(r.key.values, call.key.values);
      auto idx = spec.space.index_of(*c);
      if (idx && pruned[*idx].empty() && d < best_d) {
        best_d = d;
        start = idx;
        why = "the best of the nearest cached key, " + r.key.values_text();
      }
    }
  }
  return make_coordesc_search(start, why);
}

}  // namespace kiln
