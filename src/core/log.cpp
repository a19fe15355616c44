#include "core/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace kiln::log {

namespace {
std::atomic<int> g_level{-1};
std::mutex g_write;
// When this library was loaded: debug lines say how long after it they were
// written, so a process's start can be read off its log.
const std::chrono::steady_clock::time_point g_loaded = std::chrono::steady_clock::now();
}  // namespace

bool parse_level(std::string_view s, Level& out) {
  if (s == "error") out = Level::error;
  else if (s == "warn" || s == "warning") out = Level::warn;
  else if (s == "info") out = Level::info;
  else if (s == "debug") out = Level::debug;
  else return false;
  return true;
}

Level level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l >= 0) return static_cast<Level>(l);
  // Options::from_env refuses a bad KILN_LOG; here (logging before any
  // Options exist) an unknown value falls back to warn.
  Level parsed = Level::warn;
  if (const char* e = std::getenv("KILN_LOG"))
    if (!parse_level(e, parsed)) parsed = Level::warn;
  g_level.store(static_cast<int>(parsed), std::memory_order_relaxed);
  return parsed;
}

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }

void write(Level l, std::string_view msg) {
  static const char* names[] = {"error", "warning", "info", "debug"};
  std::string line;
  if (l == Level::debug)
    line = fmt::format("kiln: debug: +{:.4f} s: {}\n",
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - g_loaded).count(), msg);
  else
    line = fmt::format("kiln: {}: {}\n", names[static_cast<int>(l)], msg);
  std::lock_guard<std::mutex> g(g_write);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace kiln::log
