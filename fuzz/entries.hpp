// Fuzz entry points for the expression and spec parsers. The libFuzzer
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

}  // namespace kiln::fuzz
