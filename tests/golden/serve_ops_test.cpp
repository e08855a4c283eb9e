// tessera serve's operations end to end, on real server processes of the bundled model: a graceful
// SIGTERM, clients that go away, /metrics, model retrieval and CORS.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_client.h"
#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using test::client_of;
using test::events;
using test::expect_refused;
using test::post;
using test::ServerProcess;
using test::tiny_dir;
using test::tiny_server;

// SIGTERM stops the server gracefully: the request in flight finishes whole, new connections are
// refused, and the process ends saying so.
TEST(Serve, SigtermLetsTheRequestsInFlightFinish) {
  const auto tmp = test::temp_dir("serve-sigterm");
  // A drain deadline far beyond the request (30 s by default; sanitized builds run it slower than that).
  ServerProcess server("-m " + tiny_dir().string() + " --drain-timeout 600", tmp);
  ASSERT_GT(server.port(), 0);
  json done;
  std::thread request([&] {
    httplib::Client c = client_of(server, 600);  // sanitized builds take over a minute for it
    done = post(c, "/v1/completions",
                json{{"prompt", "Once"},
                     {"max_tokens", 440},
                     {"block_length", 440},
                     {"alg", "low_confidence"},  // every step runs: greedy, no EOS before the end
                     {"temperature", 0}}
                    .dump(),
                200);
  });
  {
    httplib::Client h("127.0.0.1", server.port());
    h.set_keep_alive(false);
    for (int i = 0; i < 500; ++i) {
      auto r = h.Get("/health");
      if (r && json::parse(r->body)["batch"]["forwards"].get<int>() >= 5) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  request.join();
  EXPECT_EQ(done["usage"]["completion_tokens"], 440) << done.dump();
  EXPECT_EQ(done["tessera"]["steps"], 440);
  httplib::Client late("127.0.0.1", server.port());
  late.set_connection_timeout(2, 0);
  EXPECT_FALSE(late.Get("/health")) << "a new connection was served after SIGTERM";
  std::string log;
  for (int i = 0; i < 100 && log.find("tessera serve: stopped\n") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream f(tmp / "serve.log");
    log.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  EXPECT_NE(log.find("stopping: new connections are refused"), std::string::npos) << log;
  EXPECT_NE(log.find("tessera serve: stopped\n"), std::string::npos) << log;
}

// A client that goes away ends its request: a plain one (the server watches its connection) and a
// streamed one (an event cannot be written) stop generating well before their last step, /health counts
// them, and the server goes on serving.
TEST(Serve, RequestsEndWhenTheirClientGoesAway) {
  ServerProcess server = tiny_server("", "serve-gone");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  auto health = [&] {
    auto h = c.Get("/health");
    return h ? json::parse(h->body) : json();
  };
  const int steps = 440;  // tens of milliseconds each on the tiny model at this length
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "plain");
    const json before = health();
    ASSERT_TRUE(before.contains("requests_abandoned")) << before.dump();
    const std::string body =
        json{{"prompt", "Once"}, {"max_tokens", steps}, {"block_length", steps}, {"stream", stream}}.dump();
    const int fd = test::post_raw(server.port(), "/v1/completions", body);
    ASSERT_GE(fd, 0);
    const int64_t f0 = before["batch"]["forwards"].get<int64_t>();
    for (int i = 0; i < 400 && health()["batch"]["forwards"].get<int64_t>() < f0 + 5; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    close(fd);  // gone, after its first steps
    json after;
    for (int i = 0; i < 200; ++i) {
      after = health();
      if (after["requests_abandoned"] > before["requests_abandoned"]) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(after["requests_abandoned"].get<int>(), before["requests_abandoned"].get<int>() + 1)
        << after.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int64_t ran = health()["batch"]["forwards"].get<int64_t>() - f0;
    EXPECT_GE(ran, 5);
    EXPECT_LT(ran, steps / 2) << "the request ran on after its client left";
  }
  post(c, "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 8}}.dump(), 200);
}

// /metrics: Prometheus text whose counters add up what the requests' own usage reported (answered,
// refused, streamed), with nothing left in flight, and the engine's forwards as /health counts them.
TEST(Serve, MetricsCountTheRequestsAndTheirTokens) {
  ServerProcess server = tiny_server("", "serve_metrics");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  // The value of one sample line ("name{labels} value") of the exposition text.
  const auto sample = [](const std::string& text, const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) {
      ADD_FAILURE() << "no sample " << name << " in\n" << text;
      return -1.0;
    }
    return std::stod(text.substr(at + name.size() + 2));
  };
  const auto metrics = [&] {
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    if (r) {
      EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    }
    return r ? r->body : std::string();
  };
  const std::string before = metrics();
  EXPECT_EQ(sample(before, "tessera_requests_total{result=\"ok\"}"), 0);
  EXPECT_NE(before.find("# TYPE tessera_requests_total counter"), std::string::npos) << before;
  EXPECT_NE(before.find("# TYPE tessera_requests_in_flight gauge"), std::string::npos) << before;

  const json a =
      post(c, "/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 12}}.dump(), 200);
  const json b = post(
      c, "/v1/chat/completions",
      json{{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}}, {"max_tokens", 8}, {"n", 2}}
          .dump(),
      200);
  auto s = c.Post("/v1/completions",
                  json{{"prompt", "The dog"},
                       {"max_tokens", 8},
                       {"stream", true},
                       {"stream_options", {{"include_usage", true}}}}
                      .dump(),
                  "application/json");
  ASSERT_TRUE(s);
  const std::vector<std::string> ev = events(s->body);
  ASSERT_GE(ev.size(), 2u);
  const json su = json::parse(ev[ev.size() - 2]);
  ASSERT_TRUE(su.contains("usage")) << s->body;
  expect_refused(c, "/v1/completions", {{"prompt", "x"}, {"echo", true}}, "echo");

  const std::string after = metrics();
  SCOPED_TRACE(after);  // a failure below shows the whole exposition
  EXPECT_EQ(sample(after, "tessera_requests_total{result=\"ok\"}"), 3);
  EXPECT_EQ(sample(after, "tessera_requests_total{result=\"error\"}"), 1);
  EXPECT_EQ(sample(after, "tessera_requests_total{result=\"abandoned\"}"), 0);
  EXPECT_EQ(sample(after, "tessera_requests_in_flight"), 0);
  const auto sum = [&](const char* key) {
    return a["usage"][key].get<double>() + b["usage"][key].get<double>() + su["usage"][key].get<double>();
  };
  EXPECT_EQ(sample(after, "tessera_prompt_tokens_total"), sum("prompt_tokens"));
  EXPECT_EQ(sample(after, "tessera_completion_tokens_total"), sum("completion_tokens"));
  EXPECT_GT(sample(after, "tessera_completion_tokens_total"), 0);
  EXPECT_GT(sample(after, "tessera_request_seconds_total"), 0);
  const json h = json::parse(c.Get("/health")->body);
  EXPECT_EQ(sample(after, "tessera_forwards_total"), h["batch"]["forwards"].get<double>());
  EXPECT_GE(sample(after, "tessera_forward_sequences_total"), sample(after, "tessera_forwards_total"));
  EXPECT_GT(sample(after, "tessera_peak_rss_bytes"), 1e6);
  EXPECT_EQ(after.find("tessera_device_bytes_in_use"), std::string::npos) << "no GPU here";
}

// GET /v1/models/ID retrieves the served model (404 naming it for another); CORS answers browser pages
// of the --cors origins only: their preflight gets 204 with the methods and headers, their responses
// (streamed and errors too) name the origin; another origin, and every origin without --cors, gets none.
TEST(Serve, ModelRetrievalAndCorsForTheGivenOriginsOnly) {
  ServerProcess server = tiny_server(" --model-id tiny --cors http://app.example:3000", "serve_cors");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  auto m = c.Get("/v1/models/tiny");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(json::parse(m->body)["id"], "tiny");
  EXPECT_EQ(json::parse(m->body)["object"], "model");
  auto other = c.Get("/v1/models/gpt-4");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_NE(other->body.find("model 'gpt-4' is not served here; this server serves 'tiny'"),
            std::string::npos);

  const std::string page = "http://app.example:3000";
  auto pre =
      c.Options("/v1/chat/completions", {{"Origin", page},
                                         {"Access-Control-Request-Method", "POST"},
                                         {"Access-Control-Request-Headers", "content-type, authorization"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), page);
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "content-type, authorization");
  const std::string body = json{{"prompt", "Once"}, {"max_tokens", 4}, {"stream", true}}.dump();
  auto s = c.Post("/v1/completions", {{"Origin", page}}, body, "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_EQ(s->get_header_value("Access-Control-Allow-Origin"), page);
  EXPECT_EQ(s->get_header_value("Vary"), "Origin");
  EXPECT_FALSE(events(s->body).empty());
  auto err = c.Post("/v1/completions", {{"Origin", page}}, "{", "application/json");
  ASSERT_TRUE(err);
  EXPECT_EQ(err->status, 400);
  EXPECT_EQ(err->get_header_value("Access-Control-Allow-Origin"), page);

  const std::string stranger = "http://elsewhere.example";
  auto pre2 = c.Options("/v1/completions", {{"Origin", stranger}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(pre2);
  EXPECT_EQ(pre2->status, 405);  // a known route asked with a method it does not take (no preflight answer)
  EXPECT_FALSE(pre2->has_header("Access-Control-Allow-Origin"));
  auto g = c.Get("/v1/models", {{"Origin", stranger}});
  ASSERT_TRUE(g);
  EXPECT_FALSE(g->has_header("Access-Control-Allow-Origin"));

  ServerProcess plain = tiny_server("", "serve_no_cors");
  ASSERT_GT(plain.port(), 0);
  httplib::Client p = client_of(plain);
  auto pg = p.Get("/v1/models", {{"Origin", page}});
  ASSERT_TRUE(pg);
  EXPECT_FALSE(pg->has_header("Access-Control-Allow-Origin"));
  auto pp = p.Options("/v1/completions", {{"Origin", page}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(pp);
  EXPECT_EQ(pp->status, 405);
  EXPECT_EQ(pp->get_header_value("Allow"), "POST");

  std::string out;
  EXPECT_NE(test::run_command(std::string(TESSERA_BINARY) + " serve --port 0 --cors app.example 2>&1", &out),
            0);
  EXPECT_NE(out.find("an origin is scheme://host[:port]"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
