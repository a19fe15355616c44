#include "compile/compile_pool.hpp"
#include "kiln/artifact.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <chrono>
#include <exception>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"
#include "compile/code_cache.hpp"
#include "kiln/hash.hpp"
#include "kiln/runtime.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kMagic = "kiln-artifact";
constexpr size_t kMaxArtifactBytes = size_t{4} << 30;
constexpr size_t kMaxEntries = 1u << 20;
constexpr size_t kMaxManifestBytes = size_t{64} << 20;

std::string sum_hex(std::string_view data) { return fmt::format("{:016x}", hash64(data.data(), data.size())); }

// A name kiln writes and reads: relative, no "..", no odd characters.
bool safe_name(const std::string& n) {
  if (n.empty() || n.size() > 512 || n.front() == '/' || n.back() == '/') return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '.' || c == '_' || c == '-' || c == '=' ||
          c == '+'))
      return false;
  for (size_t at = 0; at <= n.size();) {
    size_t slash = n.find('/', at);
    std::string part = n.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  return true;
}

json manifest_json(const ArtifactManifest& m) {
  json t = json::array(), k = json::array(), f = json::array();
  for (const auto& x : m.targets)
    t.push_back({{"backend", x.backend}, {"device", x.device}, {"toolchain", x.toolchain},
                 {"toolchain_text", x.toolchain_text}});
  for (const auto& x : m.kernels)
    k.push_back({{"name", x.name}, {"backend", x.backend}, {"spec", x.spec}, {"keys", x.keys}, {"choices", x.choices}});
  for (const auto& x : m.files) f.push_back({{"name", x.name}, {"bytes", x.bytes}, {"xxh3", x.xxh3}});
  return {{"format", m.format},   {"kiln_version", m.kiln_version}, {"created", m.created},
          {"targets", t},         {"kernels", k},                   {"files", f}};
}

ArtifactManifest manifest_from(const json& j) {
  ArtifactManifest m;
  m.format = j.at("format").get<int>();
  if (m.format != ArtifactManifest::kFormat)
    fail(Errc::artifact, "it is of artifact format {}; this kiln reads format {} (pack it again with this kiln)",
         m.format, ArtifactManifest::kFormat);
  m.kiln_version = j.at("kiln_version").get<std::string>();
  if (!kiln_version_compatible(m.kiln_version))
    fail(Errc::artifact, "it was packed by kiln {}, whose records this kiln {} does not read (pack it again)",
         m.kiln_version, kiln_version());
  m.created = j.at("created").get<std::string>();
  for (const auto& x : j.at("targets"))
    m.targets.push_back({x.at("backend").get<std::string>(), x.at("device").get<std::string>(),
                         x.at("toolchain").get<std::string>(), x.at("toolchain_text").get<std::string>()});
  for (const auto& x : j.at("kernels"))
    m.kernels.push_back({x.at("name").get<std::string>(), x.at("backend").get<std::string>(),
                         x.at("spec").get<std::string>(), x.at("keys").get<std::vector<std::string>>(),
                         x.at("choices").get<std::vector<std::string>>()});
  for (const auto& x : j.at("files"))
    m.files.push_back({x.at("name").get<std::string>(), x.at("bytes").get<uint64_t>(), x.at("xxh3").get<std::string>()});
  return m;
}

// Checks the entries against the manifest: every file listed is there, of
// its size and checksum, and nothing else is.
void verify(const ArtifactManifest& m, const std::map<std::string, std::string>& entries) {
  if (entries.size() != m.files.size() + 1)
    fail(Errc::artifact, "it holds {} entries where its manifest lists {}", entries.size() - 1, m.files.size());
  for (const auto& f : m.files) {
    auto it = entries.find(f.name);
    if (it == entries.end()) fail(Errc::artifact, "'{}' is listed in its manifest but missing", f.name);
    if (it->second.size() != f.bytes || sum_hex(it->second) != f.xxh3)
      fail(Errc::artifact, "'{}' is damaged (its size or checksum differs from the manifest's)", f.name);
  }
}

}  // namespace

void Artifact::add(const std::string& name, std::string data) {
  if (!safe_name(name) || name == "manifest.json") fail(Errc::internal, "artifact entry name '{}'", name);
  entries_[name] = std::move(data);
}

namespace {

void parse_checked(std::string_view all, std::map<std::string, std::string>& entries, ArtifactManifest& manifest);

// Reads and checks an artifact. Every problem throws Error(Errc::artifact)
// saying what, without the path; read() adds it, once.
void read_checked(const fs::path& path, std::map<std::string, std::string>& entries, ArtifactManifest& manifest) {
  auto bad = [](const std::string& why) { return Error(Errc::artifact, why); };
  std::error_code ec;
  // An unpacked folder's entries come from wherever it came from: each is
  // opened without following links, only if a regular file (a FIFO or a
  // device would block or never end), and no larger than the manifest says.
  auto entry = [&](const std::string& name, size_t max_bytes) -> std::optional<std::string> {
    try {
      return read_entry(path, name, max_bytes);
    } catch (const Error& e) {
      throw bad(fmt::format("'{}' cannot be used: {}", name, e.what()));
    }
  };
  if (fs::is_directory(path, ec)) {
    std::optional<std::string> man = entry("manifest.json", kMaxManifestBytes);
    if (!man) throw bad("no manifest.json in the folder");
    manifest = manifest_from(json::parse(*man));
    entries["manifest.json"] = *man;
    // What the manifest lists, bounded as a packed file is, before anything is read.
    uint64_t total = 0;
    std::set<std::string> names;
    for (const auto& f : manifest.files) {
      total += std::min<uint64_t>(f.bytes, kMaxArtifactBytes);
      if (!names.insert(f.name).second) throw bad(fmt::format("its manifest lists '{}' twice", f.name));
    }
    if (manifest.files.size() > kMaxEntries || total > kMaxArtifactBytes)
      throw bad(fmt::format("its manifest lists {} files of {} bytes in all, more than an artifact may hold",
                            manifest.files.size(), total));
    for (const auto& f : manifest.files) {
      if (!safe_name(f.name)) throw bad(fmt::format("its manifest names '{}', not a name kiln writes", f.name));
      // One byte past the manifest's size: a longer file reads as damaged, a far longer one is not read.
      std::optional<std::string> d = entry(f.name, std::min<uint64_t>(f.bytes + 1, kMaxArtifactBytes));
      if (!d) throw bad(fmt::format("'{}' is missing", f.name));
      entries[f.name] = std::move(*d);
    }
    verify(manifest, entries);
    return;
  }
  // The header first: a large file that is not an artifact is refused before it is read whole.
  if (fs::is_regular_file(path, ec)) {
    if (std::FILE* f = std::fopen(path.c_str(), "rbe")) {
      char head[64] = {};
      const size_t got = std::fread(head, 1, kMagic.size() + 1, f);
      std::fclose(f);
      if (std::string_view(head, got) != std::string(kMagic) + " ") throw bad("it is not a kiln artifact");
    }
  }
  std::optional<std::string> text;
  try {
    text = read_regular_file(path, kMaxArtifactBytes);
  } catch (const Error& e) {
    throw bad(fmt::format("cannot be read ({})", e.what()));
  }
  if (!text) throw bad("no such file");
  parse_checked(*text, entries, manifest);
}

// A packed file's bytes: the header, the entries, the manifest, each checked.
void parse_checked(std::string_view all, std::map<std::string, std::string>& entries, ArtifactManifest& manifest) {
  auto bad = [](const std::string& why) { return Error(Errc::artifact, why); };
  size_t eol = all.find('\n');
  if (eol == std::string_view::npos || eol > 200) throw bad("it is not a kiln artifact (no header)");
  // "MAGIC FORMAT SUM LEN", each read whole: a number too long for its type is named as written.
  std::vector<std::string_view> f;
  for (std::string_view h = all.substr(0, eol); !h.empty();) {
    size_t sp = h.find(' ');
    if (sp != 0) f.push_back(h.substr(0, sp));
    h = sp == std::string_view::npos ? std::string_view() : h.substr(sp + 1);
  }
  if (f.size() != 4 || f[0] != kMagic) throw bad("it is not a kiln artifact");
  auto number = [](std::string_view t, auto& v, int base) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v, base);
    return ec == std::errc() && p == t.data() + t.size();
  };
  int format = 0;
  unsigned long long sum = 0, len = 0;
  if (!number(f[1], format, 10) || format != ArtifactManifest::kFormat)
    throw bad(fmt::format("it is of artifact format {}; this kiln reads format {} (pack it again with this kiln)",
                          f[1].substr(0, 24), ArtifactManifest::kFormat));
  if (f[2].size() > 16 || !number(f[2], sum, 16) || !number(f[3], len, 10))
    throw bad("it is not a kiln artifact (its header is damaged)");
  std::string_view body = all.substr(eol + 1);
  if (body.size() < len) throw bad(fmt::format("it is truncated ({} of {} bytes)", body.size(), len));
  if (body.size() > len) throw bad("it has bytes past its end");
  if (hash64(body.data(), body.size()) != sum) throw bad("it is damaged (its checksum differs)");
  while (!body.empty()) {
    size_t e1 = body.find('\n');
    if (e1 == std::string_view::npos) throw bad("an entry has no name");
    std::string name(body.substr(0, e1));
    body.remove_prefix(e1 + 1);
    size_t e2 = body.find('\n');
    if (e2 == std::string_view::npos || e2 > 20) throw bad("an entry has no size");
    uint64_t n = std::stoull(std::string(body.substr(0, e2)));
    body.remove_prefix(e2 + 1);
    if (n > body.size()) throw bad(fmt::format("entry '{}' runs past the end", name));
    if (!safe_name(name) || entries.count(name) || entries.size() >= kMaxEntries)
      throw bad(fmt::format("entry '{}' is not a name kiln writes, or repeats", name));
    entries[name] = std::string(body.substr(0, n));
    body.remove_prefix(n);
  }
  auto man = entries.find("manifest.json");
  if (man == entries.end()) throw bad("it has no manifest");
  manifest = manifest_from(json::parse(man->second));
  verify(manifest, entries);
}

}  // namespace

Artifact Artifact::read(const fs::path& path) {
  Artifact a;
  try {
    read_checked(path, a.entries_, a.manifest_);
    return a;
  } catch (const Error& e) {
    throw Error(Errc::artifact, fmt::format("artifact {}: {}; nothing of it was loaded", path.string(), e.what()));
  } catch (const std::exception& e) {
    throw Error(Errc::artifact,
                fmt::format("artifact {}: its manifest or an entry does not parse ({}); nothing of it was loaded",
                            path.string(), e.what()));
  }
}

Artifact Artifact::parse(std::string_view bytes, const std::string& what) {
  Artifact a;
  try {
    parse_checked(bytes, a.entries_, a.manifest_);
    return a;
  } catch (const Error& e) {
    throw Error(Errc::artifact, fmt::format("artifact {}: {}; nothing of it was loaded", what, e.what()));
  } catch (const std::exception& e) {
    throw Error(Errc::artifact,
                fmt::format("artifact {}: its manifest or an entry does not parse ({}); nothing of it was loaded", what,
                            e.what()));
  }
}

namespace {
std::string manifest_text(const ArtifactManifest& base, const std::map<std::string, std::string>& entries) {
  ArtifactManifest m = base;
  m.files.clear();
  for (const auto& [n, d] : entries)
    if (n != "manifest.json") m.files.push_back({n, d.size(), sum_hex(d)});
  return dump_json(manifest_json(m), 1);
}
}  // namespace

void Artifact::write(const fs::path& file) const {
  std::string body;
  auto put = [&](const std::string& n, const std::string& d) {
    body += n + "\n" + std::to_string(d.size()) + "\n";
    body += d;
  };
  put("manifest.json", manifest_text(manifest_, entries_));
  for (const auto& [n, d] : entries_)
    if (n != "manifest.json") put(n, d);
  std::string head = fmt::format("{} {} {:016x} {}\n", kMagic, ArtifactManifest::kFormat,
                                 hash64(body.data(), body.size()), body.size());
  // The file is written beside the path and renamed over it: whatever is there is replaced, so
  // only a regular file or nothing may be (a device, a pipe or a link would be replaced by a file).
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(file, ec);
  if (!ec && fs::exists(st) && !fs::is_regular_file(st))
    fail(Errc::io, "'{}' exists and is not a regular file (a {}): an artifact is written only to a regular file or a "
         "new path", file.string(), fs::is_symlink(st) ? "symbolic link" : fs::is_directory(st) ? "folder" : "device, pipe or socket");
  // A file written again keeps its permissions; a new one is readable as the umask allows.
  write_file_atomic(file, head + body,
                    fs::is_regular_file(st) ? static_cast<unsigned>(st.permissions()) & 0777u : shared_file_mode());
}

void Artifact::write_dir(const fs::path& dir) const {
  fs::create_directories(dir);
  for (const auto& [n, d] : entries_)
    if (n != "manifest.json") {
      fs::create_directories((dir / n).parent_path());
      write_file_atomic(dir / n, d, shared_file_mode());
    }
  write_file_atomic(dir / "manifest.json", manifest_text(manifest_, entries_), shared_file_mode());
}

std::string Artifact::mismatch(Runtime& rt) const {
  for (const auto& t : manifest_.targets) {
    Backend* b = nullptr;
    try {
      b = &rt.backend(t.backend);
    } catch (const Error& e) {
      return fmt::format("its {} kernels need a backend this machine lacks ({})", t.backend, e.what());
    }
    if (std::string why = b->unavailable_reason(); !why.empty())
      return fmt::format("the {} backend is unavailable here ({})", t.backend, why);
    std::string dev = b->device_identity();
    if (dev != t.device) return fmt::format("it was packed for {} device '{}'; this one is '{}'", t.backend, t.device, dev);
    std::string tc = hash_bytes(b->toolchain_identity()).hex();
    if (tc != t.toolchain)
      return fmt::format("it was packed with the {} toolchain '{}'; this one is '{}'", t.backend, t.toolchain_text,
                         b->toolchain_identity());
  }
  return "";
}

KernelSpec Artifact::spec(const std::string& kernel, const fs::path& dir) const {
  for (const auto& k : manifest_.kernels) {
    if (k.name != kernel) continue;
    const std::string prefix = "sources/" + k.name + "/";
    for (const auto& [n, d] : entries_)
      if (n.compare(0, prefix.size(), prefix) == 0) {
        fs::create_directories((dir / n).parent_path());
        write_file_atomic(dir / n, d);
      }
    // The spec entry is a file the artifact holds, with ":member" for a family's member.
    const auto [file, member] = split_member(k.spec);
    if (!safe_name(file.string()) || file.string().compare(0, prefix.size(), prefix) != 0 ||
        (!member.empty() && !is_identifier(member)))
      fail(Errc::usage, "the artifact's kernel '{}' names its spec '{}', not a file of its own sources", kernel, k.spec);
    return load_spec(dir / k.spec);
  }
  fail(Errc::usage, "the artifact holds no kernel '{}'", kernel);
}

std::vector<std::string> Artifact::record_texts() const {
  std::vector<std::string> out;
  for (const auto& [n, d] : entries_)
    if (n.compare(0, 8, "records/") == 0) out.push_back(d);
  return out;
}

std::vector<std::string> Artifact::binary_blobs() const {
  std::vector<std::string> out;
  for (const auto& [n, d] : entries_)
    if (n.compare(0, 9, "binaries/") == 0) out.push_back(d);
  return out;
}

std::string load_artifact(Runtime& rt, const fs::path& path, bool sources_only) {
  const auto t0 = std::chrono::steady_clock::now();
  Artifact a = Artifact::read(path);
  const double read_ms = log::ms_since(t0);
  // Beside the check below, which makes the device (a GPU's context: the most of a
  // warm start): every binary decoded against its own key before any is used, and
  // each target's toolchain named (the compiler opened) on a thread of its own.
  std::vector<Binary> bins;
  std::string bad_binary;
  double decode_ms = 0;
  std::exception_ptr failed;
  auto beside = [&] {
    try {
      const auto t1 = std::chrono::steady_clock::now();
      for (const auto& [n, d] : a.entries()) {
        if (n.compare(0, 9, "binaries/") != 0) continue;
        std::optional<Binary> b = CodeCache::decode(d, fs::path(n).stem().string());
        if (!b) {
          bad_binary = n;
          break;
        }
        bins.push_back(std::move(*b));
      }
      decode_ms = log::ms_since(t1);
      // Then the toolchain (on the cuda backend NVRTC is opened, then the device's
      // architecture waited for): the check finds it named.
      for (const auto& t : a.manifest().targets) try {
          rt.backend(t.backend).toolchain_identity();
        } catch (const Error&) {
          // said by the check, which asks again
        }
    } catch (...) {
      failed = std::current_exception();
    }
  };
  std::thread side;
  try {
    side = std::thread(beside);
  } catch (const std::system_error&) {
    beside();  // no thread to be had: one after the other
  }
  std::string why;
  try {
    why = a.mismatch(rt);
  } catch (...) {
    if (side.joinable()) side.join();
    throw;
  }
  const double check_ms = log::ms_since(t0) - read_ms;
  if (side.joinable()) side.join();
  if (failed) std::rethrow_exception(failed);
  if (log::debugging())
    log::debug("artifact {}: read in {:.1f} ms; checked against this machine in {:.1f} ms; its binaries decoded "
               "beside in {:.1f} ms", path.string(), read_ms, check_ms, decode_ms);
  if (!why.empty()) {
    if (!sources_only)
      fail(Errc::artifact,
           "artifact {}: {}. Pack it on a machine like this one, or set KILN_ARTIFACT_MISMATCH=sources to use its "
           "sources and tune here; nothing of it was loaded",
           path.string(), why);
    log::warn("artifact {}: {}; using its sources only (its kernels compile and tune here)", path.string(), why);
    return fmt::format("artifact {}: sources only ({} kernels)", path.string(), a.manifest().kernels.size());
  }
  if (!bad_binary.empty())
    fail(Errc::artifact, "artifact {}: binary '{}' does not decode; nothing of it was loaded", path.string(), bad_binary);
  std::vector<std::string> recs = a.record_texts();
  size_t nb = bins.size();
  if (auto cc = rt.code_cache()) cc->add_overlay(std::move(bins));
  else if (nb) log::warn("artifact {}: KILN_NO_CACHE is set, so its binaries are not used", path.string());
  if (auto tc = rt.tuning_cache()) {
    tc->add_artifact_records(recs);
    for (const auto& [n, d] : a.entries())
      if (n.compare(0, 6, "plans/") == 0) tc->add_artifact_plan(fs::path(n).stem().string(), d);
  }
  else if (!recs.empty()) log::warn("artifact {}: KILN_NO_CACHE is set, so its records are not used", path.string());
  return fmt::format("artifact {}: {} kernels, {} records, {} binaries", path.string(), a.manifest().kernels.size(),
                     recs.size(), nb);
}

std::vector<Config> artifact_configs(const TuningRecord& record, const Config& choice, int runners_up) {
  std::vector<Config> want{choice};
  bool library = !choice.library.empty();
  const std::vector<const ConfigResult*> ranked = record.ranked();
  for (const ConfigResult* c : ranked)
    if (static_cast<int>(want.size()) <= runners_up && !(c->config == choice)) {
      want.push_back(c->config);
      library = library || !c->config.library.empty();
    }
  if (library)
    for (const ConfigResult* c : ranked)
      if (c->config.library.empty()) {
        if (std::find(want.begin(), want.end(), c->config) == want.end()) want.push_back(c->config);
        break;
      }
  std::erase_if(want, [](const Config& c) { return !c.library.empty(); });
  return want;
}

}  // namespace kiln
