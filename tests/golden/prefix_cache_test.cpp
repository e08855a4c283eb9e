// The cross-request prefix cache (engine/prefix_cache.h) on the tiny LLaDA2 checkpoint (block-causal): a
// request that begins with the whole blocks of an earlier one restores their K / V instead of computing
// them, and its tokens are those of an engine without the cache (exact), alone and batched; the cache
// stays within its cap and within the memory budget; bidirectional models do not use it.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <thread>

#include "decode/generate.h"
#include "engine/batcher.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

constexpr const char* kArgs = "--seed 7";

using test::ordinary_tokens;

GenerateOptions cached(int block, int32_t eos) {
  GenerateOptions o;
  o.gen_length = 24;
  o.block_length = block;
  o.steps = block;
  o.threshold = 0.05f;
  o.cache = KvCache::Prefix;
  o.eos_ids = {eos};
  o.stop_at_eos = false;
  return o;
}

// A shared system prompt of 3 whole blocks of 8, then each request's own tail.
struct Prompts {
  std::vector<int32_t> shared, a, b, c;
};
Prompts prompts(int64_t vocab) {
  Prompts p;
  p.shared = ordinary_tokens(24, vocab, 1);
  p.a = p.shared;
  for (int32_t t : ordinary_tokens(5, vocab, 2)) p.a.push_back(t);
  p.b = p.shared;
  for (int32_t t : ordinary_tokens(11, vocab, 3)) p.b.push_back(t);     // one more whole block of its own
  p.c = std::vector<int32_t>(p.shared.begin(), p.shared.begin() + 16);  // diverges in the third block
  for (int32_t t : ordinary_tokens(13, vocab, 4)) p.c.push_back(t);
  return p;
}

TEST(PrefixCache, RestoredBlocksGiveTheTokensOfTheUncachedEngine) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto plain = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  auto shared =
      Engine::load(dir, EngineOptions{.precision = Precision::F32, .prefix_cache_bytes = size_t{64} << 20});
  const Prompts p = prompts(plain->vocab_size());
  const GenerateOptions o = cached(8, plain->config().eos_id);
  // a: nothing stored yet, its 3 whole blocks are stored; b: restores 3, stores its 4th; a again:
  // restores 3; c: restores the first 2 (the third differs) and stores its own third.
  const std::vector<std::pair<const std::vector<int32_t>*, int64_t>> runs = {
      {&p.a, 0}, {&p.b, 3}, {&p.a, 3}, {&p.c, 2}};
  int64_t hits = 0;
  for (const auto& [prompt, restored] : runs) {
    const GenerateResult want = generate(*plain, *prompt, o);
    const GenerateResult got = generate(*shared, *prompt, o);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.order, want.order);
    const PrefixCache::Stats s = shared->prefix_stats();
    EXPECT_EQ(s.hit_blocks - hits, restored) << "prompt of " << prompt->size();
    hits = s.hit_blocks;
  }
  const PrefixCache::Stats s = shared->prefix_stats();
  EXPECT_EQ(s.stored_blocks, 3 + 1 + 1);
  EXPECT_EQ(s.evicted_blocks, 0);
  EXPECT_GT(shared->prefix_bytes(), 0u);
  EXPECT_EQ(plain->prefix_bytes(), 0u);
  // Another block size is another tree: nothing restored, tokens still those of the plain engine.
  const GenerateOptions o16 = cached(16, plain->config().eos_id);
  EXPECT_EQ(generate(*shared, p.a, o16).tokens, generate(*plain, p.a, o16).tokens);
  EXPECT_EQ(shared->prefix_stats().hit_blocks, hits);
  // DES's expert counts (serve's default on MoE models) change no row: the blocks are restored.
  GenerateOptions counted = o;
  counted.moe_stats = true;
  EXPECT_EQ(generate(*shared, p.b, counted).tokens, generate(*plain, p.b, counted).tokens);
  EXPECT_EQ(shared->prefix_stats().hit_blocks - hits, 4);
}

// Requests through the batcher (serve's path), concurrently: each gets the tokens of the plain engine.
TEST(PrefixCache, BatchedRequestsShareBlocksExactly) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto plain = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  auto shared =
      Engine::load(dir, EngineOptions{.precision = Precision::F32, .prefix_cache_bytes = size_t{64} << 20});
  const Prompts p = prompts(plain->vocab_size());
  const GenerateOptions o = cached(8, plain->config().eos_id);
  const std::vector<const std::vector<int32_t>*> list = {&p.a, &p.b, &p.c, &p.a, &p.b, &p.c};
  std::vector<GenerateResult> want;
  for (const auto* q : list) want.push_back(generate(*plain, *q, o));
  Batcher batcher(*shared, 4);
  for (int round = 0; round < 2; ++round) {  // the second round restores what the first stored
    std::vector<GenerateResult> got(list.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < list.size(); ++i)
      ts.emplace_back([&, i] { got[i] = batcher.generate(*list[i], o); });
    for (auto& t : ts) t.join();
    for (size_t i = 0; i < list.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << round << " " << i;
  }
  EXPECT_GE(shared->prefix_stats().hit_blocks, 6 * 2);
}

// A cap below one block stores nothing; a cap of two blocks keeps the two most recently used leaves'
// paths; under a memory budget the cache never takes what a step needs (a budget that fits the requests
// alone still runs them, with the cache emptied when the step would not fit).
TEST(PrefixCache, StaysWithinItsCapAndTheBudget) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto plain = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const Prompts p = prompts(plain->vocab_size());
  const GenerateOptions o = cached(8, plain->config().eos_id);
  const GenerateResult want = generate(*plain, p.b, o);
  auto tiny_cap = Engine::load(dir, EngineOptions{.precision = Precision::F32, .prefix_cache_bytes = 16});
  EXPECT_EQ(generate(*tiny_cap, p.b, o).tokens, want.tokens);
  EXPECT_EQ(tiny_cap->prefix_stats().stored_blocks, 0);
  EXPECT_EQ(tiny_cap->prefix_bytes(), 0u);

  auto measure =
      Engine::load(dir, EngineOptions{.precision = Precision::F32, .prefix_cache_bytes = size_t{64} << 20});
  generate(*measure, p.a, o);
  const size_t block_bytes = measure->prefix_bytes() / 3;
  ASSERT_GT(block_bytes, 0u);
  auto two =
      Engine::load(dir, EngineOptions{.precision = Precision::F32, .prefix_cache_bytes = 2 * block_bytes});
  EXPECT_EQ(generate(*two, p.a, o).tokens, generate(*plain, p.a, o).tokens);
  EXPECT_EQ(two->prefix_stats().stored_blocks, 2);  // the third did not fit beside the first two
  EXPECT_LE(two->prefix_bytes(), 2 * block_bytes);
  EXPECT_EQ(generate(*two, p.c, o).tokens, generate(*plain, p.c, o).tokens);
  EXPECT_LE(two->prefix_bytes(), 2 * block_bytes);

  // The budget: the weights, the pool and the largest step of these requests, and little more.
  const size_t weights = plain->model().weight_bytes();
  const size_t budget = weights + plain->kv_cache_bytes() + plain->max_planned_peak() + block_bytes / 2;
  auto tight = Engine::load(
      dir, EngineOptions{
               .precision = Precision::F32, .memory_budget = budget, .prefix_cache_bytes = size_t{64} << 20});
  for (const auto* q : {&p.a, &p.b, &p.c, &p.a}) {
    EXPECT_EQ(generate(*tight, *q, o).tokens, generate(*plain, *q, o).tokens);
    EXPECT_LT(weights + tight->kv_cache_bytes() + tight->prefix_bytes(), budget);
  }
}

TEST(PrefixCache, BidirectionalModelsDoNotUseIt) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 3");
  auto e =
      Engine::load(dir, EngineOptions{.precision = Precision::F32, .prefix_cache_bytes = size_t{64} << 20});
  GenerateOptions o;
  o.gen_length = 16;
  o.block_length = 8;
  o.steps = 16;
  o.cache = KvCache::Prefix;
  const auto prompt = ordinary_tokens(24, e->vocab_size(), 1);
  generate(*e, prompt, o);
  generate(*e, prompt, o);
  EXPECT_EQ(e->prefix_stats().lookups, 0);
  EXPECT_EQ(e->prefix_bytes(), 0u);
}

}  // namespace
}  // namespace tessera
