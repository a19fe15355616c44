#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/format.hpp"
#include "core/fsutil.hpp"
#include "core/log.hpp"
#include "kiln/args.hpp"
#include "kiln/binary_key.hpp"
#include "kiln/tuning.hpp"

namespace kiln {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kiln_version() { return KILN_VERSION; }

bool kiln_version_compatible(const std::string& recorded) {
  auto parts = [](const std::string& v) {
    int major = -1, minor = -1;
    std::sscanf(v.c_str(), "%d.%d", &major, &minor);
    return std::pair<int, int>{major, minor};
  };
  auto [rm, rn] = parts(recorded);
  auto [om, on] = parts(KILN_VERSION);
  if (rm < 0 || rm != om) return false;
  return om != 0 || rn == on;
}

std::string TuningKey::base_hex() const {
  Hasher h;
  h.add("tuning-format", static_cast<int64_t>(kFormatVersion))
      .add("backend", backend)
      .add("device", device)
      .add("source", source_hash)
      .add("space", space_hash);
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
  return fmt::format("tuning-format {}\nbackend {}\ndevice {}\nsource {}\nspace {}\nkey {}\nbase {} values {}",
                     kFormatVersion, backend, device, source_hash, space_hash, values_text(), base_hex(),
                     values_hex());
}

TuningKey make_tuning_key(const KernelSpec& spec, const std::string& device,
                          std::vector<std::pair<std::string, int64_t>> values) {
  TuningKey k;
  k.backend = spec.backend;
  k.device = device;
  // A multi-kernel's stand-in spec has no source file: its text names its variants' hashes.
  k.source_hash = spec.source_path.empty() ? hash_bytes(spec.source_text).hex() : kernel_source_hash(spec).hex();
  k.space_hash = spec.space.hash().hex();
  k.values = std::move(values);
  return k;
}

TuningKey make_tuning_key(const KernelSpec& spec, const std::string& device, void* const* params) {
  std::vector<int64_t> slots(spec.args.size(), 0);
  read_int_slots(spec, params, slots.data());
  std::vector<std::pair<std::string, int64_t>> values;
  for (const auto& name : spec.tuning.key) values.push_back({name, slots[spec.arg_index(name)]});
  return make_tuning_key(spec, device, std::move(values));
}

std::vector<const ConfigResult*> TuningRecord::ranked() const {
  std::vector<const ConfigResult*> out;
  for (const auto& c : configs)
    if (c.ns && c.error.empty()) out.push_back(&c);
  std::stable_sort(out.begin(), out.end(), [](auto* a, auto* b) { return *a->ns < *b->ns; });
  return out;
}

std::string TuningRecord::all_failed_message() const {
  std::string s = fmt::format("kernel '{}' at {}: no config survived tuning", kernel, key.values_text());
  for (const auto& c : configs) s += fmt::format("\n  {}: {}", c.config.str(), c.error.empty() ? "?" : c.error);
  return s;
}

namespace {

json config_json(const Config& c) {
  json j = json::object();
  for (const auto& [n, v] : c.values) j[n] = v;
  return j;
}

// A config read back must be a point of the space, in its order.
std::optional<Config> config_from(const json& j, const ConfigSpace& space) {
  if (!j.is_object()) return std::nullopt;
  Config c;
  for (const auto& p : space.params) {
    if (!j.contains(p.name) || !j[p.name].is_number_integer()) return std::nullopt;
    c.values.push_back({p.name, j[p.name].get<int64_t>()});
  }
  if (j.size() != space.params.size() || !space.index_of(c)) return std::nullopt;
  return c;
}

}  // namespace

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string record_to_json(const TuningRecord& r) {
  json configs = json::array();
  for (const auto& c : r.configs) {
    configs.push_back({{"params", config_json(c.config)},
                       {"ns", c.ns ? json(*c.ns) : json(nullptr)},
                       {"min_ns", c.min_ns},
                       {"max_ns", c.max_ns},
                       {"reps", c.reps},
                       {"error", c.error.empty() ? json(nullptr) : json(c.error)},
                       {"error_kind", c.error_kind.empty() ? json(nullptr) : json(c.error_kind)}});
  }
  json key = json::object();
  for (const auto& [n, v] : r.key.values) key[n] = v;
  json j = {{"schema", TuningRecord::kSchema},
            {"tuning_format", TuningKey::kFormatVersion},
            {"kiln_version", r.kiln_version.empty() ? kiln_version() : r.kiln_version},
            {"kernel", r.kernel},
            {"backend", r.key.backend},
            {"device", r.key.device},
            {"source_hash", r.key.source_hash},
            {"config_space_hash", r.key.space_hash},
            {"key", key},
            {"key_names", [&] {
               json names = json::array();
               for (const auto& [n, v] : r.key.values) names.push_back(n);
               return names;
             }()},
            {"best", r.best ? config_json(*r.best) : json(nullptr)},
            {"best_ns", r.best ? json(r.best_ns) : json(nullptr)},
            {"method", r.method},
            {"start", r.start},
            {"reference", r.reference},
            {"when", r.when.empty() ? utc_now() : r.when},
            {"configs", configs}};
  return j.dump(1);
}

std::optional<TuningRecord> record_from_json(const std::string& text, const TuningKey& expect,
                                             const ConfigSpace& space) {
  try {
    json j = json::parse(text);
    if (j.at("schema").get<int>() != TuningRecord::kSchema) return std::nullopt;
    if (j.at("tuning_format").get<int>() != TuningKey::kFormatVersion) return std::nullopt;
    if (!kiln_version_compatible(j.at("kiln_version").get<std::string>())) return std::nullopt;
    TuningRecord r;
    r.kernel = j.at("kernel").get<std::string>();
    r.key.backend = j.at("backend").get<std::string>();
    r.key.device = j.at("device").get<std::string>();
    r.key.source_hash = j.at("source_hash").get<std::string>();
    r.key.space_hash = j.at("config_space_hash").get<std::string>();
    for (const auto& n : j.at("key_names")) {
      std::string name = n.get<std::string>();
      r.key.values.push_back({name, j.at("key").at(name).get<int64_t>()});
    }
    if (r.key.backend != expect.backend || r.key.device != expect.device ||
        r.key.source_hash != expect.source_hash || r.key.space_hash != expect.space_hash ||
        r.key.space_hash != space.hash().hex())
      return std::nullopt;
    if (r.key.values.size() != expect.values.size()) return std::nullopt;
    for (size_t i = 0; i < r.key.values.size(); ++i)
      if (r.key.values[i].first != expect.values[i].first) return std::nullopt;
    if (!j.at("best").is_null()) {
      r.best = config_from(j["best"], space);
      if (!r.best) return std::nullopt;
      r.best_ns = j.at("best_ns").get<double>();
    }
    r.method = j.at("method").get<std::string>();
    r.start = j.at("start").get<std::string>();
    r.reference = j.at("reference").get<std::string>();
    r.when = j.at("when").get<std::string>();
    r.kiln_version = j.at("kiln_version").get<std::string>();
    for (const auto& c : j.at("configs")) {
      ConfigResult cr;
      auto cfg = config_from(c.at("params"), space);
      if (!cfg) return std::nullopt;
      cr.config = *cfg;
      if (!c.at("ns").is_null()) cr.ns = c["ns"].get<double>();
      cr.min_ns = c.at("min_ns").get<double>();
      cr.max_ns = c.at("max_ns").get<double>();
      cr.reps = c.at("reps").get<int>();
      if (!c.at("error").is_null()) cr.error = c["error"].get<std::string>();
      if (!c.at("error_kind").is_null()) cr.error_kind = c["error_kind"].get<std::string>();
      r.configs.push_back(std::move(cr));
    }
    return r;
  } catch (const std::exception& e) {
    log::debug("a tuning record does not parse: {}", e.what());
    return std::nullopt;
  }
}

TuningCache::TuningCache(fs::path root) {
  ensure_private_dir(root);
  dir_ = root / "tune";
  ensure_private_dir(dir_);
}

std::optional<TuningRecord> TuningCache::get(const TuningKey& key, const ConfigSpace& space) const {
  fs::path p = dir_ / key.base_hex() / (key.values_hex() + ".json");
  std::optional<std::string> text = read_file(p);
  if (!text) return std::nullopt;
  std::optional<TuningRecord> r = record_from_json(*text, key, space);
  if (!r) {
    log::info("tuning record {} does not validate (another kiln, config space or kernel); tuning again", p.string());
    return std::nullopt;
  }
  if (r->key.values != key.values) return std::nullopt;
  return r;
}

void TuningCache::put(const TuningRecord& r) {
  fs::path d = dir_ / r.key.base_hex();
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) fail(Errc::cache, "cannot create '{}': {}", d.string(), ec.message());
  write_file_atomic(d / (r.key.values_hex() + ".json"), record_to_json(r));
}

std::vector<TuningRecord> TuningCache::all(const TuningKey& base, const ConfigSpace& space) const {
  std::vector<TuningRecord> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_ / base.base_hex(), ec)) {
    if (e.path().extension() != ".json") continue;
    std::optional<std::string> text = read_file(e.path());
    if (!text) continue;
    if (auto r = record_from_json(*text, base, space)) out.push_back(std::move(*r));
  }
  return out;
}

size_t TuningCache::count() const {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->path().extension() == ".json") ++n;
  return n;
}

size_t TuningCache::clear() {
  size_t n = count();
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir_, ec)) fs::remove_all(e.path(), ec);
  return n;
}

}  // namespace kiln
