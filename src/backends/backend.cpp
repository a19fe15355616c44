#include "kiln/ext/backend.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include "kiln/ext/library.hpp"

#include "backends/cpu/cpu_backend.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "core/format.hpp"
#include "kiln/args.hpp"

namespace kiln {

CompileRequest make_compile_request(const KernelSpec& spec, const Config& config) {
  CompileRequest r;
  r.backend = spec.backend;
  r.kernel = spec.name;
  r.config_text = config.str();
  r.entry = spec.entry;
  std::error_code ec;
  auto abs = std::filesystem::absolute(spec.source_path, ec);
  r.source_name = (ec ? spec.source_path : abs.lexically_normal()).string();
  r.source_text = spec.source_text;
  r.include_dirs.push_back(std::filesystem::path(r.source_name).parent_path().string());
  for (const auto& d : spec.include_dirs) r.include_dirs.push_back(d.string());
  r.defines = config.values;
  for (const auto& a : spec.args) r.args.push_back({a.name, a.dtype, a.pointer});
  r.tensor_maps = static_cast<int>(spec.tensor_maps.size());
  r.workspace = spec.workspace.has_value();
  r.pdl = spec.pdl;
  r.cflags = spec.cflags;
  return r;
}

namespace {
thread_local const CellBinding* t_cells = nullptr;
thread_local int t_ncell = 0;
}  // namespace

CellScope::CellScope(const CellBinding* bindings, int n) : prev_(t_cells), prev_n_(t_ncell) {
  t_cells = bindings;
  t_ncell = n;
}
CellScope::~CellScope() {
  t_cells = prev_;
  t_ncell = prev_n_;
}

void* const* with_cells(void* const* params, const LaunchDims& d, CellParams& room) {
  if (d.ncell == 0 || t_ncell == 0) return params;
  bool any = false;
  for (int c = 0; c < d.ncell; ++c) {
    int64_t v = 0;
    std::memcpy(&v, params[d.cell_arg[c]], sizeof v);
    for (int b = 0; b < t_ncell; ++b)
      if (t_cells[b].value == v) {
        if (!any) {
          for (int i = 0; i < d.nargs; ++i) room.ptrs[i] = params[i];
          any = true;
        }
        room.values[c] = -static_cast<int64_t>(reinterpret_cast<uintptr_t>(t_cells[b].word));
        room.ptrs[d.cell_arg[c]] = &room.values[c];
        break;
      }
  }
  return any ? room.ptrs : params;
}

namespace {
thread_local EarlyReadScope* t_early = nullptr;
}  // namespace

EarlyReadScope::EarlyReadScope(const std::vector<EarlyReadRange>* ranges, Stream stream, bool serial_first)
    : ranges_(ranges), stream_(stream), first_(serial_first), prev_(t_early) {
  t_early = this;
}
EarlyReadScope::~EarlyReadScope() { t_early = prev_; }

bool may_overlap(void* const* params, const LaunchDims& d, Stream s) {
  EarlyReadScope* sc = t_early;
  if (sc && sc->first_ && s == sc->stream_) {
    sc->first_ = false;  // this launch waits for what came before the scope: those after it cannot pass it
    return false;
  }
  if (d.early == 0) return true;
  if (!sc || s != sc->stream_ || !sc->ranges_) return false;
  const std::vector<EarlyReadRange>& r = *sc->ranges_;
  for (uint64_t m = d.early; m; m &= m - 1) {
    const int i = __builtin_ctzll(m);
    uintptr_t p = 0;
    std::memcpy(&p, params[i], sizeof p);
    // The last range that begins at or below p holds it, or none does.
    auto it = std::upper_bound(r.begin(), r.end(), p, [](uintptr_t v, const EarlyReadRange& x) { return v < x.begin; });
    if (it == r.begin() || p >= std::prev(it)->end) return false;
  }
  return true;
}

LaunchPlan::LaunchPlan(const KernelSpec& spec, const Config& config, const LaunchLimits& limits)
    : limits_(limits), kernel_(spec.name), config_(config.str()) {
  for (const auto& e : spec.grid) grid_.push_back(compile_expr(spec, e, &config, &limits));
  for (const auto& e : spec.block) block_.push_back(compile_expr(spec, e, &config, &limits));
  if (spec.shared) {
    shared_ = compile_expr(spec, *spec.shared, &config, &limits);
    has_shared_ = true;
  }
  if (spec.workspace) {
    workspace_ = compile_expr(spec, *spec.workspace, &config, &limits);
    has_workspace_ = true;
  }
  for (const auto& name : spec.zero) {
    int i = spec.arg_index(name);
    Expr bytes(ExprNode{ExprOp::Mul, 0, "", 0,
                        {spec.args[i].size.root(), ExprNode{ExprOp::Const, static_cast<int64_t>(dtype_size(spec.args[i].dtype)), "", 0, {}}}});
    zero_.push_back({i, compile_expr(spec, bytes, &config)});
  }
  if (spec.zero_when) {
    zero_when_ = compile_expr(spec, *spec.zero_when, &config, &limits);
    has_zero_when_ = true;
  }
  nargs_ = static_cast<int>(spec.args.size());
  pdl_ = spec.pdl;
  for (const auto& name : spec.early_reads) {
    const int i = spec.arg_index(name);
    if (i < 0 || i >= 64)
      fail(Errc::spec, "kernel '{}': early_reads: '{}' is not one of its first 64 arguments", spec.name, name);
    early_ |= uint64_t(1) << i;
  }
  for (size_t i = 0; i < spec.args.size(); ++i)
    if (spec.args[i].cell) cells_.push_back(static_cast<int>(i));
  if (cells_.size() > 4 || (!cells_.empty() && spec.args.size() > static_cast<size_t>(CellParams::kMaxArgs)))
    fail(Errc::spec, "kernel '{}': {} cell arguments among {} (at most 4 among {})", spec.name, cells_.size(),
           spec.args.size(), CellParams::kMaxArgs);
  for (const auto& m : spec.tensor_maps) {
    const int i = spec.arg_index(m.of);
    auto c = [&](const Expr& e) { return compile_expr(spec, e, &config, &limits); };
    tmaps_.push_back({i, spec.args[i].dtype, m.swizzle, c(m.rows), c(m.cols), c(m.pitch), c(m.box_rows), c(m.box_cols),
                      compile_expr(spec, spec.args[i].size, nullptr)});
  }
}

LaunchDims LaunchPlan::eval(const int64_t* slots) const {
  LaunchDims d;
  int64_t* g[3] = {&d.grid.x, &d.grid.y, &d.grid.z};
  for (size_t i = 0; i < grid_.size(); ++i) *g[i] = grid_[i].eval(slots);
  int64_t* b[3] = {&d.block.x, &d.block.y, &d.block.z};
  for (size_t i = 0; i < block_.size(); ++i) *b[i] = block_[i].eval(slots);
  if (has_shared_) d.shared = shared_.eval(slots);
  d.pdl = pdl_;
  d.early = early_;
  if (d.empty()) return d;
  if (has_workspace_) {
    d.nargs = nargs_;
    d.workspace = workspace_.eval(slots);
    if (d.workspace < 0 || d.workspace > LaunchDims::kMaxWorkspaceBytes)
      throw Error(Errc::launch, fmt::format("kernel '{}' (config {}): a workspace of {} bytes", kernel_, config_,
                                            d.workspace));
  }
  if (!cells_.empty()) {
    d.nargs = nargs_;
    d.ncell = static_cast<int>(cells_.size());
    for (size_t i = 0; i < cells_.size(); ++i) {
      d.cell_arg[i] = cells_[i];
      // A negative value passed as a cell would be read as an address (kiln_cell).
      if (slots[cells_[i]] < 0)
        throw Error(Errc::launch, fmt::format("kernel '{}' (config {}): its cell argument {} is {}; a cell argument is "
                                              "never negative", kernel_, config_, cells_[i], slots[cells_[i]]));
    }
  }
  if (!zero_.empty() && (!has_zero_when_ || zero_when_.eval(slots) != 0)) {
    d.nzero = static_cast<int>(zero_.size());
    for (size_t i = 0; i < zero_.size(); ++i) {
      d.zero_arg[i] = zero_[i].first;
      d.zero_bytes[i] = zero_[i].second.eval(slots);
    }
  }
  if (!tmaps_.empty()) {
    d.nargs = nargs_;
    d.ntmap = static_cast<int>(tmaps_.size());
    for (size_t i = 0; i < tmaps_.size(); ++i) {
      const TensorMapPlan& m = tmaps_[i];
      d.tmap[i] = {m.arg,          m.dtype,         m.swizzle,           m.rows.eval(slots), m.cols.eval(slots),
                   m.pitch.eval(slots), m.box_rows.eval(slots), m.box_cols.eval(slots)};
      const TensorMapDims& t = d.tmap[i];
      int64_t last = 0;
      if (t.rows > 0 && t.cols > 0 &&
          (__builtin_mul_overflow(t.rows - 1, t.pitch, &last) || __builtin_add_overflow(last, t.cols, &last) ||
           last > m.size.eval(slots)))
        throw Error(Errc::launch, fmt::format("kernel '{}' (config {}): tensor map {} ({} x {}, pitch {}) reaches past "
                                              "its buffer's {} elements",
                                              kernel_, config_, i, t.rows, t.cols, t.pitch, m.size.eval(slots)));
    }
  }
  // Cheap checks every call makes; check() says why in words.
  int64_t total = 0, threads = 0;
  if (__builtin_mul_overflow(d.grid.x, d.grid.y, &total) || __builtin_mul_overflow(total, d.grid.z, &total) ||
      total > limits_.grid_total || d.grid.x > limits_.grid[0] || d.grid.y > limits_.grid[1] ||
      d.grid.z > limits_.grid[2] || d.block.x < 1 || d.block.y < 1 || d.block.z < 1 ||
      d.block.x > limits_.block[0] || d.block.y > limits_.block[1] || d.block.z > limits_.block[2] ||
      __builtin_mul_overflow(d.block.x * d.block.y, d.block.z, &threads) || threads > limits_.block_threads ||
      d.shared < 0 || (has_shared_ && d.shared > limits_.shared))
    throw Error(Errc::launch, check(d));
  return d;
}

std::string LaunchPlan::check(const LaunchDims& d) const {
  if (d.empty()) return "";
  auto where = [&] {
    return fmt::format("kernel '{}' (config {}): grid ({}, {}, {}), block ({}, {}, {}), shared {} bytes", kernel_,
                       config_, d.grid.x, d.grid.y, d.grid.z, d.block.x, d.block.y, d.block.z, d.shared);
  };
  int64_t total = 0;
  if (__builtin_mul_overflow(d.grid.x, d.grid.y, &total) || __builtin_mul_overflow(total, d.grid.z, &total))
    return where() + ": the grid's size overflows 64 bits";
  if (total > limits_.grid_total) return fmt::format("{}: {} program instances, more than {}", where(), total, limits_.grid_total);
  static const char* axis = "xyz";
  const int64_t gv[3] = {d.grid.x, d.grid.y, d.grid.z}, bv[3] = {d.block.x, d.block.y, d.block.z};
  for (int i = 0; i < 3; ++i)
    if (gv[i] > limits_.grid[i])
      return fmt::format("{}: grid {} = {} exceeds the device's limit of {}", where(), axis[i], gv[i], limits_.grid[i]);
  for (int i = 0; i < 3; ++i) {
    if (bv[i] < 1) return fmt::format("{}: block {} = {} (must be at least 1)", where(), axis[i], bv[i]);
    if (bv[i] > limits_.block[i])
      return fmt::format("{}: block {} = {} exceeds the device's limit of {}", where(), axis[i], bv[i],
                         limits_.block[i]);
  }
  int64_t threads = 0;
  if (__builtin_mul_overflow(d.block.x * d.block.y, d.block.z, &threads) || threads > limits_.block_threads)
    return fmt::format("{}: {} threads per block, more than the device's {}", where(), d.block.x * d.block.y * d.block.z,
                       limits_.block_threads);
  if (d.shared < 0) return where() + ": negative shared memory";
  if (has_shared_ && d.shared > limits_.shared)
    return fmt::format("{}: {} bytes of shared memory, more than the device's {}", where(), d.shared, limits_.shared);
  return "";
}

namespace {
// Whether `e` is the same for every call of a config: it names params and a
// family's constants only (no call scalar, no alignment, no SM_COUNT).
bool same_for_every_call(const KernelSpec& spec, const Expr& e) {
  for (const auto& sym : e.symbols())
    if (!spec.space.find(sym) && !spec.constant(sym)) return false;
  return true;
}
}  // namespace

std::string statically_pruned(const KernelSpec& spec, const Config& c, const LaunchLimits& limits) {
  if (!c.library.empty()) return "";
  try {
    for (const auto& e : spec.constraints)
      if (same_for_every_call(spec, e) && compile_expr(spec, e, &c).eval(nullptr) == 0)
        return fmt::format("constraint '{}' is false for every call", e.str());
    int64_t threads = 1;
    for (size_t i = 0; i < spec.block.size(); ++i) {
      if (!same_for_every_call(spec, spec.block[i])) return "";
      int64_t b = compile_expr(spec, spec.block[i], &c).eval(nullptr);
      if (b < 1 || b > limits.block[i])
        return fmt::format("block {} = {} is outside the device's 1 to {}", "xyz"[i], b, limits.block[i]);
      threads *= b;
    }
    if (threads > limits.block_threads)
      return fmt::format("{} threads per block, more than the device's {}", threads, limits.block_threads);
    if (spec.shared && same_for_every_call(spec, *spec.shared)) {
      int64_t sh = compile_expr(spec, *spec.shared, &c).eval(nullptr);
      if (sh > limits.shared)
        return fmt::format("{} bytes of shared memory per block, more than the device's {}", sh, limits.shared);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string register_sibling_key(const KernelSpec& spec, const Config& c) {
  std::string k;
  for (const auto& name : spec.tuning.registers_by) k += fmt::format("{}={} ", name, c.get(name).value_or(0));
  return k;
}

int learned_registers(const Backend& backend, const KernelMeta& meta) {
  if (meta.registers <= 0) return 0;
  // Launch bounds held the compiler to fewer threads than its registers
  // allow: its register count then follows the block, not the siblings'.
  if (meta.max_threads > 0 && meta.max_threads < backend.max_threads_for_registers(meta.registers)) return 0;
  return meta.registers;
}

std::string pruned_by_sibling_registers(const Backend& backend, const KernelSpec& spec, const Config& c, int registers,
                                        const std::string& sibling) {
  const int most = backend.max_threads_for_registers(registers);
  if (most <= 0 || !c.library.empty()) return "";
  int64_t threads = 1;
  try {
    for (const auto& e : spec.block) {
      if (!same_for_every_call(spec, e)) return "";  // the block depends on the call
      threads *= compile_expr(spec, e, &c).eval(nullptr);
    }
  } catch (const Error&) {
    return "";
  }
  if (threads <= most) return "";
  return fmt::format("{} threads per block, but its sibling {} was compiled to {} registers a thread, which allows {}",
                     threads, sibling, registers, most);
}

std::string Backend::check_resources(const KernelMeta& meta, const LaunchDims& dims) {
  if (dims.empty()) return "";
  int64_t threads = dims.block.x * dims.block.y * dims.block.z;
  if (meta.max_threads > 0 && threads > meta.max_threads)
    return fmt::format("{} threads per block, more than the {} its compiled code allows ({} registers a thread)",
                       threads, meta.max_threads, meta.registers);
  LaunchLimits l = limits();
  if (l.shared > 0 && meta.static_shared + dims.shared > l.shared)
    return fmt::format("{} bytes of shared memory ({} static + {} dynamic), more than the device's {}",
                       meta.static_shared + dims.shared, meta.static_shared, dims.shared, l.shared);
  return "";
}

Library* Backend::library(const std::string& library_name) {
  for (Library* l : libraries())
    if (l->name() == library_name) return l;
  return nullptr;
}

// The choice `name` and its library here; null with `why` when the name is
// malformed or this backend calls no such library.
Library* Backend::resolve_library(const std::string& name, std::optional<LibraryChoice>* choice, std::string* why) {
  *choice = parse_library_choice(name, why);
  if (!*choice) {
    *why = fmt::format("'{}' is no library choice: {}", name, *why);
    return nullptr;
  }
  Library* l = library((*choice)->library);
  if (!l) {
    std::string known;
    for (Library* x : libraries()) known += (known.empty() ? "" : ", ") + x->name();
    *why = fmt::format("the {} backend calls no library '{}' (it calls: {})", this->name(), (*choice)->library,
                       known.empty() ? "none" : known);
  }
  return l;
}

std::string Backend::library_unavailable(const std::string& name) {
  std::optional<LibraryChoice> c;
  std::string why;
  Library* l = resolve_library(name, &c, &why);
  if (!l) return why;
  if (c->rank >= 0 && !l->ranked()) return fmt::format("{} does not rank algorithms: '#{}' names none", l->name(), c->rank);
  if (c->rank < 0 && l->ranked()) return fmt::format("{} ranks algorithms: name one as {}#k", l->name(), name);
  if (std::string no = c->attention ? l->implements_attention(*c->attention) : l->implements(c->problem); !no.empty())
    return no;
  return l->unavailable();
}

bool Backend::library_plans_per_shape(const std::string& name) {
  std::optional<LibraryChoice> c;
  std::string why;
  Library* l = resolve_library(name, &c, &why);
  return l && l->plans_per_shape();
}

std::string Backend::library_identity(const std::string& name) {
  std::optional<LibraryChoice> c;
  std::string why;
  Library* l = resolve_library(name, &c, &why);
  return l ? name + " " + l->identity() : name;
}

void Backend::check_libraries(const KernelSpec& spec) {
  for (const auto& name : spec.libraries) {
    std::optional<LibraryChoice> c;
    std::string why;
    if (!resolve_library(name, &c, &why))
      fail(Errc::spec, "{}: kernel '{}': library choice '{}': {}", spec.spec_path.string(), spec.name, name, why);
  }
}

std::shared_ptr<LoadedKernel> Backend::load_library(const Binary& bin) {
  const std::string name = bin.meta.symbol.substr(8);
  if (std::string why = library_unavailable(name); !why.empty())
    fail(Errc::launch, "kernel '{}': library choice '{}' is unavailable: {}", bin.kernel, name, why);
  std::optional<LibraryChoice> c;
  std::string why;
  return resolve_library(name, &c, &why)->load(bin.key, bin.meta, *c);
}

Binary library_binary(const std::string& backend, const std::string& name, const std::string& kernel,
                      const std::string& key) {
  Binary b;
  b.key = key;
  b.backend = backend;
  b.kernel = kernel;
  b.config_text = "library:" + name;
  b.entry = name;
  b.meta.symbol = "library:" + name;
  b.meta.target = "library";
  b.bytes.assign(name.begin(), name.end());
  return b;
}

bool is_library_binary(const Binary& b) { return b.meta.symbol.rfind("library:", 0) == 0; }

std::shared_ptr<Backend> make_backend(const std::string& name, const Options& opts) {
  if (name == "cpu") return std::make_shared<CpuBackend>(opts);
  if (name == "cuda") return make_cuda_backend(opts);
  fail(Errc::usage, "unknown backend '{}' (known: cpu, cuda)", name);
}

}  // namespace kiln
