// kiln cache stats | clear
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

void add_cache(CLI::App& app, Globals& g) {
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
    if (*json) {
      nlohmann::json out = {{"folder", root.string()}, {"binaries", {{"entries", s.entries}, {"bytes", s.bytes}}}};
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("cache folder  %s\nbinaries      %zu entries, %.1f KiB\n", root.c_str(), s.entries,
                  s.bytes / 1024.0);
    }
  });
  auto* clear = cmd->add_subcommand("clear", "Remove every cached binary");
  clear->callback([&g] {
    (void)g;
    Options opts = Options::from_env();
    CodeCache cache(opts.resolved_cache_dir());
    size_t n = cache.clear();
    std::printf("removed %zu binaries from %s\n", n, cache.root().c_str());
  });
}

}  // namespace kiln::cli
