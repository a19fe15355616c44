#include "tune/search.hpp"

#include <algorithm>

#include "core/format.hpp"

namespace kiln {

namespace {

class Exhaustive final : public SearchStrategy {
 public:
  SearchMethod method() const override { return SearchMethod::exhaustive; }
  std::vector<size_t> next(const SearchState& s) override {
    if (done_) return {};
    done_ = true;
    return s.runnable;
  }

 private:
  bool done_ = false;
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
    // Every neighbour has a result: move to the best, if it gains 1%.
    std::optional<size_t> best;
    for (size_t i : nb)
      if (ok(i) && (!best || *s.result(i)->ns < *s.result(*best)->ns)) best = i;
    if (!best || !(*s.result(*best)->ns < *s.result(*cur_)->ns * 0.99)) return {};
    cur_ = best;
    return next(s);
  }

 private:
  std::optional<size_t> start_;
  std::string why_;
  std::optional<size_t> cur_;
  bool tried_start_ = false;
  size_t walk_ = 0;
  std::string start_text_;
};

}  // namespace

std::unique_ptr<SearchStrategy> make_exhaustive_search() { return std::make_unique<Exhaustive>(); }

std::unique_ptr<SearchStrategy> make_coordesc_search(std::optional<size_t> start, std::string why) {
  return std::make_unique<CoordDescent>(start, std::move(why));
}

}  // namespace kiln
