// Batching of concurrent requests (engine/batcher.h): requests run on their own threads and share
// packed forwards, and each one's result equals generate() of that request alone on the same engine,
// token for token and step for step, whatever it was packed with: on the bundled tessera-tiny with
// every batchable sampler (LLaDA low-confidence and random remasking with Gumbel noise, Dream's
// algorithms with top-k / top-p, threshold decoding, cfg, Window-Diffusion without its cache), on
// Dream (shifted logits) and on LLaDA2 (block-causal, requests of different blocks); under a memory
// budget that forces packed forwards to be split; with a failing request among good ones; with
// exclusive jobs (a KV-cache request) arriving while batched requests run.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/batcher.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

struct Request {
  std::vector<int32_t> prompt;
  GenerateOptions o;
};

struct Outcome {
  GenerateResult r;
  int events = 0;
  std::string error;
};

Outcome solo(Engine& e, const Request& q) {
  Outcome out;
  try {
    out.r = generate(e, q.prompt, q.o, [&](const StepEvent&) { ++out.events; });
  } catch (const Error& err) {
    out.error = err.what();
  }
  return out;
}

// Every request on its own thread through one Batcher, all started together.
std::vector<Outcome> batched(Batcher& b, const std::vector<Request>& qs) {
  std::vector<Outcome> out(qs.size());
  std::vector<std::thread> th;
  std::atomic<int> ready{0};
  for (size_t i = 0; i < qs.size(); ++i) {
    th.emplace_back([&, i] {
      ++ready;
      while (ready.load() < static_cast<int>(qs.size())) std::this_thread::yield();
      try {
        out[i].r = b.generate(qs[i].prompt, qs[i].o, [&](const StepEvent&) { ++out[i].events; });
      } catch (const Error& err) {
        out[i].error = err.what();
      }
    });
  }
  for (auto& t : th) t.join();
  return out;
}

void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].error, want[i].error) << "request " << i;
    EXPECT_EQ(got[i].r.tokens, want[i].r.tokens) << "request " << i;
    EXPECT_EQ(got[i].r.order, want[i].r.order) << "request " << i;
    EXPECT_EQ(got[i].r.steps_run, want[i].r.steps_run) << "request " << i;
    EXPECT_EQ(got[i].events, want[i].events) << "request " << i;
  }
}

std::vector<int32_t> prompt_of(int n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& t : p) {
    s = rng_mix(s);
    t = static_cast<int32_t>(s % static_cast<uint64_t>(vocab - 16));
  }
  return p;
}

// A mix of every batchable sampler, prompts of different lengths.
std::vector<Request> mixed_requests(int64_t vocab, int32_t eos) {
  std::vector<Request> qs;
  auto add = [&](int plen, uint64_t seed, const std::function<void(GenerateOptions&)>& set) {
    Request q;
    q.prompt = prompt_of(plen, vocab, seed);
    q.o.gen_length = 32;
    q.o.steps = 16;
    q.o.block_length = 16;
    q.o.eos_ids = {eos};
    q.o.stop_at_eos = false;
    set(q.o);
    qs.push_back(std::move(q));
  };
  add(5, 1, [](GenerateOptions&) {});
  add(17, 2, [](GenerateOptions& o) {
    o.temperature = 0.9f;
    o.seed = 11;
  });
  add(9, 3, [](GenerateOptions& o) {
    o.alg = "random";
    o.seed = 12;
  });
  add(23, 4, [](GenerateOptions& o) {
    o.alg = "entropy";
    o.temperature = 0.7f;
    o.top_p = 0.9f;
    o.top_k = 50;
    o.block_length = 32;
    o.seed = 13;
  });
  add(12, 5, [](GenerateOptions& o) {
    o.alg = "topk_margin";
    o.alg_temp = 0.5f;
    o.block_length = 32;
    o.seed = 14;
  });
  add(30, 6, [](GenerateOptions& o) { o.threshold = 0.3f; });
  add(7, 7, [](GenerateOptions& o) { o.cfg_scale = 1.0f; });
  add(14, 8, [](GenerateOptions& o) {
    o.window = true;
    o.window_refresh = 0;
    o.window_ex = 12;
    o.window_in = 4;
  });
  add(8, 9, [](GenerateOptions& o) {
    o.logits_eos_inf = true;
    o.stop_at_eos = true;
  });
  return qs;
}

// Engine::forward_sample with one SampleParams per sequence: each sequence's rows sample as that
// sequence alone does, also when the logits loop is chunked across the sequences' boundaries.
TEST(Batch, PackedSamplingUsesEachSequencesParameters) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  for (int64_t k_logits : {1, 3, 7}) {
    auto e = Engine::load(dir, EngineOptions{.k_logits = k_logits});
    const int64_t V = e->vocab_size();
    std::vector<std::vector<int32_t>> canvases, positions;
    std::vector<SampleParams> sps(3);
    for (int s = 0; s < 3; ++s) {
      canvases.push_back(
          test::random_canvas(20 + 13 * s, V, 50 + static_cast<uint64_t>(s), e->mask_token(), 0.6));
      std::vector<int32_t> pos;
      for (int32_t i = 0; i < static_cast<int32_t>(canvases.back().size()); ++i)
        if (canvases.back()[static_cast<size_t>(i)] == e->mask_token()) pos.push_back(i);
      positions.push_back(pos);
    }
    sps[0].temperature = 0.0f;
    sps[1].temperature = 0.9f, sps[1].gumbel = true, sps[1].seed = 77;
    sps[2].temperature = 0.7f, sps[2].top_p = 0.8f, sps[2].conf = ConfKind::NegEntropy, sps[2].seed = 78;
    std::vector<int32_t> want_tok;
    std::vector<float> want_conf;
    std::vector<SeqInput> seqs;
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> tok(positions[static_cast<size_t>(s)].size());
      std::vector<float> conf(tok.size());
      e->predict(canvases[static_cast<size_t>(s)], positions[static_cast<size_t>(s)],
                 sps[static_cast<size_t>(s)], tok, conf);
      want_tok.insert(want_tok.end(), tok.begin(), tok.end());
      want_conf.insert(want_conf.end(), conf.begin(), conf.end());
      seqs.push_back({canvases[static_cast<size_t>(s)], positions[static_cast<size_t>(s)]});
    }
    std::vector<int32_t> tok(want_tok.size());
    std::vector<float> conf(tok.size());
    e->forward_sample(seqs, sps, tok, conf);
    EXPECT_EQ(tok, want_tok) << "k_logits " << k_logits;
    EXPECT_EQ(conf, want_conf) << "k_logits " << k_logits;
    EXPECT_EQ(e->last_step().shape.k_logits, k_logits);
    // One SampleParams for all (the first): the other sequences' rows then differ.
    e->forward_sample(seqs, sps[0], tok, conf);
    EXPECT_NE(tok, want_tok);
    test::expect_error(
        [&] { e->forward_sample(seqs, std::span<const SampleParams>(sps).first(2), tok, conf); },
        "one SampleParams per sequence");
  }
}

TEST(Batch, PackedRequestsEqualTheirSoloGenerations) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto e = Engine::load(dir);
  const auto qs = mixed_requests(e->vocab_size(), e->config().eos_id);
  std::vector<Outcome> want;
  int solo_forwards = 0;
  for (const Request& q : qs) {
    want.push_back(solo(*e, q));
    ASSERT_EQ(want.back().error, "");
    solo_forwards += want.back().r.steps_run + (q.o.cfg_scale > 0 ? want.back().r.steps_run : 0);
  }
  for (int max_batch : {1, 3, 16}) {
    Batcher b(*e, max_batch, std::chrono::milliseconds(50));
    expect_same(batched(b, qs), want);
    const BatchStats s = b.stats();
    EXPECT_LE(s.largest, max_batch);
    EXPECT_EQ(s.splits, 0);
    if (max_batch > 1) {
      EXPECT_GT(s.largest, 1) << "no forward was shared";
      EXPECT_LT(s.forwards, solo_forwards);
    } else {
      EXPECT_EQ(s.forwards, solo_forwards);
    }
    // A second round on the same batcher (requests admitted again) gives the same.
    if (max_batch == 16) expect_same(batched(b, qs), want);
  }
}

TEST(Batch, DreamAndBlockCausalModels) {
  for (const char* family : {"dream", "llada2"}) {
    TESSERA_TINY_OR_SKIP(dir, family, "--seed 9");
    auto e = Engine::load(dir);
    std::vector<Request> qs;
    for (int i = 0; i < 4; ++i) {
      Request q;
      q.prompt = prompt_of(6 + 5 * i, e->vocab_size(), 40 + static_cast<uint64_t>(i));
      q.o.gen_length = 24;
      q.o.steps = 12;
      q.o.block_length = i % 2 == 0 ? 8 : 12;  // LLaDA2: two attention blocks among the requests
      q.o.temperature = i == 3 ? 0.8f : 0.0f;
      q.o.seed = 3;
      if (std::string(family) == "dream") q.o.alg = i % 2 == 0 ? "maskgit_plus" : "entropy";
      if (std::string(family) == "llada2") q.o.threshold = i == 2 ? 0.5f : 0.0f;
      q.o.eos_ids = {e->config().eos_id};
      qs.push_back(std::move(q));
    }
    std::vector<Outcome> want;
    for (const Request& q : qs) {
      want.push_back(solo(*e, q));
      ASSERT_EQ(want.back().error, "") << family;
    }
    Batcher b(*e, 8, std::chrono::milliseconds(50));
    SCOPED_TRACE(family);
    expect_same(batched(b, qs), want);
    EXPECT_GT(b.stats().largest, 1);
  }
}

TEST(Batch, PackedForwardsAreSplitToFitTheMemoryBudget) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto plain = Engine::load(dir);
  auto qs = mixed_requests(plain->vocab_size(), plain->config().eos_id);
  qs.resize(6);
  for (auto& q : qs) q.o.gen_length = 96, q.o.steps = 24, q.o.block_length = q.o.block_length == 32 ? 96 : 32;
  std::vector<Outcome> want;
  size_t peak = 0;
  for (const Request& q : qs) {
    want.push_back(solo(*plain, q));
    ASSERT_EQ(want.back().error, "");
    peak = std::max(peak, plain->max_planned_peak());
  }
  // Room for every request alone (unchunked), not for six packed even fully chunked.
  EngineOptions opt;
  opt.memory_budget = plain->model().weight_bytes() + peak + peak / 4;
  auto e = Engine::load(dir, opt);
  Batcher b(*e, 6, std::chrono::milliseconds(50));
  expect_same(batched(b, qs), want);
  EXPECT_GT(b.stats().splits, 0);
  EXPECT_GT(b.stats().largest, 1);
}

TEST(Batch, AFailingRequestFailsAloneAndExclusiveJobsInterleave) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto e = Engine::load(dir);
  auto qs = mixed_requests(e->vocab_size(), e->config().eos_id);
  qs.resize(4);
  Request bad = qs[0];  // its canvas exceeds the model's context: the engine refuses its forwards
  bad.o.gen_length = static_cast<int>(e->config().max_positions);
  bad.o.block_length = bad.o.gen_length;
  bad.o.steps = 4;
  qs.push_back(bad);
  std::vector<Outcome> want;
  for (const Request& q : qs) want.push_back(solo(*e, q));
  EXPECT_NE(want.back().error.find("exceeds the model's context"), std::string::npos) << want.back().error;
  // A KV-cache request (not batchable) as an exclusive job, solo result first.
  Request cached = qs[1];
  cached.o.cache = "dual";
  ASSERT_FALSE(Batcher::batchable(cached.o));
  ASSERT_TRUE(Batcher::batchable(qs[1].o));
  const Outcome cached_want = solo(*e, cached);
  ASSERT_EQ(cached_want.error, "");

  Batcher b(*e, 8, std::chrono::milliseconds(5));
  Outcome cached_got;
  std::thread excl([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    b.run([&] { cached_got = solo(*e, cached); }, true);
  });
  expect_same(batched(b, qs), want);
  excl.join();
  expect_same({cached_got}, {cached_want});
  test::expect_error([&] { b.generate(cached.prompt, cached.o); }, "cannot be batched");
}

// tessera generate --prompts-file: every prompt of the file in batches, results in the file's order,
// each equal to `tessera generate -p` of that prompt; a prompt that fails gets its error, the others
// their text, and the exit status says so.
TEST(Batch, GenerateCommandTakesAFileOfPrompts) {
  const auto tmp = test::temp_dir("prompts-file");
  const std::string model = (test::source_dir() / "models" / "tessera-tiny").string();
  const std::string opts =
      " -m " + model + " --raw --gen-length 16 --block-length 8 --steps 8 --temperature 0.5";
  const std::vector<std::string> prompts = {"Once upon a time", "The cat\nsat", std::string(3000, 'a'), "Hi"};
  {
    std::ofstream f(tmp / "p.txt");
    f << prompts[0] << "\n\n\"The cat\\nsat\"\n" << prompts[2] << "\r\n" << prompts[3] << "\n";
  }
  std::string out;
  EXPECT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate --prompts-file " +
                                  (tmp / "p.txt").string() + opts + " --batch 3 --json",
                              &out),
            1)
      << out;
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), prompts.size()) << out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(lines[i]["index"], i);
    if (i == 2) {
      EXPECT_NE(lines[i]["error"].get<std::string>().find("exceeds the model's context"), std::string::npos)
          << lines[i].dump();
      continue;
    }
    std::ofstream(tmp / "one.txt") << nlohmann::json(prompts[i]).dump() << "\n";
    std::string alone;
    ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate --prompts-file " +
                                    (tmp / "one.txt").string() + opts + " --json",
                                &alone),
              0)
        << alone;
    const auto want = nlohmann::json::parse(alone);
    EXPECT_EQ(lines[i]["text"], want["text"]) << prompts[i];
    EXPECT_EQ(lines[i]["tokens"], want["tokens"]) << prompts[i];
    if (i == 0) {  // and -p gives the same
      ASSERT_EQ(
          test::run_command(
              std::string(TESSERA_BINARY) + " generate -p '" + prompts[i] + "'" + opts + " --json", &alone),
          0);
      EXPECT_EQ(nlohmann::json::parse(alone)["tokens"], want["tokens"]);
    }
  }
  test::expect_command_error(std::string(TESSERA_BINARY) + " generate" + opts, "give a prompt");
  test::expect_command_error(
      std::string(TESSERA_BINARY) + " generate --prompts-file " + (tmp / "none").string(),
      "cannot read the prompts file");
  std::ofstream(tmp / "bad.txt") << "\"unterminated\n";
  test::expect_command_error(
      std::string(TESSERA_BINARY) + " generate --prompts-file " + (tmp / "bad.txt").string(),
      "line 1: a line that starts with '\"' must be one JSON string");
  std::ofstream(tmp / "empty.txt") << "\n\n";
  test::expect_command_error(
      std::string(TESSERA_BINARY) + " generate --prompts-file " + (tmp / "empty.txt").string(),
      "holds no prompt");
}

}  // namespace
}  // namespace tessera
