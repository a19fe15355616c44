// A program's inputs filled by the seeded generator that kiln/fill.hpp
// defines: fill_random, then the input's scale or constant.
#include "kiln/fill.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "compile/compile_pool.hpp"
#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/runtime.hpp"
#include "backends/cuda/fill_kernel.hpp"

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

InputFiller::InputFiller(Runtime& rt, const std::string& backend)
    : rt_(rt), backend_(backend), dev_(rt.device(backend)) {
  device_kernel_possible_ = !dev_.host_addressable() && backend == "cuda";
}

InputFiller::~InputFiller() = default;

void InputFiller::fill(const ProgramTensor& t, void* dst, size_t bytes, uint64_t seed, bool wide, Stream stream) {
  if (dev_.host_addressable()) {
    fill_input(t, std::span<std::byte>(static_cast<std::byte*>(dst), bytes), seed, wide);
    return;
  }
  if (wide || !device_kernel_possible_) {
    const std::vector<std::byte> host = filled_input(t, bytes, seed, wide);
    dev_.to_device(dst, host.data(), bytes, stream);
    dev_.sync(stream);  // the host staging is freed on return
    return;
  }
  if (!kernel_) {
    // Urgent: ahead of the compiles a program's handles queued. Where it cannot be
    // compiled or loaded, the fills are made on the host as before, and that is said once.
    try {
      const CompileRequest req = cuda_fill_request();
      std::shared_ptr<const Binary> bin =
          rt_.compile_pool(backend_).submit(req, make_binary_key(req, rt_.backend(backend_)).hex(), /*urgent=*/true).get();
      kernel_ = rt_.load(*bin);
      binary_ = bin;
      blocks_ = static_cast<int>(std::max<int64_t>(1, rt_.backend(backend_).limits().multiprocessors) * 8);
    } catch (const Error& e) {
      log::warn("inputs are filled on the host and copied: the fill kernel cannot run here ({})", e.what());
      device_kernel_possible_ = false;
      fill(t, dst, bytes, seed, wide, stream);
      return;
    }
  }
  long long n = static_cast<long long>(bytes / dtype_size(t.dtype));
  if (n == 0) return;
  unsigned long long s = seed;
  int dt = static_cast<int>(t.dtype), mode = t.constant ? 2 : t.scale != 1 ? 1 : 0;
  double c = t.constant ? *t.constant : t.scale;
  void* out = dst;
  void* params[] = {&out, &n, &s, &dt, &mode, &c};
  LaunchDims d;
  constexpr int64_t kThreads = 256;
  d.grid.x = std::min<int64_t>(blocks_, (n + kThreads - 1) / kThreads);
  d.block.x = kThreads;
  d.nargs = 6;
  kernel_->launch(params, d, stream);
}

}  // namespace kiln
