// CPU sample_rows / token_logprob / top_logprobs against hand-computed tokens, confidences and
// log-probabilities, and a full-sort reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace tessera {
namespace {

struct Out {
  std::vector<int32_t> tok;
  std::vector<float> conf;
};

// Samples every row of `logits` ([R, V] row-major) with row keys `keys`.
Out sample(std::vector<float> logits, int64_t V, std::vector<int32_t> keys, const SampleParams& p) {
  const auto R = static_cast<int64_t>(keys.size());
  Out o{std::vector<int32_t>(keys.size()), std::vector<float>(keys.size())};
  Tensor L(logits.data(), DType::F32, {R, V});
  Tensor K(keys.data(), DType::I32, {R});
  Tensor T(o.tok.data(), DType::I32, {R});
  Tensor C(o.conf.data(), DType::F32, {R});
  cpu_sample_rows(L, K, p, T, C);
  return o;
}
Out sample1(const std::vector<float>& row, const SampleParams& p, int32_t key = 7) {
  return sample(row, static_cast<int64_t>(row.size()), {key}, p);
}

SampleParams dream(ConfKind c = ConfKind::Prob) {
  SampleParams p;
  p.conf = c;
  return p;
}
SampleParams llada(ConfKind c = ConfKind::Prob) {
  SampleParams p;
  p.gumbel = true;
  p.conf = c;
  return p;
}

const double e0 = 1.0, e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
const std::vector<float> kRow = {1.0f, 3.0f, 2.0f, 0.0f};  // softmax: (e1, e3, e2, e0) / Z
const double kZ = e0 + e1 + e2 + e3;

TEST(Sample, ArgmaxProbBothFamilies) {
  for (bool g : {false, true}) {
    SampleParams p = g ? llada() : dream();
    Out o = sample1(kRow, p);
    EXPECT_EQ(o.tok[0], 1);
    EXPECT_NEAR(o.conf[0], e3 / kZ, 1e-6);
  }
}

TEST(Sample, MarginEntropyRandom) {
  Out m = sample1(kRow, dream(ConfKind::Margin));
  EXPECT_EQ(m.tok[0], 1);
  EXPECT_NEAR(m.conf[0], (e3 - e2) / kZ, 1e-6);

  Out h = sample1(kRow, dream(ConfKind::NegEntropy));
  double want = 0;
  for (double e : {e0, e1, e2, e3}) want += e / kZ * std::log(e / kZ + 1e-10);
  EXPECT_EQ(h.tok[0], 1);
  EXPECT_NEAR(h.conf[0], want, 1e-6);

  for (bool g : {false, true}) {
    SampleParams p = g ? llada(ConfKind::Random) : dream(ConfKind::Random);
    p.seed = 42;
    Out r = sample1(kRow, p, 9);
    EXPECT_EQ(r.tok[0], 1);  // the token is still the argmax
    EXPECT_FLOAT_EQ(r.conf[0], static_cast<float>(rng_uniform(42, 9, 4 + 1)));
  }
}

TEST(Sample, TiesGoToLowestIndex) {
  Out o = sample1({2.0f, 5.0f, 5.0f, 1.0f}, dream());
  EXPECT_EQ(o.tok[0], 1);
  Out m = sample1({2.0f, 5.0f, 5.0f, 1.0f}, dream(ConfKind::Margin));
  EXPECT_NEAR(m.conf[0], 0.0, 1e-7);
}

TEST(Sample, SuppressToken) {
  for (bool g : {false, true}) {
    SampleParams p = g ? llada() : dream();
    p.suppress_token = 1;
    Out o = sample1(kRow, p);
    EXPECT_EQ(o.tok[0], 2);
    EXPECT_NEAR(o.conf[0], e2 / (e0 + e1 + e2), 1e-6);
  }
}

TEST(Sample, TopK) {
  SampleParams p = dream();
  p.top_k = 2;  // keeps logits 3 and 2
  EXPECT_NEAR(sample1(kRow, p).conf[0], e3 / (e3 + e2), 1e-6);
  p.conf = ConfKind::Margin;
  EXPECT_NEAR(sample1(kRow, p).conf[0], (e3 - e2) / (e3 + e2), 1e-6);
  p.conf = ConfKind::NegEntropy;
  const double a = e3 / (e3 + e2), b = e2 / (e3 + e2);
  EXPECT_NEAR(sample1(kRow, p).conf[0], a * std::log(a + 1e-10) + b * std::log(b + 1e-10), 1e-6);
  p.top_k = 10;  // larger than the vocabulary: off
  p.conf = ConfKind::Prob;
  EXPECT_NEAR(sample1(kRow, p).conf[0], e3 / kZ, 1e-6);
}

std::vector<float> log_probs(std::vector<double> ps) {
  std::vector<float> r;
  for (double x : ps) r.push_back(static_cast<float>(std::log(x)));
  return r;
}

TEST(Sample, TopP) {
  const std::vector<float> row = log_probs({0.5, 0.3, 0.15, 0.05});
  SampleParams p = dream();
  p.top_p = 0.7f;  // cumulative 0.5 <= 0.7 keeps token 1; 0.8 > 0.7 drops the rest
  EXPECT_NEAR(sample1(row, p).conf[0], 0.5 / 0.8, 1e-5);
  p.top_p = 0.4f;  // the most likely token is always kept
  EXPECT_NEAR(sample1(row, p).conf[0], 1.0, 1e-6);
  p.top_p = 0.85f;
  EXPECT_NEAR(sample1(row, p).conf[0], 0.5 / 0.95, 1e-5);
  p.conf = ConfKind::Margin;
  EXPECT_NEAR(sample1(row, p).conf[0], 0.2 / 0.95, 1e-5);
}

// Long tails far below the maximum: the nucleus reaches deep into the row.
TEST(Sample, TopPMatchesFullSortOnLongTails) {
  const int V = 5000;
  std::vector<float> row(V);
  row[0] = 0.0f;
  for (int v = 1; v < V; ++v) row[static_cast<size_t>(v)] = -9.0f - 1e-3f * static_cast<float>((v * 37) % V);
  for (float tp : {0.3f, 0.7f, 0.9f, 0.99f}) {
    std::vector<double> s(row.begin(), row.end());
    std::sort(s.begin(), s.end(), std::greater<double>());
    double z = 0;
    for (double x : s) z += std::exp(x);
    double cum = 0, kept = 0, cut = -1e300;
    for (double x : s) {
      kept += std::exp(x);
      cum += std::exp(x) / z;
      if (cum > tp) {
        cut = x;
        break;
      }
    }
    SampleParams p = dream();
    p.top_p = tp;
    EXPECT_NEAR(sample1(row, p).conf[0], 1.0 / kept, 1e-4) << tp << " cut " << cut;
  }
}

// Long rows (the normaliser's vector path, its per-element tail and the vector that holds the
// suppressed token): the confidence of every ConfKind::Prob row equals an all-f64 reference within 1e-6,
// with a temperature, a top-k cut, -inf logits, and the suppressed token as the row's largest logit.
TEST(Sample, LongRowsMatchAnF64Reference) {
  const int64_t V = 4099;
  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v)
    row[static_cast<size_t>(v)] =
        4.0f * std::sin(0.37f * static_cast<float>(v)) - 1e-4f * static_cast<float>(v);
  row[100] = -std::numeric_limits<float>::infinity();
  row[2051] = 50.0f;                               // the largest logit, suppressed below
  for (int variant = 0; variant < 3; ++variant) {  // greedy: LLaDA, Dream, each with a suppressed token
    SCOPED_TRACE("variant " + std::to_string(variant));
    SampleParams p = variant % 2 == 0 ? llada() : dream();
    if (variant >= 1) p.suppress_token = 2051;
    std::vector<double> x(row.begin(), row.end());
    if (p.suppress_token >= 0) x[static_cast<size_t>(p.suppress_token)] = -HUGE_VAL;
    const double m = *std::max_element(x.begin(), x.end());
    double z = 0;
    for (double a : x)
      if (a != -HUGE_VAL) z += std::exp(a - m);
    const Out o = sample1(row, p);
    EXPECT_EQ(x[static_cast<size_t>(o.tok[0])], m);
    EXPECT_NEAR(o.conf[0], 1.0 / z, 1e-6 / z);
  }
  // Dream with a temperature and top-k: the sampled token's confidence is its probability.
  SampleParams p = dream();
  p.temperature = 0.7f;
  p.top_k = 300;
  p.suppress_token = 2051;
  std::vector<double> x(row.begin(), row.end());
  for (double& a : x) a = static_cast<double>(static_cast<float>(a) / 0.7f);
  x[2051] = -HUGE_VAL;
  std::vector<double> sorted = x;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  double z = 0;
  for (double a : x)
    if (a != -HUGE_VAL && a >= sorted[299]) z += std::exp(a - sorted[0]);
  const Out o = sample1(row, p);
  const double px = std::exp(x[static_cast<size_t>(o.tok[0])] - sorted[0]) / z;
  EXPECT_NEAR(o.conf[0], px, 1e-6 * px);
}

// Greedy token and margin on rows of whole vectors plus a tail, with many ties (small integer logits):
// the token is the lowest index of the largest kept logit, the margin P(1st) - P(2nd) counts a tied
// runner-up (margin 0), in one lane, across lanes or in the tail; with a suppressed token and top-k.
TEST(Sample, ArgmaxTiesAndMarginOnLongRows) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>(state >> 40);
  };
  int ties = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t V = std::vector<int64_t>{3, 16, 17, 31, 64, 1000, 4099}[static_cast<size_t>(trial % 7)];
    const int spread = 2 + trial % 9;  // logits in {-spread, ..., spread}: many equal values
    std::vector<float> row(static_cast<size_t>(V));
    for (float& a : row) a = static_cast<float>(next() % (2 * spread + 1) - spread);
    SampleParams p = trial % 2 == 0 ? llada(ConfKind::Margin) : dream(ConfKind::Margin);
    if (trial % 3 == 1) p.suppress_token = next() % V;
    if (trial % 4 == 3 && V > 8) p.top_k = 5;
    SCOPED_TRACE("trial " + std::to_string(trial) + " V " + std::to_string(V));
    std::vector<double> x(row.begin(), row.end());
    if (p.suppress_token >= 0) x[static_cast<size_t>(p.suppress_token)] = -HUGE_VAL;
    std::vector<double> sorted = x;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double cut = p.top_k > 0 ? sorted[static_cast<size_t>(p.top_k - 1)] : -HUGE_VAL;
    const double m1 = sorted[0], m2 = V > 1 && sorted[1] >= cut ? sorted[1] : -HUGE_VAL;
    ties += m1 == m2 ? 1 : 0;
    double z = 0;
    for (double a : x)
      if (a != -HUGE_VAL && a >= cut) z += std::exp(a - m1);
    const Out o = sample1(row, p);
    EXPECT_EQ(o.tok[0], std::find(x.begin(), x.end(), m1) - x.begin());
    EXPECT_NEAR(o.conf[0], (1.0 - std::exp(m2 - m1)) / z, 1e-6);
  }
  EXPECT_GT(ties, 10);  // the tied runner-up case is exercised
}

TEST(Sample, TopPThenTopKAsDream) {
  // top_p 0.5 first keeps {0, 1}; top_k 2 then keeps both. (top_k first would renormalise to
  // (0.533, 0.467) and top_p would keep only token 0.)
  const std::vector<float> row = log_probs({0.4, 0.35, 0.25});
  SampleParams p = dream();
  p.top_p = 0.5f;
  p.top_k = 2;
  EXPECT_NEAR(sample1(row, p).conf[0], 0.4 / 0.75, 1e-5);
}

TEST(Sample, DreamTemperatureSamplesByInverseCdf) {
  const std::vector<float> row = log_probs({0.5, 0.3, 0.2});
  for (int key = 0; key < 50; ++key) {
    SampleParams p = dream();
    p.temperature = 1.0f;
    p.seed = 5;
    const double u = rng_uniform(5, static_cast<uint64_t>(key), 3);
    const int want = u < 0.5 ? 0 : (u < 0.8 ? 1 : 2);
    const double pw[] = {0.5, 0.3, 0.2};
    Out o = sample1(row, p, key);
    ASSERT_EQ(o.tok[0], want) << "key " << key;
    EXPECT_NEAR(o.conf[0], pw[want], 1e-5);
  }
  // Temperature 2 flattens: P ~ p^(1/2); the confidence is the tempered probability.
  SampleParams p = dream();
  p.temperature = 2.0f;
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  Out o = sample1(row, p, 3);
  const double u = rng_uniform(0, 3, 3);
  const int want = u < std::sqrt(0.5) / z ? 0 : (u < (std::sqrt(0.5) + std::sqrt(0.3)) / z ? 1 : 2);
  EXPECT_EQ(o.tok[0], want);
  EXPECT_NEAR(o.conf[0], std::sqrt(std::vector<double>{0.5, 0.3, 0.2}[static_cast<size_t>(want)]) / z, 1e-5);
}

TEST(Sample, GumbelMatchesHandNoise) {
  for (int key = 0; key < 50; ++key) {
    SampleParams p = llada();
    p.temperature = 0.7f;
    p.seed = 11;
    int want = 0;
    double best = -1e300;
    for (int v = 0; v < 4; ++v) {
      const double u = rng_uniform(11, static_cast<uint64_t>(key), static_cast<uint64_t>(v));
      // LLaDA: argmax exp(L) / (-log U)^T
      const double s =
          std::exp(static_cast<double>(kRow[static_cast<size_t>(v)])) / std::pow(-std::log(u), 0.7);
      if (s > best) {
        best = s;
        want = v;
      }
    }
    Out o = sample1(kRow, p, key);
    ASSERT_EQ(o.tok[0], want) << "key " << key;
    const double ev[] = {e1, e3, e2, e0};
    EXPECT_NEAR(o.conf[0], ev[want] / kZ, 1e-6);  // softmax without temperature
  }
}

// Over many row keys, both samplers at T = 1 draw tokens with the softmax frequencies.
TEST(Sample, FrequenciesFollowSoftmax) {
  const int R = 20000;
  const std::vector<float> row = log_probs({0.6, 0.25, 0.15});
  std::vector<float> logits;
  std::vector<int32_t> keys;
  for (int r = 0; r < R; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    keys.push_back(r);
  }
  for (bool g : {false, true}) {
    SampleParams p = g ? llada() : dream();
    p.temperature = 1.0f;
    p.seed = 3;
    Out o = sample(logits, 3, keys, p);
    int cnt[3] = {0, 0, 0};
    for (int32_t t : o.tok) ++cnt[t];
    EXPECT_NEAR(cnt[0] / double(R), 0.6, 0.02) << (g ? "gumbel" : "dream");
    EXPECT_NEAR(cnt[1] / double(R), 0.25, 0.02);
    EXPECT_NEAR(cnt[2] / double(R), 0.15, 0.02);
  }
}

TEST(Sample, DeterministicAndKeyed) {
  std::vector<float> logits;
  std::vector<int32_t> keys;
  for (int r = 0; r < 64; ++r) {
    for (int v = 0; v < 16; ++v) logits.push_back(0.1f * static_cast<float>((r * 7 + v * 3) % 11));
    keys.push_back(100 + r);
  }
  for (bool g : {false, true}) {
    SampleParams p = g ? llada(ConfKind::Random) : dream(ConfKind::Random);
    p.temperature = 1.0f;
    p.seed = 99;
    Out a = sample(logits, 16, keys, p), b = sample(logits, 16, keys, p);
    EXPECT_EQ(a.tok, b.tok);
    EXPECT_EQ(a.conf, b.conf);
    // Each row equals the row sampled alone (no dependence on packing or threads).
    for (int r = 0; r < 64; r += 9) {
      std::vector<float> row(logits.begin() + r * 16, logits.begin() + (r + 1) * 16);
      Out s = sample1(row, p, keys[static_cast<size_t>(r)]);
      EXPECT_EQ(s.tok[0], a.tok[static_cast<size_t>(r)]);
      EXPECT_EQ(s.conf[0], a.conf[static_cast<size_t>(r)]);
    }
    // Same logits under different row keys draw different noise.
    std::vector<float> same;
    std::vector<int32_t> k2;
    for (int r = 0; r < 32; ++r) {
      same.insert(same.end(), logits.begin(), logits.begin() + 16);
      k2.push_back(r);
    }
    Out c = sample(same, 16, k2, p);
    int distinct_tok = 0;
    for (size_t r = 1; r < c.tok.size(); ++r) distinct_tok += c.tok[r] != c.tok[0];
    EXPECT_GT(distinct_tok, 0);
    for (size_t r = 1; r < c.conf.size(); ++r) EXPECT_NE(c.conf[r], c.conf[0]);
    // A different seed changes the draw.
    SampleParams q = p;
    q.seed = 100;
    EXPECT_NE(sample(same, 16, k2, q).conf, c.conf);
  }
}

TEST(Sample, TokenLogprob) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f, 0.5f, 0.5f};
  std::vector<int32_t> target = {2, 0};
  std::vector<float> lp(2);
  Tensor L(logits.data(), DType::F32, {2, 3});
  Tensor T(target.data(), DType::I32, {2});
  Tensor O(lp.data(), DType::F32, {2});
  cpu_token_logprob(L, T, O);
  EXPECT_NEAR(lp[0], 3.0 - std::log(e1 + e2 + e3), 1e-6);
  EXPECT_NEAR(lp[1], -std::log(3.0), 1e-6);
}

TEST(Sample, TopLogprobsHandComputed) {
  // Row 0: a tie between ids 1 and 3 (the lower first); row 1: a NaN is never chosen, and a row with
  // fewer non-NaN logits than K pads with id -1 and NaN.
  std::vector<float> logits = {1.0f, 2.0f, 0.0f, 2.0f, NAN, 1.0f, NAN, NAN};
  const double z0 = std::log(e1 + 2 * e2 + 1.0);
  std::vector<int32_t> ids(6, 99), tok = {2, 4};
  std::vector<float> lp(6, 99.0f), chosen(2, 99.0f);
  Tensor L(logits.data(), DType::F32, {2, 4}), T(tok.data(), DType::I32, {2}),
      C(chosen.data(), DType::F32, {2});
  Tensor I(ids.data(), DType::I32, {2, 3}), O(lp.data(), DType::F32, {2, 3});
  cpu_top_logprobs(L, T, C, I, O);
  EXPECT_NEAR(chosen[0], 0.0 - z0, 1e-6);
  EXPECT_TRUE(std::isnan(chosen[1]));  // out of the vocabulary
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids[2], 0);
  EXPECT_NEAR(lp[0], 2.0 - z0, 1e-6);
  EXPECT_NEAR(lp[1], 2.0 - z0, 1e-6);
  EXPECT_NEAR(lp[2], 1.0 - z0, 1e-6);
  // Row 1 holds NaN: its normaliser is NaN, as token_logprob's; the ids are still the non-NaN ones.
  EXPECT_EQ(ids[3], 1);
  EXPECT_EQ(ids[4], -1);
  EXPECT_EQ(ids[5], -1);
  EXPECT_TRUE(std::isnan(lp[4]) && std::isnan(lp[5]));
  // K > V is refused.
  std::vector<int32_t> big(10);
  std::vector<float> bl(10);
  Tensor BI(big.data(), DType::I32, {2, 5}), BO(bl.data(), DType::F32, {2, 5});
  EXPECT_THROW(cpu_top_logprobs(L, T, C, BI, BO), Error);
}

TEST(Sample, TopLogprobsMatchAFullSortAndTokenLogprob) {
  const int64_t R = 9, V = 5003, K = 20;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(R * V));
  for (float& x : logits) x = std::round(nd(rng) * 4.0f) / 4.0f;  // quarter steps: many exact ties
  logits[static_cast<size_t>(2 * V + 17)] = -INFINITY;
  std::vector<int32_t> ids(static_cast<size_t>(R * K)), tok(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) tok[static_cast<size_t>(r)] = static_cast<int32_t>((r * 997) % V);
  std::vector<float> lp(ids.size()), chosen(tok.size()), chosen_ref(tok.size());
  Tensor L(logits.data(), DType::F32, {R, V}), T(tok.data(), DType::I32, {R});
  Tensor C(chosen.data(), DType::F32, {R}), CR(chosen_ref.data(), DType::F32, {R});
  Tensor I(ids.data(), DType::I32, {R, K}), O(lp.data(), DType::F32, {R, K});
  cpu_top_logprobs(L, T, C, I, O);
  cpu_token_logprob(L, T, CR);
  EXPECT_EQ(chosen, chosen_ref);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = logits.data() + r * V;
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    // token_logprob of the same ids is the reference value (bit for bit: the same arithmetic).
    std::vector<int32_t> tgt(order.begin(), order.begin() + K);
    std::vector<float> ref(static_cast<size_t>(K));
    std::vector<float> rows(static_cast<size_t>(K * V));
    for (int64_t k = 0; k < K; ++k) std::copy_n(row, V, rows.begin() + k * V);
    Tensor RL(rows.data(), DType::F32, {K, V}), RT(tgt.data(), DType::I32, {K}),
        RO(ref.data(), DType::F32, {K});
    cpu_token_logprob(RL, RT, RO);
    double m = -INFINITY, z = 0.0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(row[v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - m);
    for (int64_t k = 0; k < K; ++k) {
      EXPECT_EQ(ids[static_cast<size_t>(r * K + k)], order[static_cast<size_t>(k)])
          << "row " << r << " rank " << k;
      EXPECT_EQ(lp[static_cast<size_t>(r * K + k)], ref[static_cast<size_t>(k)]);
      EXPECT_NEAR(lp[static_cast<size_t>(r * K + k)], row[order[static_cast<size_t>(k)]] - m - std::log(z),
                  1e-5);
    }
  }
}

}  // namespace
}  // namespace tessera
