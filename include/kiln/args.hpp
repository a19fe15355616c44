// Arguments of a kernel as kiln passes them: an array of pointers to values,
// one per spec argument (as cuLaunchKernel's kernelParams). HostArgs owns
// host memory for every argument of a spec, for tuning, tests and the CLI.
// Thread-safety: HostArgs is a value; const calls may run concurrently, a
// call that writes (fill_random, set) must not overlap any other on the same object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

// A scalar's value, in the dtype its spec declares.
struct ScalarValue {
  int64_t i = 0;
  double f = 0;
};

// Parses NAME=VALUE settings for every scalar argument of `spec`. Throws
// Error(Errc::usage) for an unknown name, a bad number, a pointer argument,
// or a scalar left without a value.
std::vector<ScalarValue> parse_scalars(const KernelSpec& spec,
                                       const std::vector<std::pair<std::string, std::string>>& sets);

struct LaunchLimits;

// Compiles an expression of `spec`: integer scalar arg i reads slot i; params
// take their value in `config` (nullptr: a param is an error); a family's
// constants theirs; SM_COUNT the multiprocessors of `device` (nullptr: an error).
CompiledExpr compile_expr(const KernelSpec& spec, const Expr& e, const Config* config,
                          const LaunchLimits* device = nullptr);

// Reads the integer scalar arguments out of a params array into slots (slot i
// = argument i) for CompiledExpr::eval; a buffer argument's slot holds its
// alignment (see align_target in kiln/spec.hpp).
void read_int_slots(const KernelSpec& spec, void* const* params, int64_t* slots);
// The largest power of two, at most 256, that divides `p` (256 for null).
int64_t pointer_alignment(const void* p);

// The bytes a buffer of `elements` values of `t` takes; throws
// Error(Errc::usage) naming `what` when that overflows or is negative.
size_t buffer_bytes(DType t, int64_t elements, const std::string& what);

// The element count of each buffer argument of `spec` at a call whose integer scalars are
// `slots` (0 for scalars), all evaluated before anything is made of them: Error(Errc::usage)
// names the argument whose size overflows, is negative, or whose bytes overflow.
std::vector<int64_t> buffer_elements(const KernelSpec& spec, const int64_t* slots);

// f16 and bf16 values and their 16-bit encodings (round to nearest even).
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_bf16_bits(float f);
float bf16_bits_to_f32(uint16_t h);
// Element i of a buffer of dtype t, as a double (integers as int64 first).
double element_value(DType t, const std::byte* base, size_t i);

// Host memory for every argument of a spec: for the cpu backend's calls,
// tests and the CLI. Keeps what it needs of the spec by value.
class HostArgs {
 public:
  // Allocates every pointer argument (its size expression evaluated with the
  // scalars) and stores the scalars. Buffers start zeroed. Throws
  // Error(Errc::usage) for a negative or overflowing size.
  HostArgs(const KernelSpec& spec, const std::vector<ScalarValue>& scalars);
  HostArgs(HostArgs&&) noexcept;
  HostArgs& operator=(HostArgs&&) noexcept;
  ~HostArgs();

  HostArgs(const HostArgs&) = delete;
  HostArgs& operator=(const HostArgs&) = delete;

  void* const* params() const { return params_.data(); }
  size_t count() const { return params_.size(); }
  std::span<std::byte> buffer(size_t arg);  // empty for scalars
  int64_t elements(size_t arg) const { return elements_[arg]; }
  // Fills the buffers of `in` and `inout` arguments with seeded random values
  // (floats in [-1, 1), integers in [-100, 100]).
  void fill_random(uint64_t seed);
  // Copies every buffer from `other` (same spec and sizes).
  void copy_buffers_from(const HostArgs& other);

 private:
  struct Arg {
    DType dtype;
    Intent intent;
    bool pointer;
  };
  std::vector<Arg> args_;
  std::vector<void*> buffers_;       // per arg: the buffer, or nullptr
  std::vector<int64_t> elements_;    // per arg: element count, or 0
  std::vector<uint64_t> scalar_;     // per arg: scalar storage
  std::vector<void*> params_;        // per arg: &buffers_[i] or &scalar_[i]
};

// Fills `bytes` of dtype `t` with seeded random values: uniform in [-1, 1)
// (integers in [-100, 100]); with `wide`, floats of a large dynamic range,
// +-2^e * (1 + f) with e uniform in [-8, 8) (so products span 2^32), which
// shows wrong accumulation or tolerances that a narrow range hides.
void fill_random(DType t, std::span<std::byte> bytes, uint64_t seed, bool wide = false);

}  // namespace kiln
