// Combined features in tessera serve's batcher (issue #27): concurrent /v1/completions requests that each
// combine features (cfg with a KV cache, the window with cfg or a suffix, SparseD with a suffix, inside
// the window or with cfg, token editing with its penalty, a cache or cfg, ...),
// beside plain and threshold ones, are answered exactly as each is when it is sent alone (greedy, 16
// tokens, the bundled tiny model, --batch 8). Requests that cannot share forwards (cfg with a cache,
// SparseD) run alone in the batcher; the others are packed.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

using Server = test::ServerProcess;
// A server of the bundled tiny model with `args`, logging under `dir`.
Server tiny_server(const std::string& args, const std::filesystem::path& dir) {
  return Server("-m " + (test::source_dir() / "models" / "tessera-tiny").string() + " " + args, dir);
}

// The completion text of one request, or a line that starts with "no 200" and says what came back.
std::string completion(const Server& s, const json& r) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  auto res = c.Post("/v1/completions", r.dump(), "application/json");
  if (!res || res->status != 200) return "no 200 response: " + (res ? res->body : std::string("none"));
  return json::parse(res->body)["choices"][0]["text"].get<std::string>();
}

TEST(ServeCombine, ConcurrentCombinationsAnswerAsAlone) {
  const auto tmp = test::temp_dir("serve-combine");
  Server server = tiny_server("--batch 8", tmp);
  ASSERT_GT(server.port(), 0);
  const std::string suffix = " and they lived happily ever after.";
  const std::vector<json> extra = {
      json::object(),                                                             // plain
      {{"block_length", 8}},                                                      // plain, 2 blocks
      {{"block_length", 8}, {"threshold", 0.3}},                                  // threshold
      {{"alg", "entropy"}, {"block_length", 8}, {"cache", "dual"}},               // Dream entropy, dual cache
      {{"cfg", 1.0}},                                                             // cfg
      {{"cache", "dual"}, {"cfg", 1.0}, {"block_length", 8}},                     // cfg + dual cache
      {{"cache", "prefix"}, {"cfg", 0.5}, {"block_length", 8}},                   // cfg + prefix cache
      {{"window", true}, {"cfg", 1.0}, {"window_ex", 8}, {"window_in", 4}},       // window + cfg (refresh 32)
      {{"window_refresh", 0}, {"cfg", 1.0}, {"window_ex", 8}, {"window_in", 4}},  // window + cfg, no cache
      {{"window", true}, {"suffix", suffix}, {"window_ex", 8}, {"window_in", 4}, {"window_refresh", 3}},
      {{"sparse", true}, {"suffix", suffix}, {"sparse_block", 8}, {"sparse_rho", 0.3}},  // SparseD + suffix
      {{"window", true}, {"cfg", 1.0}, {"suffix", suffix}, {"window_ex", 8}, {"window_in", 4}},
      {{"sparse", true}, {"window", true}, {"sparse_block", 8}, {"window_ex", 8}, {"window_in", 4}},
      {{"sparse", true}, {"cfg", 1.0}, {"sparse_block", 8}},  // SparseD + cfg
      {{"edit_mode", "speed"}, {"block_length", 8}},          // token editing
      {{"edit_threshold", 0.3},
       {"threshold", 0.5},
       {"edit_penalty", 3.0},
       {"cache", "dual"},
       {"block_length", 8}},
      {{"edit_mode", "quality"}, {"cfg", 1.0}, {"block_length", 8}},  // editing + cfg
  };
  std::vector<json> reqs;
  for (size_t i = 0; i < extra.size(); ++i) {
    json r = {{"prompt", "Once upon a time " + std::to_string(i)}, {"max_tokens", 16}, {"temperature", 0}};
    r.update(extra[i]);
    reqs.push_back(r);
  }
  // SparseD with a KV cache joins them where the engine accepts it (else it is a 400 that says so).
  {
    json r = reqs[0];
    r.update(json{{"cache", "prefix"}, {"sparse_block", 8}, {"block_length", 8}});
    const std::string got = completion(server, r);
    if (got.find("no 200") == std::string::npos)
      reqs.push_back(r);
    else
      EXPECT_NE(got.find("cannot be combined"), std::string::npos) << got;
  }
  std::vector<std::string> together(reqs.size());
  std::vector<std::thread> th;
  std::atomic<int> ready{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    th.emplace_back([&, i] {
      ++ready;
      while (ready.load() < static_cast<int>(reqs.size())) std::this_thread::yield();
      together[i] = completion(server, reqs[i]);
    });
  }
  for (auto& t : th) t.join();
  const auto t1 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string alone = completion(server, reqs[i]);
    EXPECT_EQ(alone.find("no 200"), std::string::npos) << reqs[i].dump() << ": " << alone;
    EXPECT_EQ(together[i], alone) << reqs[i].dump();
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::printf("%zu concurrent requests %.2f s, then one at a time %.2f s\n", reqs.size(),
              std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
  httplib::Client c("127.0.0.1", server.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  const json b = json::parse(h->body)["batch"];
  EXPECT_EQ(b["max"], 8);
  EXPECT_GT(b["largest"].get<int>(), 1) << "the packable requests never shared a forward: " << h->body;
}

}  // namespace
}  // namespace tessera
