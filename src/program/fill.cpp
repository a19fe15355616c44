// A program's inputs filled by the seeded generator that kiln/fill.hpp
// defines: fill_random, then the input's scale or constant.
#include "kiln/fill.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "core/format.hpp"
#include "kiln/args.hpp"

namespace kiln {

namespace {

// The input's scale or constant over values fill_random wrote.
void scale_fill(const ProgramTensor& t, std::span<std::byte> host) {
  if (t.scale == 1 && !t.constant) return;
  const size_t size = dtype_size(t.dtype), n = host.size() / size;
  auto scaled = [&](double v) { return t.constant ? *t.constant : v * t.scale; };
  for (size_t i = 0; i < n; ++i) {
    std::byte* p = host.data() + i * size;
    switch (t.dtype) {
      case DType::f32: { float v; std::memcpy(&v, p, 4); v = static_cast<float>(scaled(v)); std::memcpy(p, &v, 4); break; }
      case DType::f64: { double v; std::memcpy(&v, p, 8); v = scaled(v); std::memcpy(p, &v, 8); break; }
      case DType::f16: case DType::bf16: {
        uint16_t h; std::memcpy(&h, p, 2);
        const bool f16 = t.dtype == DType::f16;
        const float v = static_cast<float>(scaled(f16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h)));
        h = f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::i32: { int32_t v; std::memcpy(&v, p, 4); v = static_cast<int32_t>(scaled(v)); std::memcpy(p, &v, 4); break; }
      case DType::i64: { int64_t v; std::memcpy(&v, p, 8); v = static_cast<int64_t>(scaled(static_cast<double>(v))); std::memcpy(p, &v, 8); break; }
    }
  }
}

}  // namespace

// In chunks on every core: the same values as one pass, since the
// generator's state after j draws is seed + j times its increment.
void fill_input(const ProgramTensor& t, std::span<std::byte> host, uint64_t seed, bool wide) {
  const size_t size = dtype_size(t.dtype), n = host.size() / size;
  constexpr size_t kChunk = size_t{1} << 22;  // elements
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c; (c = next.fetch_add(1)) < chunks;) {
      const size_t from = c * kChunk, count = std::min(kChunk, n - from);
      std::span<std::byte> span(host.data() + from * size, count * size);
      fill_random(t.dtype, span, seed + static_cast<uint64_t>(from) * 0x9e3779b97f4a7c15ULL, wide);
      scale_fill(t, span);
    }
  };
  const size_t threads = std::min<size_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
}

std::vector<std::byte> filled_input(const ProgramTensor& t, size_t bytes, uint64_t seed, bool wide) {
  std::vector<std::byte> host;
  try {
    host.resize(bytes);
  } catch (const std::bad_alloc&) {
    fail(Errc::io, "cannot allocate {} bytes of host memory to fill input '{}'", bytes, t.name);
  }
  fill_input(t, host, seed, wide);
  return host;
}

}  // namespace kiln
