// tessera serve against requests that misbehave (issue #31), on a real server process of the bundled
// model: each attack is sent on loopback while a well-behaved completion runs beside it, and both answers
// are checked: the attack's (status, a bounded error body, headers) and the completion's (200, the text it
// gets alone).
#include <gtest/gtest.h>
#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

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

// Point 7: a body sent form-urlencoded (curl -d without a Content-Type) above the HTTP library's 8 KiB
// gets a 413 that says why and what to send instead.
TEST_F(ServeAbuse, FormEncodedBodyOver8KiBSaysWhy) {
  ASSERT_GT(server_->port(), 0);
  with_good_request([] {
    auto c = client();
    const std::string body = json{{"prompt", std::string(9000, 'a')}, {"max_tokens", 8}}.dump();
    auto r = c.Post("/v1/completions", body, "application/x-www-form-urlencoded");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_NE(r->body.find("Content-Type: application/json"), std::string::npos) << r->body;
  });
}

}  // namespace
}  // namespace tessera
