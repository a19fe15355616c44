// Tuning records and where they are kept.
//
// A record answers "which config of this kernel is fastest for these
// tuning-key values on this device", and keeps every config's time or
// failure by the config's binary key, so a report needs no re-run, failed
// configs are not retried, a config added to the spec is timed alone (with
// the leaders re-timed beside it) and a config removed costs nothing.
//
// Its key (TuningKey) has two parts: a base shared by all records of one
// kernel on one device, and the tuning-key values. The base holds everything
// that can change which config wins or whether a config is valid (see
// docs/tuning.md): the format version, backend, device, toolchain, the
// kernel's source tree, and the spec's launch semantics (argument sizes and
// intents, grid, block, shared memory, constraints, compile flags,
// tolerances, reference). The config space is not in the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

class Backend;
class RemoteCache;

// Why a config did not run or was set aside.
enum class FailKind : uint8_t {
  none,         // it ran, and agreed with the reference
  pruned,       // it cannot run for this call: a constraint is false, the grid is empty, or the
                // launch exceeds the device (threads, shared memory, registers)
  compile,      // it did not compile (the compiler's log)
  crash,        // it faulted while running (a signal, or a GPU fault: the CUDA error)
  timeout,      // it ran past its deadline
  wrong,        // its outputs differ from the reference's, or it left outputs unwritten
  launch,       // it could not be loaded or launched, or it wrote to an input
  unavailable,  // a library choice whose library is not here
};
const char* fail_kind_name(FailKind k) noexcept;
std::optional<FailKind> fail_kind_from_name(std::string_view s) noexcept;

// How a record's choice was found.
enum class SearchMethod : uint8_t { exhaustive, coordesc, budgeted, multi_kernel, plan };
const char* search_method_name(SearchMethod m) noexcept;
std::optional<SearchMethod> search_method_from_name(std::string_view s) noexcept;

struct TuningKey {
  // Bump when TuningRecord's stored fields or their meaning change.
  // 2: source_hash covers the files the source includes.
  // 3: toolchain and launch semantics in the key, the config space out of
  //    it; results kept by binary key; records checksummed.
  // 4: spec expressions may use SM_COUNT and a family's constants (the cuda
  //    GEMM specs became three families: their records are tuned again once).
  static constexpr int kFormatVersion = 4;

  std::string backend;
  std::string device;       // Backend::device_identity()
  std::string toolchain;    // hash of Backend::toolchain_identity(): compiler, version, target, fixed flags
  std::string source_hash;  // kernel_source_hash(): source, includes (also through -I), entry, argument list
  std::string semantics;    // spec_semantics_hash()
  std::vector<std::pair<std::string, int64_t>> values;  // tuning-key values, in key order

  std::string base_hex() const;  // every field but the values
  std::string values_hex() const;
  std::string values_text() const;  // "M=256 N=256 K=256", or "-" for none
  std::string to_string() const;    // every field, for logs and `kiln report --explain`
};

// What in a spec, beyond its source, decides which config wins or is valid:
// argument names, types, sizes and intents; grid, block and shared-memory
// expressions; constraints; compile flags; tolerances; the reference
// config; the tuning-key names.
std::string spec_semantics_hash(const KernelSpec& spec);

// The key of `spec` on a backend's device, for the tuning-key values in
// `params` (the first form) or given ones.
TuningKey make_tuning_key(const KernelSpec& spec, Backend& backend, void* const* params);
TuningKey make_tuning_key(const KernelSpec& spec, Backend& backend, std::vector<std::pair<std::string, int64_t>> values);
// With the device and toolchain identities given (tests, tools).
TuningKey make_tuning_key(const KernelSpec& spec, const std::string& device, const std::string& toolchain,
                          std::vector<std::pair<std::string, int64_t>> values);

struct ConfigResult {
  Config config;
  std::string binary;        // the config's binary key (hex); what its result is kept by
  std::optional<double> ns;  // median time; empty when it failed
  double min_ns = 0, max_ns = 0;
  int reps = 0;
  FailKind kind = FailKind::none;
  std::string error;  // why it failed (empty when it ran and agreed with the reference)
  std::string detail; // what ran, where the choice decides it per call (a library's algorithm, tile, stages)
  bool ok() const { return kind == FailKind::none && ns.has_value(); }
};

struct TuningRecord {
  static constexpr int kSchema = 3;  // 3: configs pruned before compiling written by index

  std::string kernel;
  TuningKey key;
  std::optional<Config> best;  // empty when no config survived
  double best_ns = 0;
  // The relative noise of the timings the choice was made on (the spread of
  // the fastest configs' medians over side-by-side rounds); configs within
  // it of the fastest are treated as equal, and the earliest in the space
  // is chosen among them, so tunings agree from run to run.
  double noise = 0;
  // The noise passed Options::noise_bound even after the re-timing was
  // taken again: stored flagged, the record is used but re-measured by the
  // next tuning of its key (kiln tune, a first call's background tuning),
  // whose timings replace these only if they are quieter.
  bool noisy = false;
  int remeasured = 0;  // times a noisy record was re-measured
  // Set when the record was read from a packed artifact (never stored): an
  // application does not re-measure what it ships with, noisy or not.
  bool from_artifact = false;
  SearchMethod method = SearchMethod::exhaustive;
  std::string start;      // coordesc: where it started and why
  std::string reference;  // the config whose outputs the others matched
  std::string verdict;    // why no config was chosen though some ran (the reference disagreed with all)
  std::string when;       // UTC, ISO 8601
  std::string kiln_version;
  ConfigSpace space;      // the config space the record was last tuned with
  size_t timed = 0;       // configs benchmarked for this record, over all its tunings
  int64_t peak_device_bytes = 0;  // the most extra device memory a tuning used
  std::vector<ConfigResult> configs;

  // Configs that ran and agreed, fastest first.
  std::vector<const ConfigResult*> ranked() const;
  const ConfigResult* find(const Config& c) const;
  // The error that says no config was chosen, listing each failure.
  std::string all_failed_message() const;
};

// A record as checksummed text (a header line, then JSON), and back.
// record_from_text returns nullopt for a record that does not validate
// against `expect` (checksum, schema, format, key, kiln version, each
// config a point of the record's own space): a miss, never an error.
std::string record_to_text(const TuningRecord& r);
std::optional<TuningRecord> record_from_text(std::string_view text, const TuningKey& expect);
// The JSON body alone (for `kiln report --json` and bundles).
std::string record_to_json(const TuningRecord& r);

// Tuning records on disk: <root>/tune/<base_hex>/<values_hex>.rec, written
// atomically, one file per key, so a kernel's records are one folder. Opened
// through SafeDir (see CodeCache). Thread-safe.
class TuningCache {
 public:
  explicit TuningCache(std::filesystem::path root);
  // The cache at `root` for reading only (nothing is created).
  static std::unique_ptr<TuningCache> open_existing(const std::filesystem::path& root);
  // The same, for a folder kiln cannot write: what it holds is read, a
  // packed artifact and a remote cache work as ever, and nothing is kept
  // locally, silently (the runtime said so once).
  static std::unique_ptr<TuningCache> open_read_only(const std::filesystem::path& root);
  ~TuningCache();

  std::optional<TuningRecord> get(const TuningKey& key) const;
  // Throws Error(Errc::io) when it cannot be written (a full or read-only
  // disk); the tuner reports the result anyway and warns.
  void put(const TuningRecord& r);
  // Every valid record of the kernel and device `base` names.
  std::vector<TuningRecord> all(const TuningKey& base) const;
  // Holds a cross-process lock on one key while `fn` runs (one process
  // tunes a key, the others wait for its record).
  void with_lock(const TuningKey& key, const std::function<void()>& fn) const;
  size_t count() const;
  size_t clear();
  static constexpr size_t kMaxRecordBytes = 64u << 20;
  // The largest record shared through Redis (a larger one stays local).
  static constexpr size_t kMaxRemoteRecordBytes = 4u << 20;
  // The most record bytes one fetch of many records (a kernel's, a bundle's) brings back;
  // under the remote cache's longest reply. What it leaves out is asked for one by one.
  static constexpr size_t kRemoteFetchBudget = 12u << 20;
  // The most fields such a fetch walks: a kernel's hash (one field a shape), a bundle's (one a
  // record an application used). A larger hash answers the record asked for alone.
  static constexpr size_t kRemoteFetchFields = 4096, kRemoteBundleFields = 16384;

  // A remote layer (docs/fleet.md): get() reads the local disk, then
  // records already fetched this process (a kernel's records come in one
  // round trip, with the named bundle's), then Redis; a remote record is
  // validated like a local file and written to the local disk. put() writes
  // both. with_lock() also holds a lease in Redis, so one process of a fleet
  // tunes a key and the others wait for its record (at most `lease_wait_s`).
  struct RemoteSettings {
    std::shared_ptr<RemoteCache> remote;
    double lease_ttl_s = 30;
    double lease_wait_s = 300;
    std::string bundle;  // empty: none
  };
  void attach_remote(RemoteSettings r);
  // Records from a packed artifact, read after the local disk and never
  // written to it. Each is validated against the key asked for on use.
  void add_artifact_records(const std::vector<std::string>& record_texts);
  // A record this process answered a call with: with a named bundle, it
  // joins the bundle (once per process) so the next machine fetches it with
  // the others.
  void note_used(const TuningRecord& r);
  // While on, every record note_used() sees is kept: what `kiln pack` of a
  // program packs (the records its run used).
  void journal(bool on);
  std::vector<TuningRecord> journaled() const;

  // A kernel's dispatch plan (kiln/plan.hpp) as text: tune/<base>/plan.pln on
  // the local disk, else one from a packed artifact. Validated by the reader.
  void put_plan(const TuningKey& base, const std::string& text);
  std::optional<std::string> get_plan(const TuningKey& base) const;
  void add_artifact_plan(const std::string& base_hex, std::string text);

  // Serving mode's misses (keys answered with no record of their own),
  // kept on disk under serving/ so `kiln report --misses` shows them: each
  // key once per process, with a count over processes.
  void note_serving_miss(const TuningKey& key);
  std::vector<std::pair<std::string, int64_t>> serving_misses(const TuningKey& base) const;

  struct Stats {
    uint64_t local_hits = 0, artifact_hits = 0, remote_hits = 0, misses = 0;
    // remote copies that did not validate (a lookup whose bundle copy and then the kernel's
    // own record fail counts two here, and one miss)
    uint64_t remote_rejected = 0;
    uint64_t remote_writes = 0, lease_waits = 0, leases_taken = 0;
  };
  Stats stats() const;

 private:
  TuningCache() = default;
  struct Dirs;
  std::unique_ptr<Dirs> dirs_;
};

// The kiln release policy for records: a record written by a kiln of another
// major version (for 0.x, another minor version) is a miss.
bool kiln_version_compatible(const std::string& recorded);
const char* kiln_version();
// The prefix of every key kiln writes in Redis: the record format and this kiln's
// compatibility class ("kiln:t4:v0.1:"; for 1.x and later the major version alone),
// so kilns that would reject each other's records (a fleet in a rolling upgrade)
// keep them under different keys instead of overwriting them in turn.
const std::string& remote_key_prefix();
std::string utc_now();  // "2026-11-22T10:00:00Z"

}  // namespace kiln
