// Program: runs a ProgramSpec through kiln's handles. docs/program.md.
#include "kiln/memory_plan.hpp"
#include "kiln/program.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <list>
#include <map>

#include "compile/compile_pool.hpp"
#include "core/format.hpp"
#include "kiln/ext/tuner.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/kernel.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/runtime.hpp"
#include "program/check.hpp"

namespace kiln {

namespace {

// A kernel run plain (ProgramOptions::plain): one config, untuned: the
// spec's default where it can run the call, else the first that can.
struct PlainKernel final : Launchable {
  PlainKernel(Runtime& r, KernelSpec s) : rt(r), spec(std::move(s)) {}
  Runtime& rt;
  KernelSpec spec;
  struct Loaded {
    std::shared_ptr<LoadedKernel> kernel;
    LaunchPlan plan;
  };
  std::map<std::string, Loaded> loaded;  // by config text
  std::vector<int64_t> slots;
  Config config_for(void* const* params) {
    slots.assign(spec.args.size(), 0);
    read_int_slots(spec, params, slots.data());
    const LaunchLimits limits = rt.backend(spec.backend).limits();
    if (spec.tuning.default_config && Tuner::why_not(spec, *spec.tuning.default_config, slots.data(), limits).empty())
      return *spec.tuning.default_config;
    for (size_t i = 0; i < spec.space.size(); ++i)
      if (Tuner::why_not(spec, spec.space.at(i), slots.data(), limits).empty()) return spec.space.at(i);
    fail(Errc::launch, "kernel '{}': no config of its spec can run this call", spec.name);
  }
  Running running(void* const* params) override { return {config_for(params).str(), ChoiceSource::plain}; }
  void launch(void* const* params, Stream s) override {
    const Config c = config_for(params);
    auto it = loaded.find(c.str());
    if (it == loaded.end()) {
      std::shared_ptr<const Binary> bin = rt.compile_pool(spec.backend).submit(spec, c, /*urgent=*/true).get();
      it = loaded.emplace(c.str(), Loaded{rt.load(*bin), LaunchPlan(spec, c, rt.backend(spec.backend).limits())}).first;
    }
    it->second.kernel->launch(params, it->second.plan.eval(slots.data()), s);
  }
};

}  // namespace

struct Program::Impl {
  Runtime& rt;
  ProgramSpec spec;
  ProgramOptions opts;
  Device* dev = nullptr;
  bool graphs = false;

  // Expressions over the program's scalars: a kernel spec whose arguments
  // are the constants, then the symbols (slot i = scalar i).
  KernelSpec scope;
  std::vector<int64_t> base;  // constants' values, symbols 0
  size_t nconst = 0;
  struct Binder {
    size_t input, dim;
    size_t slot;
  };
  std::vector<Binder> binders;
  // Every dimension of every input and output (the binders' too), per tensor.
  std::vector<std::vector<CompiledExpr>> in_dims, out_dims;
  std::vector<CompiledExpr> guards;
  std::vector<std::vector<CompiledExpr>> buffer_dims;  // the intermediates'
  std::vector<std::pair<int, int>> live;

  std::vector<std::unique_ptr<Launchable>> handles;  // per spec.kernels
  struct Arg {
    ProgramArg::Kind kind;
    int group = -1;  // buffer: 0 input, 1 output, 2 intermediate
    size_t index = 0;
    CompiledExpr value;
    double real = 0;
    DType dtype = DType::i64;
    bool moves = false;  // an integer whose expression names a bucketed scalar: set at each call
    std::optional<CompiledExpr> row;  // a buffer view's index: which row of the buffer it passes
  };
  struct Step {
    size_t handle;
    std::string kernel;
    std::vector<Arg> args;
    const std::vector<ArgSpec>* kargs;
    std::vector<std::string> texts;    // per argument: as written
    std::vector<CompiledExpr> ksizes;  // per argument: the kernel's size expression (buffers)
    KernelSpec kscope;                  // the kernel's args, for its size expressions
    bool moves = false;                 // an argument moves within a bucket
  };
  std::vector<Step> steps;

  struct GraphEntry {
    std::vector<void*> io;  // the inputs' and outputs' addresses it was captured with
    std::unique_ptr<Graph> graph;
    uint64_t used = 0;
    std::vector<int64_t> slots;  // the symbols its launches were captured (or last updated) with
    std::vector<size_t> step_nodes;  // per step, the nodes it added to the graph
    bool counted = false;            // the device counted them (some step added one)
    bool cells = false;              // captured at the bucket's bound, its first nodes writing the words
    std::vector<int32_t> words;      // cells: the values its word nodes write
    // Which inputs the call that captured it vouched for (reads before the wait): a graph's
    // edges keep the overlaps decided then, so it serves only calls that vouch for the same.
    std::vector<char> vouched;
  };
  // One shape: its symbols, memory plan, and each step's argument values
  // (params point into `storage`).
  struct Shape {
    std::vector<int64_t> key;    // what finds it: the slots, bucketed scalars by bucket
    std::vector<int64_t> slots;  // the exact symbols its arguments were last set for
    // The dimensions each input and output must have: checked on every call.
    std::vector<std::vector<int64_t>> in_dims, out_dims;
    MemoryPlan mem;
    std::array<std::vector<int64_t>, 3> elements;  // per group (inputs, outputs, intermediates): element counts
    std::vector<std::vector<uint64_t>> storage;
    std::vector<std::vector<void*>> params;
    std::vector<std::tuple<size_t, size_t, int, size_t>> io;  // (step, arg, group, index): per call
    // Per step and argument: a buffer view's byte offset into its buffer and the
    // elements of its row (0, 0 where the argument is no view).
    std::vector<std::vector<std::pair<int64_t, int64_t>>> views;
    std::vector<void*> patched;  // the inputs' and outputs' addresses `storage` holds (empty: none yet)
    bool settled = false;
    std::list<GraphEntry> graphs;
    uint64_t used = 0;
    // Cells: the arguments are set for `slots` = the bucket's bound (the largest values
    // the guards allow), the call's exact values go to the words (else `slots` are exact).
    bool at_bound = false;
    std::vector<CellBinding> bindings;  // at the bound: each bucketed scalar's bound and its word
    bool cells_refused = false;  // the steps could not run so for this shape: never tried again
  };
  std::vector<std::unique_ptr<Shape>> shapes;
  std::vector<size_t> bucket_slots;  // the slots of the bucketed scalars
  bool io_moves = false;             // an input's or output's shape names a bucketed scalar
  bool has_views = false;            // a step passes a row of a buffer
  // A view's row or its buffer's rows move within a bucket: views placed again at each call
  // of another exact value (else only at a shape's first; a model's per-layer views are many).
  bool views_move = false;
  std::vector<int64_t> call_key;     // reused by every call
  uint64_t clock = 0;
  size_t graph_count = 0;
  void* arena = nullptr;
  int64_t arena_bytes = 0;
  Stats st;

  // Cells (docs/program.md, "Cells"): the bucketed scalars' exact values in words on
  // the device, the launches sized for the largest value of each one's bucket.
  ProgramCells cells_mode = ProgramCells::off;
  std::string cells_why;                   // why the steps cannot run so ("" when they can)
  void* words = nullptr;                   // a 32-bit word per bucketed scalar (spec.pow2's order)
  std::vector<int32_t> word_values_;       // run's scratch: this call's exact values

  Impl(Runtime& r, ProgramSpec s, ProgramOptions o) : rt(r), spec(std::move(s)), opts(o) {
    for (const auto& [n, v] : spec.constants) {
      ArgSpec a;
      a.name = n;
      a.dtype = DType::i64;
      scope.args.push_back(a);
      base.push_back(v);
    }
    nconst = base.size();
    for (const auto& n : spec.all_symbols()) {
      ArgSpec a;
      a.name = n;
      a.dtype = DType::i64;
      scope.args.push_back(a);
      base.push_back(0);
    }
    scope.name = spec.name;
    auto slot_of = [&](const std::string& n) { return static_cast<size_t>(scope.arg_index(n)); };
    auto compile = [&](const Expr& e) { return compile_expr(scope, e, nullptr); };
    // Whether an expression names a bucketed scalar (its value moves within a bucket).
    auto moves = [&](const Expr& e) {
      for (const auto& sym : e.symbols())
        if (std::find(spec.pow2.begin(), spec.pow2.end(), sym) != spec.pow2.end()) return true;
      return false;
    };
    std::vector<bool> is_bound(spec.symbols.size(), false);
    for (size_t i = 0; i < spec.inputs.size(); ++i)
      for (size_t d = 0; d < spec.inputs[i].shape.size(); ++d) {
        const Expr& e = spec.inputs[i].shape[d];
        if (e.root().op == ExprOp::Var) {
          size_t sl = slot_of(e.root().name);
          // A symbol (not a scalar, given at each call; not a constant) is bound by the first dimension naming it.
          if (sl >= nconst && sl - nconst < is_bound.size() && !is_bound[sl - nconst]) {
            is_bound[sl - nconst] = true;
            binders.push_back({i, d, sl});
          }
        }
      }
    for (const auto& t : spec.inputs) {
      in_dims.emplace_back();
      for (const auto& d : t.shape) in_dims.back().push_back(compile(d));
    }
    for (const auto& t : spec.outputs) {
      out_dims.emplace_back();
      for (const auto& d : t.shape) out_dims.back().push_back(compile(d));
    }
    for (const auto& g : spec.guards) guards.push_back(compile(g));
    for (const auto& b : spec.buffers) {
      std::vector<CompiledExpr> dims;
      for (const auto& d : b.shape) dims.push_back(compile(d));
      buffer_dims.push_back(std::move(dims));
    }
    // Handles first, in the order of first use, so the first step's compiles start first.
    std::vector<size_t> order;
    for (const auto& s : spec.steps)
      for (size_t k = 0; k < spec.kernels.size(); ++k)
        if (spec.kernels[k].name == s.kernel && std::find(order.begin(), order.end(), k) == order.end())
          order.push_back(k);
    for (size_t k = 0; k < spec.kernels.size(); ++k)
      if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
    handles.resize(spec.kernels.size());
    for (size_t k : order) {
      const ProgramKernel& pk = spec.kernels[k];
      std::unique_ptr<Launchable>& h = handles[k];
      if (opts.plain) {
        if (pk.kind == ProgramKernel::Kind::multi)
          fail(Errc::usage, "program '{}' runs plain (as a reference does), but its kernel '{}' is a multi-kernel: "
               "a plain program's kernels are kernel specs", spec.name, pk.name);
        h = std::make_unique<PlainKernel>(rt, pk.kernel);
      } else if (pk.kind == ProgramKernel::Kind::kernel) h = std::make_unique<Kernel>(rt, pk.kernel);
      else if (pk.kind == ProgramKernel::Kind::multi) h = std::make_unique<MultiKernel>(rt, pk.multi);
      else h = std::make_unique<SizeHintMultiKernel>(rt, pk.kernel);
    }
    live.assign(spec.buffers.size(), {-1, -1});
    std::vector<size_t> viewed;  // the intermediates a view reads a row of
    for (const auto& s : spec.steps) {
      if (s.kind != ProgramStep::Kind::launch) continue;
      Step st;
      // (What messages and listings call the step: a step of a program run by this one whose
      // kernel shares a handle with another of the same spec is named as written there.)
      st.kernel = s.label.empty() || s.label == s.kernel ? s.kernel : fmt::format("{} (handle {})", s.label, s.kernel);
      for (size_t k = 0; k < spec.kernels.size(); ++k)
        if (spec.kernels[k].name == s.kernel) st.handle = k;
      const ProgramKernel& pk = spec.kernels[st.handle];
      st.kargs = &pk.args();
      st.kscope.name = pk.name;
      st.kscope.args = pk.args();
      for (size_t j = 0; j < s.args.size(); ++j) {
        const ProgramArg& pa = s.args[j];
        st.texts.push_back(pa.written());
        Arg a;
        a.kind = pa.kind;
        a.dtype = (*st.kargs)[j].dtype;
        if (pa.kind == ProgramArg::Kind::buffer) {
          for (size_t i = 0; i < spec.inputs.size(); ++i)
            if (spec.inputs[i].name == pa.text) a.group = 0, a.index = i;
          for (size_t i = 0; i < spec.outputs.size(); ++i)
            if (spec.outputs[i].name == pa.text) a.group = 1, a.index = i;
          for (size_t i = 0; i < spec.buffers.size(); ++i)
            if (spec.buffers[i].name == pa.text) {
              a.group = 2, a.index = i;
              const int si = static_cast<int>(steps.size());
              if (live[i].first < 0) live[i].first = si;
              live[i].second = si;
            }
          st.ksizes.push_back(compile_expr(st.kscope, (*st.kargs)[j].size, nullptr));
          if (pa.index) {
            a.row = compile(*pa.index);
            has_views = true;
            if (a.group == 2) viewed.push_back(a.index);
            if (moves(*pa.index)) a.moves = st.moves = views_move = true;
          }
        } else {
          if (pa.kind == ProgramArg::Kind::integer) {
            a.value = compile(pa.value);
            if (moves(pa.value)) a.moves = st.moves = true;
          }
          a.real = pa.real;
          st.ksizes.emplace_back();
        }
        st.args.push_back(std::move(a));
      }
      steps.push_back(std::move(st));
    }
    for (const auto& n : spec.pow2) bucket_slots.push_back(slot_of(n));
    for (auto* group : {&spec.inputs, &spec.outputs})
      for (const auto& t : *group) io_moves = io_moves || std::any_of(t.shape.begin(), t.shape.end(), moves);
    views_move = views_move || io_moves;
    // (an intermediate's rows matter where a view reads it: place_views lays the view out in them)
    for (size_t b : viewed)
      views_move = views_move || std::any_of(spec.buffers[b].shape.begin(), spec.buffers[b].shape.end(), moves);
    const std::string& backend = spec.backend;
    dev = &rt.backend(backend).device();
    graphs = opts.graphs && !opts.plain && rt.options().program_graphs && backend == "cuda";
    cells_mode = opts.cells ? *opts.cells : rt.options().program_cells;
    if (cells_mode == ProgramCells::off) {
      cells_why = opts.cells ? "cells are off (ProgramOptions::cells)" : "cells are off (KILN_PROGRAM_CELLS=off)";
    } else if (cells_mode == ProgramCells::graphs && !graphs) {
      cells_why = "no graphs here (cells are used in graphs; KILN_PROGRAM_CELLS=always uses them without)";
      cells_mode = ProgramCells::off;
    } else {
      cells_why = cells_refusal();
      if (!cells_why.empty()) {
        log::debug("program '{}': no cells ({})", spec.name, cells_why);
        cells_mode = ProgramCells::off;
      }
    }
  }

  // ---- Cells ----

  // The bucketed scalars an expression names (bits in spec.pow2's order), and the one it is, or -1.
  uint64_t bucket_bits(const Expr& e) const {
    uint64_t b = 0;
    for (const auto& sym : e.symbols())
      for (size_t k = 0; k < spec.pow2.size(); ++k)
        if (spec.pow2[k] == sym) b |= uint64_t{1} << k;
    return b;
  }
  int bucket_itself(const Expr& e) const {
    if (e.root().op != ExprOp::Var) return -1;
    for (size_t k = 0; k < spec.pow2.size(); ++k)
      if (spec.pow2[k] == e.root().name) return static_cast<int>(k);
    return -1;
  }
  // "" when kernel `k`, given arguments that name bucketed scalars (`dep`) or are one
  // itself (`itself`, else -1), is right sized for the buckets: each of its cell
  // arguments is given a bucketed scalar itself (no other value may look like one),
  // and every bucketed scalar its arguments name reaches it through a cell.
  static std::string leaf_refusal(const KernelSpec& k, const std::vector<uint64_t>& dep, const std::vector<int>& itself) {
    uint64_t need = 0, have = 0;
    for (size_t i = 0; i < k.args.size(); ++i) {
      need |= dep[i];
      if (!k.args[i].cell) continue;
      if (itself[i] < 0)
        return fmt::format("kernel '{}': its cell argument '{}' is not given a bucketed scalar itself", k.name,
                           k.args[i].name);
      have |= uint64_t{1} << itself[i];
    }
    if (need & ~have) return fmt::format("kernel '{}' takes a bucketed scalar that it reads from no cell", k.name);
    return "";
  }
  std::string cells_refusal() const {
    if (spec.pow2.empty()) return "no bucketed scalar";
    if (spec.pow2.size() > 32) return "more than 32 bucketed scalars";
    if (io_moves) return "an input's or output's shape names a bucketed scalar";
    if (has_views && views_move) return "a view's row or the rows of a buffer it views name a bucketed scalar";
    size_t i = 0;
    for (const auto& s : spec.steps) {
      if (s.kind != ProgramStep::Kind::launch) continue;
      const ProgramKernel& pk = spec.kernels[steps[i++].handle];
      std::vector<uint64_t> dep;
      std::vector<int> itself;
      for (const auto& a : s.args) {
        const bool integer = a.kind == ProgramArg::Kind::integer;
        dep.push_back(integer ? bucket_bits(a.value) : 0);
        itself.push_back(integer ? bucket_itself(a.value) : -1);
      }
      if (pk.kind != ProgramKernel::Kind::multi) {
        std::string why = leaf_refusal(pk.kernel, dep, itself);
        if (!why.empty()) return why;
        continue;
      }
      // A multi-kernel's variants: each step's arguments are ours, scratch, or expressions over ours.
      const MultiKernelSpec& m = pk.multi;
      for (const auto& v : m.variants)
        for (const auto& vs : v.steps) {
          std::vector<uint64_t> vdep;
          std::vector<int> vitself;
          for (const auto& text : vs.args) {
            int ours = -1;
            for (size_t j = 0; j < m.args.size(); ++j)
              if (m.args[j].name == text) ours = static_cast<int>(j);
            bool scratch = false;
            for (const auto& sc : m.scratch) scratch = scratch || sc.name == text;
            if (ours >= 0) {
              vdep.push_back(dep[static_cast<size_t>(ours)]);
              vitself.push_back(itself[static_cast<size_t>(ours)]);
            } else if (scratch) {
              vdep.push_back(0);
              vitself.push_back(-1);
            } else {
              uint64_t b = 0;
              for (const auto& sym : Expr::parse(text).symbols())
                for (size_t j = 0; j < m.args.size(); ++j)
                  if (m.args[j].name == sym) b |= dep[j];
              vdep.push_back(b);
              vitself.push_back(-1);
            }
          }
          std::string why = leaf_refusal(vs.kernel, vdep, vitself);
          if (!why.empty()) return fmt::format("multi-kernel '{}', variant {}: {}", m.name, v.name(), why);
        }
    }
    return "";
  }
  bool guards_hold(const std::vector<int64_t>& slots) const {
    for (const auto& g : guards)
      if (g.eval(slots.data()) == 0) return false;
    return true;
  }
  // Whether a call's exact values are within the shape's bound (its other symbols are the shape's).
  bool within_bound(const Shape& sh, const std::vector<int64_t>& slots) const {
    for (size_t i : bucket_slots)
      if (slots[i] > sh.slots[i] || slots[i] < 0) return false;
    return true;
  }
  // Sets the shape's arguments for its bucket's bound, where every step can then
  // run (its choice settled there); false (the arguments left exact) where not.
  bool enter_bound(Shape& sh, const std::vector<int64_t>& exact) {
    std::vector<int64_t> b = exact;
    for (size_t i : bucket_slots) {
      // The largest value of the bucket for which the guards hold (they hold at the call's).
      int64_t lo = b[i], hi = std::min<int64_t>(pow2_bucket(b[i]), INT32_MAX);
      if (lo < 0 || lo > hi) {
        log::debug("program '{}': no cells for {}: a bucketed value out of 0 .. 2^31 - 1", spec.name, sym_text(exact));
        sh.cells_refused = true;
        return false;
      }
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        b[i] = mid;
        if (guards_hold(b)) lo = mid;
        else hi = mid - 1;
      }
      b[i] = lo;
    }
    for (size_t k = 0; k < bucket_slots.size(); ++k)
      for (size_t j = 0; j < k; ++j)
        if (b[bucket_slots[j]] == b[bucket_slots[k]]) {  // two bounds alike: a cell argument could not say whose
          log::debug("program '{}': no cells for {}: two bucketed scalars' bounds are equal", spec.name, sym_text(b));
          sh.cells_refused = true;
          return false;
        }
    if (!guards_hold(b)) {
      log::debug("program '{}': no cells for {}: the guards do not hold at the bound", spec.name, sym_text(b));
      sh.cells_refused = true;
      return false;
    }
    auto back_to_exact = [&] {
      sh.slots = exact;
      for (size_t i = 0; i < steps.size(); ++i)
        if (steps[i].moves) set_integers(sh, i, /*moving_only=*/true);
    };
    bool all = true;
    try {
      sh.slots = b;
      for (size_t i = 0; i < steps.size(); ++i)
        if (steps[i].moves) set_integers(sh, i, /*moving_only=*/true);
      for (size_t i = 0; i < steps.size() && all; ++i) {
        const Launchable::Running r = handles[steps[i].handle]->running(sh.params[i].data());
        all = r.settled();
        if (!all && log::debugging())
          log::debug("program '{}': step {} ({}) at {} runs {}, a choice its tuning may replace", spec.name, i + 1,
                     steps[i].kernel, sym_text(b), r.what);
        if (all && r.library && steps[i].moves) {
          // A library reads the scalar from the call, not from a cell: this shape keeps exact launches.
          log::debug("program '{}': no cells for {}: step {} ({}) runs {}, a library choice", spec.name, sym_text(b),
                     i + 1, steps[i].kernel, r.what);
          sh.cells_refused = true;
          back_to_exact();
          return false;
        }
      }
    } catch (const WorkerError&) {
      back_to_exact();
      throw;
    } catch (const Error& e) {
      log::debug("program '{}': no cells for {}: {}", spec.name, sym_text(b), e.what());
      sh.cells_refused = true;
      back_to_exact();
      return false;
    } catch (...) {
      back_to_exact();
      throw;
    }
    if (!all) {  // a step decides at the bound first: tried again on a later call
      back_to_exact();
      return false;
    }
    if (!words) words = dev->alloc(4 * bucket_slots.size());
    sh.bindings.clear();
    for (size_t k = 0; k < bucket_slots.size(); ++k)
      sh.bindings.push_back({b[bucket_slots[k]], static_cast<int32_t*>(words) + k});
    sh.at_bound = true;
    log::debug("program '{}': launches sized for {}, the exact values in cells", spec.name, sym_text(b));
    return true;
  }
  // The call's shape with its arguments exact (left at no bound): what launches the steps
  // one by one outside run() needs, having no words to write.
  Shape& exact_shape(const std::vector<Tensor>& in, const std::vector<Tensor>& out, const std::vector<int64_t>& slots) {
    Shape& sh = shape_for(in, out, slots, nullptr);
    if (sh.at_bound) {
      leave_bound(sh);
      reslot(sh, in, out, slots);
    }
    patch_io(sh, in, out);
    return sh;
  }
  // Back to exact arguments (a call past the bound, or cells that failed): the shape's cell graphs go.
  void leave_bound(Shape& sh) {
    sh.at_bound = false;
    sh.bindings.clear();
    for (auto it = sh.graphs.begin(); it != sh.graphs.end();)
      if (it->cells) {
        it = sh.graphs.erase(it);
        --graph_count;
      } else {
        ++it;
      }
  }
  // A graph's replay, and an update of it that took from u0 until now, counted.
  void replay(GraphEntry& g, Stream s) {
    g.used = ++clock;
    g.graph->launch(s);
    ++st.graph_replays;
  }
  void count_update(std::chrono::steady_clock::time_point u0) {
    ++st.graph_updates;
    st.graph_update_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - u0).count();
  }
  // A graph just captured for these buffers kept (the least recently used one dropped past the
  // capacity) and replayed.
  void keep_graph(Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out, GraphEntry e, Stream s) {
    if (graph_count >= static_cast<size_t>(std::max(1, opts.graph_capacity))) evict_graph();
    for (const auto& t : in) e.io.push_back(t.data);
    for (const auto& t : out) e.io.push_back(t.data);
    e.used = ++clock;
    e.vouched = vouched_inputs_;
    sh.graphs.push_back(std::move(e));
    ++graph_count;
    ++st.graph_captures;
    replay(sh.graphs.back(), s);
  }
  // Cells failed for this call's shape (logged with `why`): back to exact arguments, for good.
  bool refuse_cells(Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const std::string& why) {
    log::debug("program '{}': {}; no cells for this shape", spec.name, why);
    --st.cell_calls;
    sh.cells_refused = true;
    leave_bound(sh);
    reslot(sh, in, out, call_slots);
    return false;
  }
  void write_words(Stream s) {
    for (size_t k = 0; k < word_values_.size(); ++k) dev->write_word(static_cast<int32_t*>(words) + k, word_values_[k], s);
  }
  void launch_with_cells(Shape& sh, Stream s) {
    write_words(s);
    CellScope scope(sh.bindings.data(), static_cast<int>(sh.bindings.size()));
    launch_steps(sh, s);
  }
  // A call of a shape at its bound: its graph (the words set to the call's values), else
  // the words written and the steps launched. False where the cells failed (the shape is then
  // back to exact arguments, to be run as such).
  bool run_cells(Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out, Stream s) {
    word_values_.resize(bucket_slots.size());
    for (size_t k = 0; k < bucket_slots.size(); ++k) word_values_[k] = static_cast<int32_t>(call_slots[bucket_slots[k]]);
    ++st.cell_calls;
    if (graphs) {
      for (auto it = sh.graphs.begin(); it != sh.graphs.end(); ++it) {
        if (!it->cells || !same_io(it->io, in, out) || it->vouched != vouched_inputs_) continue;
        if (it->words != word_values_) {
          const auto u0 = std::chrono::steady_clock::now();
          for (size_t k = 0; k < word_values_.size(); ++k)
            if (it->words[k] != word_values_[k] && !it->graph->set_word(k, word_values_[k]))
              return refuse_cells(sh, in, out, "a graph's cell could not be set in place");
          it->words = word_values_;
          count_update(u0);
        }
        replay(*it, s);
        return true;
      }
      // Captured once every step is settled at the bound with its scratch in place (a
      // multi-kernel's for the bound is made by a launch outside a capture first).
      bool all = true;
      for (size_t i = 0; i < steps.size() && all; ++i) all = handles[steps[i].handle]->settled(sh.params[i].data());
      if (!all) {
        launch_with_cells(sh, s);
        return true;
      }
      std::unique_ptr<Graph> g;
      try {
        g = dev->capture([&](Stream cs) {
          EarlyReadScope in_graph(&vouched_, cs, false);  // a graph starts after the work before it
          launch_with_cells(sh, cs);
        });
      } catch (const WorkerError&) {
        throw;
      } catch (const Error& e) {
        // Run as exact launches instead, where an error of their own shows again.
        return refuse_cells(sh, in, out, fmt::format("capturing with cells: {}", e.what()));
      }
      if (g) {
        keep_graph(sh, in, out, {{}, std::move(g), 0, call_slots, {}, false, true, word_values_, {}}, s);
        return true;
      }
    }
    launch_with_cells(sh, s);
    return true;
  }

  ~Impl() {
    shapes.clear();
    if (arena || words) dev->sync(nullptr);
    if (arena) dev->free(arena);
    if (words) dev->free(words);
  }

  // The symbols of a call (constants, symbols, then scalars), from its
  // inputs' shapes and its scalars.
  void bind_slots(const std::vector<Tensor>& in, const std::vector<int64_t>& scalars,
                  std::vector<int64_t>& slots) const {
    if (scalars.size() != spec.scalars.size())
      fail(Errc::usage, "program '{}' takes {} scalars ({}) at each call; the call gives {}", spec.name,
           spec.scalars.size(), fmt::join(spec.scalars, ", "), scalars.size());
    if (in.size() != spec.inputs.size())
      fail(Errc::usage, "program '{}' takes {} inputs; the call gives {}", spec.name, spec.inputs.size(), in.size());
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].shape.size() != spec.inputs[i].shape.size())
        fail(Errc::usage, "program '{}': input '{}' has {} dimensions; the program says {}", spec.name,
             spec.inputs[i].name, in[i].shape.size(), spec.inputs[i].shape.size());
    slots.assign(base.begin(), base.end());  // no allocation once it has the size
    for (const auto& b : binders) slots[b.slot] = in[b.input].shape[b.dim];
    const size_t first_scalar = nconst + spec.symbols.size();
    for (size_t i = 0; i < scalars.size(); ++i) slots[first_scalar + i] = scalars[i];
  }

  std::string sym_text(const std::vector<int64_t>& slots) const {
    std::string t;
    for (size_t i = nconst; i < slots.size(); ++i)
      t += fmt::format("{}{}={}", t.empty() ? "" : " ", scope.args[i].name, slots[i]);
    return t;
  }

  // The elements of a tensor of these dimensions; a negative dimension or a
  // count past 64 bits is an error naming the tensor.
  int64_t elements_of(const std::vector<int64_t>& dims, const ProgramTensor& t, const std::vector<int64_t>& slots) const {
    int64_t n = 1;
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] < 0)
        fail(Errc::usage, "program '{}': '{}' dimension {} ({}) is {}, negative (with {})", spec.name, t.name, d,
             t.shape[d].str(), dims[d], sym_text(slots));
      if (__builtin_mul_overflow(n, dims[d], &n))
        fail(Errc::usage, "program '{}': '{}' of shape [{}] has more elements than 64 bits count (with {})", spec.name,
             t.name, shape_text(t), sym_text(slots));
    }
    return n;
  }
  static std::string shape_text(const ProgramTensor& t) {
    std::string s;
    for (const auto& d : t.shape) s += (s.empty() ? "" : ", ") + d.str();
    return s;
  }

  // Every call: the outputs' count and every dimension of every input and
  // output against the shape's (integer compares; the message is built
  // only when one differs).
  void check_io(const Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out) const {
    if (out.size() != spec.outputs.size())
      fail(Errc::usage, "program '{}' takes {} outputs; the call gives {}", spec.name, spec.outputs.size(), out.size());
    for (int group = 0; group < 2; ++group) {
      const auto& ts = group == 0 ? in : out;
      const auto& want = group == 0 ? sh.in_dims : sh.out_dims;
      for (size_t i = 0; i < ts.size(); ++i) {
        if (ts[i].shape == want[i]) continue;
        const ProgramTensor& t = group == 0 ? spec.inputs[i] : spec.outputs[i];
        const char* what = group == 0 ? "input" : "output";
        if (ts[i].shape.size() != want[i].size())
          fail(Errc::usage, "program '{}': {} '{}' has {} dimensions; the program says {}", spec.name, what, t.name,
               ts[i].shape.size(), want[i].size());
        for (size_t d = 0; d < want[i].size(); ++d)
          if (ts[i].shape[d] != want[i][d])
            fail(Errc::usage, "program '{}': {} '{}' dimension {} is {}, but the program says {} = {} (with {})",
                 spec.name, what, t.name, d, ts[i].shape[d], t.shape[d].str(), want[i][d], sym_text(sh.slots));
      }
    }
  }

  // The key a call's shape is found by: its slots, bucketed scalars by bucket.
  void key_of(const std::vector<int64_t>& slots, std::vector<int64_t>& key) const {
    key.assign(slots.begin(), slots.end());
    for (size_t i : bucket_slots) key[i] = pow2_bucket(key[i]);
  }

  // A shape found by its bucket, called with other exact symbols: its tensors'
  // dimensions, the guards, the arguments that move and the sizes they need,
  // for this call (nothing is planned or allocated).
  void reslot(Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out,
              const std::vector<int64_t>& slots) {
    try {
      for (size_t i = 0; i < in_dims.size(); ++i)
        for (size_t d = 0; d < in_dims[i].size(); ++d) sh.in_dims[i][d] = in_dims[i][d].eval(slots.data());
      for (size_t i = 0; i < out_dims.size(); ++i)
        for (size_t d = 0; d < out_dims[i].size(); ++d) sh.out_dims[i][d] = out_dims[i][d].eval(slots.data());
      sh.slots = slots;  // what set_integers evaluates with
      check_io(sh, in, out);
      check_guards(slots);
      for (size_t i = 0; i < spec.inputs.size(); ++i)
        sh.elements[0][i] = elements_of(sh.in_dims[i], spec.inputs[i], slots);
      for (size_t i = 0; i < spec.outputs.size(); ++i)
        sh.elements[1][i] = elements_of(sh.out_dims[i], spec.outputs[i], slots);
      if (has_views && views_move) {
        place_views(sh);
        rebase(sh);
      }
      // The steps whose arguments move, and every step where an input's or output's
      // size moves with the bucketed scalar: their sizes checked again.
      for (size_t i = 0; i < steps.size(); ++i)
        if (steps[i].moves || io_moves) set_integers(sh, i, /*moving_only=*/true);
    } catch (...) {
      sh.slots.clear();  // half set for these symbols: the next call sets it again, checks and all
      throw;
    }
  }

  void check_guards(const std::vector<int64_t>& slots) const {
    for (size_t g = 0; g < guards.size(); ++g) {
      int64_t holds = 0;
      try {
        holds = guards[g].eval(slots.data());
      } catch (const Error& e) {  // the call's values overflow it, say: theirs to mend
        if (e.code() != Errc::expr) throw;
        fail(Errc::usage, "program '{}': guard '{}' cannot be evaluated for {}: {}", spec.name, spec.guards[g].str(),
             sym_text(slots), e.what());
      }
      if (holds == 0) {  // (the message built only then: this runs on every call of a bucket)
        const std::string from =
            g < spec.guard_from.size() && !spec.guard_from[g].empty() ? " (" + spec.guard_from[g] + ")" : "";
        fail(Errc::usage, "program '{}': guard '{}'{} does not hold for {}", spec.name, spec.guards[g].str(), from,
             sym_text(slots));
      }
    }
  }

  // Everything a new shape checks, plans and precomputes.
  Shape& shape_for(const std::vector<Tensor>& in, const std::vector<Tensor>& out, const std::vector<int64_t>& slots,
                   Stream stream) {
    key_of(slots, call_key);
    for (auto& s : shapes)
      if (s->key == call_key) {
        s->used = ++clock;
        if (s->slots == slots) {
          check_io(*s, in, out);  // every call, not only a shape's first
        } else if (s->at_bound && within_bound(*s, slots)) {
          check_io(*s, in, out);  // the tensors' shapes do not name the bucketed scalars
          check_guards(slots);
        } else {
          if (s->at_bound) {
            check_guards(slots);  // a call the guards refuse leaves the bucket's cell graphs as they are
            leave_bound(*s);
          }
          reslot(*s, in, out, slots);
        }
        return *s;
      }
    auto sh = std::make_unique<Shape>();
    sh->key = call_key;
    sh->slots = slots;
    // The dimensions every call of this shape must have; checked for this call before anything else.
    for (size_t i = 0; i < in_dims.size(); ++i) {
      sh->in_dims.emplace_back();
      for (const auto& e : in_dims[i]) sh->in_dims.back().push_back(e.eval(slots.data()));
    }
    for (size_t i = 0; i < out_dims.size(); ++i) {
      sh->out_dims.emplace_back();
      for (const auto& e : out_dims[i]) sh->out_dims.back().push_back(e.eval(slots.data()));
    }
    check_io(*sh, in, out);
    check_guards(slots);
    // Element counts by group: inputs (0), outputs (1), intermediates (2, planned for the bucket).
    std::array<std::vector<int64_t>, 3>& elements = sh->elements;
    for (size_t i = 0; i < spec.inputs.size(); ++i)
      elements[0].push_back(elements_of(sh->in_dims[i], spec.inputs[i], slots));
    for (size_t i = 0; i < spec.outputs.size(); ++i)
      elements[1].push_back(elements_of(sh->out_dims[i], spec.outputs[i], slots));
    elements[2] = place_intermediates(*sh, stream);
    place_views(*sh);
    sh->storage.resize(steps.size());
    sh->params.resize(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) bind_step(*sh, i);
    ++st.plans;
    if (shapes.size() >= static_cast<size_t>(std::max(1, opts.plan_capacity))) {
      auto lru = std::min_element(shapes.begin(), shapes.end(), [](auto& a, auto& b) { return a->used < b->used; });
      graph_count -= (*lru)->graphs.size();
      shapes.erase(lru);
    }
    sh->used = ++clock;
    shapes.push_back(std::move(sh));
    return *shapes.back();
  }

  // Plans the shape's intermediates by liveness and grows the arena to hold
  // them; returns their element counts.
  std::vector<int64_t> place_intermediates(Shape& sh, Stream stream) {
    std::vector<int64_t> bytes, elements;
    for (size_t b = 0; b < spec.buffers.size(); ++b) {
      std::vector<int64_t> dims;  // at the bucket: the sizes a bucketed scalar reaches within it
      for (const auto& d : buffer_dims[b]) dims.push_back(d.eval(sh.key.data()));
      const int64_t n = elements_of(dims, spec.buffers[b], sh.key);
      elements.push_back(n);
      bytes.push_back(static_cast<int64_t>(buffer_bytes(spec.buffers[b].dtype, n, spec.buffers[b].name)));
    }
    sh.mem = plan_memory(bytes, live);
    if (sh.mem.arena > arena_bytes) {
      if (arena) {
        dev->sync(stream);  // the work queued on the old arena is done before it goes
        dev->sync(nullptr);
        dev->free(arena);
        arena = nullptr;
        for (auto& s : shapes) s->graphs.clear();  // they point into the old arena
      }
      arena = dev->alloc(static_cast<size_t>(sh.mem.arena));
      arena_bytes = sh.mem.arena;
      // The shapes planned before keep their plans; their intermediates move to the new arena.
      for (auto& s : shapes) rebase(*s);
      graph_count = 0;
    }
    return elements;
  }

  // Step i's arguments for the shape: scalars evaluated and stored, the
  // arena's intermediates placed, the caller's tensors left to each call;
  // each buffer must hold what the kernel's spec says it reads or writes.
  void bind_step(Shape& sh, size_t i) {
    const Step& st = steps[i];
    auto& store = sh.storage[i];
    store.assign(st.args.size(), 0);
    for (size_t j = 0; j < st.args.size(); ++j) {
      const Arg& a = st.args[j];
      switch (a.kind) {
        case ProgramArg::Kind::integer: break;  // set_integers
        case ProgramArg::Kind::real: {
          if (a.dtype == DType::f64) std::memcpy(&store[j], &a.real, 8);
          else if (a.dtype == DType::f32) {
            float f = static_cast<float>(a.real);
            std::memcpy(&store[j], &f, 4);
          } else {
            uint16_t h = a.dtype == DType::f16 ? f32_to_f16_bits(static_cast<float>(a.real))
                                               : f32_to_bf16_bits(static_cast<float>(a.real));
            std::memcpy(&store[j], &h, 2);
          }
          break;
        }
        case ProgramArg::Kind::buffer:
          if (a.group == 2) {
            void* p = static_cast<std::byte*>(arena) + sh.mem.offset[a.index] + view_offset(sh, i, j);
            std::memcpy(&store[j], &p, sizeof p);
          } else {
            sh.io.push_back({i, j, a.group, a.index});
          }
          break;
      }
    }
    sh.params[i].resize(st.args.size());
    for (size_t j = 0; j < st.args.size(); ++j) sh.params[i][j] = &store[j];
    set_integers(sh, i, /*moving_only=*/false);
  }

  std::vector<int64_t> kslots_;  // set_integers' scratch (a Program is called from one thread at a time)

  // Step i's integer arguments for the shape's exact symbols (those that move
  // within a bucket only, where `moving_only`), and the check that each buffer
  // holds what the kernel's spec says it reads or writes with them.
  void set_integers(Shape& sh, size_t i, bool moving_only) {
    const std::vector<int64_t>& slots = sh.slots;
    const Step& st = steps[i];
    auto& store = sh.storage[i];
    kslots_.assign(st.args.size(), 0);
    for (size_t j = 0; j < st.args.size(); ++j) {
      const Arg& a = st.args[j];
      if (a.kind != ProgramArg::Kind::integer) continue;
      const int64_t v = a.value.eval(slots.data());
      kslots_[j] = v;
      if (moving_only && !a.moves) continue;
      if (a.dtype == DType::i32) {
        // The kernel would get the truncated value while the size checks below saw this one.
        if (v < INT32_MIN || v > INT32_MAX)
          fail(Errc::usage, "program '{}', step {} ({}): argument '{}' = {} is {}, which does not fit an i32 "
               "(with {})", spec.name, i + 1, st.kernel, (*st.kargs)[j].name,
               st.texts[j], v, sym_text(slots));
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(&store[j], &x, 4);
      } else {
        std::memcpy(&store[j], &v, 8);
      }
    }
    for (size_t j = 0; j < st.args.size(); ++j)
      if (st.args[j].kind == ProgramArg::Kind::buffer) {
        const int64_t need = st.ksizes[j].eval(kslots_.data());
        const int64_t have = st.args[j].row ? sh.views[i][j].second : sh.elements[st.args[j].group][st.args[j].index];
        if (need > have)
          fail(Errc::usage,
               "program '{}', step {} ({}): kernel argument '{}' takes {} elements ({} with {}), but the "
               "buffer has {}",
               spec.name, i + 1, st.kernel, (*st.kargs)[j].name, need, (*st.kargs)[j].size.str(), sym_text(slots),
               have);
      }
  }

  // Each buffer view's row for the shape's exact symbols: its offset and the
  // elements it holds; an index outside the buffer's rows is refused.
  void place_views(Shape& sh) {
    if (!has_views) return;
    sh.patched.clear();  // the views of inputs and outputs are set again by the next patch_io
    sh.views.resize(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      sh.views[i].assign(steps[i].args.size(), {0, 0});
      for (size_t j = 0; j < steps[i].args.size(); ++j) {
        const Arg& a = steps[i].args[j];
        if (!a.row) continue;
        const ProgramTensor& t =
            a.group == 0 ? spec.inputs[a.index] : a.group == 1 ? spec.outputs[a.index] : spec.buffers[a.index];
        // The rows as the call's exact sizes lay them out (an intermediate is planned
        // for its bucket's largest, but a kernel writing all of it uses the exact ones).
        view_dims_.clear();
        if (a.group == 2)
          for (const auto& d : buffer_dims[a.index]) view_dims_.push_back(d.eval(sh.slots.data()));
        const std::vector<int64_t>& dims =
            a.group == 0 ? sh.in_dims[a.index] : a.group == 1 ? sh.out_dims[a.index] : view_dims_;
        const int64_t rows = dims[0];
        int64_t per_row = 1;
        for (size_t d = 1; d < dims.size(); ++d)
          if (__builtin_mul_overflow(per_row, dims[d], &per_row))
            fail(Errc::usage, "program '{}': a row of '{}' has more elements than 64 bits count (with {})", spec.name,
                 t.name, sym_text(sh.slots));
        const int64_t r = a.row->eval(sh.slots.data());
        if (r < 0 || r >= rows)
          fail(Errc::usage, "program '{}', step {} ({}): argument '{}' is row {} of '{}', which has {} rows (with {})",
               spec.name, i + 1, steps[i].kernel, steps[i].texts[j], r, t.name, rows, sym_text(sh.slots));
        sh.views[i][j] = {r * per_row * static_cast<int64_t>(dtype_size(t.dtype)), per_row};
      }
    }
  }
  std::vector<int64_t> view_dims_;  // place_views' scratch
  int64_t view_offset(const Shape& sh, size_t i, size_t j) const {
    return sh.views.empty() ? 0 : sh.views[i][j].first;
  }

  // Points a planned shape's intermediates into the current arena.
  void rebase(Shape& sh) {
    for (size_t i = 0; i < steps.size() && i < sh.storage.size(); ++i)
      for (size_t j = 0; j < steps[i].args.size(); ++j)
        if (steps[i].args[j].kind == ProgramArg::Kind::buffer && steps[i].args[j].group == 2) {
          void* p = static_cast<std::byte*>(arena) + sh.mem.offset[steps[i].args[j].index] + view_offset(sh, i, j);
          std::memcpy(&sh.storage[i][j], &p, sizeof p);
        }
  }

  void patch_io(Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    if (same_io(sh.patched, in, out)) return;  // a loop's calls on the same tensors: set already
    sh.patched.clear();
    for (const auto& [i, j, group, index] : sh.io) {
      void* p = static_cast<std::byte*>(group == 0 ? in[index].data : out[index].data) + view_offset(sh, i, j);
      std::memcpy(&sh.storage[i][j], &p, sizeof p);
    }
    for (const auto& t : in) sh.patched.push_back(t.data);
    for (const auto& t : out) sh.patched.push_back(t.data);
  }

  void launch_step(Shape& sh, size_t i, Stream s) {
    try {
      handles[steps[i].handle]->launch(sh.params[i].data(), s);
    } catch (const WorkerError&) {
      throw;  // it says which kernel and config already, and its fault is typed
    } catch (const Error& e) {
      // Which step of which program: a compile error, a tuning that chose nothing, a refused launch.
      throw Error(e.code(), fmt::format("program '{}', step {} ({}): {}", spec.name, i + 1, steps[i].kernel, e.what()));
    }
  }
  void launch_steps(Shape& sh, Stream s) {
    // A shape's first calls decide its steps' choices: with KILN_LOG=debug, what each step took.
    if (!sh.settled && log::debugging()) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < steps.size(); ++i) {
        const auto ti = std::chrono::steady_clock::now();
        launch_step(sh, i, s);
        log::debug("program '{}': step {} ({}) launched in {:.2f} ms", spec.name, i + 1, steps[i].kernel,
                   log::ms_since(ti));
      }
      log::debug("program '{}': {} steps launched in {:.2f} ms", spec.name, steps.size(), log::ms_since(t0));
      return;
    }
    for (size_t i = 0; i < steps.size(); ++i) launch_step(sh, i, s);
  }

  // Whether a graph's update keeps step i's nodes as they are: its arguments do not
  // move within the bucket, nor do the inputs' and outputs' shapes, and the capture
  // counted each step's nodes.
  bool keeps(const GraphEntry& g, size_t i) const {
    return !io_moves && !steps[i].moves && g.step_nodes.size() == steps.size() && g.counted;
  }

  // Whether a graph was captured with these buffers.
  static bool same_io(const std::vector<void*>& io, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    if (io.size() != in.size() + out.size()) return false;
    for (size_t i = 0; i < in.size(); ++i)
      if (io[i] != in[i].data) return false;
    for (size_t i = 0; i < out.size(); ++i)
      if (io[in.size() + i] != out[i].data) return false;
    return true;
  }

  std::vector<int64_t> call_slots;  // reused by every call (a Program is called from one thread at a time)

  // Reads before the wait (docs/program.md): the bytes of the call's inputs that no step writes
  // (inputs not state, and not sharing memory with a state input or an output), which a kernel
  // reading them before its wait may overlap the step before it for. Set again where the call's
  // tensors or their sizes differ from those it was set for.
  std::vector<EarlyReadRange> vouched_;
  std::vector<char> vouched_inputs_;                // per input: 1 where vouched_ holds it
  std::vector<void*> vouched_io_;                   // the tensors it was set for (as same_io reads them)
  std::array<std::vector<int64_t>, 2> vouched_el_;  // ... and their element counts
  void vouch(const Shape& sh, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
    if (same_io(vouched_io_, in, out) && vouched_el_[0] == sh.elements[0] && vouched_el_[1] == sh.elements[1]) return;
    vouched_io_.clear();
    for (const auto& t : in) vouched_io_.push_back(t.data);
    for (const auto& t : out) vouched_io_.push_back(t.data);
    vouched_el_ = {sh.elements[0], sh.elements[1]};
    auto range = [&](int group, size_t i) {
      const ProgramTensor& t = group == 0 ? spec.inputs[i] : spec.outputs[i];
      const auto b = reinterpret_cast<uintptr_t>(group == 0 ? in[i].data : out[i].data);
      const int64_t n = sh.elements[group][i];
      return EarlyReadRange{b, b + static_cast<uintptr_t>(n > 0 ? n : 0) * dtype_size(t.dtype)};
    };
    vouched_.clear();
    vouched_inputs_.assign(in.size(), 0);
    std::vector<EarlyReadRange> written;
    for (size_t i = 0; i < in.size(); ++i)
      if (spec.inputs[i].state) written.push_back(range(0, i));
    for (size_t i = 0; i < out.size(); ++i) written.push_back(range(1, i));
    for (size_t i = 0; i < in.size(); ++i) {
      const EarlyReadRange r = range(0, i);
      if (spec.inputs[i].state || r.end <= r.begin) continue;
      const bool shared = std::any_of(written.begin(), written.end(),
                                      [&](const EarlyReadRange& w) { return w.begin < r.end && r.begin < w.end; });
      if (!shared) {
        vouched_.push_back(r);
        vouched_inputs_[i] = 1;
      }
    }
    std::sort(vouched_.begin(), vouched_.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    size_t k = 0;  // overlapping ranges (inputs that share memory, all read only) merged
    for (size_t i = 0; i < vouched_.size(); ++i)
      if (k > 0 && vouched_[i].begin <= vouched_[k - 1].end)
        vouched_[k - 1].end = std::max(vouched_[k - 1].end, vouched_[i].end);
      else
        vouched_[k++] = vouched_[i];
    vouched_.resize(k);
  }

  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out, Stream s,
           const std::vector<int64_t>& scalars) {
    bind_slots(in, scalars, call_slots);
    Shape& sh = shape_for(in, out, call_slots, s);
    patch_io(sh, in, out);
    vouch(sh, in, out);
    // The call's first launch waits for the work queued before it (which may write what
    // vouched_ holds); the steps after it may overlap each other.
    EarlyReadScope early(&vouched_, s, /*serial_first=*/true);
    ++st.calls;
    if (cells_mode != ProgramCells::off && !sh.at_bound && !sh.cells_refused &&
        (cells_mode == ProgramCells::always || sh.settled))
      enter_bound(sh, call_slots);
    if (sh.at_bound && run_cells(sh, in, out, s)) return;
    if (graphs && sh.settled) {
      for (auto it = sh.graphs.begin(); it != sh.graphs.end(); ++it) {
        if (it->cells || !same_io(it->io, in, out) || it->vouched != vouched_inputs_) continue;
        if (it->slots != call_slots) {
          // Another exact value of a bucketed scalar: the graph's launches set to
          // this call's in place, where every step's choice for it is settled.
          // The steps that move are launched into the graph; the rest keep their nodes
          // (their choices were settled when it was captured, their arguments are the same).
          bool all = true;
          for (size_t i = 0; i < steps.size() && all; ++i)
            all = keeps(*it, i) || handles[steps[i].handle]->settled(sh.params[i].data());
          if (!all) {
            launch_steps(sh, s);  // a step waits for its tuning: launched as it runs now
            return;
          }
          it->slots.clear();  // half set until the update returns true
          bool updated = false;
          const auto u0 = std::chrono::steady_clock::now();
          try {
            updated = it->graph->update([&](Stream cs) {
              for (size_t i = 0; i < steps.size(); ++i) {
                if (!keeps(*it, i)) launch_step(sh, i, cs);
                else if (!dev->graph_keep(cs, it->step_nodes[i])) return;
              }
            });
          } catch (...) {
            sh.graphs.erase(it);
            --graph_count;
            throw;
          }
          if (!updated) {
            sh.graphs.erase(it);  // its launches no longer match: captured anew below
            --graph_count;
            break;
          }
          it->slots = call_slots;
          count_update(u0);
        }
        replay(*it, s);
        return;
      }
      // Captured only where every step's choice for this call is settled (a bucket's
      // shape may be settled for another of its values).
      bool all = true;
      for (size_t i = 0; i < steps.size() && all; ++i) all = handles[steps[i].handle]->settled(sh.params[i].data());
      if (!all) {
        launch_steps(sh, s);
        return;
      }
      // Capture this shape's launches for these buffers, then replay them.
      std::vector<size_t> counts;
      std::unique_ptr<Graph> g;
      try {
        g = dev->capture([&](Stream cs) {
          EarlyReadScope in_graph(&vouched_, cs, false);  // a graph starts after the work before it
          counts.clear();
          for (size_t i = 0; i < steps.size(); ++i) {
            const size_t before = dev->graph_nodes(cs);
            launch_step(sh, i, cs);
            counts.push_back(dev->graph_nodes(cs) - before);
          }
        });
      } catch (const WorkerError&) {
        throw;
      } catch (const Error& e) {
        // A step that cannot be captured yet (a library's plan for a new size is made outside a
        // capture): launched as it runs now, where an error of its own shows again; captured
        // on a later call.
        log::debug("program '{}': capturing {}: {}; launched without a graph", spec.name, sym_text(call_slots),
                   e.what());
        launch_steps(sh, s);
        return;
      }
      if (g) {
        const bool counted = std::any_of(counts.begin(), counts.end(), [](size_t n) { return n > 0; });
        keep_graph(sh, in, out, {{}, std::move(g), 0, call_slots, std::move(counts), counted, false, {}, {}}, s);
        return;
      }
    }
    launch_steps(sh, s);
    // A shape whose steps are all tuned (none runs a safe choice waiting for
    // its tuning) is captured on its next call; never while one is tuning.
    if (graphs && !sh.settled && rt.tunings_pending() == 0) {
      bool all = true;
      for (size_t i = 0; i < steps.size() && all; ++i)
        all = handles[steps[i].handle]->running(sh.params[i].data()).settled();
      sh.settled = all;
    }
  }

  void evict_graph() {
    Shape* owner = nullptr;
    std::list<GraphEntry>::iterator oldest;
    uint64_t t = UINT64_MAX;
    for (auto& s : shapes)
      for (auto it = s->graphs.begin(); it != s->graphs.end(); ++it)
        if (it->used < t) t = it->used, owner = s.get(), oldest = it;
    if (owner) {
      owner->graphs.erase(oldest);
      --graph_count;
    }
  }
};

Program::Program(Runtime& rt, ProgramSpec spec, ProgramOptions opts)
    : impl_(std::make_unique<Impl>(rt, std::move(spec), opts)) {}
Program::~Program() = default;

void Program::run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, Stream stream,
                  const std::vector<int64_t>& scalars) {
  impl_->run(inputs, outputs, stream, scalars);
}

std::map<std::string, int64_t> Program::bind(const std::vector<Tensor>& inputs,
                                             const std::vector<int64_t>& scalars) const {
  std::vector<int64_t> slots;
  impl_->bind_slots(inputs, scalars, slots);
  for (size_t g = 0; g < impl_->guards.size(); ++g)
    if (impl_->guards[g].eval(slots.data()) == 0)
      fail(Errc::usage, "program '{}': guard '{}' does not hold", impl_->spec.name, impl_->spec.guards[g].str());
  std::map<std::string, int64_t> out;
  for (size_t i = impl_->nconst; i < slots.size(); ++i) out[impl_->scope.args[i].name] = slots[i];
  return out;
}

MemoryPlan Program::memory(const std::map<std::string, int64_t>& symbols) const {
  std::vector<int64_t> slots = impl_->base;
  for (const auto& [n, v] : symbols) {
    int i = impl_->scope.arg_index(n);
    if (i < static_cast<int>(impl_->nconst)) fail(Errc::usage, "program '{}': '{}' is not a symbol", impl_->spec.name, n);
    slots[static_cast<size_t>(i)] = v;
  }
  std::vector<int64_t> bytes;
  for (size_t b = 0; b < impl_->spec.buffers.size(); ++b) {
    std::vector<int64_t> dims;
    for (const auto& d : impl_->buffer_dims[b]) dims.push_back(d.eval(slots.data()));
    const int64_t n = impl_->elements_of(dims, impl_->spec.buffers[b], slots);
    bytes.push_back(static_cast<int64_t>(buffer_bytes(impl_->spec.buffers[b].dtype, n, impl_->spec.buffers[b].name)));
  }
  return plan_memory(bytes, impl_->live);
}

std::vector<double> Program::time_steps(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, int reps,
                                        const std::vector<int64_t>& scalars) {
  Impl& m = *impl_;
  m.run(inputs, outputs, nullptr, scalars);  // first calls: tuned or answered
  m.dev->sync(nullptr);
  m.rt.wait_tuned();
  std::vector<int64_t> slots;
  m.bind_slots(inputs, scalars, slots);
  Impl::Shape& sh = m.exact_shape(inputs, outputs, slots);
  std::vector<std::vector<double>> t(m.steps.size());
  auto timer = m.dev->timer();
  for (int r = 0; r < std::max(1, reps); ++r)
    for (size_t i = 0; i < m.steps.size(); ++i) {
      timer->start(nullptr);
      m.handles[m.steps[i].handle]->launch(sh.params[i].data(), nullptr);
      timer->stop(nullptr);
      t[i].push_back(timer->elapsed_ns());
    }
  std::vector<double> out;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

double Program::host_ns_handles_only(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                                     int calls, const std::vector<int64_t>& scalars) {
  Impl& m = *impl_;
  std::vector<int64_t> slots;
  m.bind_slots(inputs, scalars, slots);
  Impl::Shape& sh = m.exact_shape(inputs, outputs, slots);
  m.launch_steps(sh, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < std::max(1, calls); ++i) m.launch_steps(sh, nullptr);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  m.dev->sync(nullptr);
  return ns / std::max(1, calls);
}

std::vector<std::string> Program::choices(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                                          const std::vector<int64_t>& scalars) {
  Impl& m = *impl_;
  std::vector<int64_t> slots;
  m.bind_slots(inputs, scalars, slots);
  Impl::Shape& sh = m.shape_for(inputs, outputs, slots, nullptr);  // launches nothing: a shape at its bound stays
  m.patch_io(sh, inputs, outputs);
  std::vector<std::string> out;
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const Launchable::Running r = m.handles[m.steps[i].handle]->running(sh.params[i].data());
    out.push_back(fmt::format("{}: {} ({})", m.steps[i].kernel, r.what, choice_source_name(r.source)));
  }
  return out;
}

void Program::prepare() {
  for (auto& h : impl_->handles)
    if (auto* k = dynamic_cast<Kernel*>(h.get())) k->prepare();
}

ProgramCheck Program::check(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, Stream stream,
                            const std::vector<int64_t>& scalars) {
  Impl& m = *impl_;
  if (m.spec.check.reference.empty())
    fail(Errc::usage, "program '{}' names no reference ([check] reference = \"file.toml\"): nothing to check it against",
         m.spec.name);
  const std::map<std::string, int64_t> symbols = bind(inputs, scalars);
  // Every dimension as the program says, before a byte is copied: a buffer
  // smaller than its shape says must not be read past.
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int64_t> want = m.spec.dims(m.spec.inputs[i], symbols);
    if (inputs[i].shape != want)
      fail(Errc::usage, "program '{}': input '{}' has the shape [{}]; the program says [{}]", m.spec.name,
           m.spec.inputs[i].name, fmt::join(inputs[i].shape, ", "), fmt::join(want, ", "));
  }
  if (outputs.size() != m.spec.outputs.size())
    fail(Errc::usage, "program '{}' takes {} outputs; the call gives {}", m.spec.name, m.spec.outputs.size(),
         outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::vector<int64_t> want = m.spec.dims(m.spec.outputs[i], symbols);
    if (outputs[i].shape != want)
      fail(Errc::usage, "program '{}': output '{}' has the shape [{}]; the program says [{}]", m.spec.name,
           m.spec.outputs[i].name, fmt::join(outputs[i].shape, ", "), fmt::join(want, ", "));
  }
  // The inputs as the call gives them, before the program runs: state it
  // updates in place is checked from where it started.
  auto host_copy = [&](const Tensor& t, const ProgramTensor& pt) {
    const int64_t n = m.spec.elements(pt, symbols);
    std::vector<std::byte> b(buffer_bytes(pt.dtype, n, pt.name));
    if (!b.empty()) m.dev->to_host(b.data(), t.data, b.size(), stream);
    return b;
  };
  m.dev->sync(stream);
  std::vector<std::vector<std::byte>> in_host, out_host, state_host;
  for (size_t i = 0; i < inputs.size(); ++i) in_host.push_back(host_copy(inputs[i], m.spec.inputs[i]));
  run(inputs, outputs, stream, scalars);
  m.dev->sync(stream);
  for (size_t i = 0; i < outputs.size(); ++i) out_host.push_back(host_copy(outputs[i], m.spec.outputs[i]));
  // State as the call left it, compared with the reference's.
  for (size_t i = 0; i < inputs.size(); ++i)
    state_host.push_back(m.spec.inputs[i].state ? host_copy(inputs[i], m.spec.inputs[i]) : std::vector<std::byte>{});
  m.dev->sync(stream);
  return check_against_reference(m.rt, m.spec, symbols, in_host, out_host, state_host);
}

const ProgramSpec& Program::spec() const { return impl_->spec; }

std::string Program::cells_refusal() const { return impl_->cells_why; }

Program::Stats Program::stats() const {
  Stats s = impl_->st;
  s.plans = impl_->st.plans;
  s.arena_bytes = impl_->arena_bytes;
  return s;
}

}  // namespace kiln
