#include <cstring>

#include "core/format.hpp"

namespace kiln {

const char* errc_name(Errc c) noexcept {
  switch (c) {
    case Errc::spec: return "spec";
    case Errc::expr: return "expr";
    case Errc::compile: return "compile";
    case Errc::worker: return "worker";
    case Errc::launch: return "launch";
    case Errc::tune: return "tune";
    case Errc::cache: return "cache";
    case Errc::io: return "io";
    case Errc::usage: return "usage";
    case Errc::artifact: return "artifact";
    case Errc::cancelled: return "cancelled";
    case Errc::internal: return "internal";
  }
  return "unknown";
}

Errc errc_from_name(const std::string& name) noexcept {
  for (Errc c : {Errc::spec, Errc::expr, Errc::compile, Errc::worker, Errc::launch, Errc::tune, Errc::cache,
                 Errc::io, Errc::usage, Errc::artifact, Errc::cancelled, Errc::internal})
    if (name == errc_name(c)) return c;
  return Errc::internal;
}

const char* worker_fault_name(WorkerFault::Kind k) noexcept {
  switch (k) {
    case WorkerFault::Kind::crash: return "crash";
    case WorkerFault::Kind::timeout: return "timeout";
    case WorkerFault::Kind::lost: return "lost";
  }
  return "?";
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  return ::strerror_r(err, buf, sizeof buf);
}

}  // namespace kiln
