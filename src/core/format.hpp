// Internal helpers for building error messages with fmt.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/error.hpp"

namespace kiln {

template <class... A>
[[noreturn]] void fail(Errc code, fmt::format_string<A...> f, A&&... args) {
  throw Error(code, fmt::format(f, std::forward<A>(args)...));
}

// errno as text, for io failures: "open '/x': No such file or directory".
std::string errno_text(int err);

}  // namespace kiln
