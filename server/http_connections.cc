// The poll thread that waits for request headers and the pool that serves
// complete ones (see http_connections.h).
#include "server/http_connections.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace kvcache::server {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

size_t HeaderEnd(std::string_view bytes, size_t scanned) {
  const size_t at = bytes.find("\r\n\r\n", scanned >= 3 ? scanned - 3 : 0);
  return at == std::string_view::npos ? std::string_view::npos : at + 4;
}

HeaderDeadline::HeaderDeadline(Clock::time_point start, bool kept_alive, milliseconds header_timeout,
                               milliseconds idle_timeout)
    : waiting_first_byte_(kept_alive),
      header_timeout_(header_timeout),
      deadline_(start + (kept_alive ? idle_timeout : header_timeout)) {}

void HeaderDeadline::Received(Clock::time_point now) {
  if (!waiting_first_byte_) return;
  waiting_first_byte_ = false;
  deadline_ = now + header_timeout_;
}

ConnectionPool::ConnectionPool(ConnectionLimits limits, ServeFn serve)
    : limits_(std::move(limits)), serve_(std::move(serve)) {
  if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  poller_ = std::thread([this] { PollLoop(); });
  for (uint32_t i = 0; i < std::max<uint32_t>(1, limits_.threads); ++i) {
    workers_.emplace_back([this] { Work(false); });
  }
  for (size_t i = 0; i < kRejecters; ++i) workers_.emplace_back([this] { Work(true); });
}

ConnectionPool::~ConnectionPool() {
  Shutdown();
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

void ConnectionPool::Close(Connection& c) {
  if (c.fd < 0) return;
  ::shutdown(c.fd, SHUT_RDWR);
  ::close(c.fd);
  c.fd = -1;
}

void ConnectionPool::Wake() {
  if (wake_[1] < 0) return;
  const char b = 1;
  // A full pipe already wakes the poll thread.
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
}

void ConnectionPool::Add(int fd, uint32_t max_requests) {
  Connection c;
  c.fd = fd;
  c.requests_left = std::max<uint32_t>(1, max_requests);
  Park(std::move(c));
}

void ConnectionPool::Park(Connection c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      inbox_.push_back(std::move(c));
      c.fd = -1;
    }
  }
  Close(c);  // only when stopping
  Wake();
}

size_t ConnectionPool::waiting_for_header() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_count_ + inbox_.size();
}

bool ConnectionPool::ReadSome(Waiting& w, bool* drop) {
  *drop = false;
  bool got = false;
  const size_t scanned = w.c.pending.size();
  for (;;) {
    char buf[4096];
    const ssize_t n = ::recv(w.c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      got = true;
      w.c.pending.append(buf, static_cast<size_t>(n));
      if (w.c.pending.size() >= limits_.max_header_bytes) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // The peer closed (or the socket failed): what it sent is answered as
    // it is; nothing sent, nothing to answer.
    *drop = w.c.pending.empty();
    return true;
  }
  if (got) w.deadline.Received(Clock::now());
  return HeaderEnd(w.c.pending, scanned) != std::string_view::npos ||
         w.c.pending.size() >= limits_.max_header_bytes;
}

void ConnectionPool::Expire(Waiting& w) {
  // A partial header gets the timeout answer; a connection that sent
  // nothing (or nothing more since its last response) is just closed.
  if (!w.c.pending.empty() && !limits_.timeout_response.empty()) {
    [[maybe_unused]] ssize_t n = ::send(w.c.fd, limits_.timeout_response.data(), limits_.timeout_response.size(),
                                        MSG_DONTWAIT | MSG_NOSIGNAL);
    if (limits_.on_timeout_response) limits_.on_timeout_response();
  }
  Close(w.c);
}

void ConnectionPool::PollLoop() {
  std::vector<Waiting> waiting;
  std::vector<pollfd> fds;
  for (;;) {
    std::vector<Connection> arrived;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      arrived.swap(inbox_);
      waiting_count_ = waiting.size() + arrived.size();
    }
    const auto start = Clock::now();
    for (Connection& c : arrived) {
      // A kept-alive connection may hold its next header already.
      if (HeaderEnd(c.pending) != std::string_view::npos) {
        Dispatch(std::move(c));
        continue;
      }
      const HeaderDeadline deadline(start, c.kept_alive, limits_.header_timeout, limits_.idle_timeout);
      waiting.push_back(Waiting{std::move(c), deadline});
    }
    // Over the bound: the longest waiting go first.
    if (waiting.size() > limits_.max_header_waits) {
      const size_t over = waiting.size() - limits_.max_header_waits;
      std::partial_sort(waiting.begin(), waiting.begin() + over, waiting.end(),
                        [](const Waiting& a, const Waiting& b) { return a.deadline.deadline() < b.deadline.deadline(); });
      for (size_t i = 0; i < over; ++i) Expire(waiting[i]);
      waiting.erase(waiting.begin(), waiting.begin() + over);
    }
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    auto next = Clock::now() + milliseconds(1000);
    for (const Waiting& w : waiting) {
      fds.push_back(pollfd{w.c.fd, POLLIN, 0});
      next = std::min(next, w.deadline.deadline());
    }
    const auto wait = std::chrono::duration_cast<milliseconds>(next - Clock::now()).count();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait + 1, 0, 1000)));
    if (ready < 0 && errno != EINTR) std::this_thread::sleep_for(milliseconds(10));  // ENOMEM: try again
    if (fds[0].revents != 0) {
      char drain[256];
      while (::read(wake_[0], drain, sizeof(drain)) > 0) {
      }
    }
    const auto now = Clock::now();
    // fds[i + 1] is waiting[i]: walk from the back so removals keep that.
    for (size_t i = waiting.size(); i-- > 0;) {
      Waiting& w = waiting[i];
      bool done = false, drop = false;
      if (ready > 0 && fds[i + 1].revents != 0) done = ReadSome(w, &drop);
      if (!done && w.deadline.Expired(now)) {
        Expire(w);
      } else if (!done) {
        continue;
      } else if (drop) {
        Close(w.c);
      } else {
        Dispatch(std::move(w.c));
      }
      waiting[i] = std::move(waiting.back());
      waiting.pop_back();
    }
    std::lock_guard<std::mutex> lock(mu_);
    waiting_count_ = waiting.size();
  }
  for (Waiting& w : waiting) Close(w.c);
  std::lock_guard<std::mutex> lock(mu_);
  for (Connection& c : inbox_) Close(c);
  inbox_.clear();
  waiting_count_ = 0;
}

void ConnectionPool::Dispatch(Connection c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {  // the pool threads may have ended: nobody would close it
      Close(c);
      return;
    }
    // A connection an idle thread will take does not wait.
    const bool fits = jobs_.size() < idle_ + limits_.max_waiting;
    (fits ? jobs_ : rejects_).push_back(std::move(c));
  }
  cv_.notify_all();
}

void ConnectionPool::Work(bool rejecter) {
  std::deque<Connection>& queue = rejecter ? rejects_ : jobs_;
  for (;;) {
    Connection c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!rejecter) ++idle_;
      cv_.wait(lock, [&] { return !queue.empty() || stopping_; });
      if (!rejecter) --idle_;
      if (stopping_) {
        // Nothing more is served: close what still waits for a thread.
        for (Connection& left : queue) Close(left);
        queue.clear();
        return;
      }
      c = std::move(queue.front());
      queue.pop_front();
    }
    if (serve_(c, rejecter) && c.requests_left > 0) {
      c.kept_alive = true;
      Park(std::move(c));
    } else {
      Close(c);
    }
  }
}

void ConnectionPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (joined_) return;
    joined_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  Wake();
  if (poller_.joinable()) poller_.join();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

}  // namespace kvcache::server
