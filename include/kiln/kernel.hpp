// Kernel: a handle that compiles and tunes lazily. When made, it starts
// compiling its config space in the background (Options::background_compile).
// The first call for a new tuning key takes the tuning record's choice when
// there is one. When there is none, by default (KILN_FIRST_CALL=swap) it
// launches a safe choice at once (safe_choices in kiln/ext/tuner.hpp) and
// the key is tuned behind it, on a copy of the call's arguments, on the
// runtime's background thread; the winner replaces the safe choice for later
// calls (Runtime::wait_tuned waits for that). With KILN_FIRST_CALL=wait the
// call tunes on its own arguments (read, never written) before returning.
// Every later call with that key computes the launch shape and launches,
// taking no lock and allocating nothing.
//
// Thread-safe: calls may come from any number of threads at once.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/spec.hpp"
#include "kiln/tune_options.hpp"

namespace kiln {

class Runtime;
class LoadedKernel;

// 16-bit floats as kiln's typed calls take them (storage only): IEEE
// binary16 and bfloat16. `_Float16`, and CUDA's `__half` and
// `__nv_bfloat16` (when their headers come first), are taken too.
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

// Where what a handle runs for a call comes from: a tuning now, a record
// (local, remote or packed), a safe choice while the shape is tuned behind
// it (KILN_FIRST_CALL), a multi-kernel's benchmark of its variants, a variant
// forced (KILN_FORCE_VARIANT) or the only one, size hints, or a plain run.
enum class ChoiceSource : uint8_t { tuned, cache, safe, benchmarked, forced, only_variant, size_hints, plain };
// "tuned", "cache", "safe", "benchmarked", "forced", "only variant", "size hints", "plain".
const char* choice_source_name(ChoiceSource s);
std::ostream& operator<<(std::ostream& os, ChoiceSource s);

// What a call with some tuning-key values runs.
struct Choice {
  Config config;
  std::shared_ptr<LoadedKernel> kernel;  // kiln/ext/backend.hpp: describe(), key()
  ChoiceSource source = ChoiceSource::tuned;  // tuned, cache, or safe
};

// What a program (or an engine) launches: a Kernel, a MultiKernel or a
// SizeHintMultiKernel, alike.
class Launchable {
 public:
  virtual ~Launchable() = default;
  // params[i] points to argument i's value, as Kernel::launch takes them.
  virtual void launch(void* const* params, Stream stream = nullptr) = 0;
  // What runs for these params (deciding it if needed).
  struct Running {
    std::string what;  // its config, or variant and config
    ChoiceSource source = ChoiceSource::tuned;
    // It calls a library, which reads every scalar from the call: a program passes it no
    // cell, keeping exact launches for the shape (docs/program.md, "Cells").
    bool library = false;
    // Settled: not a safe choice that a tuning behind it may replace.
    bool settled() const { return source != ChoiceSource::safe; }
  };
  virtual Running running(void* const* params) = 0;
  // running(params).settled(), without the text (a program asks it on its hot path);
  // a multi-kernel also needs the calling thread's scratch for its choice in place
  // (a launch then allocates nothing, as a graph being captured requires).
  virtual bool settled(void* const* params) { return running(params).settled(); }
};

namespace detail {
constexpr uint8_t kPointerCode = 16;  // added to a dtype's code for a pointer to it
constexpr uint8_t kAnyPointer = 64;   // void* or a CUdeviceptr: matches any pointer argument
constexpr uint8_t kUnknown = 255;
template <class T>
constexpr uint8_t scalar_code() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return static_cast<uint8_t>(DType::f32);
  else if constexpr (std::is_same_v<U, double>) return static_cast<uint8_t>(DType::f64);
  else if constexpr (std::is_same_v<U, f16>) return static_cast<uint8_t>(DType::f16);
  else if constexpr (std::is_same_v<U, bf16>) return static_cast<uint8_t>(DType::bf16);
#if defined(__FLT16_MAX__)
  else if constexpr (std::is_same_v<U, _Float16>) return static_cast<uint8_t>(DType::f16);
#endif
#if defined(__CUDA_FP16_H__)
  else if constexpr (std::is_same_v<U, __half>) return static_cast<uint8_t>(DType::f16);
#endif
#if defined(__CUDA_BF16_H__)
  else if constexpr (std::is_same_v<U, __nv_bfloat16>) return static_cast<uint8_t>(DType::bf16);
#endif
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) return static_cast<uint8_t>(DType::i32);
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) return static_cast<uint8_t>(DType::i64);
  else return kUnknown;
}
// Argument type codes: a dtype, a pointer to one (+kPointerCode), any
// pointer (void*, or an unsigned 64-bit CUdeviceptr), or unknown.
template <class T>
constexpr uint8_t arg_code() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, void*> || std::is_same_v<U, const void*> ||
                (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 8)) {
    return kAnyPointer;
  } else if constexpr (std::is_pointer_v<U>) {
    constexpr uint8_t base = scalar_code<std::remove_pointer_t<U>>();
    return base < kPointerCode ? base + kPointerCode : kUnknown;
  } else {
    return scalar_code<U>();
  }
}
// kernel(args...) for a handle that has launch(void* const*, Stream) and
// check_types(codes, n): type-checks the pack against the spec, then launches.
template <class Handle>
struct TypedCall {
  template <class... A>
  void operator()(A... args) {
    call(nullptr, args...);
  }
  // kernel.on(stream)(args...): the same, queued on the caller's stream.
  struct OnStream {
    Handle& h;
    Stream s;
    template <class... A>
    void operator()(A... args) {
      h.call(s, args...);
    }
  };
  OnStream on(Stream s) { return {static_cast<Handle&>(*this), s}; }
  template <class... A>
  void call(Stream s, A... args) {
    static constexpr uint8_t codes[] = {arg_code<A>()..., 0};
    Handle& h = static_cast<Handle&>(*this);
    h.check_types(codes, sizeof...(A));
    void* params[] = {static_cast<void*>(&args)..., nullptr};
    h.launch(params, s);
  }
};
}  // namespace detail

// Whether an argument of C++ type code `got` may be passed where the spec
// says `want`, and a code's name ("f32*").
bool arg_code_matches(uint8_t got, uint8_t want);
std::string arg_code_name(uint8_t code);

// Calls are type-checked: kernel(A, B, C, M, N, K) with float*, int64_t, ...
// matching the spec, or launch(params) with a void* array.
class Kernel final : public detail::TypedCall<Kernel>, public Launchable {
 public:
  // `rt` must outlive the handle. Throws Error(Errc::usage) for a spec kiln
  // cannot dispatch (more than 64 arguments, or 16 scalars in its shape key).
  Kernel(Runtime& rt, KernelSpec spec, TuneOptions tune = {});
  ~Kernel();
  Kernel(Kernel&&) noexcept;
  Kernel& operator=(Kernel&&) noexcept;

  // params[i] points to the value of argument i, in spec order; on cuda,
  // buffers are device pointers and the launch is queued on `stream`.
  void launch(void* const* params, Stream stream = nullptr) override;
  Running running(void* const* params) override;
  bool settled(void* const* params) override;

  // Waits until the background compile of the config space is done
  // (starting it if it was not); the first call does this by itself.
  void prepare();
  // The choice for these arguments' shape, tuning if needed.
  const Choice& choice(void* const* params);
  const KernelSpec& spec() const;
  size_t shapes_seen() const;  // shapes the handle remembers now (bounded by KILN_MEMO_CAPACITY)
  // Throws Error(Errc::usage) unless `codes` (detail::arg_code) match the spec.
  void check_types(const uint8_t* codes, size_t n) const;

 private:
  struct Chosen;
  const Chosen* decide(void* const* params, const int64_t* key, Stream stream);
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with its background tunings
};

}  // namespace kiln
