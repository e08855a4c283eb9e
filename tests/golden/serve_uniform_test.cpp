// tessera serve with a uniform-noise model (DiffusionGemma, tiny checkpoint in the real layout): a completion
// is what `tessera generate` writes for the same options, the stream's deltas arrive canvas by canvas and
// concatenate to the same text, concurrent requests answer as alone (they run one at a time), and what
// the model's loop cannot combine with is refused with a 400.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "serve_process.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using test::ServerProcess;

json post(httplib::Client& c, const json& body, int want_status) {
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response for " << body.dump();
    return {};
  }
  EXPECT_EQ(r->status, want_status) << body.dump() << "\n" << r->body;
  return json::parse(r->body, nullptr, false);
}

TEST(ServeUniform, CompletionsStreamCanvasByCanvasAndRunAlone) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", "--seed 2");
  const auto tmp = test::temp_dir("serve_uniform");
  ServerProcess server("-m " + dir.string() + " --model-id dg", tmp);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(60, 0);
  const json req = {{"model", "dg"}, {"prompt", "hello"}, {"max_tokens", 24}, {"seed", 3}};
  const json got = post(c, req, 200);
  std::string cli;
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " + dir.string() +
                                  " -p hello --raw --gen-length 24 --seed 3 --json 2>/dev/null",
                              &cli),
            0);
  const json want = json::parse(cli);
  EXPECT_EQ(got["choices"][0]["text"], want["text"]);
  EXPECT_EQ(got["usage"]["completion_tokens"], want["tokens"].size());

  // Streamed: the committed text grows one canvas (8 tokens) at a time.
  json s = req;
  s["stream"] = true;
  auto sr = c.Post("/v1/completions", s.dump(), "application/json");
  ASSERT_TRUE(sr);
  const auto ev = test::events(sr->body);
  ASSERT_GE(ev.size(), 3u) << sr->body;
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  int deltas = 0;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const std::string d = json::parse(ev[i])["choices"][0]["text"].get<std::string>();
    deltas += d.empty() ? 0 : 1;
    text += d;
  }
  EXPECT_EQ(text, want["text"].get<std::string>());
  EXPECT_GE(deltas, 2);  // three canvases of 8: the text arrives in pieces, not at the end only

  // Two at once: each answers as alone.
  json other = req;
  other["seed"] = 4;
  json a, b;
  std::thread t([&] {
    httplib::Client c2("127.0.0.1", server.port());
    c2.set_read_timeout(60, 0);
    a = post(c2, req, 200);
  });
  b = post(c, other, 200);
  t.join();
  EXPECT_EQ(a["choices"][0]["text"], want["text"]);
  EXPECT_EQ(b["choices"][0]["text"], post(c, other, 200)["choices"][0]["text"]);

  // What the loop cannot combine with: one line, and the server keeps going.
  json bad = req;
  bad["logprobs"] = 2;
  const json e = post(c, bad, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("drop logprobs"), std::string::npos) << e.dump();
  EXPECT_EQ(post(c, req, 200)["choices"][0]["text"], want["text"]);
}

}  // namespace
}  // namespace tessera
