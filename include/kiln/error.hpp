// kiln's one error model: every failure in library code is a kiln::Error
// (an exception), carrying a category and a message that says what was being
// done and how to reproduce it. Library code never aborts the process.
// Thread-safety: Error is an immutable value.
#pragma once

#include <stdexcept>
#include <cstdint>
#include <string>

namespace kiln {

enum class Errc {
  spec,      // a kernel spec file is malformed
  expr,      // an expression does not parse, names an unknown symbol, or fails to evaluate
  compile,   // the kernel's source failed to compile (the compiler's log is in the message)
  worker,    // a worker process crashed, hung, or could not be started
  launch,    // a kernel launch was refused or failed
  tune,      // no config survived tuning (the message lists each failure)
  cache,     // the cache folder cannot be used
  io,        // a file or process operation failed
  usage,     // the caller passed something kiln cannot use
  artifact,  // a packed artifact is damaged, truncated, of another version, or for another device
  cancelled, // the work was stopped before it finished (a runtime going away)
  internal,  // a bug in kiln
};

const char* errc_name(Errc c) noexcept;
Errc errc_from_name(const std::string& name) noexcept;  // Errc::internal if unknown

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

// How a worker process failed a request.
struct WorkerFault {
  enum class Kind : uint8_t {
    crash,    // it died by a signal it raised itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS)
              // or, on a GPU, its kernel faulted (the reply names the CUDA error)
    timeout,  // it missed its deadline and was killed
    lost,     // it was killed from outside (SIGKILL, SIGTERM...), exited, or its socket broke
  };
  Kind kind = Kind::lost;
  int signal = 0;         // crash or lost by a signal
  double deadline_s = 0;  // timeout: the deadline it missed
  // Whether the fault belongs to what the request ran (a kernel's crash or
  // time-out while benchmarking): deterministic, so not retried and recorded
  // against the config. Otherwise it is the machine's (retried once, never
  // recorded).
  bool of_request = false;
};
const char* worker_fault_name(WorkerFault::Kind k) noexcept;  // "crash", "timeout", "lost"

// Errc::worker with what happened to the worker.
class WorkerError : public Error {
 public:
  WorkerError(WorkerFault f, const std::string& message) : Error(Errc::worker, message), fault_(f) {}
  const WorkerFault& fault() const noexcept { return fault_; }

 private:
  WorkerFault fault_;
};

}  // namespace kiln
