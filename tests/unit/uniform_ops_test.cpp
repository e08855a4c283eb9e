// The CPU kernels of uniform-noise diffusion (DiffusionGemma's Gemma 4 blocks) against direct references
// and hand-computed values: rmsnorm without scale / accumulating, geglu, scale, softcap, proportional
// RoPE, sliding-window attention (causal and a canvas over a cache), heads wider than 256, gelu experts
// with per-expert scales, the entropy-bound sampler's statistics and the soft embeddings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::random_floats;
using test::rel_error;

Tensor t2(std::vector<float>& v, int64_t rows, int64_t cols) {
  return Tensor(v.data(), DType::F32, {rows, cols});
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(UniformOps, RmsNormWithoutScaleAndAccumulating) {
  auto b = make_cpu_backend();
  std::vector<float> x = {3.0f, 4.0f, 0.0f, 0.0f, 1.0f, 1.0f};  // groups of 2
  std::vector<float> y(6, 0.0f);
  Tensor tx = t2(x, 3, 2), ty = t2(y, 3, 2);
  b->rmsnorm_ex(tx, nullptr, 2, 0.0f, false, ty);
  const double r = std::sqrt(12.5);
  EXPECT_NEAR(y[0], 3.0 / r, 1e-6);
  EXPECT_NEAR(y[1], 4.0 / r, 1e-6);
  EXPECT_NEAR(y[4], 1.0, 1e-6);
  std::vector<float> w = {2.0f, -1.0f};
  Tensor tw(w.data(), DType::F32, {2});
  std::vector<float> acc = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  Tensor ta = t2(acc, 3, 2);
  b->rmsnorm_ex(tx, &tw, 2, 0.0f, true, ta);  // acc += rms(x) * w
  EXPECT_NEAR(acc[0], 1.0 + 2.0 * 3.0 / r, 1e-6);
  EXPECT_NEAR(acc[1], 1.0 - 4.0 / r, 1e-6);
  EXPECT_NEAR(acc[5], 0.0, 1e-6);
  test::expect_error([&] { b->rmsnorm_ex(tx, &tw, 2, 0.0f, true, tx); }, "accumulating needs");
}

TEST(UniformOps, GegluScaleSoftcap) {
  auto b = make_cpu_backend();
  std::vector<float> g = random_floats(37, 3, 2.0f), u = random_floats(37, 4, 1.0f), o(37);
  Tensor tg(g.data(), DType::F32, {37}), tu(u.data(), DType::F32, {37}), to(o.data(), DType::F32, {37});
  b->geglu(tg, tu, to);
  for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], gelu_tanh(g[i]) * u[i], 1e-5);
  b->scale(to, -2.0f);
  EXPECT_NEAR(o[3], -2.0 * gelu_tanh(g[3]) * u[3], 1e-5);
  std::vector<float> l = {0.0f, 30.0f, -90.0f, 1e6f};
  Tensor tl(l.data(), DType::F32, {4});
  b->softcap(tl, 30.0f);
  EXPECT_FLOAT_EQ(l[0], 0.0f);
  EXPECT_NEAR(l[1], 30.0 * std::tanh(1.0), 1e-5);
  EXPECT_NEAR(l[2], 30.0 * std::tanh(-3.0), 1e-5);
  EXPECT_NEAR(l[3], 30.0, 1e-5);
}

// Gemma 4's global layers: a 16-wide head whose first 2 pairs (i, i + 8) rotate at theta^(-2i / 16); the
// other dims stay.
TEST(UniformOps, ProportionalRopeHandComputed) {
  auto b = make_cpu_backend();
  const int d = 16;
  std::vector<float> x = random_floats(d * 2, 9, 1.0f), orig = x;
  std::vector<int32_t> pos = {3, 7};
  Tensor tx = t2(x, 2, d), tp(pos.data(), DType::I32, {2});
  RopeParams p;
  p.rotary_dim = 4;
  p.theta = 100.0f;
  p.pair_offset = 8;
  p.freq_dim = 16;
  b->rope(tx, tp, d, p);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 8; ++i) {
      const float* o = orig.data() + r * d;
      const float* y = x.data() + r * d;
      if (i < 2) {
        const double ang = pos[static_cast<size_t>(r)] * std::pow(100.0, -2.0 * i / 16.0);
        EXPECT_NEAR(y[i], o[i] * std::cos(ang) - o[i + 8] * std::sin(ang), 1e-5) << r << " " << i;
        EXPECT_NEAR(y[i + 8], o[i + 8] * std::cos(ang) + o[i] * std::sin(ang), 1e-5) << r << " " << i;
      } else {
        EXPECT_EQ(y[i], o[i]);
        EXPECT_EQ(y[i + 8], o[i + 8]);
      }
    }
  }
  test::expect_error(
      [&] {
        RopeParams bad = p;
        bad.pair_offset = 14;  // 3 pairs from 14: the last would be (2, 16), outside the head
        bad.rotary_dim = 6;
        b->rope(tx, tp, d, bad);
      },
      "pair_offset");
}

// Direct attention: scale s, per query row the visible keys by `visible(q_pos, k_pos)`.
std::vector<float> direct_attention(int hq, int hkv, int d, float s, const std::vector<int32_t>& q_pos,
                                    const std::vector<int32_t>& k_pos, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::function<bool(int32_t, int32_t)>& visible) {
  const size_t nq = q_pos.size(), nk = k_pos.size();
  std::vector<float> out(nq * static_cast<size_t>(hq * d), 0.0f);
  for (size_t i = 0; i < nq; ++i) {
    for (int h = 0; h < hq; ++h) {
      const int hk = h / (hq / hkv);
      std::vector<double> w(nk, 0.0);
      double mx = -1e300, sum = 0.0;
      for (size_t j = 0; j < nk; ++j) {
        if (!visible(q_pos[i], k_pos[j])) continue;
        double dot = 0.0;
        for (int t = 0; t < d; ++t)
          dot += static_cast<double>(q[(i * hq + h) * d + t]) * k[(j * hkv + hk) * d + t];
        w[j] = dot * s;
        mx = std::max(mx, w[j]);
      }
      for (size_t j = 0; j < nk; ++j) sum += (w[j] = visible(q_pos[i], k_pos[j]) ? std::exp(w[j] - mx) : 0.0);
      for (size_t j = 0; j < nk; ++j)
        for (int t = 0; t < d; ++t)
          out[(i * hq + h) * d + t] += static_cast<float>(w[j] / sum * v[(j * hkv + hk) * d + t]);
    }
  }
  return out;
}

void run_attention(int hq, int hkv, int d, MaskKind mask, int window, const std::vector<int32_t>& q_pos,
                   const std::vector<int32_t>& k_pos, const std::function<bool(int32_t, int32_t)>& visible) {
  auto b = make_cpu_backend(CpuBackendOptions{CpuAttention::F32});
  const auto nq = static_cast<int64_t>(q_pos.size()), nk = static_cast<int64_t>(k_pos.size());
  std::vector<float> q = random_floats(static_cast<size_t>(nq * hq * d), 1, 0.5f),
                     k = random_floats(static_cast<size_t>(nk * hkv * d), 2, 0.5f),
                     v = random_floats(static_cast<size_t>(nk * hkv * d), 3, 1.0f), o(q.size());
  std::vector<int32_t> cu_q = {0, static_cast<int32_t>(nq)}, cu_k = {0, static_cast<int32_t>(nk)};
  AttnParams p;
  p.mask = mask;
  p.window = window;
  p.scale = 1.0f;
  p.cu_q = cu_q.data();
  p.cu_k = cu_k.data();
  p.q_pos = q_pos.data();
  p.k_pos = k_pos.data();
  Tensor tq = t2(q, nq, hq * d), tk = t2(k, nk, hkv * d), tv = t2(v, nk, hkv * d), to = t2(o, nq, hq * d);
  b->attention(tq, tk, tv, to, hq, hkv, d, p);
  const auto want = direct_attention(hq, hkv, d, 1.0f, q_pos, k_pos, q, k, v, visible);
  EXPECT_LT(rel_error(o.data(), want.data(), o.size()), 1e-5) << "d " << d << " window " << window;
}

TEST(UniformOps, SlidingWindowAttention) {
  std::vector<int32_t> pos(300);
  for (int32_t i = 0; i < 300; ++i) pos[static_cast<size_t>(i)] = i;
  for (const int d : {16, 64, 512}) {  // 512: wider than the tile kernels
    // Causal within the window: q - 40 < k <= q (tiles of 128 keys cut by it on both sides).
    run_attention(4, 2, d, MaskKind::Causal, 40, pos, pos,
                  [](int32_t q, int32_t k) { return k <= q && q - k < 40; });
    // A canvas at positions 260..299 over the cache: every canvas key, the cache from 260 - 39 on.
    std::vector<int32_t> canvas(pos.begin() + 260, pos.end());
    run_attention(4, 1, d, MaskKind::None, 40, canvas, pos, [](int32_t, int32_t k) { return k >= 260 - 39; });
    // No window: the whole cache.
    run_attention(2, 2, d, MaskKind::None, 0, canvas, pos, [](int32_t, int32_t) { return true; });
  }
}

TEST(UniformOps, CanvasSampleStatistics) {
  auto b = make_cpu_backend();
  const int64_t R = 5, V = 257;
  std::vector<float> L = random_floats(static_cast<size_t>(R * V), 21, 3.0f);
  L[2 * V + 100] = L[2 * V + 7] = 50.0f;  // a tie: the lower index is the argmax
  std::vector<int32_t> keys = {10, 11, 12, 13, 14}, tok(R), am(R);
  std::vector<float> ent(R);
  SampleParams sp;
  sp.temperature = 0.7f;
  sp.seed = 1234;
  Tensor tl = t2(L, R, V), tk(keys.data(), DType::I32, {R}), tt(tok.data(), DType::I32, {R}),
         ta(am.data(), DType::I32, {R}), te(ent.data(), DType::F32, {R});
  b->canvas_sample(tl, tk, sp, tt, ta, te);
  for (int64_t r = 0; r < R; ++r) {
    const float* l = L.data() + r * V;
    int64_t best = 0, drawn = 0;
    double bg = -1e300, mx = -1e300, z = 0.0, h = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      if (l[v] > l[best]) best = v;
      const double g =
          l[v] -
          0.7 * std::log(-std::log(rng_uniform(1234, static_cast<uint64_t>(keys[static_cast<size_t>(r)]),
                                               static_cast<uint64_t>(v))));
      if (g > bg) bg = g, drawn = v;
      mx = std::max(mx, l[v] / 0.7);
    }
    for (int64_t v = 0; v < V; ++v) z += std::exp(l[v] / 0.7 - mx);
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(l[v] / 0.7 - mx) / z;
      if (p > 0) h -= p * std::log(p);
    }
    EXPECT_EQ(am[static_cast<size_t>(r)], best);
    EXPECT_EQ(tok[static_cast<size_t>(r)], drawn);
    EXPECT_NEAR(ent[static_cast<size_t>(r)], h, 1e-5 * std::max(1.0, h));
  }
  EXPECT_EQ(am[2], 7);
  EXPECT_NEAR(ent[2], std::log(2.0), 1e-5);  // two tokens share all the mass
  sp.temperature = 0.0f;
  test::expect_error([&] { b->canvas_sample(tl, tk, sp, tt, ta, te); }, "temperature must be positive");
}

TEST(UniformOps, SoftEmbedF32AndBf16) {
  auto b = make_cpu_backend();
  const int64_t R = 3, V = 50, H = 24;
  std::vector<float> L = random_floats(static_cast<size_t>(R * V), 5, 4.0f),
                     E = random_floats(static_cast<size_t>(V * H), 6, 1.0f);
  std::vector<double> want(static_cast<size_t>(R * H), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300, z = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, L[static_cast<size_t>(r * V + v)] / 0.6);
    for (int64_t v = 0; v < V; ++v) z += std::exp(L[static_cast<size_t>(r * V + v)] / 0.6 - mx);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t h = 0; h < H; ++h)
        want[static_cast<size_t>(r * H + h)] += std::exp(L[static_cast<size_t>(r * V + v)] / 0.6 - mx) / z *
                                                E[static_cast<size_t>(v * H + h)] * 3.0;
  }
  std::vector<float> wf(want.begin(), want.end());
  std::vector<float> probs(static_cast<size_t>(R * V)), out(static_cast<size_t>(R * H));
  Tensor tl = t2(L, R, V), te = t2(E, V, H), tp = t2(probs, R, V), to = t2(out, R, H);
  b->soft_embed(tl, te, 0.6f, 3.0f, tp, to);
  EXPECT_LT(rel_error(out.data(), wf.data(), out.size()), 1e-5);
  // bf16 table: probabilities rounded to bf16, the product accumulated in f32.
  std::vector<uint16_t> Eb(E.size()), pb(probs.size());
  for (size_t i = 0; i < E.size(); ++i) Eb[i] = f32_to_bf16(E[i]);
  Tensor teb(Eb.data(), DType::BF16, {V, H}), tpb(pb.data(), DType::BF16, {R, V});
  b->soft_embed(tl, teb, 0.6f, 3.0f, tpb, to);
  EXPECT_LT(rel_error(out.data(), wf.data(), out.size()), 1e-2);
  test::expect_error([&] { b->soft_embed(tl, te, 0.6f, 3.0f, tpb, to); }, "probs must hold");
}

// Gemma 4's experts: gelu_tanh(gate) * up, and the router's weights times the per-expert scales.
TEST(UniformOps, GeluExpertsWithPerExpertScales) {
  auto b = make_cpu_backend();
  const int E = 4, K = 2;
  const int64_t M = 3, H = 8, I = 6;
  std::vector<float> logits = random_floats(static_cast<size_t>(M * E), 31, 2.0f),
                     scale = {0.5f, 2.0f, 1.5f, -1.0f};
  std::vector<int32_t> ids(static_cast<size_t>(M * K));
  std::vector<float> w(static_cast<size_t>(M * K));
  MoeRouteParams rp;
  rp.top_k = K;
  rp.norm_topk = true;
  rp.expert_scale = scale.data();
  Tensor tl = t2(logits, M, E), ti(ids.data(), DType::I32, {M, K}), tw = t2(w, M, K);
  b->moe_route(tl, rp, ti, tw);
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> s(E);
    double mx = -1e300, z = 0.0;
    for (int e = 0; e < E; ++e)
      mx = std::max(mx, static_cast<double>(logits[static_cast<size_t>(m * E + e)]));
    for (int e = 0; e < E; ++e)
      z += (s[static_cast<size_t>(e)] = std::exp(logits[static_cast<size_t>(m * E + e)] - mx));
    const int a = ids[static_cast<size_t>(m * K)], c = ids[static_cast<size_t>(m * K + 1)];
    const double sum = s[static_cast<size_t>(a)] + s[static_cast<size_t>(c)];
    EXPECT_NEAR(w[static_cast<size_t>(m * K)],
                s[static_cast<size_t>(a)] / sum * scale[static_cast<size_t>(a)], 1e-5);
    EXPECT_NEAR(w[static_cast<size_t>(m * K + 1)],
                s[static_cast<size_t>(c)] / sum * scale[static_cast<size_t>(c)], 1e-5);
  }
  std::vector<std::vector<float>> mats;
  std::vector<const void*> table;
  for (int p = 0; p < 3; ++p)
    for (int e = 0; e < E; ++e)
      mats.push_back(random_floats(static_cast<size_t>(H * I), 40 + static_cast<uint64_t>(p * E + e), 0.5f));
  for (auto& m : mats) table.push_back(m.data());
  MoeExperts ex{table.data(), E, H, I, DType::F32};
  ex.gelu = true;
  ex.overwrite = true;
  std::vector<float> x = random_floats(static_cast<size_t>(M * H), 50, 1.0f),
                     out(static_cast<size_t>(M * H), 123.0f);
  std::vector<int32_t> scratch(moe_scratch_bytes(M, K, ex) / 4 + 16);
  Tensor tx = t2(x, M, H), to = t2(out, M, H),
         ts(scratch.data(), DType::I32, {static_cast<int64_t>(scratch.size())});
  b->moe_ffn(tx, ti, tw, ex, ts, to);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t h = 0; h < H; ++h) {
      double want = 0.0;
      for (int j = 0; j < K; ++j) {
        const int e = ids[static_cast<size_t>(m * K + j)];
        double y = 0.0;
        for (int64_t i = 0; i < I; ++i) {
          double g = 0.0, u = 0.0;
          for (int64_t c = 0; c < H; ++c) {
            g += static_cast<double>(x[static_cast<size_t>(m * H + c)]) *
                 mats[static_cast<size_t>(e)][static_cast<size_t>(i * H + c)];
            u += static_cast<double>(x[static_cast<size_t>(m * H + c)]) *
                 mats[static_cast<size_t>(E + e)][static_cast<size_t>(i * H + c)];
          }
          y += gelu_tanh(g) * u * mats[static_cast<size_t>(2 * E + e)][static_cast<size_t>(h * I + i)];
        }
        want += w[static_cast<size_t>(m * K + j)] * y;
      }
      EXPECT_NEAR(out[static_cast<size_t>(m * H + h)], want, 1e-4 * std::max(1.0, std::fabs(want)));
    }
  }
}

}  // namespace
}  // namespace tessera
