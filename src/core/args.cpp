#include "kiln/args.hpp"
#include "kiln/device.hpp"

#include <charconv>
#include <cstdlib>
#include <cmath>
#include <cstring>

#include "core/format.hpp"

namespace kiln {

std::vector<ScalarValue> parse_scalars(const KernelSpec& spec,
                                       const std::vector<std::pair<std::string, std::string>>& sets) {
  std::vector<ScalarValue> out(spec.args.size());
  std::vector<bool> given(spec.args.size(), false);
  for (const auto& [name, text] : sets) {
    int i = spec.arg_index(name);
    if (i < 0) {
      std::string scalars;
      for (const auto& a : spec.args)
        if (!a.pointer) scalars += (scalars.empty() ? "" : ", ") + a.name;
      fail(Errc::usage, "kernel '{}' has no argument '{}' (its scalars: {})", spec.name, name, scalars);
    }
    const ArgSpec& a = spec.args[i];
    if (a.pointer) fail(Errc::usage, "'{}' is a buffer ({}); only scalars take a value", name, a.type_text());
    if (given[i]) fail(Errc::usage, "'{}' is set twice", name);
    given[i] = true;
    if (dtype_is_float(a.dtype)) {
      double v = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || p != text.data() + text.size() || !std::isfinite(v))
        fail(Errc::usage, "{}={}: not a finite decimal number", name, text);
      out[i].f = v;
    } else {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || p != text.data() + text.size())
        fail(Errc::usage, "{}={}: not a whole number", name, text);
      if (a.dtype == DType::i32 && (v < INT32_MIN || v > INT32_MAX))
        fail(Errc::usage, "{}={}: out of range for i32", name, text);
      out[i].i = v;
    }
  }
  std::string missing;
  for (size_t i = 0; i < spec.args.size(); ++i)
    if (!spec.args[i].pointer && !given[i]) missing += (missing.empty() ? "" : ", ") + spec.args[i].name;
  if (!missing.empty())
    fail(Errc::usage, "kernel '{}' needs a value for each scalar: missing {} (pass --set NAME=VALUE)", spec.name,
         missing);
  return out;
}

CompiledExpr compile_expr(const KernelSpec& spec, const Expr& e, const Config* config, const LaunchLimits* device) {
  return CompiledExpr::compile(e, [&](std::string_view sym) -> std::optional<SymbolBinding> {
    int i = spec.arg_index(sym);
    if (i >= 0 && !spec.args[i].pointer && !dtype_is_float(spec.args[i].dtype)) return SymbolBinding::slot(i);
    // (A kernel spec refuses SM_COUNT as a name; a program's scope may have a symbol of that name, found above.)
    if (sym == kSmCountSymbol) {
      if (!device || device->multiprocessors < 1)
        fail(Errc::usage, "kernel '{}': '{}' uses SM_COUNT, which only a launch on a known device has", spec.name,
             e.str());
      return SymbolBinding::constant(device->multiprocessors);
    }
    if (auto v = spec.constant(sym)) return SymbolBinding::constant(*v);
    // align_X reads buffer X's slot, which holds its alignment (read_int_slots).
    if (std::string_view t = align_target(sym); !t.empty()) {
      int p = spec.arg_index(t);
      if (p >= 0 && spec.args[p].pointer) return SymbolBinding::slot(p);
    }
    if (config)
      if (auto v = config->get(sym)) return SymbolBinding::constant(*v);
    return std::nullopt;
  });
}

int64_t pointer_alignment(const void* p) {
  auto v = reinterpret_cast<uint64_t>(p);
  if (v == 0) return 256;
  uint64_t low = v & (~v + 1);
  return low > 256 ? 256 : static_cast<int64_t>(low);
}

void read_int_slots(const KernelSpec& spec, void* const* params, int64_t* slots) {
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const ArgSpec& a = spec.args[i];
    if (a.pointer) {
      slots[i] = pointer_alignment(*static_cast<void* const*>(params[i]));
      continue;
    }
    if (a.dtype == DType::i64) slots[i] = *static_cast<const int64_t*>(params[i]);
    else if (a.dtype == DType::i32) slots[i] = *static_cast<const int32_t*>(params[i]);
  }
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

size_t buffer_bytes(DType t, int64_t elements, const std::string& what) {
  size_t bytes = 0;
  if (elements < 0) fail(Errc::usage, "{}: {} elements (negative)", what, elements);
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements), dtype_size(t), &bytes) ||
      bytes > (uint64_t{1} << 56))
    fail(Errc::usage, "{}: {} elements of {} do not fit in memory (the byte count overflows)", what, elements,
         dtype_name(t));
  return bytes;
}

std::vector<int64_t> buffer_elements(const KernelSpec& spec, const int64_t* slots) {
  std::vector<int64_t> out(spec.args.size(), 0);
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const ArgSpec& a = spec.args[i];
    if (!a.pointer) continue;
    try {
      out[i] = compile_expr(spec, a.size, nullptr).eval(slots);
    } catch (const Error& e) {  // the call's values overflow it, say: theirs to mend
      if (e.code() != Errc::expr) throw;
      fail(Errc::usage, "kernel '{}': the size of argument '{}' at this call: {}", spec.name, a.name, e.what());
    }
    if (out[i] < 0)
      fail(Errc::usage, "kernel '{}': argument '{}' has size {} = {} (negative)", spec.name, a.name, a.size.str(),
           out[i]);
    buffer_bytes(a.dtype, out[i], fmt::format("kernel '{}': argument '{}'", spec.name, a.name));
  }
  return out;
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while (!(mant & 0x400));
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000 | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t f32_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN stays NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {
// Element i of an array of T at base, read without assuming its alignment.
template <typename T>
T load(const std::byte* base, size_t i) {
  T v;
  std::memcpy(&v, base + sizeof(T) * i, sizeof(T));
  return v;
}
}  // namespace

double element_value(DType t, const std::byte* base, size_t i) {
  switch (t) {
    case DType::f32: return load<float>(base, i);
    case DType::f64: return load<double>(base, i);
    case DType::f16: return f16_bits_to_f32(load<uint16_t>(base, i));
    case DType::bf16: return bf16_bits_to_f32(load<uint16_t>(base, i));
    case DType::i32: return load<int32_t>(base, i);
    case DType::i64: return static_cast<double>(load<int64_t>(base, i));
  }
  return 0;
}

void fill_random(DType t, std::span<std::byte> bytes, uint64_t seed, bool wide) {
  uint64_t s = seed;
  size_t n = bytes.size() / dtype_size(t);
  void* p = bytes.data();
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = splitmix64(s);
    double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    if (wide) {
      // Sign from one bit, exponent from five, mantissa from the rest.
      double v = std::ldexp(1.0 + static_cast<double>((r >> 16) & 0xFFFF) / 65536.0,
                            static_cast<int>((r >> 1) & 15) - 8);
      u = (r & 1) ? (1 - v) / 2 : (1 + v) / 2;  // so that 2u - 1 = +-v
    }
    switch (t) {
      case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(2 * u - 1); break;
      case DType::f64: static_cast<double*>(p)[i] = 2 * u - 1; break;
      case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(r % 201) - 100; break;
      case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(r % 201) - 100; break;
      case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(static_cast<float>(2 * u - 1)); break;
      case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(static_cast<float>(2 * u - 1)); break;
    }
  }
}

namespace {
// A scalar's bits, as the kernel takes it (params point to these).
uint64_t scalar_bits(DType t, const ScalarValue& v) {
  uint64_t out = 0;
  switch (t) {
    case DType::f32: { float f = static_cast<float>(v.f); std::memcpy(&out, &f, sizeof f); break; }
    case DType::f64: std::memcpy(&out, &v.f, sizeof(double)); break;
    case DType::i32: { int32_t x = static_cast<int32_t>(v.i); std::memcpy(&out, &x, sizeof x); break; }
    case DType::i64: std::memcpy(&out, &v.i, sizeof(int64_t)); break;
    case DType::f16: { uint16_t h = f32_to_f16_bits(static_cast<float>(v.f)); std::memcpy(&out, &h, 2); break; }
    case DType::bf16: { uint16_t h = f32_to_bf16_bits(static_cast<float>(v.f)); std::memcpy(&out, &h, 2); break; }
  }
  return out;
}
}  // namespace

HostArgs::HostArgs(const KernelSpec& spec, const std::vector<ScalarValue>& scalars) {
  size_t n = spec.args.size();
  if (scalars.size() != n) fail(Errc::internal, "HostArgs: {} scalar slots for {} args", scalars.size(), n);
  for (const auto& a : spec.args) args_.push_back({a.dtype, a.intent, a.pointer});
  buffers_.assign(n, nullptr);
  elements_.assign(n, 0);
  scalar_.assign(n, 0);
  params_.assign(n, nullptr);
  std::vector<int64_t> slots(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (!spec.args[i].pointer) slots[i] = scalars[i].i;
  const std::vector<int64_t> counts = buffer_elements(spec, slots.data());
  try {
    for (size_t i = 0; i < n; ++i) {
      const ArgSpec& a = spec.args[i];
      if (a.pointer) {
        const int64_t count = counts[i];
        const size_t bytes = static_cast<size_t>(count) * dtype_size(a.dtype);  // checked by buffer_elements
        size_t alloc = (bytes + 63) / 64 * 64;
        if (alloc == 0) alloc = 64;
        buffers_[i] = std::aligned_alloc(64, alloc);
        if (!buffers_[i]) fail(Errc::io, "kernel '{}': cannot allocate {} bytes for '{}'", spec.name, bytes, a.name);
        std::memset(buffers_[i], 0, alloc);
        elements_[i] = count;
        params_[i] = &buffers_[i];
      } else {
        scalar_[i] = scalar_bits(a.dtype, scalars[i]);
        params_[i] = &scalar_[i];
      }
    }
  } catch (...) {
    for (void* b : buffers_) std::free(b);
    throw;
  }
}

HostArgs::HostArgs(HostArgs&& o) noexcept
    : args_(std::move(o.args_)), buffers_(std::move(o.buffers_)), elements_(std::move(o.elements_)),
      scalar_(std::move(o.scalar_)), params_(std::move(o.params_)) {
  // Pointers into the moved vectors stay valid: vector moves keep their storage.
  o.buffers_.clear();
}

HostArgs& HostArgs::operator=(HostArgs&& o) noexcept {
  if (this != &o) {
    for (void* b : buffers_) std::free(b);
    args_ = std::move(o.args_);
    buffers_ = std::move(o.buffers_);
    elements_ = std::move(o.elements_);
    scalar_ = std::move(o.scalar_);
    params_ = std::move(o.params_);
    o.buffers_.clear();
  }
  return *this;
}

HostArgs::~HostArgs() {
  for (void* b : buffers_) std::free(b);
}

std::span<std::byte> HostArgs::buffer(size_t arg) {
  if (!buffers_[arg]) return {};
  return {static_cast<std::byte*>(buffers_[arg]), static_cast<size_t>(elements_[arg]) * dtype_size(args_[arg].dtype)};
}

void HostArgs::fill_random(uint64_t seed) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!buffers_[i] || args_[i].intent == Intent::out) continue;
    kiln::fill_random(args_[i].dtype, buffer(i), seed + 0x1000 * (i + 1));
  }
}

void HostArgs::copy_buffers_from(const HostArgs& other) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!buffers_[i]) continue;
    if (other.elements_[i] != elements_[i]) fail(Errc::internal, "HostArgs::copy_buffers_from: size mismatch");
    std::memcpy(buffers_[i], other.buffers_[i], static_cast<size_t>(elements_[i]) * dtype_size(args_[i].dtype));
  }
}

}  // namespace kiln
