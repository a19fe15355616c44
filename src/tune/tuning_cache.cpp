#include <algorithm>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "backends/serialize.hpp"
#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/ext/backend.hpp"
#include "kiln/ext/binary_key.hpp"
#include "kiln/tuning.hpp"
#include "compile/remote_cache.hpp"
#include "kiln/library.hpp"
#include "tune/record_io.hpp"

#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace kiln {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kiln_version() { return KILN_VERSION; }

namespace {
std::pair<int, int> version_parts(const std::string& v) {
  int major = -1, minor = -1;
  std::sscanf(v.c_str(), "%d.%d", &major, &minor);
  return {major, minor};
}
}  // namespace

bool kiln_version_compatible(const std::string& recorded) {
  auto [rm, rn] = version_parts(recorded);
  auto [om, on] = version_parts(KILN_VERSION);
  if (rm < 0 || rm != om) return false;
  return om != 0 || rn == on;
}

const std::string& remote_key_prefix() {
  static const std::string prefix = [] {
    auto [major, minor] = version_parts(KILN_VERSION);
    return major == 0 ? fmt::format("kiln:t{}:v0.{}:", TuningKey::kFormatVersion, minor)
                      : fmt::format("kiln:t{}:v{}:", TuningKey::kFormatVersion, major);
  }();
  return prefix;
}

const char* fail_kind_name(FailKind k) noexcept {
  switch (k) {
    case FailKind::none: return "ok";
    case FailKind::pruned: return "pruned";
    case FailKind::compile: return "compile";
    case FailKind::crash: return "crash";
    case FailKind::timeout: return "timeout";
    case FailKind::wrong: return "wrong";
    case FailKind::launch: return "launch";
    case FailKind::unavailable: return "unavailable";
  }
  return "?";
}

std::optional<FailKind> fail_kind_from_name(std::string_view s) noexcept {
  for (FailKind k : {FailKind::none, FailKind::pruned, FailKind::compile, FailKind::crash, FailKind::timeout,
                     FailKind::wrong, FailKind::launch, FailKind::unavailable})
    if (s == fail_kind_name(k)) return k;
  return std::nullopt;
}

const char* search_method_name(SearchMethod m) noexcept {
  switch (m) {
    case SearchMethod::exhaustive: return "exhaustive";
    case SearchMethod::coordesc: return "coordesc";
    case SearchMethod::budgeted: return "budgeted";
    case SearchMethod::multi_kernel: return "multi-kernel";
    case SearchMethod::plan: return "plan";
  }
  return "?";
}

std::optional<SearchMethod> search_method_from_name(std::string_view s) noexcept {
  for (SearchMethod m : {SearchMethod::exhaustive, SearchMethod::coordesc, SearchMethod::budgeted,
                         SearchMethod::multi_kernel, SearchMethod::plan})
    if (s == search_method_name(m)) return m;
  return std::nullopt;
}

std::string TuningKey::base_hex() const {
  Hasher h;
  h.add("tuning-format", static_cast<int64_t>(kFormatVersion))
      .add("backend", backend)
      .add("device", device)
      .add("toolchain", toolchain)
      .add("source", source_hash)
      .add("semantics", semantics);
  for (const auto& [n, v] : values) h.add("key-name", n);
  return h.digest().hex();
}

std::string TuningKey::values_hex() const {
  Hasher h;
  for (const auto& [n, v] : values) h.add(n, v);
  return h.digest().hex();
}

std::string TuningKey::values_text() const {
  if (values.empty()) return "-";
  std::string s;
  for (const auto& [n, v] : values) s += fmt::format("{}{}={}", s.empty() ? "" : " ", n, v);
  return s;
}

std::string TuningKey::to_string() const {
  return fmt::format(
      "tuning-format {}\nbackend {}\ndevice {}\ntoolchain {}\nsource {}\nsemantics {}\nkey {}\nbase {} values {}",
      kFormatVersion, backend, device, toolchain, source_hash, semantics, values_text(), base_hex(), values_hex());
}

std::string spec_semantics_hash(const KernelSpec& s) {
  Hasher h;
  for (const auto& a : s.args) {
    h.add("arg", a.name + ":" + a.type_text());
    if (a.pointer) h.add("size", a.size.str()).add("intent", intent_name(a.intent));
    if (a.cell) h.add("cell", a.name);
  }
  for (const auto& e : s.grid) h.add("grid", e.str());
  for (const auto& e : s.block) h.add("block", e.str());
  if (s.shared) h.add("shared", s.shared->str());
  for (const auto& e : s.constraints) h.add("constraint", e.str());
  for (const auto& [n, v] : s.constants) h.add("constant", fmt::format("{}={}", n, v));
  for (const auto& z : s.zero) h.add("zero", z);
  if (s.zero_when) h.add("zero_when", s.zero_when->str());
  if (s.pdl) h.add("pdl", "1");
  for (const auto& f : s.cflags) h.add("cflag", f);
  h.add("rtol", fmt::format("{:.17g}", s.tuning.rtol)).add("atol", fmt::format("{:.17g}", s.tuning.atol));
  h.add("reference", s.tuning.reference_config ? s.tuning.reference_config->str() : std::string("(first that runs)"));
  for (const auto& k : s.tuning.key) h.add("key", k);
  for (const auto& k : s.tuning.pow2) h.add("pow2", k);  // records kept by bucket
  for (const auto& p : s.tuning.registers_by) h.add("registers_by", p);  // what is pruned before compiling
  if (s.tuning.reduction) h.add("reduction", s.tuning.reduction->str());  // the tolerances follow it
  return h.digest().hex();
}

TuningKey make_tuning_key(const KernelSpec& spec, const std::string& device, const std::string& toolchain,
                          std::vector<std::pair<std::string, int64_t>> values) {
  TuningKey k;
  k.backend = spec.backend;
  k.device = device;
  k.toolchain = hash_bytes(toolchain).hex();
  // A multi-kernel's stand-in spec has no source file: its text names its variants' hashes.
  k.source_hash = spec.source_path.empty() ? hash_bytes(spec.source_text).hex() : kernel_source_hash(spec).hex();
  k.semantics = spec_semantics_hash(spec);
  for (auto& [n, v] : values) v = spec.tuning.key_value(n, v);  // bucketed keys by bucket, whoever gives them
  k.values = std::move(values);
  return k;
}

TuningKey make_tuning_key(const KernelSpec& spec, Backend& backend, std::vector<std::pair<std::string, int64_t>> values) {
  return make_tuning_key(spec, backend.device_identity(), backend.toolchain_identity(), std::move(values));
}

TuningKey make_tuning_key(const KernelSpec& spec, Backend& backend, void* const* params) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  std::vector<std::pair<std::string, int64_t>> values;
  for (const auto& name : spec.tuning.key)
    values.push_back({name, spec.tuning.key_value(name, slots[spec.arg_index(name)])});
  return make_tuning_key(spec, backend, std::move(values));
}

std::vector<const ConfigResult*> TuningRecord::ranked() const {
  std::vector<const ConfigResult*> out;
  for (const auto& c : configs)
    if (c.ok()) out.push_back(&c);
  std::stable_sort(out.begin(), out.end(), [](auto* a, auto* b) { return *a->ns < *b->ns; });
  return out;
}

const ConfigResult* TuningRecord::find(const Config& c) const {
  for (const auto& r : configs)
    if (r.config == c) return &r;
  return nullptr;
}

std::string no_config_can_run(const std::vector<std::string>& reasons) {
  std::vector<std::string> why;
  for (std::string e : reasons) {
    // (Without the stage it was pruned at, so that one reason met at two stages is said once.)
    for (const char* stage : {"pruned before compiling: ", "pruned: "})
      if (e.rfind(stage, 0) == 0) e.erase(0, std::strlen(stage));
    if (std::find(why.begin(), why.end(), e) == why.end()) why.push_back(std::move(e));
  }
  if (why.size() <= 3) return fmt::format("no config can run this call ({})", fmt::join(why, "; "));
  return fmt::format("no config can run this call ({}; and {} more reason{})", fmt::join(why.begin(), why.begin() + 3, "; "),
                     why.size() - 3, why.size() == 4 ? "" : "s");
}

std::string TuningRecord::all_failed_message() const {
  std::string s = fmt::format("kernel '{}' at {}: ", kernel, key.values_text());
  // Where no config was even tried (each pruned for this call, or its library absent), the first
  // line says why, for messages that keep only it (a multi-kernel's variants): a misaligned
  // buffer, a size no config takes.
  std::vector<std::string> why;
  bool none_tried = !configs.empty();
  for (const auto& c : configs) {
    if (c.kind != FailKind::pruned && c.kind != FailKind::unavailable) {
      none_tried = false;
      break;
    }
    why.push_back(c.error);
  }
  if (!verdict.empty())
    s += verdict;
  else if (none_tried)
    s += no_config_can_run(why);
  else
    s += "no config survived tuning";
  for (const auto& c : configs)
    if (c.kind != FailKind::none || !c.ns)
      s += fmt::format("\n  {}: {}", c.config.str(), c.error.empty() ? fail_kind_name(c.kind) : c.error);
  return s;
}

namespace {

json space_json(const ConfigSpace& s) {
  json j = json::array();
  for (const auto& p : s.params) j.push_back({{"name", p.name}, {"values", p.values}});
  return j;
}

std::optional<ConfigSpace> space_from(const json& j) {
  if (!j.is_array()) return std::nullopt;
  ConfigSpace s;
  for (const auto& p : j) {
    Param x;
    x.name = p.at("name").get<std::string>();
    x.values = p.at("values").get<std::vector<int64_t>>();
    if (!is_identifier(x.name) || x.values.empty()) return std::nullopt;
    s.params.push_back(std::move(x));
  }
  if (s.size() > ConfigSpace::kMaxConfigs) return std::nullopt;
  return s;
}

// A config read back: a point of `space` (the record's own), or a library choice.
std::optional<Config> config_from(const json& j, const ConfigSpace& space) {
  if (!j.is_object()) return std::nullopt;
  Config c;
  if (j.contains("library")) {
    if (!j["library"].is_string() || j.size() != 1) return std::nullopt;
    c.library = j["library"].get<std::string>();
    // A choice of the grammar kiln/library.hpp reads ("cublaslt_bf16_nt#3").
    if (!parse_library_choice(c.library)) return std::nullopt;
    return c;
  }
  for (const auto& p : space.params) {
    if (!j.contains(p.name) || !j[p.name].is_number_integer()) return std::nullopt;
    c.values.push_back({p.name, j[p.name].get<int64_t>()});
  }
  if (j.size() != space.params.size() || !space.index_of(c)) return std::nullopt;
  return c;
}

bool is_hex32(const std::string& s) {
  if (s.size() != 32) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

constexpr std::string_view kMagic = "kiln-tuning-record";

}  // namespace

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

// A config pruned before compiling, with nothing measured: written as its
// index in the record's space, grouped by reason (a search space of 12,000
// configs prunes thousands, and a warm first call reads them all).
constexpr size_t kMaxPrunedReason = 1024;
constexpr size_t kMaxExpandedBytes = size_t{64} << 20;

bool written_by_index(const ConfigResult& c) {
  if (c.error.size() > kMaxPrunedReason) return false;  // written whole
  return c.kind == FailKind::pruned && c.config.library.empty() && c.binary.empty() && !c.ns && c.min_ns == 0 &&
         c.max_ns == 0 && c.reps == 0 && c.detail.empty();
}

// Sorted indices as ranges: "0-3 7 9-12".
std::string ranges_text(const std::vector<size_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ' ';
    out += std::to_string(v[i]);
    if (j > i) out += '-' + std::to_string(v[j]);
    i = j + 1;
  }
  return out;
}

// The indices of ranges_text, each below `limit`, ascending and each once;
// nullopt for anything else.
std::optional<std::vector<size_t>> ranges_from(std::string_view t, size_t limit) {
  std::vector<size_t> out;
  auto number = [&](size_t& pos, size_t& v) {
    size_t start = pos;
    v = 0;
    while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') {
      if (v > limit) return false;
      v = v * 10 + static_cast<size_t>(t[pos++] - '0');
    }
    return pos > start && pos - start <= 7;
  };
  size_t pos = 0;
  while (pos < t.size()) {
    if (!out.empty() && t[pos++] != ' ') return std::nullopt;
    size_t a = 0, b = 0;
    if (!number(pos, a)) return std::nullopt;
    b = a;
    if (pos < t.size() && t[pos] == '-') {
      ++pos;
      if (!number(pos, b) || b <= a) return std::nullopt;
    }
    if (b >= limit || (!out.empty() && a <= out.back())) return std::nullopt;
    for (size_t i = a; i <= b; ++i) out.push_back(i);
  }
  return out;
}

}  // namespace

std::string record_to_json(const TuningRecord& r) {
  json configs = json::array();
  std::map<std::string, std::vector<size_t>> pruned;  // reason -> indices in the space
  std::vector<bool> indexed(r.space.size(), false);
  for (const auto& c : r.configs) {
    if (written_by_index(c))
      if (std::optional<size_t> at = r.space.index_of(c.config)) {
        if (!indexed[*at]) pruned[c.error].push_back(*at);  // each once: the reader refuses a repeat
        indexed[*at] = true;
        continue;
      }
    configs.push_back({{"params", config_json(c.config)},
                       {"binary", c.binary},
                       {"ns", c.ns ? json(*c.ns) : json(nullptr)},
                       {"min_ns", c.min_ns},
                       {"max_ns", c.max_ns},
                       {"reps", c.reps},
                       {"kind", fail_kind_name(c.kind)},
                       {"error", c.error}});
    if (!c.detail.empty()) configs.back()["detail"] = c.detail;
  }
  json key = json::object();
  json names = json::array();
  for (const auto& [n, v] : r.key.values) {
    key[n] = v;
    names.push_back(n);
  }
  json j = {{"schema", TuningRecord::kSchema},
            {"tuning_format", TuningKey::kFormatVersion},
            {"kiln_version", r.kiln_version.empty() ? kiln_version() : r.kiln_version},
            {"kernel", r.kernel},
            {"backend", r.key.backend},
            {"device", r.key.device},
            {"toolchain", r.key.toolchain},
            {"source_hash", r.key.source_hash},
            {"semantics", r.key.semantics},
            {"key", key},
            {"key_names", names},
            {"best", r.best ? config_json(*r.best) : json(nullptr)},
            {"best_ns", r.best ? json(r.best_ns) : json(nullptr)},
            {"noise", r.noise},
            {"noisy", r.noisy},
            {"remeasured", r.remeasured},
            {"method", search_method_name(r.method)},
            {"start", r.start},
            {"reference", r.reference},
            {"verdict", r.verdict},
            {"when", r.when.empty() ? utc_now() : r.when},
            {"space", space_json(r.space)},
            {"timed", r.timed},
            {"peak_device_bytes", r.peak_device_bytes},
            {"configs", configs}};
  json by_reason = json::array();
  for (auto& [error, at] : pruned) {
    std::sort(at.begin(), at.end());
    by_reason.push_back({{"error", error}, {"at", ranges_text(at)}});
  }
  j["pruned"] = by_reason;
  return dump_json(j, 1);
}

std::string record_to_text(const TuningRecord& r) {
  return checked_text(kMagic, TuningRecord::kSchema, record_to_json(r));
}

std::optional<TuningRecord> record_from_text(std::string_view text, const TuningKey& expect) {
  try {
    std::optional<std::string_view> body = checked_body(text, kMagic, TuningRecord::kSchema);
    if (!body) return std::nullopt;
    json j = json::parse(*body);
    if (j.at("schema").get<int>() != TuningRecord::kSchema) return std::nullopt;
    if (j.at("tuning_format").get<int>() != TuningKey::kFormatVersion) return std::nullopt;
    if (!kiln_version_compatible(j.at("kiln_version").get<std::string>())) return std::nullopt;
    TuningRecord r;
    r.kernel = j.at("kernel").get<std::string>();
    r.key.backend = j.at("backend").get<std::string>();
    r.key.device = j.at("device").get<std::string>();
    r.key.toolchain = j.at("toolchain").get<std::string>();
    r.key.source_hash = j.at("source_hash").get<std::string>();
    r.key.semantics = j.at("semantics").get<std::string>();
    for (const auto& n : j.at("key_names")) {
      std::string name = n.get<std::string>();
      r.key.values.push_back({name, j.at("key").at(name).get<int64_t>()});
    }
    if (r.key.backend != expect.backend || r.key.device != expect.device || r.key.toolchain != expect.toolchain ||
        r.key.source_hash != expect.source_hash || r.key.semantics != expect.semantics ||
        r.key.values != expect.values)
      return std::nullopt;
    auto space = space_from(j.at("space"));
    if (!space) return std::nullopt;
    r.space = std::move(*space);
    if (!j.at("best").is_null()) {
      r.best = config_from(j["best"], r.space);
      if (!r.best) return std::nullopt;
      r.best_ns = j.at("best_ns").get<double>();
    }
    r.noise = j.at("noise").get<double>();
    r.noisy = j.value("noisy", false);  // optional: records written before the flag read as quiet
    r.remeasured = j.value("remeasured", 0);
    auto method = search_method_from_name(j.at("method").get<std::string>());
    if (!method) return std::nullopt;
    r.method = *method;
    r.start = j.at("start").get<std::string>();
    r.reference = j.at("reference").get<std::string>();
    r.verdict = j.at("verdict").get<std::string>();
    r.when = j.at("when").get<std::string>();
    r.kiln_version = j.at("kiln_version").get<std::string>();
    r.timed = j.at("timed").get<size_t>();
    r.peak_device_bytes = j.at("peak_device_bytes").get<int64_t>();
    if (!(r.noise >= 0 && r.noise < 10)) return std::nullopt;
    for (const auto& c : j.at("configs")) {
      ConfigResult cr;
      auto cfg = config_from(c.at("params"), r.space);
      if (!cfg) return std::nullopt;
      cr.config = *cfg;
      cr.binary = c.at("binary").get<std::string>();
      if (!c.at("ns").is_null()) cr.ns = c["ns"].get<double>();
      cr.min_ns = c.at("min_ns").get<double>();
      cr.max_ns = c.at("max_ns").get<double>();
      cr.reps = c.at("reps").get<int>();
      auto kind = fail_kind_from_name(c.at("kind").get<std::string>());
      if (!kind) return std::nullopt;
      cr.kind = *kind;
      cr.error = c.at("error").get<std::string>();
      if (c.contains("detail")) cr.detail = c["detail"].get<std::string>();
      // A result is a time (with its binary) or a reason, never neither.
      if (cr.kind == FailKind::none && (!cr.ns || !(*cr.ns > 0) || (!is_hex32(cr.binary) && cr.config.library.empty())))
        return std::nullopt;
      if (cr.kind != FailKind::none && cr.ns) return std::nullopt;
      r.configs.push_back(std::move(cr));
    }
    std::vector<bool> seen(r.space.size(), false);
    // What the pruned configs expand to is bounded, whatever the text says:
    // a short reason, and at most kMaxExpandedBytes of reasons and names.
    size_t names_bytes = 0, expanded = 0;
    for (const auto& p : r.space.params) names_bytes += p.name.size() + 16;
    for (const auto& group : j.at("pruned")) {
      std::string error = group.at("error").get<std::string>();
      if (error.size() > kMaxPrunedReason) return std::nullopt;
      auto at = ranges_from(group.at("at").get<std::string>(), r.space.size());
      if (!at || at->empty()) return std::nullopt;
      expanded += at->size() * (error.size() + names_bytes);
      if (expanded > kMaxExpandedBytes) return std::nullopt;
      for (size_t i : *at) {
        if (seen[i]) return std::nullopt;  // each config once
        seen[i] = true;
        ConfigResult cr;
        cr.config = r.space.at(i);
        cr.kind = FailKind::pruned;
        cr.error = error;
        r.configs.push_back(std::move(cr));
      }
    }
    if (r.best && !r.find(*r.best)) return std::nullopt;
    return r;
  } catch (const std::exception& e) {
    log::debug("a tuning record does not parse: {}", e.what());
    return std::nullopt;
  }
}

namespace {

// The key a record's text says it has (not yet validated: record_from_text does that).
std::optional<TuningKey> stated_key(std::string_view text) {
  try {
    size_t eol = text.find('\n');
    if (eol == std::string_view::npos) return std::nullopt;
    json j = json::parse(text.substr(eol + 1));
    TuningKey k;
    k.backend = j.at("backend").get<std::string>();
    k.device = j.at("device").get<std::string>();
    k.toolchain = j.at("toolchain").get<std::string>();
    k.source_hash = j.at("source_hash").get<std::string>();
    k.semantics = j.at("semantics").get<std::string>();
    for (const auto& n : j.at("key_names")) {
      std::string name = n.get<std::string>();
      k.values.push_back({name, j.at("key").at(name).get<int64_t>()});
    }
    return k;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string slot_of(const TuningKey& k) { return k.base_hex() + "/" + k.values_hex(); }

std::string random_token() {
  std::random_device rd;
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  return fmt::format("{}:{}:{:08x}{:08x}", host, ::getpid(), rd(), rd());
}

}  // namespace

struct TuningCache::Dirs {
  SafeDir root, tune, locks;
  RemoteSettings remote;
  mutable std::mutex m;
  std::map<std::string, std::string> artifact;  // slot -> record text
  std::map<std::string, std::string> fetched;   // slot -> record text from Redis (bundles, kernels' hashes)
  std::set<std::string> kernels_fetched;        // bases whose hash was fetched whole
  bool bundle_fetched = false;
  std::set<std::string> in_bundle;              // slots known to be in the named bundle
  std::map<std::string, std::string> artifact_plans;  // base -> plan text
  bool journal = false;
  bool discard_writes = false;  // open_read_only: nothing is kept locally
  std::map<std::string, TuningRecord> journaled;     // slot -> a record used while journaling
  mutable Stats stats;
  // Records parsed already, by slot with their text's hash: a text read again (the
  // same bytes) is not parsed again. A GEMM's record of a few hundred configs takes
  // about a millisecond to parse, on a first call's path; reading its kernel's
  // records ahead (a handle's work ahead of the calls) takes that off it.
  mutable std::mutex parsed_m;
  mutable std::map<std::string, std::pair<uint64_t, TuningRecord>> parsed;
  static constexpr size_t kMostParsed = 4096;

  std::optional<TuningRecord> parse(const std::string& slot, std::string_view text, const TuningKey& key) const {
    const uint64_t h = hash64(text.data(), text.size());
    {
      std::lock_guard<std::mutex> g(parsed_m);
      if (auto it = parsed.find(slot); it != parsed.end() && it->second.first == h) return it->second.second;
    }
    std::optional<TuningRecord> r = record_from_text(text, key);
    if (r) {
      std::lock_guard<std::mutex> g(parsed_m);
      if (parsed.size() >= kMostParsed) parsed.clear();
      parsed[slot] = {h, *r};
    }
    return r;
  }
};

TuningCache::TuningCache(fs::path root) : dirs_(std::make_unique<Dirs>()) {
  dirs_->root = SafeDir::open(root, true);
  dirs_->tune = dirs_->root.sub("tune", true);
  dirs_->locks = dirs_->root.sub("locks", true);
  dirs_->tune.check_writable();  // FolderNotWritable: the caller runs without a cache
  dirs_->locks.check_writable();
}

std::unique_ptr<TuningCache> TuningCache::open_existing(const fs::path& root) {
  std::unique_ptr<TuningCache> c(new TuningCache());
  c->dirs_ = std::make_unique<Dirs>();
  c->dirs_->root = SafeDir::open(root, false);
  if (c->dirs_->root) c->dirs_->tune = c->dirs_->root.sub("tune", false);
  return c;
}

std::unique_ptr<TuningCache> TuningCache::open_read_only(const fs::path& root) {
  std::unique_ptr<TuningCache> c = open_existing(root);
  c->dirs_->discard_writes = true;
  return c;
}

TuningCache::~TuningCache() = default;

void TuningCache::attach_remote(RemoteSettings r) {
  std::lock_guard<std::mutex> g(dirs_->m);
  dirs_->remote = std::move(r);
}

void TuningCache::add_artifact_records(const std::vector<std::string>& texts) {
  size_t other_schema = 0;
  {
    std::lock_guard<std::mutex> g(dirs_->m);
    const std::string head = fmt::format("{} {} ", kMagic, TuningRecord::kSchema);
    for (const auto& t : texts) {
      if (t.rfind(head, 0) != 0) ++other_schema;
      if (auto k = stated_key(t)) dirs_->artifact[slot_of(*k)] = t;
    }
  }
  if (other_schema)
    log::warn("the packed artifact holds {} tuning records of another record format than this kiln's (schema {}): "
              "they are not used, and their shapes compile and tune here; pack the artifact again with this kiln",
              other_schema, TuningRecord::kSchema);
}

TuningCache::Stats TuningCache::stats() const {
  std::lock_guard<std::mutex> g(dirs_->m);
  return dirs_->stats;
}

std::optional<TuningRecord> TuningCache::get(const TuningKey& key) const {
  Dirs& d = *dirs_;
  const std::string slot = slot_of(key);
  // 1. The local disk.
  if (d.tune) {
    if (SafeDir kd = d.tune.sub(key.base_hex(), false)) {
      std::string name = key.values_hex() + ".rec";
      if (std::optional<std::string> text = kd.read(name, kMaxRecordBytes)) {
        if (std::optional<TuningRecord> r = d.parse(slot, *text, key)) {
          std::lock_guard<std::mutex> g(d.m);
          ++d.stats.local_hits;
          return r;
        }
        log::info("tuning record {} does not validate (damaged, or from another kiln); tuning again",
                  (kd.path() / name).string());
      }
    }
  }
  // 2. A packed artifact.
  std::shared_ptr<RemoteCache> remote;
  std::optional<std::string> packed;
  {
    std::lock_guard<std::mutex> g(d.m);
    if (auto it = d.artifact.find(slot); it != d.artifact.end()) packed = it->second;
    remote = d.remote.remote;
  }
  if (packed)  // parsed outside the lock
    if (auto r = d.parse(slot, *packed, key)) {
      std::lock_guard<std::mutex> g(d.m);
      ++d.stats.artifact_hits;
      r->from_artifact = true;
      return r;
    }
  // 3. Redis: what this process fetched already, else the kernel's records
  //    (all of them, once per process, in one round trip), else the one key.
  std::optional<std::string> text;
  std::optional<TuningRecord> parsed;  // `text` parsed, where it was already
  // A remote copy that does not validate: counted, and dropped from what this process holds (and
  // from what it takes the bundle to hold, so a good record is written into it again).
  auto forget_rejected = [&] {
    std::lock_guard<std::mutex> g(d.m);
    ++d.stats.remote_rejected;
    d.fetched.erase(slot);
    d.in_bundle.erase(slot);
  };
  if (remote) {
    const std::string hash = remote_key_prefix() + "rec:" + key.base_hex();
    bool whole = false;
    std::string bundle;
    {
      std::lock_guard<std::mutex> g(d.m);
      if (!d.remote.bundle.empty() && !d.bundle_fetched) bundle = d.remote.bundle;
      d.bundle_fetched = true;
    }
    if (!bundle.empty()) {
      auto entries = remote->hgetall_bounded(remote_key_prefix() + "bundle:" + bundle, slot, kMaxRemoteRecordBytes,
                                             kRemoteFetchBudget, kRemoteBundleFields);
      std::lock_guard<std::mutex> g(d.m);
      for (auto& [field, value] : entries) {
        d.in_bundle.insert(field);
        d.fetched.emplace(field, std::move(value));
      }
      log::debug("bundle '{}': {} records fetched", bundle, entries.size());
    }
    {
      // The kernel's records in one round trip, unless what was fetched already (a bundle) holds this one.
      std::lock_guard<std::mutex> g(d.m);
      whole = !d.fetched.count(slot) && d.kernels_fetched.insert(key.base_hex()).second;
    }
    if (whole) {
      auto entries = remote->hgetall_bounded(hash, key.values_hex(), kMaxRemoteRecordBytes, kRemoteFetchBudget,
                                             kRemoteFetchFields);
      std::lock_guard<std::mutex> g(d.m);
      // (A bundle's copy fetched before stays: it is the one checked, and repaired, first.)
      for (auto& [field, value] : entries) d.fetched.emplace(key.base_hex() + "/" + field, std::move(value));
    }
    bool from_bundle = false;
    {
      std::lock_guard<std::mutex> g(d.m);
      if (auto it = d.fetched.find(slot); it != d.fetched.end()) {
        text = it->second;
        from_bundle = d.in_bundle.count(slot) > 0;
      }
    }
    if (!text && !whole) text = remote->hget(hash, key.values_hex());
    // A bundle's copy that does not validate: the kernel's own record is asked for, and the
    // bundle's copy is written again once a good record is used (note_used) or tuned (put).
    if (text && from_bundle && !(parsed = record_from_text(*text, key))) {
      forget_rejected();
      log::info("remote cache: the bundle's record of {} at {} does not validate; asking for the kernel's own",
                key.base_hex().substr(0, 12), key.values_text());
      text = remote->hget(hash, key.values_hex());
      parsed.reset();
    }
  }
  if (text) {
    // (Parsed once: a large record's parse is on the first call's path.)
    std::optional<TuningRecord> r = parsed ? std::move(parsed) : record_from_text(*text, key);
    if (!r) {
      forget_rejected();
      log::info("remote cache: the record of {} at {} does not validate (damaged, oversized, or from another kiln "
                "or config space); a miss",
                key.base_hex().substr(0, 12), key.values_text());
    } else {
      {
        std::lock_guard<std::mutex> g(d.m);
        ++d.stats.remote_hits;
        d.fetched[slot] = *text;
      }
      // Kept locally, so the next process on this machine needs no round trip.
      if (d.tune) {
        try {
          d.tune.sub(key.base_hex(), true).write(key.values_hex() + ".rec", *text);
        } catch (const Error& e) {
          log::debug("cannot keep a remote record locally: {}", e.what());
        }
      }
      return r;
    }
  }
  std::lock_guard<std::mutex> g(d.m);
  ++d.stats.misses;
  return std::nullopt;
}

void TuningCache::put(const TuningRecord& r) {
  if (!dirs_->tune && !dirs_->discard_writes) fail(Errc::cache, "the tuning cache is open for reading only");
  std::string text = record_to_text(r);
  if (dirs_->tune && !dirs_->discard_writes)
    dirs_->tune.sub(r.key.base_hex(), true).write(r.key.values_hex() + ".rec", text);
  std::shared_ptr<RemoteCache> remote;
  std::string bundle;
  {
    std::lock_guard<std::mutex> g(dirs_->m);
    remote = dirs_->remote.remote;
    bundle = dirs_->remote.bundle;
  }
  if (!remote) return;
  if (text.size() > kMaxRemoteRecordBytes) {
    log::info("the record of {} is {} bytes, more than the remote cache takes; kept locally only", r.key.values_text(),
              text.size());
    return;
  }
  bool wrote = remote->hset(remote_key_prefix() + "rec:" + r.key.base_hex(), r.key.values_hex(), text);
  if (wrote && !bundle.empty()) remote->hset(remote_key_prefix() + "bundle:" + bundle, slot_of(r.key), text);
  std::lock_guard<std::mutex> g(dirs_->m);
  if (wrote) {
    ++dirs_->stats.remote_writes;
    dirs_->fetched[slot_of(r.key)] = text;
    if (!bundle.empty()) dirs_->in_bundle.insert(slot_of(r.key));
  }
}

void TuningCache::journal(bool on) {
  std::lock_guard<std::mutex> g(dirs_->m);
  dirs_->journal = on;
}

std::vector<TuningRecord> TuningCache::journaled() const {
  std::lock_guard<std::mutex> g(dirs_->m);
  std::vector<TuningRecord> out;
  for (const auto& [slot, r] : dirs_->journaled) out.push_back(r);
  return out;
}

void TuningCache::note_used(const TuningRecord& r) {
  std::shared_ptr<RemoteCache> remote;
  std::string bundle, text;
  const std::string slot = slot_of(r.key);
  {
    std::lock_guard<std::mutex> g(dirs_->m);
    if (dirs_->journal) dirs_->journaled[slot] = r;
    if (!dirs_->remote.remote || dirs_->remote.bundle.empty() || !dirs_->in_bundle.insert(slot).second) return;
    remote = dirs_->remote.remote;
    bundle = dirs_->remote.bundle;
  }
  text = record_to_text(r);
  if (text.size() <= kMaxRemoteRecordBytes) remote->hset(remote_key_prefix() + "bundle:" + bundle, slot, text);
}

std::vector<TuningRecord> TuningCache::all(const TuningKey& base) const {
  std::vector<TuningRecord> out;
  std::set<std::string> seen;
  auto take = [&](const std::string& text) {
    auto k = stated_key(text);
    if (!k || k->base_hex() != base.base_hex() || seen.count(k->values_hex())) return;
    TuningKey expect = base;
    expect.values = k->values;
    if (auto r = dirs_->parse(slot_of(expect), text, expect)) {
      seen.insert(k->values_hex());
      out.push_back(std::move(*r));
    }
  };
  if (dirs_->tune)
    if (SafeDir d = dirs_->tune.sub(base.base_hex(), false))
      for (const auto& e : d.entries()) {
        if (!e.file || e.name.size() < 4 || e.name.substr(e.name.size() - 4) != ".rec") continue;
        if (std::optional<std::string> text = d.read(e.name, kMaxRecordBytes)) take(*text);
      }
  // The texts taken under the lock, parsed after it: a first call's get() does not
  // wait behind a whole kernel's parsing.
  std::vector<std::string> texts;
  {
    std::lock_guard<std::mutex> g(dirs_->m);
    const std::string prefix = base.base_hex() + "/";
    for (const auto* m : {&dirs_->artifact, &dirs_->fetched})
      for (auto it = m->lower_bound(prefix); it != m->end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
        texts.push_back(it->second);
  }
  for (const auto& t : texts) take(t);
  return out;
}

void TuningCache::with_lock(const TuningKey& key, const std::function<void()>& fn) const {
  std::optional<FileLock> held;
  if (dirs_->locks) {
    try {
      held.emplace(dirs_->locks.lock("tune-" + key.base_hex().substr(0, 16) + "-" + key.values_hex().substr(0, 16) +
                                     ".lock"));
    } catch (const Error& e) {
      // A read-only cache: tune without the lock (two processes may then both tune).
      log::warn("cannot lock the tuning record of {}: {}; tuning without the lock", key.values_text(), e.what());
    }
  }
  RemoteSettings rs;
  {
    std::lock_guard<std::mutex> g(dirs_->m);
    rs = dirs_->remote;
  }
  if (!rs.remote) {
    fn();
    return;
  }
  // One process of the fleet tunes: the one holding the lease. The others
  // wait for its record, a lease that ends without one (its holder died and
  // it expired, or it failed), or their patience.
  const std::string lease = remote_key_prefix() + "lease:" + slot_of(key);
  const std::string hash = remote_key_prefix() + "rec:" + key.base_hex();
  const std::string token = random_token();
  const int64_t ttl_ms = std::max<int64_t>(100, static_cast<int64_t>(rs.lease_ttl_s * 1000));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(rs.lease_wait_s * 1e6));
  bool waited = false;
  auto last_busy = std::chrono::steady_clock::now();
  for (;;) {
    RemoteCache::Lease l = rs.remote->try_lease(lease, token, ttl_ms);
    if (l == RemoteCache::Lease::unavailable) {
      if (!waited) break;  // the server cannot be asked: tune without the fleet (Redis said why, once)
      // A reply missed while another process holds the lease (a slow reply,
      // a back-off after it): that process is still tuning as far as anyone
      // knows, so ask again, for as long as its lease could still live.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_busy > std::chrono::milliseconds(ttl_ms) || now >= give_up) {
        log::warn("lost the lease server for longer than a lease lives while another process tuned {}; tuning here",
                  key.values_text());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (l == RemoteCache::Lease::acquired) {
      {
        std::lock_guard<std::mutex> g(dirs_->m);
        ++dirs_->stats.leases_taken;
      }
      // Renewed while tuning; released however fn ends. A process killed
      // while holding it leaves it to expire after ttl.
      std::mutex m;
      std::condition_variable cv;
      bool stop = false;
      std::thread renew([&] {
        std::unique_lock<std::mutex> lk(m);
        while (!cv.wait_for(lk, std::chrono::milliseconds(ttl_ms / 3), [&] { return stop; })) {
          lk.unlock();
          rs.remote->renew_lease(lease, token, ttl_ms);
          lk.lock();
        }
      });
      auto end = [&] {
        {
          std::lock_guard<std::mutex> lk(m);
          stop = true;
        }
        cv.notify_all();
        renew.join();
        rs.remote->release_lease(lease, token);
      };
      try {
        fn();
      } catch (...) {
        end();
        throw;
      }
      end();
      return;
    }
    // Busy: another tunes this key.
    last_busy = std::chrono::steady_clock::now();
    if (!waited) {
      waited = true;
      std::lock_guard<std::mutex> g(dirs_->m);
      ++dirs_->stats.lease_waits;
      log::info("kernel records {} at {}: another process is tuning it; waiting for its record (at most {:g} s)",
                key.base_hex().substr(0, 12), key.values_text(), rs.lease_wait_s);
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      log::warn("waited {:g} s for another process to tune {}; tuning here", rs.lease_wait_s, key.values_text());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (auto text = rs.remote->hget(hash, key.values_hex())) {
      // Its record: kept where get() looks first, so fn() reads (and
      // validates) it without another round trip that could be missed.
      std::lock_guard<std::mutex> g(dirs_->m);
      dirs_->fetched[slot_of(key)] = std::move(*text);
      break;
    }
  }
  fn();
}

void TuningCache::put_plan(const TuningKey& base, const std::string& text) {
  if (dirs_->discard_writes) return;
  if (!dirs_->tune) fail(Errc::cache, "the tuning cache is open for reading only");
  dirs_->tune.sub(base.base_hex(), true).write("plan.pln", text);
}

std::optional<std::string> TuningCache::get_plan(const TuningKey& base) const {
  if (dirs_->tune)
    if (SafeDir d = dirs_->tune.sub(base.base_hex(), false))
      if (auto text = d.read("plan.pln", kMaxRecordBytes)) return text;
  std::lock_guard<std::mutex> g(dirs_->m);
  if (auto it = dirs_->artifact_plans.find(base.base_hex()); it != dirs_->artifact_plans.end()) return it->second;
  return std::nullopt;
}

void TuningCache::add_artifact_plan(const std::string& base_hex, std::string text) {
  std::lock_guard<std::mutex> g(dirs_->m);
  dirs_->artifact_plans[base_hex] = std::move(text);
}

namespace {
// A serving-misses file: lines "<count> <key values>".
std::vector<std::pair<std::string, int64_t>> parse_misses(const std::string& text) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) break;
    std::string line = text.substr(at, eol - at);
    at = eol + 1;
    size_t sp = line.find(' ');
    if (sp != std::string::npos) out.push_back({line.substr(sp + 1), std::atoll(line.c_str())});
  }
  return out;
}
}  // namespace

void TuningCache::note_serving_miss(const TuningKey& key) {
  if (!dirs_->root || !dirs_->tune || dirs_->discard_writes) return;
  try {
    SafeDir d = dirs_->root.sub("serving", true);
    FileLock held = dirs_->locks.lock("serving.lock");
    const std::string name = key.base_hex() + ".misses";
    auto misses = parse_misses(d.read(name, 1u << 20).value_or(""));
    auto it = std::find_if(misses.begin(), misses.end(), [&](const auto& m) { return m.first == key.values_text(); });
    if (it != misses.end()) ++it->second;
    else misses.push_back({key.values_text(), 1});
    std::string out;
    for (const auto& [k, n] : misses) out += fmt::format("{} {}\n", n, k);
    d.write(name, out);
  } catch (const Error& e) {
    log::debug("cannot note a serving miss: {}", e.what());
  }
}

std::vector<std::pair<std::string, int64_t>> TuningCache::serving_misses(const TuningKey& base) const {
  if (!dirs_->root) return {};
  SafeDir d = dirs_->root.sub("serving", false);
  if (!d) return {};
  return parse_misses(d.read(base.base_hex() + ".misses", 1u << 20).value_or(""));
}

size_t TuningCache::count() const {
  size_t n = 0;
  if (!dirs_->tune) return 0;
  for (const auto& d : dirs_->tune.entries())
    if (d.dir)
      for (const auto& e : dirs_->tune.sub(d.name, false).entries())
        if (e.file && e.name.size() > 4 && e.name.substr(e.name.size() - 4) == ".rec") ++n;
  return n;
}

size_t TuningCache::clear() {
  size_t n = count();
  if (dirs_->tune) dirs_->tune.clear();
  return n;
}

}  // namespace kiln
