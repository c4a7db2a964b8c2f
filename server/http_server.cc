// The OpenAI-compatible HTTP server (see http_server.h): routes, the
// bearer check, the completion handlers (whole and streamed) and the
// error bodies of what httplib rejects itself.
#include "server/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "server/http_connections.h"
#include "server/metrics_text.h"
#include "server/openai_json.h"

namespace kvcache::server {
namespace {

using engine::StreamEvent;
using std::chrono::milliseconds;

constexpr const char* kJson = "application/json";
// The same for a watched (chunked) answer. httplib 0.11 compresses a body
// whose type is exactly "application/json" for a client that accepts gzip
// or br, and its compressor keeps small writes: the heartbeat spaces would
// not reach the socket. With the charset parameter it leaves the body as is.
constexpr const char* kWatchedJson = "application/json; charset=utf-8";
// How long a handler waits for its stream before checking on its client.
constexpr milliseconds kPollInterval{1000};
// A non-streamed completion that ends within this is answered whole, with
// its own status; a longer one is answered through a chunked provider that
// watches the client (WholeStep).
constexpr milliseconds kWholeAnswerWait{150};
// How often that provider looks at the client's socket.
constexpr milliseconds kWatchInterval{50};

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorBody(e), kJson);
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The presented token equals the key (in time independent of where they differ).
bool SameSecret(std::string_view presented, std::string_view key) {
  if (presented.size() != key.size() || key.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(presented[i] ^ key[i]);
  return diff == 0;
}

// True while a request is served on a rejecting thread (beyond the queue's
// bound): the pre-routing handler answers it 503 queue_full.
thread_local bool t_over_capacity = false;

// One request's reading and writing on a connection's socket, starting
// with the bytes the poll thread read ahead (Connection::pending). As
// httplib's own socket stream: reads wait up to the read timeout, a write
// first waits up to the write timeout for room and fails once the peer has
// closed (so a content provider finds a vanished client); small reads go
// through a buffer, whose unread rest goes back to the connection.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, std::string pending, milliseconds read_timeout, milliseconds write_timeout)
      : fd_(fd), buf_(std::move(pending)), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  bool is_readable() const override { return off_ < buf_.size() || Wait(POLLIN, read_timeout_); }
  bool is_writable() const override { return Wait(POLLOUT, write_timeout_) && PeerOpen(); }

  ssize_t read(char* ptr, size_t size) override {
    if (off_ < buf_.size()) return Take(ptr, size);
    if (!Wait(POLLIN, read_timeout_)) return -1;
    if (size >= kReadChunk) return Recv(ptr, size);
    buf_.resize(kReadChunk);
    off_ = 0;
    const ssize_t n = Recv(buf_.data(), kReadChunk);
    buf_.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return n > 0 ? Take(ptr, size) : n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    for (;;) {
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0 || errno != EINTR) return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { Address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Address(false, ip, port); }
  socket_t socket() const override { return fd_; }

  // The bytes read and not consumed: the start of the connection's next request.
  std::string Unread() && { return buf_.substr(std::min(off_, buf_.size())); }

 private:
  static constexpr size_t kReadChunk = 4096;

  ssize_t Take(char* ptr, size_t size) {
    const size_t n = std::min(size, buf_.size() - off_);
    std::memcpy(ptr, buf_.data() + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t Recv(char* ptr, size_t size) const {
    for (;;) {
      const ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n >= 0 || errno != EINTR) return n;
    }
  }
  bool Wait(short events, milliseconds timeout) const {
    pollfd p{fd_, events, 0};
    for (;;) {
      const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
      if (r >= 0 || errno != EINTR) return r > 0;
    }
  }
  // False once the peer has closed its side: readable with nothing to read.
  bool PeerOpen() const {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    char c;
    return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }
  void Address(bool remote, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    auto* sa = reinterpret_cast<sockaddr*>(&addr);
    if ((remote ? ::getpeername(fd_, sa, &len) : ::getsockname(fd_, sa, &len)) != 0) return;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (::getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return;
    }
    ip = host;
    port = std::atoi(serv);
  }

  const int fd_;
  std::string buf_;
  size_t off_ = 0;
  const milliseconds read_timeout_, write_timeout_;
};

// httplib's server with the connections in a ConnectionPool: httplib
// accepts, the pool waits for each request's header, and a pool thread has
// httplib read, route and answer the request (process_request).
class PooledServer final : public httplib::Server {
 public:
  // Where accepted sockets go (set while Run listens).
  ConnectionPool* pool = nullptr;

  ConnectionLimits Limits(const ServerOptions& o, std::function<void()> on_timeout) const {
    ConnectionLimits l;
    l.threads = std::max<uint32_t>(1, o.http_threads);
    l.max_waiting = o.http_queue;
    l.header_timeout = milliseconds(std::max<int64_t>(1, o.header_timeout_ms));
    l.idle_timeout = std::chrono::seconds(keep_alive_timeout_sec_);
    l.timeout_response = TimeoutResponse();
    l.on_timeout_response = std::move(on_timeout);
    return l;
  }

  // One request on c (the pool's ServeFn).
  bool Serve(Connection& c, bool rejected) {
    t_over_capacity = rejected;
    if (svr_sock_ == INVALID_SOCKET) return false;  // stopping
    ConnectionStream stream(c.fd, std::move(c.pending),
                            Timeout(read_timeout_sec_, read_timeout_usec_),
                            Timeout(write_timeout_sec_, write_timeout_usec_));
    bool closed = false;
    const bool ok = process_request(stream, /*close_connection=*/c.requests_left <= 1, closed, {});
    c.pending = std::move(stream).Unread();
    --c.requests_left;
    // A rejected connection is closed, as its 503 says (Connection: close).
    return ok && !closed && !rejected && svr_sock_ != INVALID_SOCKET;
  }

 private:
  static milliseconds Timeout(time_t sec, time_t usec) { return milliseconds(sec * 1000 + usec / 1000); }

  static std::string TimeoutResponse() {
    const std::string body = ErrorBody(ErrorForHttpStatus(408));
    return "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: " + std::string(kJson) +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }

  // httplib calls this (through the task queue, on its accepting thread)
  // for each accepted socket: the pool takes it.
  bool process_and_close_socket(socket_t sock) override {
    if (pool == nullptr) {
      ::close(sock);
      return false;
    }
    pool->Add(sock, static_cast<uint32_t>(std::min<size_t>(keep_alive_max_count_, UINT32_MAX)));
    return true;
  }
};

// httplib's task queue while Run listens: the accepted socket's task only
// hands it to the pool, so it runs at once; shutting down shuts the pool.
class PoolQueue final : public httplib::TaskQueue {
 public:
  // on_timeout: each 408 the poll thread writes (the metrics count it).
  PoolQueue(PooledServer& server, const ServerOptions& options, std::function<void()> on_timeout)
      : server_(server),
        pool_(server.Limits(options, std::move(on_timeout)),
              [&server](Connection& c, bool rejected) { return server.Serve(c, rejected); }) {
    server_.pool = &pool_;
  }
  ~PoolQueue() override { shutdown(); }
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {
    server_.pool = nullptr;
    pool_.Shutdown();
  }

 private:
  PooledServer& server_;
  ConnectionPool pool_;
};

// A non-streamed request's state: the completion collected so far, and how
// it ended; shared by the handler, the content provider and its releaser.
struct WholeState {
  std::shared_ptr<engine::RequestStream> stream;
  ResponseContext ctx;
  bool logprobs = false;
  Completion c;
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kStop;
  Status error;
  std::chrono::steady_clock::time_point last_beat;
};

// A streamed request's state, shared by the content provider and its releaser.
struct StreamState {
  std::shared_ptr<engine::RequestStream> stream;
  ResponseContext ctx;
  bool include_usage = false, logprobs = false;
  bool started = false, finished = false;
};

}  // namespace

struct OpenAiServer::Impl {
  Impl(engine::Engine& e, ServerOptions o) : engine(e), options(std::move(o)) {}

  engine::Engine& engine;
  ServerOptions options;
  PooledServer http;
  int port = 0;
  // The socket httplib last created for listening (set_socket_options).
  socket_t listen_socket = INVALID_SOCKET;
  std::mutex counters_mu;
  HttpCounters counters;
  // Completions submitted and not yet answered in full; Shutdown waits for 0.
  std::atomic<bool> draining{false};
  std::mutex active_mu;
  std::condition_variable active_cv;
  uint64_t active = 0;

  void Begin() {
    std::lock_guard<std::mutex> lock(active_mu);
    ++active;
  }
  void End() {
    std::lock_guard<std::mutex> lock(active_mu);
    if (--active == 0) active_cv.notify_all();
  }

  void Configure();
  void HandleCompletion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // Reads st's stream for up to `budget`; true once it finished.
  bool Collect(WholeState& st, milliseconds budget) const;
  // The finished completion's body and status.
  std::pair<int, std::string> WholeBody(const WholeState& st) const;
  bool WholeStep(WholeState& st, httplib::DataSink& sink);
  void AnswerWhole(const std::shared_ptr<WholeState>& st, httplib::Response& res);
  bool StreamStep(StreamState& st, httplib::DataSink& sink);
};

namespace {

// The log probabilities of generated tokens, with their texts as the engine gives them.
std::vector<LogprobEntry> Entries(const std::vector<engine::TokenOut>& tokens) {
  std::vector<LogprobEntry> out;
  for (const engine::TokenOut& t : tokens) {
    LogprobEntry e{t.piece, t.logprob, {}};
    for (const engine::TokenLogprob& top : t.top) e.top.emplace_back(top.piece, top.logprob);
    out.push_back(std::move(e));
  }
  return out;
}

// The engine request of a parsed one: the prompt as text (the engine
// tokenizes it), up to the end of the context unless max_tokens says less.
engine::RequestParams Params(const CompletionRequest& r) {
  engine::RequestParams p;
  if (r.endpoint == Endpoint::kChat) {
    p.messages = r.messages;
  } else {
    p.prompt_text = r.prompt;
  }
  p.max_tokens = r.max_tokens.value_or(std::numeric_limits<uint32_t>::max());
  p.sampling = r.sampling;
  p.stop = r.stop;
  p.ignore_eos = r.ignore_eos;
  p.logprobs = r.logprobs;
  p.top_logprobs = r.top_logprobs;
  return p;
}

}  // namespace

bool OpenAiServer::Impl::Collect(WholeState& st, milliseconds budget) const {
  const auto end = std::chrono::steady_clock::now() + budget;
  while (!st.finished) {
    const auto left = std::chrono::duration_cast<milliseconds>(end - std::chrono::steady_clock::now());
    StreamEvent ev;
    if (left.count() <= 0 || !st.stream->Next(&ev, left)) return false;
    for (const engine::TokenOut& t : ev.tokens) st.c.text += t.text;
    if (st.logprobs) {
      std::vector<LogprobEntry> e = Entries(ev.tokens);
      st.c.entries.insert(st.c.entries.end(), e.begin(), e.end());
    }
    if (!ev.finished) continue;
    st.finished = true;
    st.finish_reason = ev.finish_reason;
    st.error = std::move(ev.error);
    st.c.text += ev.text_tail;
    st.c.finish_reason = std::string(FinishReasonString(ev.finish_reason));
    st.c.usage = ev.usage;
  }
  return true;
}

std::pair<int, std::string> OpenAiServer::Impl::WholeBody(const WholeState& st) const {
  if (st.finish_reason == engine::FinishReason::kError) {
    return {500, ErrorBody(ApiError{500, st.error.ToString(), "server_error", "", "engine_error"})};
  }
  return {200, Dump(CompletionJson(st.ctx, st.c))};
}

// One call of a long non-streamed completion's content provider: waits a
// little for the stream; while it runs, checks that the client is still
// there (a closed socket reads as not writable: httplib's is_writable asks
// the socket) and once a second writes a space, which JSON allows before
// the value, so that a vanished peer also fails a write. A client gone
// cancels the request at once: its blocks go back at the next step.
bool OpenAiServer::Impl::WholeStep(WholeState& st, httplib::DataSink& sink) {
  const auto gone = [&] {
    st.stream->Cancel();
    return false;
  };
  if (!Collect(st, kWatchInterval)) {
    if (sink.is_writable && !sink.is_writable()) return gone();
    const auto now = std::chrono::steady_clock::now();
    if (now - st.last_beat >= kPollInterval) {
      st.last_beat = now;
      if (!sink.write(" ", 1)) return gone();
    }
    return true;
  }
  // Status 200 is already sent: an engine error comes as the error object.
  const std::string body = WholeBody(st).second;
  if (!sink.write(body.data(), body.size())) return gone();
  sink.done();
  return true;
}

// A completion that ends soon is answered with its status and length; a
// longer one through a chunked body (WholeStep) so that a client going away
// is noticed. The releaser cancels the request however the response ends.
void OpenAiServer::Impl::AnswerWhole(const std::shared_ptr<WholeState>& st, httplib::Response& res) {
  Begin();
  if (Collect(*st, kWholeAnswerWait)) {
    auto [status, body] = WholeBody(*st);
    res.status = status;
    res.set_content(std::move(body), kJson);
    End();
    return;
  }
  st->last_beat = std::chrono::steady_clock::now();
  res.set_chunked_content_provider(
      kWatchedJson, [this, st](size_t, httplib::DataSink& sink) { return WholeStep(*st, sink); },
      [this, st](bool) {
        st->stream->Cancel();
        End();
      });
}

// What ends a stream: the finish chunk (or an error event), the usage
// chunk when asked for, [DONE].
std::string FinalEvents(const StreamState& st, const StreamEvent& ev) {
  std::string tail;
  if (ev.finish_reason == engine::FinishReason::kError) {
    tail += SseEvent(nlohmann::json::parse(
        ErrorBody(ApiError{500, ev.error.ToString(), "server_error", "", "engine_error"})));
  } else {
    tail += SseEvent(ChunkJson(st.ctx, "", false, FinishReasonString(ev.finish_reason), false, {},
                               st.include_usage));
  }
  if (st.include_usage) tail += SseEvent(UsageChunkJson(st.ctx, ev.usage));
  tail += kSseDone;
  return tail;
}

// One call of the content provider: the next event's chunks (or a comment
// line while none comes, which also finds a vanished client); false when
// the client is gone, which ends the response and cancels the request.
bool OpenAiServer::Impl::StreamStep(StreamState& st, httplib::DataSink& sink) {
  auto write = [&](const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    st.stream->Cancel();
    return false;
  };
  if (st.finished) {
    sink.done();
    return true;
  }
  const bool chat = st.ctx.endpoint == Endpoint::kChat;
  if (!st.started) {
    st.started = true;
    if (chat && !write(SseEvent(ChunkJson(st.ctx, "", true, "", false, {}, st.include_usage)))) return false;
  }
  StreamEvent ev;
  if (!st.stream->Next(&ev, kPollInterval)) return write(": waiting\n\n");
  std::string text;
  for (const engine::TokenOut& t : ev.tokens) text += t.text;
  text += ev.text_tail;
  const std::vector<LogprobEntry> entries = st.logprobs ? Entries(ev.tokens) : std::vector<LogprobEntry>{};
  if ((!text.empty() || !entries.empty()) &&
      !write(SseEvent(ChunkJson(st.ctx, text, false, "", st.logprobs, entries, st.include_usage)))) {
    return false;
  }
  if (!ev.finished) return true;
  st.finished = true;
  if (!write(FinalEvents(st, ev))) return false;
  sink.done();
  return true;
}

void OpenAiServer::Impl::HandleCompletion(const httplib::Request& req, httplib::Response& res,
                                          Endpoint endpoint) {
  if (draining.load()) {
    return SendError(res, ApiError{503, "the server is shutting down", "server_unavailable", "", "shutting_down"});
  }
  ParseResult parsed = ParseCompletionRequest(req.body, endpoint);
  if (!parsed.request) return SendError(res, parsed.error);
  const CompletionRequest& r = *parsed.request;
  engine::SubmitFault fault = engine::SubmitFault::kNone;
  auto submitted = engine.Submit(Params(r), &fault);
  if (!submitted.ok()) return SendError(res, ErrorFromSubmit(submitted.status(), fault, endpoint));
  std::shared_ptr<engine::RequestStream> stream = std::move(*submitted);
  ResponseContext ctx{endpoint,
                      (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(stream->id()),
                      UnixNow(), options.model_name};
  if (!r.stream) {
    auto st = std::make_shared<WholeState>();
    st->stream = stream;
    st->ctx = ctx;
    st->logprobs = r.logprobs;
    st->c.logprobs = r.logprobs;
    return AnswerWhole(st, res);
  }
  Begin();
  auto st = std::make_shared<StreamState>();
  st->stream = stream;
  st->ctx = ctx;
  st->include_usage = r.include_usage;
  st->logprobs = r.logprobs;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, st](size_t, httplib::DataSink& sink) { return StreamStep(*st, sink); },
      [this, st](bool) {
        st->stream->Cancel();
        End();
      });
}

void OpenAiServer::Impl::Configure() {
  http.new_task_queue = [this] {
    return new PoolQueue(http, options, [this] {
      std::lock_guard<std::mutex> lock(counters_mu);
      ++counters.responses_by_status[408];
    });
  };
  http.set_payload_max_length(options.max_body_bytes);
  if (options.keep_alive_seconds > 0) {
    http.set_keep_alive_max_count(100);
    http.set_keep_alive_timeout(options.keep_alive_seconds);
  } else {
    http.set_keep_alive_max_count(1);
  }
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (t_over_capacity) {
      res.set_header("Connection", "close");
      SendError(res, ApiError{503, "every HTTP thread is busy and " + std::to_string(options.http_queue) +
                                       " connections wait already (--http-queue)",
                              "server_unavailable", "", "queue_full"});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options.api_key.empty() || !req.path.starts_with("/v1/")) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.starts_with("Bearer ") && SameSecret(std::string_view(auth).substr(7), options.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    SendError(res, ErrorForHttpStatus(401));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty() || res.content_length_ > 0) return httplib::Server::HandlerResponse::Unhandled;
    res.set_content(ErrorBody(ErrorForHttpStatus(res.status)), kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    SendError(res, ApiError{500, "internal server error", "server_error", "", ""});
  });
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(counters_mu);
    ++counters.responses_by_status[res.status];
  });
}

OpenAiServer::OpenAiServer(engine::Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {
  Impl& s = *impl_;
  s.Configure();
  s.http.Post("/v1/chat/completions", [&s](const httplib::Request& req, httplib::Response& res) {
    s.HandleCompletion(req, res, Endpoint::kChat);
  });
  s.http.Post("/v1/completions", [&s](const httplib::Request& req, httplib::Response& res) {
    s.HandleCompletion(req, res, Endpoint::kCompletions);
  });
  s.http.Get("/v1/models", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(Dump(ModelsJson(s.options.model_name, UnixNow())), kJson);
  });
  s.http.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    if (s.draining.load()) res.status = 503;
    res.set_content(s.draining.load() ? R"({"status":"draining"})" : R"({"status":"ok"})", kJson);
  });
  s.http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    HttpCounters http;
    {
      std::lock_guard<std::mutex> lock(s.counters_mu);
      http = s.counters;
    }
    res.set_content(PrometheusText(s.engine.Metrics(), http), kPrometheusContentType);
  });
  // A known route under another method: 405 with the methods it takes.
  const auto not_allowed = [](const char* allow) {
    return [allow](const httplib::Request&, httplib::Response& res) {
      res.set_header("Allow", allow);
      SendError(res, ErrorForHttpStatus(405));
    };
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    s.http.Get(path, not_allowed("POST"));
    s.http.Put(path, not_allowed("POST"));
    s.http.Patch(path, not_allowed("POST"));
    s.http.Delete(path, not_allowed("POST"));
  }
  for (const char* path : {"/v1/models", "/health", "/metrics"}) {
    s.http.Post(path, not_allowed("GET"));
    s.http.Put(path, not_allowed("GET"));
    s.http.Patch(path, not_allowed("GET"));
    s.http.Delete(path, not_allowed("GET"));
  }
}

OpenAiServer::~OpenAiServer() { Stop(); }

// Debian's httplib is a compiled library that listens with a backlog of 5
// (defining CPPHTTPLIB_LISTEN_BACKLOG here changes nothing in it): a burst
// of clients connecting at once overflows it, the kernel drops their
// handshakes, and some of them see their connection reset (requests lost,
// about a second in, with TcpExtListenOverflows rising). Listening again on
// the bound socket raises the backlog (Linux; capped at
// net.core.somaxconn).
constexpr int kListenBacklog = 1024;

Status OpenAiServer::Bind() {
  Impl& s = *impl_;
  s.http.set_socket_options([&s](socket_t sock) {
    httplib::default_socket_options(sock);
    s.listen_socket = sock;
  });
  bool bound = false;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
    bound = s.port > 0;
  } else if (s.http.bind_to_port(s.options.host, s.options.port)) {
    s.port = s.options.port;
    bound = true;
  }
  if (bound) {
    if (s.listen_socket != INVALID_SOCKET && ::listen(s.listen_socket, kListenBacklog) != 0) {
      return Status::IoError("cannot raise the listen backlog on " + s.options.host + ":" + std::to_string(s.port));
    }
    return Status::Ok();
  }
  return Status::IoError("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port));
}

int OpenAiServer::port() const { return impl_->port; }

Status OpenAiServer::Run() {
  if (impl_->port <= 0) return Status::FailedPrecondition("Run before a successful Bind");
  impl_->http.listen_after_bind();
  return Status::Ok();
}

void OpenAiServer::Stop() { impl_->http.stop(); }

void OpenAiServer::Shutdown(std::chrono::milliseconds drain, std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  s.draining.store(true);
  s.engine.Shutdown(drain);
  {
    std::unique_lock<std::mutex> lock(s.active_mu);
    s.active_cv.wait_for(lock, grace, [&s] { return s.active == 0; });
  }
  Stop();
}

}  // namespace kvcache::server
