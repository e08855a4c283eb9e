// The KV cache (Fast-dLLM prefix / dual cache, the engine's State tensors) on tiny checkpoints in the
// real layouts: a step over the whole canvas equals the uncached forward; a step over a row range with
// the other rows' K / V from an earlier canvas equals the numpy reference of that computation (and
// differs from recomputing everything, so the cache is really read); for block-causal LLaDA2 the
// cached generation equals the uncached one token for token; misuse fails clearly.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::all_positions;
using test::expect_error;
using test::random_canvas;

constexpr const char* kFamilies[] = {"llada", "dream", "llada_moe", "llada2"};

TEST(KvCache, WholeCanvasStepEqualsTheUncachedForward) {
  for (const char* fam : kFamilies) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const int64_t V = e->vocab_size(), n = 75;
    const auto canvas = random_canvas(n, V, 11, e->mask_token(), 0.5);
    const auto pos = all_positions(n);
    std::vector<float> full(static_cast<size_t>(n * V)), cached(full.size());
    e->logits(canvas, pos, full);
    e->kv_cache_reset(n);
    e->logits_cached(canvas, 0, n, pos, cached);
    EXPECT_LE(test::rel_error(cached.data(), full.data(), full.size()), 1e-6) << fam;
    EXPECT_GT(e->kv_cache_bytes(), 0u);
  }
}

// bf16 models keep the cache in bf16: half the bytes of f32. With the f32 attention kernel a
// whole-canvas step differs from the uncached forward only by K and V rounded to bf16 (within the bf16
// bound of the reference tests); the bf16 kernel rounds the uncached K and V to the same values, so
// there the two are equal.
TEST(KvCache, Bf16CacheHoldsHalfTheBytes) {
  for (const char* fam : kFamilies) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, EngineOptions{.cpu_attention = CpuAttention::F32});  // bf16 compute
    auto f = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const int64_t V = e->vocab_size(), n = 75;
    e->kv_cache_reset(n);
    f->kv_cache_reset(n);
    EXPECT_EQ(e->kv_cache_bytes() * 2, f->kv_cache_bytes()) << fam;
    EXPECT_EQ(static_cast<int64_t>(e->kv_cache_bytes()), e->config().kv_cache_bytes_per_token(2) * n) << fam;
    const auto canvas = random_canvas(n, V, 21, e->mask_token(), 0.5);
    const auto pos = all_positions(n);
    std::vector<float> full(static_cast<size_t>(n * V)), cached(full.size());
    e->logits(canvas, pos, full);
    e->logits_cached(canvas, 0, n, pos, cached);
    const double err = test::rel_error(cached.data(), full.data(), full.size());
    EXPECT_LE(err, 3e-2) << fam;
    EXPECT_GT(err, 0.0) << fam << ": K / V were not rounded to bf16 (is the cache f32?)";
    std::printf("%s bf16: cached whole-canvas step vs uncached %.2e\n", fam, err);
    if (resolve_cpu_attention(CpuAttention::Auto) != CpuAttention::BF16) continue;
    auto b = Engine::load(dir, EngineOptions{.cpu_attention = CpuAttention::BF16});
    b->kv_cache_reset(n);
    b->logits(canvas, pos, full);
    b->logits_cached(canvas, 0, n, pos, cached);
    EXPECT_EQ(test::rel_error(cached.data(), full.data(), full.size()), 0.0) << fam << " (bf16 attention)";
  }
}

// Canvas A fills the cache; canvas B differs from A only inside [lo, hi) and the step computes just
// those rows. The reference (reference.py logits --cache-tokens A --compute lo,hi) does the same in
// numpy: A's per-layer K / V for the other rows, B's for [lo, hi).
TEST(KvCache, RangeStepMatchesTheNumpyReference) {
  for (const char* fam : kFamilies) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const test::CachedStep c = test::run_cached_step(*e, dir);
    EXPECT_EQ(e->last_step().shape.n_query, c.hi - c.lo) << fam;
    EXPECT_EQ(e->last_step().shape.n_kv, static_cast<int64_t>(c.a.size())) << fam;
    ASSERT_EQ(c.reference.size(), c.got.size());
    const double err = test::rel_error(c.got.data(), c.reference.data(), c.got.size());
    EXPECT_LE(err, 5e-6) << fam;  // f32; observed up to 1.2e-6
    std::vector<float> full(c.got.size());
    e->logits(c.b, c.positions, full);  // recomputing everything from B
    const double diff = test::rel_error(c.got.data(), full.data(), c.got.size());
    if (std::string(fam) == "llada2") {
      // Block-causal, blocks of 32: rows before lo never see [lo, hi), so their cached K / V are B's.
      EXPECT_LE(diff, 1e-5) << fam;
    } else {
      EXPECT_GT(diff, 1e-3) << fam << ": the stale rows of A should show (was the cache read?)";
    }
    std::printf("%s: cached step vs reference %.2e, vs full recompute %.2e\n", fam, err, diff);
  }
}

// LLaDA2 (block-causal): rows of finished blocks never change nor see later rows, so the cached
// generation decides exactly what the uncached one decides (f32; threshold and step schedules;
// prompt ending mid-block).
TEST(KvCache, BlockCausalGenerationIsExact) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = random_canvas(13, e->vocab_size() - 8, 5, 0, 0.0);
  for (const int block : {8, 16}) {
    for (const float thr : {0.0f, 0.05f}) {
      GenerateOptions o;
      o.gen_length = 30;
      o.block_length = block;
      o.steps = block / 2;
      o.threshold = thr;
      o.stop_at_eos = false;
      const GenerateResult exact = generate(*e, prompt, o);
      for (const char* c : {"prefix", "dual"}) {
        o.cache = parse_kv_cache(c);
        const GenerateResult got = generate(*e, prompt, o);
        EXPECT_EQ(got.tokens, exact.tokens) << c << " block " << block << " threshold " << thr;
        EXPECT_EQ(got.order, exact.order) << c << " block " << block << " threshold " << thr;
      }
      o.cache = KvCache::None;
    }
  }
}

// Bidirectional models: the caches are approximations, but every position is still decided once,
// the first forward of every block is exact, and the later forwards compute fewer rows.
TEST(KvCache, BidirectionalGenerationRunsWithFewerRows) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = random_canvas(20, e->vocab_size() - 8, 6, 0, 0.0);
  GenerateOptions o;
  o.gen_length = 32;
  o.block_length = 8;
  o.steps = 16;
  o.stop_at_eos = false;
  const GenerateResult exact = generate(*e, prompt, o);
  for (const char* c : {"prefix", "dual"}) {
    o.cache = parse_kv_cache(c);
    const GenerateResult got = generate(*e, prompt, o);
    ASSERT_EQ(got.tokens.size(), 32u) << c;
    EXPECT_EQ(got.steps_run, exact.steps_run) << c;
    EXPECT_EQ(got.order.front(), exact.order.front()) << c;  // the first step computes the whole canvas
    // The last forward computed the last block (dual) or the last block and what follows (prefix).
    EXPECT_EQ(e->last_step().shape.n_query, 8) << c;
    EXPECT_EQ(e->last_step().shape.n_kv, 52) << c;
  }
}

TEST(KvCache, MisuseFailsClearly) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir);
  const int64_t V = e->vocab_size();
  const auto canvas = random_canvas(40, V, 3, e->mask_token(), 0.5);
  const std::vector<int32_t> pos = {10, 11};
  std::vector<int32_t> tok(2);
  std::vector<float> conf(2);
  const SampleParams sp;
  expect_error([&] { e->predict_cached(canvas, 0, 40, pos, sp, tok, conf); },
               "KV cache: no cache for a canvas of 40 positions");
  e->kv_cache_reset(40);
  expect_error([&] { e->predict_cached(canvas, 8, 16, pos, sp, tok, conf); },
               "KV cache: canvas row 0 was never computed in this request");
  expect_error([&] { e->predict_cached(canvas, 16, 8, pos, sp, tok, conf); },
               "KV cache: the computed rows [16, 8) are not a non-empty range");
  e->predict_cached(canvas, 0, 40, pos, sp, tok, conf);
  e->predict_cached(canvas, 8, 16, pos, sp, tok, conf);  // now every other row is cached
  e->kv_cache_reset(40);                                 // a new request forgets them
  expect_error([&] { e->predict_cached(canvas, 8, 16, pos, sp, tok, conf); }, "was never computed");
  expect_error([&] { e->kv_cache_reset(e->config().max_positions + 1); }, "does not fit the model's");
  // A budget that holds the weights but not the weights plus the cache.
  EngineOptions o;
  o.memory_budget = e->model().weight_bytes() + 4096;
  auto tight = Engine::load(dir, o);
  expect_error([&] { tight->kv_cache_reset(40); }, "plus a KV cache of 40 positions");
}

// Under a memory budget, what an ended request left held (the KV cache pool, the SparseD patterns) is
// freed when a later step would not fit beside it; a request's live cache is never freed.
TEST(KvCache, AnEndedRequestsMemoryIsFreedWhenAStepNeedsIt) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  const int64_t n = 120;  // the uncached step that needs the memory: n tokens, every one a logit row
  auto plain = Engine::load(dir);
  plain->check_memory(n, n, OutputMode::Sample, false);
  const size_t peak = plain->last_step().planned_peak, w = plain->model().weight_bytes();
  EngineOptions o;
  o.memory_budget = w + peak + peak / 8;
  // A cache of most of the budget: the step cannot fit beside it even fully chunked.
  const int64_t per_row = plain->config().kv_cache_bytes_per_token(2);
  const int64_t rows = std::min<int64_t>(static_cast<int64_t>(peak) / per_row, plain->config().max_positions);
  ASSERT_GT(rows, n) << "the test needs a cache larger than the step's canvas";

  auto e = Engine::load(dir, o);
  e->kv_cache_reset(rows);  // a request holding its cache: the step does not fit
  const size_t pool = e->kv_cache_bytes();
  ASSERT_EQ(pool, static_cast<size_t>(rows * per_row));
  expect_error([&] { e->check_memory(n, n, OutputMode::Sample, false); }, "memory budget");
  EXPECT_EQ(e->kv_cache_bytes(), pool);  // a live cache is kept
  e->kv_cache_end();                     // the request ended: its pool is freed for the step, and only then
  EXPECT_EQ(e->kv_cache_bytes(), pool);
  e->check_memory(n, n, OutputMode::Sample, false);
  EXPECT_EQ(e->kv_cache_bytes(), 0u);
  // The next cached request takes a pool again.
  e->kv_cache_reset(40);
  EXPECT_EQ(e->kv_cache_bytes(), static_cast<size_t>(40 * per_row));

  // generate() ends its cache however it ends. Here its cache reuses the large pool in place, so its
  // first forward does not fit the budget; the pool is freed for the next step all the same.
  auto g = Engine::load(dir, o);
  g->kv_cache_reset(rows);
  GenerateOptions go;
  go.gen_length = 16;
  go.block_length = 8;
  go.steps = 4;
  go.cache = KvCache::Prefix;
  const std::vector<int32_t> prompt = {1, 2, 3};
  expect_error([&] { generate(*g, prompt, go); }, "memory budget");
  EXPECT_EQ(g->kv_slots_open(), 0);
  EXPECT_EQ(g->kv_cache_bytes(), pool);
  g->check_memory(n, n, OutputMode::Sample, false);
  EXPECT_EQ(g->kv_cache_bytes(), 0u);
  const GenerateResult r = generate(*g, prompt, go);  // a fresh pool of its own canvas
  EXPECT_EQ(r.tokens.size(), 16u);
  EXPECT_EQ(g->kv_slots_open(), 0);
  EXPECT_EQ(g->kv_cache_bytes(), static_cast<size_t>(19 * per_row));

  // SparseD patterns outside a sparse request are freed the same way: block 1 makes them large.
  const int64_t canvas = plain->config().max_positions;
  const auto patterns = static_cast<size_t>(plain->config().sparse_pattern_bytes(canvas, 1));
  ASSERT_GT(patterns, peak / 4);
  EngineOptions so;
  so.memory_budget = w + patterns + peak / 8;
  auto s = Engine::load(dir, so);
  s->sparse_begin(canvas, SparseConfig{1, 0.5f, 10});
  expect_error([&] { s->check_memory(n, n, OutputMode::Sample, false); }, "memory budget");
  EXPECT_EQ(s->sparse_bytes(), patterns);
  s->sparse_end();
  s->check_memory(n, n, OutputMode::Sample, false);
  EXPECT_EQ(s->sparse_bytes(), 0u);
}

TEST(KvCache, CliGeneratesWithEveryCache) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  const std::string bin = TESSERA_BINARY;
  std::string none, out;
  const std::string base =
      bin + " generate -m " + dir.string() + " -p hi --gen-length 24 --block-length 8 --precision f32 --raw ";
  ASSERT_EQ(test::run_command(base + "--json 2>/dev/null", &none), 0) << none;
  const auto exact = nlohmann::json::parse(none);
  ASSERT_EQ(exact["tokens"].size(), 24u) << none;
  for (const char* c : {"prefix", "dual"}) {
    ASSERT_EQ(test::run_command(base + "--json --cache " + c + " 2>/dev/null", &out), 0) << out;
    EXPECT_EQ(nlohmann::json::parse(out)["tokens"], exact["tokens"]) << c;
  }
  test::expect_command_error(base + "--cache lru 2>&1", "--cache");
  // inspect predicts the cache the engine holds for a canvas of that size.
  auto e = Engine::load(dir);
  e->kv_cache_reset(40);
  ASSERT_EQ(test::run_command(bin + " inspect " + dir.string() + " --context 40", &out), 0) << out;
  const std::string want =
      "kv cache     " + std::to_string(e->kv_cache_bytes() / 1024) + ".0 KiB at context 40";
  EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
}

}  // namespace
}  // namespace tessera
