// A real redis-server for a test, on a free loopback port, and fake servers
// that misbehave. The real one dies with the test process however the test
// ends (PR_SET_PDEATHSIG), and is stopped by the destructor otherwise.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace kiln::test {

// A port nobody listens on now (bound, then closed).
inline int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

inline std::string redis_server_exe() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

class RedisServer {
 public:
  explicit RedisServer(int port = 0) : port_(port ? port : free_port()) { start(); }
  ~RedisServer() { stop(); }
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

  void start() {
    std::string exe = redis_server_exe();
    if (exe.empty()) return;
    pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      std::string port = std::to_string(port_);
      ::execl(exe.c_str(), exe.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "", "--appendonly",
              "no", "--loglevel", "warning", "--daemonize", "no", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Ready when it accepts a connection.
    for (int i = 0; i < 200; ++i) {
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port_));
      bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(s);
      if (ok) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

// A server on loopback that accepts connections and then, for every
// request, sends `answer` (garbage, or nothing at all when empty).
class FakeServer {
 public:
  explicit FakeServer(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 16);
    th_ = std::thread([this] { loop(); });
  }
  ~FakeServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    th_.join();
    for (int c : clients_) ::close(c);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  int connections() const { return connections_; }

 private:
  void loop() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++connections_;
      clients_.push_back(c);
      std::thread([c, ans = answer_] {
        char buf[4096];
        while (::read(c, buf, sizeof buf) > 0)
          if (!ans.empty()) (void)!::write(c, ans.data(), ans.size());
      }).detach();
    }
  }
  std::string answer_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::vector<int> clients_;
  std::thread th_;
};

}  // namespace kiln::test
