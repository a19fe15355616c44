// toml++ as kiln's file parsers (kernel specs, multi-kernel specs, programs)
// use it: one set-up, included by every file that parses TOML, so that all
// of them compile toml++ the same way. The library itself is compiled once,
// in core/toml.cpp.
//
// toml++ 3.3.0 states internal assumptions that malformed input can break
// (the fuzzer found "[[["): with NDEBUG they become __builtin_assume under
// clang, undefined behaviour. Here they are checks, and a failed one throws
// TomlCheckFailed, which each parser reports as an error in the file.
#pragma once

namespace kiln {
struct TomlCheckFailed {
  const char* expr;
};
[[noreturn]] void toml_check_failed(const char* expr);
}  // namespace kiln

#ifdef NDEBUG
#define KILN_TOML_HAD_NDEBUG
#undef NDEBUG
#endif
#define TOML_ASSERT(expr) ((expr) ? static_cast<void>(0) : ::kiln::toml_check_failed(#expr))
#define TOML_HEADER_ONLY 0
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>
#ifdef KILN_TOML_HAD_NDEBUG
#define NDEBUG
#undef KILN_TOML_HAD_NDEBUG
#endif
