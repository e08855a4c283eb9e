// CPU kernels against naive references and hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::random_floats;
using test::rel_error;

struct AttnCase {
  int hq, hkv, d;
  std::vector<int32_t> cu_q, cu_k, q_pos, k_pos;
  MaskKind mask = MaskKind::None;
  int block = 0;
  int sparse_block = 0;        // > 0: a random block-sparse pattern (one sequence)
  std::vector<uint8_t> tiles;  // [hq, n_qb, n_kb], filled by check_attention
};

std::vector<float> naive_attention(const AttnCase& c, const std::vector<float>& q,
                                   const std::vector<float>& k, const std::vector<float>& v) {
  const int64_t nq = c.cu_q.back();
  std::vector<float> out(static_cast<size_t>(nq * c.hq * c.d), 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  for (size_t s = 0; s + 1 < c.cu_q.size(); ++s) {
    for (int i = c.cu_q[s]; i < c.cu_q[s + 1]; ++i) {
      for (int h = 0; h < c.hq; ++h) {
        const int hk = h / (c.hq / c.hkv);
        std::vector<double> sc;
        std::vector<int> idx;
        for (int j = c.cu_k[s]; j < c.cu_k[s + 1]; ++j) {
          const int32_t qp = c.q_pos[static_cast<size_t>(i)], kp = c.k_pos[static_cast<size_t>(j)];
          if (c.mask == MaskKind::Causal && kp > qp) continue;
          if (c.mask == MaskKind::BlockCausal && kp / c.block > qp / c.block) continue;
          if (c.sparse_block > 0) {
            const int64_t nqb = (nq + c.sparse_block - 1) / c.sparse_block,
                          nkb = (c.cu_k.back() + c.sparse_block - 1) / c.sparse_block;
            if (!c.tiles[static_cast<size_t>((h * nqb + i / c.sparse_block) * nkb + j / c.sparse_block)])
              continue;
          }
          double dot = 0;
          for (int t = 0; t < c.d; ++t) {
            dot += static_cast<double>(q[static_cast<size_t>((i * c.hq + h) * c.d + t)]) *
                   k[static_cast<size_t>((j * c.hkv + hk) * c.d + t)];
          }
          sc.push_back(dot * scale);
          idx.push_back(j);
        }
        double mx = -1e300, sum = 0;
        for (double x : sc) mx = std::max(mx, x);
        for (double& x : sc) sum += (x = std::exp(x - mx));
        if (sc.empty()) continue;  // every key dropped: output 0
        for (size_t jj = 0; jj < sc.size(); ++jj) {
          for (int t = 0; t < c.d; ++t) {
            out[static_cast<size_t>((i * c.hq + h) * c.d + t)] +=
                static_cast<float>(sc[jj] / sum * v[static_cast<size_t>((idx[jj] * c.hkv + hk) * c.d + t)]);
          }
        }
      }
    }
  }
  return out;
}

void check_attention(AttnCase c, uint64_t seed, DType out_dtype = DType::F32) {
  auto be = make_cpu_backend();
  const int64_t nq = c.cu_q.back(), nk = c.cu_k.back();
  auto q = random_floats(static_cast<size_t>(nq * c.hq * c.d), seed);
  auto k = random_floats(static_cast<size_t>(nk * c.hkv * c.d), seed + 1);
  auto v = random_floats(static_cast<size_t>(nk * c.hkv * c.d), seed + 2);
  std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> out16(q.size(), 0x7fc0);  // bf16 NaN
  Tensor tq(q.data(), DType::F32, {nq, c.hq * c.d}), tk(k.data(), DType::F32, {nk, c.hkv * c.d}),
      tv(v.data(), DType::F32, {nk, c.hkv * c.d}), to(out.data(), DType::F32, {nq, c.hq * c.d});
  if (out_dtype == DType::BF16) to = Tensor(out16.data(), DType::BF16, {nq, c.hq * c.d});
  AttnParams p;
  p.mask = c.mask;
  p.block_size = c.block;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.n_seqs = static_cast<int>(c.cu_q.size()) - 1;
  p.cu_q = c.cu_q.data();
  p.cu_k = c.cu_k.data();
  p.q_pos = c.q_pos.data();
  p.k_pos = c.k_pos.data();
  if (c.sparse_block > 0) {
    const int64_t nqb = (nq + c.sparse_block - 1) / c.sparse_block,
                  nkb = (nk + c.sparse_block - 1) / c.sparse_block;
    c.tiles.resize(static_cast<size_t>(c.hq * nqb * nkb));
    for (size_t i = 0; i < c.tiles.size(); ++i) c.tiles[i] = rng_mix(seed * 1000 + i) % 3 == 0 ? 1 : 0;
    c.tiles[0] = 0;
    for (int64_t kb = 0; kb < nkb; ++kb) c.tiles[static_cast<size_t>(kb)] = 0;  // a row that keeps nothing
    p.block_mask = c.tiles.data();
    p.sparse_block = c.sparse_block;
  }
  be->attention(tq, tk, tv, to, c.hq, c.hkv, c.d, p);
  const auto ref = naive_attention(c, q, k, v);
  if (out_dtype == DType::BF16) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(out16[i]);
    EXPECT_LT(rel_error(out.data(), ref.data(), out.size()), 1e-2);
    return;
  }
  EXPECT_LT(rel_error(out.data(), ref.data(), out.size()), 1e-5);
}

std::vector<int32_t> iota(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

TEST(CpuAttention, BidirectionalGqaOddLength) {
  AttnCase c{8, 2, 16, {0, 301}, {0, 301}, iota(301), iota(301)};
  check_attention(c, 1);
}

TEST(CpuAttention, CausalAndBlockCausal) {
  AttnCase c{4, 4, 32, {0, 200}, {0, 200}, iota(200), iota(200), MaskKind::Causal};
  check_attention(c, 2);
  c.mask = MaskKind::BlockCausal;
  c.block = 32;
  check_attention(c, 3);
}

TEST(CpuAttention, PackedSequencesStayApart) {
  // Two sequences of 70 and 45 tokens, each with positions from 0.
  std::vector<int32_t> pos = iota(70);
  const auto p2 = iota(45);
  pos.insert(pos.end(), p2.begin(), p2.end());
  AttnCase c{4, 2, 8, {0, 70, 115}, {0, 70, 115}, pos, pos};
  check_attention(c, 4);
  c.mask = MaskKind::Causal;
  check_attention(c, 5);
}

// Masked keys weigh exactly 0: V rows of 1e36 behind the causal mask leave the rows that cannot see
// them as the reference computes them (a weight of exp(-87) ~ 1e-38 per masked key, as the kernel's
// exp once gave -inf, would add about 0.02 per key here).
TEST(CpuAttention, MaskedKeysWeighExactlyNothing) {
  auto be = make_cpu_backend();
  AttnCase c{2, 1, 16, {0, 150}, {0, 150}, iota(150), iota(150), MaskKind::Causal};
  const int64_t n = 150, cut = 100;
  auto q = random_floats(static_cast<size_t>(n * c.hq * c.d), 7);
  auto k = random_floats(static_cast<size_t>(n * c.hkv * c.d), 8);
  auto v = random_floats(static_cast<size_t>(n * c.hkv * c.d), 9);
  std::fill(v.begin() + cut * c.hkv * c.d, v.end(), 1e36f);
  std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
  Tensor tq(q.data(), DType::F32, {n, c.hq * c.d}), tk(k.data(), DType::F32, {n, c.hkv * c.d}),
      tv(v.data(), DType::F32, {n, c.hkv * c.d}), to(out.data(), DType::F32, {n, c.hq * c.d});
  AttnParams p;
  p.mask = c.mask;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.n_seqs = 1;
  p.cu_q = c.cu_q.data();
  p.cu_k = c.cu_k.data();
  p.q_pos = c.q_pos.data();
  p.k_pos = c.k_pos.data();
  be->attention(tq, tk, tv, to, c.hq, c.hkv, c.d, p);
  const auto ref = naive_attention(c, q, k, v);
  const size_t rows = static_cast<size_t>(cut * c.hq * c.d);  // the rows that see no 1e36
  EXPECT_LT(rel_error(out.data(), ref.data(), rows), 1e-5);
}

// Block-sparse patterns: tiles smaller than, equal to and larger than the kernel's 128-row / 128-key
// tiles, partial last blocks, a query block that keeps no key (output 0), with causal masks too.
TEST(CpuAttention, BlockSparseSkipsExactlyTheDroppedTiles) {
  for (const int bs : {8, 32, 48, 128, 160}) {
    SCOPED_TRACE("sparse block " + std::to_string(bs));
    AttnCase c{4, 2, 16, {0, 301}, {0, 301}, iota(301), iota(301)};
    c.sparse_block = bs;
    check_attention(c, 40 + static_cast<uint64_t>(bs));
    c.mask = MaskKind::Causal;
    check_attention(c, 50 + static_cast<uint64_t>(bs));
  }
}

// Head dimensions that are and are not whole vectors (8, 40, 64, 128), lengths that cut the kernel's
// 128-row query tiles, 128-key tiles and 4-row micro-kernels, GQA, every mask, f32 and bf16 output.
TEST(CpuAttention, HeadDimensionsAndTileEdges) {
  for (const int d : {8, 40, 64, 128}) {
    for (const int n : {1, 5, 130, 301}) {
      SCOPED_TRACE("d " + std::to_string(d) + " length " + std::to_string(n));
      AttnCase c{4, 2, d, {0, n}, {0, n}, iota(n), iota(n)};
      const auto seed = static_cast<uint64_t>(100 + d * 1000 + n);
      check_attention(c, seed);
      c.mask = MaskKind::BlockCausal;
      c.block = 48;
      check_attention(c, seed + 1);
      c.mask = MaskKind::Causal;
      check_attention(c, seed + 2, DType::BF16);
    }
  }
}

// A key that no query of a tile can see is never read: NaN in its V (memory a step never wrote)
// reaches no output. 40 queries at positions 0..39 see, causally, only the first 40 of 300 keys.
TEST(CpuAttention, KeysNoQuerySeesAreNeverRead) {
  auto be = make_cpu_backend();
  AttnCase c{2, 2, 64, {0, 40}, {0, 300}, iota(40), iota(300), MaskKind::Causal};
  auto q = random_floats(static_cast<size_t>(40 * c.hq * c.d), 21);
  auto k = random_floats(static_cast<size_t>(300 * c.hkv * c.d), 22);
  auto v = random_floats(static_cast<size_t>(300 * c.hkv * c.d), 23);
  const auto ref = naive_attention(c, q, k, v);
  std::fill(k.begin() + 40 * c.hkv * c.d, k.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(v.begin() + 40 * c.hkv * c.d, v.end(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
  Tensor tq(q.data(), DType::F32, {40, c.hq * c.d}), tk(k.data(), DType::F32, {300, c.hkv * c.d}),
      tv(v.data(), DType::F32, {300, c.hkv * c.d}), to(out.data(), DType::F32, {40, c.hq * c.d});
  AttnParams p;
  p.mask = c.mask;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.cu_q = c.cu_q.data();
  p.cu_k = c.cu_k.data();
  p.q_pos = c.q_pos.data();
  p.k_pos = c.k_pos.data();
  be->attention(tq, tk, tv, to, c.hq, c.hkv, c.d, p);
  EXPECT_LT(rel_error(out.data(), ref.data(), out.size()), 1e-5);
}

TEST(CpuAttention, QuerySubsetOfKeys) {
  // 20 queries at positions 100..119 against 150 keys at positions 0..149 (a cache-like step).
  AttnCase c{4, 4, 16, {0, 20}, {0, 150}, iota(20, 100), iota(150), MaskKind::Causal};
  check_attention(c, 6);
  c.mask = MaskKind::None;
  check_attention(c, 7);
}

TEST(CpuGemm, Bf16AndF32AgainstNaive) {
  auto be = make_cpu_backend();
  const int64_t m = 37, n = 53, k = 96;
  auto a = random_floats(static_cast<size_t>(m * k), 11);
  auto w = random_floats(static_cast<size_t>(n * k), 12);
  auto bias = random_floats(static_cast<size_t>(n), 13);
  std::vector<float> ref(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias[static_cast<size_t>(j)];
      for (int64_t t = 0; t < k; ++t)
        s += static_cast<double>(a[static_cast<size_t>(i * k + t)]) * w[static_cast<size_t>(j * k + t)];
      ref[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  std::vector<float> c(ref.size(), NAN);
  Tensor ta(a.data(), DType::F32, {m, k}), tw(w.data(), DType::F32, {n, k}), tb(bias.data(), DType::F32, {n}),
      tc(c.data(), DType::F32, {m, n});
  be->gemm(ta, tw, &tb, tc, false);
  EXPECT_LT(rel_error(c.data(), ref.data(), c.size()), 1e-5);
  // accumulate: c += a w^T + bias
  be->gemm(ta, tw, &tb, tc, true);
  std::vector<float> ref2(ref);
  for (auto& x : ref2) x *= 2;
  EXPECT_LT(rel_error(c.data(), ref2.data(), c.size()), 1e-5);
  // bf16 operands
  std::vector<uint16_t> ab(a.size()), wb(w.size());
  convert_from_f32(a.data(), ab.data(), DType::BF16, a.size());
  convert_from_f32(w.data(), wb.data(), DType::BF16, w.size());
  Tensor tab(ab.data(), DType::BF16, {m, k}), twb(wb.data(), DType::BF16, {n, k});
  std::fill(c.begin(), c.end(), NAN);
  be->gemm(tab, twb, &tb, tc, false);
  EXPECT_LT(rel_error(c.data(), ref.data(), c.size()), 1e-2);
}

TEST(CpuGemm, GatherGemmEqualsRowsOfFullGemm) {
  auto be = make_cpu_backend();
  const int64_t rows = 600, k = 64, n = 77;
  auto a = random_floats(static_cast<size_t>(rows * k), 21);
  auto w = random_floats(static_cast<size_t>(n * k), 22);
  std::vector<float> full(static_cast<size_t>(rows * n));
  Tensor ta(a.data(), DType::F32, {rows, k}), tw(w.data(), DType::F32, {n, k}),
      tf(full.data(), DType::F32, {rows, n});
  be->gemm(ta, tw, nullptr, tf, false);
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < rows; i += 1 + (i % 3)) idx.push_back(i);  // > one 256-row tile
  idx.push_back(5);                                                  // repeated and unsorted rows are fine
  std::vector<float> out(idx.size() * static_cast<size_t>(n), NAN);
  Tensor ti(idx.data(), DType::I32, {static_cast<int64_t>(idx.size())});
  Tensor to(out.data(), DType::F32, {static_cast<int64_t>(idx.size()), n});
  be->gather_gemm(ta, ti, tw, to);
  for (size_t r = 0; r < idx.size(); ++r)
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(out[r * static_cast<size_t>(n) + static_cast<size_t>(j)],
                full[static_cast<size_t>(idx[r]) * static_cast<size_t>(n) + static_cast<size_t>(j)]);
}

// The primitive cache keeps the most recently used kMaxPrimitives shapes: a server's requests of every
// canvas length do not grow it without end, a cached shape is never made again, and a shape it let go
// is made again with the same results.
TEST(CpuGemm, PrimitiveCacheIsBoundedAndReused) {
  cpu::GemmEngine g;
  const int64_t n = 8, k = 16, shapes = static_cast<int64_t>(cpu::GemmEngine::kMaxPrimitives) + 40;
  auto a = random_floats(static_cast<size_t>(shapes * k), 31);
  auto w = random_floats(static_cast<size_t>(n * k), 32);
  std::vector<float> c(static_cast<size_t>(shapes * n), NAN), first;
  Tensor tw(w.data(), DType::F32, {n, k});
  auto run = [&](int64_t m) {
    Tensor ta(a.data(), DType::F32, {m, k}), tc(c.data(), DType::F32, {m, n});
    g.gemm(ta, tw, nullptr, tc, false);
  };
  run(1);
  first.assign(c.begin(), c.begin() + n);
  EXPECT_EQ(g.primitives_created(), 1);
  run(1);
  EXPECT_EQ(g.primitives_created(), 1);  // cached
  for (int64_t m = 2; m <= shapes; ++m) run(m);
  EXPECT_EQ(g.primitives_created(), shapes);
  EXPECT_EQ(g.primitives_held(), cpu::GemmEngine::kMaxPrimitives);
  run(shapes);  // the most recent: still held
  EXPECT_EQ(g.primitives_created(), shapes);
  std::fill(c.begin(), c.end(), NAN);
  run(1);  // the oldest was let go: made again, same values
  EXPECT_EQ(g.primitives_created(), shapes + 1);
  EXPECT_EQ(g.primitives_held(), cpu::GemmEngine::kMaxPrimitives);
  for (int64_t j = 0; j < n; ++j) EXPECT_EQ(c[static_cast<size_t>(j)], first[static_cast<size_t>(j)]);
}

TEST(CpuOps, RmsNormHandComputed) {
  auto be = make_cpu_backend();
  std::vector<float> x = {3.0f, 4.0f, 0.0f, 0.0f};  // mean square = 6.25, rms = 2.5
  std::vector<float> w = {1.0f, 2.0f, 1.0f, 1.0f};
  std::vector<float> y(4, NAN);
  Tensor tx(x.data(), DType::F32, {1, 4}), tw(w.data(), DType::F32, {4}), ty(y.data(), DType::F32, {1, 4});
  be->rmsnorm(tx, tw, 0.0f, ty);
  EXPECT_FLOAT_EQ(y[0], 1.2f);
  EXPECT_FLOAT_EQ(y[1], 3.2f);
  EXPECT_FLOAT_EQ(y[2], 0.0f);
  // Grouped (qk-norm style): two groups of 2.
  std::vector<float> w2 = {1.0f, 1.0f};
  Tensor tw2(w2.data(), DType::F32, {2});
  x = {3.0f, 4.0f, 1.0f, 1.0f};
  be->rmsnorm(tx, tw2, 0.0f, ty);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[2], 1.0, 1e-6);
}

TEST(CpuOps, RopeNeoxAndInterleavedHandComputed) {
  auto be = make_cpu_backend();
  // head_dim 4, theta 100: inv_freq = {1, 0.1}; position 2: angles 2 and 0.2.
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int32_t> pos = {2};
  Tensor tx(x.data(), DType::F32, {1, 4}), tp(pos.data(), DType::I32, {1});
  be->rope(tx, tp, 4, RopeParams{.rotary_dim = 4, .theta = 100.0f});
  // neox pairs (0,2) angle 2 and (1,3) angle 0.2
  EXPECT_NEAR(x[0], 1 * std::cos(2.0) - 3 * std::sin(2.0), 1e-5);
  EXPECT_NEAR(x[2], 3 * std::cos(2.0) + 1 * std::sin(2.0), 1e-5);
  EXPECT_NEAR(x[1], 2 * std::cos(0.2) - 4 * std::sin(0.2), 1e-5);
  EXPECT_NEAR(x[3], 4 * std::cos(0.2) + 2 * std::sin(0.2), 1e-5);
  x = {1, 2, 3, 4};
  be->rope(tx, tp, 4, RopeParams{.rotary_dim = 4, .theta = 100.0f, .neox = false});
  // interleaved pairs (0,1) angle 2 and (2,3) angle 0.2
  EXPECT_NEAR(x[0], 1 * std::cos(2.0) - 2 * std::sin(2.0), 1e-5);
  EXPECT_NEAR(x[1], 2 * std::cos(2.0) + 1 * std::sin(2.0), 1e-5);
  EXPECT_NEAR(x[2], 3 * std::cos(0.2) - 4 * std::sin(0.2), 1e-5);
}

// YaRN and the Llama-4 query scale by hand: head_dim 4, theta 100 (inv_freq {1, 0.1}), factor 10 with
// the ramp over pairs [0, 1]: pair 0 keeps its frequency, pair 1 takes 0.1 / 10; cos and sin times 2;
// position 2 with pos_orig 1: every dim times 1 + 0.5 ln(1 + 2).
TEST(CpuOps, RopeYarnAndPositionScaleHandComputed) {
  auto be = make_cpu_backend();
  const RopeParams p{.rotary_dim = 4,
                     .theta = 100.0f,
                     .yarn_factor = 10.0f,
                     .ramp_lo = 0.0f,
                     .ramp_hi = 1.0f,
                     .attn_factor = 2.0f,
                     .pos_beta = 0.5f,
                     .pos_orig = 1};
  EXPECT_FLOAT_EQ(rope_inv_freq(p, 0), 1.0f);
  EXPECT_FLOAT_EQ(rope_inv_freq(p, 1), 0.01f);
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int32_t> pos = {2};
  Tensor tx(x.data(), DType::F32, {1, 4}), tp(pos.data(), DType::I32, {1});
  be->rope(tx, tp, 4, p);
  const double s = 2.0 * (1.0 + 0.5 * std::log(3.0));
  EXPECT_NEAR(x[0], s * (1 * std::cos(2.0) - 3 * std::sin(2.0)), 1e-5);
  EXPECT_NEAR(x[2], s * (3 * std::cos(2.0) + 1 * std::sin(2.0)), 1e-5);
  EXPECT_NEAR(x[1], s * (2 * std::cos(0.02) - 4 * std::sin(0.02)), 1e-5);
  EXPECT_NEAR(x[3], s * (4 * std::cos(0.02) + 2 * std::sin(0.02)), 1e-5);
  // Below pos_orig the scale is 1: only the YaRN factor remains.
  x = {1, 2, 3, 4};
  RopeParams q = p;
  q.pos_orig = 3;
  be->rope(tx, tp, 4, q);
  EXPECT_NEAR(x[0], 2 * (1 * std::cos(2.0) - 3 * std::sin(2.0)), 1e-5);
}

// The backend keeps rope's cosines and sines between calls (q and k of every layer share positions): the
// same bits as computing them each call, and a table recomputed whenever a position, the frequencies or
// the scale change.
TEST(CpuOps, RopeTableKeepsTheBitsAndFollowsEveryChange) {
  auto be = make_cpu_backend();
  const int64_t hd = 64, heads = 3;
  uint64_t seed = 1;
  auto check = [&](std::vector<int32_t> pos, const RopeParams& p, const char* what) {
    const auto n = static_cast<int64_t>(pos.size());
    auto x = test::random_floats(static_cast<size_t>(n * heads * hd), ++seed);
    std::vector<float> want = x;
    Tensor tx(x.data(), DType::F32, {n, heads * hd}), tw(want.data(), DType::F32, {n, heads * hd}),
        tp(pos.data(), DType::I32, {n});
    be->rope(tx, tp, static_cast<int>(hd), p);
    cpu::rope(tw, tp, static_cast<int>(hd), p);  // no table: every angle computed here
    EXPECT_EQ(x, want) << what;
  };
  std::vector<int32_t> pos(40);
  std::iota(pos.begin(), pos.end(), 5);
  const RopeParams p{.rotary_dim = 64, .theta = 10000.0f};
  check(pos, p, "first call");
  check(pos, p, "the same positions (the table)");
  std::vector<int32_t> moved = pos;
  moved[17] = 900;
  check(moved, p, "one position changed");
  RopeParams q = p;
  q.theta = 500000.0f;
  check(moved, q, "another theta");
  q.attn_factor = 1.5f;
  check(moved, q, "another attn_factor");
  q.rotary_dim = 32;  // partial rotary: fewer frequencies
  check(moved, q, "another rotary_dim");
  check(std::vector<int32_t>(moved.begin(), moved.begin() + 9), q, "fewer rows");
}

TEST(CpuOps, SwigluAndEmbed) {
  auto be = make_cpu_backend();
  std::vector<float> g = {0.0f, 1.0f, -2.0f}, u = {5.0f, 2.0f, 3.0f}, o(3, NAN);
  Tensor tg(g.data(), DType::F32, {1, 3}), tu(u.data(), DType::F32, {1, 3}), to(o.data(), DType::F32, {1, 3});
  be->swiglu(tg, tu, to);
  EXPECT_FLOAT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2.0 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(o[2], 3.0 * -2.0 / (1 + std::exp(2.0)), 1e-6);
  std::vector<float> table = {0, 1, 10, 11, 20, 21};
  std::vector<int32_t> ids = {2, 0};
  std::vector<float> e(4, NAN);
  Tensor tt(table.data(), DType::F32, {3, 2}), ti(ids.data(), DType::I32, {2}),
      te(e.data(), DType::F32, {2, 2});
  be->embed(ti, tt, te);
  EXPECT_EQ(e, (std::vector<float>{20, 21, 0, 1}));
  ids[0] = 3;
  EXPECT_THROW(be->embed(ti, tt, te), std::exception);
}

// KV cache writes: named rows replaced, the others untouched; an index outside the destination fails.
// The vector exp against std::exp: within 2 ulp over the whole float range it covers, then the edges:
// overflow to +inf, underflow to 0, NaN kept.
TEST(CpuSimd, ExpWithinTwoUlpOfStdExp) {
  using namespace cpu::simd;
  auto ulp_distance = [](float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    return std::abs(static_cast<int64_t>(ia) - ib);
  };
  int64_t worst = 0;
  const int n = 200000;
  for (int i = 0; i < n; i += kW) {
    vf x;
    for (int l = 0; l < kW; ++l) x[l] = -87.3f + 176.0f * static_cast<float>(i + l) / n;
    const vf e = cpu::simd::exp(x);
    for (int l = 0; l < kW; ++l) worst = std::max(worst, ulp_distance(e[l], std::exp(x[l])));
  }
  EXPECT_LE(worst, 2);
  vf x = splat(0.0f);
  x[0] = 89.0f;
  x[1] = -88.0f;
  x[2] = std::numeric_limits<float>::quiet_NaN();
  x[3] = -std::numeric_limits<float>::infinity();
  const vf e = cpu::simd::exp(x);
  EXPECT_EQ(e[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], 0.0f);
  EXPECT_EQ(e[kW - 1], 1.0f);
}

// SwiGLU and RMSNorm over rows long enough for the vector paths (and a tail), f32 and bf16, against
// scalar references: f32 within a few ulp; bf16 off by at most one bf16 step where e^x's last bits move
// a rounding, and only rarely.
TEST(CpuOps, SwigluAndRmsNormVectorPaths) {
  auto be = make_cpu_backend();
  const int64_t n = 1003;
  auto g = random_floats(static_cast<size_t>(n), 31, 12.0f);
  auto u = random_floats(static_cast<size_t>(n), 32);
  g[5] = 0.0f;
  g[6] = -95.0f;
  g[7] = 95.0f;
  g[8] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> o(static_cast<size_t>(n), NAN);
  Tensor to(o.data(), DType::F32, {1, n});
  be->swiglu(Tensor(g.data(), DType::F32, {1, n}), Tensor(u.data(), DType::F32, {1, n}), to);
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[static_cast<size_t>(i)];
    const double ref = gi / (1.0 + std::exp(-gi)) * u[static_cast<size_t>(i)];
    if (std::isnan(gi)) {
      EXPECT_TRUE(std::isnan(o[static_cast<size_t>(i)]));
      continue;
    }
    EXPECT_NEAR(o[static_cast<size_t>(i)], ref, 1e-6 * std::fabs(ref) + 1e-30) << "element " << i;
  }
  std::vector<uint16_t> gb(static_cast<size_t>(n)), ub(static_cast<size_t>(n)), ob(static_cast<size_t>(n));
  for (size_t i = 0; i < gb.size(); ++i) {
    gb[i] = f32_to_bf16(g[i]);
    ub[i] = f32_to_bf16(u[i]);
  }
  Tensor tob(ob.data(), DType::BF16, {1, n});
  be->swiglu(Tensor(gb.data(), DType::BF16, {1, n}), Tensor(ub.data(), DType::BF16, {1, n}), tob);
  int moved = 0;
  for (size_t i = 0; i < gb.size(); ++i) {
    const float gv = bf16_to_f32(gb[i]);
    const uint16_t ref = f32_to_bf16(round_bf16(gv / (1.0f + std::exp(-gv))) * bf16_to_f32(ub[i]));
    if (std::isnan(gv)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(ob[i])));
      continue;
    }
    EXPECT_LE(std::abs(static_cast<int>(ob[i]) - ref), 1) << "element " << i;
    moved += ob[i] != ref ? 1 : 0;
  }
  EXPECT_LE(moved, 10);
  // RMSNorm: 3 rows of 1003 (whole vectors and a tail), bf16 weights, f32 and bf16 outputs.
  auto x = random_floats(static_cast<size_t>(3 * n), 33);
  auto wv = random_floats(static_cast<size_t>(n), 34);
  std::vector<uint16_t> w16(wv.size());
  for (size_t i = 0; i < wv.size(); ++i) w16[i] = f32_to_bf16(wv[i]);
  std::vector<float> y(x.size(), NAN);
  std::vector<uint16_t> y16(x.size(), 0x7fc0);
  Tensor tx(x.data(), DType::F32, {3, n}), tw(w16.data(), DType::BF16, {n}), ty(y.data(), DType::F32, {3, n}),
      ty16(y16.data(), DType::BF16, {3, n});
  be->rmsnorm(tx, tw, 1e-5f, ty);
  be->rmsnorm(tx, tw, 1e-5f, ty16);
  for (int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i)
      ss += static_cast<double>(x[static_cast<size_t>(r * n + i)]) * x[static_cast<size_t>(r * n + i)];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(r * n + i);
      const double ref = x[k] * inv * bf16_to_f32(w16[static_cast<size_t>(i)]);
      EXPECT_NEAR(y[k], ref, 1e-5 * std::fabs(ref) + 1e-6) << "row " << r << " column " << i;
      EXPECT_NEAR(bf16_to_f32(y16[k]), ref, 1e-2 * std::fabs(ref) + 1e-6) << "row " << r << " column " << i;
    }
  }
}

TEST(CpuOps, ScatterRowsHandComputed) {
  auto be = make_cpu_backend();
  std::vector<float> dst = {0, 0, 1, 1, 2, 2, 3, 3}, src = {10, 11, 20, 21};
  std::vector<int32_t> rows = {2, 0};
  Tensor td(dst.data(), DType::F32, {4, 2});
  be->scatter_rows(Tensor(src.data(), DType::F32, {2, 2}), Tensor(rows.data(), DType::I32, {2}), td);
  EXPECT_EQ(dst, (std::vector<float>{20, 21, 1, 1, 10, 11, 3, 3}));
  // f32 rows into a bf16 destination are rounded to nearest even; convert reads them back exactly.
  std::vector<uint16_t> half(8, 0);
  std::vector<float> vals = {1.0f, 1.00390625f, 3.0f, -2.5f};  // 1 + 2^-8 is a tie: rounds to 1
  rows = {3, 1};
  Tensor th(half.data(), DType::BF16, {4, 2});
  be->scatter_rows(Tensor(vals.data(), DType::F32, {2, 2}), Tensor(rows.data(), DType::I32, {2}), th);
  std::vector<float> back(8, -1.0f);
  Tensor tb(back.data(), DType::F32, {4, 2});
  be->convert(th, tb);
  EXPECT_EQ(back, (std::vector<float>{0, 0, 3.0f, -2.5f, 0, 0, 1.0f, 1.0f}));
  rows[1] = 4;
  EXPECT_THROW(
      be->scatter_rows(Tensor(src.data(), DType::F32, {2, 2}), Tensor(rows.data(), DType::I32, {2}), td),
      Error);
}

// KV cache reads: destination row i is source row rows[i] (bf16 widened to f32 exactly); an index
// outside the source fails.
TEST(CpuOps, GatherRowsHandComputed) {
  auto be = make_cpu_backend();
  std::vector<float> src = {0, 1, 10, 11, 20, 21, 30, 31}, dst(6, -1.0f);
  std::vector<int32_t> rows = {3, 0, 3};
  Tensor td(dst.data(), DType::F32, {3, 2});
  be->gather_rows(Tensor(src.data(), DType::F32, {4, 2}), Tensor(rows.data(), DType::I32, {3}), td);
  EXPECT_EQ(dst, (std::vector<float>{30, 31, 0, 1, 30, 31}));
  const std::vector<uint16_t> half = {0x3f80, 0xc020, 0x4040, 0x0000};  // 1, -2.5, 3, 0
  rows = {1, 0, 1};
  Tensor th(const_cast<uint16_t*>(half.data()), DType::BF16, {2, 2});
  be->gather_rows(th, Tensor(rows.data(), DType::I32, {3}), td);
  EXPECT_EQ(dst, (std::vector<float>{3.0f, 0.0f, 1.0f, -2.5f, 3.0f, 0.0f}));
  rows[2] = 2;
  EXPECT_THROW(be->gather_rows(th, Tensor(rows.data(), DType::I32, {3}), td), Error);
  rows[2] = -1;
  EXPECT_THROW(be->gather_rows(th, Tensor(rows.data(), DType::I32, {3}), td), Error);
}

// SparseD selection against the double reference: GQA, a prompt boundary inside a block, partial
// last blocks, blocks that do not divide the kernel's 128-row tiles (48) or exceed them (160), several
// rho values; and the kept count per set is exactly sparse_keep.
TEST(CpuSparseSelect, MatchesReferenceAndKeepsTheRightCount) {
  auto be = make_cpu_backend();
  using Case = test::SparseSelectCase;
  for (const Case& c : {Case{4, 2, 32, 100, 100, 16, 0.3f, 37}, Case{2, 2, 64, 64, 64, 32, 0.5f, 64},
                        Case{4, 1, 16, 70, 70, 8, 0.0f, 0}, Case{2, 2, 16, 40, 40, 8, 1.0f, 17},
                        Case{3, 3, 48, 129, 129, 32, 0.3f, 100}, Case{2, 1, 128, 300, 300, 64, 0.4f, 128},
                        Case{2, 2, 40, 150, 290, 16, 0.3f, 33}, Case{2, 1, 32, 400, 400, 48, 0.3f, 100},
                        Case{2, 2, 32, 400, 420, 160, 0.5f, 160}}) {
    SCOPED_TRACE("hq " + std::to_string(c.hq) + " block " + std::to_string(c.block));
    // Scaled so that the softmax is far from uniform (real attention is peaked).
    auto q = random_floats(static_cast<size_t>(c.mq * c.hq * c.d), 11, 2.0f);
    auto k = random_floats(static_cast<size_t>(c.mk * c.hkv * c.d), 12, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const auto ref =
        test::sparse_select_reference(q, k, c.mq, c.mk, c.hq, c.hkv, c.d, scale, c.block, c.rho, c.prompt);
    std::vector<uint8_t> got(ref.mask.size(), 7);
    SparseSelectParams p;
    p.scale = scale;
    p.block = c.block;
    p.rho = c.rho;
    p.n_prompt_keys = c.prompt;
    be->sparse_select(Tensor(q.data(), DType::F32, {c.mq, c.hq * c.d}),
                      Tensor(k.data(), DType::F32, {c.mk, c.hkv * c.d}), c.hq, c.hkv, c.d, p, got.data());
    int clear = 0;
    ASSERT_NO_FATAL_FAILURE(test::expect_selection_matches(got, ref, c, &clear));
    EXPECT_GT(clear, c.hq * ref.n_qb / 2);  // ties are rare: most rows are compared
  }
}

// The block-causal selection (SparseSelectParams::attn_block; LLaDA2): query rows at positions q_pos
// (a KV-cache step: rows from the middle of a block on) against keys [0, mk); each row sees the keys before
// the end of its attention block; the pattern rows of the query blocks present are written at the whole
// canvas's strides, the others left alone. Against a double reference written here: the masked softmax
// summed per (query block, key block), the best sparse_keep of each key set (ties to the lower block).
TEST(CpuSparseSelect, BlockCausalSelectionByPosition) {
  auto be = make_cpu_backend();
  struct Case {
    int hq, hkv, d, block, attn_block;
    int64_t first, mk, prompt, canvas;
    float rho;
  };
  for (const Case& c :
       {Case{4, 2, 32, 4, 8, 11, 24, 11, 48, 0.3f}, Case{2, 1, 16, 16, 8, 8, 40, 5, 48, 0.4f},
        Case{2, 2, 32, 8, 8, 0, 16, 3, 32, 0.0f}, Case{4, 4, 16, 6, 16, 20, 48, 20, 64, 0.5f}}) {
    SCOPED_TRACE("block " + std::to_string(c.block) + " attn " + std::to_string(c.attn_block) + " first " +
                 std::to_string(c.first));
    const int64_t mq = c.mk - c.first, n_qb = (c.canvas + c.block - 1) / c.block, n_kb = n_qb;
    auto q = random_floats(static_cast<size_t>(mq * c.hq * c.d), 21, 2.0f);
    auto k = random_floats(static_cast<size_t>(c.mk * c.hkv * c.d), 22, 2.0f);
    std::vector<int32_t> pos(static_cast<size_t>(mq));
    for (int64_t i = 0; i < mq; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(c.first + i);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    SparseSelectParams p;
    p.scale = scale;
    p.block = c.block;
    p.rho = c.rho;
    p.n_prompt_keys = c.prompt;
    p.attn_block = c.attn_block;
    p.q_pos = pos.data();
    p.n_qb = n_qb;
    p.n_kb = n_kb;
    std::vector<uint8_t> got(static_cast<size_t>(c.hq * n_qb * n_kb), 7);
    be->sparse_select(Tensor(q.data(), DType::F32, {mq, c.hq * c.d}),
                      Tensor(k.data(), DType::F32, {c.mk, c.hkv * c.d}), c.hq, c.hkv, c.d, p, got.data());
    const int64_t view_kb = (c.mk + c.block - 1) / c.block, g = c.prompt / c.block;
    int compared = 0;
    for (int h = 0; h < c.hq; ++h) {
      for (int64_t qb = 0; qb < n_qb; ++qb) {
        const uint8_t* row = got.data() + (h * n_qb + qb) * n_kb;
        std::vector<double> imp(static_cast<size_t>(view_kb), 0.0);
        bool present = false;
        for (int64_t i = 0; i < mq; ++i) {
          if (pos[static_cast<size_t>(i)] / c.block != qb) continue;
          present = true;
          const int64_t keys =
              std::min<int64_t>(c.mk, (pos[static_cast<size_t>(i)] / c.attn_block + 1) * c.attn_block);
          std::vector<double> sc(static_cast<size_t>(keys));
          double mx = -INFINITY, sum = 0.0;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0.0;
            for (int t = 0; t < c.d; ++t)
              dot += static_cast<double>(q[static_cast<size_t>((i * c.hq + h) * c.d + t)]) *
                     k[static_cast<size_t>((j * c.hkv + h / (c.hq / c.hkv)) * c.d + t)];
            sc[static_cast<size_t>(j)] = dot * scale;
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          for (double v : sc) sum += std::exp(v - mx);
          for (int64_t j = 0; j < keys; ++j)
            imp[static_cast<size_t>(j / c.block)] += std::exp(sc[static_cast<size_t>(j)] - mx) / sum;
        }
        if (!present) {  // not this call's: untouched
          for (int64_t kb = 0; kb < n_kb; ++kb) ASSERT_EQ(row[kb], 7) << "query block " << qb;
          continue;
        }
        for (int64_t kb = view_kb; kb < n_kb; ++kb) EXPECT_EQ(row[kb], 0) << "a key block past the keys";
        bool clear = true;
        std::vector<uint8_t> want(static_cast<size_t>(view_kb), 0);
        for (auto [a, b] : {std::pair<int64_t, int64_t>{0, g}, {g, view_kb}}) {
          const int64_t keep = sparse_keep(b - a, c.rho);
          std::vector<int64_t> order(static_cast<size_t>(b - a));
          std::iota(order.begin(), order.end(), a);
          std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
            return imp[static_cast<size_t>(x)] > imp[static_cast<size_t>(y)];
          });
          for (int64_t i = 0; i < keep; ++i) want[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
          if (keep > 0 && keep < b - a &&
              imp[static_cast<size_t>(order[static_cast<size_t>(keep - 1)])] -
                      imp[static_cast<size_t>(order[static_cast<size_t>(keep)])] <=
                  1e-4 * imp[static_cast<size_t>(order[static_cast<size_t>(keep - 1)])])
            clear = false;
        }
        if (!clear) continue;
        ++compared;
        for (int64_t kb = 0; kb < view_kb; ++kb)
          EXPECT_EQ(row[kb], want[static_cast<size_t>(kb)])
              << "head " << h << " query block " << qb << " key block " << kb;
      }
    }
    EXPECT_GT(compared, 0);
  }
}

TEST(CpuSparseSelect, SparseKeepCounts) {
  EXPECT_EQ(sparse_keep(0, 0.3f), 0);
  EXPECT_EQ(sparse_keep(10, 0.0f), 1);
  EXPECT_EQ(sparse_keep(10, 0.3f), 4);  // floor(3) + 1
  EXPECT_EQ(sparse_keep(10, 0.35f), 4);
  EXPECT_EQ(sparse_keep(10, 1.0f), 10);
  EXPECT_EQ(sparse_keep(3, 0.9f), 3);
}

}  // namespace
}  // namespace tessera
