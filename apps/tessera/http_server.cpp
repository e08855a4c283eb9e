#include "apps/tessera/http_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <type_traits>
#include <unordered_set>

#include "core/error.h"

namespace tessera::http {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using unix_socket = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if (std::tolower(x) != std::tolower(y)) return false;
  }
  return true;
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// An X-Request-Id a client may set: 1 to 128 of [A-Za-z0-9._:-].
bool plain_id(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (const char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' && c != '-')
      return false;
  return true;
}

enum class Framing { Length, Chunked, UntilClose };

// A response's status line and headers.
std::string head(const Request& rq, const Response& r, bool keep, Framing f, size_t length) {
  std::string h = "HTTP/1.1 " + std::to_string(r.status) + " ";
  h += std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(r.status)));
  h += "\r\n";
  if (!r.content_type.empty()) h += "Content-Type: " + r.content_type + "\r\n";
  if (f == Framing::Length) h += "Content-Length: " + std::to_string(length) + "\r\n";
  if (f == Framing::Chunked) h += "Transfer-Encoding: chunked\r\n";
  if (!keep)
    h += "Connection: close\r\n";
  else if (rq.version == 10)
    h += "Connection: keep-alive\r\n";
  if (!rq.id.empty()) h += "X-Request-Id: " + rq.id + "\r\n";
  for (const Header& x : r.headers) h += x.name + ": " + x.value + "\r\n";
  h += "\r\n";
  return h;
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const Header& h : headers)
    if (iequals(h.name, name)) return &h.value;
  return nullptr;
}

// What an exchange needs of its connection, whatever the connection's stream. Called on the I/O thread.
struct ConnBase {
  virtual ~ConnBase() = default;
  // Queues bytes of the current answer; `final`: its last. done(ok) when written (ok false: the
  // connection broke or timed out).
  virtual void queue(std::string data, bool final, bool keep, std::function<void(bool)> done) = 0;
  virtual void handler_done() = 0;
  virtual void drain() = 0;        // closes the connection if it waits for a request
  virtual void force_close() = 0;  // ends every operation
  int fd = -1;                     // the socket, valid while a handler runs
  std::atomic<bool> broken{false};
};

struct Exchange::Impl {
  std::shared_ptr<ConnBase> conn;
  std::shared_ptr<Server::Impl> srv;
  Request req;
  bool keep = true;  // the request allows keep-alive
  enum class State { None, Streaming, Ended } state = State::None;
  Framing framing = Framing::Length;
  Clock::time_point start = Clock::now();
  Access acc;
  void send(std::string data, bool final, std::function<void(bool)> done = nullptr);
};

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  explicit Impl(Limits l) : lim(l) {
    std::random_device rd;
    char p[16];
    std::snprintf(p, sizeof p, "%08x", rd());
    id_prefix = p;
  }
  Limits lim;
  asio::io_context io{1};
  std::optional<asio::ssl::context> tls;
  std::optional<tcp::acceptor> tcp_acc;
  std::optional<unix_socket::acceptor> unix_acc;
  std::string unix_path;
  int port = 0;
  struct Route {
    std::string method, path;
    bool prefix;
    Handler h;
    Run run;
  };
  std::vector<Route> routes;
  std::function<bool(const Request&, Response&)> before;
  std::function<void(const Request&, Response&)> decorate;
  std::function<std::string(int, const std::string&)> error_format;
  std::function<void(const Access&)> access_log;
  std::unordered_set<ConnBase*> conns;  // I/O thread only
  std::atomic<int> n_conns{0}, n_handlers{0};
  std::atomic<bool> draining{false};
  std::mutex hm;
  std::condition_variable hcv;
  std::atomic<uint64_t> next_id{0};
  std::string id_prefix;
  std::optional<asio::steady_timer> drain_timer;
  std::function<void()> on_deadline;

  std::string error_body(int status, const std::string& message) const {
    return error_format ? error_format(status, message) : message;
  }
  Response error(int status, const std::string& message) const {
    Response r;
    r.status = status;
    r.set(error_body(status, message), error_format ? "application/json" : "text/plain");
    if (status == 503) r.headers.push_back({"Retry-After", "1"});
    return r;
  }
  // While draining: once no connection and no handler is left, the drain timer goes so that run() returns.
  void check_drained() {
    if (draining && conns.empty() && n_handlers == 0 && drain_timer) drain_timer->cancel();
  }
  std::string new_id() { return "req-" + id_prefix + "-" + std::to_string(++next_id); }
  void dispatch(const std::shared_ptr<Exchange::Impl>& ex);
  template <typename Acceptor, typename Make>
  void accept(Acceptor& acc, Make make);
};

void Exchange::Impl::send(std::string data, bool final, std::function<void(bool)> done) {
  asio::post(srv->io, [c = conn, d = std::move(data), final, k = keep, done = std::move(done)]() mutable {
    c->queue(std::move(d), final, k, std::move(done));
  });
}

Exchange::Exchange(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Exchange::~Exchange() {
  Impl& x = *impl_;
  if (x.state == Impl::State::None) {
    reply(x.srv->error(500, "the handler gave no answer"));
  } else if (x.state == Impl::State::Streaming) {  // ended mid-stream: the client cannot tell, so close
    x.keep = false;
    x.state = Impl::State::Ended;
    x.send(std::string(), true);
  }
  asio::post(x.srv->io, [c = x.conn] { c->handler_done(); });
}

const Request& Exchange::request() const {
  return impl_->req;
}

void Exchange::reply(Response r) {
  Impl& x = *impl_;
  if (x.state != Impl::State::None) return;
  if (x.srv->decorate) x.srv->decorate(x.req, r);
  x.keep = x.keep && !x.srv->draining;
  x.acc.status = r.status;
  x.acc.first_seconds = since(x.start);
  std::string out = head(x.req, r, x.keep, Framing::Length, r.body.size());
  if (x.req.method != "HEAD") out += r.body;
  x.state = Impl::State::Ended;
  x.send(std::move(out), true);
}

void Exchange::begin_stream(Response r) {
  Impl& x = *impl_;
  if (x.state != Impl::State::None) return;
  if (x.srv->decorate) x.srv->decorate(x.req, r);
  x.framing = x.req.version >= 11 ? Framing::Chunked : Framing::UntilClose;
  x.keep = x.keep && !x.srv->draining && x.framing == Framing::Chunked;
  x.acc.status = r.status;
  x.state = Impl::State::Streaming;
  x.send(head(x.req, r, x.keep, x.framing, 0), false);
}

bool Exchange::write(std::string_view data) {
  Impl& x = *impl_;
  if (x.state != Impl::State::Streaming || x.conn->broken) return false;
  if (data.empty()) return true;  // an empty chunk would end the stream
  if (x.acc.first_seconds == 0) x.acc.first_seconds = since(x.start);
  std::string out;
  if (x.framing == Framing::Chunked) {
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    out = size;
    out.append(data);
    out += "\r\n";
  } else {
    out.assign(data);
  }
  auto written = std::make_shared<std::promise<bool>>();
  std::future<bool> f = written->get_future();
  x.send(std::move(out), false, [written](bool ok) { written->set_value(ok); });
  return f.get();
}

void Exchange::end_stream() {
  Impl& x = *impl_;
  if (x.state != Impl::State::Streaming) return;
  x.state = Impl::State::Ended;
  x.send(x.framing == Framing::Chunked ? "0\r\n\r\n" : "", true);
}

bool Exchange::client_gone() const {
  if (impl_->conn->broken) return true;
  if (impl_->conn->fd < 0) return false;
  pollfd p{impl_->conn->fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void Exchange::note_tokens(int64_t prompt, int64_t completion) {
  impl_->acc.prompt_tokens = prompt;
  impl_->acc.completion_tokens = completion;
}

namespace {

template <typename Stream>
constexpr bool kTls = !std::is_same_v<Stream, tcp::socket> && !std::is_same_v<Stream, unix_socket::socket>;

// One connection: reads a request, hands it to its handler, writes the answer, then the next request.
template <typename Stream>
class Connection : public ConnBase, public std::enable_shared_from_this<Connection<Stream>> {
 public:
  Connection(std::shared_ptr<Server::Impl> srv, Stream stream, std::string remote)
      : srv_(std::move(srv)), stream_(std::move(stream)), timer_(srv_->io), remote_(std::move(remote)) {
    fd = beast::get_lowest_layer(stream_).native_handle();
  }

  void start() {
    srv_->conns.insert(this);
    ++srv_->n_conns;
    if constexpr (kTls<Stream>) {
      arm(srv_->lim.idle_seconds);
      stream_.async_handshake(asio::ssl::stream_base::server, [self = this->shared_from_this()](auto ec) {
        self->disarm();
        if (ec) return self->close();
        self->read_request();
      });
    } else {
      read_request();
    }
  }

  void queue(std::string data, bool final, bool keep, std::function<void(bool)> done) override {
    if (final) keep_ = keep;
    out_.push_back({std::move(data), final, std::move(done)});
    if (!writing_) write_next();
  }

  void handler_done() override {
    handler_ = false;
    if (closed_) return close();
    if (answered_) answer_ended();
  }

  void drain() override {
    if (idle_) close();
  }

  void force_close() override {
    broken = true;
    if (handler_) {
      cancel();  // the socket stays open for the handler's poll until it returns
    } else {
      close();
    }
  }

 private:
  struct Out {
    std::string data;
    bool final;
    std::function<void(bool)> done;
  };

  // A deadline for the operation in progress: at it, the socket's operations are cancelled.
  void arm(double s) {
    timed_out_ = false;
    const uint64_t gen = ++gen_;
    timer_.expires_after(seconds(s));
    timer_.async_wait([self = this->shared_from_this(), gen](const boost::system::error_code& ec) {
      if (ec || gen != self->gen_) return;
      self->timed_out_ = true;
      self->cancel();
    });
  }
  void disarm() {
    ++gen_;
    timer_.cancel();
  }
  void cancel() {
    boost::system::error_code ec;
    beast::get_lowest_layer(stream_).cancel(ec);
  }

  void read_request() {
    if (closed_) return;
    if (srv_->draining && buf_.size() == 0) return close();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(srv_->lim.max_header));
    parser_->body_limit(srv_->lim.max_body);
    answered_ = false;
    if (buf_.size() > 0) return read_header();  // a pipelined request
    idle_ = true;
    arm(srv_->lim.idle_seconds);
    stream_.async_read_some(buf_.prepare(4096), [self = this->shared_from_this()](auto ec, size_t n) {
      self->idle_ = false;
      self->disarm();
      self->buf_.commit(n);
      if (ec || n == 0) return self->close();
      self->read_header();
    });
  }

  void read_header() {
    first_byte_ = Clock::now();
    arm(srv_->lim.header_seconds);
    bhttp::async_read_header(stream_, buf_, *parser_, [self = this->shared_from_this()](auto ec, size_t) {
      self->disarm();
      self->on_header(ec);
    });
  }

  void on_header(boost::system::error_code ec) {
    if (timed_out_)
      return refuse(408, "the request header did not arrive within " + fmt(srv_->lim.header_seconds) + " s");
    if (ec == bhttp::error::header_limit)
      return refuse(431, "the request header exceeds " + std::to_string(srv_->lim.max_header >> 10) + " KiB");
    if (ec == bhttp::error::body_limit) return refuse(413, too_large());
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset)
      return close();
    if (ec) return refuse(400, "malformed HTTP request (" + ec.message() + ")");
    const auto& m = parser_->get();
    int lengths = 0;
    for (const auto& f : m) lengths += f.name() == bhttp::field::content_length;
    if (lengths > 1 || (lengths == 1 && m.find(bhttp::field::transfer_encoding) != m.end()))
      return refuse(400,
                    "the request's length is ambiguous (two Content-Length fields, or Content-Length "
                    "with Transfer-Encoding)");
    if (srv_->draining) return refuse(503, "the server is shutting down");
    const auto expect = m.find(bhttp::field::expect);
    if (expect != m.end() && !parser_->is_done()) {
      if (!iequals(std::string_view(expect->value().data(), expect->value().size()), "100-continue"))
        return refuse(417, "only Expect: 100-continue is understood");
      writing_ = true;
      arm(srv_->lim.write_seconds);
      asio::async_write(stream_, asio::buffer(kContinue, sizeof(kContinue) - 1),
                        [self = this->shared_from_this()](auto wec, size_t) {
                          self->writing_ = false;
                          self->disarm();
                          if (wec) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return dispatch();
    arm(srv_->lim.body_seconds);
    bhttp::async_read(stream_, buf_, *parser_, [self = this->shared_from_this()](auto ec, size_t) {
      self->disarm();
      if (self->timed_out_)
        return self->refuse(
            408, "the request body did not arrive within " + fmt(self->srv_->lim.body_seconds) + " s");
      if (ec == bhttp::error::body_limit) return self->refuse(413, self->too_large());
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof) return self->close();
      if (ec) return self->refuse(400, "malformed HTTP request body (" + ec.message() + ")");
      self->dispatch();
    });
  }

  std::string too_large() const {
    return "the request body exceeds " + std::to_string(srv_->lim.max_body) + " bytes";
  }
  static std::string fmt(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
  }

  std::shared_ptr<Exchange::Impl> exchange() {
    auto ex = std::make_shared<Exchange::Impl>();
    ex->conn = this->shared_from_this();
    ex->srv = srv_;
    ex->req.remote = remote_;
    ex->start = parser_ && parser_->is_header_done() ? first_byte_ : Clock::now();
    last_ = ex;  // for the access record
    return ex;
  }

  // The server's own error, then the connection closes (the rest of the request was not read).
  void refuse(int status, const std::string& message) {
    auto ex = exchange();
    ex->keep = false;
    ex->req.id = srv_->new_id();
    ex->req.method = "-";
    if (parser_ && parser_->is_header_done()) {
      const auto& m = parser_->get();
      ex->req.method = std::string(m.method_string());
      ex->req.target = std::string(m.target());
      ex->req.version = static_cast<int>(m.version());
    }
    handler_ = true;
    {
      Exchange e(ex);
      e.reply(srv_->error(status, message));
    }
  }

  void dispatch() {
    auto ex = exchange();
    auto& m = parser_->get();
    Request& r = ex->req;
    r.method = std::string(m.method_string());
    r.target = std::string(m.target());
    r.path = r.target.substr(0, r.target.find('?'));
    r.version = static_cast<int>(m.version());
    for (const auto& f : m) r.headers.push_back({std::string(f.name_string()), std::string(f.value())});
    r.body = std::move(m.body());
    const std::string* given = r.header("X-Request-Id");
    r.id = given != nullptr && plain_id(*given) ? *given : srv_->new_id();
    ex->keep = parser_->keep_alive();
    parser_.reset();
    handler_ = true;
    srv_->dispatch(ex);
  }

  void write_next() {
    if (out_.empty()) return;
    if (closed_ || broken) {  // nothing more reaches the client
      while (!out_.empty()) {
        Out o = std::move(out_.front());
        out_.pop_front();
        if (o.final) answered_ = true;
        if (o.done) o.done(false);
      }
      if (answered_ && !handler_) answer_ended();
      return;
    }
    writing_ = true;
    arm(srv_->lim.write_seconds);
    asio::async_write(stream_, asio::buffer(out_.front().data),
                      [self = this->shared_from_this()](auto ec, size_t n) { self->written(ec, n); });
  }

  void written(boost::system::error_code ec, size_t n) {
    writing_ = false;
    disarm();
    bytes_ += n;
    Out o = std::move(out_.front());
    out_.pop_front();
    if (ec) broken = true;
    if (o.done) o.done(!ec);
    if (o.final) answered_ = true;
    if (!out_.empty()) return write_next();
    if (answered_ && !handler_) answer_ended();
  }

  // The answer was written (or could not be) and its handler returned: log it, then the next request.
  void answer_ended() {
    if (last_) {
      Access& a = last_->acc;
      a.id = last_->req.id;
      a.remote = last_->req.remote;
      a.method = last_->req.method;
      a.target = last_->req.target;
      a.version = last_->req.version;
      a.total_seconds = since(last_->start);
      a.bytes = bytes_;
      if (srv_->access_log) srv_->access_log(a);
      last_.reset();
    }
    bytes_ = 0;
    if (broken || closed_ || !keep_ || srv_->draining) return close();
    read_request();
  }

  void close() {
    if (handler_) {  // the handler may still poll the socket: close it once it returns
      closed_ = true;
      broken = true;
      cancel();
      return;
    }
    if (done_) return;
    done_ = true;
    closed_ = true;
    broken = true;
    disarm();
    boost::system::error_code ec;
    auto& s = beast::get_lowest_layer(stream_);
    s.shutdown(asio::socket_base::shutdown_both, ec);
    s.close(ec);
    fd = -1;
    last_.reset();
    for (Out& o : out_)
      if (o.done) o.done(false);
    out_.clear();
    srv_->conns.erase(this);
    --srv_->n_conns;
    srv_->check_drained();
  }

  static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
  std::shared_ptr<Server::Impl> srv_;
  Stream stream_;
  asio::steady_timer timer_;
  std::string remote_;
  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<Out> out_;
  std::shared_ptr<Exchange::Impl> last_;
  Clock::time_point first_byte_ = Clock::now();
  uint64_t gen_ = 0, bytes_ = 0;
  bool timed_out_ = false, idle_ = false, writing_ = false, handler_ = false, answered_ = false, keep_ = true,
       closed_ = false, done_ = false;
};

std::string remote_of(const tcp::socket& s) {
  boost::system::error_code ec;
  const tcp::endpoint e = s.remote_endpoint(ec);
  if (ec) return "-";
  const std::string a = e.address().to_string();
  return (e.address().is_v6() ? "[" + a + "]" : a) + ":" + std::to_string(e.port());
}

}  // namespace

void Server::Impl::dispatch(const std::shared_ptr<Exchange::Impl>& ex) {
  const Request& r = ex->req;
  auto answer_now = [&](Response res) {
    Exchange e(ex);
    e.reply(std::move(res));
  };
  ex->acc.id = r.id;
  ex->acc.remote = r.remote;
  ex->acc.method = r.method;
  ex->acc.target = r.target;
  ex->acc.version = r.version;
  if (before) {
    Response res;
    if (before(r, res)) return answer_now(std::move(res));
  }
  const Route* found = nullptr;
  std::string allow;
  for (const Route& rt : routes) {
    const bool match = rt.prefix
                           ? r.path.compare(0, rt.path.size(), rt.path) == 0 && r.path.size() > rt.path.size()
                           : r.path == rt.path;
    if (!match) continue;
    if (rt.method == r.method || (r.method == "HEAD" && rt.method == "GET")) {
      found = &rt;
      break;
    }
    if (allow.find(rt.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + rt.method;
  }
  if (found == nullptr && !allow.empty()) {
    Response res = error(405, "method " + r.method + " is not allowed on " + r.path + " (use " + allow + ")");
    res.headers.push_back({"Allow", allow});
    return answer_now(std::move(res));
  }
  if (found == nullptr) return answer_now(error(404, "no route " + r.method + " " + r.path));
  if (found->run == Run::Inline) {
    Exchange e(ex);
    try {
      found->h(e);
    } catch (const std::exception& err) {
      e.reply(error(500, err.what()));
    }
    return;
  }
  if (n_handlers.fetch_add(1) >= lim.max_handlers) {
    --n_handlers;
    return answer_now(error(503, "the server is busy: " + std::to_string(lim.max_handlers) +
                                     " requests are being handled; retry later"));
  }
  std::thread([self = shared_from_this(), ex, h = found->h, work = asio::make_work_guard(io)]() mutable {
    {
      Exchange e(ex);
      try {
        h(e);
      } catch (const std::exception& err) {
        e.reply(self->error(500, err.what()));
      }
    }
    {
      std::lock_guard<std::mutex> l(self->hm);
      --self->n_handlers;
      self->hcv.notify_all();
    }
    asio::post(self->io, [self] { self->check_drained(); });
    work.reset();
  }).detach();
}

template <typename Acceptor, typename Make>
void Server::Impl::accept(Acceptor& acc, Make make) {
  acc.async_accept([this, &acc, make, self = shared_from_this()](auto ec, auto socket) mutable {
    if (!acc.is_open()) return;
    if (ec) {  // e.g. out of descriptors: try again shortly rather than spin
      auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(50));
      t->async_wait([this, &acc, make, t, self](auto) { accept(acc, make); });
      return;
    }
    if (n_conns >= lim.max_connections || draining) {
      boost::system::error_code ignored;
      socket.close(ignored);
    } else {
      make(std::move(socket));
    }
    accept(acc, make);
  });
}

Server::Server(Limits limits) : impl_(std::make_shared<Impl>(limits)) {}

Server::~Server() {
  std::unique_lock<std::mutex> l(impl_->hm);
  impl_->hcv.wait(l, [&] { return impl_->n_handlers == 0; });
}

void Server::route(const std::string& method, const std::string& path, Handler h, Run run) {
  const bool prefix = !path.empty() && path.back() == '*';
  impl_->routes.push_back(
      {method, prefix ? path.substr(0, path.size() - 1) : path, prefix, std::move(h), run});
}
void Server::before(std::function<bool(const Request&, Response&)> f) {
  impl_->before = std::move(f);
}
void Server::decorate(std::function<void(const Request&, Response&)> f) {
  impl_->decorate = std::move(f);
}
void Server::error_format(std::function<std::string(int, const std::string&)> f) {
  impl_->error_format = std::move(f);
}
void Server::access_log(std::function<void(const Access&)> f) {
  impl_->access_log = std::move(f);
}
int Server::port() const {
  return impl_->port;
}

std::string Server::listen(const Endpoint& e) {
  Impl& s = *impl_;
  const bool tls = !e.cert_file.empty() || !e.key_file.empty();
  if (tls) {
    if (e.cert_file.empty() || e.key_file.empty()) fail("TLS needs both --ssl-cert-file and --ssl-key-file");
    s.tls.emplace(asio::ssl::context::tls_server);
    s.tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
    for (const std::string* f : {&e.cert_file, &e.key_file}) {
      const int fd = ::open(f->c_str(), O_RDONLY);
      if (fd < 0) fail("cannot read " + *f + " (TLS): " + std::strerror(errno));
      ::close(fd);
    }
    boost::system::error_code ec;
    s.tls->use_certificate_chain_file(e.cert_file, ec);
    if (ec) fail("--ssl-cert-file " + e.cert_file + " is not a PEM certificate chain (" + ec.message() + ")");
    s.tls->use_private_key_file(e.key_file, asio::ssl::context::pem, ec);
    if (ec)
      fail("--ssl-key-file " + e.key_file + " is not a PEM private key of that certificate (" + ec.message() +
           ")");
  }
  boost::system::error_code ec;
  if (e.host.rfind("unix:", 0) == 0) {
    if (tls) fail("TLS is for TCP addresses, not a Unix socket");
    s.unix_path = e.host.substr(5);
    if (s.unix_path.empty() || s.unix_path.size() >= sizeof(sockaddr_un::sun_path))
      fail("a Unix socket path is 1 to " + std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
    struct stat st {};
    if (::lstat(s.unix_path.c_str(), &st) == 0) {
      // A socket left by a server that is gone is replaced; one that answers, or another file, is not.
      unix_socket::socket probe(s.io);
      boost::system::error_code pec;
      probe.connect(unix_socket::endpoint(s.unix_path), pec);
      if (!S_ISSOCK(st.st_mode) || pec != boost::system::errc::connection_refused)
        fail("cannot listen on " + e.host + ": the path exists" +
             (S_ISSOCK(st.st_mode) ? " (a server answers there)" : " (not a socket)"));
      ::unlink(s.unix_path.c_str());
    }
    s.unix_acc.emplace(s.io);
    s.unix_acc->open(unix_socket(), ec);
    if (!ec) s.unix_acc->bind(unix_socket::endpoint(s.unix_path), ec);
    if (!ec) s.unix_acc->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) fail("cannot listen on " + e.host + ": " + ec.message());
    auto impl = impl_;
    s.accept(*s.unix_acc, [impl](unix_socket::socket sock) {
      std::make_shared<Connection<unix_socket::socket>>(impl, std::move(sock), "unix")->start();
    });
    return e.host;
  }
  tcp::resolver resolver(s.io);
  const auto results = resolver.resolve(e.host, std::to_string(e.port), tcp::resolver::passive, ec);
  if (ec || results.empty()) fail("cannot listen on " + e.host + ": not an address of this machine");
  const tcp::endpoint ep = results.begin()->endpoint();
  s.tcp_acc.emplace(s.io);
  s.tcp_acc->open(ep.protocol(), ec);
  // SO_REUSEADDR (a restarted server binds at once) but not SO_REUSEPORT (a second server on the same
  // port fails to start instead of silently taking half of the requests).
  if (!ec) s.tcp_acc->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.tcp_acc->bind(ep, ec);
  if (ec == boost::system::errc::address_in_use)
    fail("cannot listen on " + e.host + ":" + std::to_string(e.port) + ": the port is in use");
  if (ec == boost::system::errc::permission_denied)
    fail("cannot listen on " + e.host + ":" + std::to_string(e.port) +
         ": permission denied (a port below 1024?)");
  if (!ec) s.tcp_acc->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on " + e.host + ":" + std::to_string(e.port) + ": " + ec.message());
  s.port = s.tcp_acc->local_endpoint().port();
  auto impl = impl_;
  if (tls) {
    s.accept(*s.tcp_acc, [impl](tcp::socket sock) {
      std::string remote = remote_of(sock);
      using Tls = asio::ssl::stream<tcp::socket>;
      std::make_shared<Connection<Tls>>(impl, Tls(std::move(sock), *impl->tls), std::move(remote))->start();
    });
  } else {
    s.accept(*s.tcp_acc, [impl](tcp::socket sock) {
      std::string remote = remote_of(sock);
      std::make_shared<Connection<tcp::socket>>(impl, std::move(sock), std::move(remote))->start();
    });
  }
  const std::string host =
      ep.address().is_v6() ? "[" + ep.address().to_string() + "]" : ep.address().to_string();
  return std::string(tls ? "https://" : "http://") + host + ":" + std::to_string(s.port);
}

void Server::run() {
  impl_->io.run();
  std::unique_lock<std::mutex> l(impl_->hm);
  impl_->hcv.wait(l, [&] { return impl_->n_handlers == 0; });
  if (!impl_->unix_path.empty()) ::unlink(impl_->unix_path.c_str());
}

void Server::drain(double deadline_seconds, std::function<void()> on_deadline) {
  asio::post(impl_->io, [s = impl_, deadline_seconds, f = std::move(on_deadline)]() mutable {
    if (s->draining.exchange(true)) return;
    boost::system::error_code ec;
    if (s->tcp_acc) s->tcp_acc->close(ec);
    if (s->unix_acc) s->unix_acc->close(ec);
    const std::vector<ConnBase*> open(s->conns.begin(), s->conns.end());
    for (ConnBase* c : open) c->drain();
    s->on_deadline = std::move(f);
    s->drain_timer.emplace(s->io, seconds(deadline_seconds));
    s->drain_timer->async_wait([s](const boost::system::error_code& e) {
      if (e) return;
      if (s->on_deadline) s->on_deadline();
      s->drain_timer->expires_after(std::chrono::seconds(5));
      s->drain_timer->async_wait([s](const boost::system::error_code& e2) {
        if (e2) return;
        const std::vector<ConnBase*> left(s->conns.begin(), s->conns.end());
        for (ConnBase* c : left) c->force_close();
      });
    });
    s->check_drained();  // nothing open: done at once
  });
}

Server::Counts Server::counts() const {
  return {impl_->n_conns.load(), impl_->n_handlers.load()};
}

}  // namespace tessera::http
