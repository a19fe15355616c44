// Where the benchmarks' kernels are: beside the build folder the benchmark
// runs from (so a build carried to another machine finds them), else where
// kiln was built.
#pragma once

#include <filesystem>
#include <string>

#include "core/process.hpp"

inline std::string bench_kernels_dir() {
  std::error_code ec;
  auto p = std::filesystem::path(kiln::self_exe_dir()).parent_path().parent_path() / "bench" / "kernels";
  return std::filesystem::exists(p, ec) ? p.string() : std::string(KILN_SOURCE_DIR) + "/bench/kernels";
}
