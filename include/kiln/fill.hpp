// How kiln fills a program's inputs when it makes them itself (kiln run,
// kiln pack, bench/model_logits): a seeded, counter-based generator, so that
// any other implementation (a framework's reference model) can make the same
// values from the seed alone, in any order and in parallel.
//
// Element j (0-based, over the whole buffer in row-major order) of a buffer
// filled with seed s:
//   r = mix(s + (j + 1) * 0x9e3779b97f4a7c15)           (64-bit, wrapping)
//   mix(z): z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
//           z ^ (z >> 31)                                 (splitmix64's finaliser)
//   u = (r >> 11) * 2^-53                                 (a double in [0, 1))
//   v = the dtype's value nearest float(2u - 1)           (round to nearest even; f64: 2u - 1)
// Then an input's `fill`:
//   f32, f16, bf16: with { scale = c }, the dtype's value nearest float(double(v) * c);
//                   with { constant = c }, the dtype's value nearest float(c)
//   f64:            v * c, or c
//   i32, i64:       v = r % 201 - 100 (unsigned r); with a scale, v * c truncated toward zero;
//                   with a constant, c truncated toward zero
// Input number i (0-based, in the program's order) of a run with seed s is
// filled with seed input_seed(s, i).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/program_spec.hpp"

namespace kiln {

// The seed of a program's input number `index` in a run with seed `run_seed`.
constexpr uint64_t input_seed(uint64_t run_seed, size_t index) { return run_seed + 977 * (index + 1); }

// Fills `host` (the input's bytes) as above, on every core for a large
// input (a model's 15 GiB in seconds). `wide` (kiln run --inputs wide)
// draws v as fill_random's wide values do, before the scale.
void fill_input(const ProgramTensor& t, std::span<std::byte> host, uint64_t seed, bool wide = false);
// The same into `bytes` of host memory it allocates: Error(Errc::io) naming the
// input and the size when the memory cannot be had.
std::vector<std::byte> filled_input(const ProgramTensor& t, size_t bytes, uint64_t seed, bool wide = false);

class Runtime;
class LoadedKernel;
struct Binary;

// Fills inputs in a backend's own memory with the same values, bit for bit:
// on the cpu in place; on the cuda backend by a kernel compiled once (through
// the code cache) and launched on the stream, with no host staging, so a
// model's 16 GB of weights take milliseconds, not a host fill and a copy.
// `wide` fills (kiln run --inputs wide) are made on the host and copied.
class InputFiller {
 public:
  InputFiller(Runtime& rt, const std::string& backend);
  ~InputFiller();
  InputFiller(const InputFiller&) = delete;
  InputFiller& operator=(const InputFiller&) = delete;
  // Fills `bytes` of the backend's memory at `dst`, as fill_input fills host
  // memory. Asynchronous on a GPU stream: synchronise before reading on the host.
  void fill(const ProgramTensor& t, void* dst, size_t bytes, uint64_t seed, bool wide = false,
            Stream stream = nullptr);
  // Whether fills (but wide ones) run as a kernel on the device (false: on the host).
  bool on_device() const { return device_kernel_possible_; }
  // The fill kernel's binary once a device fill has run (nullptr before, or on the
  // host): kiln pack ships it, so that an application filling with it compiles nothing.
  std::shared_ptr<const Binary> binary() const { return binary_; }

 private:
  Runtime& rt_;
  std::string backend_;
  Device& dev_;
  bool device_kernel_possible_ = false;
  std::shared_ptr<LoadedKernel> kernel_;  // compiled at the first device fill
  std::shared_ptr<const Binary> binary_;
  int blocks_ = 0;
};

}  // namespace kiln
