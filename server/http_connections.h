// The connections of `kvcache serve` before and between their requests: one
// poll thread holds every connection whose request header has not arrived
// in full yet, and hands a connection to a thread of the pool only once its
// header is there. A client that opens a connection and sends half a
// request (or nothing) holds no thread, so it delays nobody; it is closed
// when its header does not arrive within the header deadline (with a 408
// answer when it sent part of one, silently when it sent nothing).
//
//   new connection      -> waits for its header: header_timeout from accept
//   header complete     -> a pool thread serves it (at most max_waiting wait
//                          for one; beyond, a rejecting thread answers it)
//   kept alive after a  -> waits again: idle_timeout for its next request's
//   response               first byte, then header_timeout for the header
//
// The bytes read while waiting travel with the connection (Connection::
// pending), so the request reader starts from them. The pool knows nothing
// of HTTP beyond where a header ends: what serves a connection is the
// ServeFn (server/http_server.cc: httplib's request processing).
//
// Thread safety: Add from any thread; Shutdown (or the destructor) once,
// not from a pool thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvcache::server {

// A connection between the poll thread and the pool.
struct Connection {
  int fd = -1;
  std::string pending;         // bytes read ahead: the start of the next request
  uint32_t requests_left = 1;  // this one and the ones it may still carry
  bool kept_alive = false;     // it has been answered at least once
};

// Where a request's header ends in `bytes` (the offset past its blank line),
// or npos while it has not arrived; `scanned`: a prefix already known to
// hold no end (bytes read before the last ones).
size_t HeaderEnd(std::string_view bytes, size_t scanned = 0);

// The deadline of one waiting connection: the whole header within
// `header_timeout` of the moment the wait began, or for a kept-alive
// connection, its first byte within `idle_timeout` and the header within
// `header_timeout` of that byte.
class HeaderDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  HeaderDeadline(Clock::time_point start, bool kept_alive, std::chrono::milliseconds header_timeout,
                 std::chrono::milliseconds idle_timeout);
  // Bytes arrived at `now` (the first ones start the header's clock).
  void Received(Clock::time_point now);
  Clock::time_point deadline() const { return deadline_; }
  bool Expired(Clock::time_point now) const { return now >= deadline_; }

 private:
  bool waiting_first_byte_;
  std::chrono::milliseconds header_timeout_;
  Clock::time_point deadline_;
};

struct ConnectionLimits {
  uint32_t threads = 32;      // connections served at once
  uint32_t max_waiting = 64;  // complete headers waiting for a thread; beyond: rejected
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds idle_timeout{0};  // between a kept-alive connection's requests
  // A header that grows past this without ending is handed on as it is (the
  // request reader answers what it answers to it).
  size_t max_header_bytes = 64 * 1024;
  // Connections waiting for a header at most; beyond, the one that has
  // waited longest is closed (so old half-open connections cannot use up
  // the process's descriptors and lock new clients out).
  size_t max_header_waits = 4096;
  // Written to a connection whose partial header timed out, before closing it.
  std::string timeout_response;
  // Called (on the poll thread) each time timeout_response is written.
  std::function<void()> on_timeout_response;
};

class ConnectionPool {
 public:
  // Serves one request of the connection (`rejected`: on a rejecting
  // thread, beyond max_waiting); true keeps the connection open for its
  // next request (its pending and requests_left updated), false closes it.
  using ServeFn = std::function<bool(Connection& c, bool rejected)>;

  ConnectionPool(ConnectionLimits limits, ServeFn serve);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A freshly accepted socket, owned by the pool from now on.
  void Add(int fd, uint32_t max_requests);
  // Closes the connections waiting for a header or for a thread; lets the
  // ones being served finish their current request; joins every thread.
  // Idempotent.
  void Shutdown();

  // Connections waiting for their header now (tests, metrics).
  size_t waiting_for_header() const;

 private:
  struct Waiting {
    Connection c;
    HeaderDeadline deadline;
  };
  static constexpr size_t kRejecters = 2;

  void Park(Connection c);
  void PollLoop();
  // Closes w's connection at its deadline (the timeout response first when
  // it sent part of a header).
  void Expire(Waiting& w);
  // Reads what arrived on w's socket; true when w is done waiting (header
  // complete, too large, or the peer closed after sending something), and
  // sets *drop when it should be closed instead.
  bool ReadSome(Waiting& w, bool* drop);
  void Dispatch(Connection c);
  void Work(bool rejecter);
  void Wake();
  static void Close(Connection& c);

  const ConnectionLimits limits_;
  const ServeFn serve_;
  int wake_[2] = {-1, -1};  // a pipe: writing a byte wakes the poll thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Connection> inbox_;  // added or kept alive, not yet seen by the poll thread
  size_t waiting_count_ = 0;       // the poll thread's list size, for waiting_for_header
  std::deque<Connection> jobs_, rejects_;
  size_t idle_ = 0;  // pool threads waiting for a connection
  bool stopping_ = false, joined_ = false;

  std::thread poller_;
  std::vector<std::thread> workers_;
};

}  // namespace kvcache::server
