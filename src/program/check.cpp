// A program's result against its reference program. docs/program.md.
#include "program/check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/format.hpp"
#include "kiln/args.hpp"
#include "kiln/device_args.hpp"
#include "kiln/ext/tuner.hpp"
#include "kiln/runtime.hpp"

namespace kiln {

namespace {

bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

// Element i of a buffer of dtype t, as a double (integers as int64 first).
double get(DType t, const std::byte* base, size_t i) {
  switch (t) {
    case DType::f32: {
      float v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, base + 8 * i, 8);
      return v;
    }
    case DType::f16:
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return t == DType::f16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, base + 8 * i, 8);
      return static_cast<double>(v);
    }
  }
  return 0;
}

int64_t get_int(DType t, const std::byte* base, size_t i) {
  if (t == DType::i32) {
    int32_t v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, base + 8 * i, 8);
  return v;
}

// Element i of a buffer of dtype t from `from` (of dtype `from_t`) element j:
// floats converted through double (f16 and bf16 rounded to nearest even),
// integers copied exactly.
void convert(DType t, std::byte* base, size_t i, DType from_t, const std::byte* from, size_t j) {
  if (is_integer(t) && is_integer(from_t)) {
    const int64_t v = get_int(from_t, from, j);
    if (t == DType::i32) {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(base + 4 * i, &x, 4);
    } else {
      std::memcpy(base + 8 * i, &v, 8);
    }
    return;
  }
  const double v = get(from_t, from, j);
  switch (t) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(base + 4 * i, &f, 4);
      return;
    }
    case DType::f64: std::memcpy(base + 8 * i, &v, 8); return;
    case DType::f16:
    case DType::bf16: {
      const uint16_t h = t == DType::f16 ? f32_to_f16_bits(static_cast<float>(v)) : f32_to_bf16_bits(static_cast<float>(v));
      std::memcpy(base + 2 * i, &h, 2);
      return;
    }
    case DType::i32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(base + 4 * i, &x, 4);
      return;
    }
    case DType::i64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(base + 8 * i, &x, 8);
      return;
    }
  }
}

// At most `max` of the rows 0 .. n-1, spread evenly, the first and the last among them.
std::vector<int64_t> spread_rows(int64_t n, int64_t max) {
  std::vector<int64_t> rows;
  if (max == 1) return {0};
  for (int64_t k = 0; k < max; ++k) {
    const int64_t r = static_cast<int64_t>((static_cast<long double>(k) * (n - 1)) / (max - 1) + 0.5L);
    if (rows.empty() || rows.back() != r) rows.push_back(r);
  }
  return rows;
}

std::string index_text(const std::string& name, const std::vector<int64_t>& dims, size_t flat, int64_t row) {
  std::vector<int64_t> idx(dims.size(), 0);
  size_t rest = flat;
  for (size_t d = dims.size(); d-- > 0;) {
    const auto extent = static_cast<size_t>(std::max<int64_t>(1, dims[d]));
    idx[d] = static_cast<int64_t>(rest % extent);
    rest /= extent;
  }
  if (!idx.empty() && row >= 0) idx[0] = row;
  std::string s = name + "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

int64_t product(const std::vector<int64_t>& dims, size_t from = 0) {
  int64_t n = 1;
  for (size_t d = from; d < dims.size(); ++d) n *= dims[d];
  return n;
}

}  // namespace

bool ProgramCheck::ok() const {
  if (outputs.empty()) return false;
  for (const auto& o : outputs)
    if (o.bad > 0) return false;
  return true;
}

std::string ProgramCheck::str() const {
  std::string s = fmt::format("check of program '{}' against its reference {} on {}:\n", program, reference, rows);
  for (const auto& o : outputs) {
    if (o.bad == 0)
      s += fmt::format("  {} ({}): {} elements, all within atol {:.3g} + rtol {:.3g}\n", o.name, dtype_name(o.dtype),
                       o.compared, o.atol, o.rtol);
    else
      s += fmt::format("  {} ({}): {} of {} elements outside atol {:.3g} + rtol {:.3g}; the worst, {}, by {:.4g}\n",
                       o.name, dtype_name(o.dtype), o.bad, o.compared, o.atol, o.rtol, o.worst, o.max_error);
  }
  s += ok() ? "check passed\n" : "check FAILED\n";
  return s;
}

ProgramCheck check_against_reference(Runtime& rt, const ProgramSpec& spec, const std::map<std::string, int64_t>& symbols,
                                     const std::vector<std::vector<std::byte>>& inputs,
                                     const std::vector<std::vector<std::byte>>& outputs) {
  const ProgramCheckSpec& cs = spec.check;
  ProgramSpec ref = load_program(cs.reference);
  ProgramCheck out;
  out.program = spec.name;
  out.reference = fmt::format("'{}' ({})", ref.name, cs.reference.filename().string());

  // The rows compared: all, or at most max_rows of the sampled symbol's.
  std::vector<int64_t> rows;
  if (!cs.sample.empty()) {
    const int64_t n = symbols.at(cs.sample);
    if (n > cs.max_rows) rows = spread_rows(n, cs.max_rows);
    if (rows.empty()) {
      out.rows = fmt::format("all {} rows of {}", n, cs.sample);
    } else {
      std::string list;
      for (size_t k = 0; k < rows.size(); ++k)
        if (k < 3 || k + 1 == rows.size()) list += fmt::format("{}{}", list.empty() ? "" : ", ", rows[k]);
        else if (k == 3) list += ", ...";
      out.rows = fmt::format("{} of the {} rows of {} ({})", rows.size(), n, cs.sample, list);
    }
  } else {
    out.rows = "every element";
  }
  auto sampled = [&](const ProgramTensor& t) {
    return !rows.empty() && !t.shape.empty() && t.shape[0].root().op == ExprOp::Var &&
           t.shape[0].root().name == cs.sample;
  };
  auto find = [](const std::vector<ProgramTensor>& ts, const std::string& name) -> size_t {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i].name == name) return i;
    return ts.size();
  };

  // The reference's inputs: the program's of the same names, their rows sampled, in the reference's dtypes.
  Device& rdev = rt.backend(ref.backend).device();
  std::vector<DeviceBuffer> held;
  held.reserve(ref.inputs.size() + ref.outputs.size());
  std::vector<Tensor> rin, rout;
  for (const auto& ri : ref.inputs) {
    const size_t pi = find(spec.inputs, ri.name);
    if (pi == spec.inputs.size())
      fail(Errc::usage, "the reference {} takes an input '{}', which program '{}' has not", out.reference, ri.name,
           spec.name);
    const ProgramTensor& pt = spec.inputs[pi];
    std::vector<int64_t> dims = spec.dims(pt, symbols);
    if (ri.shape.size() != dims.size())
      fail(Errc::usage, "the reference {} takes '{}' with {} dimensions; program '{}' has {}", out.reference, ri.name,
           ri.shape.size(), spec.name, dims.size());
    const int64_t row_elems = product(dims, 1);
    const bool sub = sampled(pt);
    std::vector<int64_t> rdims = dims;
    if (sub) rdims[0] = static_cast<int64_t>(rows.size());
    const int64_t n = product(rdims);
    std::vector<std::byte> host(buffer_bytes(ri.dtype, n, ri.name));
    const int64_t nrows = dims.empty() ? 1 : rdims[0];
    for (int64_t k = 0; k < nrows; ++k) {
      const int64_t r = sub ? rows[static_cast<size_t>(k)] : k;
      for (int64_t j = 0; j < (dims.empty() ? 1 : row_elems); ++j)
        convert(ri.dtype, host.data(), static_cast<size_t>(k * row_elems + j), pt.dtype, inputs[pi].data(),
                static_cast<size_t>(r * row_elems + j));
    }
    held.emplace_back(rdev, host.empty() ? 1 : host.size());
    if (!host.empty()) rdev.to_device(held.back().get(), host.data(), host.size(), nullptr);
    rin.push_back({held.back().get(), rdims});
  }
  ProgramOptions po;
  po.plain = true;
  Program rp(rt, ref, po);
  const std::map<std::string, int64_t> rsym = rp.bind(rin);
  std::vector<size_t> which;  // per reference output: the program's output of its name
  for (const auto& ro : ref.outputs) {
    const size_t pi = find(spec.outputs, ro.name);
    if (pi == spec.outputs.size())
      fail(Errc::usage, "the reference {} computes an output '{}', which program '{}' has not", out.reference,
           ro.name, spec.name);
    which.push_back(pi);
    const std::vector<int64_t> dims = ref.dims(ro, rsym);
    held.emplace_back(rdev, std::max<size_t>(1, buffer_bytes(ro.dtype, ref.elements(ro, rsym), ro.name)));
    rout.push_back({held.back().get(), dims});
  }
  rp.run(rin, rout, nullptr);
  rdev.sync(nullptr);

  // Each output of the reference against the program's, by tuning's tolerance rules.
  int64_t reduction = 0;
  if (cs.reduction) {
    KernelSpec scope;
    std::vector<int64_t> slots;
    for (const auto& [n, v] : spec.constants) scope.args.push_back(ArgSpec{}), scope.args.back().name = n, slots.push_back(v);
    for (const auto& [n, v] : symbols) scope.args.push_back(ArgSpec{}), scope.args.back().name = n, slots.push_back(v);
    reduction = compile_expr(scope, *cs.reduction, nullptr).eval(slots.data());
  }
  TuningSpec ts;
  ts.rtol = cs.rtol;
  ts.atol = cs.atol;
  for (size_t k = 0; k < ref.outputs.size(); ++k) {
    const ProgramTensor& ro = ref.outputs[k];
    const ProgramTensor& pt = spec.outputs[which[k]];
    const std::vector<int64_t> dims = spec.dims(pt, symbols);
    const bool sub = sampled(pt);
    std::vector<int64_t> want = dims;
    if (sub) want[0] = static_cast<int64_t>(rows.size());
    if (rout[k].shape != want)
      fail(Errc::usage, "the reference {} computes '{}' of another shape than program '{}' ({} elements against {})",
           out.reference, ro.name, spec.name, product(rout[k].shape), product(want));
    std::vector<std::byte> refh(buffer_bytes(ro.dtype, product(want), ro.name));
    if (!refh.empty()) rdev.to_host(refh.data(), rout[k].data, refh.size(), nullptr);
    rdev.sync(nullptr);
    const size_t n = static_cast<size_t>(product(want));
    const int64_t row_elems = dims.empty() ? 1 : product(dims, 1);
    double max_ref = 0;
    for (size_t i = 0; i < n; ++i) {
      const double r = get(ro.dtype, refh.data(), i);
      if (std::isfinite(r)) max_ref = std::max(max_ref, std::abs(r));
    }
    const Tuner::Tolerance tol = Tuner::tolerance(pt.dtype, ts, reduction, max_ref);
    ProgramCheck::Output o;
    o.name = pt.name;
    o.dtype = pt.dtype;
    o.compared = n;
    o.rtol = tol.rtol;
    o.atol = tol.atol;
    size_t worst_i = 0;
    double worst = -1, worst_got = 0, worst_ref = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t row = row_elems > 0 ? static_cast<int64_t>(i) / row_elems : 0;
      const size_t at = sub ? static_cast<size_t>(rows[static_cast<size_t>(row)] * row_elems +
                                                  static_cast<int64_t>(i) % row_elems)
                            : i;
      const double g = get(pt.dtype, outputs[which[k]].data(), at), r = get(ro.dtype, refh.data(), i);
      if (std::isnan(g) && std::isnan(r)) continue;
      const double err = (std::isnan(g) || std::isnan(r)) ? INFINITY : std::abs(g - r);
      if (err <= tol.atol + tol.rtol * std::abs(r)) continue;
      ++o.bad;
      if (err > worst) worst = err, worst_i = i, worst_got = g, worst_ref = r;
    }
    if (o.bad) {
      o.max_error = worst;
      const int64_t row = row_elems > 0 ? static_cast<int64_t>(worst_i) / row_elems : 0;
      o.worst = fmt::format("{} = {:.6g} where the reference has {:.6g}",
                            index_text(pt.name, dims, worst_i, sub ? rows[static_cast<size_t>(row)] : -1), worst_got,
                            worst_ref);
    }
    out.outputs.push_back(std::move(o));
  }
  return out;
}

}  // namespace kiln
