// Program specs: the file format (kind = "program", version 1), the
// builder, lowering, the memory planner and the C++ emitter. docs/program.md.
#include "kiln/program_spec.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/format.hpp"
#include "kiln/args.hpp"

#include "core/toml.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// An expression over the program's constants alone, compiled with them folded in:
// ExprError for any other name.
CompiledExpr over_constants(const ProgramSpec& p, const Expr& e) {
  return CompiledExpr::compile(e, [&](std::string_view n) -> std::optional<SymbolBinding> {
    for (const auto& [k, v] : p.constants)
      if (k == n) return SymbolBinding::constant(v);
    return std::nullopt;
  });
}

// Its value where it names the constants alone and evaluates; else nullopt.
std::optional<int64_t> constant_value(const ProgramSpec& p, const Expr& e) {
  try {
    CompiledExpr c = over_constants(p, e);
    if (c.is_constant()) return c.constant_value();
  } catch (const Error&) {  // ExprError too
  }
  return std::nullopt;
}

// Program files are text a person writes: far below this.
constexpr size_t kMaxProgramBytes = size_t{16} << 20;

std::string read_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) fail(Errc::spec, "{}: cannot read the program file (not a file)", p.string());
  if (fs::file_size(p, ec) > kMaxProgramBytes)
    fail(Errc::spec, "{}: larger than a program file may be ({} MiB)", p.string(), kMaxProgramBytes >> 20);
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(Errc::spec, "{}: cannot read the program file", p.string());
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

toml::table parse_toml_text(std::string_view text, const fs::path& path) {
  // ASCII only: toml++ 3.3.0 misbehaves on some non-ASCII input (docs/spec.md).
  int line = 1;
  for (char c : text) {
    if (c == '\n') ++line;
    if (static_cast<unsigned char>(c) >= 0x80)
      fail(Errc::spec, "{}:{}: program files are ASCII (write names and comments without other characters)",
           path.string(), line);
  }
  try {
    return toml::parse(text, path.string());
  } catch (const TomlCheckFailed& e) {
    fail(Errc::spec, "{}: not valid TOML (the parser's check '{}' failed)", path.string(), e.expr);
  } catch (const toml::parse_error& e) {
    fail(Errc::spec, "{}:{}:{}: {}", path.string(), e.source().begin.line, e.source().begin.column,
         e.description());
  }
}

class Reader {
 public:
  Reader(const fs::path& path) : path_(path) {}

  [[noreturn]] void error(const toml::node& n, const std::string& what) const {
    fail(Errc::spec, "{}:{}:{}: {}", path_.string(), n.source().begin.line, n.source().begin.column, what);
  }
  [[noreturn]] void error(const std::string& what) const { fail(Errc::spec, "{}: {}", path_.string(), what); }

  const std::string& str(const toml::node& n, const std::string& key) const {
    if (!n.is_string()) error(n, fmt::format("{} must be a string", key));
    return n.as_string()->get();
  }
  const toml::array& array(const toml::node& n, const std::string& key) const {
    if (!n.is_array()) error(n, fmt::format("{} must be an array", key));
    return *n.as_array();
  }
  const toml::table& table(const toml::node& n, const std::string& key) const {
    if (!n.is_table()) error(n, fmt::format("{} must be a table", key));
    return *n.as_table();
  }
  void only(const toml::table& t, std::initializer_list<const char*> keys, const std::string& where) const {
    for (const auto& [k, v] : t) {
      bool known = false;
      for (const char* x : keys) known = known || k.str() == x;
      if (!known) {
        std::string list;
        for (const char* x : keys) list += (list.empty() ? "" : ", ") + std::string(x);
        error(v, fmt::format("{}: unknown key '{}' (known: {})", where, k.str(), list));
      }
    }
  }
  Expr expr(const toml::node& n, const std::string& key) const {
    const std::string& text = str(n, key);
    try {
      return Expr::parse(text);
    } catch (const ExprError& e) {
      error(n, fmt::format("{}: {} (column {} of \"{}\")", key, e.what_only(), e.column(), text));
    }
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Names become C++ identifiers in kiln emit's output: an identifier that is not a keyword.
bool is_name(std::string_view s) { return is_identifier(s) && !is_cpp_keyword(s); }
constexpr const char* kNameRule = "letters, digits and _, not starting with a digit, not a C++ keyword";

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Checks a whole spec (symbols, kernels, steps) and completes its steps'
// arguments (which are buffers, which are numbers). `where(i)` names step i
// for messages, `fail_at(i, what)` throws for step i.
void check_program(ProgramSpec& p, const std::function<std::string(size_t)>& where) {
  if (!is_name(p.name))
    fail(Errc::spec, "program name {:?} is not a name ({})", p.name, kNameRule);
  auto err = [&](const std::string& what) { fail(Errc::spec, "program '{}': {}", p.name, what); };
  if (p.backend != "cpu" && p.backend != "cuda") err(fmt::format("backend '{}' is not cpu or cuda", p.backend));
  std::set<std::string> names;
  auto name_ok = [&](const std::string& n, const char* what) {
    if (!is_name(n)) err(fmt::format("{} {:?} is not a name ({})", what, n, kNameRule));
    if (!names.insert(n).second) err(fmt::format("'{}' is declared twice", n));
  };
  std::set<std::string> scalars;  // what expressions may use
  for (const auto& [n, v] : p.constants) name_ok(n, "constant"), scalars.insert(n);
  for (const auto& n : p.symbols) name_ok(n, "symbol"), scalars.insert(n);
  for (const auto& n : p.scalars) name_ok(n, "scalar"), scalars.insert(n);
  auto known = [&](const Expr& e, const std::string& what) {
    for (const auto& s : e.symbols())
      if (!scalars.count(s))
        err(fmt::format("{}: '{}' is not a symbol or constant of the program (symbols: {}; constants: {})", what, s,
                        join(p.all_symbols()), [&] {
                          std::vector<std::string> c;
                          for (const auto& [n, v] : p.constants) c.push_back(n);
                          return join(c);
                        }()));
  };
  for (const auto& g : p.guards) known(g, fmt::format("guard '{}'", g.str()));
  if (p.check.reduction) known(*p.check.reduction, "check.reduction");
  std::set<std::string> bound;
  for (auto* group : {&p.inputs, &p.outputs, &p.buffers})
    for (const auto& t : *group) {
      name_ok(t.name, "buffer");
      if (t.shape.empty()) err(fmt::format("buffer '{}' has no shape", t.name));
      for (const auto& d : t.shape) {
        known(d, fmt::format("the shape of '{}'", t.name));
        if (group == &p.inputs && d.root().op == ExprOp::Var) bound.insert(d.root().name);
      }
    }
  for (const auto& s : p.symbols)
    if (!bound.count(s))
      err(fmt::format("symbol '{}' is bound by no input: an input's shape must name it as a dimension of its own "
                      "(or declare it in scalars, given at each call)", s));
  for (const auto& t : p.outputs)
    if (t.state) err(fmt::format("output '{}' is state: only an input is updated in place", t.name));
  for (const auto& t : p.buffers)
    if (t.state) err(fmt::format("buffer '{}' is state: only an input is updated in place", t.name));
  if (p.outputs.empty()) err("it has no outputs");
  std::set<std::string> kernel_names;
  for (const auto& k : p.kernels) {
    if (!is_name(k.name)) err(fmt::format("kernel {:?} is not a name ({})", k.name, kNameRule));
    if (!kernel_names.insert(k.name).second) err(fmt::format("kernel '{}' is listed twice", k.name));
    if (k.backend() != p.backend)
      err(fmt::format("kernel '{}' ({}) is a {} kernel; the program's backend is {}", k.name, k.spec.string(),
                      k.backend(), p.backend));
  }
  std::set<std::string> written;  // every row, as far as the check can tell
  for (const auto& t : p.inputs) written.insert(t.name);
  // Buffers of which only some rows are written so far, through views whose
  // index is a constant (`h[1]`); a view with another index counts as the whole.
  std::map<std::string, std::set<int64_t>> rows_written;
  auto constant_row = [&](const Expr& e) { return constant_value(p, e); };
  for (size_t i = 0; i < p.steps.size(); ++i) {
    ProgramStep& st = p.steps[i];
    if (st.kind != ProgramStep::Kind::launch) continue;
    const ProgramKernel* k = p.kernel(st.kernel);
    if (!k) {
      std::vector<std::string> ks;
      for (const auto& x : p.kernels) ks.push_back(x.name);
      err(fmt::format("{}: kernel '{}' is not one of the program's kernels ({})", where(i), st.kernel, join(ks)));
    }
    const auto& args = k->args();
    if (st.args.size() != args.size())
      err(fmt::format("{}: kernel '{}' takes {} arguments ({}), the step gives {}", where(i), st.kernel, args.size(),
                      [&] {
                        std::vector<std::string> a;
                        for (const auto& x : args) a.push_back(x.name);
                        return join(a);
                      }(),
                      st.args.size()));
    std::vector<std::pair<std::string, std::optional<int64_t>>> writes;  // a buffer, and its row for a view
    for (size_t j = 0; j < args.size(); ++j) {
      ProgramArg& a = st.args[j];
      const ArgSpec& want = args[j];
      // `name[index]`: a view of one row of a buffer.
      if (!a.index && want.pointer && a.text.size() > 3 && a.text.back() == ']') {
        const size_t open = a.text.find('[');
        if (open != std::string::npos && open > 0 && p.tensor(std::string_view(a.text).substr(0, open))) {
          const std::string inner = a.text.substr(open + 1, a.text.size() - open - 2);
          try {
            a.index = Expr::parse(inner);
          } catch (const ExprError& e) {
            err(fmt::format("{}: argument {} ('{}' of kernel '{}'): the index of '{}': {} (column {} of \"{}\")",
                            where(i), j, want.name, st.kernel, a.text, e.what_only(), e.column(), inner));
          }
          a.text.resize(open);
        }
      }
      const ProgramTensor* t = p.tensor(a.text);
      if (a.index) {
        if (!t || !want.pointer)
          err(fmt::format("{}: argument {} ('{}' of kernel '{}'): '{}' is a view of a buffer, but the kernel takes a "
                          "scalar there", where(i), j, want.name, st.kernel, a.written()));
        if (t->shape.size() < 2)
          err(fmt::format("{}: argument {} ('{}' of kernel '{}'): '{}' views a row of '{}', which has {} dimension; "
                          "a view needs two or more (the first is the row's index)",
                          where(i), j, want.name, st.kernel, a.written(), a.text, t->shape.size()));
        known(*a.index, fmt::format("{}: argument {} ('{}'), the index of '{}'", where(i), j, want.name, a.written()));
        if (const std::optional<int64_t> r = constant_row(*a.index); r && *r < 0)
          err(fmt::format("{}: argument {} ('{}' of kernel '{}'): '{}' is row {} of '{}'; rows are counted from 0",
                          where(i), j, want.name, st.kernel, a.written(), *r, a.text));
      }
      if (want.pointer) {
        if (!t)
          err(fmt::format("{}: argument {} ('{}' of kernel '{}') is a buffer; '{}' is not one of the program's",
                          where(i), j, want.name, st.kernel, a.text));
        if (t->dtype != want.dtype)
          err(fmt::format("{}: '{}' is {}, but kernel '{}' takes {}* as '{}'", where(i), a.text, dtype_name(t->dtype),
                          st.kernel, dtype_name(want.dtype), want.name));
        a.kind = ProgramArg::Kind::buffer;
        const bool is_input = std::any_of(p.inputs.begin(), p.inputs.end(), [&](const ProgramTensor& x) {
          return x.name == a.text && !x.state;
        });
        if (want.intent != Intent::in) {
          if (is_input)
            err(fmt::format("{}: kernel '{}' writes '{}' ('{}'), an input of the program; inputs are read only "
                            "(state = true makes an input state the program updates in place)",
                            where(i), st.kernel, want.name, a.text));
          writes.emplace_back(a.text, a.index ? constant_row(*a.index) : std::nullopt);
        }
        if (want.intent != Intent::out && !written.count(a.text)) {
          auto rows = rows_written.find(a.text);
          if (rows == rows_written.end())
            err(fmt::format("{}: kernel '{}' reads '{}' before any step writes it", where(i), st.kernel, a.text));
          const std::optional<int64_t> r = a.index ? constant_row(*a.index) : std::nullopt;
          if (r && !rows->second.count(*r))
            err(fmt::format("{}: kernel '{}' reads '{}', row {} of '{}', before any step writes that row (rows "
                            "written so far: {})",
                            where(i), st.kernel, a.written(), *r, a.text, fmt::join(rows->second, ", ")));
        }
      } else if (t) {
        err(fmt::format("{}: argument {} ('{}' of kernel '{}') is a {} scalar, not a buffer like '{}'", where(i), j,
                        want.name, st.kernel, dtype_name(want.dtype), a.text));
      } else if (dtype_is_float(want.dtype)) {
        a.kind = ProgramArg::Kind::real;
        double v = 0;
        auto [ptr, ec] = std::from_chars(a.text.data(), a.text.data() + a.text.size(), v);
        if (ec != std::errc() || ptr != a.text.data() + a.text.size())
          err(fmt::format("{}: argument {} ('{}' of kernel '{}') is {}: '{}' is not a number", where(i), j, want.name,
                          st.kernel, dtype_name(want.dtype), a.text));
        a.real = v;
      } else {
        a.kind = ProgramArg::Kind::integer;
        try {
          a.value = Expr::parse(a.text);
        } catch (const ExprError& e) {
          err(fmt::format("{}: argument {} ('{}' of kernel '{}'): {} (column {} of \"{}\")", where(i), j, want.name,
                          st.kernel, e.what_only(), e.column(), a.text));
        }
        known(a.value, fmt::format("{}: argument {} ('{}')", where(i), j, want.name));
      }
    }
    // A buffer a launch writes may not overlap another of its arguments (the kernels
    // read their inputs while they write: in place gives a wrong answer). Two views
    // overlap unless their rows are different constants or their indices differ.
    for (size_t j = 0; j < args.size(); ++j) {
      const ProgramArg& a = st.args[j];
      if (a.kind != ProgramArg::Kind::buffer || args[j].intent == Intent::in) continue;
      for (size_t q = 0; q < args.size(); ++q) {
        const ProgramArg& b = st.args[q];
        if (q == j || b.kind != ProgramArg::Kind::buffer || b.text != a.text) continue;
        if (q < j && args[q].intent != Intent::in) continue;  // a pair of written ones: said once
        bool overlap = !a.index || !b.index;
        if (a.index && b.index) {
          const std::optional<int64_t> ra = constant_row(*a.index), rb = constant_row(*b.index);
          overlap = ra && rb ? *ra == *rb : *a.index == *b.index;
        }
        if (overlap)
          err(fmt::format("{}: kernel '{}' writes '{}' as '{}' and {} it as '{}' in the same launch: a launch's "
                          "arguments may not overlap where it writes (give the output a buffer of its own)",
                          where(i), st.kernel, a.written(), args[j].name,
                          args[q].intent == Intent::in ? "reads" : "writes", args[q].name));
      }
    }
    for (const auto& [w, row] : writes) {
      if (row) rows_written[w].insert(*row);
      else written.insert(w);
    }
  }
  // An output written row by row through views must have every row written.
  for (const auto& o : p.outputs) {
    auto rows = rows_written.find(o.name);
    if (written.count(o.name) || rows == rows_written.end() || o.shape.empty()) continue;
    const std::optional<int64_t> n = constant_row(o.shape[0]);
    if (!n) continue;
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < *n && missing.size() < 8; ++r)
      if (!rows->second.count(r)) missing.push_back(r);
    if (!missing.empty())
      err(fmt::format("output '{}' has {} rows, but no step writes row{} {}", o.name, *n, missing.size() > 1 ? "s" : "",
                      fmt::join(missing, ", ")));
  }
  for (const auto& o : p.outputs)
    if (!written.count(o.name) && !rows_written.count(o.name))
      err(fmt::format("output '{}' is written by no step", o.name));
  for (const auto& b : p.buffers)
    if (!written.count(b.name) && !rows_written.count(b.name))
      err(fmt::format("buffer '{}' is written by no step", b.name));
}

ProgramKernel load_kernel_ref(const std::string& name, const fs::path& spec, const std::string& kind) {
  ProgramKernel k;
  k.name = name;
  k.spec = spec;
  std::error_code ec;
  if (!fs::is_regular_file(split_member(spec).first, ec))
    fail(Errc::spec, "kernel '{}': no spec file {}", name, spec.string());
  if (kind == "size_hint") {
    k.kind = ProgramKernel::Kind::size_hint;
    k.kernel = load_spec(spec);
  } else if (kind.empty() || kind == "kernel" || kind == "multi") {
    if (is_multi_spec(spec)) {
      k.kind = ProgramKernel::Kind::multi;
      k.multi = load_multi_spec(spec);
    } else {
      if (kind == "multi") fail(Errc::spec, "kernel '{}': {} is not a multi-kernel spec", name, spec.string());
      k.kernel = load_spec(spec);
    }
  } else {
    fail(Errc::spec, "kernel '{}': kind '{}' is not kernel, multi or size_hint", name, kind);
  }
  return k;
}

}  // namespace

const ProgramTensor* ProgramSpec::tensor(std::string_view n) const {
  for (auto* group : {&inputs, &outputs, &buffers})
    for (const auto& t : *group)
      if (t.name == n) return &t;
  return nullptr;
}

std::vector<std::string> ProgramSpec::all_symbols() const {
  std::vector<std::string> v = symbols;
  v.insert(v.end(), scalars.begin(), scalars.end());
  return v;
}

const ProgramKernel* ProgramSpec::kernel(std::string_view n) const {
  for (const auto& k : kernels)
    if (k.name == n) return &k;
  return nullptr;
}

std::vector<int64_t> ProgramSpec::dims(const ProgramTensor& t, const std::map<std::string, int64_t>& values) const {
  KernelSpec scope;
  std::vector<int64_t> slots;
  for (const auto& [n, v] : constants) {
    scope.args.push_back(ArgSpec{});
    scope.args.back().name = n;
    slots.push_back(v);
  }
  for (const auto& n : all_symbols()) {
    auto it = values.find(n);
    if (it == values.end()) fail(Errc::usage, "program '{}': symbol '{}' has no value", name, n);
    scope.args.push_back(ArgSpec{});
    scope.args.back().name = n;
    slots.push_back(it->second);
  }
  std::vector<int64_t> out;
  for (const auto& d : t.shape) out.push_back(compile_expr(scope, d, nullptr).eval(slots.data()));
  return out;
}

int64_t ProgramSpec::elements(const ProgramTensor& t, const std::map<std::string, int64_t>& values) const {
  const std::vector<int64_t> d = dims(t, values);
  int64_t n = 1;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0)
      fail(Errc::usage, "program '{}': '{}' dimension {} ({}) is {}, negative", name, t.name, i, t.shape[i].str(), d[i]);
    if (__builtin_mul_overflow(n, d[i], &n)) {
      std::vector<std::string> s;
      for (const auto& e : t.shape) s.push_back(e.str());
      fail(Errc::usage, "program '{}': '{}' of shape [{}] has more elements than 64 bits count", name, t.name, join(s));
    }
  }
  return n;
}

std::vector<ProgramStep> ProgramSpec::lower() const {
  std::vector<ProgramStep> launches;
  for (const auto& s : steps)
    if (s.kind == ProgramStep::Kind::launch) launches.push_back(s);
  std::vector<int> first(buffers.size(), -1), last(buffers.size(), -1);
  for (size_t i = 0; i < launches.size(); ++i)
    for (const auto& a : launches[i].args)
      for (size_t b = 0; b < buffers.size(); ++b)
        if (a.kind == ProgramArg::Kind::buffer && a.text == buffers[b].name) {
          if (first[b] < 0) first[b] = static_cast<int>(i);
          last[b] = static_cast<int>(i);
        }
  std::vector<ProgramStep> out;
  for (size_t i = 0; i < launches.size(); ++i) {
    for (size_t b = 0; b < buffers.size(); ++b)
      if (first[b] == static_cast<int>(i)) {
        ProgramStep a;
        a.kind = ProgramStep::Kind::alloc;
        a.buffer = buffers[b].name;
        out.push_back(a);
      }
    out.push_back(launches[i]);
    for (size_t b = 0; b < buffers.size(); ++b)
      if (last[b] == static_cast<int>(i)) {
        ProgramStep f;
        f.kind = ProgramStep::Kind::free;
        f.buffer = buffers[b].name;
        out.push_back(f);
      }
  }
  ProgramStep r;
  r.kind = ProgramStep::Kind::ret;
  out.push_back(r);
  return out;
}

std::string ProgramSpec::str() const {
  std::string s = fmt::format("program {} ({}), version {}\n", name, backend, kVersion);
  for (const auto& [n, v] : constants) s += fmt::format("  constant {} = {}\n", n, v);
  for (const auto& n : symbols) s += fmt::format("  symbol {}\n", n);
  for (const auto& n : scalars)
    s += fmt::format("  scalar {} (given at each call{})\n", n,
                     std::find(pow2.begin(), pow2.end(), n) != pow2.end() ? "; planned and graphed by powers of two" : "");
  for (const auto& g : guards) s += fmt::format("  guard {}\n", g.str());
  auto shape = [](const ProgramTensor& t) {
    std::vector<std::string> d;
    for (const auto& e : t.shape) d.push_back(e.str());
    return fmt::format("{} {}[{}]", t.name, dtype_name(t.dtype), join(d));
  };
  for (const auto& t : inputs) s += (t.state ? "  input (state) " : "  input ") + shape(t) + "\n";
  for (const auto& t : outputs) s += "  output " + shape(t) + "\n";
  for (const auto& t : buffers) s += "  buffer " + shape(t) + "\n";
  for (const auto& k : kernels)
    s += fmt::format("  kernel {} = {} ({})\n", k.name, k.spec.string(),
                     k.kind == ProgramKernel::Kind::multi       ? "multi-kernel"
                     : k.kind == ProgramKernel::Kind::size_hint ? "size-hint kernel"
                                                                : "kernel");
  int n = 0;
  for (const auto& st : lower()) {
    switch (st.kind) {
      case ProgramStep::Kind::alloc: s += fmt::format("  {:>3}  alloc {}\n", "", st.buffer); break;
      case ProgramStep::Kind::free: s += fmt::format("  {:>3}  free {}\n", "", st.buffer); break;
      case ProgramStep::Kind::ret: s += fmt::format("  {:>3}  return\n", ""); break;
      case ProgramStep::Kind::launch: {
        std::vector<std::string> a;
        for (const auto& x : st.args) a.push_back(x.written());
        s += fmt::format("  {:>3}  launch {}({})\n", ++n, st.kernel, join(a));
        break;
      }
    }
  }
  return s;
}

namespace {

std::vector<ProgramTensor> read_tensors(Reader& r, const toml::table& root, const char* key) {
  std::vector<ProgramTensor> out;
  const toml::node* n = root.get(key);
  if (!n) return out;
  const toml::array& a = r.array(*n, key);
  for (size_t i = 0; i < a.size(); ++i) {
    std::string where = fmt::format("{}[{}]", key, i);
    const toml::table& t = r.table(a[i], where);
    const bool is_input = std::string(key) == "inputs";
    if (is_input) r.only(t, {"name", "dtype", "shape", "state", "fill"}, where);
    else r.only(t, {"name", "dtype", "shape"}, where);
    ProgramTensor x;
    const toml::node* nm = t.get("name");
    const toml::node* dt = t.get("dtype");
    const toml::node* sh = t.get("shape");
    if (!nm || !dt || !sh) r.error(a[i], fmt::format("{} needs name, dtype and shape", where));
    x.name = r.str(*nm, where + ".name");
    auto d = dtype_from_name(r.str(*dt, where + ".dtype"));
    if (!d) r.error(*dt, fmt::format("{}.dtype: '{}' is not f32, f64, f16, bf16, i32 or i64", where, dt->as_string()->get()));
    x.dtype = *d;
    for (const auto& e : r.array(*sh, where + ".shape")) x.shape.push_back(r.expr(e, where + ".shape"));
    if (const toml::node* st = t.get("state")) {
      if (!st->is_boolean()) r.error(*st, fmt::format("{}.state: true or false", where));
      x.state = st->as_boolean()->get();
    }
    if (const toml::node* f = t.get("fill")) {
      // fill = { scale = 0.02 } or { constant = 1.0 }: how kiln run fills it.
      const toml::table& ft = r.table(*f, where + ".fill");
      r.only(ft, {"scale", "constant"}, where + ".fill");
      if (ft.size() != 1) r.error(*f, fmt::format("{}.fill: one of scale or constant", where));
      const toml::node* sc = ft.get("scale");
      const toml::node* c = ft.get("constant");
      const toml::node& v = sc ? *sc : *c;
      const double d = v.value<double>().value_or(std::nan(""));
      if (!v.is_number() || !std::isfinite(d) || (sc && d <= 0))
        r.error(v, fmt::format("{}.fill: a finite number{}", where, sc ? ", more than 0" : ""));
      // An integer input's values (-100..100 times the scale, or the constant) must fit its dtype.
      if (x.dtype == DType::i32 || x.dtype == DType::i64) {
        const double most = x.dtype == DType::i32 ? 2147483647.0 : 9.2e18;
        if ((sc ? 100 * d : std::fabs(d)) > most)
          r.error(v, fmt::format("{}.fill: {} {} makes values past what {} holds", where, sc ? "scale" : "constant", d,
                                 dtype_name(x.dtype)));
      }
      if (sc) x.scale = d;
      else x.constant = d;
    }
    out.push_back(std::move(x));
  }
  return out;
}

// [kernels]: name = "spec.toml", or name = { spec = "...", kind = "..." }; paths from the program's folder.
void read_kernels(Reader& r, const toml::node& ks, const fs::path& dir, ProgramSpec& p) {
  for (const auto& [k, v] : r.table(ks, "kernels")) {
    std::string spec, kind;
    if (v.is_string()) {
      spec = v.as_string()->get();
    } else {
      const toml::table& t = r.table(v, "kernels." + std::string(k.str()));
      r.only(t, {"spec", "kind"}, "kernels." + std::string(k.str()));
      const toml::node* s = t.get("spec");
      if (!s) r.error(v, fmt::format("kernels.{}: no spec", k.str()));
      spec = r.str(*s, "spec");
      if (const toml::node* kd = t.get("kind")) kind = r.str(*kd, "kind");
    }
    fs::path sp = fs::path(spec).is_absolute() ? fs::path(spec) : dir / spec;
    try {
      p.kernels.push_back(load_kernel_ref(std::string(k.str()), sp, kind));
    } catch (const Error& e) {
      r.error(v, e.what());
    }
  }
}

// An expression's text with each identifier found in `to` replaced by its
// text in parentheses; numbers (1e-5 included) and operators stay.
std::string substitute(const std::string& text, const std::map<std::string, std::string>& to) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const bool starts = (std::isalpha(static_cast<unsigned char>(c)) || c == '_') &&
                        (i == 0 || !(word(text[i - 1]) || text[i - 1] == '.'));
    if (!starts) {
      out += c;
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && word(text[j])) ++j;
    const std::string id = text.substr(i, j - i);
    auto it = to.find(id);
    out += it == to.end() ? id : "(" + it->second + ")";
    i = j;
  }
  return out;
}

// The text of an expression, as the parser prints it back (so that two
// spellings of one expression compare equal); the text itself if it does not parse.
std::string normal(const std::string& text) {
  try {
    return Expr::parse(text).str();
  } catch (const ExprError&) {
    return text;
  }
}

// The program files being read, outermost first: a file that runs itself
// (directly or through others) would not end.
thread_local std::vector<fs::path> t_reading;
// The programs run as steps that one top-level read has loaded, by file: a file
// run by many steps (and theirs by many) is read once.
thread_local std::map<fs::path, ProgramSpec>* t_loaded = nullptr;

// A step that runs another program (a layer) once, or `repeat` times over
// rows of stacked buffers: its steps are written into this program, its
// inputs and outputs replaced by what `bind` gives them (the repetition's
// index a number in each), its intermediates made this program's (one set,
// reused by every repetition), its kernels added (shared by every
// repetition: one handle, one tuning), its symbols bound from the shapes of
// what is bound to its inputs, and guards added that the shapes agree.
void expand_program_step(Reader& r, const toml::table& t, const toml::node& at, const std::string& where,
                         ProgramSpec& p, int line, std::set<std::string>& made) {
  r.only(t, {"program", "repeat", "index", "bind"}, where);
  const toml::node* pn = t.get("program");
  const std::string file = r.str(*pn, where + ".program");
  const fs::path path = fs::path(file).is_absolute() ? fs::path(file) : r.path().parent_path() / file;
  ProgramSpec sub;
  {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) r.error(*pn, fmt::format("{}: no program file {}", where, path.string()));
    const fs::path me = fs::weakly_canonical(r.path(), ec), it = fs::weakly_canonical(path, ec);
    struct Reading {  // leaves the list as it found it, however this step ends
      size_t n;
      ~Reading() { t_reading.resize(n); }
    } reading{t_reading.size()};
    if (t_reading.empty()) t_reading.push_back(me);
    if (std::find(t_reading.begin(), t_reading.end(), it) != t_reading.end()) {
      std::string chain;
      for (const auto& f : t_reading) chain += f.filename().string() + " -> ";
      r.error(*pn, fmt::format("{}: {} runs itself ({}{})", where, it.filename().string(), chain,
                               it.filename().string()));
    }
    t_reading.push_back(it);
    const ProgramSpec* cached = nullptr;
    if (t_loaded)
      if (auto f = t_loaded->find(it); f != t_loaded->end()) cached = &f->second;
    if (cached) {
      sub = *cached;
    } else {
      try {
        sub = load_program(path);
      } catch (const Error& e) {
        r.error(*pn, fmt::format("{}: the program it runs: {}", where, e.what()));
      }
      if (t_loaded) t_loaded->emplace(it, sub);
    }
  }
  if (sub.backend != p.backend)
    r.error(*pn, fmt::format("{}: program '{}' is a {} program; this one's backend is {}", where, sub.name, sub.backend,
                             p.backend));
  // The count: a whole number, or an expression over the constants.
  int64_t count = 1;
  if (const toml::node* rn = t.get("repeat")) {
    if (rn->is_integer()) {
      count = rn->as_integer()->get();
    } else {
      const Expr e = r.expr(*rn, where + ".repeat");
      try {
        count = over_constants(p, e).eval(nullptr);
      } catch (const ExprError& x) {
        r.error(*rn, fmt::format("{}.repeat: '{}' is a count over the constants ({})", where, e.str(), x.what_only()));
      } catch (const Error& x) {
        r.error(*rn, fmt::format("{}.repeat: '{}': {}", where, e.str(), x.what()));
      }
    }
    if (count < 0 || count > 4096) r.error(*rn, fmt::format("{}.repeat: {} is not a count from 0 to 4096", where, count));
  }
  std::string index = "layer";
  if (const toml::node* in = t.get("index")) {
    index = r.str(*in, where + ".index");
    if (!is_name(index)) r.error(*in, fmt::format("{}.index: {:?} is not a name ({})", where, index, kNameRule));
  }
  if (t.get("repeat") || t.get("index")) {
    for (const auto& n : p.all_symbols())
      if (n == index)
        r.error(at, fmt::format("{}: the repetition's index '{}' is also a symbol of the program", where, index));
    for (const auto& [n, v] : p.constants)
      if (n == index)
        r.error(at, fmt::format("{}: the repetition's index '{}' is also a constant of the program", where, index));
    if (p.tensor(index))
      r.error(at, fmt::format("{}: the repetition's index '{}' is also a buffer of the program", where, index));
  }
  // What the step binds: each input and output of the program it runs, and its scalars.
  std::map<std::string, std::string> bind;
  const toml::node* bn = t.get("bind");
  if (bn) {
    for (const auto& [k, v] : r.table(*bn, where + ".bind")) {
      const std::string key(k.str());
      const bool is_tensor = sub.tensor(key) && !std::any_of(sub.buffers.begin(), sub.buffers.end(),
                                                              [&](const ProgramTensor& b) { return b.name == key; });
      const auto all = sub.all_symbols();
      if (!is_tensor && std::find(all.begin(), all.end(), key) == all.end()) {
        std::vector<std::string> known;
        for (const auto* g : {&sub.inputs, &sub.outputs})
          for (const auto& x : *g) known.push_back(x.name);
        for (const auto& x : all) known.push_back(x);
        r.error(v, fmt::format("{}.bind: program '{}' has no input, output, symbol or scalar '{}' (it has: {})", where,
                               sub.name, key, join(known)));
      }
      if (v.is_integer()) bind[key] = std::to_string(v.as_integer()->get());
      else bind[key] = r.str(v, where + ".bind." + key);
      if (!is_tensor) {
        if (substitute(bind[key], {{index, "0"}}) != bind[key])
          r.error(v, fmt::format("{}.bind.{}: the repetition's index '{}' selects rows of buffers only "
                                 "(name[{}]); a symbol or scalar is the same for every repetition",
                                 where, key, index, index));
        try {
          Expr::parse(bind[key]);
        } catch (const ExprError& e) {
          r.error(v, fmt::format("{}.bind.{}: {} (column {} of \"{}\")", where, key, e.what_only(), e.column(),
                                 bind[key]));
        }
      }
    }
  }
  for (const auto* g : {&sub.inputs, &sub.outputs})
    for (const auto& x : *g)
      if (!bind.count(x.name))
        r.error(bn ? *bn : at, fmt::format("{}: program '{}' takes '{}'; bind gives it nothing (bind = {{ {} = \"...\" }})",
                                     where, sub.name, x.name, x.name));
  // Tensors bound: the outer buffer and, for a view, its index text.
  struct Bound {
    std::string name, index;  // index: "" where the whole buffer is bound
  };
  auto bound_of = [&](const std::string& text, const std::string& key) -> Bound {
    if (text.empty()) r.error(*bn, fmt::format("{}.bind.{}: an empty name", where, key));
    Bound b{text, ""};
    const size_t open = text.find('[');
    if (open != std::string::npos && text.back() == ']') {
      b.name = text.substr(0, open);
      b.index = text.substr(open + 1, text.size() - open - 2);
      if (b.index.find_first_not_of(' ') == std::string::npos)
        r.error(*bn, fmt::format("{}.bind.{}: '{}' has an empty index (name[row], or the name alone)", where, key, text));
    }
    const ProgramTensor* o = p.tensor(b.name);
    if (!o)
      r.error(*bn, fmt::format("{}.bind.{}: '{}' is not a buffer of this program (an input, output or buffer)", where,
                               key, b.name));
    const ProgramTensor* s = sub.tensor(key);
    if (o->dtype != s->dtype)
      r.error(*bn, fmt::format("{}.bind.{}: '{}' is {}, but program '{}' takes '{}' as {}", where, key, b.name,
                               dtype_name(o->dtype), sub.name, key, dtype_name(s->dtype)));
    const size_t dims = o->shape.size() - (b.index.empty() ? 0 : 1);
    if (dims != s->shape.size())
      r.error(*bn, fmt::format("{}.bind.{}: '{}' has {} dimensions{}, but program '{}' takes '{}' with {}", where, key,
                               text, dims, b.index.empty() ? "" : " (a row of it)", sub.name, key, s->shape.size()));
    return b;
  };
  // The symbols of the program it runs: from the dimensions of what its inputs are bound to, or from bind.
  std::map<std::string, std::string> m;  // its names -> this program's expressions
  for (const auto& [n, v] : sub.constants) m[n] = std::to_string(v);
  for (const auto& n : sub.all_symbols())
    if (bind.count(n)) m[n] = bind[n];
  for (const auto& x : sub.inputs) {
    const Bound b = bound_of(bind[x.name], x.name);
    const ProgramTensor* o = p.tensor(b.name);
    const size_t skip = b.index.empty() ? 0 : 1;
    for (size_t d = 0; d < x.shape.size(); ++d)
      if (x.shape[d].root().op == ExprOp::Var && !m.count(x.shape[d].root().name))
        m[x.shape[d].root().name] = o->shape[d + skip].str();
  }
  const std::vector<std::string> outer = p.all_symbols();
  for (const auto& n : sub.all_symbols()) {
    if (m.count(n)) continue;
    const bool own = std::find(outer.begin(), outer.end(), n) != outer.end() ||
                     std::any_of(p.constants.begin(), p.constants.end(), [&](const auto& c) { return c.first == n; });
    if (!own)
      r.error(bn ? *bn : at, fmt::format("{}: program '{}' needs '{}', which no input bound gives and this program does "
                                   "not have (bind = {{ {} = \"...\" }})", where, sub.name, n, n));
    m[n] = n;  // a scalar or symbol of the same name
  }
  // Guards: the program's own, and that every bound tensor has the shape it takes.
  std::set<std::string> have;
  for (const auto& g : p.guards) have.insert(g.str());
  // A guard over the constants alone is decided now: kept out where it holds, refused where it does not.
  auto constant = [&](const Expr& e) { return constant_value(p, e); };
  auto guard = [&](const std::string& text, const std::string& why) {
    const Expr e = Expr::parse(normal(text));
    if (auto v = constant(e)) {
      if (*v == 0) r.error(at, fmt::format("{}: {} ({} does not hold)", where, why, e.str()));
      return;
    }
    if (have.insert(e.str()).second) {
      p.guard_from.resize(p.guards.size());
      p.guards.push_back(e);
      p.guard_from.push_back(fmt::format("{}: {}", where, why));
    }
  };
  for (const auto& g : sub.guards)
    guard(substitute(g.str(), m), fmt::format("program '{}' guards '{}'", sub.name, g.str()));
  for (const auto* grp : {&sub.inputs, &sub.outputs})
    for (const auto& x : *grp) {
      const Bound b = bound_of(bind[x.name], x.name);
      const ProgramTensor* o = p.tensor(b.name);
      const size_t skip = b.index.empty() ? 0 : 1;
      for (size_t d = 0; d < x.shape.size(); ++d) {
        const std::string want = normal(substitute(x.shape[d].str(), m)), got = normal(o->shape[d + skip].str());
        if (want != got)
          guard(fmt::format("({}) == ({})", got, want),
                fmt::format("'{}' is bound to '{}', whose dimension {} is {}, but program '{}' takes {} there",
                            x.name, bind[x.name], d, got, sub.name, want));
      }
    }
  if (count == 0) return;  // bound and checked, run no times
  // Its intermediates, as this program's; its kernels, shared by every repetition.
  std::map<std::string, std::string> buffers;
  std::set<std::string> mine;  // made by this step: two of its intermediates are never one
  for (const auto& b : sub.buffers) {
    ProgramTensor x = b;
    x.shape.clear();
    for (const auto& d : b.shape) x.shape.push_back(Expr::parse(normal(substitute(d.str(), m))));
    // An intermediate another such step made, of the same type and shape, is reused (the steps run one after
    // the other); otherwise a name of its own.
    auto same = [&](const ProgramTensor* o) {
      if (!o || !made.count(o->name) || mine.count(o->name) || o->dtype != x.dtype || o->shape.size() != x.shape.size())
        return false;
      for (size_t d = 0; d < x.shape.size(); ++d)
        if (o->shape[d].str() != x.shape[d].str()) return false;
      return true;
    };
    std::string name = sub.name + "_" + b.name;
    for (int k = 2; p.tensor(name) && !same(p.tensor(name)); ++k) name = fmt::format("{}_{}{}", sub.name, b.name, k);
    if (!p.tensor(name)) {
      x.name = name;
      p.buffers.push_back(std::move(x));
      made.insert(name);
    }
    mine.insert(name);
    buffers[b.name] = name;
  }
  std::map<std::string, std::string> kernels;
  std::set<std::string> shared;  // the sub-program's kernels that are another's handle here
  for (const auto& k : sub.kernels) {
    std::string name = sub.name + "_" + k.name;
    const ProgramKernel* same = nullptr;
    for (const auto& e : p.kernels)
      if (e.spec == k.spec && e.kind == k.kind) {
        same = &e;
        name = e.name;
        break;
      }
    for (int n = 2; !same; ++n) {
      const ProgramKernel* e = p.kernel(name);
      if (!e) break;
      if (e->spec == k.spec && e->kind == k.kind) {
        same = e;
        break;
      }
      name = fmt::format("{}_{}{}", sub.name, k.name, n);
    }
    if (!same) {
      ProgramKernel x = k;
      x.name = name;
      p.kernels.push_back(std::move(x));
    } else {
      shared.insert(k.name);
    }
    kernels[k.name] = name;
  }
  // Its steps, once per repetition (a bound on what files that nest repeats may make).
  constexpr size_t kMaxSteps = size_t{1} << 16;
  if (p.steps.size() + static_cast<size_t>(count) * sub.steps.size() > kMaxSteps)
    r.error(at, fmt::format("{}: {} runs of program '{}' ({} steps each) make more than {} steps", where, count,
                            sub.name, sub.steps.size(), kMaxSteps));
  for (int64_t rep = 0; rep < count; ++rep) {
    const std::map<std::string, std::string> at_rep{{index, std::to_string(rep)}};
    for (const auto& st : sub.steps) {
      if (st.kind != ProgramStep::Kind::launch) continue;
      ProgramStep x;
      x.kernel = kernels.at(st.kernel);
      if (!st.label.empty() || shared.count(st.kernel)) x.label = sub.name + "_" + (st.label.empty() ? st.kernel : st.label);
      x.line = line;
      for (const auto& a : st.args) {
        ProgramArg y;
        if (a.kind == ProgramArg::Kind::buffer) {
          const std::string idx = a.index ? substitute(a.index->str(), m) : "";
          if (buffers.count(a.text)) {
            y.text = buffers[a.text] + (a.index ? "[" + idx + "]" : "");
          } else {
            const Bound b = bound_of(substitute(bind.at(a.text), at_rep), a.text);
            if (!b.index.empty() && a.index)
              r.error(*bn, fmt::format("{}.bind.{}: program '{}' passes a row of '{}' ('{}'), and '{}' is a row "
                                       "already: a view of a view is not supported",
                                       where, a.text, sub.name, a.text, a.written(), bind.at(a.text)));
            y.text = b.index.empty() ? b.name + (a.index ? "[" + idx + "]" : "") : b.name + "[" + b.index + "]";
          }
        } else if (a.kind == ProgramArg::Kind::integer) {
          y.text = normal(substitute(a.text, m));
        } else {
          y.text = a.text;
        }
        x.args.push_back(std::move(y));
      }
      p.steps.push_back(std::move(x));
    }
  }
}

void read_steps(Reader& r, const toml::node& ss, ProgramSpec& p) {
  const toml::array& a = r.array(ss, "steps");
  std::set<std::string> made;  // the intermediates that programs run as steps brought
  for (size_t i = 0; i < a.size(); ++i) {
    std::string where = fmt::format("steps[{}]", i);
    const toml::table& t = r.table(a[i], where);
    if (t.get("program")) {
      expand_program_step(r, t, a[i], where, p, static_cast<int>(a[i].source().begin.line), made);
      continue;
    }
    r.only(t, {"launch", "args"}, where);
    ProgramStep st;
    const toml::node* l = t.get("launch");
    if (!l) r.error(a[i], fmt::format("{}: a step says which kernel it launches (launch = \"name\")", where));
    st.kernel = r.str(*l, where + ".launch");
    if (const toml::node* ar = t.get("args"))
      for (const auto& e : r.array(*ar, where + ".args")) {
        ProgramArg x;
        if (e.is_string()) x.text = e.as_string()->get();
        else if (e.is_integer()) x.text = std::to_string(e.as_integer()->get());
        else if (e.is_floating_point()) x.text = fmt::format("{}", e.as_floating_point()->get());
        else r.error(e, fmt::format("{}.args: a buffer's name, an expression or a number", where));
        st.args.push_back(std::move(x));
      }
    st.line = static_cast<int>(a[i].source().begin.line);
    p.steps.push_back(std::move(st));
  }
}

void read_check(Reader& r, const toml::node& c, const fs::path& dir, ProgramSpec& p) {
  const toml::table& t = r.table(c, "check");
  r.only(t, {"reference", "sample", "max_rows", "reduction", "rtol", "atol"}, "check");
  ProgramCheckSpec& k = p.check;
  if (const toml::node* n = t.get("reference")) {
    const std::string ref = r.str(*n, "check.reference");
    k.reference = fs::path(ref).is_absolute() ? fs::path(ref) : dir / ref;
    std::error_code ec;
    if (!fs::is_regular_file(k.reference, ec)) r.error(*n, fmt::format("check.reference: no file {}", k.reference.string()));
  } else {
    r.error(c, "check: a reference program is what a result is checked against (reference = \"file.toml\")");
  }
  if (const toml::node* n = t.get("sample")) {
    k.sample = r.str(*n, "check.sample");
    if (std::find(p.symbols.begin(), p.symbols.end(), k.sample) == p.symbols.end())
      r.error(*n, fmt::format("check.sample: '{}' is not a symbol of the program", k.sample));
  }
  if (const toml::node* n = t.get("max_rows")) {
    if (!n->is_integer() || n->as_integer()->get() < 1 || n->as_integer()->get() > (int64_t{1} << 30))
      r.error(*n, "check.max_rows: a whole number from 1 to 2^30");
    k.max_rows = n->as_integer()->get();
  }
  if (const toml::node* n = t.get("reduction")) k.reduction = r.expr(*n, "check.reduction");
  for (const char* key : {"rtol", "atol"})
    if (const toml::node* n = t.get(key)) {
      if (!n->is_number() || n->value<double>().value_or(-1) < 0)
        r.error(*n, fmt::format("check.{}: a number, 0 or more", key));
      (std::string(key) == "rtol" ? k.rtol : k.atol) = *n->value<double>();
    }
}

}  // namespace

ProgramSpec parse_program(std::string_view text, const fs::path& path) {
  std::map<fs::path, ProgramSpec> loaded;  // for the programs its steps run, where this read is the outermost
  struct Scope {
    bool own;
    ~Scope() {
      if (own) t_loaded = nullptr;
    }
  } scope{t_loaded == nullptr};
  if (scope.own) t_loaded = &loaded;
  toml::table root = parse_toml_text(text, path);
  Reader r(path);
  if (const toml::node* kind = root.get("kind"); !kind || !kind->is_string() || kind->as_string()->get() != "program")
    for (const char* k : {"entry", "source", "members", "variants"})
      if (root.get(k))
        r.error(fmt::format("this is a kernel spec ('{}' = ...; no kind = \"program\"), not a program: `kiln tune` "
                            "tunes a kernel, `kiln compile` compiles it; `kiln run` runs programs (docs/program.md)",
                            k));
  r.only(root, {"kind", "version", "name", "backend", "constants", "symbols", "scalars", "buckets", "guards", "inputs", "outputs", "buffers",
                "kernels", "steps", "check", "description"},
         "program");
  ProgramSpec p;
  p.path = path;
  const toml::node* kind = root.get("kind");
  if (!kind || !kind->is_string() || kind->as_string()->get() != "program")
    r.error("a program file says kind = \"program\"");
  const toml::node* version = root.get("version");
  if (!version) r.error(fmt::format("a program file states its version (version = {})", ProgramSpec::kVersion));
  if (!version->is_integer() || version->as_integer()->get() != ProgramSpec::kVersion)
    r.error(*version, fmt::format("version {}: this kiln reads program files of version {}",
                                  version->is_integer() ? std::to_string(version->as_integer()->get()) : "?",
                                  ProgramSpec::kVersion));
  auto required = [&](const char* key) -> const toml::node& {
    const toml::node* n = root.get(key);
    if (!n) r.error(fmt::format("'{}' is missing", key));
    return *n;
  };
  p.name = r.str(required("name"), "name");
  p.backend = r.str(required("backend"), "backend");
  if (const toml::node* c = root.get("constants"))
    for (const auto& [k, v] : r.table(*c, "constants")) {
      if (!v.is_integer()) r.error(v, fmt::format("constants.{} must be an integer", k.str()));
      p.constants.push_back({std::string(k.str()), v.as_integer()->get()});
    }
  if (const toml::node* s = root.get("symbols"))
    for (const auto& el : r.array(*s, "symbols")) p.symbols.push_back(r.str(el, "symbols"));
  if (const toml::node* s = root.get("scalars"))
    for (const auto& el : r.array(*s, "scalars")) p.scalars.push_back(r.str(el, "scalars"));
  if (const toml::node* b = root.get("buckets"))
    for (const auto& [k, v] : r.table(*b, "buckets")) {
      const std::string n(k.str());
      if (std::find(p.scalars.begin(), p.scalars.end(), n) == p.scalars.end())
        r.error(v, fmt::format("buckets.{}: '{}' is not one of the program's scalars", n, n));
      if (r.str(v, "buckets." + n) != "pow2")
        r.error(v, fmt::format("buckets.{}: '{}' is not a bucket kiln knows (pow2)", n, v.value_or(std::string())));
      p.pow2.push_back(n);
    }
  if (const toml::node* g = root.get("guards"))
    for (const auto& el : r.array(*g, "guards")) p.guards.push_back(r.expr(el, "guards"));
  p.inputs = read_tensors(r, root, "inputs");
  p.outputs = read_tensors(r, root, "outputs");
  p.buffers = read_tensors(r, root, "buffers");
  const fs::path dir = path.parent_path();
  if (const toml::node* ks = root.get("kernels")) read_kernels(r, *ks, dir, p);
  if (const toml::node* ss = root.get("steps")) read_steps(r, *ss, p);
  if (p.steps.empty()) r.error("the program has no steps");
  if (const toml::node* c = root.get("check")) read_check(r, *c, dir, p);
  check_program(p, [&](size_t i) {
    return fmt::format("{}:{}: step {} ({})", path.string(), p.steps[i].line, i + 1, p.steps[i].kernel);
  });
  return p;
}

ProgramSpec load_program(const fs::path& file) { return parse_program(read_file(file), file); }

bool is_program_file(const fs::path& file) {
  try {
    std::string text = read_file(file);
    for (char c : text)
      if (static_cast<unsigned char>(c) >= 0x80) return false;
    toml::table root = toml::parse(text, file.string());
    const toml::node* k = root.get("kind");
    return k && k->is_string() && k->as_string()->get() == "program";
  } catch (...) {
    return false;
  }
}

ProgramBuilder::ProgramBuilder(std::string name, std::string backend) {
  p_.name = std::move(name);
  p_.backend = std::move(backend);
  p_.path = fs::path("<builder:" + p_.name + ">");
}

// The builder makes the ProgramSpec itself; build() checks it as a program
// file is checked (check_program), with the same messages.
Expr ProgramBuilder::expr(const std::string& text, const std::string& what) const {
  try {
    return Expr::parse(text);
  } catch (const ExprError& e) {
    fail(Errc::spec, "program '{}': {}: {} (column {} of \"{}\")", p_.name, what, e.what_only(), e.column(), text);
  }
}
ProgramBuilder& ProgramBuilder::constant(const std::string& name, int64_t value) {
  p_.constants.push_back({name, value});
  return *this;
}
ProgramBuilder& ProgramBuilder::symbol(const std::string& name) {
  p_.symbols.push_back(name);
  return *this;
}
ProgramBuilder& ProgramBuilder::scalar(const std::string& name) {
  p_.scalars.push_back(name);
  return *this;
}
ProgramBuilder& ProgramBuilder::state() {
  if (p_.inputs.empty()) fail(Errc::spec, "program '{}': state() follows the input it marks", p_.name);
  p_.inputs.back().state = true;
  return *this;
}
ProgramBuilder& ProgramBuilder::guard(const std::string& text) {
  p_.guards.push_back(expr(text, "guards"));
  return *this;
}
ProgramBuilder& ProgramBuilder::tensor(std::vector<ProgramTensor>& to, const char* group, const std::string& name,
                                       DType dtype, const std::vector<std::string>& shape) {
  ProgramTensor t;
  t.name = name;
  t.dtype = dtype;
  for (const auto& d : shape) t.shape.push_back(expr(d, fmt::format("{} '{}' shape", group, name)));
  to.push_back(std::move(t));
  return *this;
}
ProgramBuilder& ProgramBuilder::input(const std::string& name, DType dtype, std::vector<std::string> shape) {
  return tensor(p_.inputs, "input", name, dtype, shape);
}
ProgramBuilder& ProgramBuilder::output(const std::string& name, DType dtype, std::vector<std::string> shape) {
  return tensor(p_.outputs, "output", name, dtype, shape);
}
ProgramBuilder& ProgramBuilder::buffer(const std::string& name, DType dtype, std::vector<std::string> shape) {
  return tensor(p_.buffers, "buffer", name, dtype, shape);
}
ProgramBuilder& ProgramBuilder::kernel(const std::string& name, const fs::path& spec, const std::string& kind) {
  const fs::path abs = spec.is_absolute() ? spec : fs::absolute(spec);
  try {
    p_.kernels.push_back(load_kernel_ref(name, abs, kind));
  } catch (const Error& e) {
    fail(Errc::spec, "program '{}': kernel '{}': {}", p_.name, name, e.what());
  }
  return *this;
}
ProgramBuilder& ProgramBuilder::launch(const std::string& kernel, std::vector<std::string> args) {
  ProgramStep st;
  st.kernel = kernel;
  for (auto& a : args) {
    ProgramArg x;
    x.text = std::move(a);
    st.args.push_back(std::move(x));
  }
  p_.steps.push_back(std::move(st));
  return *this;
}
ProgramSpec ProgramBuilder::build() const {
  ProgramSpec p = p_;
  if (p.steps.empty()) fail(Errc::spec, "program '{}': the program has no steps", p.name);
  check_program(p, [&](size_t i) { return fmt::format("program '{}' step {} ({})", p.name, i + 1, p.steps[i].kernel); });
  return p;
}


}  // namespace kiln
