// What a call pays when the Redis of KILN_REMOTE_CACHE is down: the lookup of
// a record that is not on the local disk, for several keys in a row, against
// the same lookups with no remote cache. Two kinds of down: a server that
// accepts connections and never answers (the worst: a full time-out), and
// an address where nothing listens (refused at once).
// Usage: kiln_bench_remote_down [timeout seconds, default 0.05]
// Prints a table: microseconds per lookup, in order.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/fsutil.hpp"
#include "kiln/runtime.hpp"

using namespace kiln;

namespace {
// A loopback server that accepts and never answers.
int silent_server(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::listen(fd, 64);
  *port = ntohs(a.sin_port);
  return fd;
}
int unused_port() {
  int p = 0;
  int fd = silent_server(&p);
  ::close(fd);
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  double timeout = argc > 1 ? std::atof(argv[1]) : 0.05;
  const char* spec_text = R"(name = "k"
backend = "cpu"
source = "k.cpp"
entry = "k"
grid = ["1"]
args = [ { name = "x", type = "f32*", size = "n", intent = "inout" }, { name = "n", type = "i64" } ]
[tuning]
key = ["n"]
)";
  TempDir dir("kiln-bench");
  write_file_atomic(dir.path() / "k.cpp", "void k(kiln::program_id, float*, int64_t) {}\n");
  write_file_atomic(dir.path() / "k.toml", spec_text);
  KernelSpec spec = load_spec(dir.path() / "k.toml");
  int port = 0;
  int silent = silent_server(&port);
  std::thread acceptor([&] {
    std::vector<int> held;
    for (;;) {
      int c = ::accept(silent, nullptr, nullptr);
      if (c < 0) break;
      held.push_back(c);
    }
    for (int c : held) ::close(c);
  });
  struct Case {
    const char* name;
    std::string url;
  };
  std::vector<Case> cases{{"no remote", ""},
                          {"Redis silent (accepts, never answers)", "redis://127.0.0.1:" + std::to_string(port)},
                          {"Redis refused (nothing listens)", "redis://127.0.0.1:" + std::to_string(unused_port())}};
  constexpr int kKeys = 6;
  std::printf("lookups of records missing from the local disk, us each (time-out %.0f ms)\n", timeout * 1000);
  std::printf("%-40s", "");
  for (int i = 0; i < kKeys; ++i) std::printf("  key %d", i + 1);
  std::printf("\n");
  for (const auto& c : cases) {
    Options o;
    o.cache_dir = dir.path() / ("cache-" + std::to_string(&c - cases.data()));
    o.remote_cache = c.url;
    o.remote_timeout_s = timeout;
    o.log_level = LogLevel::error;
    Runtime rt(o);
    auto cache = rt.tuning_cache();
    std::printf("%-40s", c.name);
    for (int i = 0; i < kKeys; ++i) {
      TuningKey key = make_tuning_key(spec, rt.backend("cpu"), {{"n", 1000 + i}});
      auto t0 = std::chrono::steady_clock::now();
      auto r = cache->get(key);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      std::printf(" %6.0f", us);
      (void)r;
    }
    std::printf("\n");
  }
  ::shutdown(silent, SHUT_RDWR);
  ::close(silent);
  acceptor.join();
  return 0;
}
