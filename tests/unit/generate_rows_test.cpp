// The unmasking loops against a fake Denoiser (fake_denoiser.h): the rows each forward computes under
// the KV caches, SparseD's phases, Window-Diffusion, and option validation.
#include <gtest/gtest.h>

#include "fake_denoiser.h"

namespace tessera {
namespace {

// The rows each forward computes under the KV caches (Fast-dLLM prefix / dual; block-causal exact).
TEST(Generate, KvCacheComputesTheExpectedRows) {
  using R = std::array<int64_t, 3>;
  auto run = [](const std::string& cache, int block, int gen, int bl, int steps, float thr = 0.0f) {
    FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return 1.0f + 0.1f * p; }));
    d.cached = true;
    d.block = block;
    GenerateOptions o;
    o.gen_length = gen;
    o.block_length = bl;
    o.steps = steps;
    o.threshold = thr;
    o.stop_at_eos = false;
    o.cache = parse_kv_cache(cache);
    const GenerateResult r = generate(d, kPrompt, o);
    EXPECT_EQ(d.calls.size(), static_cast<size_t>(r.steps_run));
    EXPECT_EQ(d.ranges.size(), d.calls.size());  // every forward went through the cache
    EXPECT_EQ(d.ends, 1);                        // the request's cache ended with it
    return std::make_pair(d.resets, d.ranges);
  };
  // Prompt 3, gen 8 in blocks of 4, 2 steps per block: canvas 11, blocks [3, 7) and [7, 11).
  auto [rs, pre] = run("prefix", 0, 8, 4, 4);
  EXPECT_EQ(rs, (std::vector<int64_t>{11}));
  EXPECT_EQ(pre, (std::vector<R>{{0, 11, 11}, {3, 11, 11}, {0, 11, 11}, {7, 11, 11}}));
  auto [rd, dual] = run("dual", 0, 8, 4, 4);
  EXPECT_EQ(dual, (std::vector<R>{{0, 11, 11}, {3, 7, 11}, {0, 11, 11}, {7, 11, 11}}));
  // Block-causal (blocks of 4 on the absolute grid: [0,4) holds the prompt and position 3, then [4,8),
  // [8,12) padded): forwards see the canvas up to the block's end; the first forward of a block also
  // computes the previous block, final now; later ones only the block. prefix and dual agree.
  for (const char* c : {"prefix", "dual"}) {
    auto [rb, bc] = run(c, 4, 8, 4, 2);
    EXPECT_EQ(rb, (std::vector<int64_t>{12})) << c;
    EXPECT_EQ(bc, (std::vector<R>{{0, 4, 4}, {0, 8, 8}, {4, 8, 8}, {4, 12, 12}, {8, 12, 12}})) << c;
  }
  // Threshold decoding: the first forward of each block refreshes, the others reuse. No confidence
  // reaches 0.99 (at most conf_of(2.0) ~ 0.55), so each forward decides one position: 4 per block.
  auto [rt, thr] = run("dual", 0, 8, 4, 8, 0.99f);
  EXPECT_EQ(thr, (std::vector<R>{{0, 11, 11},
                                 {3, 7, 11},
                                 {3, 7, 11},
                                 {3, 7, 11},
                                 {0, 11, 11},
                                 {7, 11, 11},
                                 {7, 11, 11},
                                 {7, 11, 11}}));
  auto [rtp, thr_prefix] = run("prefix", 0, 8, 4, 8, 0.99f);
  EXPECT_EQ(thr_prefix, (std::vector<R>{{0, 11, 11},
                                        {3, 11, 11},
                                        {3, 11, 11},
                                        {3, 11, 11},
                                        {0, 11, 11},
                                        {7, 11, 11},
                                        {7, 11, 11},
                                        {7, 11, 11}}));
  // Dream's schedule (entropy, 2 blocks of 4 steps): every forward after a block's first reuses too.
  for (const char* c : {"prefix", "dual"}) {
    FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return 1.0f + 0.1f * p; }));
    d.cached = true;
    GenerateOptions o;
    o.gen_length = 8;
    o.block_length = 4;
    o.steps = 8;
    o.alg = Unmask::Entropy;
    o.stop_at_eos = false;
    o.cache = parse_kv_cache(c);
    const GenerateResult r = generate(d, kPrompt, o);
    ASSERT_EQ(d.ranges.size(), r.order.size()) << c;
    ASSERT_GT(r.order.size(), 2u) << c;
    for (size_t i = 0; i < r.order.size(); ++i) {
      const int64_t lo = r.order[i].front() < 7 ? 3 : 7;  // the block of the step's positions
      const bool first = i == 0 || (r.order[i - 1].front() < 7) != (lo == 3);
      const R want = first ? R{0, 11, 11} : R{lo, std::string(c) == "dual" ? lo + 4 : 11, 11};
      EXPECT_EQ(d.ranges[i], want) << c << " forward " << i;
    }
  }
  // Without support the cache is refused, not ignored.
  FakeDenoiser plain(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  GenerateOptions o;
  o.gen_length = o.block_length = o.steps = 4;
  o.cache = KvCache::Prefix;
  EXPECT_THROW(generate(plain, kPrompt, o), Error);
}

// SparseD: floor(steps * skip) dense forwards, one that selects, then sparse ones in every block; the
// request starts with the canvas and prompt lengths and ends with exact attention again.
TEST(Generate, SparseAttentionPhases) {
  using P = SparsePhase;
  FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return 1.0f + 0.1f * p; }));
  d.sparse = true;
  GenerateOptions o;
  o.gen_length = 8;
  o.block_length = 4;
  o.steps = 8;
  o.stop_at_eos = false;
  o.sparse = true;
  o.sparse_block = 2;
  o.sparse_skip = 0.3f;  // floor(8 * 0.3) = 2 dense forwards
  const GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(r.steps_run, 8);
  EXPECT_EQ(d.sparse_begins, (std::vector<std::array<int64_t, 3>>{{11, 2, 3}}));
  EXPECT_EQ(d.phases, (std::vector<P>{P::Dense, P::Dense, P::Select, P::Sparse, P::Sparse, P::Sparse,
                                      P::Sparse, P::Sparse}));
  EXPECT_FALSE(d.in_sparse);
  // skip 0: the first forward selects. Output equals the dense run (the fake ignores the phase).
  FakeDenoiser d0(peaked([](int p) { return p % 5; }, [](int p) { return 1.0f + 0.1f * p; }));
  d0.sparse = true;
  o.sparse_skip = 0.0f;
  EXPECT_EQ(generate(d0, kPrompt, o).tokens, r.tokens);
  EXPECT_EQ(d0.phases.front(), P::Select);
  // Without support, with a cache, cfg or a block-causal model it is refused, not ignored.
  FakeDenoiser plain(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  EXPECT_THROW(generate(plain, kPrompt, o), Error);
  auto refused = [&](std::function<void(GenerateOptions&)> f, int block, const std::string& want) {
    FakeDenoiser s(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
    s.sparse = s.cached = true;
    s.block = block;
    GenerateOptions b = o;
    f(b);
    try {
      generate(s, kPrompt, b);
      ADD_FAILURE() << "no error; expected: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.sparse_begins.empty());
  };
  // With the dual cache the selection waits for the first refresh of the whole canvas at or after the
  // skip (block 1's first forward), then every forward is sparse.
  FakeDenoiser dc(peaked([](int p) { return p % 5; }, [](int p) { return 1.0f + 0.1f * p; }));
  dc.sparse = dc.cached = true;
  o.sparse_skip = 0.3f;
  o.cache = KvCache::Dual;
  EXPECT_EQ(generate(dc, kPrompt, o).steps_run, 8);
  EXPECT_EQ(dc.phases, (std::vector<P>{P::Dense, P::Dense, P::Dense, P::Dense, P::Select, P::Sparse,
                                       P::Sparse, P::Sparse}));
  EXPECT_EQ(dc.log[4], "c0-11/11");  // the refresh that selects
  o.cache = KvCache::None;
  // cfg: the unconditional canvas (prompt masked) runs first in every step, so that a Select step's
  // pattern is the conditional canvas's.
  FakeDenoiser g(peaked([](int p) { return p % 5; }, [](int p) { return 1.0f + 0.1f * p; }));
  g.sparse = true;
  GenerateOptions gc = o;
  gc.cfg_scale = 1.0f;
  EXPECT_EQ(generate(g, kPrompt, gc).steps_run, 8);
  ASSERT_EQ(g.logit_canvases.size(), 16u);
  for (size_t i = 0; i < 16; ++i)
    EXPECT_EQ(g.logit_canvases[i][0] == kMask, i % 2 == 0) << "logits call " << i;
  refused([](auto& b) { b.sparse_rho = 1.5f; }, 0, "sparse-rho must be in [0, 1] (got 1.5)");
  refused([](auto& b) { b.sparse_skip = 1.0f; }, 0, "sparse-skip must be in [0, 1) (got 1)");
  refused([](auto& b) { b.sparse_block = 0; }, 0, "sparse-block must be > 0 (got 0)");
}

// Window-Diffusion: the forwards of each phase (refresh over the window, then the active set plus
// the positions decided in the phase), worked out by hand.
// A windowed generation of `gen` positions in one block (steps = gen unless given), not stopping at EOS.
GenerateOptions window_options(int gen, int w_ex, int w_in, int refresh, int steps = 0) {
  GenerateOptions o;
  o.gen_length = o.block_length = gen;
  o.steps = steps > 0 ? steps : gen;
  o.stop_at_eos = false;
  o.window = true;
  o.window_ex = w_ex;
  o.window_in = w_in;
  o.window_refresh = refresh;
  return o;
}

TEST(Generate, WindowPhasesComputeTheExpectedRows) {
  // Confidence falls with the position: one token per step, left to right.
  FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
  d.cached = true;
  GenerateOptions o = window_options(12, 6, 3, 3);  // canvas 15, positions 3..14
  const GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(d.resets, (std::vector<int64_t>{15}));
  EXPECT_EQ(d.ends, 1);
  EXPECT_EQ(d.log, (std::vector<std::string>{
                       // phase 1: window 3..8 (canvas 9), active {3,4,5}, then {4,5,6}, {5,6,7}
                       "c0-9/9", "r3,4,5,6/9", "r3,4,5,6,7/9",
                       // phase 2: window 6..11
                       "c0-12/12", "r6,7,8,9/12", "r6,7,8,9,10/12",
                       // phase 3: window 9..14 (the canvas end)
                       "c0-15/15", "r9,10,11,12/15", "r9,10,11,12,13/15",
                       // phase 4: only 12..14 are left
                       "c0-15/15", "r12,13,14/15", "r12,13,14/15"}));
  ASSERT_EQ(d.calls.size(), 12u);
  EXPECT_EQ(d.calls[0], (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(d.calls[10], (std::vector<int32_t>{13, 14}));
  for (size_t i = 0; i < r.order.size(); ++i) EXPECT_EQ(r.order[i], (std::vector<int32_t>{int32_t(3 + i)}));

  // No cache (window-refresh 0): every forward is a plain predict over the window of its step.
  FakeDenoiser n(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
  o.window_refresh = 0;
  generate(n, kPrompt, o);
  EXPECT_TRUE(n.resets.empty());
  EXPECT_EQ(n.ends, 0);
  EXPECT_EQ(n.log, (std::vector<std::string>{"p/9", "p/10", "p/11", "p/12", "p/13", "p/14", "p/15", "p/15",
                                             "p/15", "p/15", "p/15", "p/15"}));

  // DES: the block opens with its rows, then every forward votes with its candidates' span.
  FakeDenoiser m(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
  m.cached = m.moe = true;
  o.window_refresh = 3;
  o.des = DesMode::Seq;
  generate(m, kPrompt, o);
  // clang-format off
  EXPECT_EQ(m.log, (std::vector<std::string>{
      "d3-15",
      "d3-6", "c0-9/9", "d4-7", "r3,4,5,6/9", "d5-8", "r3,4,5,6,7/9",
      "d6-9", "c0-12/12", "d7-10", "r6,7,8,9/12", "d8-11", "r6,7,8,9,10/12",
      "d9-12", "c0-15/15", "d10-13", "r9,10,11,12/15", "d11-14", "r9,10,11,12,13/15",
      "d12-15", "c0-15/15", "d13-15", "r12,13,14/15", "d14-15", "r12,13,14/15"}));
  // clang-format on

  // SparseD inside the window: floor(12 * 0.2) = 2 exact forwards; then a forward that computes its whole
  // view (a phase's refresh) selects when the window has moved since the last selection, and every
  // other forward reads the pattern.
  using enum SparsePhase;
  o.des = DesMode::Off;
  o.sparse = true;
  o.sparse_skip = 0.2f;
  FakeDenoiser sp(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
  sp.cached = sp.sparse = true;
  generate(sp, kPrompt, o);
  // The third forward is not a refresh: the fourth (view 12) selects, the seventh (view 15) again, the
  // tenth (view 15 still) does not.
  EXPECT_EQ(sp.phases, (std::vector<SparsePhase>{Dense, Dense, Dense, Select, Sparse, Sparse, Select, Sparse,
                                                 Sparse, Sparse, Sparse, Sparse}));
  // Without the phase cache every forward computes its whole view: the window moves at every step until
  // it reaches the canvas end (views 9, 10, .., 15, then 15).
  o.window_refresh = 0;
  FakeDenoiser sn(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
  sn.sparse = true;
  generate(sn, kPrompt, o);
  EXPECT_EQ(sn.phases, (std::vector<SparsePhase>{Dense, Dense, Select, Select, Select, Select, Select, Sparse,
                                                 Sparse, Sparse, Sparse, Sparse}));
}

// Window-Diffusion on a block-causal model (LLaDA2), worked out by hand: prompt 3, 8 generated
// positions on a grid of blocks of 4 (canvas 12), an external window of 3, active sets of 2, phases of 2
// forwards, one decision per step (threshold 0.99 is never reached), left to right. Each block starts a
// phase; forwards see at most the current block; a refresh recomputes from the previous block's start at
// the block's first refresh (its rows were cached before it was final), from the block's start after.
TEST(Generate, WindowOnABlockCausalModelKeepsItsBlockGrid) {
  auto run = [](int refresh, bool cached) {
    FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
    d.block = 4;
    d.cached = cached;
    GenerateOptions o = window_options(8, 3, 2, refresh, 4);
    o.block_length = 4;
    o.threshold = 0.99f;
    const GenerateResult r = generate(d, kPrompt, o);
    EXPECT_EQ(r.steps_run, 9);
    for (size_t i = 0; i < r.order.size(); ++i) EXPECT_EQ(r.order[i], (std::vector<int32_t>{int32_t(3 + i)}));
    return d.log;
  };
  EXPECT_EQ(run(2, true), (std::vector<std::string>{"c0-4/4", "c0-7/7", "r4,5,6/7", "c4-8/8", "r6,7/8",
                                                    "c4-11/11", "r8,9,10/11", "c8-12/12", "r10,11/12"}));
  EXPECT_EQ(run(0, false),
            (std::vector<std::string>{"p/4", "p/7", "p/8", "p/8", "p/8", "p/11", "p/12", "p/12", "p/12"}));
}

// Windows that hold the whole generation decide exactly as the plain loops (refresh 0: no cache;
// refresh 1: every forward refreshes the whole canvas).
TEST(Generate, WindowCoveringEverythingIsExact) {
  RowFn fn = [](std::span<const int32_t> c, int p) {  // depends on the canvas: decisions interact
    std::vector<float> r(kV, 0.0f);
    int decided = 0;
    for (int32_t t : c) decided += t != kMask;
    r[static_cast<size_t>((p * 3 + decided) % 6)] = 1.0f + 0.37f * static_cast<float>((p * 7 + decided) % 5);
    r[kMask] = -100.0f;
    return r;
  };
  struct Case {
    std::string alg;
    float threshold;
    int block;
  };
  for (const Case& c : {Case{"low_confidence", 0.0f, 4}, Case{"entropy", 0.0f, 8},
                        Case{"topk_margin", 0.0f, 4}, Case{"low_confidence", 0.3f, 8}}) {
    GenerateOptions o;
    o.alg = parse_unmask(c.alg);
    o.threshold = c.threshold;
    o.gen_length = 8;
    o.block_length = c.block;
    o.steps = 4;
    o.stop_at_eos = false;
    FakeDenoiser d0(fn);
    const GenerateResult ref = generate(d0, kPrompt, o);
    o.window = true;
    o.window_ex = o.window_in = 8;
    for (int refresh : {0, 1}) {
      o.window_refresh = refresh;
      FakeDenoiser d(fn);
      d.cached = true;
      const GenerateResult r = generate(d, kPrompt, o);
      EXPECT_EQ(r.tokens, ref.tokens) << c.alg << " refresh " << refresh;
      EXPECT_EQ(r.order, ref.order) << c.alg << " refresh " << refresh;
      EXPECT_EQ(d.seeds, d0.seeds) << c.alg << " refresh " << refresh;
      for (const std::string& e : d.log) EXPECT_EQ(e, refresh ? "c0-11/11" : "p/11");
    }
  }
}

// A step's count beyond its active set carries to the next step (LLaDA); what the schedule leaves is
// decided a whole active set per step, with the RNG counter after the scheduled steps.
TEST(Generate, WindowCapsCountsAtTheActiveSet) {
  FakeDenoiser d(peaked([](int p) { return p % 5; }, [](int p) { return 5.0f - 0.1f * p; }));
  GenerateOptions o = window_options(8, 4, 2, 0, 2);  // 4 per step
  o.seed = 11;
  const GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(sizes(r), (std::vector<size_t>{2, 2, 2, 2}));
  expect_each_once(r, 3, 8);
  EXPECT_EQ(d.seeds, (std::vector<uint64_t>{rng_mix(11), rng_mix(12), rng_mix(11 + 2), rng_mix(11 + 3)}));
}

// Early stop: after an EOS is decided the positions after it are never computed nor decided; they
// read as that EOS.
TEST(Generate, WindowEarlyStopAtEos) {
  RowFn fn = [](std::span<const int32_t>, int p) {
    std::vector<float> r(kV, 0.0f);
    r[p == 5 ? kEos : 4] = p == 5 ? 9.0f : 3.0f - 0.1f * static_cast<float>(p);
    return r;
  };
  GenerateOptions o = window_options(8, 8, 4, 0);  // positions 3..10
  o.stop_at_eos = true;
  o.eos_ids = {kEos};
  o.window_early_stop = true;
  FakeDenoiser d(fn);
  const GenerateResult r = generate(d, kPrompt, o);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(r.order, (std::vector<std::vector<int32_t>>{{5}, {3}, {4}}));
  EXPECT_EQ(d.log, (std::vector<std::string>{"p/11", "p/6", "p/6"}));
  o.stop_at_eos = false;
  FakeDenoiser d2(fn);
  EXPECT_EQ(generate(d2, kPrompt, o).tokens,
            (std::vector<int32_t>{4, 4, kEos, kEos, kEos, kEos, kEos, kEos}));
  // Without early stop every position is decided.
  o.window_early_stop = false;
  FakeDenoiser d3(fn);
  const GenerateResult all = generate(d3, kPrompt, o);
  EXPECT_EQ(all.steps_run, 8);
  expect_each_once(all, 3, 8);
}

TEST(Generate, WindowRefusals) {
  auto with = [](std::function<void(GenerateOptions&)> f) {
    GenerateOptions o;
    o.window = true;
    f(o);
    return o;
  };
  expect_error(with([](auto& o) { o.cache = KvCache::Dual; }), "Window-Diffusion keeps its own phase cache");
  // SparseD inside the window is asked of the denoiser, which this one lacks (FakeDenoiser.sparse off).
  expect_error(with([](auto& o) {
                 o.sparse = true;
                 o.window_refresh = 0;
               }),
               "this denoiser has no sparse attention");
  expect_error(with([](auto& o) { o.cfg_scale = 1.0f; }), "this denoiser has no KV cache");
  expect_error(with([](auto& o) { o.window_in = 0; }), "window-in must be >= 1 (got 0)");
  expect_error(with([](auto& o) { o.window_in = 65; }), "window-in (65) must not exceed window-ex (64)");
  expect_error(with([](auto& o) {
                 o.alg = Unmask::Entropy;
                 o.window_in = 200;
               }),
               "window-in (200) must not exceed window-ex (128)");
  expect_error(with([](auto& o) { o.window_ex = -1; }), "window-ex must be >= 0 (got -1)");
  expect_error(with([](auto& o) { o.window_refresh = -2; }), "window-refresh must be >= 0 (got -2)");
  expect_error(with([](auto& o) { o.window_early_stop = true; }), "window-early-stop needs an eos id");
  GenerateOptions e;
  e.window_early_stop = true;
  expect_error(e, "window-early-stop needs the window");
  // Block-causal models decode block by block.
  FakeDenoiser bc(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  bc.block = 4;
  GenerateOptions w = with([](auto&) {});
  w.gen_length = w.block_length = w.steps = 4;
  EXPECT_THROW(generate(bc, kPrompt, w), Error);
  // The phase cache needs a KV-cache denoiser; refresh 0 does not.
  FakeDenoiser plain(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  EXPECT_THROW(generate(plain, kPrompt, w), Error);
  w.window_refresh = 0;
  EXPECT_EQ(generate(plain, kPrompt, w).order.size(), 4u);
}

TEST(Generate, ValidationErrors) {
  auto with = [](std::function<void(GenerateOptions&)> f) {
    GenerateOptions o;
    f(o);
    return o;
  };
  test::expect_error([] { (void)parse_unmask("greedy"); }, "unknown algorithm 'greedy'");
  expect_error(with([](auto& o) { o.gen_length = 0; }), "gen-length must be > 0 (got 0)");
  expect_error(with([](auto& o) { o.steps = -1; }), "steps must be > 0 (got -1)");
  expect_error(with([](auto& o) { o.block_length = 0; }), "block-length must be > 0 (got 0)");
  expect_error(with([](auto& o) {
                 o.gen_length = 100;
                 o.block_length = 32;
               }),
               "gen-length 100 is not divisible by block-length 32");
  expect_error(with([](auto& o) {
                 o.gen_length = 96;
                 o.block_length = 32;
                 o.steps = 100;
               }),
               "steps 100 is not divisible by the number of blocks 3");
  expect_error(with([](auto& o) {
                 o.alg = Unmask::Entropy;
                 o.gen_length = 96;
                 o.block_length = 32;
                 o.steps = 100;
               }),
               "steps 100 is not divisible by the number of blocks 3");
  test::expect_error([] { (void)parse_kv_cache("lru"); }, "unknown KV cache 'lru'; use none, prefix or dual");
  expect_error(with([](auto& o) {
                 o.suffix = {1, kV};
               }),
               "suffix token 8 at position 1 is outside the vocabulary");
  expect_error(with([](auto& o) { o.suffix = {1, kMask}; }), "suffix token 1 is the mask token");
  expect_error(with([](auto& o) {
                 o.suffix = {1};
                 o.window = o.window_early_stop = true;
                 o.eos_ids = {kEos};
               }),
               "window-early-stop cannot be combined with a suffix");
  test::expect_error([&] { validate_generate_options(with([](auto& o) { o.suffix = {1}; }), kV, true); },
                     "a suffix needs a bidirectional model");
  expect_error(with([](auto& o) {
                 o.cache = KvCache::Dual;
                 o.cfg_scale = 1.0f;
               }),
               "this denoiser has no KV cache");
  expect_error(with([](auto& o) { o.temperature = -0.5f; }), "temperature must be >= 0 (got -0.5)");
  expect_error(with([](auto& o) { o.threshold = 1.5f; }), "threshold must be in [0, 1] (got 1.5)");
  expect_error(with([](auto& o) {
                 o.threshold = 0.9f;
                 o.alg = Unmask::Random;
               }),
               "threshold decoding needs a probability-like confidence");
  expect_error(with([](auto& o) { o.cfg_scale = -1.0f; }), "cfg-scale must be >= 0 (got -1)");
  expect_error(with([](auto& o) {
                 o.cfg_scale = 1.0f;
                 o.alg = Unmask::Entropy;
               }),
               "cfg-scale applies only to the LLaDA algorithms");
  expect_error(with([](auto& o) {
                 o.top_k = -2;
                 o.alg = Unmask::Origin;
               }),
               "top-k must be >= 0 (got -2)");
  expect_error(with([](auto& o) {
                 o.top_p = 0.0f;
                 o.alg = Unmask::Origin;
               }),
               "top-p must be in (0, 1] (got 0)");
  expect_error(with([](auto& o) { o.top_p = 0.9f; }), "top-k / top-p apply only to the Dream algorithms");
  expect_error(with([](auto& o) { o.alg_temp = -1.0f; }), "alg-temp must be >= 0 (got -1)");
  expect_error(with([](auto& o) {
                 o.alg_temp = 0.5f;
                 o.alg = Unmask::Origin;
               }),
               "alg-temp applies only to maskgit_plus, topk_margin and entropy");
  expect_error(with([](auto& o) {
                 o.alg_temp = 0.5f;
                 o.alg = Unmask::Entropy;
                 o.threshold = 0.1f;
               }),
               "threshold decoding needs a probability-like confidence");
  expect_error(with([](auto& o) {
                 o.alg_temp = 0.5f;
                 o.alg = Unmask::MaskgitPlus;
                 o.threshold = 0.5f;
               }),
               "alg-temp cannot be combined with threshold decoding");
  expect_error(with([](auto& o) {
                 o.eps = 0.0f;
                 o.alg = Unmask::Origin;
               }),
               "eps must be in (0, 1) (got 0)");
  expect_error(with([](auto& o) { o.eos_ids = {3, 100}; }), "eos id 100 is outside the vocabulary [0, 8)");
  expect_error(with([](auto& o) { o.logits_eos_inf = true; }), "logits-eos-inf needs an eos id");
  expect_error(GenerateOptions{}, "prompt token 9 at position 1 is outside the vocabulary [0, 8)", {1, 9});
  // block-length larger than gen-length is one block, not an error.
  FakeDenoiser d(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  GenerateOptions o;
  o.gen_length = 4;
  o.steps = 4;
  EXPECT_EQ(generate(d, kPrompt, o).steps_run, 4);
}

}  // namespace
}  // namespace tessera
