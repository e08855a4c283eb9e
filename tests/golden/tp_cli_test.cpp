// The CLI's --tp under mpirun (tests/mpi checks the logits and generations of every family): the text
// two ranks print is the single process's, and a layout the launch or the model cannot take is a
// one-line error.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

std::string tiny_model() {
  return (test::source_dir() / "models" / "tessera-tiny").string();
}

std::string generate_args() {
  return " generate -m " + tiny_model() +
         " -p 'The old man walked' --gen-length 24 --steps 24 --precision f32 --threads 1";
}

// The generated tokens and text of a --json result.
std::string tokens_and_text(const std::string& out) {
  const auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_object() || !j.contains("tokens")) return "(not a result: " + out + ")";
  return j["tokens"].dump() + " " + j["text"].dump();
}

TEST(TensorParallelCli, WithoutALauncherTpIsRefusedInOneLine) {
  std::string out;
  EXPECT_NE(test::run_command(std::string(TESSERA_BINARY) + generate_args() + " --tp 2", &out), 0);
  EXPECT_NE(out.find("--tp 2 needs 2 processes, one per rank: run mpirun -np 2"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

#ifdef TESSERA_MPIEXEC
std::string mpirun(int ranks) {
  return std::string(TESSERA_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
         " ";
}

TEST(TensorParallelCli, TwoRanksPrintTheSingleProcessText) {
  std::string one, two;
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + generate_args() + " --json 2>/dev/null", &one), 0)
      << one;
  ASSERT_EQ(
      test::run_command(mpirun(2) + TESSERA_BINARY + generate_args() + " --tp 2 --json 2>/dev/null", &two), 0)
      << two;
  EXPECT_GT(nlohmann::json::parse(one)["tokens"].size(), 8u) << one;
  EXPECT_EQ(tokens_and_text(two), tokens_and_text(one));  // rank 0's result, once (one JSON line)
  // Without --json: the text once on stdout, and the statistics line once on stderr (rank 0's).
  std::string text;
  ASSERT_EQ(
      test::run_command(mpirun(2) + TESSERA_BINARY + generate_args() + " --tp 2 --no-progress 2>&1", &text),
      0)
      << text;
  size_t stats = 0;
  for (size_t at = text.find("tokens/s"); at != std::string::npos; at = text.find("tokens/s", at + 1))
    ++stats;
  EXPECT_EQ(stats, 1u) << text;
  // Under a memory budget every rank plans with the same runtime share (the largest measured), so their
  // steps chunk alike and their all-reduces match.
  ASSERT_EQ(test::run_command(mpirun(2) + TESSERA_BINARY + generate_args() +
                                  " --tp 2 --memory-budget 40MiB --json 2>/dev/null",
                              &two),
            0)
      << two;
  EXPECT_EQ(tokens_and_text(two), tokens_and_text(one));
}

// generate --prompts-file --batch N over ranks: rank 0 orders the packed forwards and exclusive jobs and
// the others run exactly those, so every prompt's answer is the one a single process gives it (f32), with
// forwards shared (KV caches, threshold decoding: requests of different lengths) and with SparseD, whose
// requests run alone as exclusive jobs. Under a memory budget it is refused in one line.
TEST(TensorParallelCli, BatchedPromptsOverRanksAreTheSingleProcessAnswers) {
  const auto dir = test::temp_dir("tp_batch");
  {
    std::ofstream f(dir / "prompts.txt");
    f << "Once upon a time\nThe little dog\nA girl named Lily\nThe sun was\nTom and his mom went\nOne day\n";
  }
  const std::string args = " generate -m " + tiny_model() + " --prompts-file " +
                           (dir / "prompts.txt").string() +
                           " --gen-length 32 --block-length 16 --steps 16 --precision f32 --threads 1 --json";
  // Each line's index, tokens and text, in the file's order.
  auto answers = [](const std::string& out) {
    std::string all;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      all += j.is_object() && j.contains("tokens")
                 ? j["index"].dump() + " " + j["tokens"].dump() + " " + j["text"].dump() + "\n"
                 : "(not a result: " + line + ")\n";
    }
    return all;
  };
  for (const std::string opts : {"", " --cache dual --threshold 0.9", " --sparse"}) {
    std::string one, two;
    ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + args + opts + " --batch 1 2>/dev/null", &one),
              0)
        << one;
    ASSERT_EQ(
        test::run_command(mpirun(2) + TESSERA_BINARY + args + opts + " --tp 2 --batch 4 2>/dev/null", &two),
        0)
        << two;
    EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 6) << one;
    EXPECT_EQ(answers(two), answers(one)) << opts;
  }
  test::expect_command_error(
      mpirun(2) + TESSERA_BINARY + args + " --tp 2 --batch 4 --memory-budget 64MiB 2>&1",
      "batched requests over ranks (--tp / --ep) do not take a memory budget yet");
}

// bench --profile's model of expert parallelism's all-reduce (MoeTraffic: 2 (N - 1) x rows x hidden x 4
// over all ranks, from the routed rows) against the bytes rank 0 handed its all-reduces under --ep 2 (its
// payload: rows x hidden x 4 per MoE layer, half of the model's total for 2 ranks), one per MoE layer.
TEST(TensorParallelCli, ExpertParallelBytesAreTheProfilesModel) {
  const std::string moe = (test::source_dir() / "models" / "tessera-tiny-moe").string();
  std::string out;
  ASSERT_EQ(
      test::run_command(mpirun(2) + TESSERA_BINARY + " bench -m " + moe +
                            " --prompt-len 20 --gen-length 24 --block-length 24 --steps 4 --ep 2 --threads 1 "
                            "--dist-timeout 60 --profile --json 2>/dev/null",
                        &out),
      0)
      << out;
  const auto r = nlohmann::json::parse(out)["rows"][0];
  const double forwards = r["forwards"].get<double>();
  ASSERT_GT(forwards, 0);
  ASSERT_GE(r["expert_parallel_traffic"].size(), 1u) << r.dump();
  const auto& two = r["expert_parallel_traffic"][0];
  ASSERT_EQ(two["ranks"], 2);
  EXPECT_EQ(r["comm_bytes"].get<double>() / forwards, two["all_reduce_bytes_per_forward"].get<double>() / 2)
      << r.dump();
  EXPECT_EQ(r["comm_calls"].get<double>(), 6 * forwards);  // tessera-tiny-moe: 6 MoE layers
  test::expect_command_error(std::string(TESSERA_BINARY) + " bench -m " + moe + " --dist-timeout 0 2>&1",
                             "--dist-timeout: 0 is not in [0.001, 1e+06]");
}

TEST(TensorParallelCli, LayoutsThatCannotRunAreOneLineErrors) {
  std::string out;
  // 4 heads over 3 ranks: every rank refuses it at load.
  EXPECT_NE(test::run_command(mpirun(3) + TESSERA_BINARY + generate_args() + " --tp 3", &out), 0);
  EXPECT_NE(out.find("--tp 3: the model's attention heads (4) cannot be split evenly over 3 ranks"),
            std::string::npos)
      << out;
  // Two processes launched, one rank asked for.
  EXPECT_NE(test::run_command(mpirun(2) + TESSERA_BINARY + generate_args(), &out), 0);
  EXPECT_NE(out.find("this process is one of 2 started by the launcher, but --tp is 1"), std::string::npos)
      << out;
}
// `tessera plan --tp / --ep`: a rank's load holds its share and one layer bound whole (hand-computed).
TEST(TensorParallelCli, PlanGivesARanksLoadPeak) {
  const auto plan = [](const std::string& args) {
    std::string out;
    EXPECT_EQ(test::run_command(std::string(TESSERA_BINARY) + " plan --context 4096 --json " + args, &out), 0)
        << out;
    const auto j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << out;
    return j.is_object() ? j["load_peak_bytes"].get<int64_t>() - j["weight_bytes"].get<int64_t>() : -1;
  };
  // LLaDA-8B over 2 ranks: a layer's attention (4 x 4096 x 4096) and FFN (3 x 4096 x 12288) lose half, in
  // bf16.
  EXPECT_EQ(plan("--geometry llada-8b --tp 2"), (4LL * 4096 * 4096 + 3LL * 4096 * 12288) / 2 * 2);
  // LLaDA2-flash over 8: its dense first layer, q / o 4096 -> 512 wide, k / v 512 -> 128, FFN 9216 -> 1152.
  EXPECT_EQ(plan("--geometry llada2-flash --tp 8 --ep 8"),
            (2LL * 4096 * (4096 - 512) + 2LL * 4096 * (512 - 128) + 3LL * 4096 * (9216 - 1152)) * 2);
  EXPECT_EQ(plan("--geometry llada2-flash --ep 8"), 0);  // only the rank's experts are ever bound
  EXPECT_EQ(plan("--geometry llada-8b"), 0);
}

// `mpirun -np 2 tessera serve --tp 2`: rank 0 answers HTTP, rank 1 follows its generations. Completions
// (sampled, with log-probabilities) and a streamed chat answer as one process does (f32); an idle server
// outlives --dist-timeout (rank 0's heartbeats); SIGTERM drains rank 0, which then ends rank 1.
TEST(TensorParallelCli, ServeOverTwoRanksAnswersAsOneProcess) {
  const std::string args = "-m " + tiny_model() + " --precision f32 --threads 1";
  test::ServerProcess two(args + " --tp 2 --dist-timeout 4", test::temp_dir("tp_serve_two"), mpirun(2));
  test::ServerProcess one(args, test::temp_dir("tp_serve_one"));
  ASSERT_TRUE(two.ready() && one.ready()) << two.log();
  const auto ask = [](const test::ServerProcess& s, const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post(path, body, "application/json");
    return r ? std::to_string(r->status) + " " + r->body : std::string("no response");
  };
  const auto choices = [](const std::string& answer) {
    const auto j = nlohmann::json::parse(answer.substr(answer.find(' ') + 1), nullptr, false);
    return j.is_object() && j.contains("choices") ? j["choices"] : nlohmann::json::array();
  };
  const std::string completion =
      R"({"prompt":"The old man walked","max_tokens":24,"temperature":0.8,"seed":5,"logprobs":3,"n":2})";
  const std::string a = ask(two, "/v1/completions", completion);
  EXPECT_EQ(a.substr(0, 4), "200 ") << a;
  // The same texts and tokens, the same most likely tokens, the log-probabilities within f32 rounding.
  const nlohmann::json got = choices(a), want = choices(ask(one, "/v1/completions", completion));
  ASSERT_EQ(got.size(), 2u) << a;
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i]["text"], want[i]["text"]);
    const nlohmann::json &g = got[i]["logprobs"], &w = want[i]["logprobs"];
    EXPECT_EQ(g["tokens"], w["tokens"]);
    ASSERT_EQ(g["token_logprobs"].size(), w["token_logprobs"].size());
    for (size_t t = 0; t < w["token_logprobs"].size(); ++t) {
      EXPECT_NEAR(g["token_logprobs"][t].get<double>(), w["token_logprobs"][t].get<double>(), 1e-4);
      for (const auto& [tok, lp] : w["top_logprobs"][t].items()) {
        ASSERT_TRUE(g["top_logprobs"][t].contains(tok)) << tok;
        EXPECT_NEAR(g["top_logprobs"][t][tok].get<double>(), lp.get<double>(), 1e-4);
      }
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(6));  // idle past --dist-timeout 4
  const std::string chat = R"({"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":16,)"
                           R"("temperature":0,"stream":true})";
  const std::string s2 = ask(two, "/v1/chat/completions", chat), s1 = ask(one, "/v1/chat/completions", chat);
  EXPECT_NE(s2.find("data: [DONE]"), std::string::npos) << s2;
  const auto deltas = [](const std::string& sse) {  // the streamed content, without ids and times
    std::string text;
    for (const std::string& e : test::events(sse)) {
      const auto j = nlohmann::json::parse(e, nullptr, false);
      if (j.is_object() && j.contains("choices") && !j["choices"].empty())
        text += j["choices"][0].value("delta", nlohmann::json::object()).value("content", "");
    }
    return text;
  };
  EXPECT_EQ(deltas(s2), deltas(s1));
  EXPECT_FALSE(deltas(s1).empty()) << s1;
  // SIGTERM (mpirun passes it to both ranks): rank 0 drains and stops, then tells rank 1 to exit.
  kill(two.pid(), SIGTERM);
  for (int i = 0; i < 200 && two.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(two.alive()) << two.log();
  EXPECT_NE(two.log().find("tessera serve: stopped"), std::string::npos) << two.log();
  EXPECT_EQ(two.log().find("did not complete within"), std::string::npos) << two.log();
}

// `mpirun -np 2 tessera serve --tp 2 --batch 4`: concurrent requests share packed forwards on both ranks
// (/health counts forwards of several) and each answer is one process's, those with a KV cache and threshold
// decoding and a SparseD one (which runs alone) among them. A request rank 0 ends early (its client leaves
// after a few steps) ends on rank 1 too, batched or alone, and the server goes on answering as one process.
TEST(TensorParallelCli, ServeOverTwoRanksBatchesRequestsAndEndsThemTogether) {
  using json = nlohmann::json;
  const std::string args = "-m " + tiny_model() + " --precision f32 --threads 1 --batch 4 --batch-wait 50";
  test::ServerProcess two(args + " --tp 2 --dist-timeout 10", test::temp_dir("tp_serve_batch_two"),
                          mpirun(2));
  test::ServerProcess one(args, test::temp_dir("tp_serve_batch_one"));
  ASSERT_TRUE(two.ready() && one.ready()) << two.log();
  const auto ask = [](const test::ServerProcess& s, const json& body) {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) return std::string("failed: ") + (r ? r->body : "no response");
    const auto j = json::parse(r->body, nullptr, false);
    return j.is_object() && j.contains("choices") ? j["choices"][0]["text"].dump()
                                                  : "(no choices) " + r->body;
  };
  const auto health = [](const test::ServerProcess& s) {
    httplib::Client c("127.0.0.1", s.port());
    auto h = c.Get("/health");
    return h ? json::parse(h->body, nullptr, false) : json();
  };
  const std::vector<json> requests = {
      {{"prompt", "The old man walked"}, {"max_tokens", 24}, {"temperature", 0}},
      {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"temperature", 0.8}, {"seed", 3}},
      {{"prompt", "The little dog"},
       {"max_tokens", 32},
       {"block_length", 8},
       {"cache", "dual"},
       {"threshold", 0.9}},
      {{"prompt", "She said"}, {"max_tokens", 24}, {"temperature", 0}, {"sparse", true}},
      {{"prompt", "A bird"}, {"max_tokens", 16}, {"temperature", 0.7}, {"seed", 9}, {"steps", 8}},
  };
  // Both servers take the requests all at once; each answer must be the one process's.
  const auto all_at_once = [&](const test::ServerProcess& s) {
    std::vector<std::string> out(requests.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < requests.size(); ++i) ts.emplace_back([&, i] { out[i] = ask(s, requests[i]); });
    for (auto& t : ts) t.join();
    return out;
  };
  const std::vector<std::string> got = all_at_once(two), want = all_at_once(one);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << requests[i].dump();
    EXPECT_EQ(got[i].rfind("failed", 0), std::string::npos) << got[i];
  }
  const json h = health(two);
  ASSERT_TRUE(h.contains("batch")) << h.dump();
  // Packed (how much depends on the arrival times: the SparseD request runs alone, the others differ in
  // steps).
  EXPECT_GE(h["batch"]["largest"].get<int>(), 2) << h.dump();
  EXPECT_GT(h["batch"]["sequences"].get<int>(), h["batch"]["forwards"].get<int>()) << h.dump();

  // A client that leaves after a few steps, of a batched request and of one that runs alone (SparseD).
  for (const bool alone : {false, true}) {
    SCOPED_TRACE(alone ? "alone" : "batched");
    json body = {{"prompt", "Once"}, {"max_tokens", 400}, {"block_length", 400}, {"stream", true}};
    if (alone) body["sparse"] = true;
    const json before = health(two);
    const int fd = test::post_raw(two.port(), "/v1/completions", body.dump());
    ASSERT_GE(fd, 0);
    char buf[4096];
    ASSERT_GT(recv(fd, buf, sizeof buf, 0), 0);  // its first event: it runs
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    close(fd);
    json after;
    for (int i = 0; i < 300; ++i) {
      after = health(two);
      if (after.value("requests_abandoned", 0) > before.value("requests_abandoned", 0)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(after.value("requests_abandoned", 0), before.value("requests_abandoned", 0) + 1)
        << after.dump();
    // Rank 1 ended it too: the next requests answer as one process (a forward it still waited in would
    // pair with theirs and hang or change them).
    EXPECT_EQ(ask(two, requests[0]), want[0]);
    EXPECT_EQ(ask(two, requests[3]), want[3]);
  }
  kill(two.pid(), SIGTERM);
  for (int i = 0; i < 200 && two.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(two.alive()) << two.log();
  EXPECT_EQ(two.log().find("did not complete within"), std::string::npos) << two.log();
  EXPECT_EQ(two.log().find("still waited for a forward"), std::string::npos) << two.log();  // all ended
}

// `mpirun -np 2 tessera chat --tp 2`: rank 0 reads the lines, rank 1 follows its turns (commands included:
// /system, /undo); the answers are one process's, an idle pause longer than --dist-timeout is survived, and
// /quit ends both ranks (the line after it is never read).
TEST(TensorParallelCli, ChatOverTwoRanksAnswersAsOneProcess) {
  const std::string chat =
      " chat -m " + tiny_model() + " --precision f32 --threads 1 --temperature 0.7 --seed 4 -n 16 --json";
  const std::string lines = "printf 'Hello\\n/system be brief\\nTell me more\\n/undo\\nAgain\\n'";
  const std::string rest = "printf 'Once more\\n/quit\\nNever\\n'";
  std::string one, two;
  ASSERT_EQ(test::run_command("(" + lines + "; " + rest + ") | " + TESSERA_BINARY + chat, &one), 0) << one;
  ASSERT_EQ(test::run_command("(" + lines + "; sleep 5; " + rest + ") | " + mpirun(2) + TESSERA_BINARY +
                                  chat + " --tp 2 --dist-timeout 3",
                              &two),
            0)
      << two;
  const auto answers = [](const std::string& out) {
    std::vector<std::string> v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] != '{') continue;  // notes and command replies (stderr)
      const auto j = nlohmann::json::parse(line, nullptr, false);
      v.push_back(j.is_object() ? j["tokens"].dump() + " " + j["text"].dump()
                                : "(not a result: " + line + ")");
    }
    return v;
  };
  EXPECT_EQ(answers(one).size(), 4u) << one;  // Hello, Tell me more (undone), Again, Once more
  EXPECT_EQ(answers(two), answers(one));
}

// A rank that dies (here: its model path does not exist) ends the job with its error; one that stops
// taking part (here: it runs fewer steps, then waits to finish) makes the others' next collective time
// out, and the job ends with a line naming it. Never a hang.
TEST(TensorParallelCli, ARankThatDiesOrStopsEndsTheJobWithAnError) {
  const std::string bin =
      std::string(TESSERA_BINARY) + " generate -p 'The old man walked' --gen-length 24 --tp 2 --threads 1";
  const std::string launch = std::string(TESSERA_MPIEXEC) + " --allow-run-as-root --oversubscribe ";
  std::string out;
  EXPECT_NE(test::run_command(launch + "-np 1 " + bin + " -m " + tiny_model() + " --steps 24 : -np 1 " + bin +
                                  " -m /nonexistent/model --steps 24",
                              &out),
            0);
  EXPECT_NE(out.find("tessera: rank 1: error: "), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/model"), std::string::npos) << out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(test::run_command(launch + "-np 1 " + bin + " -m " + tiny_model() +
                                  " --steps 24 --dist-timeout 3 : -np 1 " + bin + " -m " + tiny_model() +
                                  " --steps 12 --dist-timeout 3",
                              &out),
            0);
  EXPECT_NE(out.find("did not complete within 3 s: another rank died or hangs; ending the job"),
            std::string::npos)
      << out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
}
#endif

}  // namespace
}  // namespace tessera
