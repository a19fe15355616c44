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
  const double v = element_value(from_t, from, j);
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

namespace {

size_t find_tensor(const std::vector<ProgramTensor>& ts, const std::string& name) {
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].name == name) return i;
  return ts.size();
}

// The rows compared: all (empty), or at most max_rows of the sampled
// symbol's, spread over them; `text` says which.
std::vector<int64_t> rows_compared(const ProgramCheckSpec& cs, const std::map<std::string, int64_t>& symbols,
                                   std::string* text) {
  if (cs.sample.empty()) {
    *text = "every element";
    return {};
  }
  std::vector<int64_t> rows;
  const int64_t n = symbols.at(cs.sample);
  if (n > cs.max_rows) rows = spread_rows(n, cs.max_rows);
  if (rows.empty()) {
    *text = fmt::format("all {} rows of {}", n, cs.sample);
    return rows;
  }
  std::string list;
  for (size_t k = 0; k < rows.size(); ++k)
    if (k < 3 || k + 1 == rows.size()) list += fmt::format("{}{}", list.empty() ? "" : ", ", rows[k]);
    else if (k == 3) list += ", ...";
  *text = fmt::format("{} of the {} rows of {} ({})", rows.size(), n, cs.sample, list);
  return rows;
}

// One run of the reference program on the program's inputs (their rows
// sampled, in the reference's dtypes), and its outputs compared with the
// program's by the tuning's tolerance rules.
class ReferenceRun {
 public:
  ReferenceRun(Runtime& rt, const ProgramSpec& spec, const std::map<std::string, int64_t>& symbols, ProgramCheck& out)
      : rt_(rt), spec_(spec), ref_(load_program(spec.check.reference)), symbols_(symbols), out_(out),
        dev_(rt.backend(ref_.backend).device()) {
    out.program = spec.name;
    out.reference = fmt::format("'{}' ({})", ref_.name, spec.check.reference.filename().string());
    rows_ = rows_compared(spec.check, symbols, &out.rows);
    held_.reserve(ref_.inputs.size() + ref_.outputs.size());
  }

  void run(const std::vector<std::vector<std::byte>>& inputs) {
    for (const auto& t : spec_.inputs)
      if (t.state && !rows_.empty())
        fail(Errc::usage, "program '{}': input '{}' is state, and the check samples rows of {}: the reference's "
             "state would be written at other rows (leave [check] sample out of a program with state)",
             spec_.name, t.name, spec_.check.sample);
    for (const auto& ri : ref_.inputs) rin_.push_back(input(ri, inputs));
    ProgramOptions po;
    po.plain = true;
    Program rp(rt_, ref_, po);
    std::vector<int64_t> rscalars;
    for (const auto& n : ref_.scalars) {
      auto it = symbols_.find(n);
      if (it == symbols_.end())
        fail(Errc::usage, "the reference {} takes a scalar '{}', which program '{}' has not", out_.reference, n,
             spec_.name);
      rscalars.push_back(it->second);
    }
    const std::map<std::string, int64_t> rsym = rp.bind(rin_, rscalars);
    for (const auto& ro : ref_.outputs) {
      const size_t pi = find_tensor(spec_.outputs, ro.name);
      if (pi == spec_.outputs.size())
        fail(Errc::usage, "the reference {} computes an output '{}', which program '{}' has not", out_.reference,
             ro.name, spec_.name);
      which_.push_back(pi);
      const std::vector<int64_t> dims = ref_.dims(ro, rsym);
      held_.emplace_back(dev_, std::max<size_t>(1, buffer_bytes(ro.dtype, ref_.elements(ro, rsym), ro.name)));
      rout_.push_back({held_.back().get(), dims});
    }
    rp.run(rin_, rout_, nullptr, rscalars);
    dev_.sync(nullptr);
  }

  void compare(const std::vector<std::vector<std::byte>>& outputs, const std::vector<std::vector<std::byte>>& state) {
    TuningSpec ts;
    ts.rtol = spec_.check.rtol;
    ts.atol = spec_.check.atol;
    const int64_t reduction = reduction_length();
    for (size_t k = 0; k < ref_.outputs.size(); ++k)
      out_.outputs.push_back(compare_one(ref_.outputs[k], spec_.outputs[which_[k]], rout_[k], outputs[which_[k]], ts,
                                         reduction));
    // State both update in place: compared as each call left it.
    for (size_t k = 0; k < ref_.inputs.size(); ++k) {
      const size_t pi = find_tensor(spec_.inputs, ref_.inputs[k].name);
      if (!ref_.inputs[k].state || pi >= spec_.inputs.size() || !spec_.inputs[pi].state || pi >= state.size()) continue;
      out_.outputs.push_back(compare_one(ref_.inputs[k], spec_.inputs[pi], rin_[k], state[pi], ts, reduction));
    }
  }

 private:
  bool sampled(const ProgramTensor& t) const {
    return !rows_.empty() && !t.shape.empty() && t.shape[0].root().op == ExprOp::Var &&
           t.shape[0].root().name == spec_.check.sample;
  }

  // The reference's input `ri`: the program's of the same name, converted, on the reference's device.
  Tensor input(const ProgramTensor& ri, const std::vector<std::vector<std::byte>>& inputs) {
    const size_t pi = find_tensor(spec_.inputs, ri.name);
    if (pi == spec_.inputs.size())
      fail(Errc::usage, "the reference {} takes an input '{}', which program '{}' has not", out_.reference, ri.name,
           spec_.name);
    const ProgramTensor& pt = spec_.inputs[pi];
    std::vector<int64_t> dims = spec_.dims(pt, symbols_);
    if (ri.shape.size() != dims.size())
      fail(Errc::usage, "the reference {} takes '{}' with {} dimensions; program '{}' has {}", out_.reference,
           ri.name, ri.shape.size(), spec_.name, dims.size());
    const int64_t row_elems = product(dims, 1);
    const bool sub = sampled(pt);
    std::vector<int64_t> rdims = dims;
    if (sub) rdims[0] = static_cast<int64_t>(rows_.size());
    std::vector<std::byte> host(buffer_bytes(ri.dtype, product(rdims), ri.name));
    const int64_t nrows = dims.empty() ? 1 : rdims[0];
    for (int64_t k = 0; k < nrows; ++k) {
      const int64_t r = sub ? rows_[static_cast<size_t>(k)] : k;
      for (int64_t j = 0; j < (dims.empty() ? 1 : row_elems); ++j)
        convert(ri.dtype, host.data(), static_cast<size_t>(k * row_elems + j), pt.dtype, inputs[pi].data(),
                static_cast<size_t>(r * row_elems + j));
    }
    held_.emplace_back(dev_, host.empty() ? 1 : host.size());
    if (!host.empty()) dev_.to_device(held_.back().get(), host.data(), host.size(), nullptr);
    return {held_.back().get(), rdims};
  }

  // The check's [check] reduction for these sizes (0: not given).
  int64_t reduction_length() const {
    if (!spec_.check.reduction) return 0;
    KernelSpec scope;
    std::vector<int64_t> slots;
    auto add = [&](const std::string& n, int64_t v) {
      scope.args.push_back(ArgSpec{});
      scope.args.back().name = n;
      slots.push_back(v);
    };
    for (const auto& [n, v] : spec_.constants) add(n, v);
    for (const auto& [n, v] : symbols_) add(n, v);
    return compile_expr(scope, *spec_.check.reduction, nullptr).eval(slots.data());
  }

  ProgramCheck::Output compare_one(const ProgramTensor& ro, const ProgramTensor& pt, const Tensor& computed,
                                   const std::vector<std::byte>& got, const TuningSpec& ts, int64_t reduction) {
    const std::vector<int64_t> dims = spec_.dims(pt, symbols_);
    const bool sub = sampled(pt);
    std::vector<int64_t> want = dims;
    if (sub) want[0] = static_cast<int64_t>(rows_.size());
    if (computed.shape != want)
      fail(Errc::usage, "the reference {} computes '{}' of another shape than program '{}' ({} elements against {})",
           out_.reference, ro.name, spec_.name, product(computed.shape), product(want));
    std::vector<std::byte> refh(buffer_bytes(ro.dtype, product(want), ro.name));
    if (!refh.empty()) dev_.to_host(refh.data(), computed.data, refh.size(), nullptr);
    dev_.sync(nullptr);
    const size_t n = static_cast<size_t>(product(want));
    const int64_t row_elems = dims.empty() ? 1 : product(dims, 1);
    double max_ref = 0;
    for (size_t i = 0; i < n; ++i) {
      const double r = element_value(ro.dtype, refh.data(), i);
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
    auto row_of = [&](size_t i) { return row_elems > 0 ? static_cast<int64_t>(i) / row_elems : 0; };
    for (size_t i = 0; i < n; ++i) {
      const size_t at = sub ? static_cast<size_t>(rows_[static_cast<size_t>(row_of(i))] * row_elems +
                                                  static_cast<int64_t>(i) % row_elems)
                            : i;
      const double g = element_value(pt.dtype, got.data(), at), r = element_value(ro.dtype, refh.data(), i);
      if (std::isnan(g) && std::isnan(r)) continue;
      if (g == r) continue;  // infinities of one sign agree
      const double err = !std::isfinite(g) || !std::isfinite(r) ? INFINITY : std::abs(g - r);
      if (std::isfinite(err) && err <= tol.atol + tol.rtol * std::abs(r)) continue;
      ++o.bad;
      if (err > worst) worst = err, worst_i = i, worst_got = g, worst_ref = r;
    }
    if (o.bad) {
      o.max_error = worst;
      o.worst = fmt::format("{} = {:.6g} where the reference has {:.6g}",
                            index_text(pt.name, dims, worst_i, sub ? rows_[static_cast<size_t>(row_of(worst_i))] : -1),
                            worst_got, worst_ref);
    }
    return o;
  }

  Runtime& rt_;
  const ProgramSpec& spec_;
  ProgramSpec ref_;
  const std::map<std::string, int64_t>& symbols_;
  ProgramCheck& out_;
  Device& dev_;
  std::vector<int64_t> rows_;
  std::vector<DeviceBuffer> held_;  // the reference's buffers
  std::vector<Tensor> rin_, rout_;
  std::vector<size_t> which_;  // per reference output: the program's output of its name
};

}  // namespace

ProgramCheck check_against_reference(Runtime& rt, const ProgramSpec& spec, const std::map<std::string, int64_t>& symbols,
                                     const std::vector<std::vector<std::byte>>& inputs,
                                     const std::vector<std::vector<std::byte>>& outputs,
                                     const std::vector<std::vector<std::byte>>& state) {
  ProgramCheck out;
  ReferenceRun r(rt, spec, symbols, out);
  r.run(inputs);
  r.compare(outputs, state);
  return out;
}

}  // namespace kiln
