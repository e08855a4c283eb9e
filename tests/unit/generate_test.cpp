// The unmasking loops against a fake Denoiser whose logits are a hand-built function of the canvas.
#include "decode/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "decode/schedule.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr int64_t kV = 8;
constexpr int32_t kMask = 7;
constexpr int32_t kEos = 6;

// Logits of one position as a function of the whole canvas.
using RowFn = std::function<std::vector<float>(std::span<const int32_t> canvas, int pos)>;

class FakeDenoiser final : public Denoiser {
 public:
  FakeDenoiser(RowFn fn, int64_t v = kV, int32_t mask = kMask) : fn_(std::move(fn)), v_(v), mask_(mask) {}
  int64_t vocab_size() const override { return v_; }
  int32_t mask_token() const override { return mask_; }
  void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
               std::span<int32_t> tokens, std::span<float> conf) override {
    log.push_back("p/" + std::to_string(canvas.size()));
    sample(canvas, positions, sp, tokens, conf);
  }
  void sample(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
              std::span<int32_t> tokens, std::span<float> conf) {
    calls.emplace_back(positions.begin(), positions.end());
    seeds.push_back(sp.seed);
    if (in_sparse) phases.push_back(phase);
    for (int32_t p : positions)
      EXPECT_EQ(canvas[static_cast<size_t>(p)], mask_) << "prediction for a decided position";
    std::vector<float> L(positions.size() * static_cast<size_t>(v_));
    fill(canvas, positions, L);
    std::vector<int32_t> keys(positions.begin(), positions.end());
    const auto R = static_cast<int64_t>(positions.size());
    Tensor tl(L.data(), DType::F32, {R, v_}), tk(keys.data(), DType::I32, {R});
    Tensor tt(tokens.data(), DType::I32, {R}), tc(conf.data(), DType::F32, {R});
    cpu_sample_rows(tl, tk, sp, tt, tc);
  }
  void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
              std::span<float> out) override {
    logit_canvases.emplace_back(canvas.begin(), canvas.end());
    fill(canvas, positions, out);
  }

  // KV cache (off unless `cached`): records each predict_cached's computed range and canvas length,
  // then predicts from the whole canvas (the fake has no stale state).
  bool supports_kv_cache() const override { return cached; }
  void kv_cache_reset(int64_t capacity) override { resets.push_back(capacity); }
  void kv_cache_end() override { ++ends; }
  void predict_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                      std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                      std::span<float> conf) override {
    ranges.push_back({q_lo, q_hi, static_cast<int64_t>(canvas.size())});
    log.push_back("c" + std::to_string(q_lo) + "-" + std::to_string(q_hi) + "/" +
                  std::to_string(canvas.size()));
    sample(canvas, positions, sp, tokens, conf);
  }
  void predict_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                    std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                    std::span<float> conf) override {
    std::string e = "r";
    for (size_t i = 0; i < rows.size(); ++i) e += (i ? "," : "") + std::to_string(rows[i]);
    log.push_back(e + "/" + std::to_string(canvas.size()));
    sample(canvas, positions, sp, tokens, conf);
  }
  int attention_block() const override { return block; }
  void set_attention_block(int b) override { block = b; }
  // DES (off unless `moe`): each des_rows goes into the log as "dLO-HI".
  bool supports_expert_sharing() const override { return moe; }
  void des_begin(const DesConfig& c) override { (void)c; }
  void des_rows(int64_t lo, int64_t hi) override {
    log.push_back("d" + std::to_string(lo) + "-" + std::to_string(hi));
  }
  // SparseD (off unless `sparse`): records sparse_begin and the phase of every predict().
  bool supports_sparse_attention() const override { return sparse; }
  void sparse_begin(int64_t canvas_len, const SparseConfig& c) override {
    sparse_begins.push_back({canvas_len, c.block, c.prompt_len});
    phase = SparsePhase::Dense;
    in_sparse = true;
  }
  void sparse_phase(SparsePhase p) override { phase = p; }
  void sparse_end() override { in_sparse = false; }

  bool cached = false, sparse = false, in_sparse = false, moe = false;
  SparsePhase phase = SparsePhase::Dense;
  std::vector<std::array<int64_t, 3>> sparse_begins;  // (canvas, block, prompt length)
  std::vector<SparsePhase> phases;                    // of each predict() while a sparse request runs
  int block = 0;                                      // > 0: a block-causal model
  std::vector<int64_t> resets;
  int ends = 0;                                // kv_cache_end calls
  std::vector<std::array<int64_t, 3>> ranges;  // (q_lo, q_hi, canvas size) of each predict_cached
  std::vector<std::vector<int32_t>> calls;     // positions of each forward
  // Each forward: "p/N" predict over N positions, "cLO-HI/N" predict_cached, "rA,B,../N" predict_rows;
  // "dLO-HI" des_rows.
  std::vector<std::string> log;
  std::vector<uint64_t> seeds;                       // SampleParams.seed of each predict()
  std::vector<std::vector<int32_t>> logit_canvases;  // canvas of each logits()

 private:
  void fill(std::span<const int32_t> canvas, std::span<const int32_t> positions, std::span<float> out) {
    for (size_t i = 0; i < positions.size(); ++i) {
      std::vector<float> row = fn_(canvas, positions[i]);
      EXPECT_EQ(row.size(), static_cast<size_t>(v_));
      std::copy(row.begin(), row.end(),
                out.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(v_)));
    }
  }
  RowFn fn_;
  int64_t v_;
  int32_t mask_;
};

// Position p predicts token tok(p) with logit strength(p) (others 0).
RowFn peaked(std::function<int(int)> tok, std::function<float(int)> strength) {
  return [=](std::span<const int32_t>, int p) {
    std::vector<float> r(kV, 0.0f);
    r[static_cast<size_t>(tok(p))] = strength(p);
    r[kMask] = -100.0f;
    return r;
  };
}
// Softmax confidence of a row with one logit s and kV - 2 zeros (mask at -100).
double conf_of(float s) {
  return std::exp(double(s)) / (std::exp(double(s)) + double(kV - 2));
}

std::vector<size_t> sizes(const GenerateResult& r) {
  std::vector<size_t> s;
  for (const auto& o : r.order) s.push_back(o.size());
  return s;
}

// Every generated position decided exactly once.
void expect_each_once(const GenerateResult& r, int lo, int n) {
  std::multiset<int32_t> all;
  for (const auto& o : r.order) all.insert(o.begin(), o.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  for (int p = lo; p < lo + n; ++p) EXPECT_EQ(all.count(p), 1u) << "position " << p;
}

const std::vector<int32_t> kPrompt = {1, 2, 3};

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
  EXPECT_EQ(d2.logit_canvases[0], (std::vector<int32_t>{1, 2, 3, kMask}));
  EXPECT_EQ(d2.logit_canvases[1], (std::vector<int32_t>{kMask, kMask, kMask, kMask}));
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
  EXPECT_EQ(d.logit_canvases[0], (std::vector<int32_t>{1, 2, 3, kMask, 4, 5}));
  EXPECT_EQ(d.logit_canvases[1], (std::vector<int32_t>(6, kMask)));
  EXPECT_EQ(canvas_length(3, o, false), 6);
}

void expect_error(const GenerateOptions& o, const std::string& msg, std::vector<int32_t> prompt = kPrompt) {
  FakeDenoiser d(peaked([](int) { return 1; }, [](int) { return 1.0f; }));
  try {
    generate(d, prompt, o);
    ADD_FAILURE() << "expected an error containing: " << msg;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << "got: " << e.what();
  }
}

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
  refused([](auto& b) { b.cfg_scale = 1.0f; }, 0, "cannot be combined with classifier-free guidance");
  refused([](auto&) {}, 4, "sparse attention needs a bidirectional model");
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
  expect_error(with([](auto& o) { o.sparse = true; }), "Window-Diffusion cannot be combined with sparse");
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
