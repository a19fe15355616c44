// The binary key: the content address of a compiled variant. Every input that
// changes the compiled bytes is a field; the key is the hash of them all.
// Thread-safety: the functions are pure (they read the files a source
// includes); BinaryKeyer may be shared once made.
#pragma once

#include <string>
#include <vector>

#include "kiln/ext/backend.hpp"
#include "kiln/hash.hpp"

namespace kiln {

struct BinaryKey {
  // Bump when Binary's stored form, or what a key covers, changes.
  // 2: binaries carry launch metadata; -I folders in cflags are searched.
  static constexpr int kFormatVersion = 2;

  std::string backend;
  std::string toolchain;          // compiler identity and version, target, fixed flags
  std::string entry;
  Hash128 source;                 // the source text and every file it includes that kiln can find
  std::vector<std::string> includes_found;    // resolved include files hashed into `source`
  std::vector<std::string> includes_external; // includes left to the toolchain (system headers)
  std::string defines;            // "BM=32;BN=64;"
  std::string args;               // "A:f32*;M:i64;"
  std::string cflags;

  std::string to_string() const;  // every field, for logs and `kiln compile --explain`
  std::string hex() const;        // the key
};

// Builds the key of a request. The backend supplies its toolchain identity.
BinaryKey make_binary_key(const CompileRequest& req, Backend& backend);

// The binary keys of one spec's configs: the toolchain and the source tree
// are read once, so a key per config costs a hash of its defines.
// A library choice's key names the backend, the call and the library's
// identity (its version): its results are kept by that.
class BinaryKeyer {
 public:
  BinaryKeyer(const KernelSpec& spec, Backend& backend);
  std::string hex(const Config& c) const;
  BinaryKey key(const Config& c) const;  // a template config's key

 private:
  BinaryKey base_;
  Backend* backend_;
};
std::string library_key(Backend& backend, const std::string& name);

// A source file with everything it includes that kiln can find: quoted
// includes resolve against the including file's folder, then `include_dirs`
// (which should hold the -I folders of the compile flags too); angled ones
// against `include_dirs`; what is not found belongs to the toolchain and is
// hashed by name.
struct SourceTree {
  Hash128 hash;
  std::vector<std::string> found, external;
};
SourceTree hash_source_tree(const std::string& source_text, const std::vector<std::string>& include_dirs);

// What a kernel's code is, for tuning records: backend, entry, argument list,
// and its source tree (so editing an included header invalidates records).
Hash128 kernel_source_hash(const KernelSpec& spec);

}  // namespace kiln
