// How much host memory this process can still take without being killed for it: the
// kernel's MemAvailable, and, in a container or a service with a memory limit, the room its
// control group leaves (cgroup v2 and v1), whichever is less.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace kiln {

// Bytes, or -1 when nothing could be read. `by_cgroup`: whether a control group's limit is what
// bounds it.
int64_t available_memory_bytes(bool* by_cgroup = nullptr);

// The room under the memory limits of the control group that `proc_self_cgroup` (the text of
// /proc/self/cgroup) names, mounted under `cgroup_fs` (/sys/fs/cgroup): for the group and each
// group above it that has a limit, the limit less what is charged and cannot be reclaimed (the
// usage less the page cache); the least of them. -1 when no group has a limit or
// nothing could be read.
int64_t cgroup_memory_room(std::string_view proc_self_cgroup, const std::filesystem::path& cgroup_fs);

}  // namespace kiln
