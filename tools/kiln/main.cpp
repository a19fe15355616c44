#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "commands.hpp"
#include "core/log.hpp"
#include "core/process.hpp"
#include "kiln/error.hpp"

namespace kiln::cli {

std::filesystem::path kernels_dir() {
  namespace fs = std::filesystem;
  if (const char* e = std::getenv("KILN_KERNELS_DIR")) return e;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (fs::path c : {exe / "kernels", exe.parent_path() / "kernels", exe.parent_path() / "share/kiln/kernels"})
    if (fs::is_directory(c / "cpu", ec)) return c;
  return fs::path(KILN_SOURCE_DIR) / "kernels";
}

Table::Table(std::vector<std::string> header, std::vector<bool> right_align) : right_(std::move(right_align)) {
  right_.resize(header.size(), false);
  rows_.push_back(std::move(header));
}

void Table::row(std::vector<std::string> cells) {
  cells.resize(rows_[0].size());
  rows_.push_back(std::move(cells));
}

std::string Table::str() const {
  std::vector<size_t> w(rows_[0].size(), 0);
  for (const auto& r : rows_)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::string out;
  for (const auto& r : rows_) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      size_t pad = w[i] - r[i].size();
      if (i) line += "  ";
      if (right_[i]) line += std::string(pad, ' ') + r[i];
      else line += r[i] + (i + 1 < r.size() ? std::string(pad, ' ') : "");
    }
    out += line + "\n";
  }
  return out;
}

namespace {
FILE* g_out = nullptr;
}  // namespace

SpecFileValidator::SpecFileValidator() : CLI::Validator("FILE") {
  func_ = [](std::string& text) -> std::string {
    const std::filesystem::path file = split_member(text).first;  // a family's file, for a member
    std::error_code ec;
    if (std::filesystem::is_regular_file(file, ec)) return "";
    if (std::filesystem::exists(file, ec)) return file.string() + ": not a regular file (a spec is a .toml file)";
    if (file.string() != text)  // FILE.toml:MEMBER, split at its last ':'
      return "File does not exist: " + file.string() + " (read from '" + text +
             "' as FILE:MEMBER, a member of a family in FILE)";
    return "File does not exist: " + file.string();
  };
}
const SpecFileValidator SpecFile;

SeedValidator::SeedValidator() : CLI::Validator("UINT64") {
  func_ = [](std::string& text) -> std::string {
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    return ec == std::errc() && p == text.data() + text.size() && !text.empty()
               ? ""
               : "a seed is a whole number from 0 to 18446744073709551615, not '" + text + "'";
  };
}
const SeedValidator Seed;

FiniteValidator::FiniteValidator() : CLI::Validator("NUMBER") {
  func_ = [](std::string& text) -> std::string {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(text.c_str(), &end);
    return !text.empty() && end == text.c_str() + text.size() && std::isfinite(v) && errno != ERANGE
               ? ""
               : "expected a finite number, not '" + text + "'";
  };
}
const FiniteValidator Finite;

FILE* out() { return g_out ? g_out : stdout; }

void isolate_stdout() {
  if (g_out) return;
  std::fflush(stdout);
  int fd = ::dup(1);
  if (fd < 0) return;
  FILE* f = ::fdopen(fd, "w");
  if (!f) {
    ::close(fd);
    return;
  }
  g_out = f;
  ::dup2(2, 1);
}

std::string canonical_shape(const std::vector<std::pair<std::string, std::string>>& shape) {
  std::map<std::string, std::string> sorted;
  for (const auto& [n, v] : shape) {
    int64_t x = 0;
    const char* b = v.data() + (v.size() > 1 && v[0] == '+' ? 1 : 0);
    auto [p, ec] = std::from_chars(b, v.data() + v.size(), x);
    sorted[n] = ec == std::errc() && p == v.data() + v.size() ? std::to_string(x) : v;
  }
  std::string t;
  for (const auto& [n, v] : sorted) t += (t.empty() ? "" : " ") + n + "=" + v;
  return t;
}

std::vector<std::pair<std::string, std::string>> split_sets(const std::vector<std::string>& sets, const char* flag,
                                                            bool repeats) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& s : sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw kiln::Error(kiln::Errc::usage, std::string(flag) + " " + s + ": expected NAME=VALUE");
    std::string name = s.substr(0, eq);
    for (const auto& [n, v] : out)
      if (n == name && !repeats)
        throw kiln::Error(kiln::Errc::usage, fmt::format("{} {}: '{}' is set twice ({}={} before)", flag, s, n, n, v));
    out.push_back({std::move(name), s.substr(eq + 1)});
  }
  return out;
}

std::string seconds_text(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2fs", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.1fms", s * 1e3);
  else if (s >= 1e-6) std::snprintf(buf, sizeof buf, "%.1fus", s * 1e6);
  else std::snprintf(buf, sizeof buf, "%.0fns", s * 1e9);
  return buf;
}

}  // namespace kiln::cli

namespace {
int run(int argc, char** argv);
}

int main(int argc, char** argv) {
  int rc = run(argc, argv);
  // Interrupted: the clean-up thread ends the process by its signal.
  while (kiln::stopping()) ::pause();
  return rc;
}

namespace {
int run(int argc, char** argv) {
  using namespace kiln::cli;
  // Ctrl-C or SIGTERM kills the compilers and workers kiln started and
  // removes its temporary folders before kiln ends.
  kiln::install_interrupt_cleanup();
  CLI::App app{"kiln: compile, autotune, cache and dispatch compute kernels for shapes that change at run time.\n"
               "Settings come from KILN_* environment variables (see docs/settings.md)."};
  app.name("kiln");
  app.require_subcommand(1);
  app.fallthrough();  // global flags (-q) work after the subcommand too
  Globals g;
  app.add_flag("-q,--quiet", g.quiet, "No progress bars");
  app.add_flag_callback("--version", [] {
    std::printf("kiln %s\n", KILN_VERSION);
    std::exit(0);
  }, "Print the version and exit");
  add_compile(app, g);
  add_cache(app, g);
  add_tune(app, g);
  add_demo(app, g);
  add_backends(app, g);
  add_pack(app, g);
  add_plan(app, g);
  add_plot(app, g);
  add_program(app, g);
  // A first word that is no command and no flag is a typo: say so.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "kiln: error: unknown command '%s' (commands: %s; see kiln --help)\n", argv[1],
                   names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help, or the error
    return rc == 0 ? 0 : 2;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return e.code() == kiln::Errc::usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
  return g.exit_code;
}
}  // namespace
