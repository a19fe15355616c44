// kiln pack, unpack, inspect: packed artifacts (docs/fleet.md).
#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/serialize.hpp"
#include "commands.hpp"
#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "compile/code_cache.hpp"
#include "compile/compile_pool.hpp"
#include <set>
#include "kiln/artifact.hpp"
#include "kiln/plan.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/device_args.hpp"
#include "kiln/fill.hpp"
#include "kiln/program.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

struct PackArgs {
  std::vector<std::string> specs, sets;
  bool hints = false;
  std::string out, unpacked;
  uint64_t seed = 1;
  int runners_up = 3;
};

using Shape = std::vector<std::pair<std::string, std::string>>;

// Every combination of the --set values of the names `has` accepts (--set M=64,128 or --set M=64
// --set M=128: each value once), for a kernel spec's scalars and a program's symbols alike.
// One empty shape when no name is accepted.
std::vector<Shape> set_combinations(const PackArgs& a, const std::function<bool(const std::string&)>& has) {
  std::vector<std::pair<std::string, std::vector<std::string>>> values;
  for (const auto& [n, v] : split_sets(a.sets, "--set", /*repeats=*/true)) {
    if (!has(n)) continue;
    if (v.empty() || v.back() == ',') fail(Errc::usage, "--set {}={}: an empty value in the list", n, v);
    auto it = std::find_if(values.begin(), values.end(), [&](const auto& e) { return e.first == n; });
    if (it == values.end()) it = values.insert(values.end(), {n, {}});
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');) {
      if (item.empty()) fail(Errc::usage, "--set {}={}: an empty value in the list", n, v);
      if (std::find(it->second.begin(), it->second.end(), item) == it->second.end()) it->second.push_back(item);
    }
  }
  std::vector<Shape> combos = {{}};
  for (const auto& [n, vs] : values) {
    std::vector<Shape> next;
    for (const auto& c : combos)
      for (const auto& v : vs) {
        Shape t = c;
        t.push_back({n, v});
        next.push_back(std::move(t));
      }
    combos = std::move(next);
  }
  return combos;
}

// The tuning-key assignments to pack for one spec.
std::vector<std::vector<std::pair<std::string, std::string>>> shapes(const KernelSpec& spec, const PackArgs& a) {
  std::vector<Shape> out;
  // A shape given twice (by --set and again as a size hint, or twice in a list) is packed once.
  std::set<std::string> seen;
  auto add = [&](Shape s) {
    if (seen.insert(canonical_shape(s)).second) out.push_back(std::move(s));
  };
  if (!a.sets.empty()) {
    const auto scalar = [&](const std::string& n) {
      return std::any_of(spec.args.begin(), spec.args.end(), [&](const ArgSpec& x) { return x.name == n && !x.pointer; });
    };
    std::vector<Shape> combos = set_combinations(a, scalar);
    // No --set names this spec's scalars (they were for another spec or a program): with
    // --hints, its hint points alone are packed.
    if (combos.size() == 1 && combos[0].empty() && a.hints) combos.clear();
    for (auto& c : combos) add(std::move(c));
  }
  if (a.hints) {
    if (spec.tuning.hints.empty())
      fail(Errc::usage, "kernel '{}' ({}) declares no size hints; give its shape with --set", spec.name,
           spec.path_text());
    for (const auto& point : spec.tuning.hint_point_list()) {
      Shape s;
      for (size_t i = 0; i < point.size(); ++i) s.push_back({spec.tuning.key[i], std::to_string(point[i])});
      add(std::move(s));
    }
  }
  return out;
}

// The spec, its source and what the source includes, under sources/<name>/,
// at their paths relative to the spec's folder.
void add_sources(Artifact& art, const KernelSpec& spec, Backend& be, std::string& spec_entry) {
  fs::path root = fs::absolute(spec.spec_path).lexically_normal().parent_path();
  auto add = [&](const fs::path& file) -> std::string {
    fs::path rel = fs::absolute(file).lexically_normal().lexically_relative(root);
    if (rel.empty() || *rel.begin() == "..") {
      std::fprintf(stderr, "kiln: warning: %s is outside the spec's folder and is not packed with '%s'\n",
                   file.string().c_str(), spec.name.c_str());
      return "";
    }
    std::optional<std::string> d = read_file(file);
    if (!d) fail(Errc::io, "cannot read {}", file.string());
    std::string name = "sources/" + spec.name + "/" + rel.generic_string();
    art.add(name, std::move(*d));
    return rel.generic_string();
  };
  spec_entry = "sources/" + spec.name + "/" + add(spec.spec_path) + (spec.member.empty() ? "" : ":" + spec.member);
  add(spec.source_path);
  BinaryKey k = make_binary_key(make_compile_request(spec, Config{}), be);
  for (const auto& inc : k.includes_found) add(inc);
}

// Which spec a kernel is: its file (links resolved) and member. Two kernels of one name are one
// only if this is the same: an artifact holds one spec per kernel name.
std::string spec_identity(const KernelSpec& spec) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(spec.spec_path), ec);
  if (ec) p = fs::absolute(spec.spec_path).lexically_normal();
  return p.string() + (spec.member.empty() ? "" : ":" + spec.member);
}

[[noreturn]] void two_specs(const std::string& name, const std::string& a, const std::string& b) {
  fail(Errc::usage, "two specs name the kernel '{}': {}, and {}; an artifact holds one spec per kernel name", name, a, b);
}
std::string run_by(const std::string& identity, const std::string& program) {
  return identity + " (run by program " + program + ")";
}

// The manifest's entry of kernel `spec` (made, with the spec's sources, where no program or spec
// packed before made it), by index: the vector grows.
size_t kernel_entry(Artifact& art, const KernelSpec& spec, Backend& be) {
  std::vector<ArtifactManifest::Kernel>& ks = art.manifest().kernels;
  const size_t at = std::find_if(ks.begin(), ks.end(), [&](const auto& k) { return k.name == spec.name; }) - ks.begin();
  if (at == ks.size()) {
    ArtifactManifest::Kernel fresh{spec.name, spec.backend, "", {}, {}};
    add_sources(art, spec, be, fresh.spec);
    ks.push_back(std::move(fresh));
  }
  return at;
}

// Lists `key` and its choice in a kernel's entry; a key listed before (a shape a program and a
// kernel spec both packed) takes this choice, that of the record packed last, which replaced it.
void list_choice(ArtifactManifest::Kernel& entry, const std::string& key, const std::string& choice) {
  auto k = std::find(entry.keys.begin(), entry.keys.end(), key);
  if (k == entry.keys.end()) {
    entry.keys.push_back(key);
    entry.choices.push_back(choice);
    return;
  }
  const size_t i = static_cast<size_t>(k - entry.keys.begin());
  if (i < entry.choices.size()) entry.choices[i] = choice;
}

// Every kernel spec the program at `path` runs (its steps' programs' and its multi-kernels'
// variants' included), by name; two different specs of one name are refused.
std::map<std::string, KernelSpec> program_kernel_specs(const ProgramSpec& ps, const std::string& path) {
  std::map<std::string, KernelSpec> specs;
  auto add = [&](const KernelSpec& k) {
    auto [it, fresh] = specs.emplace(k.name, k);
    if (!fresh && spec_identity(it->second) != spec_identity(k))
      two_specs(k.name, run_by(spec_identity(it->second), path), spec_identity(k) + " (run by it too)");
  };
  for (const auto& k : ps.kernels) {
    if (k.kind == ProgramKernel::Kind::multi)
      for (const auto& v : k.multi.variants)
        for (const auto& st : v.steps) add(st.kernel);
    else
      add(k.kernel);
  }
  return specs;
}

// A program: run at each shape its --set values give (every step tuned on
// its real intermediate tensors, or answered by a record), then the records
// the run used, the binaries of their choices and runners-up, and the
// sources of every kernel (and the program file) go into the artifact.
void pack_program(Runtime& rt, Artifact& art, const std::string& path, const PackArgs& a, std::set<std::string>& binaries,
                  size_t& records) {
  ProgramSpec ps = load_program(path);
  ArtifactManifest& m = art.manifest();
  Backend& be = rt.backend(ps.backend);
  bool have_target = false;
  for (const auto& t : m.targets) have_target = have_target || t.backend == ps.backend;
  if (!have_target)
    m.targets.push_back({ps.backend, be.device_identity(), hash_bytes(be.toolchain_identity()).hex(),
                         be.toolchain_identity()});
  const std::map<std::string, KernelSpec> specs = program_kernel_specs(ps, path);
  // The shapes: each symbol's values, every combination.
  const std::vector<std::string> symbols = ps.all_symbols();
  std::vector<std::map<std::string, int64_t>> shapes_;
  for (const Shape& c : set_combinations(a, [&](const std::string& n) {
         return std::find(symbols.begin(), symbols.end(), n) != symbols.end();
       })) {
    std::map<std::string, int64_t> shape;
    for (const auto& [n, v] : c) {
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), shape[n]);
      if (ec != std::errc() || p != v.data() + v.size()) fail(Errc::usage, "--set {}={}: not an integer", n, v);
    }
    for (const auto& sym : symbols)
      if (!shape.count(sym))
        fail(Errc::usage, "program '{}': give symbol '{}' its values to pack (--set {}=...)", ps.name, sym, sym);
    shapes_.push_back(std::move(shape));
  }
  auto cache = rt.tuning_cache();
  if (!cache) fail(Errc::usage, "kiln pack needs the tuning cache (KILN_NO_CACHE is set)");
  cache->journal(true);
  Device& dev = be.device();
  Program prog(rt, ps);
  InputFiller filler(rt, ps.backend);  // on a GPU, a kernel fills its memory
  for (const auto& shape : shapes_) {
    std::vector<DeviceBuffer> held;
    held.reserve(ps.inputs.size() + ps.outputs.size());
    std::vector<Tensor> in, outs;
    auto make = [&](const ProgramTensor& t, bool fill, uint64_t seed) {
      Tensor x;
      x.shape = ps.dims(t, shape);
      const int64_t n = ps.elements(t, shape);
      const size_t bytes = buffer_bytes(t.dtype, n, t.name);
      held.emplace_back(dev, bytes ? bytes : 1);
      if (fill) filler.fill(t, held.back().get(), bytes, seed);
      x.data = held.back().get();
      return x;
    };
    for (size_t i = 0; i < ps.inputs.size(); ++i) in.push_back(make(ps.inputs[i], true, input_seed(a.seed, i)));
    for (const auto& t : ps.outputs) outs.push_back(make(t, false, 0));
    std::vector<int64_t> scalars;
    for (const auto& n : ps.scalars) scalars.push_back(shape.at(n));
    prog.run(in, outs, nullptr, scalars);
    dev.sync(nullptr);
    std::string text;
    for (const auto& [n, v] : shape) text += fmt::format("{}{}={}", text.empty() ? "" : " ", n, v);
    std::fprintf(stderr, "program %s at %s: every step tuned or answered\n", ps.name.c_str(), text.c_str());
  }
  cache->journal(false);
  // The kernel that filled the inputs on the device: an application making its inputs
  // with kiln::InputFiller from this artifact compiles nothing either.
  if (std::shared_ptr<const Binary> b = filler.binary(); b && binaries.insert(b->key).second)
    art.add("binaries/" + b->key + ".kbin", CodeCache::encode(*b));
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> chosen;  // kernel -> (key, choice)
  for (const TuningRecord& r : cache->journaled()) {
    const std::string entry = "records/" + r.key.base_hex() + "/" + r.key.values_hex() + ".rec";
    records += !art.entries().count(entry);  // (the same program given twice packs its records once)
    art.add(entry, record_to_text(r));
    if (r.best) chosen[r.kernel].push_back({r.key.values_text(), r.best->str()});
    if (r.noisy)
      std::fprintf(stderr, "%s at %s: timed on a busy machine, packed as it is (`kiln tune` re-measures it)\n",
                   r.kernel.c_str(), r.key.values_text().c_str());
    auto it = specs.find(r.kernel);
    if (it == specs.end() || !r.best) continue;  // a multi-kernel's own record: it names variants, not binaries
    for (const Config& c : artifact_configs(r, *r.best, a.runners_up)) {
      std::shared_ptr<const Binary> b = rt.compile_pool(ps.backend).submit(it->second, c).get();
      if (binaries.insert(b->key).second) art.add("binaries/" + b->key + ".kbin", CodeCache::encode(*b));
    }
  }
  for (const auto& [name, spec] : specs) {
    ArtifactManifest::Kernel& entry = m.kernels[kernel_entry(art, spec, be)];
    // The keys and choices the program's runs used (as a kernel spec's entry lists them).
    for (const auto& [key, choice] : chosen[spec.name]) list_choice(entry, key, choice);
  }
  std::optional<std::string> text = read_file(path);
  if (text) art.add("sources/programs/" + fs::path(path).filename().string(), std::move(*text));
}

void run_pack(Globals& g, const PackArgs& a) {
  if (!a.hints && a.sets.empty()) fail(Errc::usage, "kiln pack: give the shapes to pack, with --set NAME=V ... or --hints");
  if (a.out.empty() && a.unpacked.empty()) fail(Errc::usage, "kiln pack: give -o FILE, --unpacked DIR, or both");
  if (!a.out.empty()) {  // refused before anything is tuned (Artifact::write refuses it too)
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::symlink_status(a.out, ec);
    if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
      fail(Errc::usage, "-o {}: exists and is not a regular file: an artifact is written only to a regular file or a "
           "new path (it is written beside it and renamed over it)", a.out);
  }
  isolate_stdout();
  Options opts = Options::from_env();
  opts.quiet = opts.quiet || g.quiet;
  opts.artifact.clear();  // packing reads the caches, not another artifact
  opts.first_call = FirstCall::wait;  // every shape packed is tuned before it is packed
  Runtime rt(opts);
  Artifact art;
  ArtifactManifest& m = art.manifest();
  m.kiln_version = kiln_version();
  m.created = utc_now();
  auto t0 = std::chrono::steady_clock::now();
  size_t records = 0;
  std::set<std::string> binaries;
  // A --set name no spec or program given has is a mistake (a misspelt symbol would
  // pack other shapes than meant): refused before anything is tuned.
  // Each kernel spec given, read once (a path given twice is refused below), by path.
  std::map<std::string, KernelSpec> kernel_specs;
  {
    std::set<std::string> known;
    std::map<std::string, std::pair<std::string, std::string>> programs_kernels;  // name -> (spec, program)
    for (const auto& path : a.specs) {
      if (is_program_file(path)) {
        const ProgramSpec ps = load_program(path);
        for (const auto& n : ps.all_symbols()) known.insert(n);
        for (const auto& [n, spec] : program_kernel_specs(ps, path)) {
          auto [it, fresh] = programs_kernels.emplace(n, std::pair{spec_identity(spec), path});
          if (!fresh && it->second.first != spec_identity(spec))
            two_specs(n, run_by(it->second.first, it->second.second), run_by(spec_identity(spec), path));
        }
      } else {
        const KernelSpec& spec = kernel_specs.emplace(path, load_spec(path)).first->second;
        for (const auto& arg : spec.args)
          if (!arg.pointer) known.insert(arg.name);
      }
    }
    for (const auto& [n, v] : split_sets(a.sets, "--set", /*repeats=*/true))
      if (!known.count(n))
        fail(Errc::usage, "--set {}={}: no spec or program given has a scalar or symbol '{}' (they have: {})", n, v, n,
             fmt::join(known, ", "));
    // Each kernel spec's shapes read as its scalars, two specs of one name (a kernel spec given
    // twice, or a spec that is not the one a program given runs under that name), a folder for
    // -o that is not there: refused now, not after the specs before them were tuned.
    std::map<std::string, std::string> names;  // a kernel spec's name -> its spec
    for (const auto& path : a.specs) {
      if (is_program_file(path)) continue;
      const KernelSpec& spec = kernel_specs.at(path);
      if (auto [it, fresh] = names.emplace(spec.name, spec_identity(spec)); !fresh)
        two_specs(spec.name, it->second, spec_identity(spec) + (it->second == spec_identity(spec) ? " again" : ""));
      auto in_program = programs_kernels.find(spec.name);
      if (in_program != programs_kernels.end() && in_program->second.first != spec_identity(spec))
        two_specs(spec.name, spec_identity(spec), run_by(in_program->second.first, in_program->second.second));
      for (const auto& shape : shapes(spec, a)) parse_scalars(spec, shape);
    }
    if (!a.out.empty()) {
      const fs::path parent = fs::absolute(a.out).parent_path();
      std::error_code ec;
      if (!fs::is_directory(parent, ec))
        fail(Errc::usage, "-o {}: the folder {} is not there", a.out, parent.string());
    }
  }
  for (const auto& path : a.specs) {
    if (is_program_file(path)) {
      pack_program(rt, art, path, a, binaries, records);
      continue;
    }
    const KernelSpec& spec = kernel_specs.at(path);
    Backend& be = rt.backend(spec.backend);
    bool have_target = false;
    for (const auto& t : m.targets) have_target = have_target || t.backend == spec.backend;
    if (!have_target)
      m.targets.push_back({spec.backend, be.device_identity(), hash_bytes(be.toolchain_identity()).hex(),
                           be.toolchain_identity()});
    // A kernel a program given before it runs (the same spec, checked above) keeps its entry:
    // its sources are there, and its keys and choices gain this spec's shapes.
    const size_t at = kernel_entry(art, spec, be);
    for (const auto& shape : shapes(spec, a)) {
      DeviceArgs args(spec, parse_scalars(spec, shape), be.device());
      args.fill_random(a.seed);
      TuneOptions to;
      to.show_progress = !opts.quiet && stderr_is_terminal();
      to.remeasure_noisy = true;  // what ships is measured as quietly as this machine allows
      TuneOutcome o = rt.tune(spec, args.params(), to);
      const TuningRecord& r = o.record;
      if (!o.choice) fail(Errc::tune, "{}", r.all_failed_message());
      const std::string rec = "records/" + r.key.base_hex() + "/" + r.key.values_hex() + ".rec";
      records += !art.entries().count(rec);  // (a shape a program given before it packed too: once)
      art.add(rec, record_to_text(r));
      list_choice(m.kernels[at], r.key.values_text(), o.choice->str());
      // The choice and the runners-up (a call the choice cannot run, such as
      // a misaligned pointer, goes to the next that can).
      for (const Config& c : artifact_configs(r, *o.choice, a.runners_up)) {
        std::shared_ptr<const Binary> b = rt.compile_pool(spec.backend).submit(spec, c).get();
        if (binaries.insert(b->key).second) art.add("binaries/" + b->key + ".kbin", CodeCache::encode(*b));
      }
      std::fprintf(stderr, "%s at %s: %s (%s%s)\n", spec.name.c_str(), r.key.values_text().c_str(),
                   o.choice->str().c_str(), o.from_cache ? "cached" : "tuned now",
                   r.noisy ? "; timed on a busy machine, packed as it is" : "");
    }
    // Its dispatch plan (kiln plan), when there is one for this device.
    if (auto cache = rt.tuning_cache()) {
      TuningKey base = plan_base_key(spec, be);
      if (auto text = cache->get_plan(base))
        if (plan_from_text(*text, base, spec)) {
          art.add("plans/" + base.base_hex() + ".pln", *text);
          std::fprintf(stderr, "%s: its dispatch plan\n", spec.name.c_str());
        }
    }
  }
  if (!a.out.empty()) art.write(a.out);
  if (!a.unpacked.empty()) art.write_dir(a.unpacked);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // What was tuned now: the configs timed (a program's steps tune inside its runs, where no
  // record says whether it came from the cache).
  std::fprintf(out(), "packed %zu kernels, %zu records, %zu binaries (%llu configs timed now) in %s%s%s\n",
               m.kernels.size(), records, binaries.size(), static_cast<unsigned long long>(rt.stats().configs_timed),
               seconds_text(secs).c_str(),
               a.out.empty() ? "" : (" -> " + a.out).c_str(), a.unpacked.empty() ? "" : (" -> " + a.unpacked + "/").c_str());
}

void run_inspect(const std::string& path, bool as_json) {
  isolate_stdout();
  Artifact art = Artifact::read(path);
  const ArtifactManifest& m = art.manifest();
  size_t bytes = 0, nbin = 0, nrec = 0;
  for (const auto& [n, d] : art.entries()) {
    bytes += d.size();
    nbin += n.rfind("binaries/", 0) == 0;
    nrec += n.rfind("records/", 0) == 0;
  }
  if (as_json) {
    json j = json::parse(art.entries().at("manifest.json"));
    j["entries"] = art.entries().size();
    j["bytes"] = bytes;
    std::fprintf(out(), "%s\n", j.dump(2).c_str());
    return;
  }
  std::fprintf(out(), "kiln artifact (format %d), packed %s by kiln %s: %zu kernels, %zu records, %zu binaries, %zu bytes\n",
               m.format, m.created.c_str(), m.kiln_version.c_str(), m.kernels.size(), nrec, nbin, bytes);
  for (const auto& t : m.targets) {
    std::string tc = t.toolchain_text;
    for (char& c : tc)
      if (c == '\n') c = ';';
    std::fprintf(out(), "for %s on %s\n  toolchain %s: %.160s\n", t.backend.c_str(), t.device.c_str(), t.toolchain.c_str(), tc.c_str());
  }
  for (const auto& k : m.kernels) {
    std::fprintf(out(), "kernel %s (%s, spec %s)\n", k.name.c_str(), k.backend.c_str(), k.spec.c_str());
    for (size_t i = 0; i < k.keys.size(); ++i)
      std::fprintf(out(), "  %-28s %s\n", k.keys[i].c_str(), i < k.choices.size() ? k.choices[i].c_str() : "");
  }
}

}  // namespace

void add_pack(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("pack", "Compile and tune what is missing, then write kernels, records and sources "
                                         "into one checksummed artifact an application loads at start");
  auto a = std::make_shared<PackArgs>();
  cmd->add_option("specs", a->specs, "Spec files (.toml; file.toml:member for a family's member)")->required()->check(SpecFile);
  cmd->add_option("--set", a->sets,
                  "A shape to pack, NAME=VALUE for each scalar or symbol (applied to every spec and program that has it); "
                  "NAME=V1,V2 or NAME given again: each value, every combination")
      ->allow_extra_args(false);  // one value an occurrence: spec files after it are not taken as values
  cmd->add_flag("--hints", a->hints, "Pack every spec's size-hint points");
  cmd->add_option("-o,--output", a->out, "The artifact file to write");
  cmd->add_option("--unpacked", a->unpacked, "Also (or instead) write the same entries into this folder");
  cmd->add_option("--seed", a->seed, "Seed of the random inputs tuned on")->check(Seed)->capture_default_str();
  cmd->add_option("--runners-up", a->runners_up, "Binaries of this many next-best configs per shape, beside the choice")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->callback([&g, a] { run_pack(g, *a); });

  auto* un = app.add_subcommand("unpack", "Check an artifact and write its entries into a folder a person can read");
  auto file = std::make_shared<std::string>();
  auto dir = std::make_shared<std::string>();
  un->add_option("artifact", *file, "The artifact file")->required()->check(CLI::ExistingFile);
  un->add_option("dir", *dir, "The folder to write")->required();
  un->callback([file, dir] {
    isolate_stdout();
    Artifact art = Artifact::read(*file);
    art.write_dir(*dir);
    std::fprintf(out(), "unpacked %zu entries into %s/\n", art.entries().size(), dir->c_str());
  });

  auto* ins = app.add_subcommand("inspect", "Check an artifact and print what is inside, for which device and toolchain");
  auto ipath = std::make_shared<std::string>();
  auto ijson = std::make_shared<bool>(false);
  ins->add_option("artifact", *ipath, "The artifact file, or an unpacked folder")->required()->check(CLI::ExistingPath);
  ins->add_flag("--json", *ijson, "Print its manifest as JSON");
  ins->callback([ipath, ijson] { run_inspect(*ipath, *ijson); });
}

}  // namespace kiln::cli
