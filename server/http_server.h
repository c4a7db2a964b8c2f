// The HTTP front of `kvcache serve`: an OpenAI-compatible API over one
// engine::Engine, on cpp-httplib's threaded server.
//
//   POST /v1/chat/completions   messages in the model's chat template
//   POST /v1/completions        a prompt string
//   GET  /v1/models             the one served model
//   GET  /health                200 {"status": "ok"} while serving
//   GET  /metrics               Prometheus text (server/metrics_text.h)
//
// Every error is an OpenAI error object (server/openai_json.h) with its
// status: 400 bad JSON / field / prompt longer than the context, 401 a
// missing or wrong bearer token on /v1/* when api_key is set, 404 no route,
// 405 a known route with the wrong method, 413 a body over max_body_bytes,
// 503 the engine's queue is full or it is shutting down, 500 an engine error.
//
// Streaming responses are server-sent events written through httplib's
// chunked content provider; when a write fails (the client went away) the
// request is cancelled at once, so its blocks go back to the pool at the
// engine's next step. A non-streamed completion that runs longer than a
// moment is answered through a chunked body too, whose provider watches the
// client's socket, so a client that goes away cancels it the same way.
// A connection waits for its request header on one poll thread, holding no
// HTTP thread (server/http_connections.h): a client that sends half a
// request, or nothing, delays nobody, and is closed when its header has not
// arrived within header_timeout_ms (408 when it sent part of one). A
// connection whose header arrived is served by one thread of a pool of
// `http_threads`, and at most `http_queue` more wait for one (503
// queue_full beyond); a handler blocks on its request's stream, never on
// the engine's step thread. A kept-alive connection goes back to the poll
// thread between its requests.
//
// Thread safety: Bind, then Run on one thread; Stop and Shutdown from any
// thread (a signal-handling thread); Run returns once every in-flight
// handler ended.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "kvcache/status.h"

namespace kvcache::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (see port())
  std::string api_key;                // empty: no authentication
  size_t max_body_bytes = 1u << 20;   // larger bodies get 413
  std::string model_name = "kvcache"; // the id /v1/models and responses carry
  uint32_t http_threads = 32;         // concurrent connections served
  // Connections with a complete request header that may wait for a free
  // HTTP thread; beyond that such a request gets 503 queue_full and its
  // connection is closed.
  uint32_t http_queue = 64;
  // A request's header must arrive in full within this many milliseconds of
  // its connection's accept (or of its first byte, on a kept-alive
  // connection); a connection that misses it is closed (408 when it sent
  // part of a header).
  int64_t header_timeout_ms = 10000;
  // 0: one request per connection (every response says Connection: close).
  // N > 0: a connection may carry up to 100 requests and is closed after N
  // idle seconds; a client that reuses it as the server closes it loses that
  // request, so keep N above the clients' own idle limit (httpx: 5 s) if at
  // all. An idle connection holds no HTTP thread.
  int keep_alive_seconds = 0;
};

class OpenAiServer {
 public:
  // The engine must outlive the server.
  OpenAiServer(engine::Engine& engine, ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds the listening socket (IoError naming host:port on failure).
  Status Bind();
  // The bound port (after Bind).
  int port() const;
  // Serves until Stop; returns after the in-flight handlers ended.
  Status Run();
  // Stops accepting connections at once; idempotent. A streamed response
  // still being written is cut off (httplib ends them on stop): use
  // Shutdown to drain.
  void Stop();
  // The graceful end: new completions get 503 and /health 503 from now on;
  // the engine finishes in-flight requests for up to `drain` (cancelling
  // what is left, engine::Engine::Shutdown); every response still being
  // written is given up to `grace` more to end; then Stop. Idempotent.
  void Shutdown(std::chrono::milliseconds drain,
                std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache::server
