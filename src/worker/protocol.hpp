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

#include "kiln/ext/backend.hpp"

namespace kiln::wire {

constexpr uint32_t kMaxFrame = 1u << 30;

// A worker's exit code when its end of the connection was closed inside it (by the code of
// the request it ran, since kiln never does): the request's fault, as a crash would be.
constexpr int kExitConnectionClosedInside = 71;

// Sends one frame (and `fd`, if >= 0). Returns false if the peer is gone.
bool send(int sock, const nlohmann::json& msg, int fd = -1);

enum class Recv { ok, eof, timeout, died };
// Receives one frame; a passed fd lands in *fd_out (else -1). timeout_ms < 0
// waits forever. When `watch_fd` (a pidfd) becomes readable first, the peer
// has died: Recv::died, even if something it forked keeps the socket open.
// Throws Error(Errc::worker) on a malformed frame.
Recv recv(int sock, nlohmann::json& out, int* fd_out, int timeout_ms, int watch_fd = -1);

nlohmann::json binary_to_json(const Binary& b);  // with the bytes
Binary binary_from_json(const nlohmann::json& j);

}  // namespace kiln::wire

namespace kiln {

// One argument of a benchmark, and where the caller's data for it comes from.
struct BenchArg {
  std::string name;
  bool buffer = false;
  DType dtype = DType::f32;
  Intent intent = Intent::in;
  int64_t elements = 0;
  uint64_t scalar_bits = 0;  // a scalar's value, in its dtype's bytes
  // Where the data of an in or inout buffer comes from:
  //   host:   a copy in the shared arena, at `pristine`;
  //   shared: the caller's device buffer itself, through `handle`
  //           (Device::export_buffer; read, never written);
  //   direct: the caller's device buffer at address `direct` (in-process only).
  enum class Source : uint8_t { host, shared, direct };
  Source source = Source::host;
  uint64_t pristine = 0;
  std::string handle;
  uint64_t direct = 0;
  uint64_t result = 0;  // out and inout: where the checking run's output lands in the arena
  int alias = -1;       // the same buffer as an earlier argument (passed twice), or -1
};

struct BenchSettings {
  double budget_ms = 50;  // timed repetitions stop once this much time has passed...
  int min_reps = 3;       // ...but never before this many
  int max_reps = 100000;
  int warmup = 1;
  bool flush = false;     // evict caches before each timed run
  bool hold = false;      // enqueue timed runs behind a held stream, in batches (Device::hold_stream)
  bool check = true;      // do the checking run (poison, compare, keep outputs) first
  bool time = true;       // do the timed runs (false: the checking run alone)
};

struct BenchPlan {
  std::vector<BenchArg> args;
  LaunchDims dims;
  BenchSettings settings;
  uint64_t arena_bytes = 0;
  uint64_t arena_id = 0;  // the same inputs; an executor keeps their device copies between requests
};

struct BenchResult {
  std::vector<double> ns;  // each timed run, in order
  double median_ns = 0, min_ns = 0, max_ns = 0;
  std::string checksum;    // of the checking run's outputs
  // Per argument: elements of an out buffer still holding the poison after
  // the checking run (the kernel never wrote them).
  std::vector<int64_t> unwritten;
  int64_t device_bytes = 0;  // extra device memory the benchmark held
  bool replayed = false;     // timed by graph replay (launch gaps excluded)
};

nlohmann::json to_json(const BenchPlan& p);
BenchPlan bench_plan_from_json(const nlohmann::json& j);
nlohmann::json to_json(const BenchResult& r);
BenchResult bench_result_from_json(const nlohmann::json& j);

}  // namespace kiln
