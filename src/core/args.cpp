#include "kiln/args.hpp"

#include <charconv>
#include <cstdlib>
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
      char* end = nullptr;
      out[i].f = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0') fail(Errc::usage, "{}={}: not a number", name, text);
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

CompiledExpr compile_expr(const KernelSpec& spec, const Expr& e, const Config* config) {
  return CompiledExpr::compile(e, [&](std::string_view sym) -> std::optional<SymbolBinding> {
    int i = spec.arg_index(sym);
    if (i >= 0 && !spec.args[i].pointer && !dtype_is_float(spec.args[i].dtype)) return SymbolBinding::slot(i);
    if (config)
      if (auto v = config->get(sym)) return SymbolBinding::constant(*v);
    return std::nullopt;
  });
}

void read_int_slots(const KernelSpec& spec, void* const* params, int64_t* slots) {
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const ArgSpec& a = spec.args[i];
    if (a.pointer) continue;
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

void fill_random(DType t, std::span<std::byte> bytes, uint64_t seed) {
  uint64_t s = seed;
  size_t n = bytes.size() / dtype_size(t);
  void* p = bytes.data();
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = splitmix64(s);
    double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    switch (t) {
      case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(2 * u - 1); break;
      case DType::f64: static_cast<double*>(p)[i] = 2 * u - 1; break;
      case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(r % 201) - 100; break;
      case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(r % 201) - 100; break;
    }
  }
}

HostArgs::HostArgs(const KernelSpec& spec, const std::vector<ScalarValue>& scalars)
    : spec_(&spec) {
  size_t n = spec.args.size();
  if (scalars.size() != n) fail(Errc::internal, "HostArgs: {} scalar slots for {} args", scalars.size(), n);
  buffers_.assign(n, nullptr);
  elements_.assign(n, 0);
  scalar_.assign(n, 0);
  params_.assign(n, nullptr);
  std::vector<int64_t> slots(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (!spec.args[i].pointer) slots[i] = scalars[i].i;
  try {
    for (size_t i = 0; i < n; ++i) {
      const ArgSpec& a = spec.args[i];
      if (a.pointer) {
        int64_t count = compile_expr(spec, a.size, nullptr).eval(slots.data());
        if (count < 0)
          fail(Errc::usage, "kernel '{}': argument '{}' has size {} = {} (negative)", spec.name, a.name,
               a.size.str(), count);
        size_t bytes = static_cast<size_t>(count) * dtype_size(a.dtype);
        size_t alloc = (bytes + 63) / 64 * 64;
        if (alloc == 0) alloc = 64;
        buffers_[i] = std::aligned_alloc(64, alloc);
        if (!buffers_[i]) fail(Errc::io, "kernel '{}': cannot allocate {} bytes for '{}'", spec.name, bytes, a.name);
        std::memset(buffers_[i], 0, alloc);
        elements_[i] = count;
        params_[i] = &buffers_[i];
      } else {
        switch (a.dtype) {
          case DType::f32: { float v = static_cast<float>(scalars[i].f); std::memcpy(&scalar_[i], &v, sizeof v); break; }
          case DType::f64: std::memcpy(&scalar_[i], &scalars[i].f, sizeof(double)); break;
          case DType::i32: { int32_t v = static_cast<int32_t>(scalars[i].i); std::memcpy(&scalar_[i], &v, sizeof v); break; }
          case DType::i64: std::memcpy(&scalar_[i], &scalars[i].i, sizeof(int64_t)); break;
        }
        params_[i] = &scalar_[i];
      }
    }
  } catch (...) {
    for (void* b : buffers_) std::free(b);
    throw;
  }
}

HostArgs::HostArgs(HostArgs&& o) noexcept
    : spec_(o.spec_), buffers_(std::move(o.buffers_)), elements_(std::move(o.elements_)),
      scalar_(std::move(o.scalar_)), params_(std::move(o.params_)) {
  // Pointers into the moved vectors stay valid: vector moves keep their storage.
  o.buffers_.clear();
}

HostArgs& HostArgs::operator=(HostArgs&& o) noexcept {
  if (this != &o) {
    for (void* b : buffers_) std::free(b);
    spec_ = o.spec_;
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
  return {static_cast<std::byte*>(buffers_[arg]),
          static_cast<size_t>(elements_[arg]) * dtype_size(spec_->args[arg].dtype)};
}

void HostArgs::fill_random(uint64_t seed) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!buffers_[i] || spec_->args[i].intent == Intent::out) continue;
    kiln::fill_random(spec_->args[i].dtype, buffer(i), seed + 0x1000 * (i + 1));
  }
}

void HostArgs::copy_buffers_from(const HostArgs& other) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!buffers_[i]) continue;
    if (other.elements_[i] != elements_[i]) fail(Errc::internal, "HostArgs::copy_buffers_from: size mismatch");
    std::memcpy(buffers_[i], other.buffers_[i], static_cast<size_t>(elements_[i]) * dtype_size(spec_->args[i].dtype));
  }
}

}  // namespace kiln
