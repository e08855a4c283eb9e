// tessera serve's HTTP/1.1 layer: Boost.Asio's event loop with Boost.Beast's request parser (and
// OpenSSL through Asio for TLS). Why not cpp-httplib 0.11 (Debian's), which served before: it gives
// every connection a worker thread from the first byte to the end of keep-alive, so 25 slowloris
// connections or 60 idle keep-alive sockets took every worker; it has no total deadline for a header,
// caps only a body with a Content-Length, answers one of two pipelined requests, and streams chunked
// to HTTP/1.0 clients. Here connections are sockets on one I/O thread and cost no thread while they
// send, wait or idle; a thread runs only a handler (a request that was read whole), and /health and
// /metrics run on the I/O thread, answered while every generation slot is busy.
//
// Per connection: an idle deadline for the next request's first byte (keep-alive), a total deadline for
// its header once it began and another for its body, a size limit for each (431, 413), a deadline per
// write to a client that stops reading; requests on one connection are answered in order (pipelining);
// Expect: 100-continue is honoured; a streamed answer is chunked on HTTP/1.1 and sent until close on
// HTTP/1.0. A request whose length is ambiguous (two Content-Length fields, or Transfer-Encoding with
// Content-Length) is a 400 and ends its connection. Every answer carries X-Request-Id (the client's when it
// sent a plain one, else a new one), and each request ends with one access-log record.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::http {

struct Header {
  std::string name, value;
};

struct Request {
  std::string method, target, path;  // path: the target without its query
  int version = 11;                  // 10: HTTP/1.0, 11: HTTP/1.1
  std::vector<Header> headers;
  std::string body;
  std::string remote;  // the client: "address:port", or "unix"
  std::string id;      // X-Request-Id
  // A header's value (names compare case-insensitively); nullptr when absent.
  const std::string* header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<Header> headers;
  std::string body;
  void set(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
};

// One request and its one answer, given whole (reply) or streamed (begin_stream, write..., end_stream).
// A handler that returns without answering gets a 500 (or, mid-stream, its connection closed).
class Exchange {
 public:
  struct Impl;
  explicit Exchange(std::shared_ptr<Impl> impl);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const Request& request() const;
  void reply(Response r);
  // The status and headers of a streamed answer (its body is ignored).
  void begin_stream(Response head);
  // One part of the stream, returning once it was written: false when the client went away, stopped
  // reading (the write deadline), or the server is stopping.
  bool write(std::string_view data);
  void end_stream();
  // Whether the client closed or reset its connection (polled; for an answer not yet written).
  bool client_gone() const;
  // Token counts for the access log.
  void note_tokens(int64_t prompt, int64_t completion);

 private:
  std::shared_ptr<Impl> impl_;
};

// Limits of one connection and of the handlers; seconds for the deadlines.
struct Limits {
  size_t max_body = size_t{16} << 20;
  size_t max_header = size_t{64} << 10;
  double idle_seconds = 30;    // waiting for a request's first byte (keep-alive; a TLS handshake)
  double header_seconds = 10;  // from a request's first byte to the end of its header
  double body_seconds = 60;    // reading its body
  double write_seconds = 60;   // one write to the client
  int max_connections = 1024;  // more are closed at once
  int max_handlers = 64;       // threaded handlers at once; more requests get 503
};

// The access log's record of one request, given when its answer ended.
struct Access {
  std::string id, remote, method, target;
  int version = 11, status = 0;
  int64_t prompt_tokens = -1, completion_tokens = -1;  // -1: none noted
  double first_seconds = 0, total_seconds = 0;         // to the answer's first bytes / its end
  uint64_t bytes = 0;                                  // of the answer
};

// The listening address: host "unix:PATH" is a Unix socket; cert and key files enable TLS.
struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  std::string cert_file, key_file;
};

class Server {
 public:
  using Handler = std::function<void(Exchange&)>;
  // Inline: runs on the I/O thread and must answer whole and at once (health, metrics, small lookups).
  // Thread: runs on a thread of its own (at most Limits::max_handlers at once).
  enum class Run { Inline, Thread };

  explicit Server(Limits limits);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // A route: path exact, or a prefix when it ends in '*'. A known path asked with another method gets
  // 405 with Allow; an unknown path 404.
  void route(const std::string& method, const std::string& path, Handler h, Run run);
  // Runs on the I/O thread before routing (every request, routed or not): true when it answered (CORS
  // preflight, 401).
  void before(std::function<bool(const Request&, Response&)> f);
  // Adds to every answer's headers (any thread).
  void decorate(std::function<void(const Request&, Response&)> f);
  // The body of the server's own errors (404, 405, 413, 431, 400, 503).
  void error_format(std::function<std::string(int status, const std::string& message)> f);
  void access_log(std::function<void(const Access&)> f);

  // Binds and listens; returns the address as "http(s)://host:port" or "unix:PATH". One-line error
  // (tessera::Error) when it cannot.
  std::string listen(const Endpoint& e);
  int port() const;

  // Serves until drained (or stopped); call once.
  void run();
  // Graceful stop, from any thread: no new connections, idle ones closed, requests that arrive on open
  // connections get 503, those being answered go on. After `deadline_seconds` on_deadline runs (to end
  // the rest), and 5 s later every connection is closed. run() returns when no connection and no
  // handler is left.
  void drain(double deadline_seconds, std::function<void()> on_deadline);

  struct Counts {
    int connections = 0, handlers = 0;
  };
  Counts counts() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::http
