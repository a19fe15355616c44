#include "kiln/options.hpp"

#include <charconv>
#include <cstdlib>
#include <thread>

#include "core/format.hpp"

namespace kiln {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name, int fallback, int min, int max) {
  const char* v = env(name);
  if (!v) return fallback;
  int out = 0;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || p != s.data() + s.size() || out < min || out > max)
    fail(Errc::usage, "{}='{}' is not a whole number from {} to {}", name, v, min, max);
  return out;
}

double env_double(const char* name, double fallback, double min) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  double out = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(out >= min))
    fail(Errc::usage, "{}='{}' is not a number of at least {}", name, v, min);
  return out;
}

bool env_bool(const char* name) {
  const char* v = env(name);
  if (!v) return false;
  std::string_view s(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  fail(Errc::usage, "{}='{}' is not a boolean (1 or 0)", name, v);
}

}  // namespace

Options Options::from_env() {
  Options o;
  if (const char* v = env("KILN_CACHE_DIR")) o.cache_dir = v;
  o.no_cache = env_bool("KILN_NO_CACHE");
  o.compile_threads = env_int("KILN_COMPILE_THREADS", 0, 1, 1024);
  if (const char* v = env("KILN_COMPILE_MODE")) {
    std::string_view s(v);
    if (s == "threads") o.compile_mode = CompileMode::threads;
    else if (s == "subprocess") o.compile_mode = CompileMode::subprocess;
    else if (s == "auto") o.compile_mode = CompileMode::automatic;
    else fail(Errc::usage, "KILN_COMPILE_MODE='{}' is not one of threads, subprocess, auto", v);
  }
  if (const char* v = env("KILN_CXX")) o.cxx = v;
  o.compile_timeout_s = env_double("KILN_COMPILE_TIMEOUT", o.compile_timeout_s, 0.1);
  o.launch_threads = env_int("KILN_NUM_THREADS", 0, 1, 1024);
  if (const char* v = env("KILN_WORKER")) o.worker_path = v;
  o.workers = env_int("KILN_WORKERS", 0, 1, 256);
  o.tune_in_process = env_bool("KILN_TUNE_IN_PROCESS");
  o.tune_max_configs = env_int("KILN_TUNE_MAX_CONFIGS", 0, 1, 1000000);
  o.bench_budget_ms = env_double("KILN_BENCH_BUDGET_MS", o.bench_budget_ms, 0.0);
  o.bench_timeout_s = env_double("KILN_BENCH_TIMEOUT", o.bench_timeout_s, 0.01);
  o.bench_flush = env_bool("KILN_BENCH_FLUSH");
  if (env("KILN_FORCE_VARIANT")) o.force_variant = env_int("KILN_FORCE_VARIANT", 0, 0, 1 << 20);
  o.retune_after = env_int("KILN_RETUNE_AFTER", 0, 0, 1 << 30);
  return o;
}

std::filesystem::path Options::resolved_cache_dir() const {
  if (!cache_dir.empty()) return cache_dir;
  if (const char* x = env("XDG_CACHE_HOME")) return std::filesystem::path(x) / "kiln";
  if (const char* h = env("HOME")) return std::filesystem::path(h) / ".cache" / "kiln";
  fail(Errc::cache, "no cache folder: set KILN_CACHE_DIR (HOME and XDG_CACHE_HOME are unset)");
}

int Options::resolved_compile_threads() const {
  if (compile_threads > 0) return compile_threads;
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

int Options::resolved_launch_threads() const {
  if (launch_threads > 0) return launch_threads;
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

}  // namespace kiln
