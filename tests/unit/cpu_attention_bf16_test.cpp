// The CPU attention kernel on bf16 operands (AVX-512 BF16, f32 accumulation) against the f32 kernel,
// which cpu_ops_test checks against a double reference: dense, masks, packed sequences, GQA, query
// subsets and row lists, block-sparse patterns by row and by position, and the SparseD selection.
// Skipped on CPUs without AVX-512 BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/backend.h"
#include "backend/cpu/attention_tile.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::random_floats;
using test::rel_error;

// Norm-wise relative error of the bf16 kernel against the f32 kernel (max |a - b| / max |b| over the
// whole output). Rounding q (scaled), k and v to bf16 (8 significant bits) moves each score by about
// 2^-9 of |q| |k| and each value by 2^-9. Measured on these cases: at most 8.2e-3 for q, k of unit
// spread (5e-3 to 6e-3 at d >= 40), 2.3e-2 for peaked scores (spread 2; d 8: 1.2e-2 at d >= 40).
constexpr double kBf16Bound = 3e-2;      // peaked softmax (spread 2)
constexpr double kBf16BoundUnit = 1e-2;  // q, k of unit spread
// Operands that are bf16 values already, with a power-of-two scale: only the probabilities' rounding
// (up to 2^-8 of each weight) and the order of the sums differ from the f32 kernel. Measured: at most
// 7.4e-3, so most of the error above is the probabilities' (as in flash attention on tensor cores).
constexpr double kBf16BoundExact = 1e-2;

#define SKIP_WITHOUT_BF16()                                                  \
  do {                                                                       \
    if (!cpu::bf16_attention_supported()) GTEST_SKIP() << "no AVX-512 BF16"; \
  } while (0)

int g_staged_cases = 0;  // bf16_vs_f32 cases that staged K / V

std::vector<int32_t> iota(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

struct Case {
  int hq, hkv, d;
  std::vector<int32_t> cu_q, cu_k, q_pos, k_pos;
  MaskKind mask = MaskKind::None;
  int block = 0;
  float spread = 1.0f;          // standard deviation of q and k: > 1 makes the softmax peaked
  bool exact_operands = false;  // q, k, v rounded to bf16 values and scale 1/4 before either kernel runs
  int sparse_block = 0;         // > 0: a random block-sparse pattern (one sequence)
  int64_t sparse_canvas = 0;    // > 0: the pattern is over a canvas of this many positions, read by position
  DType out_dtype = DType::F32;
};

// Runs the case on the f32 kernel and on the bf16 one (operands BF16) and returns the error.
double bf16_vs_f32(const Case& c, uint64_t seed, std::vector<float>* v_override = nullptr) {
  const int64_t nq = c.cu_q.back(), nk = c.cu_k.back();
  auto q = random_floats(static_cast<size_t>(nq * c.hq * c.d), seed, c.spread);
  auto k = random_floats(static_cast<size_t>(nk * c.hkv * c.d), seed + 1, c.spread);
  auto v =
      v_override != nullptr ? *v_override : random_floats(static_cast<size_t>(nk * c.hkv * c.d), seed + 2);
  AttnParams p;
  p.mask = c.mask;
  p.block_size = c.block;
  p.scale = c.exact_operands ? 0.25f : 1.0f / std::sqrt(static_cast<float>(c.d));
  p.n_seqs = static_cast<int>(c.cu_q.size()) - 1;
  p.cu_q = c.cu_q.data();
  p.cu_k = c.cu_k.data();
  p.q_pos = c.q_pos.data();
  p.k_pos = c.k_pos.data();
  std::vector<uint8_t> tiles;
  if (c.sparse_block > 0) {
    const int64_t span_q = c.sparse_canvas > 0 ? c.sparse_canvas : nq,
                  span_k = c.sparse_canvas > 0 ? c.sparse_canvas : nk;
    const int64_t nqb = (span_q + c.sparse_block - 1) / c.sparse_block,
                  nkb = (span_k + c.sparse_block - 1) / c.sparse_block;
    tiles.resize(static_cast<size_t>(c.hq * nqb * nkb));
    for (size_t i = 0; i < tiles.size(); ++i) tiles[i] = rng_mix(seed * 1000 + i) % 3 == 0 ? 1 : 0;
    for (int64_t kb = 0; kb < nkb; ++kb) tiles[static_cast<size_t>(kb)] = 0;  // a row that keeps nothing
    p.block_mask = tiles.data();
    p.sparse_block = c.sparse_block;
    if (c.sparse_canvas > 0) {
      p.sparse_q_blocks = nqb;
      p.sparse_k_blocks = nkb;
    }
  }
  // With `scratch`, the bf16 kernel is given the planned K / V staging buffer (filled with NaN) and
  // stages K and V there wherever some sequence has two query tiles or more (the engine waits for
  // kStageMinTiles) and the head dim is a multiple of 16; it must give the same bits as without it.
  std::vector<uint16_t> scratch(attn_kv_scratch_bytes(nk, c.hkv * c.d) / 2);
  auto run = [&](CpuAttention kind, DType operands, bool with_scratch = false) {
    auto be = make_cpu_backend({kind});
    AttnParams pp = p;
    pp.operands = operands;
    std::fill(scratch.begin(), scratch.end(), uint16_t{0x7fc0});
    if (with_scratch) pp.kv_scratch = scratch.data();
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<uint16_t> out16(q.size(), 0x7fc0);
    const Tensor tq(q.data(), DType::F32, {nq, c.hq * c.d}), tk(k.data(), DType::F32, {nk, c.hkv * c.d}),
        tv(v.data(), DType::F32, {nk, c.hkv * c.d});
    Tensor to = c.out_dtype == DType::F32 ? Tensor(out.data(), DType::F32, {nq, c.hq * c.d})
                                          : Tensor(out16.data(), DType::BF16, {nq, c.hq * c.d});
    if (with_scratch)
      cpu::attention(tq, tk, tv, to, c.hq, c.hkv, c.d, pp, true, 2);
    else
      be->attention(tq, tk, tv, to, c.hq, c.hkv, c.d, pp);
    if (c.out_dtype == DType::BF16)
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(out16[i]);
    return out;
  };
  const auto ref = run(CpuAttention::F32, DType::BF16);
  const auto got = run(CpuAttention::BF16, DType::BF16);
  const auto staged = run(CpuAttention::BF16, DType::BF16, true);
  EXPECT_EQ(0, std::memcmp(staged.data(), got.data(), got.size() * sizeof(float))) << "K / V staged in bf16";
  AttnParams ps = p;
  ps.kv_scratch = scratch.data();
  const bool written = std::any_of(scratch.begin(), scratch.end(), [](uint16_t x) { return x != 0x7fc0; });
  EXPECT_EQ(written, cpu::attention_stages_kv(ps, c.hq, c.d, true, 2)) << "staged where decided, only there";
  if (written) ++g_staged_cases;
  // A bf16 backend asked for f32 operands runs the f32 kernel: the same bits.
  const auto f32_ops = run(CpuAttention::BF16, DType::F32);
  EXPECT_EQ(0, std::memcmp(f32_ops.data(), ref.data(), ref.size() * sizeof(float)));
  return rel_error(got.data(), ref.data(), ref.size());
}

TEST(CpuAttentionBf16, HeadDimensionsLengthsMasksAndGqa) {
  SKIP_WITHOUT_BF16();
  for (const int d : {8, 40, 64, 128, 100}) {
    for (const int n : {1, 5, 130, 301}) {
      SCOPED_TRACE("d " + std::to_string(d) + " length " + std::to_string(n));
      Case c{8, 2, d, {0, n}, {0, n}, iota(n), iota(n)};
      const auto seed = static_cast<uint64_t>(100 + d * 1000 + n);
      EXPECT_LT(bf16_vs_f32(c, seed), kBf16BoundUnit);
      c.mask = MaskKind::BlockCausal;
      c.block = 48;
      c.spread = 2.0f;
      EXPECT_LT(bf16_vs_f32(c, seed + 1), kBf16Bound);
      c.mask = MaskKind::Causal;
      c.out_dtype = DType::BF16;
      EXPECT_LT(bf16_vs_f32(c, seed + 2), kBf16Bound);
    }
  }
}

// With operands that bf16 holds exactly, the bf16 kernel is the f32 kernel up to the probabilities'
// rounding: a tighter check of its tiling, masks and online softmax.
TEST(CpuAttentionBf16, ExactOperandsLeaveOnlyTheProbabilityRounding) {
  SKIP_WITHOUT_BF16();
  for (const int d : {16, 40, 128}) {
    for (const int n : {7, 129, 300}) {
      SCOPED_TRACE("d " + std::to_string(d) + " length " + std::to_string(n));
      Case c{4, 2, d, {0, n}, {0, n}, iota(n), iota(n)};
      c.exact_operands = true;
      EXPECT_LT(bf16_vs_f32(c, static_cast<uint64_t>(7 * d + n)), kBf16BoundExact);
      c.mask = MaskKind::Causal;
      EXPECT_LT(bf16_vs_f32(c, static_cast<uint64_t>(7 * d + n + 1)), kBf16BoundExact);
    }
  }
}

TEST(CpuAttentionBf16, PackedSequencesAndQuerySubsets) {
  SKIP_WITHOUT_BF16();
  std::vector<int32_t> pos = iota(70);
  const auto p2 = iota(45);
  pos.insert(pos.end(), p2.begin(), p2.end());
  Case packed{4, 2, 64, {0, 70, 115}, {0, 70, 115}, pos, pos};
  EXPECT_LT(bf16_vs_f32(packed, 4), kBf16BoundUnit);
  packed.mask = MaskKind::Causal;
  EXPECT_LT(bf16_vs_f32(packed, 5), kBf16BoundUnit);
  // Sequences of more than a tile (K / V staged), the second starting at an odd row: its key pairs
  // straddle the staged pairs; and an odd last row, past them.
  std::vector<int32_t> pos2 = iota(141);
  const auto p3 = iota(160);
  pos2.insert(pos2.end(), p3.begin(), p3.end());
  // (Two heads: tiles of 128 rows whatever the thread count, so both sequences have two.)
  Case straddle{2, 1, 64, {0, 141, 301}, {0, 141, 301}, pos2, pos2};
  const int before = g_staged_cases;
  EXPECT_LT(bf16_vs_f32(straddle, 14), kBf16BoundUnit);
  straddle.mask = MaskKind::Causal;
  EXPECT_LT(bf16_vs_f32(straddle, 15), kBf16BoundUnit);
  EXPECT_EQ(g_staged_cases, before + 2);
  // A cached step: 20 queries at positions 100..119 against 150 keys; and a row list (a window's
  // rows: ascending, with gaps) against 300 keys, GQA 4:1.
  Case subset{4, 4, 128, {0, 20}, {0, 150}, iota(20, 100), iota(150), MaskKind::Causal};
  EXPECT_LT(bf16_vs_f32(subset, 6), kBf16BoundUnit);
  subset.mask = MaskKind::None;
  EXPECT_LT(bf16_vs_f32(subset, 7), kBf16BoundUnit);
  std::vector<int32_t> list;
  for (int i = 0; i < 300; i += (i % 7 == 0 ? 3 : 1)) list.push_back(i);
  const int nl = static_cast<int>(list.size());
  Case rows{8, 2, 128, {0, nl}, {0, 300}, list, iota(300), MaskKind::BlockCausal, 32, 2.0f};
  EXPECT_LT(bf16_vs_f32(rows, 8), kBf16Bound);
}

TEST(CpuAttentionBf16, BlockSparseByRowAndByPosition) {
  SKIP_WITHOUT_BF16();
  const int before = g_staged_cases;
  for (const int bs : {8, 32, 48, 128, 160}) {
    SCOPED_TRACE("sparse block " + std::to_string(bs));
    Case c{4, 2, 64, {0, 301}, {0, 301}, iota(301), iota(301)};
    c.sparse_block = bs;
    EXPECT_LT(bf16_vs_f32(c, 40 + static_cast<uint64_t>(bs)), kBf16BoundUnit);
    c.mask = MaskKind::Causal;
    EXPECT_LT(bf16_vs_f32(c, 50 + static_cast<uint64_t>(bs)), kBf16BoundUnit);
    // A KV-cache step over a canvas of 400: queries at 130..269, every key, the pattern by position.
    Case cached{4, 2, 64, {0, 140}, {0, 400}, iota(140, 130), iota(400)};
    cached.sparse_block = bs;
    cached.sparse_canvas = 400;
    EXPECT_LT(bf16_vs_f32(cached, 60 + static_cast<uint64_t>(bs)), kBf16BoundUnit);
  }
  EXPECT_EQ(g_staged_cases, before + 15);  // every case has two query tiles or more: all staged
}

// The rules of the f32 kernel hold: masked keys weigh exactly 0 (V of 1e36 behind a causal mask), and
// a key that no query of a tile sees is never read (NaN K and V past the 40 keys 40 queries see).
TEST(CpuAttentionBf16, MaskedKeysWeighNothingAndUnseenKeysAreNotRead) {
  SKIP_WITHOUT_BF16();
  Case c{2, 1, 16, {0, 150}, {0, 150}, iota(150), iota(150), MaskKind::Causal};
  auto v = random_floats(150 * 16, 9);
  std::fill(v.begin() + 100 * 16, v.end(), 1e36f);
  {
    auto be = make_cpu_backend({CpuAttention::BF16});
    auto ref_be = make_cpu_backend({CpuAttention::F32});
    auto q = random_floats(150 * 2 * 16, 7);
    auto k = random_floats(150 * 16, 8);
    std::vector<float> out(q.size()), ref(q.size());
    AttnParams p;
    p.mask = MaskKind::Causal;
    p.scale = 0.25f;
    p.cu_q = c.cu_q.data();
    p.cu_k = c.cu_k.data();
    p.q_pos = c.q_pos.data();
    p.k_pos = c.k_pos.data();
    p.operands = DType::BF16;
    const Tensor tq(q.data(), DType::F32, {150, 32}), tk(k.data(), DType::F32, {150, 16}),
        tv(v.data(), DType::F32, {150, 16});
    Tensor to(out.data(), DType::F32, {150, 32}), tr(ref.data(), DType::F32, {150, 32});
    be->attention(tq, tk, tv, to, 2, 1, 16, p);
    ref_be->attention(tq, tk, tv, tr, 2, 1, 16, p);
    EXPECT_LT(rel_error(out.data(), ref.data(), 100 * 32), kBf16BoundUnit);
  }
  auto be = make_cpu_backend({CpuAttention::BF16});
  auto ref_be = make_cpu_backend({CpuAttention::F32});
  const std::vector<int32_t> cu_q{0, 40}, cu_k{0, 300}, qp = iota(40), kp = iota(300);
  auto q = random_floats(40 * 2 * 64, 21);
  auto k = random_floats(300 * 2 * 64, 22);
  auto vv = random_floats(300 * 2 * 64, 23);
  AttnParams p;
  p.mask = MaskKind::Causal;
  p.scale = 0.125f;
  p.cu_q = cu_q.data();
  p.cu_k = cu_k.data();
  p.q_pos = qp.data();
  p.k_pos = kp.data();
  p.operands = DType::BF16;
  std::vector<float> ref(q.size()), out(q.size(), std::numeric_limits<float>::quiet_NaN());
  Tensor tr(ref.data(), DType::F32, {40, 128});
  ref_be->attention(Tensor(q.data(), DType::F32, {40, 128}), Tensor(k.data(), DType::F32, {300, 128}),
                    Tensor(vv.data(), DType::F32, {300, 128}), tr, 2, 2, 64, p);
  std::fill(k.begin() + 40 * 128, k.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(vv.begin() + 40 * 128, vv.end(), std::numeric_limits<float>::quiet_NaN());
  Tensor to(out.data(), DType::F32, {40, 128});
  be->attention(Tensor(q.data(), DType::F32, {40, 128}), Tensor(k.data(), DType::F32, {300, 128}),
                Tensor(vv.data(), DType::F32, {300, 128}), to, 2, 2, 64, p);
  EXPECT_LT(rel_error(out.data(), ref.data(), out.size()), kBf16BoundUnit);
  // 140 queries (K / V staged in bf16, the NaN rows with them): keys 140.. no query sees weigh nothing.
  const std::vector<int32_t> cu_q2{0, 140}, qp2 = iota(140);
  auto q2 = random_floats(140 * 2 * 64, 24);
  k = random_floats(300 * 2 * 64, 22);
  vv = random_floats(300 * 2 * 64, 23);
  p.cu_q = cu_q2.data();
  p.q_pos = qp2.data();
  std::vector<float> ref2(q2.size()), out2(q2.size(), std::numeric_limits<float>::quiet_NaN());
  Tensor tr2(ref2.data(), DType::F32, {140, 128}), to2(out2.data(), DType::F32, {140, 128});
  ref_be->attention(Tensor(q2.data(), DType::F32, {140, 128}), Tensor(k.data(), DType::F32, {300, 128}),
                    Tensor(vv.data(), DType::F32, {300, 128}), tr2, 2, 2, 64, p);
  std::fill(k.begin() + 140 * 128, k.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(vv.begin() + 140 * 128, vv.end(), std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> scratch(attn_kv_scratch_bytes(300, 128) / 2, 0x7fc0);
  p.kv_scratch = scratch.data();
  cpu::attention(Tensor(q2.data(), DType::F32, {140, 128}), Tensor(k.data(), DType::F32, {300, 128}),
                 Tensor(vv.data(), DType::F32, {300, 128}), to2, 2, 2, 64, p, true, 2);
  EXPECT_NE(scratch[0], 0x7fc0) << "K / V staged";
  EXPECT_LT(rel_error(out2.data(), ref2.data(), out2.size()), kBf16BoundUnit);
}

// The selection on bf16 scores keeps the reference's blocks wherever the reference's choice is clear by
// more than the bf16 rounding of the importances (tie 2e-2 instead of 1e-4), and always the right counts.
TEST(CpuAttentionBf16, SparseSelectMatchesReferenceOutsideBf16Ties) {
  SKIP_WITHOUT_BF16();
  auto be = make_cpu_backend({CpuAttention::BF16});
  using SC = test::SparseSelectCase;
  for (const SC& c : {SC{4, 2, 32, 100, 100, 16, 0.3f, 37}, SC{2, 2, 64, 64, 64, 32, 0.5f, 64},
                      SC{3, 3, 48, 129, 129, 32, 0.3f, 100}, SC{2, 1, 128, 300, 300, 64, 0.4f, 128},
                      SC{2, 2, 40, 150, 290, 16, 0.3f, 33}, SC{2, 1, 32, 400, 400, 48, 0.3f, 100},
                      SC{2, 2, 128, 400, 420, 160, 0.5f, 160}, SC{4, 2, 128, 512, 512, 8, 0.3f, 200}}) {
    SCOPED_TRACE("hq " + std::to_string(c.hq) + " block " + std::to_string(c.block));
    auto q = random_floats(static_cast<size_t>(c.mq * c.hq * c.d), 11, 2.0f);
    auto k = random_floats(static_cast<size_t>(c.mk * c.hkv * c.d), 12, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const auto ref = test::sparse_select_reference(q, k, c.mq, c.mk, c.hq, c.hkv, c.d, scale, c.block, c.rho,
                                                   c.prompt, 2e-2);
    std::vector<uint8_t> got(ref.mask.size(), 7);
    SparseSelectParams p;
    p.scale = scale;
    p.block = c.block;
    p.rho = c.rho;
    p.n_prompt_keys = c.prompt;
    p.operands = DType::BF16;
    be->sparse_select(Tensor(q.data(), DType::F32, {c.mq, c.hq * c.d}),
                      Tensor(k.data(), DType::F32, {c.mk, c.hkv * c.d}), c.hq, c.hkv, c.d, p, got.data());
    int clear = 0;
    ASSERT_NO_FATAL_FAILURE(test::expect_selection_matches(got, ref, c, &clear));
    EXPECT_GT(clear, c.hq * ref.n_qb / 3);
  }
}

// The block-causal selection (LLaDA2) on bf16 scores: the f32 kernel's pattern (tested against a double
// reference in cpu_ops_test) in nearly every row, the rows of other query blocks untouched.
TEST(CpuAttentionBf16, BlockCausalSelectionAgreesWithF32) {
  SKIP_WITHOUT_BF16();
  const int hq = 4, hkv = 2, d = 64, block = 16, attn_block = 32;
  const int64_t first = 40, mk = 256, canvas = 320, mq = mk - first;
  const int64_t n_qb = canvas / block, n_kb = n_qb;
  auto q = random_floats(static_cast<size_t>(mq * hq * d), 31, 2.0f);
  auto k = random_floats(static_cast<size_t>(mk * hkv * d), 32, 2.0f);
  const auto pos = iota(static_cast<int>(mq), static_cast<int>(first));
  SparseSelectParams p;
  p.scale = 0.125f;
  p.block = block;
  p.rho = 0.3f;
  p.n_prompt_keys = 64;
  p.attn_block = attn_block;
  p.q_pos = pos.data();
  p.n_qb = n_qb;
  p.n_kb = n_kb;
  p.operands = DType::BF16;
  auto select = [&](CpuAttention kind) {
    std::vector<uint8_t> got(static_cast<size_t>(hq * n_qb * n_kb), 7);
    make_cpu_backend({kind})->sparse_select(Tensor(q.data(), DType::F32, {mq, hq * d}),
                                            Tensor(k.data(), DType::F32, {mk, hkv * d}), hq, hkv, d, p,
                                            got.data());
    return got;
  };
  const auto ref = select(CpuAttention::F32), got = select(CpuAttention::BF16);
  int same = 0, rows = 0;
  for (int64_t r = 0; r < hq * n_qb; ++r) {
    const bool present = ref[static_cast<size_t>(r * n_kb)] != 7;
    EXPECT_EQ(present, got[static_cast<size_t>(r * n_kb)] != 7) << "row " << r;
    if (!present) continue;
    ++rows;
    same += std::equal(ref.begin() + r * n_kb, ref.begin() + (r + 1) * n_kb, got.begin() + r * n_kb) ? 1 : 0;
  }
  EXPECT_GT(rows, 0);
  EXPECT_GE(same * 10, rows * 9) << same << " of " << rows << " rows equal";
}

TEST(CpuAttentionBf16, EnvironmentChoosesTheKernel) {
  const char* old = std::getenv("TESSERA_CPU_ATTN");
  const std::string saved = old != nullptr ? old : "";
  setenv("TESSERA_CPU_ATTN", "f32", 1);
  EXPECT_EQ(resolve_cpu_attention(CpuAttention::Auto), CpuAttention::F32);
  setenv("TESSERA_CPU_ATTN", "fp8", 1);
  test::expect_error([] { resolve_cpu_attention(CpuAttention::Auto); }, "TESSERA_CPU_ATTN='fp8'");
  unsetenv("TESSERA_CPU_ATTN");
  EXPECT_EQ(resolve_cpu_attention(CpuAttention::Auto),
            cpu::bf16_attention_supported() ? CpuAttention::BF16 : CpuAttention::F32);
  EXPECT_EQ(resolve_cpu_attention(CpuAttention::F32), CpuAttention::F32);
  if (!cpu::bf16_attention_supported())
    test::expect_error([] { resolve_cpu_attention(CpuAttention::BF16); }, "AVX-512 BF16");
  if (!saved.empty()) setenv("TESSERA_CPU_ATTN", saved.c_str(), 1);
  // TESSERA_CPU_KV_STAGE=0 turns the K / V staging off (no buffer planned); 1 leaves the option's choice.
  const char* old_stage = std::getenv("TESSERA_CPU_KV_STAGE");
  const std::string saved_stage = old_stage != nullptr ? old_stage : "";
  unsetenv("TESSERA_CPU_KV_STAGE");
  EXPECT_TRUE(resolve_cpu_kv_stage(true));
  EXPECT_FALSE(resolve_cpu_kv_stage(false));
  EXPECT_EQ(make_cpu_backend({})->stages_attention_kv(DType::BF16), cpu::bf16_attention_supported());
  EXPECT_FALSE(make_cpu_backend({})->stages_attention_kv(DType::F32));
  EXPECT_FALSE(make_cpu_backend({CpuAttention::F32})->stages_attention_kv(DType::BF16));
  setenv("TESSERA_CPU_KV_STAGE", "0", 1);
  EXPECT_FALSE(resolve_cpu_kv_stage(true));
  EXPECT_FALSE(make_cpu_backend({})->stages_attention_kv(DType::BF16));
  setenv("TESSERA_CPU_KV_STAGE", "1", 1);
  EXPECT_TRUE(resolve_cpu_kv_stage(true));
  setenv("TESSERA_CPU_KV_STAGE", "yes", 1);
  test::expect_error([] { resolve_cpu_kv_stage(true); }, "TESSERA_CPU_KV_STAGE='yes'");
  if (saved_stage.empty())
    unsetenv("TESSERA_CPU_KV_STAGE");
  else
    setenv("TESSERA_CPU_KV_STAGE", saved_stage.c_str(), 1);
}

}  // namespace
}  // namespace tessera
