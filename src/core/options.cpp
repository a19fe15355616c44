#include "kiln/options.hpp"

#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <thread>

#include "core/format.hpp"
#include "core/log.hpp"

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

// A decimal number, as docs/settings.md says: no spaces, no hex, no inf or nan.
double env_double(const char* name, double fallback, double min, double max) {
  const char* v = env(name);
  if (!v) return fallback;
  std::string_view s(v);
  double out = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, std::chars_format::fixed);
  bool plain = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.');
  if (!plain || ec != std::errc() || p != s.data() + s.size() || !std::isfinite(out) || out < min || out > max)
    fail(Errc::usage, "{}='{}' is not a decimal number from {:g} to {:g}", name, v, min, max);
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

namespace {
// A variable that names one of `choices`: its value, `fallback` when unset, an error listing them else.
template <class E>
E env_choice(const char* name, E fallback, std::initializer_list<std::pair<std::string_view, E>> choices) {
  const char* v = env(name);
  if (!v) return fallback;
  std::string known;
  for (const auto& [text, value] : choices) {
    if (text == v) return value;
    known += (known.empty() ? "" : ", ") + std::string(text);
  }
  fail(Errc::usage, "{}='{}' is not one of {}", name, v, known);
}
}  // namespace

Options Options::from_env() {
  Options o;
  if (const char* v = env("KILN_CACHE_DIR")) o.cache_dir = v;
  o.no_cache = env_bool("KILN_NO_CACHE");
  o.compile_threads = env_int("KILN_COMPILE_THREADS", 0, 1, 1024);
  o.compile_mode = env_choice("KILN_COMPILE_MODE", o.compile_mode,
                              {{"threads", CompileMode::threads},
                               {"subprocess", CompileMode::subprocess},
                               {"auto", CompileMode::automatic}});
  if (const char* v = env("KILN_CXX")) o.cxx = v;
  o.compile_timeout_s = env_double("KILN_COMPILE_TIMEOUT", o.compile_timeout_s, 0.1, kMaxTimeoutSeconds);
  o.launch_threads = env_int("KILN_NUM_THREADS", 0, 1, 1024);
  if (const char* v = env("KILN_WORKER")) o.worker_path = v;
  o.workers = env_int("KILN_WORKERS", 0, 1, 256);
  o.tune_in_process = env_bool("KILN_TUNE_IN_PROCESS");
  o.tune_max_configs = env_int("KILN_TUNE_MAX_CONFIGS", 0, 1, 1000000);
  o.quick_above = env_int("KILN_QUICK_ABOVE", o.quick_above, 0, 1000000);
  o.bench_budget_ms = env_double("KILN_BENCH_BUDGET_MS", o.bench_budget_ms, 0.0, 600000);
  o.noise_bound = env_double("KILN_NOISE_BOUND", o.noise_bound, 0.0, 10);
  o.bench_timeout_s = env_double("KILN_BENCH_TIMEOUT", o.bench_timeout_s, 0.01, kMaxTimeoutSeconds);
  o.bench_deadline_floor_s = env_double("KILN_BENCH_DEADLINE_FLOOR", o.bench_deadline_floor_s, 0.01, kMaxTimeoutSeconds);
  o.bench_flush = env_bool("KILN_BENCH_FLUSH");
  if (env("KILN_FORCE_VARIANT")) o.force_variant = env_int("KILN_FORCE_VARIANT", 0, 0, 1 << 20);
  o.retune_after = env_int("KILN_RETUNE_AFTER", 0, 0, 1 << 30);
  if (const char* v = env("KILN_LOG")) {
    if (!log::parse_level(v, o.log_level))
      fail(Errc::usage, "KILN_LOG='{}' is not one of error, warn, info, debug", v);
  }
  o.memo_capacity = env_int("KILN_MEMO_CAPACITY", o.memo_capacity, 64, 1 << 24);
  if (const char* v = env("KILN_BACKGROUND_COMPILE")) o.background_compile = env_bool("KILN_BACKGROUND_COMPILE"), (void)v;
  o.cuda_device = env_int("KILN_CUDA_DEVICE", 0, 0, 1024);
  if (const char* v = env("KILN_CUDA_ARCH")) {
    std::string_view a(v);
    bool ok = a.size() >= 5 && a.substr(0, 3) == "sm_";
    for (size_t i = 3; ok && i < a.size(); ++i)
      ok = std::isdigit(static_cast<unsigned char>(a[i])) || (i + 1 == a.size() && (a[i] == 'a' || a[i] == 'f'));
    if (!ok) fail(Errc::usage, "KILN_CUDA_ARCH='{}' is not a GPU architecture such as sm_90 or sm_90a", v);
    o.cuda_arch = v;
  }
  o.cuda_flush_l2 = !env("KILN_BENCH_NO_L2_FLUSH") || !env_bool("KILN_BENCH_NO_L2_FLUSH");
  o.cuda_flush_read = env_choice("KILN_BENCH_L2_FLUSH", o.cuda_flush_read, {{"write", false}, {"read", true}});
  o.cuda_bench_hold = env_bool("KILN_BENCH_HOLD");
  if (const char* v = env("KILN_REMOTE_CACHE")) o.remote_cache = v;
  o.remote_timeout_s = env_double("KILN_REMOTE_TIMEOUT", o.remote_timeout_s, 0.001, 60);
  o.remote_binaries = env_bool("KILN_REMOTE_BINARIES");
  o.lease_ttl_s = env_double("KILN_REMOTE_LEASE_TTL", o.lease_ttl_s, 0.1, 86400);
  o.lease_wait_s = env_double("KILN_REMOTE_LEASE_WAIT", o.lease_wait_s, 0, kMaxTimeoutSeconds);
  if (const char* v = env("KILN_BUNDLE")) {
    std::string_view b(v);
    bool ok = b.size() <= 128;
    for (char c : b) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
    if (!ok)
      fail(Errc::usage, "KILN_BUNDLE={} is not a name (letters, digits, - _ ., at most 128)",
           b.size() > 128 ? fmt::format("'{}...' ({} bytes)", b.substr(0, 128), b.size()) : fmt::format("'{}'", b));
    o.bundle = v;
  }
  o.serving = env_bool("KILN_SERVING");
  if (env("KILN_PROGRAM_GRAPHS")) o.program_graphs = env_bool("KILN_PROGRAM_GRAPHS");
  o.program_cells = env_choice("KILN_PROGRAM_CELLS", o.program_cells,
                               {{"graphs", ProgramCells::graphs},
                                {"always", ProgramCells::always},
                                {"off", ProgramCells::off}});
  if (env("KILN_PDL")) o.cuda_pdl = env_bool("KILN_PDL");
  if (env("KILN_CUDA_WARM_LIBRARIES")) o.cuda_warm_libraries = env_bool("KILN_CUDA_WARM_LIBRARIES");
  o.first_call = env_choice("KILN_FIRST_CALL", o.first_call,
                            {{"wait", FirstCall::wait}, {"swap", FirstCall::swap}, {"serve", FirstCall::serve}});
  if (const char* v = env("KILN_ARTIFACT")) o.artifact = v;
  o.artifact_sources_only =
      env_choice("KILN_ARTIFACT_MISMATCH", o.artifact_sources_only, {{"refuse", false}, {"sources", true}});
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
