// Quantized (GGUF) weights kept in their ggml blocks on the CPU: the AVX-512 row converters against
// the scalar dequantizer (which tests/unit/gguf_quant_test.cpp checks bit for bit against ggml), and
// every CPU op that reads such weights (gemm, gather_gemm, embed, moe_ffn) against the same op on the
// dequantized weight. Outputs are poisoned with NaN before each call.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "core/error.h"
#include "core/ggml_quant.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::random_floats;
using test::rel_error;

// Random blocks of type t for rows x cols values whose scale fields are set to moderate f16 / E8M0
// values (random bytes there could be inf or NaN); every other byte (quants, sub-block scales) is random.
std::vector<uint8_t> random_blocks(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
  const GgmlTypeInfo* info = ggml_type_info(t);
  const size_t bytes = static_cast<size_t>(rows) * ggml_bytes(t, cols);
  std::vector<uint8_t> b(bytes);
  uint64_t s = seed;
  for (auto& x : b) x = static_cast<uint8_t>((s = rng_mix(s)) >> 56);
  std::vector<size_t> f16_at;  // offsets of the f16 scales inside a block
  switch (t) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      f16_at = {0, 2};
      break;
    case GgmlType::Q2_K:
      f16_at = {80, 82};
      break;
    case GgmlType::Q3_K:
      f16_at = {108};
      break;
    case GgmlType::Q6_K:
      f16_at = {208};
      break;
    case GgmlType::MXFP4:
      break;
    default:
      f16_at = {0};
  }
  for (size_t blk = 0; blk < bytes / info->block_bytes; ++blk) {
    uint8_t* p = b.data() + blk * info->block_bytes;
    if (t == GgmlType::MXFP4) p[0] = static_cast<uint8_t>(120 + (s = rng_mix(s)) % 8);  // 2^-7 .. 2^0
    for (size_t o : f16_at) {
      const uint16_t h = f32_to_f16(static_cast<float>(((s = rng_mix(s)) % 2000) + 1) * 1e-5f);
      p[o] = static_cast<uint8_t>(h & 0xff);
      p[o + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return b;
}

// The whole tensor dequantized (the scalar path) to f32, and rounded to `to`.
std::vector<uint8_t> dequantized(GgmlType t, const std::vector<uint8_t>& q, int64_t rows, int64_t cols,
                                 DType to) {
  std::vector<float> f(static_cast<size_t>(rows * cols));
  ggml_dequantize(t, q.data(), f.data(), rows * cols);
  std::vector<uint8_t> out(f.size() * dtype_size(to));
  convert_from_f32(f.data(), out.data(), to, f.size());
  return out;
}

std::vector<uint8_t> in_dtype(const std::vector<float>& f, DType dt) {
  std::vector<uint8_t> out(f.size() * dtype_size(dt));
  convert_from_f32(f.data(), out.data(), dt, f.size());
  return out;
}

Tensor quant_tensor(std::vector<uint8_t>& q, GgmlType t, DType as, int64_t rows, int64_t cols) {
  Tensor w(q.data(), as, {rows, cols});
  w.quant = static_cast<int16_t>(t);
  return w;
}

const GgmlType kAllQuantized[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,
                                  GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,
                                  GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                                  GgmlType::MXFP4};

TEST(GgufQuant, RowConvertersMatchScalar) {
  for (GgmlType t : kAllQuantized) {
    const int64_t n = 1024;
    auto q = random_blocks(t, 1, n, 7 + static_cast<uint64_t>(t));
    if (t == GgmlType::Q8_0) {  // a NaN scale in the second block: NaN values stay NaN in bf16
      q[34] = 0x00;
      q[35] = 0x7e;
    }
    std::vector<float> ref(static_cast<size_t>(n)), f32(ref.size(), NAN), f32s(ref.size(), NAN);
    ggml_dequantize(t, q.data(), ref.data(), n);
    ggml_dequantize_row(t, q.data(), n, DType::F32, f32.data(), true);
    ggml_dequantize_row(t, q.data(), n, DType::F32, f32s.data(), false);
    std::vector<uint16_t> bf(ref.size(), 0xffff), bfs(ref.size(), 0xffff);
    ggml_dequantize_row(t, q.data(), n, DType::BF16, bf.data(), true);
    ggml_dequantize_row(t, q.data(), n, DType::BF16, bfs.data(), false);
    const char* name = ggml_type_info(t)->name;
    EXPECT_EQ(std::memcmp(f32.data(), ref.data(), ref.size() * 4), 0) << name;
    EXPECT_EQ(std::memcmp(f32s.data(), ref.data(), ref.size() * 4), 0) << name;
    size_t same = 0;
    for (size_t i = 0; i < ref.size(); ++i) same += bf[i] == f32_to_bf16(ref[i]) && bfs[i] == bf[i];
    EXPECT_EQ(same, ref.size()) << name;
  }
  std::vector<float> out(32);
  EXPECT_THROW(ggml_dequantize_row(GgmlType::Q8_0, nullptr, 32, DType::F16, out.data()), Error);
  EXPECT_THROW(ggml_dequantize_row(GgmlType::Q8_0, nullptr, 31, DType::F32, out.data()), Error);
  EXPECT_THROW(ggml_dequantize_row(GgmlType::IQ2_XXS, nullptr, 256, DType::F32, out.data()), Error);
}

// gemm on a quantized weight equals gemm on the same weight dequantized (to the activations' dtype),
// with bias, accumulate, bf16 output, and more rows than one dequantized panel holds (up to the
// summation order oneDNN picks for each panel width: 1e-5).
TEST(CpuQuantGemm, MatchesTheDequantizedWeight) {
  auto be = make_cpu_backend();
  const int64_t m = 37;
  // Every type on one panel; q4_K and q6_K also with k = 4096 on a full panel plus 77 rows.
  const int64_t big_n = static_cast<int64_t>(cpu::GemmEngine::kPanelBytes / (4096 * 2)) + 77;
  struct Case {
    GgmlType t;
    int64_t n, k;
  };
  std::vector<Case> cases;
  for (GgmlType t : kAllQuantized) cases.push_back({t, 300, 512});
  cases.push_back({GgmlType::Q4_K, big_n, 4096});
  cases.push_back({GgmlType::Q6_K, big_n, 4096});
  for (const Case& c : cases) {
    const int64_t n = c.n, k = c.k;
    const char* name = ggml_type_info(c.t)->name;
    const auto bias = random_floats(static_cast<size_t>(n), 3);
    Tensor tb(const_cast<float*>(bias.data()), DType::F32, {n});
    auto q = random_blocks(c.t, n, k, 100 + static_cast<uint64_t>(c.t));
    for (DType act : {DType::BF16, DType::F32}) {
      auto wd = dequantized(c.t, q, n, k, act);
      auto a = in_dtype(random_floats(static_cast<size_t>(m * k), 5), act);
      const Tensor ta(a.data(), act, {m, k}), plain(wd.data(), act, {n, k});
      const Tensor quant = quant_tensor(q, c.t, act, n, k);
      std::vector<float> want(static_cast<size_t>(m * n)), got(want.size(), NAN);
      Tensor tw(want.data(), DType::F32, {m, n}), tg(got.data(), DType::F32, {m, n});
      be->gemm(ta, plain, &tb, tw, false);
      be->gemm(ta, quant, &tb, tg, false);
      EXPECT_LE(rel_error(got.data(), want.data(), got.size()), 1e-5)
          << name << " " << dtype_name(act) << " n=" << n;
      be->gemm(ta, plain, nullptr, tw, true);  // accumulate
      be->gemm(ta, quant, nullptr, tg, true);
      EXPECT_LE(rel_error(got.data(), want.data(), got.size()), 1e-5) << name << " accumulate n=" << n;
      if (act == DType::BF16 && c.t == GgmlType::Q4_K) {  // bf16 output
        std::vector<uint16_t> wb(want.size()), gb(want.size(), 0xffff);
        Tensor twb(wb.data(), DType::BF16, {m, n}), tgb(gb.data(), DType::BF16, {m, n});
        be->gemm(ta, plain, nullptr, twb, false);
        be->gemm(ta, quant, nullptr, tgb, false);
        std::vector<float> wf(wb.size()), gf(gb.size());
        convert_to_f32(wb.data(), DType::BF16, wf.data(), wf.size());
        convert_to_f32(gb.data(), DType::BF16, gf.data(), gf.size());
        EXPECT_LE(rel_error(gf.data(), wf.data(), gf.size()), 1e-2);
      }
    }
  }
}

// gather_gemm (the mask-only logits) on a quantized LM head: several 256-row tiles of selected rows
// against several dequantized panels (re-gathered per panel), against the plain head.
TEST(CpuQuantGemm, GatherGemmMatchesTheDequantizedWeight) {
  auto be = make_cpu_backend();
  const int64_t rows = 700, k = 2048;
  const int64_t n = std::max(static_cast<int64_t>(cpu::GemmEngine::kPanelBytes / (k * 2)),
                             cpu::GemmEngine::kGatherPanelRows) +
                    100;  // two panels
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q8_0}) {
    auto q = random_blocks(t, n, k, 31);
    auto wd = dequantized(t, q, n, k, DType::BF16);
    auto a = in_dtype(random_floats(static_cast<size_t>(rows * k), 32), DType::BF16);
    std::vector<int32_t> idx;
    for (int32_t i = 0; i < rows; i += 1 + (i % 2)) idx.push_back(i);  // 467 rows: two tiles
    idx.push_back(3);
    const auto r = static_cast<int64_t>(idx.size());
    const Tensor ta(a.data(), DType::BF16, {rows, k}), ti(idx.data(), DType::I32, {r});
    const Tensor plain(wd.data(), DType::BF16, {n, k}), quant = quant_tensor(q, t, DType::BF16, n, k);
    std::vector<float> want(static_cast<size_t>(r * n)), got(want.size(), NAN);
    Tensor tw(want.data(), DType::F32, {r, n}), tg(got.data(), DType::F32, {r, n});
    be->gather_gemm(ta, ti, plain, tw);
    be->gather_gemm(ta, ti, quant, tg);
    EXPECT_LE(rel_error(got.data(), want.data(), got.size()), 1e-5) << ggml_type_info(t)->name;
  }
}

TEST(CpuQuantGemm, EmbedReadsQuantizedRows) {
  auto be = make_cpu_backend();
  const int64_t v = 10, d = 512;
  auto q = random_blocks(GgmlType::Q4_K, v, d, 41);
  const auto ref = dequantized(GgmlType::Q4_K, q, v, d, DType::F32);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  const Tensor tt = quant_tensor(q, GgmlType::Q4_K, DType::F32, v, d), ti(ids.data(), DType::I32, {4});
  std::vector<float> out(static_cast<size_t>(4 * d), NAN);
  Tensor to(out.data(), DType::F32, {4, d});
  be->embed(ti, tt, to);
  std::vector<uint16_t> outb(out.size(), 0xffff);
  Tensor tob(outb.data(), DType::BF16, {4, d});
  be->embed(ti, tt, tob);
  const auto* rf = reinterpret_cast<const float*>(ref.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t j = 0; j < d; ++j) {
      const float want = rf[static_cast<size_t>(ids[r] * d + j)];
      ASSERT_EQ(out[r * static_cast<size_t>(d) + static_cast<size_t>(j)], want);
      ASSERT_EQ(outb[r * static_cast<size_t>(d) + static_cast<size_t>(j)], f32_to_bf16(want));
    }
  }
  std::vector<int32_t> bad = {10};
  const Tensor tbad(bad.data(), DType::I32, {1});
  Tensor one(out.data(), DType::F32, {1, d});
  EXPECT_THROW(be->embed(tbad, tt, one), Error);
}

// moe_ffn with quantized experts (a different type per projection, as Q4_K_M files mix them) equals
// moe_ffn on the dequantized experts.
TEST(CpuQuantGemm, MoeExpertsMatchTheDequantizedExperts) {
  auto be = make_cpu_backend();
  const int E = 4, top_k = 2;
  const int64_t M = 40, H = 256, I = 512;
  const GgmlType types[3] = {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K};  // gate, up, down
  std::vector<std::vector<uint8_t>> q, plain;
  std::vector<const void*> tq, tp;
  for (int p = 0; p < 3; ++p) {
    for (int e = 0; e < E; ++e) {
      const int64_t rows = p < 2 ? I : H, cols = p < 2 ? H : I;
      q.push_back(random_blocks(types[p], rows, cols, 50 + static_cast<uint64_t>(p * E + e)));
      plain.push_back(dequantized(types[p], q.back(), rows, cols, DType::BF16));
    }
  }
  for (size_t i = 0; i < q.size(); ++i) {
    tq.push_back(q[i].data());
    tp.push_back(plain[i].data());
  }
  MoeExperts eq{tq.data(), E, H, I, DType::BF16}, ep{tp.data(), E, H, I, DType::BF16};
  for (int p = 0; p < 3; ++p) eq.quant[static_cast<size_t>(p)] = static_cast<int16_t>(types[p]);
  auto x = in_dtype(random_floats(static_cast<size_t>(M * H), 61, 0.1f), DType::BF16);
  std::vector<int32_t> ids(static_cast<size_t>(M * top_k));
  for (int64_t r = 0; r < M; ++r) {
    ids[static_cast<size_t>(2 * r)] = static_cast<int32_t>(r % E);
    ids[static_cast<size_t>(2 * r + 1)] =
        static_cast<int32_t>((r % E + 1 + (r / E) % (E - 1)) % E);  // != first
  }
  const auto w = random_floats(static_cast<size_t>(M * top_k), 62, 0.5f);
  std::vector<char> scratch(moe_scratch_bytes(M, top_k, eq));
  std::vector<float> want(static_cast<size_t>(M * H), 0.0f), got(want.size(), 0.0f);
  Tensor tx(x.data(), DType::BF16, {M, H}), tids(ids.data(), DType::I32, {M, top_k}),
      tw(const_cast<float*>(w.data()), DType::F32, {M, top_k}),
      ts(scratch.data(), DType::I32, {static_cast<int64_t>(scratch.size() / 4)}),
      twant(want.data(), DType::F32, {M, H}), tgot(got.data(), DType::F32, {M, H});
  be->moe_ffn(tx, tids, tw, ep, ts, twant);
  be->moe_ffn(tx, tids, tw, eq, ts, tgot);
  EXPECT_LE(rel_error(got.data(), want.data(), got.size()), 1e-5);
  // The quantized experts give the same bits under both schedules (each thread dequantizes into its
  // own panel when the experts are shared out among the threads).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(std::max(2, threads));
  std::vector<std::vector<float>> by(2, std::vector<float>(want.size(), 0.0f));
  for (int i = 0; i < 2; ++i) {
    auto bs = make_cpu_backend(
        CpuBackendOptions{CpuAttention::Auto, i == 0 ? CpuMoe::PerExpert : CpuMoe::AcrossExperts});
    Tensor t(by[static_cast<size_t>(i)].data(), DType::F32, {M, H});
    bs->moe_ffn(tx, tids, tw, eq, ts, t);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(by[0], by[1]);
  EXPECT_EQ(by[0], got);
  double norm = 0;
  for (float v : want) norm += std::fabs(v);
  EXPECT_GT(norm, 0.0);  // the experts did contribute
}

}  // namespace
}  // namespace tessera
