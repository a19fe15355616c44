// Fuzz entry points for the expression, spec, program and artifact parsers. The libFuzzer
// targets call them; the corpus replay test calls them on fuzz/corpus/*.
// Each returns normally for any input; a broken promise traps.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::fuzz {

// Parse; if it parses, print → parse again must give the same tree and text;
// compile and evaluate with sample values (errors allowed, crashes not).
void expr_one(const uint8_t* data, size_t size);
// Parse as a spec file whose source files all exist; only kiln::Error may escape.
void spec_one(const uint8_t* data, size_t size);
// Parse as a program file beside the built-in ones (kernels/programs, so
// its kernel specs can be the real ones); if it parses, print it, lower it,
// size its tensors and plan its memory at a few symbol values, and emit its
// C++, whose every line must start outside a string literal and whose
// string literals hold no raw control characters. Only kiln::Error may escape.
void program_one(const uint8_t* data, size_t size);
// Parse as a packed artifact's bytes; if it parses, decode its binaries and
// records as loading it would. Only kiln::Error may escape.
void artifact_one(const uint8_t* data, size_t size);

}  // namespace kiln::fuzz
