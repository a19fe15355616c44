// The kiln command-line tool: each subcommand registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln {
class Runtime;
class DeviceArgs;
}  // namespace kiln

namespace kiln::cli {

struct Globals {
  bool quiet = false;
  int exit_code = 0;
};

void add_compile(CLI::App& app, Globals& g);
void add_cache(CLI::App& app, Globals& g);
void add_demo(CLI::App& app, Globals& g);
void add_tune(CLI::App& app, Globals& g);  // tune and report
void add_backends(CLI::App& app, Globals& g);
void add_pack(CLI::App& app, Globals& g);  // pack, unpack, inspect
void add_plan(CLI::App& app, Globals& g);
void add_plot(CLI::App& app, Globals& g);
void add_program(CLI::App& app, Globals& g);

// Where the built-in kernels live: KILN_KERNELS_DIR, else beside the
// executable, else the source tree kiln was built from.
std::filesystem::path kernels_dir();

// A spec argument: an existing file, or a member of a kernel family in one
// ("kernels/cuda/gemm.toml:bf16_nt", docs/families.md).
struct SpecFileValidator : CLI::Validator {
  SpecFileValidator();
};
extern const SpecFileValidator SpecFile;

// A seed: a whole number from 0 to 2^64 - 1, all of the text (not wrapped or clamped).
struct SeedValidator : CLI::Validator {
  SeedValidator();
};
extern const SeedValidator Seed;

// A real number that is a number: not nan nor an infinity (a range check alone lets nan
// through, since every comparison with it is false).
struct FiniteValidator : CLI::Validator {
  FiniteValidator();
};
extern const FiniteValidator Finite;

// A fixed-width text table.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> right_align = {});
  void row(std::vector<std::string> cells);
  std::string str() const;

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_;
};

std::string seconds_text(double s);  // "0.84s", "12ms", "35us"

// Where the tool's results go: the standard output as it was when kiln
// started. Once isolate_stdout() has run, file descriptor 1 is the standard
// error, so whatever else writes to it (a kernel's printf, in this process)
// cannot mix into results or break --json.
FILE* out();
void isolate_stdout();

// NAME=VALUE pairs from --set.
// NAME=VALUE texts split; refuses a text without '=' and, unless `repeats` (kiln pack: a
// program's values listed one --set at a time), a name given twice (naming `flag`).
std::vector<std::pair<std::string, std::string>> split_sets(const std::vector<std::string>& sets,
                                                            const char* flag = "--set", bool repeats = false);
// A shape's NAME=VALUE pairs as one text that is the same for the same shape however it was
// written (names in order, whole numbers without signs or leading zeros): "M=8 N=16" for
// "N=16, M=08". For telling shapes given twice apart.
std::string canonical_shape(const std::vector<std::pair<std::string, std::string>>& shape);

// Times configs of `spec` at one shape side by side: interleaved rounds on
// the same inputs (in this process), so drift falls on all alike. Median ms per config.
std::vector<double> time_side_by_side(Runtime& rt, const KernelSpec& spec, const std::vector<Config>& configs,
                                      const DeviceArgs& args);
std::string ms_text(double ms);
double geomean(const std::vector<double>& v);

// Short names for the configs the tables show ("c1", "c2", ...), listed once.
struct Legend {
  std::vector<Config> configs;
  std::string name(const Config& c) {
    if (!c.library.empty()) return c.library;
    for (size_t i = 0; i < configs.size(); ++i)
      if (configs[i] == c) return "c" + std::to_string(i + 1);
    configs.push_back(c);
    return "c" + std::to_string(configs.size());
  }
};


}  // namespace kiln::cli
