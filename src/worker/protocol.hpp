// The kiln-worker wire protocol: frames of a 4-byte little-endian length and
// a CBOR body, over a Unix socketpair; a frame may carry one file descriptor
// (SCM_RIGHTS), used to share a benchmark's argument memory.
//
// Requests (the "op" field) and replies:
//   ping                                  → {ok, pid}
//   shutdown                              → {ok}, then the worker exits
//   compile {request, key, options}       → {ok, binary} | {ok: false, error}
//   bench {binary, plan, options} + fd    → {ok, result} | {ok: false, error}
// A reply with ok = false carries {code, message}: a failure of the request
// (a compile error, a kernel that wrote to its input), not of the worker.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/backend.hpp"

namespace kiln::wire {

constexpr uint32_t kMaxFrame = 1u << 30;

// Sends one frame (and `fd`, if >= 0). Returns false if the peer is gone.
bool send(int sock, const nlohmann::json& msg, int fd = -1);

enum class Recv { ok, eof, timeout };
// Receives one frame; a passed fd lands in *fd_out (else -1). timeout_ms < 0
// waits forever. Throws Error(Errc::worker) on a malformed frame.
Recv recv(int sock, nlohmann::json& out, int* fd_out, int timeout_ms);

nlohmann::json binary_to_json(const Binary& b);  // with the bytes
Binary binary_from_json(const nlohmann::json& j);

}  // namespace kiln::wire

namespace kiln {

// How one benchmark lays out its arguments in a shared arena, and how long it runs.
struct BenchArg {
  bool buffer = false;
  DType dtype = DType::f32;
  Intent intent = Intent::in;
  int64_t elements = 0;
  // Offsets into the arena: the caller's data (in, inout), the memory the
  // kernel runs on, and the outputs of the checking run (out, inout).
  uint64_t pristine = 0, work = 0, result = 0;
  uint64_t scalar_bits = 0;  // a scalar's value, in its dtype's bytes
  std::string name;
};

struct BenchSettings {
  double budget_ms = 50;  // timed repetitions stop once this much time has passed...
  int min_reps = 3;       // ...but never before this many
  int max_reps = 100000;
  int warmup = 1;
  bool flush = false;     // evict caches before each timed run
  bool check = true;      // do the checking run (poison, compare, keep outputs) first
};

struct BenchPlan {
  std::vector<BenchArg> args;
  Grid grid;
  BenchSettings settings;
  uint64_t arena_bytes = 0;
};

struct BenchResult {
  std::vector<double> ns;  // each timed run, in order
  double median_ns = 0, min_ns = 0, max_ns = 0;
  std::string checksum;    // of the checking run's outputs
};

nlohmann::json to_json(const BenchPlan& p);
BenchPlan bench_plan_from_json(const nlohmann::json& j);
nlohmann::json to_json(const BenchResult& r);
BenchResult bench_result_from_json(const nlohmann::json& j);

}  // namespace kiln
