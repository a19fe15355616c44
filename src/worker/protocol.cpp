#include "worker/protocol.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "backends/serialize.hpp"
#include "core/format.hpp"

namespace kiln::wire {

using nlohmann::json;

bool send(int sock, const json& msg, int fd) {
  std::vector<uint8_t> body = json::to_cbor(msg);
  if (body.size() > kMaxFrame) fail(Errc::worker, "a worker message of {} bytes is too large", body.size());
  uint32_t n = static_cast<uint32_t>(body.size());
  uint8_t head[4] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
                     static_cast<uint8_t>(n >> 24)};
  body.insert(body.begin(), head, head + 4);
  size_t off = 0;
  bool fd_sent = fd < 0;
  while (off < body.size()) {
    iovec iov{body.data() + off, body.size() - off};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      std::memset(ctrl, 0, sizeof ctrl);
      mh.msg_control = ctrl;
      mh.msg_controllen = sizeof ctrl;
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t w = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    fd_sent = true;
    off += static_cast<size_t>(w);
  }
  return true;
}

namespace {

using Clock = std::chrono::steady_clock;

// Reads exactly n bytes; the first read may pick up a passed fd.
Recv read_exact(int sock, uint8_t* p, size_t n, int* fd_out, Clock::time_point deadline, bool has_deadline,
                int watch_fd) {
  size_t got = 0;
  const bool polling = has_deadline || watch_fd >= 0;
  bool wait_first = false;  // when polling: try to read, and poll only when nothing is there yet
  while (got < n) {
    if (polling && wait_first) {
      long long left = 1 << 30;
      if (has_deadline) {
        left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return Recv::timeout;
      }
      pollfd pf[2] = {{sock, POLLIN, 0}, {watch_fd, POLLIN, 0}};
      int r = ::poll(pf, watch_fd >= 0 ? 2 : 1, has_deadline ? static_cast<int>(std::min<long long>(left, 1 << 30)) : -1);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;
      if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR)) && watch_fd >= 0 && (pf[1].revents & POLLIN))
        return Recv::died;
      wait_first = false;
    }
    iovec iov{p + got, n - got};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    ssize_t r = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | (polling ? MSG_DONTWAIT : 0));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_first = true;
        continue;
      }
      return Recv::eof;  // a reset connection is a gone peer
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
        if (fd_out && *fd_out < 0) *fd_out = fd;
        else ::close(fd);
      }
    }
    if (r == 0) return Recv::eof;
    got += static_cast<size_t>(r);
  }
  return Recv::ok;
}

}  // namespace

Recv recv(int sock, json& out, int* fd_out, int timeout_ms, int watch_fd) {
  if (fd_out) *fd_out = -1;
  bool has_deadline = timeout_ms >= 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(has_deadline ? timeout_ms : 0);
  uint8_t head[4];
  Recv r = read_exact(sock, head, 4, fd_out, deadline, has_deadline, watch_fd);
  if (r != Recv::ok) return r;
  uint32_t n = head[0] | (head[1] << 8) | (head[2] << 16) | (static_cast<uint32_t>(head[3]) << 24);
  if (n > kMaxFrame) fail(Errc::worker, "a worker frame claims {} bytes", n);
  std::vector<uint8_t> body(n);
  r = read_exact(sock, body.data(), n, fd_out, deadline, has_deadline, watch_fd);
  if (r != Recv::ok) return r;
  try {
    out = json::from_cbor(body);
  } catch (const std::exception& e) {
    fail(Errc::worker, "a worker frame does not decode: {}", e.what());
  }
  return Recv::ok;
}

json binary_to_json(const Binary& b) {
  json j = binary_meta_to_json(b);
  j["bytes"] = json::binary(b.bytes);
  return j;
}

Binary binary_from_json(const json& j) {
  Binary b = binary_from_meta_json(j);
  const auto& bytes = j.at("bytes").get_binary();
  b.bytes.assign(bytes.begin(), bytes.end());
  return b;
}

}  // namespace kiln::wire

namespace kiln {

using nlohmann::json;

namespace {
DType dtype_of(const std::string& s) {
  if (auto d = dtype_from_name(s)) return *d;
  fail(Errc::worker, "unknown dtype '{}' in a bench plan", s);
}
Intent intent_of(const std::string& s) {
  for (Intent i : {Intent::in, Intent::out, Intent::inout})
    if (s == intent_name(i)) return i;
  fail(Errc::worker, "unknown intent '{}' in a bench plan", s);
}
json grid_json(const Grid& g) { return {g.x, g.y, g.z}; }
Grid grid_from(const json& g) { return {g.at(0).get<int64_t>(), g.at(1).get<int64_t>(), g.at(2).get<int64_t>()}; }
}  // namespace

json to_json(const BenchPlan& p) {
  json args = json::array();
  for (const auto& a : p.args)
    args.push_back({{"name", a.name}, {"buffer", a.buffer}, {"dtype", dtype_name(a.dtype)},
                    {"intent", intent_name(a.intent)}, {"elements", a.elements}, {"scalar", a.scalar_bits},
                    {"source", static_cast<int>(a.source)}, {"pristine", a.pristine},
                    {"handle", json::binary(std::vector<uint8_t>(a.handle.begin(), a.handle.end()))},
                    {"direct", a.direct}, {"result", a.result}, {"alias", a.alias}});
  const BenchSettings& s = p.settings;
  return {{"args", args},
          {"grid", grid_json(p.dims.grid)},
          {"block", grid_json(p.dims.block)},
          {"shared", p.dims.shared},
          {"zero", [&] {
             json z = json::array();
             for (int i = 0; i < p.dims.nzero; ++i) z.push_back({p.dims.zero_arg[i], p.dims.zero_bytes[i]});
             return z;
           }()},
          {"nargs", p.dims.nargs},
          {"pdl", p.dims.pdl},
          {"early", p.dims.early},
          {"workspace", p.dims.workspace},
          {"tensor_maps", [&] {
             json t = json::array();
             for (int i = 0; i < p.dims.ntmap; ++i) {
               const TensorMapDims& m = p.dims.tmap[i];
               t.push_back({m.arg, dtype_name(m.dtype), m.swizzle, m.rows, m.cols, m.pitch, m.box_rows, m.box_cols});
             }
             return t;
           }()},
          {"arena_bytes", p.arena_bytes},
          {"arena_id", p.arena_id},
          {"settings",
           {{"budget_ms", s.budget_ms}, {"min_reps", s.min_reps}, {"max_reps", s.max_reps}, {"warmup", s.warmup},
            {"flush", s.flush}, {"hold", s.hold}, {"check", s.check}, {"time", s.time}}}};
}

BenchPlan bench_plan_from_json(const json& j) {
  BenchPlan p;
  for (const auto& a : j.at("args")) {
    BenchArg b;
    b.name = a.at("name").get<std::string>();
    b.buffer = a.at("buffer").get<bool>();
    b.dtype = dtype_of(a.at("dtype").get<std::string>());
    b.intent = intent_of(a.at("intent").get<std::string>());
    b.elements = a.at("elements").get<int64_t>();
    b.scalar_bits = a.at("scalar").get<uint64_t>();
    int src = a.at("source").get<int>();
    if (src < 0 || src > 2) fail(Errc::worker, "bad buffer source {} in a bench plan", src);
    b.source = static_cast<BenchArg::Source>(src);
    b.pristine = a.at("pristine").get<uint64_t>();
    const auto& h = a.at("handle").get_binary();
    b.handle.assign(h.begin(), h.end());
    b.direct = a.at("direct").get<uint64_t>();
    b.result = a.at("result").get<uint64_t>();
    b.alias = a.at("alias").get<int>();
    p.args.push_back(std::move(b));
  }
  p.dims.grid = grid_from(j.at("grid"));
  p.dims.block = grid_from(j.at("block"));
  p.dims.shared = j.at("shared").get<int64_t>();
  const auto& z = j.at("zero");
  if (z.size() > 4) fail(Errc::worker, "a bench plan zeroes {} buffers (at most 4)", z.size());
  p.dims.nzero = static_cast<int>(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    p.dims.zero_arg[i] = z[i].at(0).get<int>();
    p.dims.zero_bytes[i] = z[i].at(1).get<int64_t>();
    if (p.dims.zero_arg[i] < 0 || static_cast<size_t>(p.dims.zero_arg[i]) >= p.args.size() ||
        !p.args[p.dims.zero_arg[i]].buffer)
      fail(Errc::worker, "a bench plan zeroes argument {}, which is no buffer", p.dims.zero_arg[i]);
  }
  p.dims.nargs = j.at("nargs").get<int>();
  p.dims.pdl = j.value("pdl", false);
  p.dims.early = j.value("early", uint64_t{0});
  for (uint64_t m = p.dims.early; m; m &= m - 1) {
    const int i = __builtin_ctzll(m);
    if (static_cast<size_t>(i) >= p.args.size() || !p.args[i].buffer)
      fail(Errc::worker, "a bench plan says argument {} is read before the wait, which is no buffer", i);
  }
  p.dims.workspace = j.value("workspace", int64_t{-1});
  if (p.dims.workspace < -1 || p.dims.workspace > LaunchDims::kMaxWorkspaceBytes)
    fail(Errc::worker, "a bench plan asks for a workspace of {} bytes", p.dims.workspace);
  const auto& t = j.at("tensor_maps");
  if (t.size() > 4) fail(Errc::worker, "a bench plan passes {} tensor maps (at most 4)", t.size());
  p.dims.ntmap = static_cast<int>(t.size());
  if ((p.dims.ntmap > 0 || p.dims.workspace >= 0) && static_cast<size_t>(p.dims.nargs) != p.args.size())
    fail(Errc::worker, "a bench plan passes tensor maps or a workspace after {} arguments, but has {}", p.dims.nargs,
         p.args.size());
  for (size_t i = 0; i < t.size(); ++i) {
    TensorMapDims& m = p.dims.tmap[i];
    m.arg = t[i].at(0).get<int>();
    m.dtype = dtype_of(t[i].at(1).get<std::string>());
    m.swizzle = t[i].at(2).get<int>();
    m.rows = t[i].at(3).get<int64_t>();
    m.cols = t[i].at(4).get<int64_t>();
    m.pitch = t[i].at(5).get<int64_t>();
    m.box_rows = t[i].at(6).get<int64_t>();
    m.box_cols = t[i].at(7).get<int64_t>();
    if (m.arg < 0 || static_cast<size_t>(m.arg) >= p.args.size() || !p.args[m.arg].buffer)
      fail(Errc::worker, "a bench plan's tensor map views argument {}, which is no buffer", m.arg);
    // The view lies inside its buffer, in the buffer's own element type.
    const BenchArg& b = p.args[m.arg];
    int64_t last = 0;
    if (m.dtype != b.dtype || (m.swizzle != 0 && m.swizzle != 32 && m.swizzle != 64 && m.swizzle != 128) ||
        m.rows < 1 || m.cols < 1 || m.pitch < m.cols || m.box_rows < 1 || m.box_cols < 1 ||
        __builtin_mul_overflow(m.rows - 1, m.pitch, &last) || __builtin_add_overflow(last, m.cols, &last) ||
        last > b.elements)
      fail(Errc::worker, "a bench plan's tensor map of argument {} ({} x {}, pitch {}) does not fit it ({} {} elements)",
           m.arg, m.rows, m.cols, m.pitch, b.elements, dtype_name(b.dtype));
  }
  p.arena_bytes = j.at("arena_bytes").get<uint64_t>();
  p.arena_id = j.at("arena_id").get<uint64_t>();
  const auto& s = j.at("settings");
  p.settings.budget_ms = s.at("budget_ms").get<double>();
  p.settings.min_reps = s.at("min_reps").get<int>();
  p.settings.max_reps = s.at("max_reps").get<int>();
  p.settings.warmup = s.at("warmup").get<int>();
  p.settings.flush = s.at("flush").get<bool>();
  p.settings.hold = s.value("hold", false);
  p.settings.check = s.at("check").get<bool>();
  p.settings.time = s.at("time").get<bool>();
  return p;
}

json to_json(const BenchResult& r) {
  return {{"ns", r.ns},       {"median_ns", r.median_ns},   {"min_ns", r.min_ns},
          {"max_ns", r.max_ns}, {"checksum", r.checksum},   {"unwritten", r.unwritten},
          {"device_bytes", r.device_bytes}, {"replayed", r.replayed}};
}

BenchResult bench_result_from_json(const json& j) {
  BenchResult r;
  r.ns = j.at("ns").get<std::vector<double>>();
  r.median_ns = j.at("median_ns").get<double>();
  r.min_ns = j.at("min_ns").get<double>();
  r.max_ns = j.at("max_ns").get<double>();
  r.checksum = j.at("checksum").get<std::string>();
  r.unwritten = j.at("unwritten").get<std::vector<int64_t>>();
  r.device_bytes = j.at("device_bytes").get<int64_t>();
  r.replayed = j.at("replayed").get<bool>();
  return r;
}

}  // namespace kiln
