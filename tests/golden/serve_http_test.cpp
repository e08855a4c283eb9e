// tessera serve's HTTP layer under clients that misbehave (issue #31), on real server processes of the
// bundled model, over raw sockets where a client library would not misbehave: slow and idle connections,
// pipelining, HTTP/1.0 streams, ambiguous lengths, Expect: 100-continue, the configurable limits, request
// ids and the access log, /slots, the per-request --timeout, graceful drain with 40 requests, API keys,
// TLS and a Unix socket. Each attack is bounded in count and time, and well-behaved requests beside it
// are checked to succeed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using test::ServerProcess;
using Clock = std::chrono::steady_clock;

const json kGood = {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"steps", 32}, {"block_length", 32}};
// About 120 of its 200 steps run (random order, greedy tokens: the answer's end is decided late): seconds
// on this model.
const json kLong = {{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"steps", 200},
                    {"block_length", 200},          {"alg", "random"},   {"temperature", 0}};

std::string tiny() {
  return "-m " + (test::source_dir() / "models" / "tessera-tiny").string();
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A raw TCP connection to the server.
class Raw {
 public:
  explicit Raw(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Raw() { ::close(fd_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  bool ok() const { return ok_; }
  bool send(const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }
  // What arrives within `seconds`, until the server closes (closed() then) or `until` appears.
  std::string read(double seconds, const std::string& until = "") {
    std::string got;
    const auto t0 = Clock::now();
    while (since(t0) < seconds) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
      if (!until.empty() && got.find(until) != std::string::npos) break;
    }
    return got;
  }
  bool closed() const { return closed_; }

 private:
  int fd_;
  bool ok_ = false, closed_ = false;
};

std::string post_text(const std::string& path, const std::string& body, const std::string& extra = "",
                      const char* version = "HTTP/1.1") {
  return "POST " + path + " " + version +
         "\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra + "\r\n" + body;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string file_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The completion text of an SSE stream's events.
std::string streamed_text(const std::string& body) {
  std::string text;
  for (size_t at = body.find("data: {"); at != std::string::npos; at = body.find("data: {", at + 1)) {
    const json j = json::parse(body.substr(at + 6, body.find("\n\n", at) - at - 6));
    if (j.contains("choices") && !j["choices"].empty()) text += j["choices"][0].value("text", "");
  }
  return text;
}

class ServeHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    dir_ = new std::filesystem::path(test::temp_dir("serve_http"));
    server_ = new ServerProcess(
        tiny() + " --header-timeout 1.5 --max-body 64K --max-sequences 4 --max-tokens 64", *dir_);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  static std::string good_text() {
    static const std::string text = [] {
      auto c = client();
      auto r = c.Post("/v1/completions", kGood.dump(), "application/json");
      return r && r->status == 200 ? json::parse(r->body)["choices"][0]["text"].get<std::string>() : "?";
    }();
    return text;
  }
  // Runs `attack` while a well-behaved completion runs on another connection; checks that it got the text
  // it gets alone.
  static void beside_good(const std::function<void()>& attack) {
    const std::string want = good_text();
    std::string got;
    int status = 0;
    std::thread good([&] {
      auto c = client();
      auto r = c.Post("/v1/completions", kGood.dump(), "application/json");
      status = r ? r->status : -1;
      if (r && r->status == 200) got = json::parse(r->body)["choices"][0]["text"];
    });
    attack();
    good.join();
    EXPECT_EQ(status, 200);
    EXPECT_EQ(got, want);
  }
  static ServerProcess* server_;
  static std::filesystem::path* dir_;
};
ServerProcess* ServeHttp::server_ = nullptr;
std::filesystem::path* ServeHttp::dir_ = nullptr;

// Point 3: 30 slowloris connections (a header dribbled a byte at a time) and 60 idle keep-alive sockets
// hold no worker: /health answers at once, a completion gets its text, the slow ones get 408 at the
// header deadline, and an idle connection still serves a request when it sends one.
TEST_F(ServeHttp, SlowAndIdleClientsHoldNoWorker) {
  ASSERT_GT(server_->port(), 0);
  const std::string want = good_text();
  std::vector<std::unique_ptr<Raw>> slow, idle;
  for (int i = 0; i < 30; ++i) {
    slow.push_back(std::make_unique<Raw>(server_->port()));
    ASSERT_TRUE(slow.back()->ok());
    slow.back()->send("POST /v1/completions HTTP/1.1\r\nHost: t\r\n");
  }
  for (int i = 0; i < 60; ++i) {
    idle.push_back(std::make_unique<Raw>(server_->port()));
    ASSERT_TRUE(idle.back()->ok());
  }
  std::atomic<bool> dribble{true};
  std::thread t([&] {
    while (dribble) {
      for (auto& s : slow) s->send("X");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto c = client();
  for (int i = 0; i < 10; ++i) {
    const auto t0 = Clock::now();
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(since(t0), 0.5);
  }
  auto r = c.Post("/v1/completions", kGood.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], want);
  int timed_out = 0;
  for (auto& s : slow) {
    const std::string got = s->read(4.0, "\r\n\r\n");
    timed_out += got.rfind("HTTP/1.1 408", 0) == 0;
  }
  dribble = false;
  t.join();
  EXPECT_EQ(timed_out, 30);
  ASSERT_TRUE(idle[7]->send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(idle[7]->read(5.0, "\"status\"").rfind("HTTP/1.1 200", 0), 0u);
}

// Point 6: two pipelined requests are both answered, in order; the second's Connection: close ends it.
TEST_F(ServeHttp, PipelinedRequestsAreAnsweredInOrder) {
  beside_good([&] {
    Raw s(server_->port());
    ASSERT_TRUE(s.ok());
    s.send(
        "GET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\nX-Request-Id: "
        "second\r\n"
        "Connection: close\r\n\r\n");
    const std::string got = s.read(10.0);
    EXPECT_TRUE(s.closed());
    EXPECT_EQ(count(got, "HTTP/1.1 200 OK"), 2u) << got;
    const size_t health = got.find("\"admission\""), models = got.find("\"object\":\"list\"");
    ASSERT_NE(health, std::string::npos) << got;
    ASSERT_NE(models, std::string::npos) << got;
    EXPECT_LT(health, models);
    EXPECT_NE(got.find("X-Request-Id: second"), std::string::npos);
  });
}

// Point 6: a stream to an HTTP/1.0 client is sent until close, not chunked, and holds the same text.
TEST_F(ServeHttp, Http10StreamIsNotChunked) {
  json req = kGood;
  req["stream"] = true;
  Raw s(server_->port());
  ASSERT_TRUE(s.ok());
  s.send(post_text("/v1/completions", req.dump(), "", "HTTP/1.0"));
  const std::string got = s.read(30.0);
  EXPECT_TRUE(s.closed());
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 300);
  EXPECT_EQ(got.find("Transfer-Encoding"), std::string::npos);
  EXPECT_NE(got.find("Connection: close"), std::string::npos);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(streamed_text(got.substr(got.find("\r\n\r\n"))), good_text());
}

// Point 6: two Content-Length fields, or Content-Length with Transfer-Encoding, are a 400 that closes
// the connection (a proxy and this server could read different requests from them).
TEST_F(ServeHttp, AmbiguousLengthsAre400) {
  beside_good([&] {
    for (const std::string& extra :
         {std::string("Content-Length: 2\r\n"), std::string("Transfer-Encoding: chunked\r\n")}) {
      Raw s(server_->port());
      ASSERT_TRUE(s.ok());
      s.send(post_text("/v1/completions", "{}", extra));
      const std::string got = s.read(5.0);
      EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
      EXPECT_TRUE(s.closed());
    }
  });
}

// curl sends Expect: 100-continue before a large body: the server says 100 Continue, then answers.
TEST_F(ServeHttp, ExpectContinueIsHonoured) {
  beside_good([&] {
    const std::string body = kGood.dump();
    Raw s(server_->port());
    ASSERT_TRUE(s.ok());
    s.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(s.read(5.0, "\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
    s.send(body);
    const std::string got = s.read(30.0);
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  });
}

// --max-body 64K: a larger body is a 413 whether it has a Content-Length (refused before it is read) or
// comes chunked; --max-sequences and --max-tokens are checked before any prompt is tokenized.
TEST_F(ServeHttp, LimitsAreConfigurable) {
  beside_good([&] {
    const std::string big = "{\"prompt\": \"" + std::string(100000, 'a') + "\"}";
    {
      Raw s(server_->port());
      s.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(big.size()) +
             "\r\n\r\n");
      const std::string got = s.read(5.0);
      EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
      EXPECT_NE(got.find("exceeds 65536 bytes"), std::string::npos) << got;
    }
    {
      Raw s(server_->port());
      s.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", big.size());
      s.send(size + big + "\r\n0\r\n\r\n");
      EXPECT_EQ(s.read(5.0).rfind("HTTP/1.1 413", 0), 0u);
    }
    auto c = client();
    const json five = {{"prompt", {"a", "b", "c", "d", "e"}}, {"max_tokens", 8}};
    auto r = c.Post("/v1/completions", five.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("at most 4 choices"), std::string::npos) << r->body;
    const json two_n = {{"prompt", "a"}, {"n", 5}, {"max_tokens", 8}};
    r = c.Post("/v1/completions", two_n.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    const json longer = {{"prompt", "a"}, {"max_tokens", 100}};
    r = c.Post("/v1/completions", longer.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("--max-tokens"), std::string::npos) << r->body;
  });
}

// Every answer names its request (the client's plain X-Request-Id, else a new one), and each request is
// one access-log line: id, client, request line, status, tokens, times, bytes.
TEST_F(ServeHttp, RequestIdsAndAccessLog) {
  auto c = client();
  auto r = c.Post("/v1/completions", {{"X-Request-Id", "trace-42.a"}}, kGood.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "trace-42.a");
  auto odd = c.Get("/health", {{"X-Request-Id", "two words"}});
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->get_header_value("X-Request-Id").rfind("req-", 0), 0u);
  std::string log;
  for (int i = 0; i < 50 && log.find("trace-42.a") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = file_text(*dir_ / "serve.log");
  }
  const size_t at = log.find("trace-42.a");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find("127.0.0.1:"), std::string::npos) << line;
  EXPECT_NE(line.find("\"POST /v1/completions HTTP/1.1\" 200 prompt="), std::string::npos) << line;
  EXPECT_NE(line.find(" completion="), std::string::npos) << line;
  EXPECT_NE(line.find(" total="), std::string::npos) << line;
}

// /slots lists the requests being answered, with their state and steps.
TEST_F(ServeHttp, SlotsShowTheRequestsRunning) {
  json req = kLong;
  req["max_tokens"] = 64;
  req["steps"] = 64;
  req["block_length"] = 64;
  std::thread t([&] {
    auto c = client();
    c.Post("/v1/completions", {{"X-Request-Id", "slot-probe"}}, req.dump(), "application/json");
  });
  auto c = client();
  json seen;
  for (int i = 0; i < 400; ++i) {
    auto r = c.Get("/slots");
    ASSERT_TRUE(r);
    const json j = json::parse(r->body);
    for (const json& s : j["requests"])
      if (s["id"] == "slot-probe" && s["steps"].get<int>() > 0) seen = s;
    if (!seen.is_null()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  t.join();
  ASSERT_FALSE(seen.is_null());
  EXPECT_EQ(seen["state"], "running");
  EXPECT_EQ(seen["route"], "/v1/completions");
  EXPECT_EQ(seen["sequences"], 1);
}

// --timeout: a request that runs longer ends cleanly, a 504 (streamed: an error event, then [DONE]);
// a short one beside it is answered.
TEST(ServeTimeout, LongRequestsEndWith504) {
  ServerProcess server(tiny() + " --timeout 0.5", test::temp_dir("serve_timeout"));
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);
  auto t0 = Clock::now();
  auto r = c.Post("/v1/completions", kLong.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_NE(r->body.find("--timeout"), std::string::npos);
  EXPECT_LT(since(t0), 3.0);
  json streamed = kLong;
  streamed["stream"] = true;
  auto s = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("\"type\":\"timeout\""), std::string::npos) << s->body.substr(0, 500);
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos);
  auto ok = c.Post("/v1/completions",
                   json{{"prompt", "Hi"}, {"max_tokens", 8}, {"steps", 8}, {"block_length", 8}}.dump(),
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("tessera_requests_total{result=\"timeout\"} 2"), std::string::npos) << m->body;
}

// Point 2: SIGTERM with 40 requests accepted (32 generating, 8 waiting): every one is answered whole,
// new connections are refused, and the process exits by itself.
TEST(ServeDrain, FortyRequestsFinishOnSigterm) {
  const auto dir = test::temp_dir("serve_drain");
  ServerProcess server(tiny() + " --batch 8 --parallel 32 --max-queue 16", dir);
  ASSERT_GT(server.port(), 0);
  // Greedy low-confidence decoding (the bundled model samples by default and may end an answer at EOS
  // early): every request runs its 16 steps, so all 40 are in flight together.
  const json small = {{"prompt", "Once upon a time"}, {"max_tokens", 16},        {"steps", 16},
                      {"block_length", 16},           {"alg", "low_confidence"}, {"temperature", 0}};
  std::string alone;
  {
    httplib::Client c("127.0.0.1", server.port());
    auto r = c.Post("/v1/completions", small.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200);
    alone = json::parse(r->body)["choices"][0]["text"];
  }
  std::vector<int> status(40, 0);
  std::vector<std::string> text(40);
  std::vector<std::thread> ts;
  for (int i = 0; i < 40; ++i) {
    ts.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", server.port());
      c.set_read_timeout(120, 0);
      auto r = c.Post("/v1/completions", small.dump(), "application/json");
      status[i] = r ? r->status : -1;
      if (r && r->status == 200) text[i] = json::parse(r->body)["choices"][0]["text"];
    });
  }
  httplib::Client h("127.0.0.1", server.port());
  json adm;
  for (int i = 0; i < 5000; ++i) {
    auto r = h.Get("/slots");
    if (r) adm = json::parse(r->body);
    if (r && adm["requests"].size() == 40u) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(adm["requests"].size(), 40u) << "not every request was accepted before SIGTERM: " << adm.dump();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  for (auto& t : ts) t.join();
  int answered = 0;
  for (int i = 0; i < 40; ++i) answered += status[i] == 200 && text[i] == alone;
  EXPECT_EQ(answered, 40) << "accepted requests lost at SIGTERM (requests seen before it: "
                          << adm["requests"].size() << ")";
  httplib::Client late("127.0.0.1", server.port());
  late.set_connection_timeout(2, 0);
  EXPECT_FALSE(late.Get("/health")) << "a new connection was served after SIGTERM";
  for (int i = 0; i < 100 && server.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(server.alive());
  EXPECT_NE(file_text(dir / "serve.log").find("tessera serve: stopped\n"), std::string::npos);
}

// The drain deadline: requests still generating when it passes end with 503, waiting ones too, and the
// process exits within the deadline and its grace.
TEST(ServeDrain, DeadlineEndsTheRestWith503) {
  ServerProcess server(tiny() + " --batch 2 --parallel 2 --max-queue 4 --drain-timeout 0.5",
                       test::temp_dir("serve_drain_deadline"));
  ASSERT_GT(server.port(), 0);
  std::vector<int> status(4, 0);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", server.port());
      c.set_read_timeout(120, 0);
      auto r = c.Post("/v1/completions", kLong.dump(), "application/json");
      status[i] = r ? r->status : -1;
    });
  }
  httplib::Client h("127.0.0.1", server.port());
  json seen;
  for (int i = 0; i < 5000; ++i) {
    auto r = h.Get("/slots");
    if (r) seen = json::parse(r->body);
    if (r && seen["requests"].size() == 4u && seen["running"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(seen["running"], 2) << seen.dump();
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  for (auto& t : ts) t.join();
  EXPECT_LT(since(t0), 4.0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(status[i], 503) << i;
  for (int i = 0; i < 60 && server.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(server.alive());
}

// --api-key / --api-key-file: OpenAI's Bearer header, 401 with WWW-Authenticate otherwise; /health open.
TEST(ServeAuth, ApiKeysGuardEveryRouteButHealth) {
  const auto dir = test::temp_dir("serve_auth");
  std::ofstream(dir / "keys") << "# the team's keys\nsk-file-1\n\n";
  ServerProcess server(tiny() + " --api-key sk-flag --api-key-file " + (dir / "keys").string(), dir);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  for (const char* path : {"/v1/models", "/metrics", "/slots"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  }
  auto wrong =
      c.Post("/v1/completions", {{"Authorization", "Bearer sk-flag2"}}, kGood.dump(), "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_NE(wrong->body.find("incorrect API key"), std::string::npos) << wrong->body;
  for (const char* key : {"sk-flag", "sk-file-1"}) {
    auto r = c.Post("/v1/completions", {{"Authorization", std::string("Bearer ") + key}}, kGood.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << key;
  }
  std::string out;
  EXPECT_NE(test::run_command(std::string(TESSERA_BINARY) + " serve " + tiny() + " --port 0 --api-key-file " +
                                  (dir / "none").string() + " 2>&1",
                              &out),
            0);
  EXPECT_NE(out.find("cannot read --api-key-file"), std::string::npos) << out;
}

// TLS with --ssl-cert-file / --ssl-key-file, checked with curl against the certificate (made here with
// openssl); a plain-HTTP client on the TLS port is closed without harm.
TEST(ServeTls, HttpsWithTheGivenCertificate) {
  std::string out;
  if (test::run_command("command -v openssl && command -v curl", &out) != 0)
    GTEST_SKIP() << "openssl or curl is not installed (scripts/deps.sh installs both)";
  const auto dir = test::temp_dir("serve_tls");
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  ASSERT_EQ(test::run_command("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 -addext "
                              "subjectAltName=IP:127.0.0.1 -keyout " +
                                  key + " -out " + cert + " 2>&1",
                              &out),
            0)
      << out;
  ServerProcess server(tiny() + " --ssl-cert-file " + cert + " --ssl-key-file " + key, dir);
  ASSERT_GT(server.port(), 0);
  EXPECT_NE(file_text(dir / "serve.log").find("on https://127.0.0.1:"), std::string::npos);
  {
    Raw plain(server.port());
    plain.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
    plain.read(3.0);
    EXPECT_TRUE(plain.closed());
  }
  const std::string url = "https://127.0.0.1:" + std::to_string(server.port());
  ASSERT_EQ(test::run_command("curl -sS --cacert " + cert + " " + url + "/health", &out), 0) << out;
  EXPECT_NE(out.find("\"status\":\"ok\""), std::string::npos) << out;
  ASSERT_EQ(test::run_command("curl -sS --cacert " + cert + " " + url +
                                  "/v1/completions -H 'Content-Type: "
                                  "application/json' -d '" +
                                  kGood.dump() + "'",
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("\"text_completion\""), std::string::npos) << out;
  EXPECT_NE(test::run_command("curl -sS " + url + "/health 2>&1", &out), 0)
      << "an unknown certificate was trusted";
  EXPECT_NE(test::run_command(std::string(TESSERA_BINARY) + " serve " + tiny() +
                                  " --port 0 --ssl-cert-file " + cert + " 2>&1",
                              &out),
            0);
  EXPECT_NE(out.find("TLS needs both"), std::string::npos) << out;
}

// --host unix:PATH: the API on a Unix socket (curl --unix-socket); a second server on the same path
// fails to start; the socket file is removed at exit.
TEST(ServeUnix, ApiOnAUnixSocket) {
  std::string out;
  if (test::run_command("command -v curl", &out) != 0) GTEST_SKIP() << "curl is not installed";
  const auto dir = test::temp_dir("serve_unix");
  const std::string sock = (dir / "tessera.sock").string();
  {
    ServerProcess server(tiny() + " --host unix:" + sock, dir);
    ASSERT_TRUE(server.ready());
    ASSERT_EQ(test::run_command("curl -sS --unix-socket " + sock + " http://localhost/health", &out), 0)
        << out;
    EXPECT_NE(out.find("\"status\":\"ok\""), std::string::npos) << out;
    ASSERT_EQ(test::run_command("curl -sS --unix-socket " + sock +
                                    " http://localhost/v1/completions -H "
                                    "'Content-Type: application/json' -d '" +
                                    kGood.dump() + "'",
                                &out),
              0);
    EXPECT_NE(out.find("\"text_completion\""), std::string::npos) << out;
    EXPECT_NE(test::run_command(
                  std::string(TESSERA_BINARY) + " serve " + tiny() + " --host unix:" + sock + " 2>&1", &out),
              0);
    EXPECT_NE(out.find("a server answers there"), std::string::npos) << out;
    ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
    for (int i = 0; i < 100 && server.alive(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(std::filesystem::exists(sock));
}

}  // namespace
}  // namespace tessera
