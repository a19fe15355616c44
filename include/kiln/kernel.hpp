// Kernel: a handle that compiles and tunes lazily. The first call for a new
// tuning key tunes on that call's own arguments (copied; the caller's buffers
// are never written while tuning) and remembers the choice in memory and in
// the tuning cache; every later call with that key computes the grid and
// launches, taking no lock and allocating nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "kiln/backend.hpp"
#include "kiln/tuner.hpp"

namespace kiln {

class Runtime;

// What a call with some tuning-key values runs.
struct Choice {
  Config config;
  std::shared_ptr<LoadedKernel> kernel;
  GridPlan grid;
  std::string source;  // "tuned", "cache"
  double ns = 0;       // its benchmarked time
};

namespace detail {
// Argument type codes: the dtype, plus 4 for a pointer; 255 for a type kiln cannot pass.
template <class T>
constexpr uint8_t arg_code() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_pointer_v<U>) {
    constexpr uint8_t base = arg_code<std::remove_pointer_t<U>>();
    return base < 4 ? base + 4 : 255;
  } else if constexpr (std::is_same_v<U, float>) {
    return 0;
  } else if constexpr (std::is_same_v<U, double>) {
    return 1;
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) {
    return 2;
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) {
    return 3;
  } else {
    return 255;
  }
}
// kernel(args...) for a handle that has launch(void* const*) and
// check_types(codes, n): type-checks the pack against the spec, then launches.
template <class Handle>
struct TypedCall {
  template <class... A>
  void operator()(A... args) {
    static constexpr uint8_t codes[] = {arg_code<A>()..., 0};
    Handle& h = static_cast<Handle&>(*this);
    h.check_types(codes, sizeof...(A));
    void* params[] = {static_cast<void*>(&args)..., nullptr};
    h.launch(params);
  }
};
}  // namespace detail

// Calls are type-checked: kernel(A, B, C, M, N, K) with float*, int64_t, ...
// matching the spec, or launch(params) with a void* array.
class Kernel : public detail::TypedCall<Kernel> {
 public:
  // `rt` must outlive the handle. Throws Error(Errc::usage) for a spec kiln
  // cannot dispatch (more than 64 arguments or 8 tuning-key names).
  Kernel(Runtime& rt, KernelSpec spec, TuneOptions tune = {});
  ~Kernel();
  Kernel(Kernel&&) noexcept;
  Kernel& operator=(Kernel&&) noexcept;

  // params[i] points to the value of argument i, in spec order.
  void launch(void* const* params);

  // The choice for these arguments' tuning-key values, tuning if needed.
  const Choice& choice(void* const* params);
  const KernelSpec& spec() const;
  size_t shapes_seen() const;
  // Throws Error(Errc::usage) unless `codes` (detail::arg_code) match the spec.
  void check_types(const uint8_t* codes, size_t n) const;

 private:
  Choice* find(void* const* params, int64_t* slots);  // memoised, or decided now
  Choice* decide(void* const* params, const int64_t* key);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
