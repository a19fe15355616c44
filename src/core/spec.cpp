#include "kiln/spec.hpp"
#include "kiln/library.hpp"

#include <algorithm>
#include <charconv>
#include <deque>
#include <fstream>
#include <set>
#include <sstream>

#include "core/format.hpp"

#include "core/toml.hpp"

namespace kiln {

namespace fs = std::filesystem;

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::f16: case DType::bf16: return 2;
  }
  return 0;
}
const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}
const char* dtype_ctype(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::f16: return "_Float16";
    case DType::bf16: return "kiln::bf16";
  }
  return "?";
}
const char* dtype_cuda_type(DType t) {
  switch (t) {
    case DType::f16: return "__half";
    case DType::bf16: return "__nv_bfloat16";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    default: return dtype_ctype(t);
  }
}
bool dtype_is_float(DType t) { return t != DType::i32 && t != DType::i64; }
std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

const char* intent_name(Intent i) {
  switch (i) {
    case Intent::in: return "in";
    case Intent::out: return "out";
    case Intent::inout: return "inout";
  }
  return "?";
}

std::string ArgSpec::type_text() const {
  return std::string(dtype_name(dtype)) + (pointer ? "*" : "");
}

std::optional<int64_t> Config::get(std::string_view name) const {
  for (const auto& [n, v] : values)
    if (n == name) return v;
  return std::nullopt;
}

std::string Config::str() const {
  if (!library.empty()) return "library:" + library;
  if (values.empty()) return "-";
  std::string s;
  for (const auto& [n, v] : values) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}={}", n, v);
  }
  return s;
}

size_t ConfigSpace::size() const {
  size_t n = 1;
  for (const auto& p : params)
    if (__builtin_mul_overflow(n, p.values.size(), &n)) return SIZE_MAX;
  return n;
}

Config ConfigSpace::at(size_t index) const {
  Config c;
  c.values.resize(params.size());
  for (size_t i = params.size(); i-- > 0;) {
    const auto& vals = params[i].values;
    c.values[i] = {params[i].name, vals[index % vals.size()]};
    index /= vals.size();
  }
  return c;
}

std::vector<Config> ConfigSpace::all() const {
  std::vector<Config> out;
  size_t n = size();
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(at(i));
  return out;
}

std::optional<size_t> ConfigSpace::index_of(const Config& c) const {
  if (!c.library.empty() || c.values.size() != params.size()) return std::nullopt;
  size_t index = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (c.values[i].first != params[i].name) return std::nullopt;
    const auto& vals = params[i].values;
    auto it = std::find(vals.begin(), vals.end(), c.values[i].second);
    if (it == vals.end()) return std::nullopt;
    index = index * vals.size() + static_cast<size_t>(it - vals.begin());
  }
  return index;
}

const Param* ConfigSpace::find(std::string_view name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

Hash128 ConfigSpace::hash() const {
  Hasher h;
  h.add("config-space", static_cast<int64_t>(params.size()));
  for (const auto& p : params) {
    h.add("param", p.name);
    for (int64_t v : p.values) h.add("value", v);
  }
  return h.digest();
}

std::vector<std::vector<int64_t>> TuningSpec::hint_point_list() const {
  std::vector<std::vector<int64_t>> out;
  if (hints.empty()) return out;
  if (hint_points == HintPoints::diagonal) {
    size_t n = hints[0].second.size();
    for (size_t i = 0; i < n; ++i) {
      std::vector<int64_t> pt;
      for (const auto& h : hints) pt.push_back(h.second[i]);
      out.push_back(std::move(pt));
    }
    return out;
  }
  out.push_back({});
  for (const auto& h : hints) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& prefix : out)
      for (int64_t v : h.second) {
        auto pt = prefix;
        pt.push_back(v);
        next.push_back(std::move(pt));
      }
    out = std::move(next);
  }
  return out;
}

int KernelSpec::arg_index(std::string_view n) const {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name == n) return static_cast<int>(i);
  return -1;
}

std::optional<int64_t> KernelSpec::constant(std::string_view n) const {
  for (const auto& [k, v] : constants)
    if (k == n) return v;
  return std::nullopt;
}

std::string VariantSpec::name() const {
  std::string out;
  for (const auto& st : steps) out += (out.empty() ? "" : " + ") + st.kernel.name;
  return out;
}

std::string KernelSpec::path_text() const {
  return member.empty() ? spec_path.string() : spec_path.string() + ":" + member;
}

std::string_view align_target(std::string_view sym) {
  return sym.size() > 6 && sym.substr(0, 6) == "align_" ? sym.substr(6) : std::string_view();
}

namespace {
bool is_int_scalar(const KernelSpec& s, std::string_view name) {
  int i = s.arg_index(name);
  return i >= 0 && !s.args[i].pointer && !dtype_is_float(s.args[i].dtype);
}
// Integer scalars used by the launch shape and constraints (and, with
// `sizes`, by argument sizes), in argument order.
std::vector<std::string> scalars_used(const KernelSpec& s, bool sizes, bool aligns = false) {
  std::set<std::string> used;
  std::vector<std::string> align_names;
  auto take = [&](const Expr& e) {
    for (const auto& sym : e.symbols()) {
      if (is_int_scalar(s, sym)) used.insert(sym);
      // align_X of a buffer argument X (a family's align_ constants are no call's).
      if (aligns && !align_target(sym).empty() && s.arg_index(align_target(sym)) >= 0 &&
          std::find(align_names.begin(), align_names.end(), sym) == align_names.end())
        align_names.push_back(sym);
    }
  };
  if (s.zero_when) take(*s.zero_when);
  for (const auto& m : s.tensor_maps)
    for (const Expr* e : {&m.rows, &m.cols, &m.pitch, &m.box_rows, &m.box_cols}) take(*e);
  for (const auto& e : s.grid) take(e);
  for (const auto& e : s.block) take(e);
  if (s.shared) take(*s.shared);
  if (s.workspace) take(*s.workspace);
  for (const auto& e : s.constraints) take(e);
  if (sizes)
    for (const auto& a : s.args)
      if (a.pointer) take(a.size);
  std::vector<std::string> out;
  for (const auto& a : s.args)
    if (used.count(a.name)) out.push_back(a.name);
  out.insert(out.end(), align_names.begin(), align_names.end());
  return out;
}
}  // namespace

int64_t TuningSpec::key_value(const std::string& name, int64_t v) const {
  for (const auto& n : pow2)
    if (n == name) return pow2_bucket(v);
  return v;
}

std::vector<std::string> KernelSpec::unkeyed_launch_scalars() const {
  std::vector<std::string> out;
  for (const auto& n : scalars_used(*this, false, true))
    if (std::find(tuning.key.begin(), tuning.key.end(), n) == tuning.key.end()) out.push_back(n);
  return out;
}

std::string c_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\{:03o}", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<std::filesystem::path> include_dirs_in_flags(const std::vector<std::string>& cflags) {
  std::vector<std::filesystem::path> out;
  for (size_t i = 0; i < cflags.size(); ++i) {
    const std::string& f = cflags[i];
    std::string dir;
    for (const char* opt : {"-I", "-isystem", "-iquote", "-idirafter"}) {
      std::string_view o(opt);
      if (f == o && i + 1 < cflags.size()) dir = cflags[++i];
      else if (f.size() > o.size() && f.compare(0, o.size(), o) == 0) dir = f.substr(o.size());
      if (!dir.empty()) break;
    }
    if (dir.empty()) continue;
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(dir, ec);
    out.push_back(ec ? std::filesystem::path(dir) : p.lexically_normal());
  }
  return out;
}


bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

bool is_cpp_keyword(std::string_view s) {
  // C++20's keywords and alternative tokens, and the identifiers with a
  // special meaning that a declaration cannot take (final, override, import, module).
  static constexpr std::string_view kWords[] = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "final", "float",
      "for", "friend", "goto", "if", "import", "inline", "int", "long", "module", "mutable", "namespace", "new",
      "noexcept", "not", "not_eq", "nullptr", "operator", "or", "or_eq", "override", "private", "protected",
      "public", "register", "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static",
      "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local", "throw", "true",
      "try", "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile",
      "wchar_t", "while", "xor", "xor_eq"};
  for (std::string_view w : kWords)
    if (s == w) return true;
  return false;
}

// ---------------------------------------------------------------------------

namespace {

const char* node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date or time";
  }
}

// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable(), undefined
// behaviour, on some non-ASCII code points (found by fuzzing kiln; upstream
// marzer/tomlplusplus#295, fixed after 3.3.0). So toml++ is only ever given
// ASCII: non-ASCII characters in strings become \u escapes (a literal string
// is rewritten as the equal basic string), those in comments become '?', and
// anywhere else they are an error, as TOML says. Control characters and
// invalid UTF-8 are refused. A column map sends positions back to the file.
struct AsciiDoc {
  std::string text;
  std::vector<std::vector<uint32_t>> cols;  // per line: the original column of each output byte

  toml::source_position original(toml::source_position p) const {
    if (p.line == 0 || p.line > cols.size()) return p;
    const auto& c = cols[p.line - 1];
    if (c.empty()) return p;
    size_t i = p.column == 0 ? 0 : p.column - 1;
    if (i < c.size()) {
      p.column = c[i];
    } else {
      p.column = static_cast<toml::source_index>(c.back() + (i - c.size()) + 1);
    }
    return p;
  }
};

AsciiDoc asciify(std::string_view t, const fs::path& path) {
  AsciiDoc d;
  d.cols.emplace_back();
  size_t line = 1, col = 1;
  enum { code, comment, basic, literal, ml_basic, ml_literal } st = code;
  bool escaped = false;  // the previous byte was a backslash in a basic string
  auto refuse = [&](const std::string& what) {
    fail(Errc::spec, "{}:{}:{}: {}", path.string(), line, col, what);
  };
  // Appends output bytes that all stand for the input at the current column.
  auto emit = [&](std::string_view bytes) {
    for (char b : bytes) {
      d.text += b;
      d.cols.back().push_back(static_cast<uint32_t>(col));
    }
  };
  size_t i = 0;
  while (i < t.size()) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
      refuse(fmt::format("control character 0x{:02x} (TOML allows none but tab and line ends)", c));
    if (c >= 0x80) {
      int n = (c >= 0xF0 && c <= 0xF4) ? 4 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xC2 && c <= 0xDF) ? 2 : 0;
      if (n == 0 || i + n > t.size()) refuse("invalid UTF-8");
      uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
      for (int k = 1; k < n; ++k) {
        unsigned char cc = static_cast<unsigned char>(t[i + k]);
        if ((cc & 0xC0) != 0x80) refuse("invalid UTF-8");
        cp = (cp << 6) | (cc & 0x3F);
      }
      if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
          (cp >= 0xD800 && cp <= 0xDFFF))
        refuse("invalid UTF-8");
      if (st == code) refuse("a non-ASCII character outside a string or comment");
      if (st == comment) {
        emit("?");
      } else {
        if (escaped) refuse("a backslash before a non-ASCII character is not a valid escape");
        emit(cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp) : fmt::format("\\U{:08X}", cp));
      }
      escaped = false;
      i += static_cast<size_t>(n);
      ++col;
      continue;
    }
    const char ch = static_cast<char>(c);
    auto at = [&](std::string_view w) { return t.substr(i, w.size()) == w; };
    if (escaped) {
      escaped = false;
      emit(std::string_view(&ch, 1));
    } else if ((st == code && (at("\"\"\"") || at("'''"))) || (st == ml_basic && at("\"\"\"")) ||
               (st == ml_literal && at("'''"))) {
      // A multi-line string opens or closes: three bytes, one column each.
      st = st == code ? (ch == '"' ? ml_basic : ml_literal) : code;
      for (int k = 0; k < 3; ++k) {
        emit("\"");
        ++col;
      }
      i += 3;
      continue;
    } else {
      std::string_view out(&ch, 1);
      switch (st) {
        case code:
          if (ch == '#') st = comment;
          else if (ch == '"') st = basic;
          else if (ch == '\'') { st = literal; out = "\""; }
          break;
        case comment:
          if (ch == '\n') st = code;
          break;
        case basic:
          if (ch == '\\') escaped = true;
          else if (ch == '"' || ch == '\n') st = code;
          break;
        case ml_basic:
          if (ch == '\\') escaped = true;
          break;
        case literal:
        case ml_literal:
          if (st == literal && ch == '\'') { st = code; out = "\""; }
          else if (st == literal && ch == '\n') st = code;
          else if (ch == '\\') out = "\\\\";
          else if (ch == '"') out = "\\\"";
          break;
      }
      emit(out);
    }
    if (ch == '\n') {
      ++line;
      col = 1;
      d.cols.emplace_back();
    } else {
      ++col;
    }
    ++i;
  }
  return d;
}

class SpecReader {
 public:
  SpecReader(const fs::path& path, const SourceReader& read, const AsciiDoc& doc)
      : path_(path), read_(read), doc_(doc) {}

  [[noreturn]] void error(const toml::source_region& at, const std::string& what) const {
    if (at.begin.line == 0) fail(Errc::spec, "{}: {}", path_.string(), what);
    toml::source_position p = doc_.original(at.begin);
    fail(Errc::spec, "{}:{}:{}: {}", path_.string(), p.line, p.column, what);
  }
  [[noreturn]] void error(const toml::node& at, const std::string& what) const {
    error(at.source(), what);
  }

  const std::string& str(const toml::node& n, const std::string& key) const {
    if (!n.is_string()) error(n, fmt::format("'{}' must be a string, not {}", key, node_type_name(n)));
    return n.as_string()->get();
  }
  int64_t integer(const toml::node& n, const std::string& key) const {
    if (!n.is_integer())
      error(n, fmt::format("'{}' must be an integer, not {}", key, node_type_name(n)));
    return n.as_integer()->get();
  }
  const toml::array& array(const toml::node& n, const std::string& key) const {
    if (!n.is_array()) error(n, fmt::format("'{}' must be an array, not {}", key, node_type_name(n)));
    return *n.as_array();
  }
  const toml::table& table(const toml::node& n, const std::string& key) const {
    if (!n.is_table()) error(n, fmt::format("'{}' must be a table, not {}", key, node_type_name(n)));
    return *n.as_table();
  }

  void only_keys(const toml::table& t, std::initializer_list<std::string_view> allowed,
                 const std::string& where) const {
    for (auto&& [k, v] : t) {
      bool ok = std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end();
      if (!ok) {
        std::string list;
        for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        error(k.source(), fmt::format("unknown key '{}'{} (allowed: {})", k.str(), where, list));
      }
    }
  }

  // [tuning] buckets = { S = "pow2" }: key names whose records are kept by bucket.
  std::vector<std::string> read_buckets(const toml::node& n, const std::vector<std::string>& key) const {
    std::vector<std::string> out;
    for (const auto& [k, v] : table(n, "tuning.buckets")) {
      const std::string name(k.str());
      if (std::find(key.begin(), key.end(), name) == key.end())
        error(v, fmt::format("tuning.buckets: '{}' is not in the tuning key (a bucket keeps a key's records)", name));
      if (str(v, "tuning.buckets." + name) != "pow2")
        error(v, fmt::format("tuning.buckets.{}: '{}' is not a bucket kiln knows (pow2)", name, v.value_or(std::string())));
      out.push_back(name);
    }
    return out;
  }

  // Parses an expression stored in a string node; errors point into the string.
  Expr expr(const toml::node& n, const std::string& key) const {
    const std::string& text = str(n, key);
    try {
      return Expr::parse(text);
    } catch (const ExprError& e) {
      expr_error(n, key, e);
    }
  }

  [[noreturn]] void expr_error(const toml::node& n, const std::string& key, const ExprError& e) const {
    toml::source_region at = n.source();
    // The node's column is its opening quote; the expression's column counts from 1.
    at.begin.column = static_cast<toml::source_index>(at.begin.column + e.column());
    error(at, fmt::format("{}: {} (column {} of \"{}\")", key, e.what_only(), e.column(),
                          n.as_string() ? n.as_string()->get() : std::string()));
  }

  fs::path resolve(const std::string& rel) const {
    fs::path p(rel);
    if (p.is_absolute()) return p;
    return path_.parent_path() / p;
  }

  const toml::node& required(const toml::table& root, const char* key) const {
    const toml::node* n = root.get(key);
    if (!n) error(toml::source_region{}, fmt::format("missing required key '{}'", key));
    return *n;
  }

  KernelSpec read(const toml::table& root) {
    only_keys(root, {"name", "backend", "source", "entry", "grid", "block", "shared", "zero", "zero_when", "args",
                     "params", "tuning", "constraints", "include_dirs", "cflags", "library", "description", "target",
                     "tensor_maps", "pdl", "early_reads", "workspace"},
              "");
    KernelSpec s;
    s.spec_path = path_;
    s.constants = constants_;
    read_identity(s, root);
    read_args(s, required(root, "args"));
    if (const toml::node* p = root.get("params")) read_params(s, *p);
    read_source(s, required(root, "source"));
    check_arg_sizes(s);
    read_launch(s, root);
    read_zero(s, root);
    if (const toml::node* tm = root.get("tensor_maps")) read_tensor_maps(s, *tm);
    if (const toml::node* c = root.get("constraints")) s.constraints = exprs(s, *c, "constraints", 0, SIZE_MAX);
    if (const toml::node* lib = root.get("library"))
      for (const auto& el : array(*lib, "library")) read_library(s, el);
    if (const toml::node* t = root.get("tuning")) read_tuning(s, *t);
    if (!s.tuning.key_given) s.tuning.key = scalars_used(s, true);
    if (s.tuning.key.size() > 8) {
      const toml::node* t = root.get("tuning");
      error(t ? t->source() : toml::source_region{},
            fmt::format("{} integer scalars would select a tuning record ({}); kiln takes at most 8: give "
                        "[tuning] key",
                        s.tuning.key.size(), fmt::join(s.tuning.key, ", ")));
    }
    return s;
  }

  // name, backend, entry, description, include_dirs, cflags, target.
  void read_identity(KernelSpec& s, const toml::table& root) const {
    const toml::node& name = required(root, "name");
    s.name = str(name, "name");
    if (!is_identifier(s.name)) error(name, fmt::format("name '{}' is not an identifier", s.name));

    const toml::node& backend = required(root, "backend");
    s.backend = str(backend, "backend");
    if (s.backend != "cpu" && s.backend != "cuda")
      error(backend, fmt::format("unknown backend '{}' (known: cpu, cuda)", s.backend));

    const toml::node& entry = required(root, "entry");
    s.entry = str(entry, "entry");
    if (!is_identifier(s.entry)) error(entry, fmt::format("entry '{}' is not an identifier", s.entry));

    if (const toml::node* d = root.get("description")) str(*d, "description");

    if (const toml::node* inc = root.get("include_dirs")) {
      for (const auto& el : array(*inc, "include_dirs"))
        s.include_dirs.push_back(resolve(str(el, "include_dirs")));
    }
    if (const toml::node* fl = root.get("cflags")) {
      for (const auto& el : array(*fl, "cflags")) s.cflags.push_back(str(el, "cflags"));
    }
    // cuda: the one architecture the kernel is built for (sm_90a: Hopper's
    // own instructions, wgmma), whatever KILN_CUDA_ARCH or the device says.
    if (const toml::node* t = root.get("target")) {
      const std::string& v = str(*t, "target");
      bool ok = v.size() >= 5 && v.compare(0, 3, "sm_") == 0;
      for (size_t i = 3; ok && i < v.size(); ++i)
        ok = std::isdigit(static_cast<unsigned char>(v[i])) || (i + 1 == v.size() && (v[i] == 'a' || v[i] == 'f'));
      if (!ok) error(*t, fmt::format("target: '{}' is not a GPU architecture such as sm_90a", v));
      s.cflags.push_back("--gpu-architecture=" + v);
    }
  }

  void read_source(KernelSpec& s, const toml::node& source) {
    const std::string& src = str(source, "source");
    if (src.empty()) error(source, "'source' is empty");
    s.source_path = resolve(src);
    std::optional<std::string> text = read_(s.source_path);
    if (!text)
      error(source, fmt::format("source file '{}' not found (looked at {})", src, s.source_path.string()));
    s.source_text = std::move(*text);
  }

  // Checks an expression's symbols: integer scalar args, params, and the
  // alignment of a buffer argument (align_<name>); errors point into it.
  void check(const KernelSpec& s, const toml::node& n, const std::string& key, const Expr& e) const {
    for (const auto& sym : e.symbols()) {
      int i = s.arg_index(sym);
      if (i >= 0 && (s.args[i].pointer || dtype_is_float(s.args[i].dtype))) {
        // Find the column of the symbol for the error.
        try {
          e.check_symbols([&](std::string_view x) { return x != sym; }, "");
        } catch (const ExprError& err) {
          expr_error(n, key,
                     ExprError(err.column(),
                               fmt::format("'{}' is {} argument; expressions use integer scalars and params", sym,
                                           s.args[i].pointer ? "a pointer" : "a float"),
                               e.str()));
        }
      }
    }
    auto known = [&](std::string_view sym) {
      if (sym == kSmCountSymbol || s.constant(sym)) return true;
      int i = s.arg_index(sym);
      if (i >= 0) return !s.args[i].pointer && !dtype_is_float(s.args[i].dtype);
      if (std::string_view t = align_target(sym); !t.empty()) {
        int p = s.arg_index(t);
        return p >= 0 && s.args[p].pointer;
      }
      return s.space.find(sym) != nullptr;
    };
    try {
      e.check_symbols(known, known_symbols(s));
    } catch (const ExprError& err) {
      expr_error(n, key, err);
    }
  }

  // An array of `min`..`max` checked expressions under `key`.
  std::vector<Expr> exprs(const KernelSpec& s, const toml::node& n, const char* key, size_t min, size_t max) const {
    const toml::array& arr = array(n, key);
    if (arr.size() < min || arr.size() > max)
      error(n, fmt::format("'{}' needs {} to {} expressions, got {}", key, min, max, arr.size()));
    std::vector<Expr> out;
    for (size_t i = 0; i < arr.size(); ++i) {
      std::string k = fmt::format("{}[{}]", key, i);
      Expr e = expr(arr[i], k);
      check(s, arr[i], k, e);
      out.push_back(std::move(e));
    }
    return out;
  }

  // The caller allocates arguments before any config is chosen: sizes use scalars only.
  void check_arg_sizes(const KernelSpec& s) const {
    for (size_t i = 0; i < s.args.size(); ++i) {
      if (!s.args[i].pointer) continue;
      const toml::node& sz = *arg_tables_[i]->get("size");
      std::string key = fmt::format("args[{}].size", i);
      check(s, sz, key, s.args[i].size);
      try {
        s.args[i].size.check_symbols([&](std::string_view x) {
          return s.space.find(x) == nullptr && align_target(x).empty() && x != kSmCountSymbol; }, "");
      } catch (const ExprError& err) {
        expr_error(sz, key,
                   ExprError(err.column(),
                             fmt::format("the size of '{}' uses a param or SM_COUNT; argument sizes may use "
                                         "scalars only",
                                         s.args[i].name),
                             s.args[i].size.str()));
      }
    }
  }

  // grid, block, shared, workspace, pdl.
  void read_launch(KernelSpec& s, const toml::table& root) const {
    s.grid = exprs(s, required(root, "grid"), "grid", 1, 3);
    if (const toml::node* b = root.get("block")) {
      if (s.backend != "cuda")
        error(*b, "'block' (threads per block) is for the cuda backend; a cpu kernel runs one program "
                  "instance per grid point");
      s.block = exprs(s, *b, "block", 1, 3);
    }
    // An expression key of cuda kernels only (`what` says what it is, in the error).
    auto cuda_expr = [&](const char* key, const char* what) -> std::optional<Expr> {
      const toml::node* n = root.get(key);
      if (!n) return std::nullopt;
      if (s.backend != "cuda") error(*n, fmt::format("'{}' ({}) is for the cuda backend", key, what));
      Expr e = expr(*n, key);
      check(s, *n, key, e);
      return e;
    };
    s.shared = cuda_expr("shared", "dynamic shared memory per block");
    s.workspace = cuda_expr("workspace", "device memory kiln keeps for the kernel");
    if (const toml::node* p = root.get("pdl")) {
      if (!p->is_boolean()) error(*p, "'pdl' is true or false");
      if (s.backend != "cuda")
        error(*p, "'pdl' (a launch that may overlap the kernel before it) is for the cuda backend");
      s.pdl = p->as_boolean()->get();
    }
    if (const toml::node* e = root.get("early_reads")) {
      if (s.backend != "cuda")
        error(*e, "'early_reads' (buffers read before kiln_wait_prior()) is for the cuda backend");
      if (!s.pdl)
        error(*e, "'early_reads' (buffers read before kiln_wait_prior()) needs pdl = true: a kernel launched "
                  "without it never overlaps the kernel before it, and reads nothing early");
      for (const auto& el : array(*e, "early_reads")) {
        const std::string& name = str(el, "early_reads");
        const int i = s.arg_index(name);
        if (i < 0 || !s.args[i].pointer || s.args[i].intent != Intent::in)
          error(el, fmt::format("early_reads: '{}' is not an input buffer argument (intent in): a kernel reads "
                                "before its wait only what it never writes",
                                name));
        if (i >= 64) error(el, fmt::format("early_reads: '{}' is argument {}; only the first 64 can be", name, i));
        if (std::find(s.early_reads.begin(), s.early_reads.end(), name) != s.early_reads.end())
          error(el, fmt::format("early_reads: '{}' appears twice", name));
        s.early_reads.push_back(name);
      }
    }
  }

  // zero, zero_when.
  void read_zero(KernelSpec& s, const toml::table& root) const {
    if (const toml::node* z = root.get("zero")) {
      for (const auto& el : array(*z, "zero")) {
        const std::string& name = str(el, "zero");
        int i = s.arg_index(name);
        if (i < 0 || !s.args[i].pointer || s.args[i].intent == Intent::in)
          error(el, fmt::format("zero: '{}' is not an out or inout buffer argument", name));
        if (std::find(s.zero.begin(), s.zero.end(), name) != s.zero.end())
          error(el, fmt::format("zero: '{}' appears twice", name));
        if (s.zero.size() == 4) error(el, "zero: at most 4 buffers");
        s.zero.push_back(name);
      }
    }
    if (const toml::node* zw = root.get("zero_when")) {
      if (s.zero.empty()) error(*zw, "zero_when without zero");
      Expr e = expr(*zw, "zero_when");
      check(s, *zw, "zero_when", e);
      s.zero_when = std::move(e);
    }
  }

  // tensor_maps: TMA descriptors of buffer arguments (cuda). In a kernel family, an entry
  // whose buffer the member lacks (Bg in a member of one weight) is left out.
  void read_tensor_maps(KernelSpec& s, const toml::node& n) const {
    if (s.backend != "cuda") error(n, "tensor_maps: TMA tensor maps are for the cuda backend");
    for (const auto& el : array(n, "tensor_maps")) {
      const toml::table& t = table(el, "tensor_maps");
      only_keys(t, {"of", "rows", "cols", "pitch", "box_rows", "box_cols", "swizzle"}, " in a tensor_maps entry");
      TensorMapSpec m;
      m.of = str(required(t, "of"), "tensor_maps.of");
      const int i = s.arg_index(m.of);
      if (i < 0 && s.constant("align_" + m.of)) continue;  // a family's operand this member lacks
      if (i < 0 || !s.args[i].pointer)
        error(*t.get("of"), fmt::format("tensor_maps.of: '{}' is not a buffer argument", m.of));
      const DType dt = s.args[i].dtype;
      if (dt != DType::f32 && dt != DType::f16 && dt != DType::bf16 && dt != DType::i32)
        error(*t.get("of"), fmt::format("tensor_maps.of: '{}' is {}; a tensor map views f32, f16, bf16 or i32 elements",
                                        m.of, dtype_name(dt)));
      auto field = [&](const char* key, Expr& out) {
        const toml::node& v = required(t, key);
        const std::string where = std::string("tensor_maps.") + key;
        out = expr(v, where);
        check(s, v, where, out);
      };
      field("rows", m.rows);
      field("cols", m.cols);
      if (t.get("pitch")) field("pitch", m.pitch);
      else m.pitch = m.cols;
      field("box_rows", m.box_rows);
      field("box_cols", m.box_cols);
      if (const toml::node* sw = t.get("swizzle")) {
        const int64_t v = integer(*sw, "tensor_maps.swizzle");
        if (v != 0 && v != 32 && v != 64 && v != 128)
          error(*sw, fmt::format("tensor_maps.swizzle: {} (one of 0, 32, 64, 128 bytes)", v));
        m.swizzle = static_cast<int>(v);
      }
      if (s.tensor_maps.size() == 4) error(el, "tensor_maps: at most 4");
      s.tensor_maps.push_back(std::move(m));
    }
  }

  // One library entry: a call kiln knows, or "name#a-b", the choices name#a
  // to name#b (ranked algorithms of a library); its arguments must be the spec's.
  void read_library(KernelSpec& s, const toml::node& el) const {
    std::vector<std::string> names = {str(el, "library")};
    if (auto hash = names[0].rfind('#'), dash = names[0].rfind('-');
        hash != std::string::npos && dash != std::string::npos && dash > hash) {
      int a = -1, b = -1;
      std::string_view sa(names[0].data() + hash + 1, dash - hash - 1), sb(names[0].data() + dash + 1);
      auto ra = std::from_chars(sa.data(), sa.data() + sa.size(), a);
      auto rb = std::from_chars(sb.data(), sb.data() + sb.size(), b);
      if (sa.empty() || sb.empty() || ra.ptr != sa.data() + sa.size() || rb.ptr != sb.data() + sb.size() || a < 0 ||
          b < a || b >= kLibraryRanks)
        error(el, fmt::format("library: '{}': a range is name#a-b with 0 <= a <= b < {}", names[0], kLibraryRanks));
      std::string base = names[0].substr(0, hash);
      names.clear();
      for (int k = a; k <= b; ++k) names.push_back(fmt::format("{}#{}", base, k));
    }
    for (const std::string& name : names) {
      std::string why;
      std::optional<LibraryChoice> c = parse_library_choice(name, &why);
      if (!c) error(el, fmt::format("library: '{}': {}", name, why));
      // The problem decides the arguments; which library implements it is
      // the backend's to say (an unknown library is unavailable there, with why).
      const auto want = c->args();
      if (want.size() != s.args.size())
        error(el, fmt::format("library: '{}' takes {} arguments ({}); the spec has {}", name, want.size(),
                              c->what(), s.args.size()));
      for (size_t i = 0; i < s.args.size(); ++i) {
        const ArgSpec& a = s.args[i];
        const auto& [type, intent] = want[i];
        if (a.cell && !c->may_be_cell(i))
          error(el, fmt::format("library: '{}' cannot read args[{}] '{}' from a cell; only an attention problem's S "
                                "may be one", name, i, a.name));
        if (a.type_text() != type || (a.pointer && a.intent != intent))
          error(el, fmt::format("library: '{}' takes {} {} as argument {}, but args[{}] '{}' is {}{}", name,
                                a.pointer ? intent_name(intent) : "", type, i, i, a.name, a.type_text(),
                                a.pointer ? std::string(" ") + intent_name(a.intent) : ""));
      }
      if (std::find(s.libraries.begin(), s.libraries.end(), name) != s.libraries.end())
        error(el, fmt::format("library: '{}' appears twice", name));
      s.libraries.push_back(name);
    }
  }

  static bool is_int_scalar(const KernelSpec& s, std::string_view sym) {
    int i = s.arg_index(sym);
    return i >= 0 && !s.args[i].pointer && !dtype_is_float(s.args[i].dtype);
  }

  // [family]: the problem its members compute and their names.
  std::vector<std::string> family_members(const toml::table& root) const {
    const toml::table& fam = table(required(root, "family"), "family");
    only_keys(fam, {"problem", "members"}, " in [family]");
    const toml::node& problem = required(fam, "problem");
    if (str(problem, "family.problem") != "gemm")
      error(problem, fmt::format("family.problem: unknown '{}' (known: gemm)", str(problem, "family.problem")));
    std::vector<std::string> members;
    for (const auto& el : array(required(fam, "members"), "family.members")) {
      const std::string& m = str(el, "family.members");
      std::optional<GemmProblem> p = parse_gemm_problem(m);
      if (!p || p->member_text() != m)
        error(el, fmt::format("family.members: '{}' is not a GEMM problem spelt <dtype>_<nn|nt>[_rmsnorm][_<epilogue>] "
                              "(epilogues: bias, residual, silu, gelu, bias_gelu, gated)", m));
      if (std::find(members.begin(), members.end(), m) != members.end())
        error(el, fmt::format("family.members: '{}' appears twice", m));
      members.push_back(m);
    }
    if (members.empty()) error(fam, "family.members is empty");
    return members;
  }

  // The spec of one member of a kernel family (kind = "family"; docs/families.md):
  // the family's keys, with `name` = <family>_<member>, the problem's arguments,
  // its defines added to cflags, library entries completed with the problem, and
  // the member's own [member.<name>] keys over the family's, made of `root` in
  // place. Sets the constants its expressions may use.
  void make_member(toml::table& root, std::string_view member) {
    only_keys(root, {"kind", "name", "backend", "source", "entry", "grid", "block", "shared", "zero", "zero_when",
                     "params", "tuning", "constraints", "include_dirs", "cflags", "library", "description", "target",
                     "family", "member", "tensor_maps", "pdl", "early_reads", "workspace"},
              " in a kernel family (its members' arguments follow their problem: no 'args')");
    const std::vector<std::string> members = family_members(root);
    const std::string family = str(required(root, "name"), "name");
    if (member.empty())
      fail(Errc::spec, "{}: a kernel family ({}); name a member as {}:<member> (members: {})", path_.string(),
           family, path_.string(), fmt::join(members, ", "));
    if (std::find(members.begin(), members.end(), member) == members.end())
      fail(Errc::spec, "{}: the family '{}' has no member '{}' (members: {})", path_.string(), family, member,
           fmt::join(members, ", "));
    const GemmProblem p = *parse_gemm_problem(member);

    root.erase("kind");
    root.erase("family");
    if (toml::node* own = root.get("member")) {
      for (auto&& [k, v] : table(*own, "member"))
        if (std::find(members.begin(), members.end(), k.str()) == members.end())
          error(k.source(), fmt::format("member.{}: not one of family.members", k.str()));
      // Moved, not copied, so that errors still point into the file.
      if (toml::node* mine = own->as_table()->get(member)) {
        const std::string where = fmt::format("member.{}", member);
        only_keys(table(*mine, where), {"library", "params", "tuning", "description"}, " in [" + where + "]");
        for (auto&& [k, v] : *mine->as_table()) {
          toml::node* base = root.get(k.str());
          if (base && base->is_table() && v.is_table()) {
            for (auto&& [kk, vv] : *v.as_table()) base->as_table()->insert_or_assign(kk, std::move(vv));
          } else {
            root.insert_or_assign(k, std::move(v));
          }
        }
      }
      root.erase("member");
    }
    root.insert_or_assign("name", family + "_" + std::string(member));
    toml::array args;
    for (const ProblemArg& a : p.arguments()) {
      toml::table t{{"name", a.name}, {"type", a.type}};
      if (!a.size.empty()) {
        t.insert("size", a.size);
        t.insert("intent", intent_name(a.intent));
      }
      args.push_back(std::move(t));
    }
    root.insert_or_assign("args", std::move(args));
    const std::vector<ProblemArg> have = p.arguments();
    auto has_arg = [&](const std::string& name) {
      return std::any_of(have.begin(), have.end(), [&](const ProblemArg& a) { return a.name == name; });
    };
    const std::vector<std::string>& ops = gemm_operand_names();
    // early_reads names operands of the problem (the weights: B, Bg, Bu): each member keeps those it has.
    if (toml::node* er = root.get("early_reads"); er && er->is_array()) {
      toml::array& arr = *er->as_array();
      for (auto it = arr.begin(); it != arr.end();) {
        const std::string* name = it->is_string() ? &it->as_string()->get() : nullptr;
        const bool operand = name && std::find(ops.begin(), ops.end(), *name) != ops.end();
        if (operand && !has_arg(*name)) it = arr.erase(it);  // (a name no problem has is left for the error)
        else ++it;
      }
    }
    if (!root.get("cflags")) root.insert("cflags", toml::array{});
    array(*root.get("cflags"), "cflags");  // an array, or an error
    for (const std::string& d : p.defines()) root.get("cflags")->as_array()->push_back(d);
    if (toml::node* lib = root.get("library")) {
      array(*lib, "library");  // an array, or an error
      for (auto& el : *lib->as_array()) {
        str(el, "library");  // a string, or an error
        std::string& e = el.as_string()->get();
        const size_t hash = e.find('#');
        if (e.substr(0, hash).find('_') != std::string::npos)
          error(el, fmt::format("library: '{}': a family's library entry names the library alone (cublaslt#0-7); "
                                "each member adds its problem", e));
        e.insert(hash == std::string::npos ? e.size() : hash, "_" + p.text());
      }
    }
    constants_ = {{"WEIGHTS", p.weights()},
                  {"B_NT", p.layout == GemmLayout::nt ? 1 : 0},
                  {"RESIDUAL", p.epilogue == GemmEpilogue::residual ? 1 : 0},
                  {"RMSNORM", p.rmsnorm ? 1 : 0}};
    for (const std::string& op : ops)
      if (!has_arg(op)) constants_.push_back({"align_" + op, 256});
  }

  // An expression of the multi-kernel's integer scalars only.
  void check_scalars_only(const KernelSpec& s, const toml::node& n, const std::string& key, const Expr& e) const {
    try {
      e.check_symbols([&](std::string_view sym) { return is_int_scalar(s, sym); }, known_symbols(s));
    } catch (const ExprError& err) {
      expr_error(n, key, err);
    }
  }

  MultiKernelSpec read_multi(const toml::table& root,
                             const std::function<KernelSpec(const fs::path&)>& load_variant) {
    only_keys(root, {"name", "kind", "args", "scratch", "tuning", "variants", "description"}, " in a multi-kernel spec");
    MultiKernelSpec m;
    m.spec_path = path_;
    // Arguments are read as a kernel's are (names, types, sizes, intents).
    KernelSpec s;
    const toml::node& name = required(root, "name");
    m.name = str(name, "name");
    if (!is_identifier(m.name)) error(name, fmt::format("name '{}' is not an identifier", m.name));
    if (const toml::node* d = root.get("description")) str(*d, "description");
    read_args(s, required(root, "args"));
    for (size_t i = 0; i < s.args.size(); ++i)
      if (s.args[i].pointer)
        check_scalars_only(s, *arg_tables_[i]->get("size"), fmt::format("args[{}].size", i), s.args[i].size);
    m.args = s.args;
    if (const toml::node* sc = root.get("scratch")) {
      const toml::array& arr = array(*sc, "scratch");
      for (size_t i = 0; i < arr.size(); ++i) m.scratch.push_back(read_scratch(m, s, arr[i], i));
    }
    if (const toml::node* t = root.get("tuning")) {
      const toml::table& tt = table(*t, "tuning");
      only_keys(tt, {"key", "buckets"}, " in the [tuning] of a multi-kernel spec");
      if (const toml::node* k = tt.get("key")) {
        for (const auto& el : array(*k, "tuning.key")) {
          const std::string& kn = str(el, "tuning.key");
          if (!is_int_scalar(s, kn)) error(el, fmt::format("tuning.key: '{}' is not an integer scalar argument", kn));
          if (std::find(m.key.begin(), m.key.end(), kn) != m.key.end())
            error(el, fmt::format("tuning.key: '{}' appears twice", kn));
          m.key.push_back(kn);
        }
      }
      if (const toml::node* b = tt.get("buckets")) m.pow2 = read_buckets(*b, m.key);
    }
    const toml::node& vs = required(root, "variants");
    const toml::array& varr = array(vs, "variants");
    if (varr.empty()) error(vs, "'variants' is empty");
    for (size_t i = 0; i < varr.size(); ++i) m.variants.push_back(read_variant(m, s, varr[i], i, load_variant));
    return m;
  }

  ScratchSpec read_scratch(const MultiKernelSpec& m, const KernelSpec& s, const toml::node& node, size_t i) const {
    std::string where = fmt::format("scratch[{}]", i);
    const toml::table& t = table(node, where);
    only_keys(t, {"name", "type", "size"}, " in " + where);
    ScratchSpec x;
    const toml::node* n = t.get("name");
    const toml::node* ty = t.get("type");
    const toml::node* sz = t.get("size");
    if (!n || !ty || !sz) error(node, fmt::format("{} needs name, type and size", where));
    x.name = str(*n, where + ".name");
    check_new_name(s, *n, x.name, "scratch");
    for (const auto& other : m.scratch)
      if (other.name == x.name) error(*n, fmt::format("duplicate name '{}'", x.name));
    std::string type = str(*ty, where + ".type");
    bool found = false;
    for (DType d : kAllDTypes)
      if (type == std::string(dtype_name(d)) + "*") x.dtype = d, found = true;
    if (!found)
      error(*ty, fmt::format("{}: unknown type '{}' (scratch buffers are f32*, f64*, i32*, i64*, f16* or bf16*)",
                             where, type));
    x.size = expr(*sz, where + ".size");
    check_scalars_only(s, *sz, where + ".size", x.size);
    return x;
  }

  // A variant: one launch ({spec, args}) or several in order ({steps = [{spec, args}, ...]}).
  VariantSpec read_variant(MultiKernelSpec& m, const KernelSpec& s, const toml::node& node, size_t i,
                           const std::function<KernelSpec(const fs::path&)>& load_variant) const {
    std::string where = fmt::format("variants[{}]", i);
    const toml::table& t = table(node, where);
    VariantSpec v;
    if (const toml::node* st = t.get("steps")) {
      only_keys(t, {"steps"}, " in " + where + " (a variant of several launches lists them under steps alone)");
      const toml::array& arr = array(*st, where + ".steps");
      if (arr.empty()) error(*st, fmt::format("{}.steps is empty", where));
      if (arr.size() > kMaxVariantSteps)
        error(*st, fmt::format("{}.steps has {} launches; kiln takes at most {}", where, arr.size(), kMaxVariantSteps));
      std::vector<std::string> written;  // scratch buffers an earlier step writes
      for (size_t k = 0; k < arr.size(); ++k)
        v.steps.push_back(read_step(m, s, arr[k], fmt::format("{}.steps[{}]", where, k), load_variant, &written));
    } else {
      v.steps.push_back(read_step(m, s, node, where, load_variant, nullptr));
    }
    return v;
  }

  // One launch: a kernel spec and, per its argument, one of ours or a scratch
  // buffer of the same type, or an expression of our integer scalars for an
  // integer scalar. `written` (steps only): the scratch buffers earlier steps
  // write, which a step may read; without it no scratch may be read.
  VariantStep read_step(MultiKernelSpec& m, const KernelSpec& s, const toml::node& node, const std::string& where,
                        const std::function<KernelSpec(const fs::path&)>& load_variant,
                        std::vector<std::string>* written) const {
    const toml::table& t = table(node, where);
    only_keys(t, {"spec", "args"}, " in " + where);
    const toml::node* sp = t.get("spec");
    const toml::node* va = t.get("args");
    if (!sp || !va) error(node, fmt::format("{} needs spec and args", where));
    VariantStep v;
    v.kernel = load_variant(resolve(str(*sp, where + ".spec")));
    if (m.backend.empty()) m.backend = v.kernel.backend;
    if (v.kernel.backend != m.backend)
      error(*sp, fmt::format("{}: backend {} differs from the first variant's ({})", where, v.kernel.backend, m.backend));
    const toml::array& names = array(*va, where + ".args");
    if (names.size() != v.kernel.args.size())
      error(*va, fmt::format("{}: {} names for the {} arguments of kernel '{}'", where, names.size(),
                             v.kernel.args.size(), v.kernel.name));
    std::vector<std::string> writes;
    for (size_t j = 0; j < names.size(); ++j) {
      const std::string& an = str(names[j], where + ".args");
      const ArgSpec& want = v.kernel.args[j];
      int ai = s.arg_index(an);
      const ScratchSpec* sc = nullptr;
      for (const auto& x : m.scratch)
        if (x.name == an) sc = &x;
      if (ai < 0 && !sc) {
        if (want.pointer || dtype_is_float(want.dtype))
          error(names[j], fmt::format("{}: '{}' is neither an argument nor a scratch buffer", where, an));
        // An integer scalar computed from ours.
        Expr e;
        try {
          e = Expr::parse(an);
        } catch (const ExprError& err) {
          error(names[j], fmt::format("{}: '{}' is neither an argument, a scratch buffer nor an expression of the "
                                      "integer scalars: {}", where, an, err.what_only()));
        }
        check_scalars_only(s, names[j], where + ".args", e);
        v.args.push_back(an);
        continue;
      }
      if (sc) {
        if (!want.pointer || want.dtype != sc->dtype)
          error(names[j], fmt::format("{}: scratch '{}' ({}*) passed as '{}' ({})", where, an, dtype_name(sc->dtype),
                                      want.name, want.type_text()));
        const bool written_before =
            written && std::find(written->begin(), written->end(), an) != written->end();
        // One launch: scratch it only reads starts undefined. Steps: a step may read what an earlier one wrote.
        if (written ? want.intent != Intent::out && !written_before : want.intent == Intent::in)
          error(names[j], fmt::format("{}: scratch '{}' passed as '{}', which the kernel reads; scratch starts "
                                      "undefined{}", where, an, want.name,
                                      written ? " (no earlier step writes it)" : ""));
        if (want.intent != Intent::in) writes.push_back(an);
      } else {
        const ArgSpec& have = s.args[ai];
        if (have.pointer != want.pointer || have.dtype != want.dtype)
          error(names[j], fmt::format("{}: '{}' ({}) passed as '{}' ({})", where, an, have.type_text(), want.name,
                                      want.type_text()));
        if (have.pointer && have.intent == Intent::in && want.intent != Intent::in)
          error(names[j], fmt::format("{}: the variant writes '{}' (as '{}'), which the multi-kernel declares "
                                      "intent = \"in\"", where, an, want.name));
        if (written && have.pointer && have.intent == Intent::out && want.intent != Intent::out &&
            std::find(written->begin(), written->end(), an) == written->end())
          error(names[j], fmt::format("{}: '{}' (intent = \"out\") passed as '{}', which the kernel reads, and no "
                                      "earlier step writes it", where, an, want.name));
        if (have.pointer && want.intent != Intent::in) writes.push_back(an);
      }
      v.args.push_back(an);
    }
    if (written) written->insert(written->end(), writes.begin(), writes.end());
    return v;
  }

  static std::string known_symbols(const KernelSpec& s) {
    std::string out;
    for (const auto& a : s.args)
      if (!a.pointer && !dtype_is_float(a.dtype)) out += (out.empty() ? "" : ", ") + a.name;
    for (const auto& a : s.args)
      if (a.pointer) out += (out.empty() ? "" : ", ") + ("align_" + a.name);
    for (const auto& p : s.space.params) out += (out.empty() ? "" : ", ") + p.name;
    for (const auto& c : s.constants) out += (out.empty() ? "" : ", ") + c.first;
    out += (out.empty() ? "" : ", ") + std::string(kSmCountSymbol);
    return out;
  }

  void check_new_name(const KernelSpec& s, const toml::node& at, const std::string& n,
                      const char* what) const {
    if (!is_identifier(n)) error(at, fmt::format("{} name '{}' is not an identifier", what, n));
    if (n == "cdiv" || n == "min" || n == "max")
      error(at, fmt::format("{} name '{}' is a function of the expression language", what, n));
    if (n.rfind("kiln_", 0) == 0) error(at, fmt::format("{} name '{}': the prefix kiln_ is reserved", what, n));
    if (s.arg_index(n) >= 0 || s.space.find(n))
      error(at, fmt::format("duplicate name '{}': args and params share one namespace", n));
    if (n == kSmCountSymbol || s.constant(n))
      error(at, fmt::format("{} name '{}' is a name kiln gives expressions (the device's SM_COUNT, or a "
                            "family's constant)", what, n));
  }

  void read_args(KernelSpec& s, const toml::node& n) {
    const toml::array& arr = array(n, "args");
    if (arr.empty()) error(n, "'args' is empty: a kernel takes at least one argument");
    for (size_t i = 0; i < arr.size(); ++i) {
      std::string where = fmt::format("args[{}]", i);
      const toml::table& t = table(arr[i], where);
      arg_tables_.push_back(&t);
      only_keys(t, {"name", "type", "size", "intent", "cell"}, " in " + where);
      ArgSpec a;
      const toml::node* name = t.get("name");
      if (!name) error(arr[i], fmt::format("{}: missing 'name'", where));
      a.name = str(*name, where + ".name");
      check_new_name(s, *name, a.name, "argument");
      const toml::node* type = t.get("type");
      if (!type) error(arr[i], fmt::format("{} '{}': missing 'type'", where, a.name));
      std::string ty = str(*type, where + ".type");
      if (!ty.empty() && ty.back() == '*') {
        a.pointer = true;
        ty.pop_back();
      }
      if (auto d = dtype_from_name(ty)) a.dtype = *d;
      else
        error(*type, fmt::format("{} '{}': unknown type '{}' (known: f32, f64, i32, i64, f16, bf16, and "
                                 "pointers to them such as f32*)",
                                 where, a.name, str(*type, "")));
      const toml::node* size = t.get("size");
      const toml::node* intent = t.get("intent");
      if (a.pointer) {
        if (!size) error(arr[i], fmt::format("{} '{}': a pointer needs 'size' (its element count)", where, a.name));
        a.size = expr(*size, where + ".size");
        if (!intent) error(arr[i], fmt::format("{} '{}': a pointer needs 'intent' (in, out or inout)", where, a.name));
        std::string in = str(*intent, where + ".intent");
        if (in == "in") a.intent = Intent::in;
        else if (in == "out") a.intent = Intent::out;
        else if (in == "inout") a.intent = Intent::inout;
        else error(*intent, fmt::format("{} '{}': unknown intent '{}' (known: in, out, inout)", where, a.name, in));
      } else {
        if (size) error(*size, fmt::format("{} '{}': a size expression on a scalar", where, a.name));
        if (intent) error(*intent, fmt::format("{} '{}': an intent on a scalar (scalars are always in)", where, a.name));
      }
      if (const toml::node* cell = t.get("cell")) {
        const auto b = cell->value<bool>();
        if (!cell->is_boolean() || !b) error(*cell, fmt::format("{} '{}': 'cell' is true or false", where, a.name));
        if (*b && (a.pointer || a.dtype != DType::i64))
          error(*cell, fmt::format("{} '{}': a cell is an i64 scalar (the kernel reads it with kiln_cell)", where,
                                   a.name));
        a.cell = *b;
      }
      s.args.push_back(std::move(a));
    }
  }

  void read_params(KernelSpec& s, const toml::node& n) {
    const toml::table& t = table(n, "params");
    // toml++ tables iterate in key order; keep the order of the file instead.
    std::vector<std::pair<const toml::key*, const toml::node*>> entries;
    for (auto&& [k, v] : t) entries.push_back({&k, &v});
    std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      const auto& x = a.first->source().begin;
      const auto& y = b.first->source().begin;
      return x.line != y.line ? x.line < y.line : x.column < y.column;
    });
    for (const auto& [k, v] : entries) {
      std::string name(k->str());
      std::string where = "params." + name;
      check_new_name(s, *v, name, "param");
      Param p;
      p.name = name;
      const toml::array& vals = array(*v, where);
      if (vals.empty()) error(*v, fmt::format("{} has no values", where));
      for (const auto& el : vals) {
        int64_t x = integer(el, where);
        if (std::find(p.values.begin(), p.values.end(), x) != p.values.end())
          error(el, fmt::format("{}: duplicate value {}", where, x));
        p.values.push_back(x);
      }
      s.space.params.push_back(std::move(p));
    }
    if (s.space.size() > ConfigSpace::kMaxConfigs)
      error(n, s.space.size() == SIZE_MAX
                   ? fmt::format("the config space has more configs than a 64-bit count holds; kiln takes at most {}",
                                 ConfigSpace::kMaxConfigs)
                   : fmt::format("the config space has {} configs; kiln takes at most {}", s.space.size(),
                                 ConfigSpace::kMaxConfigs));
  }

  Config read_config(const KernelSpec& s, const toml::node& n, const std::string& where) const {
    const toml::table& t = table(n, where);
    for (auto&& [k, v] : t)
      if (!s.space.find(k.str()))
        error(k.source(), fmt::format("{}: '{}' is not a param", where, k.str()));
    Config c;
    for (const auto& p : s.space.params) {
      const toml::node* v = t.get(p.name);
      if (!v) error(n, fmt::format("{}: missing a value for param '{}'", where, p.name));
      int64_t x = integer(*v, where + "." + p.name);
      if (std::find(p.values.begin(), p.values.end(), x) == p.values.end())
        error(*v, fmt::format("{}: {} = {} is not one of the param's values", where, p.name, x));
      c.values.push_back({p.name, x});
    }
    return c;
  }

  void read_tuning(KernelSpec& s, const toml::node& n) {
    const toml::table& t = table(n, "tuning");
    only_keys(t, {"key", "hints", "hint_points", "search", "default", "reference", "rtol", "atol", "registers_by",
                  "reduction", "buckets"},
              " in [tuning]");
    TuningSpec& ts = s.tuning;
    if (const toml::node* k = t.get("key")) {
      ts.key_given = true;
      for (const auto& el : array(*k, "tuning.key")) {
        const std::string& name = str(el, "tuning.key");
        int i = s.arg_index(name);
        if (i < 0) error(el, fmt::format("tuning.key: '{}' is not an argument", name));
        if (s.args[i].pointer || dtype_is_float(s.args[i].dtype))
          error(el, fmt::format("tuning.key: '{}' is not an integer scalar", name));
        if (std::find(ts.key.begin(), ts.key.end(), name) != ts.key.end())
          error(el, fmt::format("tuning.key: '{}' appears twice", name));
        ts.key.push_back(name);
      }
    }
    if (const toml::node* b = t.get("buckets")) {
      if (!ts.key_given) error(*b, "tuning.buckets: name the tuning key it buckets (key = [...])");
      ts.pow2 = read_buckets(*b, ts.key);
    }
    if (const toml::node* h = t.get("hints")) {
      const toml::table& ht = table(*h, "tuning.hints");
      for (auto&& [k, v] : ht)
        if (std::find(ts.key.begin(), ts.key.end(), k.str()) == ts.key.end())
          error(k.source(), fmt::format("tuning.hints: '{}' is not in tuning.key", k.str()));
      for (const auto& name : ts.key) {
        const toml::node* v = ht.get(name);
        if (!v) error(*h, fmt::format("tuning.hints: no hints for key '{}'", name));
        std::vector<int64_t> vals;
        std::string where = "tuning.hints." + name;
        const toml::array& arr = array(*v, where);
        if (arr.empty()) error(*v, fmt::format("{} has no values", where));
        for (const auto& el : arr) {
          int64_t x = integer(el, where);
          if (x <= 0) error(el, fmt::format("{}: hint {} is not positive", where, x));
          if (std::find(vals.begin(), vals.end(), x) != vals.end())
            error(el, fmt::format("{}: duplicate value {}", where, x));
          vals.push_back(x);
        }
        ts.hints.push_back({name, std::move(vals)});
      }
    }
    if (const toml::node* hp = t.get("hint_points")) {
      const std::string& v = str(*hp, "tuning.hint_points");
      if (v == "diagonal") ts.hint_points = HintPoints::diagonal;
      else if (v == "grid") ts.hint_points = HintPoints::grid;
      else error(*hp, fmt::format("tuning.hint_points: unknown '{}' (known: diagonal, grid)", v));
      if (ts.hints.empty()) error(*hp, "tuning.hint_points without tuning.hints");
    }
    if (ts.hint_points == HintPoints::diagonal && ts.hints.size() > 1) {
      size_t n0 = ts.hints[0].second.size();
      for (const auto& [name, vals] : ts.hints)
        if (vals.size() != n0)
          error(*t.get("hints"), fmt::format("tuning.hints: diagonal hint points need the same number of "
                                             "hints per key ('{}' has {}, '{}' has {}); or set "
                                             "hint_points = \"grid\"",
                                             ts.hints[0].first, n0, name, vals.size()));
    }
    if (const toml::node* se = t.get("search")) {
      const std::string& v = str(*se, "tuning.search");
      ts.search_given = true;
      if (v == "exhaustive") ts.search = SearchKind::exhaustive;
      else if (v == "coordesc") ts.search = SearchKind::coordesc;
      else if (v == "budgeted") ts.search = SearchKind::budgeted;
      else error(*se, fmt::format("tuning.search: unknown '{}' (known: exhaustive, coordesc, budgeted)", v));
    }
    if (const toml::node* rb = t.get("registers_by")) {
      for (const auto& el : array(*rb, "tuning.registers_by")) {
        const std::string& name = str(el, "tuning.registers_by");
        if (!s.space.find(name)) error(el, fmt::format("tuning.registers_by: '{}' is not a param", name));
        if (std::find(ts.registers_by.begin(), ts.registers_by.end(), name) != ts.registers_by.end())
          error(el, fmt::format("tuning.registers_by: '{}' appears twice", name));
        ts.registers_by.push_back(name);
      }
    }
    if (const toml::node* d = t.get("default")) ts.default_config = read_config(s, *d, "tuning.default");
    if (const toml::node* r = t.get("reference")) ts.reference_config = read_config(s, *r, "tuning.reference");
    auto tol = [&](const char* key, double& out) {
      if (const toml::node* v = t.get(key)) {
        if (v->is_floating_point()) out = v->as_floating_point()->get();
        else if (v->is_integer()) out = static_cast<double>(v->as_integer()->get());
        else error(*v, fmt::format("tuning.{} must be a number, not {}", key, node_type_name(*v)));
        if (!(out >= 0)) error(*v, fmt::format("tuning.{} must be >= 0", key));
      }
    };
    tol("rtol", ts.rtol);
    tol("atol", ts.atol);
    if (const toml::node* r = t.get("reduction")) {
      Expr e = expr(*r, "tuning.reduction");
      for (const auto& sym : e.symbols())
        if (!is_int_scalar(s, sym))
          error(*r, fmt::format("tuning.reduction: '{}' is not an integer scalar argument (the sums' length "
                                "follows the call, not a config)",
                                sym));
      ts.reduction = std::move(e);
    }
  }

 private:
  fs::path path_;
  const SourceReader& read_;
  std::vector<std::pair<std::string, int64_t>> constants_;  // a family member's
  const AsciiDoc& doc_;
  std::vector<const toml::table*> arg_tables_;
};


}  // namespace

namespace {

// A spec's kind = "..." ("multi", "family"), or "" for a plain kernel spec.
std::string kind_of(const toml::table& root) {
  const toml::node* k = root.get("kind");
  return k && k->is_string() ? k->as_string()->get() : "";
}

toml::table parse_toml(const AsciiDoc& doc, const fs::path& spec_path) {
  try {
    return toml::parse(doc.text, spec_path.string());
  } catch (const TomlCheckFailed& e) {
    fail(Errc::spec, "{}: not valid TOML (the parser's check '{}' failed; look for a malformed key or table header)",
         spec_path.string(), e.expr);
  } catch (const toml::parse_error& e) {
    const auto b = doc.original(e.source().begin);
    fail(Errc::spec, "{}:{}:{}: {}", spec_path.string(), b.line, b.column, e.description());
  }
}

std::optional<std::string> read_text(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream f(p, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string read_spec_file(const fs::path& spec_file) {
  std::optional<std::string> text = read_text(spec_file);
  if (!text) fail(Errc::spec, "{}: cannot read the spec file ({})", spec_file.string(), errno_text(errno ? errno : ENOENT));
  return *text;
}

// A spec's text made ASCII (for toml++, with the original columns kept for
// errors) and parsed.
struct ParsedSpec {
  AsciiDoc doc;
  toml::table root;
};
ParsedSpec parse_spec_text(std::string_view text, const fs::path& spec_path) {
  ParsedSpec p{asciify(text, spec_path), {}};
  p.root = parse_toml(p.doc, spec_path);
  return p;
}

// For readers of a spec's tables alone (a multi-kernel's, a family's members).
const SourceReader no_sources = [](const fs::path&) -> std::optional<std::string> { return std::nullopt; };

}  // namespace

KernelSpec parse_spec(std::string_view toml_text, const fs::path& spec_path, const SourceReader& read_source) {
  return parse_spec(toml_text, spec_path, read_source, "");
}

KernelSpec parse_spec(std::string_view toml_text, const fs::path& spec_path, const SourceReader& read_source,
                      std::string_view member) {
  auto [doc, root] = parse_spec_text(toml_text, spec_path);
  const std::string kind = kind_of(root);
  if (kind == "multi")
    fail(Errc::spec, "{}: a multi-kernel spec (kind = \"multi\"); load it as a multi-kernel", spec_path.string());
  SpecReader r(spec_path, read_source, doc);
  if (kind == "family") {
    r.make_member(root, member);
    KernelSpec s = r.read(root);
    s.member = std::string(member);
    return s;
  }
  if (kind == "program")
    fail(Errc::spec, "{}: a program (kind = \"program\"), not a kernel spec: run it with `kiln run`, or compile "
         "its kernels with `kiln compile`", spec_path.string());
  if (const toml::node* k = root.get("kind"))
    r.error(*k, fmt::format("kind: unknown '{}' for a kernel spec (known: family, multi, program)", kind));
  if (!member.empty())
    fail(Errc::spec, "{}: not a kernel family (kind = \"family\"), so it has no member '{}'", spec_path.string(),
         member);
  return r.read(root);
}

std::vector<std::string> family_members(const fs::path& file) {
  auto [doc, root] = parse_spec_text(read_spec_file(file), file);
  if (kind_of(root) != "family") return {};
  return SpecReader(file, no_sources, doc).family_members(root);
}

std::pair<fs::path, std::string> split_member(const fs::path& spec_path) {
  const std::string text = spec_path.string();
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || !is_identifier(std::string_view(text).substr(colon + 1))) return {spec_path, ""};
  std::error_code ec;
  if (fs::exists(spec_path, ec)) return {spec_path, ""};
  return {fs::path(text.substr(0, colon)), text.substr(colon + 1)};
}

MultiKernelSpec parse_multi_spec(std::string_view toml_text, const fs::path& spec_path,
                                 const std::function<KernelSpec(const fs::path&)>& load_variant) {
  auto [doc, root] = parse_spec_text(toml_text, spec_path);
  if (kind_of(root) != "multi")
    fail(Errc::spec, "{}: not a multi-kernel spec (it needs kind = \"multi\")", spec_path.string());
  SpecReader r(spec_path, no_sources, doc);
  return r.read_multi(root, load_variant);
}

MultiKernelSpec load_multi_spec(const fs::path& file) {
  return parse_multi_spec(read_spec_file(file), file, [](const fs::path& p) { return load_spec(p); });
}

bool is_multi_spec(const fs::path& spec) {
  const auto [file, member] = split_member(spec);
  if (!member.empty()) return false;
  return kind_of(parse_spec_text(read_spec_file(file), file).root) == "multi";
}

KernelSpec load_spec(const fs::path& spec) {
  const auto [file, member] = split_member(spec);
  return parse_spec(read_spec_file(file), file, read_text, member);
}

}  // namespace kiln
