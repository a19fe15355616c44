// Minimal leveled logging to stderr. The level comes from KILN_LOG
// (error, warn, info, debug; default warn) or from Options.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <string_view>

#include "kiln/options.hpp"

namespace kiln::log {

using Level = kiln::LogLevel;

Level level();
void set_level(Level l);
// Parses "error", "warn", "info", "debug"; false if unknown.
bool parse_level(std::string_view s, Level& out);
void write(Level l, std::string_view msg);

template <class... A>
void at(Level l, fmt::format_string<A...> f, A&&... a) {
  if (static_cast<int>(l) <= static_cast<int>(level())) write(l, fmt::format(f, std::forward<A>(a)...));
}
template <class... A> void error(fmt::format_string<A...> f, A&&... a) { at(Level::error, f, std::forward<A>(a)...); }
template <class... A> void warn(fmt::format_string<A...> f, A&&... a) { at(Level::warn, f, std::forward<A>(a)...); }
template <class... A> void info(fmt::format_string<A...> f, A&&... a) { at(Level::info, f, std::forward<A>(a)...); }
inline bool debugging() { return level() == Level::debug; }
// Milliseconds since t0, for the timings of debug lines.
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
template <class... A> void debug(fmt::format_string<A...> f, A&&... a) { at(Level::debug, f, std::forward<A>(a)...); }

}  // namespace kiln::log
