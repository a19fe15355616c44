#include "tune/surrogate.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "core/format.hpp"
#include "core/log.hpp"

namespace kiln {

namespace {

// The few functions of XGBoost's C API kiln uses (xgboost/c_api.h).
using Handle = void*;
using bst_ulong = uint64_t;
struct Api {
  void* lib = nullptr;
  const char* (*last_error)() = nullptr;
  int (*dmatrix_from_mat)(const float*, bst_ulong, bst_ulong, float, Handle*) = nullptr;
  int (*dmatrix_set_float)(Handle, const char*, const float*, bst_ulong) = nullptr;
  int (*dmatrix_free)(Handle) = nullptr;
  int (*booster_create)(const Handle*, bst_ulong, Handle*) = nullptr;
  int (*booster_free)(Handle) = nullptr;
  int (*booster_set_param)(Handle, const char*, const char*) = nullptr;
  int (*booster_update)(Handle, int, Handle) = nullptr;
  int (*booster_predict)(Handle, Handle, int, unsigned, int, bst_ulong*, const float**) = nullptr;
  int (*version)(int*, int*, int*) = nullptr;
  std::string why;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> names;
    if (const char* p = std::getenv("KILN_XGBOOST_LIB"); p && *p) names.push_back(p);
    else names = {"libxgboost.so.0", "libxgboost.so"};
    for (const auto& n : names)
      if ((a.lib = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    if (!a.lib) {
      const char* e = ::dlerror();
      a.why = fmt::format("libxgboost cannot be opened ({}); apt-get install libxgboost-dev, or set KILN_XGBOOST_LIB",
                          e ? e : "not found");
      return;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(a.lib, name));
      if (!f && a.why.empty()) a.why = fmt::format("libxgboost lacks {}", name);
    };
    sym(a.last_error, "XGBGetLastError");
    sym(a.dmatrix_from_mat, "XGDMatrixCreateFromMat");
    sym(a.dmatrix_set_float, "XGDMatrixSetFloatInfo");
    sym(a.dmatrix_free, "XGDMatrixFree");
    sym(a.booster_create, "XGBoosterCreate");
    sym(a.booster_free, "XGBoosterFree");
    sym(a.booster_set_param, "XGBoosterSetParam");
    sym(a.booster_update, "XGBoosterUpdateOneIter");
    sym(a.booster_predict, "XGBoosterPredict");
    sym(a.version, "XGBoostVersion");
  });
  return a;
}

class XgbSurrogate final : public Surrogate {
 public:
  ~XgbSurrogate() override {
    if (booster_) api().booster_free(booster_);
  }
  bool fit(const std::vector<float>& x, size_t cols, const std::vector<float>& y) override {
    const Api& a = api();
    if (booster_) {
      a.booster_free(booster_);
      booster_ = nullptr;
    }
    Handle d = nullptr;
    if (a.dmatrix_from_mat(x.data(), y.size(), cols, NAN, &d) != 0) return failed("DMatrix");
    bool ok = a.dmatrix_set_float(d, "label", y.data(), y.size()) == 0 && a.booster_create(&d, 1, &booster_) == 0;
    // Small, deterministic trees: a few dozen samples, one thread.
    for (auto [k, v] : {std::pair{"objective", "reg:squarederror"}, {"max_depth", "4"}, {"eta", "0.3"},
                        {"min_child_weight", "1"}, {"nthread", "1"}, {"seed", "0"}, {"verbosity", "0"}})
      ok = ok && a.booster_set_param(booster_, k, v) == 0;
    for (int it = 0; ok && it < 40; ++it) ok = a.booster_update(booster_, it, d) == 0;
    a.dmatrix_free(d);
    return ok || failed("training");
  }
  std::vector<float> predict(const std::vector<float>& x, size_t cols) override {
    const Api& a = api();
    std::vector<float> out;
    if (!booster_) return out;
    Handle d = nullptr;
    if (a.dmatrix_from_mat(x.data(), x.size() / cols, cols, NAN, &d) != 0) return failed("DMatrix"), out;
    bst_ulong n = 0;
    const float* r = nullptr;
    if (a.booster_predict(booster_, d, 0, 0, 0, &n, &r) == 0) out.assign(r, r + n);
    else failed("prediction");
    a.dmatrix_free(d);
    return out;
  }
  std::string name() const override {
    int ma = 0, mi = 0, pa = 0;
    api().version(&ma, &mi, &pa);
    return fmt::format("xgboost {}.{}.{}", ma, mi, pa);
  }

 private:
  bool failed(const char* what) {
    log::debug("xgboost {}: {}", what, api().last_error());
    return false;
  }
  Handle booster_ = nullptr;
};

}  // namespace

std::unique_ptr<Surrogate> Surrogate::make(std::string* why) {
  const Api& a = api();
  if (!a.why.empty()) {
    if (why) *why = a.why;
    return nullptr;
  }
  return std::make_unique<XgbSurrogate>();
}

}  // namespace kiln
