// kiln's one error model: every failure in library code is a kiln::Error
// (an exception), carrying a category and a message that says what was being
// done and how to reproduce it. Library code never aborts the process.
#pragma once

#include <stdexcept>
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

}  // namespace kiln
