// The binary key: the content address of a compiled variant. Every input that
// changes the compiled bytes is a field; the key is the hash of them all.
#pragma once

#include <string>
#include <vector>

#include "kiln/backend.hpp"
#include "kiln/hash.hpp"

namespace kiln {

struct BinaryKey {
  // Bump when Binary's stored form, or what a key covers, changes.
  static constexpr int kFormatVersion = 1;

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

}  // namespace kiln
