// kiln emit: a program as C++ over libkiln, its steps unrolled. docs/program.md.
//
// What the emitted code does at a call is what Program::run does, checked
// the same way: the guards; every integer expression evaluated with kiln's
// semantics (floor division and modulo as Python's; division by zero and
// 64-bit overflow are errors, never undefined behaviour); every buffer's
// size; every i32 argument's range; each kernel argument's buffer holding
// what the kernel's spec says it reads or writes.
//
// Names: every name of the program is an identifier that is not a C++
// keyword (check_program), and reaches the C++ with a prefix of its own kind
// (s_ scalars, b_ buffers, k_ kernel handles); the emitter's own names end
// in '_' and take none of those prefixes, so the two never meet. Text from
// the program (its name, expressions, paths) is written into string
// literals escaped and into comments with anything unprintable replaced.
#include <cmath>
#include <limits>

#include "core/format.hpp"
#include "emit.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// A C++ string literal holding exactly `s`.
std::string literal(std::string_view s) {
  std::string o = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c >= 0x20 && c < 0x7f) {
      o += ch;
    } else {
      o += fmt::format("\\{:03o}", c);  // three octal digits: never runs into what follows
    }
  }
  return o + "\"";
}

// Text for a // comment: one line, printable ASCII.
std::string comment(std::string_view s) {
  std::string o;
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    o += c >= 0x20 && c < 0x7f ? ch : '?';
  }
  return o;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// An expression as C++ over int64_t values, through the checked helpers the
// emitted file defines (`what`: the literal naming the whole expression, for
// their errors). `var` gives the C++ name of a symbol.
std::string cpp_expr(const ExprNode& n, const std::string& what, const std::function<std::string(const std::string&)>& var) {
  auto k = [&](size_t i) { return cpp_expr(n.kids[i], what, var); };
  auto call = [&](const char* f) { return fmt::format("{}({}, {}, {})", f, k(0), k(1), what); };
  switch (n.op) {
    case ExprOp::Const: return fmt::format("int64_t{{{}}}", n.value);
    case ExprOp::Var: return var(n.name);
    case ExprOp::Neg: return fmt::format("kiln_neg_({}, {})", k(0), what);
    case ExprOp::Add: return call("kiln_add_");
    case ExprOp::Sub: return call("kiln_sub_");
    case ExprOp::Mul: return call("kiln_mul_");
    case ExprOp::FloorDiv: return call("kiln_floordiv_");
    case ExprOp::Mod: return call("kiln_mod_");
    case ExprOp::Cdiv: return call("kiln_cdiv_");
    case ExprOp::Lt: return "int64_t(" + k(0) + " < " + k(1) + ")";
    case ExprOp::Le: return "int64_t(" + k(0) + " <= " + k(1) + ")";
    case ExprOp::Gt: return "int64_t(" + k(0) + " > " + k(1) + ")";
    case ExprOp::Ge: return "int64_t(" + k(0) + " >= " + k(1) + ")";
    case ExprOp::Eq: return "int64_t(" + k(0) + " == " + k(1) + ")";
    case ExprOp::Ne: return "int64_t(" + k(0) + " != " + k(1) + ")";
    case ExprOp::Min:
    case ExprOp::Max: {  // one or more arguments
      std::vector<std::string> args;
      for (size_t i = 0; i < n.kids.size(); ++i) args.push_back(k(i));
      return fmt::format("std::{}<int64_t>({{{}}})", n.op == ExprOp::Min ? "min" : "max", join(args));
    }
    // Short-circuit, as kiln evaluates them: `B == 0 || N % B == 0` is safe.
    case ExprOp::And: return "int64_t(" + k(0) + " != 0 && " + k(1) + " != 0)";
    case ExprOp::Or: return "int64_t(" + k(0) + " != 0 || " + k(1) + " != 0)";
    default: throw Error(Errc::internal, fmt::format("kiln emit: no C++ for expression operator {}", static_cast<int>(n.op)));
  }
}

const char* cpp_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: return "kiln::f16";
    case DType::bf16: return "kiln::bf16";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
  }
  return "void";
}

// A double as an exact C++ expression of type double: finite values as
// hexadecimal floating literals (every bit kept), infinities and NaN by name.
std::string exact_double(double v) {
  if (std::isnan(v)) return "std::numeric_limits<double>::quiet_NaN()";
  if (std::isinf(v)) return v > 0 ? "std::numeric_limits<double>::infinity()" : "(-std::numeric_limits<double>::infinity())";
  return fmt::format("double({:a})", v);
}

// A float scalar's value as Program::run passes it: through float, then to 16 bits for f16 and bf16.
std::string scalar_value(DType t, double v) {
  const std::string d = exact_double(v);
  switch (t) {
    case DType::f64: return d;
    case DType::f32: return "static_cast<float>(" + d + ")";
    case DType::f16: return "kiln::f16{kiln::f32_to_f16_bits(static_cast<float>(" + d + "))}";
    case DType::bf16: return "kiln::bf16{kiln::f32_to_bf16_bits(static_cast<float>(" + d + "))}";
    default: return d;
  }
}

// The helpers every emitted file defines (in its own namespace): kiln's
// integer semantics, with its errors.
constexpr const char* kHelpers = R"CPP(
[[noreturn]] inline void kiln_fail_(const char* what, const char* why) {
  throw kiln::Error(kiln::Errc::expr, std::string("program ") + kProgramName_ + ": evaluating '" + what + "': " + why);
}
inline int64_t kiln_add_(int64_t a, int64_t b, const char* w) { int64_t r; if (__builtin_add_overflow(a, b, &r)) kiln_fail_(w, "overflow"); return r; }
inline int64_t kiln_sub_(int64_t a, int64_t b, const char* w) { int64_t r; if (__builtin_sub_overflow(a, b, &r)) kiln_fail_(w, "overflow"); return r; }
inline int64_t kiln_mul_(int64_t a, int64_t b, const char* w) { int64_t r; if (__builtin_mul_overflow(a, b, &r)) kiln_fail_(w, "overflow"); return r; }
inline int64_t kiln_neg_(int64_t a, const char* w) { if (a == std::numeric_limits<int64_t>::min()) kiln_fail_(w, "overflow"); return -a; }
inline int64_t kiln_floordiv_(int64_t a, int64_t b, const char* w) {
  if (b == 0) kiln_fail_(w, "division by zero");
  if (b == -1 && a == std::numeric_limits<int64_t>::min()) kiln_fail_(w, "overflow");
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t kiln_mod_(int64_t a, int64_t b, const char* w) {
  if (b == 0) kiln_fail_(w, "division by zero");
  if (b == -1 && a == std::numeric_limits<int64_t>::min()) kiln_fail_(w, "overflow");
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline int64_t kiln_cdiv_(int64_t a, int64_t b, const char* w) {
  if (a == std::numeric_limits<int64_t>::min()) kiln_fail_(w, "overflow");
  return -kiln_floordiv_(-a, b, w);
}
// The elements of a buffer of these dimensions, named in the error when the product does not fit.
inline int64_t kiln_elements_(std::initializer_list<int64_t> dims, const char* buffer) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) throw kiln::Error(kiln::Errc::usage, std::string("program ") + kProgramName_ + ": buffer '" + buffer + "' has a negative dimension (" + std::to_string(d) + ")");
    if (__builtin_mul_overflow(n, d, &n)) throw kiln::Error(kiln::Errc::usage, std::string("program ") + kProgramName_ + ": buffer '" + buffer + "' has more elements than 64 bits count");
  }
  return n;
}
inline int32_t kiln_i32_(int64_t v, const char* where) {
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    throw kiln::Error(kiln::Errc::usage, std::string("program ") + kProgramName_ + ", " + where + ": " + std::to_string(v) + " does not fit an i32");
  return static_cast<int32_t>(v);
}
inline void kiln_holds_(int64_t need, int64_t have, const char* where) {
  if (need > have)
    throw kiln::Error(kiln::Errc::usage, std::string("program ") + kProgramName_ + ", " + where + ": the kernel takes " + std::to_string(need) + " elements, but the buffer has " + std::to_string(have));
}
)CPP";

}  // namespace

namespace {

std::string sym(const std::string& n) { return "s_" + n; }
std::string buf(const std::string& n) { return "b_" + n; }

// Writes one program as a C++ header: the struct Program, its constructor
// loading the kernels, and operator() running the steps unrolled.
class Emitter {
 public:
  explicit Emitter(const ProgramSpec& p) : p_(p) {}

  std::string emit() {
    std::string head = preamble();
    std::string o = members();
    o += call();
    o += "  }\n};\n\n";
    o += fmt::format("}}  // namespace {}_program\n", p_.name);
    std::string table = "\n// The expressions the checks above name in their errors.\n";
    for (size_t i = 0; i < texts_.size(); ++i)
      table += fmt::format("inline constexpr const char* kExpr{}_ = {};\n", i, literal(texts_[i]));
    return head + table + o;
  }

 private:
  // Each expression's text once, as a named literal the checked helpers'
  // errors quote (written into every operator, a long expression's text
  // would make the file grow with its square).
  std::string text(const std::string& t) {
    auto it = std::find(texts_.begin(), texts_.end(), t);
    if (it == texts_.end()) it = texts_.insert(texts_.end(), t);
    return fmt::format("kExpr{}_", it - texts_.begin());
  }
  std::string expr(const Expr& e) { return cpp_expr(e.root(), text(e.str()), sym); }

  std::string preamble() const {
    std::string o;
    o += fmt::format("// Generated by `kiln emit` from {}: program {} ({}), its steps unrolled.\n",
                     comment(p_.path.filename().string()), comment(p_.name), comment(p_.backend));
    o += "// Build it with the installed kiln package (find_package(kiln) / pkg-config kiln).\n";
    o += "#pragma once\n#include <algorithm>\n#include <cstdint>\n#include <initializer_list>\n#include <limits>\n"
         "#include <string>\n#include <vector>\n\n#include <kiln/kiln.hpp>\n\n";
    o += fmt::format("namespace {}_program {{\n\n", p_.name);
    o += fmt::format("inline constexpr const char* kProgramName_ = {};\n", literal("'" + p_.name + "'"));
    o += kHelpers;
    return o;
  }

  // The kernels and the arena as members; the constructor loads the kernels.
  std::string members() const {
    std::string o = "\nstruct Program {\n  kiln::Runtime& rt_;\n";
    for (const auto& k : p_.kernels)
      o += fmt::format("  {} k_{};\n",
                       k.kind == ProgramKernel::Kind::multi       ? "kiln::MultiKernel"
                       : k.kind == ProgramKernel::Kind::size_hint ? "kiln::SizeHintMultiKernel"
                                                                  : "kiln::Kernel",
                       k.name);
    o += "  void* arena_ = nullptr;\n  int64_t arena_bytes_ = 0;\n\n";
    o += "  // `dir_`: the folder holding the program file (its kernels' specs are found from there, as it names them).\n";
    o += "  Program(kiln::Runtime& rt, const std::string& dir_)\n      : rt_(rt)";
    // Spec paths as the program file reaches them from its own folder, whatever folder kiln emit ran in.
    std::error_code ec;
    const fs::path program_dir = fs::absolute(p_.path, ec).parent_path();
    for (const auto& k : p_.kernels) {
      fs::path rel = fs::relative(fs::absolute(k.spec, ec), program_dir, ec);
      if (ec || rel.empty())
        fail(Errc::usage, "kiln emit: cannot write kernel '{}''s spec {} relative to {}", k.name, k.spec.string(),
             program_dir.string());
      o += fmt::format(",\n        k_{}(rt, kiln::{}(dir_ + \"/\" + {}))", k.name,
                       k.kind == ProgramKernel::Kind::multi ? "load_multi_spec" : "load_spec",
                       literal(rel.generic_string()));
    }
    o += " {}\n";
    o += fmt::format("  ~Program() {{ if (arena_) rt_.device({}).free(arena_); }}\n", literal(p_.backend));
    o += "  Program(const Program&) = delete;\n  Program& operator=(const Program&) = delete;\n\n";
    return o;
  }

  // operator(): inputs, outputs, then the symbols; guards, element counts,
  // the arena, then each launch.
  std::string call() {
    std::vector<std::string> params, names;
    for (const auto& t : p_.inputs)  // state (a KV cache) is written in place
      params.push_back(fmt::format("{}{}* {}", t.state ? "" : "const ", cpp_type(t.dtype), buf(t.name))),
          names.push_back(t.name);
    for (const auto& t : p_.outputs)
      params.push_back(fmt::format("{}* {}", cpp_type(t.dtype), buf(t.name))), names.push_back(t.name);
    for (const auto& s : p_.all_symbols()) params.push_back("int64_t " + sym(s)), names.push_back(s);
    params.push_back("kiln::Stream stream_ = nullptr");
    std::string o = fmt::format("  // ({}): inputs, outputs (device pointers on cuda), then the symbols' and scalars' values.\n",
                                comment(join(names)));
    o += "  void operator()(" + join(params) + ") {\n";
    for (const auto& [n, v] : p_.constants) o += fmt::format("    const int64_t {} = {};\n", sym(n), v);
    for (const auto& g : p_.guards)
      o += fmt::format(
          "    if ({} == 0) throw kiln::Error(kiln::Errc::usage, std::string(\"program \") + kProgramName_ + {});\n",
          expr(g), literal(": guard '" + g.str() + "' does not hold"));
    // Every buffer's element count, checked as Program::run checks it. n_<name>_
    // cannot meet the emitter's other names: they end in '_' too but start
    // neither with n_ nor with s_, b_ or k_.
    for (auto* group : {&p_.inputs, &p_.outputs, &p_.buffers})
      for (const auto& t : *group) {
        std::vector<std::string> dims;
        for (const auto& d : t.shape) dims.push_back(expr(d));
        o += fmt::format("    const int64_t n_{}_ = kiln_elements_({{{}}}, {});\n", t.name, join(dims),
                         literal(t.name));
      }
    std::vector<const ProgramStep*> launches;
    for (const auto& s : p_.steps)
      if (s.kind == ProgramStep::Kind::launch) launches.push_back(&s);
    if (!p_.buffers.empty()) o += arena(launches);
    for (size_t i = 0; i < launches.size(); ++i) o += launch(i, *launches[i]);
    return o;
  }

  // The intermediates, placed in one arena by liveness.
  std::string arena(const std::vector<const ProgramStep*>& launches) {
    std::vector<std::string> sizes, lives;
    for (const auto& b : p_.buffers) {
      sizes.push_back(fmt::format("kiln_mul_(n_{}_, {}, {})", b.name, dtype_size(b.dtype), text("the size of " + b.name)));
      int first = -1, last = -1;
      for (size_t i = 0; i < launches.size(); ++i)
        for (const auto& a : launches[i]->args)
          if (a.kind == ProgramArg::Kind::buffer && a.text == b.name) {
            if (first < 0) first = static_cast<int>(i);
            last = static_cast<int>(i);
          }
      lives.push_back(fmt::format("{{{}, {}}}", first, last));
    }
    std::string o = "    // The intermediates, placed in one arena by liveness.\n";
    o += "    const kiln::MemoryPlan plan_ = kiln::plan_memory({" + join(sizes) + "}, {" + join(lives) + "});\n";
    o += fmt::format("    if (plan_.arena > arena_bytes_) {{\n      kiln::Device& dev_ = rt_.device({});\n"
                     "      if (arena_) {{ dev_.sync(stream_); dev_.free(arena_); arena_ = nullptr; }}\n"
                     "      arena_ = dev_.alloc(static_cast<size_t>(plan_.arena));\n      arena_bytes_ = plan_.arena;\n    }}\n",
                     literal(p_.backend));
    for (size_t b = 0; b < p_.buffers.size(); ++b)
      o += fmt::format("    auto* {} = reinterpret_cast<{}*>(static_cast<char*>(arena_) + plan_.offset[{}]);\n",
                       buf(p_.buffers[b].name), cpp_type(p_.buffers[b].dtype), b);
    return o;
  }

  // Launch step i: its arguments, the checks that each buffer holds what
  // the kernel's spec reads or writes, the launch.
  std::string launch(size_t i, const ProgramStep& st) {
    const ProgramKernel* k = p_.kernel(st.kernel);
    const auto& args = k->args();
    std::string o = fmt::format("    {{  // step {}: {}\n", i + 1, st.kernel);
    // The kernel's integer scalars by the kernel's names (its size expressions use them).
    auto karg = [&](const std::string& n) {
      for (size_t j = 0; j < args.size(); ++j)
        if (args[j].name == n)  // as Program::run: a buffer or float argument reads as 0
          return args[j].pointer || dtype_is_float(args[j].dtype) ? std::string("int64_t{0}") : fmt::format("v{}_", j);
      throw Error(Errc::internal, fmt::format("kiln emit: kernel '{}' has no argument '{}'", st.kernel, n));
    };
    std::vector<std::string> ptrs;
    for (size_t j = 0; j < st.args.size(); ++j) {
      const ProgramArg& a = st.args[j];
      const std::string v = fmt::format("v{}_", j);
      const std::string where = fmt::format("step {} ({}) argument '{}'", i + 1, st.kernel, args[j].name);
      if (a.kind == ProgramArg::Kind::buffer) {
        if (a.index)
          throw Error(Errc::usage, fmt::format("kiln emit: {} is a view of a row of a buffer ('{}'), which kiln emit "
                                               "does not write yet; kiln run and Program run it",
                                               where, a.written()));
        o += fmt::format("      const void* {} = {};\n", v, buf(a.text));
      } else if (a.kind == ProgramArg::Kind::real) {
        o += fmt::format("      const {} {} = {};\n", cpp_type(args[j].dtype), v, scalar_value(args[j].dtype, a.real));
      } else if (args[j].dtype == DType::i32) {
        o += fmt::format("      const int32_t {} = kiln_i32_({}, {});\n", v, expr(a.value), literal(where));
      } else {
        o += fmt::format("      const int64_t {} = {};\n", v, expr(a.value));
      }
      ptrs.push_back("const_cast<void*>(static_cast<const void*>(&" + v + "))");
    }
    for (size_t j = 0; j < st.args.size(); ++j) {
      if (st.args[j].kind != ProgramArg::Kind::buffer) continue;
      const Expr& need = args[j].size;
      o += fmt::format("      kiln_holds_({}, n_{}_, {});\n", cpp_expr(need.root(), text(need.str()), karg),
                       st.args[j].text,
                       literal(fmt::format("step {} ({}) argument '{}' ({})", i + 1, st.kernel, args[j].name,
                                           st.args[j].text)));
    }
    o += "      void* params_[] = {" + join(ptrs) + "};\n";
    o += fmt::format("      k_{}.launch(params_, stream_);\n    }}\n", st.kernel);
    return o;
  }

  const ProgramSpec& p_;
  std::vector<std::string> texts_;
};

}  // namespace

std::string emit_program_cpp(const ProgramSpec& p) { return Emitter(p).emit(); }

}  // namespace kiln
