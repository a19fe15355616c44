// kiln cache stats | clear
#include <cstdio>

#include <nlohmann/json.hpp>

#include "compile/code_cache.hpp"
#include "backends/serialize.hpp"
#include "commands.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

void add_cache(CLI::App& app, Globals&) {
  auto* cmd = app.add_subcommand("cache", "Inspect or clear the disk cache");
  cmd->require_subcommand(1);
  auto* stats = cmd->add_subcommand("stats", "Show what the cache holds");
  auto json = std::make_shared<bool>(false);
  stats->add_flag("--json", *json, "Print one JSON object");
  stats->callback([json] {
    isolate_stdout();
    Options opts = Options::from_env();
    auto root = opts.resolved_cache_dir();
    // Reading stats creates nothing: a missing folder is an empty cache.
    auto code = CodeCache::open_existing(root);
    CodeCache::Stats s = code->stats();
    size_t records = TuningCache::open_existing(root)->count();
    if (*json) {
      nlohmann::json j = {{"folder", root.string()},
                          {"binaries", {{"entries", s.entries}, {"bytes", s.bytes}}},
                          {"tuning_records", records}};
      std::fprintf(out(), "%s\n", dump_json(j, 2).c_str());
    } else {
      std::fprintf(out(), "cache folder    %s\nbinaries        %zu entries, %.1f KiB\ntuning records  %zu\n",
                   root.c_str(), s.entries, s.bytes / 1024.0, records);
    }
  });
  auto* clear = cmd->add_subcommand("clear", "Remove every cached binary and tuning record");
  clear->callback([] {
    isolate_stdout();
    Options opts = Options::from_env();
    auto root = opts.resolved_cache_dir();
    size_t n = CodeCache::open_existing(root)->clear();
    size_t r = TuningCache::open_existing(root)->clear();
    std::fprintf(out(), "removed %zu binaries and %zu tuning records from %s\n", n, r, root.c_str());
  });
}

}  // namespace kiln::cli
