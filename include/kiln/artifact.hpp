// Packed artifacts: the binaries, tuning records and sources of a set of
// kernels in one checksummed file (or a folder a person can read), so an
// application ships its kernels and starts with nothing to compile or tune.
// Written by `kiln pack`, read by `kiln inspect` / `kiln unpack` and by a
// Runtime at start (Options::artifact, KILN_ARTIFACT). docs/fleet.md.
//
// The file: a header line
//   kiln-artifact <format> <xxh3-64 of the rest, hex> <bytes of the rest>
// then entries, each "<name>\n<bytes>\n<bytes of data>". manifest.json comes
// first and lists every other entry with its size and checksum. Anything
// that does not add up (a flipped byte, a truncation, another format) is
// refused whole: nothing of it is loaded.
//
// Thread-safety: an Artifact is a value; const calls may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {

class Runtime;

struct ArtifactManifest {
  static constexpr int kFormat = 1;
  int format = kFormat;
  std::string kiln_version;
  std::string created;  // UTC
  struct Target {
    std::string backend;
    std::string device;     // Backend::device_identity()
    std::string toolchain;  // the tuning key's toolchain hash
    std::string toolchain_text;
  };
  std::vector<Target> targets;  // one per backend used
  struct Kernel {
    std::string name, backend;
    std::string spec;                 // the spec's entry name, "sources/<name>/<file>.toml"
    std::vector<std::string> keys;    // the tuning keys packed, as "M=64 N=64 K=64"
    std::vector<std::string> choices; // the chosen config at each key
  };
  std::vector<Kernel> kernels;
  struct File {
    std::string name;
    uint64_t bytes = 0;
    std::string xxh3;
  };
  std::vector<File> files;  // every entry but the manifest
};

class Artifact {
 public:
  Artifact() = default;
  // Reads a packed file or an unpacked folder. Throws Error(Errc::artifact)
  // saying what is wrong (damaged, truncated, another format or kiln).
  static Artifact read(const std::filesystem::path& path);
  // The same from a packed file's bytes (what read() does once it has them);
  // `what` names them in errors.
  static Artifact parse(std::string_view bytes, const std::string& what = "<bytes>");
  void write(const std::filesystem::path& file) const;      // atomically (temp + rename)
  void write_dir(const std::filesystem::path& dir) const;   // the same entries as files

  const ArtifactManifest& manifest() const { return manifest_; }
  ArtifactManifest& manifest() { return manifest_; }
  // Entries by name: manifest.json is generated on write.
  const std::map<std::string, std::string>& entries() const { return entries_; }
  void add(const std::string& name, std::string data);

  // Why this artifact cannot be used with `rt`'s backends as packed (another
  // device or toolchain), or "" when it can.
  std::string mismatch(Runtime& rt) const;
  // The spec of a packed kernel, from the sources inside (written under
  // `dir`, which must exist and stay while the spec is used).
  KernelSpec spec(const std::string& kernel, const std::filesystem::path& dir) const;
  std::vector<std::string> record_texts() const;
  std::vector<std::string> binary_blobs() const;  // CodeCache entries

 private:
  ArtifactManifest manifest_;
  std::map<std::string, std::string> entries_;
};

// Loads an artifact into a Runtime: its records join the tuning cache and
// its binaries the code cache (in memory; nothing is written to disk). With
// `sources_only`, an artifact for another device or toolchain is accepted
// for its sources and nothing else; otherwise it is refused
// (Error(Errc::artifact), saying what differs). Returns a summary line.
std::string load_artifact(Runtime& rt, const std::filesystem::path& path, bool sources_only);

struct TuningRecord;
// The configs of a record whose binaries an artifact ships (kiln pack): the
// choice, `runners_up` next ranked configs (a call the choice cannot run, such
// as a misaligned pointer, goes to the next that can), and, where one of these
// calls a library, the fastest config of kiln's own: a warm process's first
// call runs it while the library is readied (docs/dispatch.md). Library
// choices have no binary and are left out.
std::vector<Config> artifact_configs(const TuningRecord& record, const Config& choice, int runners_up);

}  // namespace kiln
