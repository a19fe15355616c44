#include "compile/remote_cache.hpp"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>

#include <charconv>
#include <cstring>
#include <mutex>

#include "core/format.hpp"
#include "core/log.hpp"
#include "kiln/error.hpp"

namespace kiln {

using Clock = std::chrono::steady_clock;

RedisUrl parse_redis_url(std::string_view url) {
  RedisUrl u;
  u.text = std::string(url);
  auto bad = [&](const char* why) {
    fail(Errc::usage, "remote cache '{}' {}: write redis://host[:port][/db], e.g. redis://127.0.0.1:6379/0", url, why);
  };
  constexpr std::string_view scheme = "redis://";
  if (url.substr(0, scheme.size()) != scheme) bad("is not a redis:// address");
  std::string_view rest = url.substr(scheme.size());
  std::string_view hostport = rest, db;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    db = rest.substr(slash + 1);
  }
  if (hostport.find('@') != std::string_view::npos) bad("has a password, which kiln does not send");
  std::string_view port;
  if (size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    port = hostport.substr(colon + 1);
    hostport = hostport.substr(0, colon);
  }
  if (hostport.empty()) bad("has no host");
  for (char c : hostport)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) bad("has a malformed host");
  u.host = std::string(hostport);
  auto number = [&](std::string_view s, int max, const char* what) {
    int v = -1;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < 0 || v > max)
      fail(Errc::usage, "remote cache '{}': {} '{}' is not a number from 0 to {}", url, what, s, max);
    return v;
  };
  if (!port.empty() || url.find(':', scheme.size()) != std::string_view::npos) u.port = number(port, 65535, "the port");
  if (u.port == 0) bad("has port 0");
  if (!db.empty()) u.db = number(db, 1 << 20, "the database");
  return u;
}

RemoteCache::RemoteCache(Settings s) : url_(parse_redis_url(s.url)), s_(std::move(s)) {}

RemoteCache::~RemoteCache() {
  if (ctx_) redisFree(ctx_);
}

RemoteCache::Stats RemoteCache::stats() const {
  std::lock_guard<std::mutex> g(m_);
  return stats_;
}

void RemoteCache::fail_locked(const std::string& why) {
  ++stats_.failures;
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  backoff_ = backoff_.count() == 0 ? std::chrono::milliseconds(1000) : std::min(backoff_ * 2, std::chrono::milliseconds(60000));
  retry_at_ = Clock::now() + backoff_;
  if (!down_) {
    down_ = true;
    log::warn("remote cache {}: {}; going on with the local cache, and trying again later", url_.text, why);
  } else {
    log::debug("remote cache {}: {}; next try in {} ms", url_.text, why, backoff_.count());
  }
}

namespace {

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits until the socket is ready for `events` or the deadline passes.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int left = ms_left(deadline);
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, left);
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// hiredis makes a list reply's array when it reads its header, as long as the header says, and
// walks all of it when the reply is freed: a server that answers "*2147483647" would cost 16 GB
// of address space and seconds of freeing. Lists longer than any kiln asks for (a kernel's
// records, field and value each) are refused as they are read, by a reader whose list maker
// says no past kMaxListElements (hiredis then reports the reply as unreadable).
constexpr long long kMaxListElements = 1 << 20;
template <class F>
struct ListLimit;
template <class R, class Task, class N>
struct ListLimit<R (*)(Task, N)> {
  static inline R (*original)(Task, N) = nullptr;
  static R make(Task t, N n) { return static_cast<long long>(n) > kMaxListElements ? nullptr : original(t, n); }
};
using Limited = ListLimit<decltype(redisReplyObjectFunctions{}.createArray)>;
void limit_lists(redisContext* c) {
  static redisReplyObjectFunctions fns;
  static std::once_flag once;
  std::call_once(once, [&] {
    fns = *c->reader->fn;
    Limited::original = fns.createArray;
    fns.createArray = &Limited::make;
  });
  c->reader->fn = &fns;
}

RemoteCache::Reply convert(const redisReply* r) {
  RemoteCache::Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.kind = RemoteCache::Reply::text; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_STATUS: out.kind = RemoteCache::Reply::status; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_ERROR: out.kind = RemoteCache::Reply::error; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_INTEGER: out.kind = RemoteCache::Reply::number; out.integer = r->integer; break;
    case REDIS_REPLY_ARRAY:
      out.kind = RemoteCache::Reply::list;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default: out.kind = RemoteCache::Reply::nil; break;
  }
  return out;
}

}  // namespace

bool RemoteCache::connect_locked(Clock::time_point deadline) {
  redisContext* c = redisConnectNonBlock(url_.host.c_str(), url_.port);
  if (!c || c->err) {
    fail_locked(c ? fmt::format("cannot connect: {}", c->errstr) : std::string("cannot allocate a connection"));
    if (c) redisFree(c);
    return false;
  }
  ctx_ = c;
  limit_lists(c);
  if (!wait_fd(c->fd, POLLOUT, deadline)) {
    fail_locked(fmt::format("no connection within {:g} ms", s_.timeout_s * 1000));
    return false;
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    fail_locked(fmt::format("cannot connect: {}", std::strerror(err ? err : errno)));
    return false;
  }
  if (url_.db != 0) {
    // SELECT before anything else, under the same deadline.
    const char* argv[] = {"SELECT", nullptr};
    std::string db = std::to_string(url_.db);
    argv[1] = db.c_str();
    size_t lens[] = {6, db.size()};
    redisAppendCommandArgv(ctx_, 2, argv, lens);
  }
  return true;
}

std::optional<RemoteCache::Reply> RemoteCache::command(const std::vector<std::string>& argv) {
  std::lock_guard<std::mutex> g(m_);
  const Clock::time_point start = Clock::now();
  if (!ctx_ && start < retry_at_) {
    ++stats_.skipped;
    return std::nullopt;
  }
  ++stats_.commands;
  const Clock::time_point deadline =
      start + std::chrono::microseconds(static_cast<int64_t>(s_.timeout_s * 1e6));
  const bool fresh = !ctx_;
  if (!ctx_ && !connect_locked(deadline)) return std::nullopt;
  int pending = (fresh && url_.db != 0) ? 2 : 1;  // a SELECT queued by connect_locked answers first

  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const auto& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(ctx_, static_cast<int>(args.size()), args.data(), lens.data()) != REDIS_OK) {
    fail_locked(fmt::format("cannot queue a command: {}", ctx_->errstr));
    return std::nullopt;
  }
  for (int done = 0; !done;) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) {
      fail_locked(fmt::format("cannot send: {}", ctx_->errstr));
      return std::nullopt;
    }
    if (!done && !wait_fd(ctx_->fd, POLLOUT, deadline)) {
      fail_locked(fmt::format("no room to send within {:g} ms", s_.timeout_s * 1000));
      return std::nullopt;
    }
  }
  std::optional<Reply> out;
  while (pending > 0) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(ctx_, &raw) != REDIS_OK) {
      fail_locked(ctx_->err == REDIS_ERR_OOM
                      ? fmt::format("sent a list longer than {} elements", kMaxListElements)
                      : fmt::format("answered something that is not Redis's protocol ({})", ctx_->errstr));
      return std::nullopt;
    }
    if (raw) {
      auto* r = static_cast<redisReply*>(raw);
      Reply reply = convert(r);
      freeReplyObject(r);
      if (--pending == 0) out = std::move(reply);
      else if (reply.kind == Reply::error) {
        fail_locked(fmt::format("refused SELECT {}: {}", url_.db, reply.str));
        return std::nullopt;
      }
      continue;
    }
    if (ctx_->reader && ctx_->reader->len > s_.max_reply_bytes) {
      fail_locked(fmt::format("sent a reply longer than {} bytes", s_.max_reply_bytes));
      return std::nullopt;
    }
    // What has arrived is used whatever the time; no more is read past the deadline, so a server
    // that keeps sending (a reply that never ends, or a list of two billion elements, one at a
    // time) is cut off at it as one that sends nothing is. (Past it, poll still says "ready"
    // while bytes arrive.)
    if (Clock::now() >= deadline) {
      fail_locked(fmt::format("no whole answer within {:g} ms", s_.timeout_s * 1000));
      return std::nullopt;
    }
    if (!wait_fd(ctx_->fd, POLLIN, deadline)) {
      fail_locked(fmt::format("no answer within {:g} ms", s_.timeout_s * 1000));
      return std::nullopt;
    }
    if (redisBufferRead(ctx_) != REDIS_OK) {
      fail_locked(fmt::format("connection lost: {}", ctx_->errstr));
      return std::nullopt;
    }
  }
  if (down_) {
    down_ = false;
    log::info("remote cache {}: reachable again", url_.text);
  }
  backoff_ = std::chrono::milliseconds(0);
  if (out->kind == Reply::error) {
    log::debug("remote cache {}: {} answered an error: {}", url_.text, argv[0], out->str);
    // A server that wants a password (or refuses this user) answers every command so: nothing
    // is shared. Said once, as an outage is.
    const bool refused = out->str.rfind("NOAUTH", 0) == 0 || out->str.rfind("WRONGPASS", 0) == 0;
    if (refused && !refused_said_) {
      refused_said_ = true;
      log::warn("remote cache {}: the server refuses kiln's commands ({}); kiln sends no password, so nothing is "
                "shared through it: going on with the local cache", url_.text, out->str);
    }
    // A key of kiln's that holds another type than kiln writes there (a hash): nothing is read
    // from it or written to it until someone deletes it. Said once a key.
    const std::string& key_of = argv.size() > 3 && argv[0] == "EVAL" ? argv[3] : argv.size() > 1 ? argv[1] : argv[0];
    if (out->str.find("WRONGTYPE") != std::string::npos && wrong_type_keys_.insert(key_of).second)
      log::warn("remote cache {}: key '{}' holds another type than kiln writes there; nothing is shared through it "
                "until it is deleted (redis-cli del '{}')", url_.text, key_of, key_of);
    // A user the server lets run some commands and not others (an ACL): said once a command.
    if (out->str.rfind("NOPERM", 0) == 0 && !argv.empty() && refused_commands_.insert(argv[0]).second)
      log::warn("remote cache {}: the server refuses kiln's {} command or the key it names (\"{}\"); kiln goes on "
                "without it", url_.text, argv[0], out->str);
  }
  return out;
}

std::optional<std::string> RemoteCache::get(const std::string& key) {
  auto r = command({"GET", key});
  if (!r || r->kind != Reply::text) return std::nullopt;
  return std::move(r->str);
}

std::optional<std::string> RemoteCache::hget(const std::string& key, const std::string& field) {
  auto r = command({"HGET", key, field});
  if (!r || r->kind != Reply::text) return std::nullopt;
  return std::move(r->str);
}

std::vector<std::pair<std::string, std::string>> RemoteCache::hgetall(const std::string& key) {
  std::vector<std::pair<std::string, std::string>> out;
  auto r = command({"HGETALL", key});
  if (!r || r->kind != Reply::list || r->elements.size() % 2 != 0) return out;
  for (size_t i = 0; i + 1 < r->elements.size(); i += 2) {
    if (r->elements[i].kind != Reply::text || r->elements[i + 1].kind != Reply::text) continue;
    out.emplace_back(std::move(r->elements[i].str), std::move(r->elements[i + 1].str));
  }
  return out;
}

namespace {
// Runs in the server: the wanted field first, then the others while they fit. Only the
// lengths of fields are looked at before a value is copied (HSTRLEN), so a huge field costs
// nothing, and a hash of more than ARGV[4] fields is not
// walked: the wanted field alone comes back. (A server blocked on one long script would time
// out every client.)
constexpr const char* kBoundedGetAll =
    "local maxv, budget, want, maxf = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]) "
    "local out, used = {}, 0 "
    "local function take(f) "
    "  local n = redis.call('HSTRLEN', KEYS[1], f) "
    "  if n > 0 and n <= maxv and used + n <= budget then "
    "    out[#out + 1] = f; out[#out + 1] = redis.call('HGET', KEYS[1], f); used = used + n end "
    "end "
    "take(want) "
    "if redis.call('HLEN', KEYS[1]) <= maxf then "
    "  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do if f ~= want then take(f) end end "
    "end "
    "return out";
}  // namespace

std::vector<std::pair<std::string, std::string>> RemoteCache::hgetall_bounded(const std::string& key,
                                                                              const std::string& first,
                                                                              size_t max_value, size_t budget,
                                                                              size_t max_fields) {
  std::vector<std::pair<std::string, std::string>> out;
  // A server (or a proxy) that runs no scripts: the field asked for alone, in one round trip,
  // the others one key at a time when they are asked for (a plain HGETALL is unbounded: one long
  // field would cost the connection). Scripts are not tried again on this connection's server.
  auto one = [&] {
    if (auto v = hget(key, first); v && v->size() <= max_value) out.emplace_back(first, std::move(*v));
    return out;
  };
  bool refused;
  {
    std::lock_guard<std::mutex> g(m_);
    refused = scripts_refused_;
  }
  if (refused) return one();
  auto r = command({"EVAL", kBoundedGetAll, "1", key, std::to_string(max_value), std::to_string(budget), first,
                    std::to_string(max_fields)});
  if (r && r->kind == Reply::error && r->str.find("WRONGTYPE") == std::string::npos) {
    {
      std::lock_guard<std::mutex> g(m_);
      scripts_refused_ = true;
    }
    log::info("remote cache {}: the server runs no scripts ({}); records are fetched one key at a time", url_.text,
              r->str);
    return one();
  }
  if (!r || r->kind != Reply::list || r->elements.size() % 2 != 0) return out;
  for (size_t i = 0; i + 1 < r->elements.size(); i += 2) {
    if (r->elements[i].kind != Reply::text || r->elements[i + 1].kind != Reply::text) continue;
    out.emplace_back(std::move(r->elements[i].str), std::move(r->elements[i + 1].str));
  }
  return out;
}

bool RemoteCache::set(const std::string& key, std::string_view value) {
  auto r = command({"SET", key, std::string(value)});
  return r && r->kind == Reply::status;
}

bool RemoteCache::hset(const std::string& key, const std::string& field, std::string_view value) {
  auto r = command({"HSET", key, field, std::string(value)});
  return r && r->kind == Reply::number;
}

RemoteCache::Lease RemoteCache::try_lease(const std::string& key, const std::string& token, int64_t ttl_ms) {
  auto r = command({"SET", key, token, "NX", "PX", std::to_string(ttl_ms)});
  if (!r || r->kind == Reply::error) return Lease::unavailable;
  return r->kind == Reply::status ? Lease::acquired : Lease::busy;
}

namespace {
constexpr const char* kRenew =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
constexpr const char* kRelease =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
}  // namespace

bool RemoteCache::renew_lease(const std::string& key, const std::string& token, int64_t ttl_ms) {
  auto r = command({"EVAL", kRenew, "1", key, token, std::to_string(ttl_ms)});
  return r && r->kind == Reply::number && r->integer == 1;
}

void RemoteCache::release_lease(const std::string& key, const std::string& token) {
  command({"EVAL", kRelease, "1", key, token});
}

}  // namespace kiln
