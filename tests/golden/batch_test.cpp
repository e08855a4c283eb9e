// Batching of concurrent requests (engine/batcher.h): requests run on their own threads and share
// packed forwards, and each one's result equals generate() of that request alone on the same engine,
// token for token and step for step, whatever it was packed with: on the bundled tessera-tiny with
// every batchable sampler (LLaDA low-confidence and random remasking with Gumbel noise, Dream's
// algorithms with top-k / top-p, threshold decoding, cfg, Window-Diffusion without its cache), on
// Dream (shifted logits) and on LLaDA2 (block-causal, requests of different blocks); under a memory
// budget that forces packed forwards to be split; with a failing request among good ones; with
// exclusive jobs (a KV-cache request) arriving while batched requests run. Over ranks, a forward that fails
// on one rank ends the job.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "decode/generate.h"
#include "dist/communicator.h"
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

// Every request on its own thread through one Batcher, all started together (with stagger: request i
// i * stagger later).
std::vector<Outcome> batched(Batcher& b, const std::vector<Request>& qs,
                             std::chrono::milliseconds stagger = std::chrono::milliseconds(0)) {
  std::vector<Outcome> out(qs.size());
  std::vector<std::thread> th;
  std::atomic<int> ready{0};
  for (size_t i = 0; i < qs.size(); ++i) {
    th.emplace_back([&, i] {
      ++ready;
      while (ready.load() < static_cast<int>(qs.size())) std::this_thread::yield();
      std::this_thread::sleep_for(stagger * static_cast<int>(i));
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
    o.alg = Unmask::Random;
    o.seed = 12;
  });
  add(23, 4, [](GenerateOptions& o) {
    o.alg = Unmask::Entropy;
    o.temperature = 0.7f;
    o.top_p = 0.9f;
    o.top_k = 50;
    o.block_length = 32;
    o.seed = 13;
  });
  add(12, 5, [](GenerateOptions& o) {
    o.alg = Unmask::TopkMargin;
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

// Dream (shifted logits) and LLaDA2 (block-causal, requests of two attention blocks), without and with
// KV caches (prefix and dual; exact on LLaDA2).
TEST(Batch, DreamAndBlockCausalModels) {
  for (const char* family : {"dream", "llada2"}) {
    TESSERA_TINY_OR_SKIP(dir, family, "--seed 9");
    auto e = Engine::load(dir);
    for (const bool cached : {false, true}) {
      std::vector<Request> qs;
      for (int i = 0; i < 4; ++i) {
        Request q;
        q.prompt = prompt_of(6 + 5 * i, e->vocab_size(), 40 + static_cast<uint64_t>(i));
        q.o.gen_length = 24;
        q.o.steps = 12;
        q.o.block_length = i % 2 == 0 ? 8 : 12;  // LLaDA2: two attention blocks among the requests
        q.o.temperature = i == 3 ? 0.8f : 0.0f;
        q.o.seed = 3;
        if (std::string(family) == "dream") q.o.alg = i % 2 == 0 ? Unmask::MaskgitPlus : Unmask::Entropy;
        if (std::string(family) == "llada2") q.o.threshold = i == 2 ? 0.5f : 0.0f;
        if (cached) q.o.cache = i == 1 ? KvCache::Prefix : KvCache::Dual;
        q.o.eos_ids = {e->config().eos_id};
        qs.push_back(std::move(q));
      }
      std::vector<Outcome> want;
      for (const Request& q : qs) {
        want.push_back(solo(*e, q));
        ASSERT_EQ(want.back().error, "") << family;
      }
      Batcher b(*e, 8, std::chrono::milliseconds(50));
      SCOPED_TRACE(std::string(family) + (cached ? " cached" : ""));
      expect_same(batched(b, qs), want);
      EXPECT_GT(b.stats().largest, 1);
      if (cached) {
        EXPECT_GT(b.stats().cached_sequences, b.stats().cached_forwards) << "no cached step was shared";
      }
    }
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
  // A SparseD request (not batchable: its patterns are engine state) as an exclusive job, solo result
  // first.
  Request cached = qs[1];
  cached.o.sparse = true;
  ASSERT_FALSE(plan_request(cached.o, static_cast<int64_t>(cached.prompt.size()), false).shares_forwards());
  ASSERT_TRUE(plan_request(qs[1].o, static_cast<int64_t>(qs[1].prompt.size()), false).shares_forwards());
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

namespace tessera {
namespace {

std::vector<int32_t> masked_positions(const std::vector<int32_t>& canvas, int32_t mask, int32_t lo,
                                      int32_t hi) {
  std::vector<int32_t> pos;
  for (int32_t i = lo; i < hi; ++i)
    if (canvas[static_cast<size_t>(i)] == mask) pos.push_back(i);
  return pos;
}

// Engine::forward_cached: the cached steps of three requests packed in one forward, each reading its
// keys from its own slot of the pool, give each request's steps alone (slot 0, through the Denoiser
// interface), token and confidence bit for bit. The slots are opened while others hold rows (the pool
// grows and moves them); a closed slot's region is reused; a row that a slot never computed is refused.
TEST(Batch, PackedCacheStepsReadTheirOwnSlots) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto e = Engine::load(dir);
  const int64_t V = e->vocab_size();
  const int32_t M = e->mask_token();
  const std::vector<int> lens = {24, 40, 31};
  std::vector<std::vector<int32_t>> first, second;  // the canvas of the refresh step, then of a later step
  std::vector<SampleParams> sps(3);
  sps[1].temperature = 0.8f, sps[1].gumbel = true, sps[1].seed = 5;
  sps[2].conf = ConfKind::Margin;
  std::vector<int32_t> want_tok;
  std::vector<float> want_conf;
  for (size_t s = 0; s < lens.size(); ++s) {
    first.push_back(test::random_canvas(lens[s], V, 90 + s, M, 0.6));
    second.push_back(first.back());
    for (size_t i = 0; i < second.back().size(); i += 3)  // some masks decided since the refresh
      if (second.back()[i] == M) second.back()[i] = static_cast<int32_t>((i * 31) % 200);
    // Alone: a refresh of the whole canvas, then the rows [lo, n) computed, the rest from the cache.
    e->kv_cache_reset(lens[s]);
    const auto p0 = masked_positions(first[s], M, 0, lens[s]);
    std::vector<int32_t> t0(p0.size());
    std::vector<float> c0(p0.size());
    e->predict_cached(first[s], 0, lens[s], p0, sps[s], t0, c0);
    const int32_t lo = lens[s] / 2;
    const auto p1 = masked_positions(second[s], M, lo, lens[s]);
    std::vector<int32_t> t1(p1.size());
    std::vector<float> c1(p1.size());
    e->predict_cached(second[s], lo, lens[s], p1, sps[s], t1, c1);
    want_tok.insert(want_tok.end(), t1.begin(), t1.end());
    want_conf.insert(want_conf.end(), c1.begin(), c1.end());
  }
  const size_t row_bytes = e->kv_cache_bytes() / static_cast<size_t>(lens[1]);  // slot 0 grew to 40 rows

  auto e2 = Engine::load(dir);
  std::vector<std::vector<int32_t>> all(3), pos0(3), pos1(3), rows1(3);
  for (size_t s = 0; s < 3; ++s) {
    for (int32_t i = 0; i < lens[s]; ++i) all[s].push_back(i);
    pos0[s] = masked_positions(first[s], M, 0, lens[s]);
    pos1[s] = masked_positions(second[s], M, lens[s] / 2, lens[s]);
    for (int32_t i = lens[s] / 2; i < lens[s]; ++i) rows1[s].push_back(i);
  }
  auto refresh = [&](std::vector<Engine::CachedSeq> seqs, std::vector<SampleParams> sp) {
    size_t n = 0;
    for (const auto& q : seqs) n += q.positions.size();
    std::vector<int32_t> t(n);
    std::vector<float> c(n);
    e2->forward_cached(seqs, sp, t, c);
  };
  const int a = e2->kv_open(lens[0]);
  refresh({{a, first[0], all[0], pos0[0]}}, {sps[0]});
  const int b = e2->kv_open(lens[1]);  // the pool grows: slot a's rows move
  const int c = e2->kv_open(lens[2]);
  EXPECT_EQ(e2->kv_slots_open(), 3);
  EXPECT_GE(e2->kv_cache_bytes(), row_bytes * static_cast<size_t>(lens[0] + lens[1] + lens[2]));
  refresh({{b, first[1], all[1], pos0[1]}, {c, first[2], all[2], pos0[2]}}, {sps[1], sps[2]});
  const std::vector<Engine::CachedSeq> step = {{a, second[0], rows1[0], pos1[0]},
                                               {b, second[1], rows1[1], pos1[1]},
                                               {c, second[2], rows1[2], pos1[2]}};
  std::vector<int32_t> tok(want_tok.size());
  std::vector<float> conf(tok.size());
  e2->forward_cached(step, sps, tok, conf);
  EXPECT_EQ(tok, want_tok);
  EXPECT_EQ(conf, want_conf);
  EXPECT_EQ(e2->last_step().shape.n_seqs, 3);
  EXPECT_EQ(e2->last_step().shape.n_kv, lens[0] + lens[1] + lens[2]);

  // Slot b given back: a new slot of at most its rows takes its region, the pool does not grow, and
  // its rows are unwritten (a step that reads them is refused).
  const size_t pool = e2->kv_cache_bytes();
  e2->kv_close(b);
  const int d = e2->kv_open(lens[1] - 4);
  EXPECT_EQ(e2->kv_cache_bytes(), pool);
  const std::vector<int32_t> shorter(second[1].begin(), second[1].end() - 4);
  const std::vector<int32_t> one = {static_cast<int32_t>(shorter.size()) - 1};
  const std::vector<Engine::CachedSeq> bad = {{a, second[0], rows1[0], pos1[0]}, {d, shorter, one, one}};
  test::expect_error([&] { e2->forward_cached(bad, std::span<const SampleParams>(sps).first(2), tok, conf); },
                     "was never computed");
  // The other slots are intact: their step again gives the same.
  e2->forward_cached(
      std::span<const Engine::CachedSeq>(step).first(1), std::span<const SampleParams>(sps).first(1),
      std::span<int32_t>(tok).first(pos1[0].size()), std::span<float>(conf).first(pos1[0].size()));
  EXPECT_TRUE(
      std::equal(tok.begin(), tok.begin() + static_cast<std::ptrdiff_t>(pos1[0].size()), want_tok.begin()));
}

// KV-cache requests (prefix, dual, with threshold decoding, Window-Diffusion's phase cache) are packed
// with each other and with uncached requests, and each one's result equals generate() of it alone;
// requests that arrive while others hold cache rows make the pool grow under them.
TEST(Batch, CachedRequestsArePackedAndEqualTheirSoloGenerations) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto e = Engine::load(dir);
  auto qs = mixed_requests(e->vocab_size(), e->config().eos_id);
  qs[0].o.cache = KvCache::Prefix;
  qs[1].o.cache = KvCache::Dual;
  qs[3].o.cache = KvCache::Dual;
  qs[5].o.cache = KvCache::Dual;  // threshold decoding
  qs[7].o.window_refresh = 3;
  qs[8].o.cache = KvCache::Prefix;
  for (int i : {0, 1, 3, 5, 7, 8})
    ASSERT_GT(plan_request(qs[static_cast<size_t>(i)].o, 1, false).kv_capacity, 0);
  std::vector<Outcome> want;
  for (const Request& q : qs) {
    want.push_back(solo(*e, q));
    ASSERT_EQ(want.back().error, "");
  }
  Batcher b(*e, 16, std::chrono::milliseconds(50));
  expect_same(batched(b, qs), want);
  BatchStats st = b.stats();
  EXPECT_GT(st.cached_forwards, 0);
  EXPECT_GT(st.cached_sequences, st.cached_forwards) << "no KV-cache step was shared";
  // Arriving one after another, while the earlier ones hold their rows.
  expect_same(batched(b, qs, std::chrono::milliseconds(15)), want);
  EXPECT_EQ(e->kv_slots_open(), 0);
}

// Under a memory budget that holds one request's cache (and its largest step) but not two: the
// requests wait for each other's cache instead of failing, and each result equals its solo one; a
// request whose cache does not fit even alone fails with the budget error, the others succeed.
TEST(Batch, CachedRequestsWaitForCacheMemoryUnderABudget) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto plain = Engine::load(dir);
  auto qs = mixed_requests(plain->vocab_size(), plain->config().eos_id);
  qs.resize(4);
  for (auto& q : qs) {
    q.prompt.resize(8);
    q.o.cache = KvCache::Dual;
    q.o.gen_length = 96;
    q.o.block_length = 32;
    q.o.steps = 12;
  }
  std::vector<Outcome> want;
  size_t peak = 0, kv = 0;
  for (const Request& q : qs) {
    want.push_back(solo(*plain, q));
    ASSERT_EQ(want.back().error, "");
    peak = std::max(peak, plain->max_planned_peak());
    kv = std::max(kv, plain->kv_cache_bytes());
  }
  ASSERT_GT(kv + kv / 2, peak) << "the test needs caches larger than the activations";
  EngineOptions opt;
  opt.memory_budget = plain->model().weight_bytes() + peak + kv + kv / 2;
  auto e = Engine::load(dir, opt);
  Request big = qs[0];
  big.o.gen_length = 400;
  big.o.block_length = 400;
  const Outcome big_alone = solo(*e, big);
  EXPECT_NE(big_alone.error.find("cannot hold the weights"), std::string::npos) << big_alone.error;
  qs.push_back(big);
  Batcher b(*e, 8, std::chrono::milliseconds(20));
  // (the batcher checks each request's plan against the budget: its whole canvas, a block of logit
  // rows, its KV cache)
  auto got = batched(b, qs);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[4].error, big_alone.error);
  got.pop_back();
  expect_same(got, want);
  EXPECT_GT(b.stats().cache_waits, 0);
}

// Rank 0 of two whose peer is absent: the collectives give back this rank's own values (wrong sums, which
// this test does not look at) until `fail_after` more all-reduces have run, then one throws, as MPI's do
// when a peer is lost; end_job ends this process (the default abort_job) as MPI_Abort would end the job.
class LonelyRankZero final : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* name() const override { return "mpi"; }
  void all_reduce_sum(float*, size_t n) override {
    count(n * sizeof(float));
    if (fail_after >= 0 && fail_after-- == 0) fail("MPI all-reduce failed on rank 0: injected");
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    count(bytes);
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  }
  void all_to_all(const void* send, void* recv, size_t bytes) override {
    count(2 * bytes);
    std::memcpy(recv, send, 2 * bytes);
  }
  void broadcast(void*, size_t bytes, int) override { count(bytes); }
  void barrier() override {}
  int fail_after = -1;
};

// A packed forward that fails on one rank (the others ran its collectives, or wait in them) is not retried
// call by call there, which would pair that rank's collectives with the others' out of order: the job
// ends with one line naming the failure.
TEST(Batch, AForwardThatFailsOnOneRankEndsTheJob) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the engine's and OpenMP's threads: no fork
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  EXPECT_EXIT(
      {
        auto comm = std::make_shared<LonelyRankZero>();
        auto e = Engine::load(dir, EngineOptions{.comm = comm, .tp = 2});
        auto qs = mixed_requests(e->vocab_size(), e->config().eos_id);
        qs.resize(3);
        comm->fail_after = 5;  // inside the first packed forward
        Batcher b(*e, 4, std::chrono::milliseconds(50), /*over_ranks=*/true);
        batched(b, qs);
        std::_Exit(0);
      },
      testing::ExitedWithCode(3),
      "rank 0 of 2: a forward of [0-9]+ sequences? failed \\(MPI all-reduce failed on rank 0: injected\\): "
      "the "
      "ranks are no longer in step; ending the job");
}

// A generation that runs alone over ranks (an exclusive job) and fails midway on one rank does not just
// fail its request there: the other ranks wait in its next collectives. The job ends with one line.
TEST(Batch, AGenerationRunningAloneThatFailsMidwayEndsTheJob) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  EXPECT_EXIT(
      {
        auto comm = std::make_shared<LonelyRankZero>();
        auto e = Engine::load(dir, EngineOptions{.comm = comm, .tp = 2});
        const Request q = mixed_requests(e->vocab_size(), e->config().eos_id)[0];
        comm->fail_after = 20;  // in the generation's first steps
        Batcher b(*e, 1, std::chrono::milliseconds(50), /*over_ranks=*/true);
        try {
          b.run([&] { generate(*e, q.prompt, q.o, [&](const StepEvent&) { b.agree_stop(false); }); }, true,
                1);
        } catch (...) {
        }
        std::_Exit(0);
      },
      testing::ExitedWithCode(3),
      "rank 0 of 2: a generation running alone failed \\(MPI all-reduce failed on rank 0: injected\\): the "
      "ranks are no longer in step; ending the job");
}

// What does not leave the ranks out of step stays the request's error and the job goes on: a failure
// before the job's first collective (a request every rank refuses alike), and a stop the ranks agreed on.
TEST(Batch, AloneOverRanksARefusalOrAnAgreedStopFailsOnlyTheRequest) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto comm = std::make_shared<LonelyRankZero>();
  auto e = Engine::load(dir, EngineOptions{.comm = comm, .tp = 2});
  Batcher b(*e, 1, std::chrono::milliseconds(50), /*over_ranks=*/true);
  const auto error_of = [&](const std::function<void()>& job, uint64_t key) {
    try {
      b.run(job, true, key);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string("(none)");
  };
  EXPECT_EQ(error_of([] { fail("the prompt is too long"); }, 1), "the prompt is too long");
  EXPECT_EQ(error_of(
                [&] {
                  float x = 1;
                  comm->all_reduce_sum(&x, 1);  // a step's collectives
                  if (b.agree_stop(true)) fail("this request was stopped");
                },
                2),
            "this request was stopped");
  // and the job goes on: the next request generates
  const Request q = mixed_requests(e->vocab_size(), e->config().eos_id)[0];
  Outcome o;
  EXPECT_EQ(error_of([&] { o = solo(*e, q); }, 3), "(none)");
  EXPECT_EQ(o.error, "");
  EXPECT_GT(o.events, 0);
}

}  // namespace
}  // namespace tessera
