#include "core/memory.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace kiln {

namespace fs = std::filesystem;

namespace {

std::optional<std::string> first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<int64_t> number(std::string_view t) {
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n')) t.remove_suffix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size() || v < 0) return std::nullopt;
  return v;
}

// A value of memory.stat ("inactive_file 123"), or 0.
int64_t stat_value(const fs::path& file, std::string_view name) {
  std::ifstream in(file);
  std::string key;
  int64_t v = 0;
  while (in >> key >> v)
    if (key == name) return v;
  return 0;
}

// The room one group leaves, or nullopt when it has no limit (or it cannot be read).
std::optional<int64_t> room_of(const fs::path& dir, bool v2) {
  std::optional<std::string> limit_text = first_line(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
  if (!limit_text || *limit_text == "max") return std::nullopt;
  std::optional<int64_t> limit = number(*limit_text);
  // cgroup v1 writes "no limit" as a page-rounded 2^63 - 1.
  if (!limit || *limit >= (int64_t{1} << 62)) return std::nullopt;
  std::optional<std::string> usage_text = first_line(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
  std::optional<int64_t> usage = usage_text ? number(*usage_text) : std::nullopt;
  if (!usage) return std::nullopt;
  // The page cache is given back under pressure before anything is killed: not counted as held.
  const int64_t reclaimable = stat_value(dir / "memory.stat", v2 ? "file" : "total_cache");
  const int64_t held = std::max<int64_t>(0, *usage - reclaimable);
  return std::max<int64_t>(0, *limit - held);
}

}  // namespace

int64_t cgroup_memory_room(std::string_view proc_self_cgroup, const fs::path& cgroup_fs) {
  // "0::/a/b" (v2), or "4:memory:/a/b" (v1; the controllers a comma list). v1's memory line wins.
  std::optional<std::string> v1, v2;
  std::istringstream lines{std::string(proc_self_cgroup)};
  for (std::string line; std::getline(lines, line);) {
    const size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    if (line.compare(0, c1, "0") == 0 && controllers.empty()) v2 = path;
    std::istringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');)
      if (c == "memory") v1 = path;
  }
  const bool is_v2 = !v1;
  std::optional<std::string> rel = v1 ? v1 : v2;
  if (!rel) return -1;
  const fs::path base = is_v2 ? cgroup_fs : cgroup_fs / "memory";
  // The group's folder; where the process sees another namespace's path (a container with
  // its own cgroup namespace mounts its group at the root), the root itself.
  fs::path dir = (base / fs::path(*rel).relative_path()).lexically_normal();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) dir = base;
  int64_t best = -1;
  for (fs::path d = dir;; d = d.parent_path()) {
    if (std::optional<int64_t> r = room_of(d, is_v2)) best = best < 0 ? *r : std::min(best, *r);
    if (d.native().size() <= base.native().size()) break;  // the mount's root was read
  }
  return best;
}

int64_t available_memory_bytes(bool* by_cgroup) {
  if (by_cgroup) *by_cgroup = false;
  int64_t avail = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) avail = static_cast<int64_t>(kb) * 1024;
  }
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  const int64_t room = cgroup_memory_room(text.str(), "/sys/fs/cgroup");
  if (room >= 0 && (avail < 0 || room < avail)) {
    avail = room;
    if (by_cgroup) *by_cgroup = true;
  }
  return avail;
}

}  // namespace kiln
