// A redis-server child process for tests that need a real Redis: loopback
// only (--bind 127.0.0.1), a free port, a temporary folder, no persistence;
// killed on destruction. Start() says whether it answered PING in time.
// (tier_redis_test.cc's gtest environment wraps one.)
#pragma once

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace kvcache::testing {

inline int FreeLoopbackPort() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

class RedisProcess {
 public:
  RedisProcess() = default;
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;
  ~RedisProcess() {
    Stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Starts the server and waits (up to ~4 s) for it to answer: the first
  // time on a free port and a new folder, after Stop() on the same ones (so
  // URLs handed out stay valid: a restarted server).
  bool Start() {
    if (port_ == 0) {
      dir_ = std::filesystem::temp_directory_path() /
             ("kvc_redis_proc_" + std::to_string(::getpid()) + "_" + std::to_string(++starts_));
      std::filesystem::create_directories(dir_);
      port_ = FreeLoopbackPort();
    }
    Stop();
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      const std::string dir = dir_.string();
      if (::freopen("/dev/null", "w", stdout) == nullptr) _exit(126);
      ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", dir.c_str(), (char*)nullptr);
      _exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      if (Ping()) return running_ = true;
      ::usleep(20000);
    }
    return false;
  }
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    running_ = false;
  }
  bool Ping() const {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, {0, 200000});
    bool ok = false;
    if (c != nullptr && !c->err) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return ok;
  }
  // Started and answered PING (false again after Stop()).
  bool running() const { return running_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool running_ = false;
  static inline int starts_ = 0;  // folders are unique per process
};

}  // namespace kvcache::testing
