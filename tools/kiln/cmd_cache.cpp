// kiln cache stats | clear
#include <cstdio>

#include <nlohmann/json.hpp>

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
    Options opts = Options::from_env();
    auto root = opts.resolved_cache_dir();
    CodeCache cache(root);
    CodeCache::Stats s = cache.stats();
    size_t records = TuningCache(root).count();
    if (*json) {
      nlohmann::json out = {{"folder", root.string()},
                            {"binaries", {{"entries", s.entries}, {"bytes", s.bytes}}},
                            {"tuning_records", records}};
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("cache folder    %s\nbinaries        %zu entries, %.1f KiB\ntuning records  %zu\n", root.c_str(),
                  s.entries, s.bytes / 1024.0, records);
    }
  });
  auto* clear = cmd->add_subcommand("clear", "Remove every cached binary and tuning record");
  clear->callback([] {
    Options opts = Options::from_env();
    CodeCache cache(opts.resolved_cache_dir());
    size_t n = cache.clear();
    size_t r = TuningCache(opts.resolved_cache_dir()).clear();
    std::printf("removed %zu binaries and %zu tuning records from %s\n", n, r, cache.root().c_str());
  });
}

}  // namespace kiln::cli
