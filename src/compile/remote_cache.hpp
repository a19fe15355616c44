// A remote cache on a Redis server (hiredis), for tuning records shared by
// a fleet and, opt-in, binaries.
//
// Every command has one deadline (Options::remote_timeout_s, tens of
// milliseconds by default) for the connect, the write and the whole reply:
// the socket is non-blocking and kiln waits on it with poll, so a server
// that is down, slow, or answers garbage costs one time-out, never more.
// After a failure the connection is dropped and no command is tried until a
// back-off passes (1 s, doubling to 60 s); meanwhile every call returns at
// once as a miss. The first failure of an outage is logged once, and the
// reconnection too.
//
// What is read is never trusted: callers validate every value as they
// validate their local files. Thread-safe (one connection, one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct redisContext;

namespace kiln {

struct RedisUrl {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string text;  // as given, for messages
};
// "redis://host[:port][/db]"; throws Error(Errc::usage) on anything else.
RedisUrl parse_redis_url(std::string_view url);

class RemoteCache {
 public:
  struct Settings {
    std::string url;
    double timeout_s = 0.05;  // one command, connect included
    size_t max_reply_bytes = 16u << 20;  // a longer reply is garbage: dropped, and the connection with it
  };
  explicit RemoteCache(Settings s);
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  const std::string& url() const { return url_.text; }

  // A reply, reduced to what kiln uses.
  struct Reply {
    enum Kind { nil, text, number, list, status, error } kind = nil;
    std::string str;
    long long integer = 0;
    std::vector<Reply> elements;
  };
  // Runs one command. nullopt when the server cannot be reached in time,
  // answers garbage, or is in back-off (and then nothing was sent).
  std::optional<Reply> command(const std::vector<std::string>& argv);

  // Conveniences over command(): a miss, an error and a wrong type all read as nullopt.
  std::optional<std::string> get(const std::string& key);
  std::optional<std::string> hget(const std::string& key, const std::string& field);
  std::vector<std::pair<std::string, std::string>> hgetall(const std::string& key);
  // A hash's fields in one round trip, as HGETALL, but only values of at most max_value bytes,
  // and no more than `budget` bytes of values in all: `first`'s value (when it fits) comes
  // before any other. A field too long for the reader (one that someone wrote by hand, or many
  // records together) so never costs the others, nor the connection.
  // A hash of more than `max_fields` fields is not walked (`first` alone comes back); nor is any
  // on a server that runs no scripts.
  std::vector<std::pair<std::string, std::string>> hgetall_bounded(const std::string& key, const std::string& first,
                                                                   size_t max_value, size_t budget,
                                                                   size_t max_fields);
  bool set(const std::string& key, std::string_view value);
  bool hset(const std::string& key, const std::string& field, std::string_view value);

  // A lease: SET key token NX PX ttl. `busy` when another holds it;
  // `unavailable` when the server cannot be asked.
  enum class Lease { acquired, busy, unavailable };
  Lease try_lease(const std::string& key, const std::string& token, int64_t ttl_ms);
  // Extends the lease if `token` still holds it (a compare-and-expire script).
  bool renew_lease(const std::string& key, const std::string& token, int64_t ttl_ms);
  // Deletes the lease if `token` holds it (compare-and-delete).
  void release_lease(const std::string& key, const std::string& token);

  struct Stats {
    uint64_t commands = 0, failures = 0, skipped = 0;  // skipped: calls answered at once during a back-off
  };
  Stats stats() const;

 private:
  bool connect_locked(std::chrono::steady_clock::time_point deadline);
  void fail_locked(const std::string& why);

  RedisUrl url_;
  Settings s_;
  mutable std::mutex m_;
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
  bool down_ = false;  // an outage has been reported and not yet ended
  bool refused_said_ = false;  // a refusal of its commands (a password it wants) has been reported
  std::set<std::string> refused_commands_;  // the commands an ACL refused, reported once each
  std::set<std::string> wrong_type_keys_;   // keys holding another type than kiln's, reported once each
  bool scripts_refused_ = false;            // the server answered a script with an error: none is sent again
  Stats stats_;
};

}  // namespace kiln
