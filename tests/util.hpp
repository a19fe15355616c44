// Helpers shared by the tests: temporary folders with kernel files in them.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/fsutil.hpp"
#include "core/process.hpp"
#include "kiln/args.hpp"
#include "kiln/options.hpp"
#include "kiln/spec.hpp"

// (gtest's, in the files that use it) `hay`, a string or text, holds `needle`; else it is shown.
#define EXPECT_CONTAINS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << (hay)

namespace kiln::test {

inline void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// Options for a test: a private cache folder inside `dir`, no progress bars.
inline Options options_in(const std::filesystem::path& dir) {
  Options o = Options::from_env();
  o.cache_dir = dir / "cache";
  o.quiet = true;
  return o;
}

// Writes a spec (as k.toml) and its source into `dir`, and loads the spec.
inline KernelSpec spec_in(const std::filesystem::path& dir, const std::string& toml, const std::string& src_name,
                          const std::string& src) {
  write(dir / src_name, src);
  write(dir / "k.toml", toml);
  return load_spec(dir / "k.toml");
}

// The build and source trees, found from the test executable first (a build
// folder carried to another machine, at another path, still finds them),
// else where this file was compiled.
inline std::filesystem::path exe_dir() { return std::filesystem::path(self_exe_dir()); }
inline std::string kiln_exe() {
  std::error_code ec;
  auto p = exe_dir().parent_path() / "kiln";
  return std::filesystem::exists(p, ec) ? p.string() : std::string(KILN_BINARY_DIR) + "/kiln";
}
inline std::string source_dir() {
  std::error_code ec;
  auto p = exe_dir().parent_path().parent_path();
  return std::filesystem::exists(p / "kernels" / "cpu", ec) ? p.string() : std::string(KILN_SOURCE_DIR);
}
inline std::string kernels() { return source_dir() + "/kernels"; }

// A one-buffer kernel: out[i] = i * SCALE, over a 1-d grid of cdiv(N, BLOCK).
inline const char* kFillSpec = R"SPEC(name = "fill"
backend = "cpu"
source = "fill.cpp"
entry = "fill"
grid = ["cdiv(N, BLOCK)"]
args = [ { name = "out", type = "i64*", size = "N", intent = "out" }, { name = "N", type = "i64" } ]
[params]
BLOCK = [1, 4, 16]
SCALE = [1, 3]
)SPEC";

inline const char* kFillSource = R"SRC(
void fill(kiln::program_id pid, int64_t* out, int64_t n) {
  for (int64_t i = pid.x * BLOCK; i < (pid.x + 1) * BLOCK && i < n; ++i) out[i] = i * SCALE;
}
)SRC";


// y = 2x; MODE changes the time only (MODE 0: 20 times the work).
inline const char* kTwiceSpec = R"SPEC(name = "twice"
backend = "cpu"
source = "twice.cpp"
entry = "twice"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
MODE = [0, 1, 2]
[tuning]
key = ["n"]
)SPEC";

inline const char* kTwiceSource = R"SRC(
void twice(kiln::program_id, const float* x, float* y, int64_t n) {
  const int reps = MODE == 0 ? 20 : 1;
  for (int r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f;
  asm volatile("" ::: "memory");
}
)SRC";

// The cuda spec `file` (in kernels/cuda) with its space narrowed to one config, `params` (its
// [params] lines, "NAME = [value]"), which is also its default (one the file names is dropped):
// no tuning can pass it over.
inline void one_config_spec(const std::string& file, const std::string& params, KernelSpec& out) {
  const std::string dir = test::kernels() + "/cuda/";
  std::string t = read_file(dir + file).value();
  const size_t a = t.find("[params]"), b = t.find("[tuning]");
  ASSERT_TRUE(a != std::string::npos && b != std::string::npos && a < b);
  t.replace(a, b - a, "[params]\n" + params);
  if (const size_t d = t.find("default = {"); d != std::string::npos)
    t.erase(d, t.find('\n', d) - d);  // the one config is the default
  for (const char* key : {"\nlibrary = [", "\nreference = {"})  // no library choice, no reference but the config
    if (const size_t l = t.find(key); l != std::string::npos) t.erase(l + 1, t.find('\n', l + 1) - l);
  out = parse_spec(t, dir + file, read_file);
}

// bf16 values (their bytes) as doubles.
inline std::vector<double> bf16_doubles(const std::vector<std::byte>& b) {
  std::vector<double> v(b.size() / 2);
  for (size_t j = 0; j < v.size(); ++j) {
    uint16_t h;
    std::memcpy(&h, b.data() + 2 * j, 2);
    v[j] = bf16_bits_to_f32(h);
  }
  return v;
}

}  // namespace kiln::test
