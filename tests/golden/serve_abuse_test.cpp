// tessera serve against requests that misbehave (issue #31), on a real server process of the bundled
// model: each attack is sent on loopback while a well-behaved completion runs beside it, and both answers
// are checked: the attack's (status, a bounded error body, headers) and the completion's (200, the text it
// gets alone).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

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

const json kGood = {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"steps", 32}, {"block_length", 32}};

class ServeAbuse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);  // a client writing to a connection the server closed gets an error, not killed
    server_ = new ServerProcess("-m " + (test::source_dir() / "models" / "tessera-tiny").string(),
                                test::temp_dir("serve_abuse"));
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  // The well-behaved completion's text, alone (once) and while `attack` runs on another connection.
  static void with_good_request(const std::function<void()>& attack) {
    static const std::string alone = [] {
      auto c = client();
      auto r = c.Post("/v1/completions", kGood.dump(), "application/json");
      EXPECT_TRUE(r && r->status == 200);
      return r && r->status == 200 ? json::parse(r->body)["choices"][0]["text"].get<std::string>()
                                   : std::string();
    }();
    std::string beside;
    int status = 0;
    std::thread good([&] {
      auto c = client();
      auto r = c.Post("/v1/completions", kGood.dump(), "application/json");
      if (r) status = r->status;
      if (r && r->status == 200) beside = json::parse(r->body)["choices"][0]["text"].get<std::string>();
    });
    attack();
    good.join();
    EXPECT_EQ(status, 200);
    EXPECT_EQ(beside, alone);
  }
  static ServerProcess* server_;
};
ServerProcess* ServeAbuse::server_ = nullptr;

// Point 8: a 1 MB number, a 100 KB field name or a long path get a 4xx whose body stays small and names
// no library internals.
TEST_F(ServeAbuse, ErrorBodiesDoNotEchoTheirInput) {
  ASSERT_GT(server_->port(), 0);
  with_good_request([] {
    auto c = client();
    const std::string big_number = "{\"prompt\": \"x\", \"max_tokens\": 1" + std::string(1 << 20, '0') + "}";
    const std::string big_key = "{\"" + std::string(100000, 'k') + "\": 1}";
    for (const std::string& body : {big_number, big_key}) {
      auto r = c.Post("/v1/completions", body, "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 400);
      EXPECT_LT(r->body.size(), 1024u) << r->body.substr(0, 200);
      EXPECT_EQ(r->body.find("json.exception"), std::string::npos) << r->body.substr(0, 200);
    }
    auto nf = c.Get("/v1/" + std::string(6000, 'p'));
    ASSERT_TRUE(nf);
    EXPECT_EQ(nf->status, 404);
    EXPECT_LT(nf->body.size(), 1024u);
  });
}

// Point 8: a known route asked with another method is a 405 naming the methods it takes.
TEST_F(ServeAbuse, WrongMethodIs405WithAllow) {
  ASSERT_GT(server_->port(), 0);
  with_good_request([] {
    auto c = client();
    auto g = c.Get("/v1/chat/completions");
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 405);
    EXPECT_EQ(g->get_header_value("Allow"), "POST");
    EXPECT_NE(json::parse(g->body)["error"]["message"].get<std::string>().find("not allowed"),
              std::string::npos);
    auto p = c.Post("/health", "{}", "application/json");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->status, 405);
    EXPECT_EQ(p->get_header_value("Allow"), "GET");
    auto d = c.Delete("/v1/models");
    ASSERT_TRUE(d);
    EXPECT_EQ(d->status, 405);
    auto nf = c.Get("/v1/nothing");  // an unknown route stays a 404
    ASSERT_TRUE(nf);
    EXPECT_EQ(nf->status, 404);
  });
}

// Point 8: OpenAI's ids (chatcmpl- for chat, cmpl- for completions) and a system_fingerprint, in plain
// answers and in every streamed chunk.
TEST_F(ServeAbuse, IdsAndFingerprintAreOpenAis) {
  ASSERT_GT(server_->port(), 0);
  auto c = client();
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 16},
                     {"steps", 16},
                     {"block_length", 16}};
  auto r = c.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u) << j["id"];
  EXPECT_EQ(j["system_fingerprint"].get<std::string>().rfind("tessera-", 0), 0u);
  auto k = c.Post("/v1/completions", kGood.dump(), "application/json");
  ASSERT_TRUE(k);
  const json kj = json::parse(k->body);
  EXPECT_EQ(kj["id"].get<std::string>().rfind("cmpl-", 0), 0u) << kj["id"];
  EXPECT_EQ(kj["system_fingerprint"], j["system_fingerprint"]);
  json streamed = chat;
  streamed["stream"] = true;
  auto s = c.Post("/v1/chat/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(s);
  size_t chunks = 0;
  for (size_t at = s->body.find("data: {"); at != std::string::npos; at = s->body.find("data: {", at + 1)) {
    const size_t end = s->body.find('\n', at);
    const json ev = json::parse(s->body.substr(at + 6, end - at - 6));
    EXPECT_EQ(ev["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(ev["system_fingerprint"], j["system_fingerprint"]);
    ++chunks;
  }
  EXPECT_GT(chunks, 1u);
}

// Point 7: a body sent form-urlencoded (curl -d without a Content-Type) is read as JSON like any other,
// whatever its size (the HTTP library answered a bare 413 above 8 KiB).
TEST_F(ServeAbuse, FormEncodedBodyIsReadAsJson) {
  ASSERT_GT(server_->port(), 0);
  with_good_request([] {
    auto c = client();
    const std::string body = kGood.dump() + std::string(9000, ' ');
    auto r = c.Post("/v1/completions", body, "application/x-www-form-urlencoded");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  });
}

// The server's peak resident memory (VmHWM), in MiB.
double server_peak_mib(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

// Point 1: a chunked upload of 32 MB is cut at the 16 MiB limit (413) as a body with a Content-Length is,
// not read whole and parsed (it took 6 s and 810 MB).
TEST_F(ServeAbuse, ChunkedBodyOverTheLimitIs413) {
  ASSERT_GT(server_->port(), 0);
  with_good_request([] {
    auto c = client();
    const std::string piece(1 << 16, 'a');
    size_t sent = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post(
        "/v1/completions",
        [&](size_t, httplib::DataSink& sink) {  // no length: httplib's client sends it chunked
          if (sent == 0) sink.write("{\"prompt\": \"", 12);
          if (sent >= (size_t{32} << 20)) {
            sink.done();
            return true;
          }
          sent += piece.size();
          return sink.write(piece.data(), piece.size());
        },
        "application/json");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The server answers as soon as the limit is passed and closes the connection; the client may see
    // the 413 or, still writing, a closed connection.
    if (r) {
      EXPECT_EQ(r->status, 413);
      EXPECT_NE(r->body.find("exceeds 16 MiB"), std::string::npos) << r->body;
    }
    EXPECT_LT(sent, size_t{32} << 20);  // it stopped reading before the end
    EXPECT_LT(s, 20.0);
  });
  EXPECT_LT(server_peak_mib(server_->pid()), 400.0);
}

// Point 5: 15 MiB of '[' (it took 16.6 s and 1.25 GB to parse) is refused before parsing, and a 15 MB
// prompt (8 s and +424 MB) before tokenizing.
TEST_F(ServeAbuse, DeepNestingAndHugePromptsAreRefusedUnparsed) {
  ASSERT_GT(server_->port(), 0);
  with_good_request([] {
    auto c = client();
    auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post("/v1/completions", std::string(15 << 20, '['), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("deeper than"), std::string::npos) << r->body;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    std::string prompt;
    for (int i = 0; i < 2500000; ++i) prompt += "hello ";
    t0 = std::chrono::steady_clock::now();
    auto p =
        c.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 8}}.dump(), "application/json");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->status, 400);
    EXPECT_NE(p->body.find("not tokenized"), std::string::npos) << p->body;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  });
  EXPECT_LT(server_peak_mib(server_->pid()), 400.0);
}

// Point 4: admission control. With --parallel 2 --max-queue 1, two long requests generate, a third waits
// for them, and the next ones get 503 with Retry-After at once; a request that asks for more sequences
// than --parallel alone is a 400; every admitted request is answered.
TEST(ServeAdmission, BeyondParallelAndQueueRequestsGet503) {
  ServerProcess server("-m " + (test::source_dir() / "models" / "tessera-tiny").string() +
                           " --batch 2 --parallel 2 --max-queue 1",
                       test::temp_dir("serve_admission"));
  ASSERT_GT(server.port(), 0);
  auto client = [&] {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(120, 0);
    return c;
  };
  auto admission = [&] {
    auto c = client();
    auto r = c.Get("/health");
    return r ? json::parse(r->body)["admission"] : json();
  };
  auto wait_for = [&](const char* key, int value) {
    for (int i = 0; i < 1000; ++i) {
      if (admission()[key] == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  // Random unmasking decides the answer's first tokens late: about 120 of its 200 steps run even when it
  // is short, seconds on this model.
  const json long_request = {{"prompt", "Once upon a time"},
                             {"max_tokens", 200},
                             {"steps", 200},
                             {"block_length", 200},
                             {"alg", "random"}};
  int status[3] = {0, 0, 0};
  std::vector<std::thread> admitted;
  for (int i = 0; i < 3; ++i) {
    admitted.emplace_back([&, i] {
      auto c = client();
      auto r = c.Post("/v1/completions", long_request.dump(), "application/json");
      status[i] = r ? r->status : -1;
    });
    ASSERT_TRUE(wait_for(i < 2 ? "running" : "waiting", i < 2 ? i + 1 : 1)) << admission().dump();
  }
  auto c = client();
  // Point 3: every slot busy and the queue full, /health and /metrics are answered at once (the I/O
  // thread answers them; no worker is needed).
  for (const char* path : {"/health", "/metrics", "/health"}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = c.Get(path);
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5) << path;
  }
  for (int i = 0; i < 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Post("/v1/completions", long_request.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_NE(r->body.find("busy"), std::string::npos) << r->body;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  }
  json three = long_request;
  three["n"] = 3;
  auto big = c.Post("/v1/completions", three.dump(), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 400);
  EXPECT_NE(big->body.find("at most 2 at once"), std::string::npos) << big->body;
  for (auto& t : admitted) t.join();
  EXPECT_EQ(status[0], 200);
  EXPECT_EQ(status[1], 200);
  EXPECT_EQ(status[2], 200);
  EXPECT_EQ(admission()["refused"], 2);
  // A handler gives its slot back just after its answer is queued for writing, so the client can read
  // the answer a moment before the count drops.
  EXPECT_TRUE(wait_for("running", 0)) << admission().dump();
}

}  // namespace
}  // namespace tessera
