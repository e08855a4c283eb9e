// The unmasking loops against a fake Denoiser (fake_denoiser.h): schedules, samplers, stop conditions,
// cfg and infilling.
#include <gtest/gtest.h>

#include "fake_denoiser.h"

namespace tessera {
namespace {

TEST(Schedule, LLaDA) {
  EXPECT_EQ(llada_schedule(10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(llada_schedule(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(llada_schedule(3, 5), (std::vector<int>{1, 1, 1, 0, 0}));
}

TEST(Schedule, DreamTimestepsAndCounts) {
  const std::vector<float> ts = dream_timesteps(4, 1e-3f);
  ASSERT_EQ(ts.size(), 5u);
  EXPECT_FLOAT_EQ(ts[0], 1.0f);
  EXPECT_FLOAT_EQ(ts[1], 0.75025f);
  EXPECT_FLOAT_EQ(ts[2], 0.5005f);
  EXPECT_FLOAT_EQ(ts[3], 0.25075f);
  EXPECT_FLOAT_EQ(ts[4], 0.001f);
  // n=10: 10*0.24975=2.5 -> 2; 8*(1-.5005/.75025)=2.66 -> 2; 6*(1-.25075/.5005)=2.99 -> 2; last 4.
  EXPECT_EQ(dream_schedule(10, 4, 1e-3f), (std::vector<int>{2, 2, 2, 4}));
  // n=8, 8 steps: 8*0.124875 = 0.999 -> 0 first, then 1 each, the last step takes the 2 left.
  EXPECT_EQ(dream_schedule(8, 8, 1e-3f), (std::vector<int>{0, 1, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(dream_schedule(5, 1, 1e-3f), (std::vector<int>{5}));
  for (int n : {1, 7, 64, 128})
    for (int s : {1, 3, 16, 128, 512}) {
      const std::vector<int> k = dream_schedule(n, s, 1e-3f);
      int sum = 0;
      for (int x : k) sum += x;
      EXPECT_EQ(sum, n) << n << " " << s;
    }
  EXPECT_FLOAT_EQ(dream_transfer_prob(0.75025f, 0.5005f, false), 1.0f - 0.5005f / 0.75025f);
  EXPECT_FLOAT_EQ(dream_transfer_prob(0.5f, 0.25f, true), 1.0f);
}

TEST(Generate, LLaDAScheduleCounts) {
  FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return float(p); }));
  GenerateOptions o;
  o.gen_length = 10;
  o.block_length = 10;
  o.steps = 4;
  GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(sizes(r), (std::vector<size_t>{3, 3, 2, 2}));
  EXPECT_EQ(r.steps_run, 4);
  expect_each_once(r, 3, 10);
  ASSERT_EQ(r.tokens.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r.tokens[static_cast<size_t>(i)], (i + 3) % 5);
}

TEST(Generate, LLaDABlocksInOrder) {
  FakeDenoiser d(peaked([](int) { return 4; }, [](int p) { return float(p % 3); }));
  GenerateOptions o;
  o.gen_length = 12;
  o.block_length = 4;
  o.steps = 6;  // 2 steps per block
  std::vector<int> event_steps;
  GenerateResult r = generate(d, kPrompt, o, [&](const StepEvent& e) {
    event_steps.push_back(e.step);
    EXPECT_EQ(e.canvas.size(), 15u);
    for (int32_t p : e.newly_decided_positions) EXPECT_NE(e.canvas[static_cast<size_t>(p)], kMask);
  });
  ASSERT_EQ(r.order.size(), 6u);
  EXPECT_EQ(event_steps, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  for (size_t s = 0; s < 6; ++s) {
    const int lo = 3 + 4 * static_cast<int>(s / 2);
    EXPECT_EQ(r.order[s].size(), 2u);
    for (int32_t p : r.order[s]) EXPECT_TRUE(p >= lo && p < lo + 4) << "step " << s << " decided " << p;
    // Only undecided positions of the current block are asked for.
    for (int32_t p : d.calls[s]) EXPECT_TRUE(p >= lo && p < lo + 4);
  }
  EXPECT_EQ(d.calls[0].size(), 4u);
  EXPECT_EQ(d.calls[1].size(), 2u);
  expect_each_once(r, 3, 12);
  // Each step draws fresh noise: seed = rng_mix(seed + global step).
  for (size_t s = 0; s < 6; ++s) EXPECT_EQ(d.seeds[s], rng_mix(o.seed + s));
}

TEST(Generate, LowConfidencePicksMostConfidentTiesLowerFirst) {
  // strength by position offset: 1, 5, 3, 5, 0, 2 -> order 4,6 (tie at 5: lower first), then 5, 8, 3, 7
  const float st[] = {1, 5, 3, 5, 0, 2};
  FakeDenoiser d(peaked([](int) { return 2; }, [&](int p) { return st[p - 3]; }));
  GenerateOptions o;
  o.gen_length = 6;
  o.block_length = 6;
  o.steps = 6;
  GenerateResult r = generate(d, kPrompt, o);
  std::vector<int32_t> seq;
  for (const auto& s : r.order) seq.insert(seq.end(), s.begin(), s.end());
  EXPECT_EQ(seq, (std::vector<int32_t>{4, 6, 5, 8, 3, 7}));
}

TEST(Generate, ThresholdAcceptsAllAboveAndAtLeastOne) {
  // Positions 4 and 7 are confident (0.9995 >= 0.9); the others (0.28) come one per step, best first.
  const float st[] = {1.0f, 9.0f, 1.2f, 1.0f, 9.0f, 1.1f};
  FakeDenoiser d(peaked([](int) { return 3; }, [&](int p) { return st[p - 3]; }));
  ASSERT_GT(conf_of(9.0f), 0.9);
  ASSERT_LT(conf_of(1.2f), 0.9);
  GenerateOptions o;
  o.gen_length = 6;
  o.block_length = 6;
  o.steps = 7;  // not split under threshold decoding
  o.threshold = 0.9f;
  GenerateResult r = generate(d, kPrompt, o);
  ASSERT_EQ(r.order.size(), 5u);
  EXPECT_EQ(r.order[0], (std::vector<int32_t>{4, 7}));
  EXPECT_EQ(r.order[1], (std::vector<int32_t>{5}));
  EXPECT_EQ(r.order[2], (std::vector<int32_t>{8}));
  EXPECT_EQ(r.order[3], (std::vector<int32_t>{3}));
  EXPECT_EQ(r.order[4], (std::vector<int32_t>{6}));
  EXPECT_EQ(r.steps_run, 5);

  // Threshold with blocks: block 1 finishes before block 2 starts.
  o.block_length = 3;
  GenerateResult b = generate(d, kPrompt, o);
  EXPECT_EQ(b.order[0], (std::vector<int32_t>{4}));
  EXPECT_EQ(b.order[1], (std::vector<int32_t>{5}));
  EXPECT_EQ(b.order[2], (std::vector<int32_t>{3}));
  EXPECT_EQ(b.order[3], (std::vector<int32_t>{7}));
  expect_each_once(b, 3, 6);
}

TEST(Generate, DreamLinspaceCounts) {
  for (auto [n, steps] : std::vector<std::pair<int, int>>{{10, 4}, {8, 8}, {16, 5}, {12, 3}}) {
    FakeDenoiser d(peaked([](int) { return 1; }, [](int p) { return float(p % 4); }));
    GenerateOptions o;
    o.alg = Unmask::MaskgitPlus;
    o.gen_length = n;
    o.steps = steps;
    o.block_length = 1000;  // ignored: >= gen_length
    GenerateResult r = generate(d, kPrompt, o);
    std::vector<size_t> want;
    for (int k : dream_schedule(n, steps, o.eps))
      if (k > 0) want.push_back(static_cast<size_t>(k));
    EXPECT_EQ(sizes(r), want) << n << " " << steps;
    expect_each_once(r, 3, n);
  }
}

TEST(Generate, DreamScheduleInsideBlocks) {
  FakeDenoiser d(peaked([](int) { return 1; }, [](int p) { return float(p % 4); }));
  GenerateOptions o;
  o.alg = Unmask::Entropy;
  o.gen_length = 20;
  o.block_length = 10;
  o.steps = 8;  // 4 per block: 2,2,2,4 in each
  GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(sizes(r), (std::vector<size_t>{2, 2, 2, 4, 2, 2, 2, 4}));
  for (size_t s = 0; s < 4; ++s)
    for (int32_t p : r.order[s]) EXPECT_LT(p, 13);
  expect_each_once(r, 3, 20);
}

// Four positions with hand-set distributions (V = 5): the first step of gen 4 / steps 2 decides one.
//   Y (0.65, 0.30, 0.0167 x3): max prob
//   Z (0.60, 0.10 x4):         max margin 0.5
//   X (0.62, 0.38, ~0 x3):     max neg-entropy -0.664
//   W uniform:                 worst everywhere
TEST(Generate, ProbMarginEntropyChooseAsHandComputed) {
  auto lg = [](std::vector<double> ps) {
    std::vector<float> r;
    for (double x : ps) r.push_back(static_cast<float>(std::log(x)));
    return r;
  };
  const std::vector<std::vector<float>> rows = {
      lg({0.2, 0.2, 0.2, 0.2, 0.2}),                   // W at 3
      lg({0.65, 0.30, 0.05 / 3, 0.05 / 3, 0.05 / 3}),  // Y at 4
      lg({0.60, 0.10, 0.10, 0.10, 0.10}),              // Z at 5
      lg({0.62, 0.38 - 3e-9, 1e-9, 1e-9, 1e-9}),       // X at 6
  };
  ASSERT_EQ(dream_schedule(4, 2, 1e-3f), (std::vector<int>{1, 3}));
  const std::pair<const char*, int32_t> cases[] = {{"maskgit_plus", 4}, {"topk_margin", 5}, {"entropy", 6}};
  for (auto [alg, want] : cases) {
    FakeDenoiser d([&](std::span<const int32_t>, int p) { return rows[static_cast<size_t>(p - 3)]; }, 5, 4);
    GenerateOptions o;
    o.alg = parse_unmask(alg);
    o.gen_length = 4;
    o.steps = 2;
    GenerateResult r = generate(d, kPrompt, o);
    ASSERT_EQ(r.order.size(), 2u);
    EXPECT_EQ(r.order[0], (std::vector<int32_t>{want})) << alg;
  }
}

TEST(Generate, OriginReproducibleAndKeyed) {
  FakeDenoiser d(peaked([](int p) { return p % 6; }, [](int) { return 2.0f; }));
  GenerateOptions o;
  o.alg = Unmask::Origin;
  o.gen_length = 16;
  o.steps = 6;
  o.seed = 1234;
  GenerateResult a = generate(d, kPrompt, o), b = generate(d, kPrompt, o);
  EXPECT_EQ(a.order, b.order);
  EXPECT_EQ(a.tokens, b.tokens);
  expect_each_once(a, 3, 16);
  // The documented contract: at step i each undecided position transfers when
  // rng_uniform(rng_mix(rng_mix(seed + i) ^ 0xd1b54a32d192ed03), position, 0) < 1 - s/t (1 at the end).
  const std::vector<float> ts = dream_timesteps(6, o.eps);
  std::vector<char> dec(19, 0);
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 6; ++i) {
    const uint64_t hs = rng_mix(rng_mix(o.seed + static_cast<uint64_t>(i)) ^ 0xd1b54a32d192ed03ull);
    const float pt = dream_transfer_prob(ts[static_cast<size_t>(i)], ts[static_cast<size_t>(i) + 1], i == 5);
    std::vector<int32_t> s;
    for (int p = 3; p < 19; ++p)
      if (!dec[static_cast<size_t>(p)] && rng_uniform(hs, static_cast<uint64_t>(p), 0) < pt) s.push_back(p);
    for (int32_t p : s) dec[static_cast<size_t>(p)] = 1;
    if (!s.empty()) want.push_back(s);
  }
  EXPECT_EQ(a.order, want);
  o.seed = 99;
  EXPECT_NE(generate(d, kPrompt, o).order, a.order);
}

TEST(Generate, RandomRemaskingReproducible) {
  FakeDenoiser d(peaked([](int) { return 1; }, [](int) { return 2.0f; }));
  GenerateOptions o;
  o.alg = Unmask::Random;
  o.gen_length = 16;
  o.block_length = 16;
  o.steps = 16;
  o.seed = 5;
  GenerateResult a = generate(d, kPrompt, o), b = generate(d, kPrompt, o);
  EXPECT_EQ(a.order, b.order);
  // Step 0 decides the position with the largest rng_uniform(rng_mix(seed + 0), position, V + 1).
  int32_t best = -1;
  double bu = -1;
  for (int p = 3; p < 19; ++p) {
    const double u = rng_uniform(rng_mix(5), static_cast<uint64_t>(p), kV + 1);
    if (u > bu) {
      bu = u;
      best = p;
    }
  }
  EXPECT_EQ(a.order[0], (std::vector<int32_t>{best}));
  o.seed = 6;
  EXPECT_NE(generate(d, kPrompt, o).order, a.order);
}

TEST(Generate, AlgTempSamplesPositionsReproducibly) {
  FakeDenoiser d(peaked([](int) { return 1; }, [](int p) { return float(p % 4); }));
  GenerateOptions o;
  o.alg = Unmask::MaskgitPlus;
  o.gen_length = 10;
  o.steps = 4;
  o.alg_temp = 0.5f;
  o.seed = 8;
  GenerateResult a = generate(d, kPrompt, o), b = generate(d, kPrompt, o);
  EXPECT_EQ(a.order, b.order);
  EXPECT_EQ(sizes(a), (std::vector<size_t>{2, 2, 2, 4}));
  expect_each_once(a, 3, 10);
}

// gen positions in blocks of `block`, one token per step, stopping at EOS kEos.
GenerateOptions eos_blocks(int gen, int block) {
  GenerateOptions o;
  o.gen_length = o.steps = gen;
  o.block_length = block;
  o.eos_ids = {kEos};
  return o;
}

TEST(Generate, EosTrimAndEarlyStop) {
  // Position 5 (offset 2) predicts EOS confidently; the others predict token 4.
  RowFn fn = [](std::span<const int32_t>, int p) {
    std::vector<float> r(kV, 0.0f);
    r[p == 5 ? kEos : 4] = p == 5 ? 9.0f : 3.0f;
    return r;
  };
  FakeDenoiser d(fn);
  GenerateOptions o = eos_blocks(8, 4);
  GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{4, 4}));
  // The EOS is decided first, then positions 3 and 4: the tokens before the EOS are final after the
  // third step, which ends the generation (mid_block_stop) with the answer it would have anyway.
  EXPECT_EQ(r.order, (std::vector<std::vector<int32_t>>{{5}, {3}, {4}}));
  o.mid_block_stop = false;
  r = generate(d, kPrompt, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(r.steps_run, 4);  // the second block is skipped: the first holds an EOS

  o.stop_at_eos = false;
  GenerateResult full = generate(d, kPrompt, o);
  EXPECT_EQ(full.tokens, (std::vector<int32_t>{4, 4, kEos, 4, 4, 4, 4, 4}));
  EXPECT_EQ(full.steps_run, 8);

  // logits_eos_inf forbids the EOS token.
  o.stop_at_eos = true;
  o.logits_eos_inf = true;
  GenerateResult noeos = generate(d, kPrompt, o);
  EXPECT_EQ(noeos.tokens.size(), 8u);
  for (int32_t t : noeos.tokens) EXPECT_NE(t, kEos);
}

// A stop_when that records the tokens it is asked about into `seen` and answers whether there are at
// least `n` of them (0: never).
std::function<bool(std::span<const int32_t>)> recording_stop(std::vector<std::vector<int32_t>>& seen,
                                                             size_t n) {
  return [&seen, n](std::span<const int32_t> t) {
    seen.emplace_back(t.begin(), t.end());
    return n > 0 && t.size() >= n;
  };
}

// Position 9 (offset 6) predicts EOS; the others 1 + offset % 5; all equally sure (left to right).
std::vector<float> stop_rows(std::span<const int32_t>, int p) {
  std::vector<float> r(kV, 0.0f);
  r[p == 9 ? kEos : 1 + (p - 3) % 5] = 5.0f;
  return r;
}

// Without mid_block_stop, stop_when (a stop sequence, seen by the caller in the text) is asked after
// every block but the last, with the generated tokens decided so far (cut at the first EOS); true skips
// the later blocks and the answer ends before the first undecided position.
TEST(Generate, StopWhenSkipsTheLaterBlocks) {
  FakeDenoiser d(stop_rows);
  GenerateOptions o = eos_blocks(12, 4);
  o.mid_block_stop = false;
  o.stop_at_eos = false;
  std::vector<std::vector<int32_t>> seen;
  o.stop_when = recording_stop(seen, 8);
  GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(seen, (std::vector<std::vector<int32_t>>{{1, 2, 3, 4}, {1, 2, 3, 4, 5, 1, kEos, 3}}));
  EXPECT_EQ(r.steps_run, 8);  // the third block is skipped
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 1, kEos, 3}));
  // With stop_at_eos the block holding the EOS ends it first; stop_when sees the tokens before the EOS.
  seen.clear();
  o.stop_at_eos = true;
  o.stop_when = recording_stop(seen, 0);
  r = generate(d, kPrompt, o);
  EXPECT_EQ(seen, (std::vector<std::vector<int32_t>>{{1, 2, 3, 4}}));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 1}));
  EXPECT_EQ(r.steps_run, 8);
  // Never true: every block runs; the last block is not asked about.
  seen.clear();
  o.stop_at_eos = false;
  r = generate(d, kPrompt, o);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(r.steps_run, 12);
  EXPECT_EQ(r.tokens.size(), 12u);
}

// mid_block_stop (the default): stop_when is asked whenever the run of decided tokens from the start
// grows, and true (or an EOS in that run) ends the generation inside the block.
TEST(Generate, MidBlockStopEndsInsideTheBlock) {
  FakeDenoiser d(stop_rows);
  GenerateOptions o = eos_blocks(12, 4);
  o.stop_at_eos = false;
  std::vector<std::vector<int32_t>> seen;
  o.stop_when = recording_stop(seen, 6);
  GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(seen, (std::vector<std::vector<int32_t>>{
                      {1}, {1, 2}, {1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5, 1}}));
  EXPECT_EQ(r.steps_run, 6);  // two steps into the second block
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 1}));
  // An EOS in the decided run ends it too, before stop_when is asked about that run.
  seen.clear();
  o.stop_at_eos = true;
  o.stop_when = recording_stop(seen, 0);
  r = generate(d, kPrompt, o);
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(r.steps_run, 7);  // the EOS at offset 6 is decided at the seventh step
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 1}));
  // A position decided out of order does not extend the run: asked only when the run grows.
  RowFn late_first = [](std::span<const int32_t> c, int p) {
    std::vector<float> row = stop_rows(c, p);
    if (p == 5) row[3] = 9.0f;  // offset 2 decided first
    return row;
  };
  FakeDenoiser d2(late_first);
  seen.clear();
  o.stop_at_eos = false;
  r = generate(d2, kPrompt, o);
  EXPECT_EQ(r.order.front(), (std::vector<int32_t>{5}));
  ASSERT_EQ(seen.size(), 11u);  // after every step but the first (the last one too)
  EXPECT_EQ(seen[0], (std::vector<int32_t>{1}));
  EXPECT_EQ(seen[1], (std::vector<int32_t>{1, 2, 3}));  // offset 1 joins the run to offset 2
  EXPECT_EQ(r.steps_run, 12);
}

TEST(Generate, CfgCombinesOnTheHost) {
  // Conditional logits (prompt visible) (0, 1, 1.2, ...) pick token 2; unconditional (prompt masked)
  // (0, 0, 1.5, ...). cfg 1: Lu + 2 (Lc - Lu) = (0, 2, 0.9, ...) picks token 1.
  RowFn fn = [](std::span<const int32_t> c, int) {
    std::vector<float> r(kV, -5.0f);
    const bool uncond = c[0] == kMask;
    r[0] = 0.0f;
    r[1] = uncond ? 0.0f : 1.0f;
    r[2] = uncond ? 1.5f : 1.2f;
    return r;
  };
  FakeDenoiser d(fn);
  GenerateOptions o;
  o.gen_length = 1;
  o.block_length = 1;
  o.steps = 1;
  GenerateResult plain = generate(d, kPrompt, o);
  EXPECT_EQ(plain.tokens, (std::vector<int32_t>{2}));
  o.cfg_scale = 1.0f;
  FakeDenoiser d2(fn);
  GenerateResult cfg = generate(d2, kPrompt, o);
  EXPECT_EQ(cfg.tokens, (std::vector<int32_t>{1}));
  ASSERT_EQ(d2.logit_canvases.size(), 2u);
  // The unconditional canvas first (SparseD's Select step then keeps the conditional pattern).
  EXPECT_EQ(d2.logit_canvases[1], (std::vector<int32_t>{1, 2, 3, kMask}));
  EXPECT_EQ(d2.logit_canvases[0], (std::vector<int32_t>{kMask, kMask, kMask, kMask}));
  EXPECT_TRUE(d2.calls.empty());
}

// Infilling: the canvas is prompt + masks + suffix in every forward (predict, the KV caches' forwards and
// their reset capacity, cfg's two canvases with the suffix masked in the unconditional one); the suffix
// is never predicted nor returned; the answer is the gen_length tokens between.
TEST(Generate, SuffixFollowsTheGenerationInEveryForward) {
  const std::vector<int32_t> suffix = {4, 5};
  // Each position predicts the token after it on the canvas, or 1 before a mask: the suffix reaches
  // the last generated position and, once it is decided, the one before it.
  RowFn fn = [](std::span<const int32_t> c, int p) {
    std::vector<float> r(kV, 0.0f);
    const int32_t next = c[static_cast<size_t>(p) + 1];
    r[next == kMask ? 1 : next] = 5.0f + 0.1f * static_cast<float>(p);  // right to left
    return r;
  };
  for (const std::string cache : {"none", "prefix", "dual"}) {
    SCOPED_TRACE(cache);
    FakeDenoiser d(fn);
    d.cached = true;
    GenerateOptions o;
    o.gen_length = o.steps = o.block_length = 3;
    o.cache = parse_kv_cache(cache);
    o.suffix = suffix;
    o.stop_at_eos = false;
    std::vector<std::vector<int32_t>> canvases;
    const GenerateResult r = generate(d, kPrompt, o, [&](const StepEvent& ev) {
      canvases.emplace_back(ev.canvas.begin(), ev.canvas.end());
    });
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{4, 4, 4}));  // each copies its right neighbour, the suffix's 4
    EXPECT_EQ(r.order, (std::vector<std::vector<int32_t>>{{5}, {4}, {3}}));
    EXPECT_EQ(canvases.back(), (std::vector<int32_t>{1, 2, 3, 4, 4, 4}));  // the events show prompt + span
    for (const auto& call : d.calls)
      for (int32_t p : call) EXPECT_LT(p, 6);  // never a suffix position
    if (cache == "none") continue;
    ASSERT_EQ(d.resets, (std::vector<int64_t>{8}));
    for (const auto& rg : d.ranges) EXPECT_EQ(rg[2], 8);  // every forward's canvas holds the suffix
  }
  // cfg: the unconditional canvas masks the suffix with the prompt.
  FakeDenoiser d(fn);
  GenerateOptions o;
  o.gen_length = o.steps = o.block_length = 1;
  o.suffix = suffix;
  o.cfg_scale = 1.0f;
  generate(d, kPrompt, o);
  ASSERT_EQ(d.logit_canvases.size(), 2u);
  EXPECT_EQ(d.logit_canvases[1], (std::vector<int32_t>{1, 2, 3, kMask, 4, 5}));
  EXPECT_EQ(d.logit_canvases[0], (std::vector<int32_t>(6, kMask)));
  EXPECT_EQ(canvas_length(3, o, false), 6);
}

}  // namespace
}  // namespace tessera
