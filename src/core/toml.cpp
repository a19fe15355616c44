// toml++'s implementation, compiled once for every parser of kiln (see core/toml.hpp).
#define TOML_IMPLEMENTATION
#include "core/toml.hpp"

namespace kiln {
void toml_check_failed(const char* expr) { throw TomlCheckFailed{expr}; }
}  // namespace kiln
