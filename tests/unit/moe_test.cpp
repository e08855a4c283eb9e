// Mixture-of-experts: the CPU router against hand-computed values, the CPU expert FFN against a naive
// loop over every (row, slot), LLaDA-MoE config.json parsing, and the shape-only MoE geometries.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "memory/planner.h"
#include "models/model.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::random_floats;
using test::rel_error;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed route(const std::vector<float>& logits, int E, const MoeRouteParams& p) {
  auto be = make_cpu_backend();
  const auto M = static_cast<int64_t>(logits.size()) / E;
  Routed r{std::vector<int32_t>(static_cast<size_t>(M * p.top_k), -1),
           std::vector<float>(static_cast<size_t>(M * p.top_k), std::numeric_limits<float>::quiet_NaN())};
  Tensor l(const_cast<float*>(logits.data()), DType::F32, {M, E});
  Tensor ids(r.ids.data(), DType::I32, {M, p.top_k}), w(r.w.data(), DType::F32, {M, p.top_k});
  be->moe_route(l, p, ids, w);
  return r;
}

float logit_of(float s) {  // sigmoid^-1
  return std::log(s / (1.0f - s));
}

TEST(MoeRoute, SoftmaxTopKWithoutRenormalisation) {
  // Row 0: softmax([1, 2, 3, 0]) = e^x / 31.19287485 -> top-2 = expert 2 (0.6439143), expert 1
  // (0.2368828). Row 1: three equal logits -> ties go to the lower expert: 0, then 1, each with
  // p = e^0.5 / (3 e^0.5 + e^-1) = 1.6487213 / 5.3140433 = 0.3102574.
  MoeRouteParams p;
  p.top_k = 2;
  const Routed r = route({1, 2, 3, 0, 0.5f, 0.5f, 0.5f, -1}, 4, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1, 0, 1}));
  EXPECT_NEAR(r.w[0], 0.6439143f, 1e-6);
  EXPECT_NEAR(r.w[1], 0.2368828f, 1e-6);
  EXPECT_NEAR(r.w[2], 0.3102574f, 1e-6);
  EXPECT_NEAR(r.w[3], 0.3102574f, 1e-6);
  // norm_topk and scale: 0.6439143 / (0.6439143 + 0.2368828) * 2 = 1.4621172
  p.norm_topk = true;
  p.scale = 2.0f;
  const Routed n = route({1, 2, 3, 0}, 4, p);
  EXPECT_NEAR(n.w[0], 1.4621172f, 1e-5);
  EXPECT_NEAR(n.w[1], 0.5378828f, 1e-5);
}

TEST(MoeRoute, SigmoidBiasGroupsRenormScaleLikeLlada2) {
  // Sigmoid scores s and selection bias (expert 4 only) -> selection scores b:
  //   s = [0.9, 0.1, 0.6, 0.5, 0.2, 0.8, 0.7, 0.3], bias[4] = 0.45 -> b[4] = 0.65.
  // 4 groups of 2, group score = sum of its top-2 b: [1.0, 1.1, 1.45, 1.0] -> keep groups 2 and 1;
  // eligible b: e2 0.6, e3 0.5, e4 0.65, e5 0.8 -> top-3 = 5, 4, 2 (expert 0, the best, sits in a
  // dropped group; expert 4 beats expert 3 only through its bias).
  // Weights from the UNBIASED s: [0.8, 0.2, 0.6] / 1.6 * 2.5 = [1.25, 0.3125, 0.9375].
  const float s[8] = {0.9f, 0.1f, 0.6f, 0.5f, 0.2f, 0.8f, 0.7f, 0.3f};
  std::vector<float> logits;
  for (float v : s) logits.push_back(logit_of(v));
  const std::vector<float> bias = {0, 0, 0, 0, 0.45f, 0, 0, 0};
  MoeRouteParams p;
  p.score = MoeScore::Sigmoid;
  p.top_k = 3;
  p.norm_topk = true;
  p.scale = 2.5f;
  p.n_group = 4;
  p.topk_group = 2;
  p.expert_bias = bias.data();
  const Routed g = route(logits, 8, p);
  EXPECT_EQ(g.ids, (std::vector<int32_t>{5, 4, 2}));
  EXPECT_NEAR(g.w[0], 1.25f, 1e-5);
  EXPECT_NEAR(g.w[1], 0.3125f, 1e-5);
  EXPECT_NEAR(g.w[2], 0.9375f, 1e-5);
  // Without groups: b top-3 = 0 (0.9), 5 (0.8), 6 (0.7) -> [0.9, 0.8, 0.7] / 2.4 * 2.5.
  p.n_group = p.topk_group = 1;
  const Routed f = route(logits, 8, p);
  EXPECT_EQ(f.ids, (std::vector<int32_t>{0, 5, 6}));
  EXPECT_NEAR(f.w[0], 0.9375f, 1e-5);
  EXPECT_NEAR(f.w[1], 0.8333333f, 1e-5);
  EXPECT_NEAR(f.w[2], 0.7291667f, 1e-5);
}

// ---- Dynamic Expert Sharing (MoeShare) against hand-computed coresets ---------------------------

struct Shared {
  Routed r;
  std::vector<float> state;  // [5 * E]
};

// Routes `logits` with the share rows and passes of `sh` (state zeroed first unless `state` is given).
Shared route_shared(const std::vector<float>& logits, int E, const MoeRouteParams& base, MoeShare sh,
                    std::vector<float> state = {}) {
  Shared out;
  out.state = state.empty() ? std::vector<float>(static_cast<size_t>(5 * E), 0.0f) : state;
  sh.state = out.state.data();
  MoeRouteParams p = base;
  p.share = &sh;
  out.r = route(logits, E, p);
  return out;
}

void expect_weights(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
}

std::vector<float> flags(const std::vector<float>& state, int E, int which) {
  return {state.begin() + which * E, state.begin() + (which + 1) * E};
}

TEST(MoeShare, SeqAndVoteCoresetsHandComputed) {
  // Softmax of log(p) is p. Rows: p0 = [.5 .3 .15 .05], p1 = [.1 .2 .3 .4], p2 = [.05 .15 .3 .5];
  // top-2: row 0 {0, 1}, row 1 {3, 2}, row 2 {3, 2}. Rows 0 and 1 vote: V = [.5 .3 .3 .4].
  const std::vector<float> p = {.5f, .3f, .15f, .05f, .1f, .2f, .3f, .4f, .05f, .15f, .3f, .5f};
  std::vector<float> logits;
  for (float v : p) logits.push_back(std::log(v));
  MoeRouteParams base;
  base.top_k = 2;
  MoeShare sh;
  sh.vote_lo = 0;
  sh.vote_hi = 2;
  sh.share_lo = 0;
  sh.share_hi = 2;
  sh.vote = sh.apply = true;
  // DES-Seq, k = 1: C = {0, 3} (each voting row's first expert). Row 0 -> [0 (.5), 3 (.05)], row 1 ->
  // [3 (.4), 0 (.1)]; row 2 (not a share row) keeps its own [3, 2].
  sh.mode = DesMode::Seq;
  sh.k = 1;
  sh.m_core = 4;
  Shared a = route_shared(logits, 4, base, sh);
  EXPECT_EQ(a.r.ids, (std::vector<int32_t>{0, 3, 3, 0, 3, 2}));
  expect_weights(a.r.w, {.5f, .05f, .4f, .1f, .5f, .3f});
  EXPECT_EQ(flags(a.state, 4, 1), (std::vector<float>{1, 0, 0, 1}));  // seq counts
  EXPECT_EQ(flags(a.state, 4, 4), (std::vector<float>{1, 0, 0, 1}));  // coreset
  EXPECT_EQ(flags(a.state, 4, 2), (std::vector<float>{1, 0, 1, 1}));  // hit: row 2 used expert 2
  EXPECT_EQ(flags(a.state, 4, 3), (std::vector<float>{1, 0, 0, 1}));  // hit by voting rows
  expect_weights(flags(a.state, 4, 0), {.5f, .3f, .3f, .4f});         // votes
  // DES-Vote, m = 3: V ranks 0 (.5), 3 (.4), then 1 and 2 tie at .3 -> the lower id: C = {0, 1, 3}.
  // Every row shares: row 0 [0, 1], row 1 [3 (.4), 1 (.2)], row 2 [3 (.5), 1 (.15)].
  sh.mode = DesMode::Vote;
  sh.m_core = 3;
  sh.share_hi = 3;
  Shared b = route_shared(logits, 4, base, sh);
  EXPECT_EQ(b.r.ids, (std::vector<int32_t>{0, 1, 3, 1, 3, 1}));
  expect_weights(b.r.w, {.5f, .3f, .4f, .2f, .5f, .15f});
  EXPECT_EQ(flags(b.state, 4, 4), (std::vector<float>{1, 1, 0, 1}));
  EXPECT_EQ(flags(b.state, 4, 2), (std::vector<float>{1, 1, 0, 1}));
  // m = 1: C = {0}, then filled to top_k by votes: {0, 3}.
  sh.m_core = 1;
  Shared c = route_shared(logits, 4, base, sh);
  EXPECT_EQ(flags(c.state, 4, 4), (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(c.r.ids, (std::vector<int32_t>{0, 3, 3, 0, 3, 0}));
  // Votes first (the chunks holding voting rows), then routing: the same as one call.
  sh.m_core = 3;
  sh.apply = false;
  Shared v = route_shared(logits, 4, base, sh);
  EXPECT_EQ(v.r.ids, (std::vector<int32_t>{0, 1, 3, 2, 3, 2}));  // normal routing while voting
  sh.apply = true;
  sh.vote = false;
  Shared two = route_shared(logits, 4, base, sh, v.state);
  EXPECT_EQ(two.r.ids, b.r.ids);
  EXPECT_EQ(two.state, b.state);
  // No voting row in the call's forward: every expert stays, routing is unchanged.
  sh.vote = true;
  sh.vote_lo = sh.vote_hi = 1;
  Shared none = route_shared(logits, 4, base, sh);
  EXPECT_EQ(none.r.ids, (std::vector<int32_t>{0, 1, 3, 2, 3, 2}));
  EXPECT_EQ(flags(none.state, 4, 4), (std::vector<float>{1, 1, 1, 1}));
  // Off: routing unchanged, the hits recorded.
  sh.mode = DesMode::Off;
  sh.vote_lo = 0;
  sh.vote_hi = 2;
  Shared off = route_shared(logits, 4, base, sh);
  EXPECT_EQ(off.r.ids, (std::vector<int32_t>{0, 1, 3, 2, 3, 2}));
  EXPECT_EQ(flags(off.state, 4, 3), (std::vector<float>{1, 1, 1, 1}));
}

// Expert parallelism's exchanges for a routing (bench --profile), by hand: 8 experts, 2 per row, rows 1-3
// of a step. With N ranks, rank e / (8 / N) holds expert e and row r belongs to rank r % N.
TEST(MoeTraffic, RowsRanksAndLoadsHandComputed) {
  const std::vector<int32_t> ids{0, 7, 2, 3, 5, 4};
  MoeTraffic t;
  t.hidden = 10;
  t.add(ids, 2, 8, 1);
  EXPECT_EQ(t.calls, 1);
  EXPECT_EQ(t.rows, 3);
  EXPECT_EQ(t.pairs, 6);
  // 2 ranks (experts 0-3, 4-7): row 1 touches both and is rank 1's; row 2 only rank 0 (its own); row 3
  // only rank 1 (its own). Loads 3 and 3.
  EXPECT_EQ(t.touched[0], 4);
  EXPECT_EQ(t.sent_rows[0], 1);
  EXPECT_EQ(t.busiest[0], 3);
  // 4 ranks (pairs of experts): row 1 -> ranks 0, 3 (owner 1); row 2 -> rank 1 (owner 2); row 3 -> rank 2
  // (owner 3). Loads 1, 2, 2, 1.
  EXPECT_EQ(t.touched[1], 4);
  EXPECT_EQ(t.sent_rows[1], 4);
  EXPECT_EQ(t.busiest[1], 2);
  // 8 ranks: row 1 -> 0, 7 (owner 1); row 2 -> 2, 3 (owner 2); row 3 -> 5, 4 (owner 3).
  EXPECT_EQ(t.touched[2], 6);
  EXPECT_EQ(t.sent_rows[2], 5);
  EXPECT_EQ(t.busiest[2], 1);
  // All-reduce: 2 (N - 1) rows x hidden f32; sparse combine: the sent rows + (N - 1) rows, x hidden f32.
  EXPECT_EQ(t.all_reduce_bytes(0), 2.0 * 1 * 3 * 10 * 4);
  EXPECT_EQ(t.sparse_bytes(0), (1 + 3) * 10 * 4.0);
  EXPECT_EQ(t.all_reduce_bytes(2), 2.0 * 7 * 3 * 10 * 4);
  EXPECT_EQ(t.sparse_bytes(2), (5 + 21) * 10 * 4.0);
  // 6 experts split only over 2 ranks: the 4- and 8-rank counts stay empty.
  MoeTraffic six;
  six.add(std::vector<int32_t>{0, 5}, 2, 6, 0);
  EXPECT_EQ(six.touched[0], 2);
  EXPECT_EQ(six.sent_rows[0], 1);
  EXPECT_EQ(six.touched[1] + six.touched[2], 0);
}

TEST(MoeShare, BadParametersFailClearly) {
  MoeRouteParams base;
  base.top_k = 2;
  MoeShare sh;
  sh.mode = DesMode::Seq;
  sh.apply = true;
  sh.m_core = 2;
  sh.vote_hi = sh.share_hi = 3;  // 2 rows only
  test::expect_error([&] { route_shared(std::vector<float>(8, 0.0f), 4, base, sh); },
                     "expert sharing rows outside the call's 2 rows");
  sh.vote_hi = sh.share_hi = 2;
  sh.k = 3;
  test::expect_error([&] { route_shared(std::vector<float>(8, 0.0f), 4, base, sh); },
                     "DES-Seq k must be in [1, top_k = 2]");
  sh.k = 1;
  sh.mode = DesMode::Vote;
  sh.m_core = 5;
  test::expect_error([&] { route_shared(std::vector<float>(8, 0.0f), 4, base, sh); },
                     "coreset size must be in [1, 4]");
}

TEST(MoeRoute, BadParametersFailClearly) {
  MoeRouteParams p;
  p.top_k = 5;
  EXPECT_THROW(route(std::vector<float>(8, 0.0f), 4, p), Error);  // top_k > E
  p.top_k = 2;
  p.n_group = 3;  // does not divide 4
  EXPECT_THROW(route(std::vector<float>(8, 0.0f), 4, p), Error);
}

// ---- moe_ffn against a naive loop over every (row, slot) ----------------------------------------

struct FfnCase {
  int64_t M, H, I;
  int E, k;
  DType dt;
  std::vector<int32_t> allowed;      // experts the random ids are drawn from (others get no rows)
  bool all_rows_to_expert0 = false;  // slot 0 of every row -> expert 0 (tiles of 256 + rest)
};

// Values representable in dt (bf16 tensors hold exactly what the reference reads).
std::vector<float> in_dtype(std::vector<float> v, DType dt) {
  if (dt == DType::BF16)
    for (float& x : v) x = round_bf16(x);
  return v;
}
std::vector<uint16_t> to_bits(const std::vector<float>& v, DType dt) {
  std::vector<uint16_t> b(dt == DType::BF16 ? v.size() : 0);
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
void* data_of(std::vector<float>& f, std::vector<uint16_t>& b, DType dt) {
  return dt == DType::BF16 ? static_cast<void*>(b.data()) : static_cast<void*>(f.data());
}

void check_moe_ffn(const FfnCase& c, uint64_t seed) {
  const int64_t M = c.M, H = c.H, I = c.I, P = M * c.k;
  const bool bf = c.dt == DType::BF16;
  auto round = [&](double v) { return bf ? round_bf16(static_cast<float>(v)) : static_cast<float>(v); };
  auto x = in_dtype(random_floats(static_cast<size_t>(M * H), seed), c.dt);
  std::vector<std::vector<float>> wts;  // gate[E], up[E], down[E]
  for (int i = 0; i < 3 * c.E; ++i) {
    const float sd = 1.0f / std::sqrt(static_cast<float>(i < 2 * c.E ? H : I));
    wts.push_back(
        in_dtype(random_floats(static_cast<size_t>(H * I), seed + 1 + static_cast<uint64_t>(i), sd), c.dt));
  }
  std::vector<int32_t> ids(static_cast<size_t>(P));
  uint64_t s = seed;
  for (int64_t m = 0; m < M; ++m) {  // distinct experts per row, from `allowed`
    for (int j = 0; j < c.k; ++j) {
      int32_t e;
      bool dup;
      do {
        s = rng_mix(s);
        e = c.all_rows_to_expert0 && j == 0 ? 0 : c.allowed[s % c.allowed.size()];
        dup = false;
        for (int t = 0; t < j; ++t) dup |= ids[static_cast<size_t>(m * c.k + t)] == e;
      } while (dup);
      ids[static_cast<size_t>(m * c.k + j)] = e;
    }
  }
  const auto w = random_floats(static_cast<size_t>(P), seed + 99, 0.5f);
  const auto init = random_floats(static_cast<size_t>(M * H), seed + 98);

  // Naive reference in double with the kernel's rounding points.
  std::vector<double> want(init.begin(), init.end());
  for (int64_t m = 0; m < M; ++m) {
    for (int j = 0; j < c.k; ++j) {
      const int e = ids[static_cast<size_t>(m * c.k + j)];
      const auto &G = wts[static_cast<size_t>(e)], &U = wts[static_cast<size_t>(c.E + e)],
                 &D = wts[static_cast<size_t>(2 * c.E + e)];
      std::vector<float> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += static_cast<double>(x[static_cast<size_t>(m * H + h)]) * G[static_cast<size_t>(i * H + h)];
          u += static_cast<double>(x[static_cast<size_t>(m * H + h)]) * U[static_cast<size_t>(i * H + h)];
        }
        const float gr = round(g), ur = round(u);
        a[static_cast<size_t>(i)] = round(round(gr / (1.0 + std::exp(-static_cast<double>(gr)))) * ur);
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i)
          y += static_cast<double>(a[static_cast<size_t>(i)]) * D[static_cast<size_t>(h * I + i)];
        want[static_cast<size_t>(m * H + h)] += w[static_cast<size_t>(m * c.k + j)] * y;
      }
    }
  }

  auto be = make_cpu_backend();
  auto xb = to_bits(x, c.dt);
  std::vector<std::vector<uint16_t>> wb;
  std::vector<const void*> table;
  for (auto& t : wts) wb.push_back(to_bits(t, c.dt));
  for (size_t i = 0; i < wts.size(); ++i) table.push_back(data_of(wts[i], wb[i], c.dt));
  const MoeExperts ex{table.data(), c.E, H, I, c.dt};
  std::vector<char> scratch(moe_scratch_bytes(M, c.k, ex));
  std::vector<float> out = init;
  Tensor tx(data_of(x, xb, c.dt), c.dt, {M, H}), tids(ids.data(), DType::I32, {M, c.k}),
      tw(const_cast<float*>(w.data()), DType::F32, {M, c.k}),
      ts(scratch.data(), DType::I32, {static_cast<int64_t>(scratch.size() / 4)}),
      to(out.data(), DType::F32, {M, H});
  be->moe_ffn(tx, tids, tw, ex, ts, to);
  std::vector<float> wantf(want.begin(), want.end()), delta(out.size()), want_delta(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    delta[i] = out[i] - init[i];
    want_delta[i] = wantf[i] - init[i];
  }
  const double err = rel_error(delta.data(), want_delta.data(), delta.size());
  EXPECT_LE(err, bf ? 1e-2 : 1e-5) << "M=" << M << (bf ? " bf16" : " f32");
  // A second call on the same buffers computes the same thing again (no state kept between calls).
  std::vector<float> again = init;
  Tensor ta(again.data(), DType::F32, {M, H});
  be->moe_ffn(tx, tids, tw, ex, ts, ta);
  EXPECT_EQ(again, out);
  // A scratch smaller than moe_scratch_bytes is refused with an error.
  Tensor small(scratch.data(), DType::I32, {static_cast<int64_t>(scratch.size() / 8)});
  EXPECT_THROW(be->moe_ffn(tx, tids, tw, ex, small, ta), Error);
  // Both schedules give the same bits: one expert's GEMMs at a time over the threads, and the experts'
  // windows shared out among the threads (at least two of them, whatever the machine has).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(std::max(2, threads));
  for (CpuMoe sched : {CpuMoe::PerExpert, CpuMoe::AcrossExperts}) {
    auto bs = make_cpu_backend(CpuBackendOptions{CpuAttention::Auto, sched});
    for (int rep = 0; rep < 2; ++rep) {  // the second call on primitives and slots already made
      std::vector<float> o2 = init;
      Tensor t2(o2.data(), DType::F32, {M, H});
      bs->moe_ffn(tx, tids, tw, ex, ts, t2);
      EXPECT_EQ(o2, out) << "M=" << M << (bf ? " bf16" : " f32")
                         << (sched == CpuMoe::PerExpert ? " per expert" : " across experts");
    }
  }
  omp_set_num_threads(threads);
}

TEST(MoeFfn, MatchesNaiveLoopF32AndBf16WithIdleExperts) {
  for (DType dt : {DType::F32, DType::BF16}) {
    // Experts 3 and 5 receive no rows.
    check_moe_ffn({37, 64, 48, 6, 3, dt, {0, 1, 2, 4}}, 1);
    check_moe_ffn({1, 64, 48, 6, 2, dt, {0, 1, 2, 4}}, 2);  // M = 1
    check_moe_ffn({1, 32, 16, 4, 1, dt, {3}}, 3);           // one row, one expert, top-1
  }
}

TEST(MoeFfn, ManyRowsOnOneExpertUseSeveralTiles) {
  // 300 rows of expert 0 in slot 0: tiles of 256, 32, 8 and 4 rows.
  check_moe_ffn({300, 32, 24, 4, 2, DType::BF16, {1, 2, 3}, true}, 4);
  check_moe_ffn({300, 32, 24, 4, 2, DType::F32, {1, 2, 3}, true}, 5);
}

TEST(MoeFfn, ExpertIdsOutsideTheTableFail) {
  auto be = make_cpu_backend();
  std::vector<float> x(8, 1.0f), w(2, 1.0f), out(8, 0.0f), wt(8 * 4, 0.1f);
  const void* table[3] = {wt.data(), wt.data(), wt.data()};
  const MoeExperts ex{table, 1, 8, 4, DType::F32};
  std::vector<int32_t> ids = {0, 1};  // expert 1 does not exist
  std::vector<char> scratch(moe_scratch_bytes(1, 2, ex));
  Tensor tx(x.data(), DType::F32, {1, 8}), tids(ids.data(), DType::I32, {1, 2}),
      tw(w.data(), DType::F32, {1, 2}),
      ts(scratch.data(), DType::I32, {static_cast<int64_t>(scratch.size() / 4)}),
      to(out.data(), DType::F32, {1, 8});
  EXPECT_THROW(be->moe_ffn(tx, tids, tw, ex, ts, to), Error);
}

// A rank's range of experts (expert parallelism) must lie inside the table: refused by the op check every
// backend shares, before anything is read.
TEST(MoeFfn, ARanksExpertRangeOutsideTheTableFails) {
  auto be = make_cpu_backend();
  std::vector<float> x(8, 1.0f), w(2, 1.0f), out(8, 0.0f), wt(8 * 4, 0.1f);
  const void* table[6] = {wt.data(), wt.data(), wt.data(), wt.data(), wt.data(), wt.data()};
  std::vector<int32_t> ids = {0, 1};
  for (const auto& [lo, hi] : {std::pair{1, 3}, std::pair{-1, 1}, std::pair{1, 1}}) {
    MoeExperts ex{table, 2, 8, 4, DType::F32};
    ex.local_lo = lo;
    ex.local_hi = hi;
    std::vector<char> scratch(moe_scratch_bytes(1, 2, ex));
    Tensor tx(x.data(), DType::F32, {1, 8}), tids(ids.data(), DType::I32, {1, 2}),
        tw(w.data(), DType::F32, {1, 2}),
        ts(scratch.data(), DType::I32, {static_cast<int64_t>(scratch.size() / 4)}),
        to(out.data(), DType::F32, {1, 8});
    test::expect_error([&] { be->moe_ffn(tx, tids, tw, ex, ts, to); },
                       "moe_ffn: the rank's experts [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           ") must be a range inside [0, 2)");
  }
}

// ---- config.json --------------------------------------------------------------------------------

// The published LLaDA-MoE-7B-A1B fields (LLaDAMoEConfig), with `edits` applied (an empty value
// removes the field).
ModelConfig moe_config(const std::vector<std::pair<std::string, std::string>>& edits = {}) {
  std::map<std::string, std::string> f = {
      {"model_type", "\"lladamoe\""},
      {"hidden_size", "2048"},
      {"num_hidden_layers", "16"},
      {"num_attention_heads", "16"},
      {"num_key_value_heads", "16"},
      {"dense_intermediate_size", "8192"},
      {"expert_intermediate_size", "1024"},
      {"shared_expert_intermediate_size", "null"},
      {"num_experts", "64"},
      {"num_experts_per_tok", "8"},
      {"norm_topk_prob", "null"},
      {"moe_router_score_function", "\"softmax\""},
      {"moe_router_enable_expert_bias", "false"},
      {"routed_scaling_factor", "1"},
      {"partial_rotary_factor", "1.0"},
      {"rope_theta", "50000"},
      {"rms_norm_eps", "1e-05"},
      {"max_position_embeddings", "8192"},
      {"vocab_size", "157184"},
      {"tie_word_embeddings", "false"},
      {"mask_token_id", "156895"},
      {"eos_token_id", "156892"},
      {"pad_token_id", "156892"},
      {"hidden_act", "\"silu\""},
      {"moe_layer_freq", "[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"}};
  for (const auto& [key, value] : edits) {
    if (value.empty()) {
      f.erase(key);
    } else {
      f[key] = value;
    }
  }
  std::string json = "{";
  for (const auto& [k, v] : f) json += (json.size() > 1 ? ", \"" : "\"") + k + "\": " + v;
  const auto dir = test::temp_dir("moe_config");
  std::ofstream(dir / "config.json") << json << "}";
  return load_config(dir);
}

void expect_config_error(const std::string& key, const std::string& value, const std::string& names) {
  try {
    moe_config({{key, value}});
    ADD_FAILURE() << key << "=" << value << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(LladaMoeConfig, ReadsThePublishedFields) {
  const ModelConfig c = moe_config();
  EXPECT_EQ(c.family, Family::LLaDAMoE);
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary(), 128);
  EXPECT_TRUE(c.qk_norm);  // qk_layernorm defaults to true
  EXPECT_EQ(c.moe.n_experts, 64);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.expert_inter, 1024);
  EXPECT_EQ(c.moe.n_shared, 0);
  EXPECT_FALSE(c.moe.norm_topk);  // null = no renormalisation
  EXPECT_EQ(c.moe.score, RouterScore::Softmax);
  EXPECT_EQ(c.intermediate, 8192);
  for (int64_t l = 0; l < 16; ++l) EXPECT_TRUE(c.is_moe_layer(l));
  EXPECT_EQ(c.mask_id, 156895);
  EXPECT_EQ(c.eos_id, 156892);
  // Also accepted: model_type "llada_moe", the shipped "llada" with MoE fields, moe_intermediate_size.
  EXPECT_EQ(moe_config({{"model_type", "\"llada_moe\""}}).family, Family::LLaDAMoE);
  EXPECT_EQ(moe_config({{"model_type", "\"llada\""}}).family, Family::LLaDAMoE);
  EXPECT_EQ(moe_config({{"expert_intermediate_size", ""}, {"moe_intermediate_size", "768"}}).moe.expert_inter,
            768);
}

TEST(LladaMoeConfig, OptionalFields) {
  EXPECT_EQ(moe_config({{"partial_rotary_factor", "0.5"}}).rotary(), 64);
  EXPECT_TRUE(moe_config({{"norm_topk_prob", "true"}}).moe.norm_topk);
  EXPECT_FALSE(moe_config({{"qk_layernorm", "false"}}).qk_norm);
  const ModelConfig d = moe_config({{"moe_layer_freq", "[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]"}});
  EXPECT_FALSE(d.is_moe_layer(0));
  EXPECT_TRUE(d.is_moe_layer(1));
  EXPECT_FALSE(d.is_moe_layer(15));
  const ModelConfig s = moe_config({{"shared_expert_intermediate_size", "512"}});
  EXPECT_EQ(s.moe.n_shared, 1);
  EXPECT_EQ(s.moe.shared_inter, 512);
}

TEST(LladaMoeConfig, BadValuesNameTheField) {
  expect_config_error("num_experts_per_tok", "65", "num_experts_per_tok");
  expect_config_error("moe_router_score_function", "\"sigmoid\"", "moe_router_score_function");
  expect_config_error("moe_router_enable_expert_bias", "true", "moe_router_enable_expert_bias");
  expect_config_error("moe_layer_freq", "[1, 1]", "moe_layer_freq");
  expect_config_error("partial_rotary_factor", "0.3", "partial_rotary_factor");
  expect_config_error("num_experts", "", "num_experts");
  expect_config_error("hidden_act", "\"gelu\"", "hidden_act");
  expect_config_error("routed_scaling_factor", "-1", "routed_scaling_factor");
  // moe_intermediate_size is accepted in place of expert_intermediate_size, but not a different value.
  expect_config_error("moe_intermediate_size", "512", "moe_intermediate_size");
  expect_config_error("expert_intermediate_size", "", "expert_intermediate_size");
  // A dense layer needs dense_intermediate_size; without dense layers it may be absent.
  EXPECT_EQ(moe_config({{"dense_intermediate_size", ""}}).intermediate, 0);
  try {
    moe_config({{"dense_intermediate_size", ""},
                {"moe_layer_freq", "[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"}});
    ADD_FAILURE() << "a dense layer without dense_intermediate_size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dense_intermediate_size"), std::string::npos) << e.what();
  }
}

// ---- shape-only geometries ----------------------------------------------------------------------

TEST(MoeGeometry, ParameterCounts) {
  // LLaDA-MoE-7B-A1B: per layer 4 * 2048^2 attention + 2 * 2048 + 2 * 128 norms + 64 x 3 x 2048 x 1024
  // experts + 64 x 2048 router; 16 layers; untied 157184 x 2048 embedding and head + final norm.
  const ModelConfig c = named_geometry("llada-moe-7b");
  const int64_t d = 2048, attn = 4 * d * d + 2 * d + 2 * 128, expert = 3 * d * 1024, router = 64 * d;
  const int64_t emb = 2 * 157184 * d + d;
  EXPECT_EQ(c.param_count(), emb + 16 * (attn + 64 * expert + router));
  EXPECT_EQ(c.active_param_count(), emb + 16 * (attn + 8 * expert + router));
  EXPECT_NEAR(static_cast<double>(c.active_param_count() - emb) / 1e9, 1.08, 0.01);  // "A1B"
  // LLaDA2.0-mini: layer 0 dense (5120), 19 MoE layers with 256 experts (+ bias) and a shared expert.
  const ModelConfig m = named_geometry("llada2-mini");
  const int64_t a2 = d * d + 2 * d * 512 + d * d + 2 * d + 2 * 128;  // q, k/v (4 heads), o, norms
  const int64_t moe = 256 * 3 * d * 512 + 256 * d + 256 + 3 * d * 512;
  EXPECT_EQ(m.param_count(), emb + 20 * a2 + 3 * d * 5120 + 19 * moe);
}

graph::Program plan_geometry(const std::string& name, int64_t n, int64_t k_ffn,
                             graph::GraphTemplate* out = nullptr) {
  const ModelConfig c = named_geometry(name);
  graph::GraphTemplate g = build_dense_graph(shape_only_weights(c, DType::BF16),
                                             graph_options(c, DType::BF16), OutputMode::Sample);
  graph::StepShape s;
  s.n_query = s.n_kv = n;
  s.n_logits = n / 50;
  s.k_ffn = k_ffn;
  graph::Program p = graph::instantiate(g, s);
  memory::plan(g, p);
  if (out != nullptr) *out = std::move(g);
  return p;
}

TEST(MoeGeometry, ShapeOnlyGraphsPlanTheMoeTensors) {
  for (const char* name : {"llada-moe-7b", "llada2-mini"}) {
    graph::GraphTemplate g;
    const graph::Program p = plan_geometry(name, 1000, 1, &g);
    const ModelConfig c = named_geometry(name);
    const int moe_layer = 1;  // MoE in both (llada2-mini: layer 0 is dense)
    const auto bytes = [&](const std::string& t) {
      const int id = g.find("blk." + std::to_string(moe_layer) + "." + t);
      EXPECT_GE(id, 0) << name << " lacks " << t;
      return id < 0 ? size_t{0} : p.tensors[static_cast<size_t>(id)].bytes;
    };
    const MoeExperts e{nullptr, static_cast<int>(c.moe.n_experts), c.hidden, c.moe.expert_inter, DType::BF16};
    EXPECT_EQ(bytes("ffn_router"), 1000u * static_cast<size_t>(c.moe.n_experts) * 4) << name;
    EXPECT_EQ(bytes("moe_ids"), 1000u * 8 * 4) << name;
    EXPECT_EQ(bytes("moe_weights"), 1000u * 8 * 4) << name;
    EXPECT_GE(bytes("moe_scratch"), moe_scratch_bytes(1000, 8, e)) << name;
    EXPECT_LE(bytes("moe_scratch"), moe_scratch_bytes(1000, 8, e) + 4 * 1000 + 4) << name;
    EXPECT_GE(g.find("blk.1.attn_q_norm.weight"), 0) << name;
    // Chunking the FFN shrinks the MoE buffers and the plan.
    const graph::Program q = plan_geometry(name, 1000, 4);
    EXPECT_LT(q.peak, p.peak) << name;
  }
  // llada2-mini: a dense layer 0, shared experts elsewhere, RoPE on 64 of 128 dims, block-causal.
  graph::GraphTemplate g;
  plan_geometry("llada2-mini", 64, 1, &g);
  EXPECT_GE(g.find("blk.0.ffn_gate"), 0);
  EXPECT_LT(g.find("blk.0.moe_scratch"), 0);
  EXPECT_GE(g.find("blk.1.ffn_gate_shexp"), 0);
  EXPECT_GE(g.find("blk.1.ffn_router_bias.weight"), 0);
  for (const graph::OpDecl& op : g.ops()) {
    if (op.kind == graph::OpKind::Rope) {
      EXPECT_EQ(op.p.rope.rotary_dim, 64);
    }
    if (op.kind == graph::OpKind::Attention) {
      EXPECT_EQ(op.p.mask, MaskKind::BlockCausal);
      EXPECT_EQ(op.p.block_size, 32);
    }
    if (op.kind == graph::OpKind::MoeRoute) {
      EXPECT_EQ(op.p.route.score, MoeScore::Sigmoid);
      EXPECT_EQ(op.p.route.n_group, 8);
      EXPECT_EQ(op.p.route.topk_group, 4);
      EXPECT_TRUE(op.p.route.norm_topk);
      EXPECT_FLOAT_EQ(op.p.route.scale, 2.5f);
    }
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The LLaDA2.0-mini layer structure at toy width with random weights, end to end through the engine:
// dense layer 0, then sigmoid + bias + grouped routing with a shared expert, partial rotary and the
// block-causal mask (block 32): a change at position 40 leaves the logits of block 0 untouched.
TEST(MoeGeometry, SyntheticLlada2LayoutRunsAndIsBlockCausal) {
  ModelConfig c = named_geometry("llada2-mini");
  c.hidden = 128;
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.head_dim = 32;
  c.rotary_dim = 16;
  c.intermediate = 192;
  c.vocab = 500;
  c.n_layers = 3;
  c.moe.moe_layer = {0, 1, 1};
  c.moe.expert_inter = 32;
  c.moe.shared_inter = 32;
  c.mask_id = 499;
  for (DType act : {DType::F32, DType::BF16}) {
    auto e = Engine::synthetic(c, EngineOptions{.k_ffn = 2}, act);
    std::vector<int32_t> a(70), pos(70);
    for (int i = 0; i < 70; ++i) {
      a[static_cast<size_t>(i)] = static_cast<int32_t>(i * 37 % 499);
      pos[static_cast<size_t>(i)] = i;
    }
    std::vector<int32_t> b = a;
    b[40] = 7;
    std::vector<float> la(70 * 500), lb(la.size());
    e->logits(a, pos, la);
    e->logits(b, pos, lb);
    for (float v : la) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(std::vector<float>(la.begin(), la.begin() + 32 * 500),
              std::vector<float>(lb.begin(), lb.begin() + 32 * 500));
    EXPECT_GT(rel_error(la.data() + 40 * 500, lb.data() + 40 * 500, 500), 1e-3);
  }
}

}  // namespace
}  // namespace tessera
