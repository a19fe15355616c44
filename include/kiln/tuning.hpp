// Tuning records and where they are kept.
//
// A record answers "which config of this kernel is fastest for these
// tuning-key values on this device", and keeps every config's time or
// failure, so a report needs no re-run and failed configs are not retried.
// Its key (TuningKey) has two parts: a base (tuning-format version, backend,
// device identity, kernel source hash, config-space hash) shared by all
// records of one kernel on one device, and the tuning-key values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

struct TuningKey {
  // Bump when TuningRecord's stored fields or their meaning change.
  // 2: source_hash covers the files the source includes.
  static constexpr int kFormatVersion = 2;

  std::string backend;
  std::string device;       // Backend::device_identity()
  std::string source_hash;  // kernel_source_hash(): source, includes, entry, argument list
  std::string space_hash;   // ConfigSpace::hash()
  std::vector<std::pair<std::string, int64_t>> values;  // tuning-key values, in key order

  std::string base_hex() const;  // every field but the values
  std::string values_hex() const;
  std::string values_text() const;  // "M=256 N=256 K=256", or "-" for none
  std::string to_string() const;    // every field, for logs
};

// The key of `spec` on a device, for the tuning-key values in `params`.
TuningKey make_tuning_key(const KernelSpec& spec, const std::string& device, void* const* params);
TuningKey make_tuning_key(const KernelSpec& spec, const std::string& device,
                          std::vector<std::pair<std::string, int64_t>> values);

struct ConfigResult {
  Config config;
  std::optional<double> ns;  // median time; empty when it failed
  double min_ns = 0, max_ns = 0;
  int reps = 0;
  std::string error;       // why it failed (empty when it ran and agreed with the reference)
  std::string error_kind;  // pruned, compile, crash, timeout, wrong, launch
};

struct TuningRecord {
  static constexpr int kSchema = 1;

  std::string kernel;
  TuningKey key;
  std::optional<Config> best;  // empty when every config failed
  double best_ns = 0;
  std::string method;  // exhaustive, coordesc, hint
  std::string start;   // coordesc: where it started and why
  std::string reference;  // the config whose outputs the others matched
  std::string when;       // UTC, ISO 8601
  std::string kiln_version;
  std::vector<ConfigResult> configs;

  // Configs that ran and agreed, fastest first.
  std::vector<const ConfigResult*> ranked() const;
  // The error that says every config failed, listing each failure.
  std::string all_failed_message() const;
};

// A record as JSON text, and back. from_json returns nullopt for a record that
// does not validate against `expect` (schema, key, config space, kiln version):
// a miss, never an error.
std::string record_to_json(const TuningRecord& r);
std::optional<TuningRecord> record_from_json(const std::string& text, const TuningKey& expect,
                                             const ConfigSpace& space);

// Tuning records on disk: <root>/tune/<base_hex>/<values_hex>.json, written
// atomically, one file per key, so a kernel's records are one folder.
class TuningCache {
 public:
  explicit TuningCache(std::filesystem::path root);
  std::optional<TuningRecord> get(const TuningKey& key, const ConfigSpace& space) const;
  void put(const TuningRecord& r);
  // Every valid record of the kernel and device `base` names.
  std::vector<TuningRecord> all(const TuningKey& base, const ConfigSpace& space) const;
  size_t count() const;
  size_t clear();

 private:
  std::filesystem::path dir_;
};

// The kiln release policy for records: a record written by a kiln of another
// major version (for 0.x, another minor version) is a miss.
bool kiln_version_compatible(const std::string& recorded);
const char* kiln_version();
std::string utc_now();  // "2026-11-22T10:00:00Z"

}  // namespace kiln
