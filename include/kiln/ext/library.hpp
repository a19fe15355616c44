// A library a backend calls for library choices: each is one file,
// src/backends/<backend>/<library>.cpp, and one line of its backend's
// libraries(). docs/libraries.md has a worked example (OpenBLAS).
#pragma once

#include <memory>
#include <string>

#include "kiln/ext/backend.hpp"
#include "kiln/library.hpp"

namespace kiln {

class Library {
 public:
  virtual ~Library() = default;
  // As choices name it: "openblas" in "openblas_sgemm".
  virtual std::string name() const = 0;
  // Whether it ranks algorithms for a call, a choice "#k" running the k-th;
  // a choice of a library that does not has no rank.
  virtual bool ranked() const { return false; }
  // "" when it implements the problem, else why not.
  virtual std::string implements(const GemmProblem& p) const = 0;
  // The same for an attention problem; by default none is.
  virtual std::string implements_attention(const AttentionProblem& p) const {
    return name() + " implements no attention problem (" + p.text() + ")";
  }
  // "" when it can be used here (installed, with a device), else why not.
  virtual std::string unavailable() = 0;
  // Its name, version and settings: what its results are kept by.
  virtual std::string identity() = 0;
  // The loaded choice, its launch() running the call (one or several
  // launches: a choice is timed as a whole). Throws Error(Errc::launch)
  // when the library cannot be used.
  virtual std::shared_ptr<LoadedKernel> load(std::string key, KernelMeta meta, const LibraryChoice& choice) = 0;
  // Whether it is being readied in the background (a large library's one-time
  // start, begun beside the device's making): a call of it now would wait for
  // that. A first call whose record chose it then runs the record's fastest
  // choice of kiln's own, and the library's once it is ready (docs/dispatch.md).
  virtual bool readying() const { return false; }
  // Whether its first call at a shape builds a plan that costs far more than a call
  // (cuDNN's graphs: 45-757 ms each on an H200). A choice of it is then no candidate
  // where a spec's tuning keys a scalar by bucket and the call's bucket holds more than
  // one value (bucket_refusal in kiln/ext/tuner.hpp): a bucket's choice runs all its
  // values, and each new one would build a plan (a decode loop, one a step).
  virtual bool plans_per_shape() const { return false; }
};

}  // namespace kiln
