#include "compile/compile_pool.hpp"
#include "kiln/ext/binary_key.hpp"

#include <filesystem>
#include <set>

#include "core/format.hpp"
#include "core/fsutil.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

struct IncludeScan {
  const std::vector<std::string>& dirs;
  Hasher& h;
  std::set<std::string> seen;
  std::vector<std::string> found, external;

  // Finds `#include "x"` and `#include <x>` lines. Quoted names resolve
  // against the including file's folder, then the include folders; angled
  // names against the include folders only. What is not found belongs to the
  // toolchain, whose identity is part of the key already.
  void scan(const std::string& text, const fs::path& from_dir, int depth) {
    if (depth > 64) return;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::string_view line(text.data() + pos, eol - pos);
      pos = eol + 1;
      size_t i = 0;
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (i >= line.size() || line[i] != '#') continue;
      ++i;
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (line.substr(i, 7) != "include") continue;
      i += 7;
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (i >= line.size() || (line[i] != '"' && line[i] != '<')) continue;
      char close = line[i] == '"' ? '"' : '>';
      size_t end = line.find(close, i + 1);
      if (end == std::string_view::npos) continue;
      std::string name(line.substr(i + 1, end - i - 1));
      resolve(name, close == '"' ? from_dir : fs::path(), depth);
    }
  }

  void resolve(const std::string& name, const fs::path& local, int depth) {
    std::vector<fs::path> candidates;
    if (!local.empty()) candidates.push_back(local / name);
    for (const auto& d : dirs) candidates.push_back(fs::path(d) / name);
    for (const auto& c : candidates) {
      std::error_code ec;
      if (!fs::is_regular_file(c, ec)) continue;
      std::string canon = fs::weakly_canonical(c, ec).string();
      if (!seen.insert(canon).second) return;
      std::optional<std::string> text = read_file(c);
      if (!text) continue;
      h.add("include", name).add("content", *text);
      found.push_back(canon);
      scan(*text, c.parent_path(), depth + 1);
      return;
    }
    h.add("external", name);
    external.push_back(name);
  }
};

}  // namespace

std::string BinaryKey::to_string() const {
  std::string inc;
  for (const auto& f : includes_found) inc += "\n  found " + f;
  for (const auto& f : includes_external) inc += "\n  toolchain <" + f + ">";
  return fmt::format(
      "binary-format {}\nbackend {}\nentry {}\nsource {}\ndefines {}\nargs {}\ncflags {}\nincludes:{}\n"
      "toolchain:\n{}\nkey {}",
      kFormatVersion, backend, entry, source.hex(), defines, args, cflags, inc, toolchain, hex());
}

std::string BinaryKey::hex() const {
  Hasher h;
  h.add("format", static_cast<int64_t>(kFormatVersion))
      .add("backend", backend)
      .add("toolchain", toolchain)
      .add("entry", entry)
      .add("source", source.hex())
      .add("defines", defines)
      .add("args", args)
      .add("cflags", cflags);
  return h.digest().hex();
}

SourceTree hash_source_tree(const std::string& source_text, const std::vector<std::string>& include_dirs) {
  Hasher h;
  h.add("source", source_text);
  IncludeScan scan{include_dirs, h, {}, {}, {}};
  fs::path dir = include_dirs.empty() ? fs::path() : fs::path(include_dirs.front());
  scan.scan(source_text, dir, 0);
  return {h.digest(), std::move(scan.found), std::move(scan.external)};
}

namespace {
// The folders a request's includes are searched in: its own, then the -I
// folders of its flags.
std::vector<std::string> search_dirs(const CompileRequest& r) {
  std::vector<std::string> dirs = r.include_dirs;
  for (const auto& d : include_dirs_in_flags(r.cflags)) dirs.push_back(d.string());
  return dirs;
}
}  // namespace

Hash128 kernel_source_hash(const KernelSpec& spec) {
  CompileRequest r = make_compile_request(spec, Config{});
  Hasher h;
  h.add("backend", spec.backend).add("entry", spec.entry).add("tree", hash_source_tree(r.source_text, search_dirs(r)).hash.hex());
  for (const auto& a : spec.args) h.add("arg", a.name + ":" + a.type_text());
  for (const auto& m : spec.tensor_maps)
    h.add("tensor_map", fmt::format("{} {} {} {} {} {} {}", m.of, m.rows.str(), m.cols.str(), m.pitch.str(),
                                    m.box_rows.str(), m.box_cols.str(), m.swizzle));
  if (spec.workspace) h.add("workspace", spec.workspace->str());
  return h.digest();
}

BinaryKey make_binary_key(const CompileRequest& req, Backend& backend) {
  BinaryKey k;
  k.backend = req.backend;
  k.toolchain = backend.toolchain_identity();
  k.entry = req.entry;
  SourceTree tree = hash_source_tree(req.source_text, search_dirs(req));
  k.source = tree.hash;
  k.includes_found = std::move(tree.found);
  k.includes_external = std::move(tree.external);
  for (const auto& [n, v] : req.defines) k.defines += fmt::format("{}={};", n, v);
  for (const auto& a : req.args) k.args += fmt::format("{}:{}{};", a.name, dtype_name(a.dtype), a.pointer ? "*" : "");
  if (req.tensor_maps > 0) k.args += fmt::format("tensor_maps:{};", req.tensor_maps);
  if (req.workspace) k.args += "workspace;";
  if (req.pdl) k.args += "pdl;";  // a pdl kernel's compile checks that it waits
  for (const auto& f : req.cflags) k.cflags += f + " ";
  return k;
}

BinaryKeyer::BinaryKeyer(const KernelSpec& spec, Backend& backend)
    : base_(make_binary_key(make_compile_request(spec, Config{}), backend)), backend_(&backend) {}

std::string library_key(Backend& backend, const std::string& name) {
  Hasher h;
  h.add("format", static_cast<int64_t>(BinaryKey::kFormatVersion))
      .add("library", name)
      .add("backend", backend.name())
      .add("identity", backend.library_identity(name));
  return h.digest().hex();
}

BinaryKey BinaryKeyer::key(const Config& c) const {
  BinaryKey k = base_;
  k.defines.clear();
  for (const auto& [n, v] : c.values) k.defines += fmt::format("{}={};", n, v);
  return k;
}

std::string BinaryKeyer::hex(const Config& c) const {
  return c.library.empty() ? key(c).hex() : library_key(*backend_, c.library);
}

}  // namespace kiln
