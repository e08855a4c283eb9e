// Every CUDA op against the CPU backend on fresh random inputs (ggml test-backend-ops style):
// outputs are poisoned before each run, relative error bounds per dtype (bf16 operands <= 1e-2,
// f32 <= 1e-4). Skipped cleanly where no GPU is present.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "cuda_test_util.h"

namespace tessera {
namespace {

using test::CudaTest;
using test::DevBuf;
using test::from_bf16;
using test::random_floats;
using test::sparse_select_reference;
using test::to_bf16;

std::vector<int32_t> random_ids(size_t n, int32_t hi, uint64_t seed) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(rng_mix(seed + i) % static_cast<uint64_t>(hi));
  return v;
}

// ---- GEMM (cuBLASLt) -------------------------------------------------------------------------
struct GemmCase {
  int64_t m, n, k;
  DType in, out;
  bool bias, acc;
};

class CudaGemm : public CudaTest, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(CudaGemm, MatchesCpu) {
  const GemmCase c = GetParam();
  const uint64_t seed = 100 + static_cast<uint64_t>(c.m * 7 + c.n);
  auto a = random_floats(static_cast<size_t>(c.m * c.k), seed);
  auto w = random_floats(static_cast<size_t>(c.n * c.k), seed + 1, 0.1f);
  auto bias = random_floats(static_cast<size_t>(c.n), seed + 2);
  auto c0 = random_floats(static_cast<size_t>(c.m * c.n), seed + 3);
  const bool bf = c.in == DType::BF16;
  if (bf) {  // identical operands on both sides
    a = from_bf16(to_bf16(a));
    w = from_bf16(to_bf16(w));
  }
  // CPU reference.
  std::vector<uint16_t> ab = to_bf16(a), wb = to_bf16(w);
  std::vector<float> cref = c0;
  std::vector<uint16_t> cref_b(static_cast<size_t>(c.m * c.n));
  {
    Tensor ta(bf ? static_cast<void*>(ab.data()) : a.data(), c.in, {c.m, c.k});
    Tensor tw(bf ? static_cast<void*>(wb.data()) : w.data(), c.in, {c.n, c.k});
    Tensor tb(bias.data(), DType::F32, {c.n});
    Tensor tc(c.out == DType::F32 ? static_cast<void*>(cref.data()) : cref_b.data(), c.out, {c.m, c.n});
    cpu->gemm(ta, tw, c.bias ? &tb : nullptr, tc, c.acc);
  }
  DevBuf da(*gpu, a.size() * 4), dw(*gpu, w.size() * 4), db(*gpu, bias.size() * 4), dc(*gpu, c0.size() * 4);
  if (bf) {
    da.upload(ab);
    dw.upload(wb);
  } else {
    da.upload(a);
    dw.upload(w);
  }
  db.upload(bias);
  if (c.acc) {
    dc.upload(c0);
  } else {
    dc.poison();
  }
  Tensor ta = da.view(c.in, {c.m, c.k}), tw = dw.view(c.in, {c.n, c.k}), tb = db.view(DType::F32, {c.n});
  Tensor tc = dc.view(c.out, {c.m, c.n});
  gpu->gemm(ta, tw, c.bias ? &tb : nullptr, tc, c.acc);
  const double bound = bf ? 1e-2 : 1e-4;
  if (c.out == DType::F32) {
    const auto got = dc.download<float>(cref.size());
    EXPECT_CLOSE_TO_CPU(got, cref, bound);
  } else {
    const auto got = from_bf16(dc.download<uint16_t>(cref_b.size()));
    EXPECT_CLOSE_TO_CPU(got, from_bf16(cref_b), bound);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm,
                         ::testing::Values(GemmCase{1, 64, 64, DType::BF16, DType::F32, false, false},
                                           GemmCase{37, 200, 96, DType::BF16, DType::F32, true, false},
                                           GemmCase{37, 200, 96, DType::BF16, DType::BF16, false, false},
                                           GemmCase{300, 512, 256, DType::BF16, DType::F32, false, true},
                                           GemmCase{512, 1024, 512, DType::BF16, DType::BF16, false, false},
                                           GemmCase{45, 130, 70, DType::F32, DType::F32, true, false},
                                           GemmCase{64, 96, 128, DType::F32, DType::F32, false, true}),
                         test::case_index_name);

// ---- Gather-GEMM (mask-only logits) ----------------------------------------------------------
struct GatherCase {
  int64_t rows_a, n_sel, n, k;
  DType in;
  DType out;
};
class CudaGatherGemm : public CudaTest, public ::testing::WithParamInterface<GatherCase> {};

TEST_P(CudaGatherGemm, MatchesCpu) {
  const GatherCase c = GetParam();
  const bool bf = c.in == DType::BF16;
  auto a = random_floats(static_cast<size_t>(c.rows_a * c.k), 7 + static_cast<uint64_t>(c.n));
  auto w = random_floats(static_cast<size_t>(c.n * c.k), 8 + static_cast<uint64_t>(c.k), 0.1f);
  const auto rows = random_ids(static_cast<size_t>(c.n_sel), static_cast<int32_t>(c.rows_a), 99);
  std::vector<uint16_t> ab = to_bf16(a), wb = to_bf16(w);
  std::vector<float> ref(static_cast<size_t>(c.n_sel * c.n));
  {
    std::vector<int32_t> r = rows;
    Tensor ta(bf ? static_cast<void*>(ab.data()) : a.data(), c.in, {c.rows_a, c.k});
    Tensor tw(bf ? static_cast<void*>(wb.data()) : w.data(), c.in, {c.n, c.k});
    Tensor tr(r.data(), DType::I32, {c.n_sel});
    // The CPU gather-GEMM writes f32; compare bf16 outputs after rounding it.
    Tensor tc(ref.data(), DType::F32, {c.n_sel, c.n});
    cpu->gather_gemm(ta, tr, tw, tc);
    if (c.out == DType::BF16) ref = from_bf16(to_bf16(ref));
  }
  DevBuf da(*gpu, a.size() * 4), dw(*gpu, w.size() * 4), dr(*gpu, rows.size() * 4), dc(*gpu, ref.size() * 4);
  if (bf) {
    da.upload(ab);
    dw.upload(wb);
  } else {
    da.upload(a);
    dw.upload(w);
  }
  dr.upload(rows);
  dc.poison();
  Tensor tc = dc.view(c.out, {c.n_sel, c.n});
  gpu->gather_gemm(da.view(c.in, {c.rows_a, c.k}), dr.view(DType::I32, {c.n_sel}), dw.view(c.in, {c.n, c.k}),
                   tc);
  const auto got =
      c.out == DType::F32 ? dc.download<float>(ref.size()) : from_bf16(dc.download<uint16_t>(ref.size()));
  EXPECT_CLOSE_TO_CPU(got, ref, bf ? 1e-2 : 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGatherGemm,
                         ::testing::Values(GatherCase{10, 1, 64, 64, DType::BF16, DType::F32},
                                           GatherCase{300, 100, 1000, 256, DType::BF16, DType::F32},
                                           GatherCase{300, 257, 515, 72, DType::BF16, DType::F32},
                                           GatherCase{2048, 1500, 4000, 512, DType::BF16, DType::F32},
                                           GatherCase{500, 130, 384, 128, DType::BF16, DType::BF16},
                                           GatherCase{100, 33, 200, 48, DType::F32, DType::F32},
                                           GatherCase{64, 20, 100, 30, DType::BF16, DType::F32}),
                         test::case_index_name);

// ---- Row-wise ops -------------------------------------------------------------------------------
TEST_F(CudaTest, RmsNormMatchesCpu) {
  for (const auto& [rows, cols, group, out] : std::vector<std::tuple<int64_t, int64_t, int64_t, DType>>{
           {7, 96, 96, DType::F32},
           {130, 1024, 1024, DType::BF16},
           {33, 512, 64, DType::F32},
           // a block per row (wide rows, float4 words), and a wide row the warp-per-row kernel keeps
           {300, 4096, 4096, DType::F32},
           {64, 4096, 4096, DType::BF16},
           {3, 1030, 1030, DType::F32}}) {
    auto x = random_floats(static_cast<size_t>(rows * cols), 11 + static_cast<uint64_t>(cols), 3.0f);
    auto w = from_bf16(to_bf16(random_floats(static_cast<size_t>(group), 12)));
    const auto wb = to_bf16(w);
    std::vector<float> ref(x.size());
    std::vector<uint16_t> refb(x.size());
    Tensor tw(const_cast<uint16_t*>(wb.data()), DType::BF16, {group});
    Tensor ty(out == DType::F32 ? static_cast<void*>(ref.data()) : refb.data(), out, {rows, cols});
    cpu->rmsnorm(Tensor(x.data(), DType::F32, {rows, cols}), tw, 1e-5f, ty);
    DevBuf dx(*gpu, x.size() * 4), dw(*gpu, wb.size() * 2), dy(*gpu, x.size() * 4);
    dx.upload(x);
    dw.upload(wb);
    dy.poison();
    Tensor gy = dy.view(out, {rows, cols});
    gpu->rmsnorm(dx.view(DType::F32, {rows, cols}), dw.view(DType::BF16, {group}), 1e-5f, gy);
    if (out == DType::F32) {
      const auto got = dy.download<float>(ref.size());
      EXPECT_CLOSE_TO_CPU(got, ref, 1e-4);
    } else {
      const auto got = from_bf16(dy.download<uint16_t>(ref.size()));
      EXPECT_CLOSE_TO_CPU(got, from_bf16(refb), 1e-2);
    }
  }
}

TEST_F(CudaTest, RopeMatchesCpu) {
  for (const auto& [rows, heads, hd, rot, neox, yarn] :
       std::vector<std::tuple<int64_t, int64_t, int, int, bool, bool>>{
           {40, 4, 64, 64, true, false},
           {17, 2, 128, 64, true, false},
           {9, 3, 32, 32, false, false},
           // a block per row (>= 64 rows): interleaved pairs as float2, rotate-half, partial rotary
           {64, 32, 128, 128, false, false},
           {100, 8, 128, 64, true, false},
           {70, 3, 32, 32, false, false},
           // YaRN with its cos / sin scale and the Llama-4 query scale (Ministral-3), both kernels
           {100, 8, 128, 128, true, true},
           {12, 4, 128, 128, true, true}}) {
    RopeParams rp{.rotary_dim = rot, .theta = 500000.0f, .neox = neox};
    if (yarn) {
      rp.yarn_factor = 16.0f;
      rp.ramp_lo = 20.0f;
      rp.ramp_hi = 41.0f;
      rp.attn_factor = 1.277f;
      rp.pos_beta = 0.1f;
      rp.pos_orig = 8192;  // positions up to 30000: scales 1 to 1 + 0.1 ln 4
    }
    auto x = random_floats(static_cast<size_t>(rows * heads * hd), 21 + static_cast<uint64_t>(hd));
    const auto pos = random_ids(static_cast<size_t>(rows), 30000, 5);
    std::vector<float> ref = x;
    std::vector<int32_t> p = pos;
    Tensor tx(ref.data(), DType::F32, {rows, heads * hd});
    cpu->rope(tx, Tensor(p.data(), DType::I32, {rows}), hd, rp);
    DevBuf dx(*gpu, x.size() * 4), dp(*gpu, pos.size() * 4);
    dx.upload(x);
    dp.upload(pos);
    Tensor gx = dx.view(DType::F32, {rows, heads * hd});
    gpu->rope(gx, dp.view(DType::I32, {rows}), hd, rp);
    const auto got = dx.download<float>(x.size());
    EXPECT_CLOSE_TO_CPU(got, ref, 1e-4);
  }
}

TEST_F(CudaTest, SwigluAndEmbedMatchCpu) {
  const int64_t n = 1001;
  auto g = random_floats(static_cast<size_t>(n), 31, 4.0f), u = random_floats(static_cast<size_t>(n), 32);
  for (DType t : {DType::F32, DType::BF16}) {
    const bool bf = t == DType::BF16;
    auto gb = to_bf16(g), ub = to_bf16(u);
    std::vector<float> ref(static_cast<size_t>(n));
    std::vector<uint16_t> refb(static_cast<size_t>(n));
    Tensor tg(bf ? static_cast<void*>(gb.data()) : g.data(), t, {n});
    Tensor tu(bf ? static_cast<void*>(ub.data()) : u.data(), t, {n});
    Tensor to(bf ? static_cast<void*>(refb.data()) : ref.data(), t, {n});
    cpu->swiglu(tg, tu, to);
    DevBuf dg(*gpu, n * 4), du(*gpu, n * 4), dout(*gpu, n * 4);
    if (bf) {
      dg.upload(gb);
      du.upload(ub);
    } else {
      dg.upload(g);
      du.upload(u);
    }
    dout.poison();
    Tensor go = dout.view(t, {n});
    gpu->swiglu(dg.view(t, {n}), du.view(t, {n}), go);
    const auto got =
        bf ? from_bf16(dout.download<uint16_t>(static_cast<size_t>(n))) : dout.download<float>(ref.size());
    EXPECT_CLOSE_TO_CPU(got, bf ? from_bf16(refb) : ref, bf ? 1e-2 : 1e-5);
  }
  // Embedding: bf16 table -> f32 rows.
  const int64_t V = 500, D = 72, R = 37;
  const auto table = to_bf16(random_floats(static_cast<size_t>(V * D), 33));
  const auto ids = random_ids(static_cast<size_t>(R), static_cast<int32_t>(V), 34);
  std::vector<float> ref(static_cast<size_t>(R * D));
  {
    std::vector<uint16_t> tb = table;
    std::vector<int32_t> id = ids;
    Tensor o(ref.data(), DType::F32, {R, D});
    cpu->embed(Tensor(id.data(), DType::I32, {R}), Tensor(tb.data(), DType::BF16, {V, D}), o);
  }
  DevBuf dt(*gpu, table.size() * 2), di(*gpu, ids.size() * 4), dout(*gpu, ref.size() * 4);
  dt.upload(table);
  di.upload(ids);
  dout.poison();
  Tensor go = dout.view(DType::F32, {R, D});
  gpu->embed(di.view(DType::I32, {R}), dt.view(DType::BF16, {V, D}), go);
  const auto got = dout.download<float>(ref.size());
  EXPECT_CLOSE_TO_CPU(got, ref, 0.0);
}

// ---- Attention ---------------------------------------------------------------------------------
struct AttnCase {
  int hq, hkv, d;
  std::vector<int> q_lens, k_lens;  // per sequence; queries are a subset of the keys when shorter
  MaskKind mask = MaskKind::None;
  int block = 0;
  DType out = DType::BF16;
  int sparse_block = 0;    // > 0: random block-sparse pattern (one sequence)
  bool scratch = true;     // pass AttnParams::kv_scratch
  bool q_scratch = false;  // also AttnParams::q_scratch: cuDNN takes the case where it is loaded
  // Where cuDNN is loaded and the case is one it may take: 1 it must run it (the engine's shapes), -1
  // either (its support of the shape decides; the outcome is printed).
  int lib = -1;
};
// Whether cuDNN's attention takes a case (cudnn_attention.h): no mask, no pattern, bf16 output, both
// staging buffers, head dims of multiples of 8 up to 128.
bool cudnn_case(const AttnCase& c) {
  return c.q_scratch && c.scratch && c.mask == MaskKind::None && c.sparse_block == 0 &&
         c.out == DType::BF16 && c.d % 8 == 0 && c.d <= 128;
}

class CudaAttention : public CudaTest, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(CudaAttention, MatchesCpu) {
  const AttnCase c = GetParam();
  std::vector<int32_t> cu_q{0}, cu_k{0}, q_pos, k_pos;
  for (size_t s = 0; s < c.q_lens.size(); ++s) {
    const int nk = c.k_lens[s], nq = c.q_lens[s];
    for (int j = 0; j < nk; ++j) k_pos.push_back(j);
    // Queries: the last nq key positions (a suffix, like a block being decoded against its prefix).
    for (int i = 0; i < nq; ++i) q_pos.push_back(nk - nq + i);
    cu_q.push_back(cu_q.back() + nq);
    cu_k.push_back(cu_k.back() + nk);
  }
  const int64_t NQ = cu_q.back(), NK = cu_k.back();
  auto q = random_floats(static_cast<size_t>(NQ * c.hq * c.d), 41 + static_cast<uint64_t>(c.d), 2.0f);
  auto k = random_floats(static_cast<size_t>(NK * c.hkv * c.d), 42, 2.0f);
  auto v = random_floats(static_cast<size_t>(NK * c.hkv * c.d), 43);
  // The tensor-core kernel takes bf16 operands: give the reference the same operands.
  const bool tc =
      ((c.d == 32 || c.d == 64 || c.d == 128) && c.out == DType::BF16 && c.scratch) || cudnn_case(c);
  if (tc) {
    q = from_bf16(to_bf16(q));
    k = from_bf16(to_bf16(k));
    v = from_bf16(to_bf16(v));
  }
  std::vector<uint8_t> bmask;
  AttnParams p;
  p.mask = c.mask;
  p.block_size = c.block;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  p.n_seqs = static_cast<int>(c.q_lens.size());
  if (c.sparse_block > 0) {
    const int64_t nqb = (NQ + c.sparse_block - 1) / c.sparse_block,
                  nkb = (NK + c.sparse_block - 1) / c.sparse_block;
    bmask.resize(static_cast<size_t>(c.hq * nqb * nkb));
    for (size_t i = 0; i < bmask.size(); ++i) bmask[i] = rng_mix(777 + i) % 3 != 0 ? 1 : 0;
    p.sparse_block = c.sparse_block;
  }
  // CPU reference (host pointers).
  std::vector<float> ref(static_cast<size_t>(NQ * c.hq * c.d));
  std::vector<uint16_t> refb(ref.size());
  {
    AttnParams hp = p;
    hp.cu_q = cu_q.data();
    hp.cu_k = cu_k.data();
    hp.q_pos = q_pos.data();
    hp.k_pos = k_pos.data();
    hp.block_mask = bmask.empty() ? nullptr : bmask.data();
    std::vector<float> qq = q, kk = k, vv = v;
    Tensor o(c.out == DType::F32 ? static_cast<void*>(ref.data()) : refb.data(), c.out, {NQ, c.hq * c.d});
    cpu->attention(Tensor(qq.data(), DType::F32, {NQ, c.hq * c.d}),
                   Tensor(kk.data(), DType::F32, {NK, c.hkv * c.d}),
                   Tensor(vv.data(), DType::F32, {NK, c.hkv * c.d}), o, c.hq, c.hkv, c.d, hp);
    if (c.out == DType::BF16) ref = from_bf16(refb);
  }
  DevBuf dq(*gpu, q.size() * 4), dk(*gpu, k.size() * 4), dv(*gpu, v.size() * 4), dout(*gpu, ref.size() * 4);
  DevBuf dcq(*gpu, cu_q.size() * 4), dck(*gpu, cu_k.size() * 4), dqp(*gpu, q_pos.size() * 4),
      dkp(*gpu, k_pos.size() * 4), dbm(*gpu, std::max<size_t>(bmask.size(), 1));
  dq.upload(q);
  dk.upload(k);
  dv.upload(v);
  dcq.upload(cu_q);
  dck.upload(cu_k);
  dqp.upload(q_pos);
  dkp.upload(k_pos);
  if (!bmask.empty()) dbm.upload(bmask);
  AttnParams dp = p;
  dp.cu_q = static_cast<const int32_t*>(dcq.p);
  dp.cu_k = static_cast<const int32_t*>(dck.p);
  dp.q_pos = static_cast<const int32_t*>(dqp.p);
  dp.k_pos = static_cast<const int32_t*>(dkp.p);
  dp.block_mask = bmask.empty() ? nullptr : static_cast<const uint8_t*>(dbm.p);
  DevBuf dscr(*gpu, attn_kv_scratch_bytes(NK, c.hkv * c.d)), dqs(*gpu, attn_q_scratch_bytes(NQ, c.hq * c.d));
  if (c.scratch) dp.kv_scratch = dscr.p;  // bf16 K/V staging: the tensor-core kernel runs
  if (c.q_scratch) dp.q_scratch = dqs.p;
  const int64_t lib_before = gpu->attention_library_calls();
  dout.poison();
  Tensor o = dout.view(c.out, {NQ, c.hq * c.d});
  gpu->attention(dq.view(DType::F32, {NQ, c.hq * c.d}), dk.view(DType::F32, {NK, c.hkv * c.d}),
                 dv.view(DType::F32, {NK, c.hkv * c.d}), o, c.hq, c.hkv, c.d, dp);
  const auto got =
      c.out == DType::F32 ? dout.download<float>(ref.size()) : from_bf16(dout.download<uint16_t>(ref.size()));
  // Tensor-core head dims round P to bf16: 1e-2; the SIMT path computes in f32.
  EXPECT_CLOSE_TO_CPU(got, ref, c.out == DType::BF16 ? 1e-2 : 1e-4);
  // With cuDNN loaded, the cases it takes run on it (and no other case does).
  const bool lib = gpu->name().find("cuDNN") != std::string::npos;
  const int64_t ran = gpu->attention_library_calls() - lib_before;
  if (!lib || !cudnn_case(c)) {
    EXPECT_EQ(ran, 0) << gpu->name();
  } else if (c.lib == 1) {
    EXPECT_EQ(ran, 1) << gpu->name();
  } else {
    std::printf("cuDNN %s this case\n", ran == 1 ? "ran" : "refused");
  }
}

// On the GPU session, where libcudnn.so.9 is on the library path (bench/gpu_session.sh sets
// TESSERA_EXPECT_CUDNN=1), the backend must have loaded it.
TEST_F(CudaTest, CudnnLoadsWhereExpected) {
  const char* expect = std::getenv("TESSERA_EXPECT_CUDNN");
  if (expect == nullptr || std::string(expect) != "1") GTEST_SKIP() << "TESSERA_EXPECT_CUDNN is not set";
  EXPECT_NE(gpu->name().find("cuDNN 9"), std::string::npos) << gpu->name();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaAttention,
    ::testing::Values(
        AttnCase{4, 4, 64, {1}, {1}}, AttnCase{4, 2, 64, {70, 130}, {70, 130}},
        AttnCase{8, 2, 128, {200}, {200}, MaskKind::None, 0, DType::F32},
        AttnCase{4, 4, 128, {40, 64}, {300, 64}}, AttnCase{2, 1, 32, {100}, {100}, MaskKind::Causal},
        AttnCase{4, 4, 64, {150}, {150}, MaskKind::BlockCausal, 32},
        AttnCase{4, 2, 16, {50, 20}, {90, 20}, MaskKind::None, 0, DType::F32},
        AttnCase{3, 3, 80, {33}, {77}, MaskKind::Causal, 0, DType::F32},
        AttnCase{4, 2, 64, {256}, {256}, MaskKind::None, 0, DType::BF16, 64},
        AttnCase{4, 4, 128, {300}, {300}, MaskKind::None, 0, DType::BF16, 32},
        AttnCase{4, 4, 128, {300}, {300}, MaskKind::Causal, 0, DType::BF16, 128},
        AttnCase{4, 2, 64, {256}, {256}, MaskKind::None, 0, DType::F32, 64},
        AttnCase{2, 2, 16, {130}, {130}, MaskKind::None, 0, DType::F32, 32},
        AttnCase{4, 2, 64, {300, 40}, {300, 90}, MaskKind::None, 0, DType::BF16, 0, false},
        AttnCase{4, 4, 64, {1000}, {1000}, MaskKind::BlockCausal, 100},
        AttnCase{2, 2, 128, {129, 1, 255}, {129, 1, 255}},
        // cuDNN (where loaded): one sequence, GQA, a query subset, packed sequences
        // (ragged), head dims 64 / 96 / 128; and cases it must leave to tessera's kernels.
        AttnCase{4, 4, 64, {1}, {1}, MaskKind::None, 0, DType::BF16, 0, true, true},
        AttnCase{8, 2, 128, {200}, {200}, MaskKind::None, 0, DType::BF16, 0, true, true, 1},
        AttnCase{4, 4, 128, {64}, {1000}, MaskKind::None, 0, DType::BF16, 0, true, true, 1},
        AttnCase{4, 4, 96, {300}, {300}, MaskKind::None, 0, DType::BF16, 0, true, true},
        AttnCase{4, 2, 64, {70, 130}, {70, 130}, MaskKind::None, 0, DType::BF16, 0, true, true, 1},
        AttnCase{4, 4, 128, {40, 64}, {300, 64}, MaskKind::None, 0, DType::BF16, 0, true, true},
        AttnCase{2, 2, 128, {129, 1, 255}, {129, 1, 255}, MaskKind::None, 0, DType::BF16, 0, true, true},
        AttnCase{32, 8, 128, {2048}, {2048}, MaskKind::None, 0, DType::BF16, 0, true, true, 1},
        AttnCase{4, 4, 64, {150}, {150}, MaskKind::BlockCausal, 32, DType::BF16, 0, true, true},
        AttnCase{4, 4, 128, {300}, {300}, MaskKind::None, 0, DType::BF16, 32, true, true},
        AttnCase{8, 2, 128, {200}, {200}, MaskKind::None, 0, DType::F32, 0, true, true}),
    test::case_index_name);

// ---- Sampling ----------------------------------------------------------------------------------
struct SampleCase {
  int64_t rows, vocab;
  SampleParams p;
};
class CudaSample : public CudaTest, public ::testing::WithParamInterface<SampleCase> {};

TEST_P(CudaSample, MatchesCpu) {
  const SampleCase c = GetParam();
  const auto logits =
      random_floats(static_cast<size_t>(c.rows * c.vocab), 51 + static_cast<uint64_t>(c.vocab), 4.0f);
  std::vector<int32_t> keys(static_cast<size_t>(c.rows));
  std::iota(keys.begin(), keys.end(), 1000);
  std::vector<int32_t> tok(keys.size());
  std::vector<float> conf(keys.size());
  {
    std::vector<float> l = logits;
    std::vector<int32_t> k = keys;
    Tensor tt(tok.data(), DType::I32, {c.rows}), tc(conf.data(), DType::F32, {c.rows});
    cpu->sample_rows(Tensor(l.data(), DType::F32, {c.rows, c.vocab}), Tensor(k.data(), DType::I32, {c.rows}),
                     c.p, tt, tc);
  }
  DevBuf dl(*gpu, logits.size() * 4), dk(*gpu, keys.size() * 4), dt(*gpu, keys.size() * 4),
      dc(*gpu, keys.size() * 4);
  dl.upload(logits);
  dk.upload(keys);
  dt.poison();
  dc.poison();
  Tensor gt = dt.view(DType::I32, {c.rows}), gc = dc.view(DType::F32, {c.rows});
  gpu->sample_rows(dl.view(DType::F32, {c.rows, c.vocab}), dk.view(DType::I32, {c.rows}), c.p, gt, gc);
  const auto gtok = dt.download<int32_t>(tok.size());
  const auto gconf = dc.download<float>(conf.size());
  EXPECT_EQ(gtok, tok);
  EXPECT_CLOSE_TO_CPU(gconf, conf, 1e-5);
}

SampleParams sp(ConfKind conf, float t, bool gumbel, int top_k = 0, float top_p = 1.0f, int suppress = -1) {
  SampleParams p;
  p.conf = conf;
  p.temperature = t;
  p.gumbel = gumbel;
  p.top_k = top_k;
  p.top_p = top_p;
  p.suppress_token = suppress;
  p.seed = 1234;
  return p;
}

INSTANTIATE_TEST_SUITE_P(Policies, CudaSample,
                         ::testing::Values(SampleCase{64, 5000, sp(ConfKind::Prob, 0.0f, true)},
                                           SampleCase{16, 126464, sp(ConfKind::Prob, 0.0f, true, 0, 1.0f, 7)},
                                           SampleCase{64, 3000, sp(ConfKind::Prob, 0.7f, true)},
                                           SampleCase{64, 3000, sp(ConfKind::Random, 0.0f, true)},
                                           SampleCase{64, 3000, sp(ConfKind::Margin, 0.0f, false)},
                                           SampleCase{64, 3000, sp(ConfKind::NegEntropy, 0.0f, false)},
                                           SampleCase{64, 3000, sp(ConfKind::Prob, 0.9f, false)},
                                           SampleCase{64, 3000, sp(ConfKind::Prob, 0.8f, false, 50, 0.9f)},
                                           SampleCase{64, 3000,
                                                      sp(ConfKind::NegEntropy, 1.0f, false, 0, 0.95f)},
                                           SampleCase{32, 777, sp(ConfKind::Margin, 0.5f, false, 10)}),
                         test::case_index_name);

TEST_F(CudaTest, TokenLogprobMatchesCpu) {
  const int64_t R = 40, V = 3001;
  const auto logits = random_floats(static_cast<size_t>(R * V), 61, 3.0f);
  auto target = random_ids(static_cast<size_t>(R), static_cast<int32_t>(V), 62);
  target[3] = -1;  // out of range: NaN on both sides
  std::vector<float> ref(static_cast<size_t>(R));
  {
    std::vector<float> l = logits;
    std::vector<int32_t> t = target;
    Tensor o(ref.data(), DType::F32, {R});
    cpu->token_logprob(Tensor(l.data(), DType::F32, {R, V}), Tensor(t.data(), DType::I32, {R}), o);
  }
  DevBuf dl(*gpu, logits.size() * 4), dt(*gpu, target.size() * 4), dout(*gpu, ref.size() * 4);
  dl.upload(logits);
  dt.upload(target);
  dout.poison();
  Tensor o = dout.view(DType::F32, {R});
  gpu->token_logprob(dl.view(DType::F32, {R, V}), dt.view(DType::I32, {R}), o);
  auto got = dout.download<float>(ref.size());
  EXPECT_TRUE(std::isnan(got[3]) && std::isnan(ref[3]));
  got[3] = ref[3] = 0.0f;
  EXPECT_CLOSE_TO_CPU(got, ref, 1e-5);
}

// The chosen tokens' log-probabilities and the K most likely tokens per row with theirs: ids equal to the
// CPU's (ties to the lower id: the logits are on a coarse grid, so ties are many), values within 1e-5; NaN
// logits never chosen, a row of mostly NaN pads with -1; K = 20 over LLaDA's vocabulary, and K = V.
TEST_F(CudaTest, TopLogprobsMatchCpu) {
  struct Case {
    int64_t R, V, K;
  };
  for (const Case& c : {Case{40, 3001, 20}, Case{8, 126464, 20}, Case{5, 7, 7}, Case{3, 1000, 1}}) {
    SCOPED_TRACE("V " + std::to_string(c.V) + " K " + std::to_string(c.K));
    auto logits = random_floats(static_cast<size_t>(c.R * c.V), 63, 3.0f);
    for (float& x : logits) x = std::round(x * 8.0f) / 8.0f;
    if (c.R > 2 && c.V > 30) {
      for (int64_t v = 0; v < c.V; ++v)
        if (v % 97 != 0) logits[static_cast<size_t>(2 * c.V + v)] = NAN;  // row 2: a few real logits
      logits[static_cast<size_t>(c.V + 5)] = -INFINITY;
    }
    const auto n = static_cast<size_t>(c.R * c.K);
    auto tok = random_ids(static_cast<size_t>(c.R), static_cast<int32_t>(c.V), 64);
    tok[0] = -1;  // out of range: NaN on both sides
    std::vector<int32_t> ref_ids(n);
    std::vector<float> ref_lp(n), ref_ch(tok.size());
    {
      std::vector<float> l = logits;
      std::vector<int32_t> t = tok;
      Tensor i(ref_ids.data(), DType::I32, {c.R, c.K}), o(ref_lp.data(), DType::F32, {c.R, c.K}),
          ch(ref_ch.data(), DType::F32, {c.R});
      cpu->top_logprobs(Tensor(l.data(), DType::F32, {c.R, c.V}), Tensor(t.data(), DType::I32, {c.R}), ch, i,
                        o);
    }
    DevBuf dl(*gpu, logits.size() * 4), dt(*gpu, tok.size() * 4), dch(*gpu, tok.size() * 4), di(*gpu, n * 4),
        dlp(*gpu, n * 4);
    dl.upload(logits);
    dt.upload(tok);
    dch.poison();
    di.poison();
    dlp.poison();
    Tensor ch = dch.view(DType::F32, {c.R}), i = di.view(DType::I32, {c.R, c.K}),
           o = dlp.view(DType::F32, {c.R, c.K});
    gpu->top_logprobs(dl.view(DType::F32, {c.R, c.V}), dt.view(DType::I32, {c.R}), ch, i, o);
    const auto ids = di.download<int32_t>(n);
    auto lp = dlp.download<float>(n);
    auto chosen = dch.download<float>(tok.size());
    EXPECT_EQ(ids, ref_ids);
    for (size_t j = 0; j < chosen.size(); ++j) {
      EXPECT_EQ(std::isnan(chosen[j]), std::isnan(ref_ch[j])) << j;
      if (std::isnan(chosen[j]) || std::isnan(ref_ch[j])) chosen[j] = ref_ch[j] = 0.0f;
    }
    EXPECT_CLOSE_TO_CPU(chosen, ref_ch, 1e-5);
    for (size_t j = 0; j < n; ++j) {  // NaN where the CPU has NaN (row 2's normaliser, padding)
      EXPECT_EQ(std::isnan(lp[j]), std::isnan(ref_lp[j])) << j;
      if (std::isnan(lp[j]) || std::isnan(ref_lp[j])) lp[j] = ref_lp[j] = 0.0f;
    }
    EXPECT_CLOSE_TO_CPU(lp, ref_lp, 1e-5);
  }
}

// SparseD selection on the GPU vs the double reference (and the CPU backend): every tie-free query
// block selects the same tiles; shapes include GQA, a prompt boundary inside a block, partial blocks,
// head dims 32 / 64 / 128, blocks of 256 (two 128-row passes per query block), fewer query rows than
// keys, and a canvas whose key blocks exceed the default 48 KiB of shared memory. Blocks that are a
// multiple of 8 take the tensor-core kernel, block 1 the scalar one.
TEST_F(CudaTest, SparseSelectMatchesReference) {
  using Case = test::SparseSelectCase;
  for (const Case& c : {Case{4, 2, 64, 300, 300, 32, 0.3f, 150}, Case{2, 1, 128, 257, 257, 64, 0.5f, 64},
                        Case{2, 2, 32, 100, 100, 16, 0.0f, 0}, Case{1, 1, 64, 64, 16000, 1, 0.3f, 9000},
                        Case{4, 2, 128, 600, 1400, 256, 0.5f, 512}}) {
    SCOPED_TRACE("hq " + std::to_string(c.hq) + " mk " + std::to_string(c.mk));
    auto q = random_floats(static_cast<size_t>(c.mq * c.hq * c.d), 21, 2.0f);
    auto k = random_floats(static_cast<size_t>(c.mk * c.hkv * c.d), 22, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const auto ref =
        sparse_select_reference(q, k, c.mq, c.mk, c.hq, c.hkv, c.d, scale, c.block, c.rho, c.prompt);
    SparseSelectParams p;
    p.scale = scale;
    p.block = c.block;
    p.rho = c.rho;
    p.n_prompt_keys = c.prompt;
    DevBuf dq(*gpu, q.size() * 4), dk(*gpu, k.size() * 4), dm(*gpu, ref.mask.size());
    dq.upload(q);
    dk.upload(k);
    dm.poison();
    gpu->sparse_select(dq.view(DType::F32, {c.mq, c.hq * c.d}), dk.view(DType::F32, {c.mk, c.hkv * c.d}),
                       c.hq, c.hkv, c.d, p, static_cast<uint8_t*>(dm.p));
    const auto got = dm.download<uint8_t>(ref.mask.size());
    std::vector<uint8_t> cpu_mask(ref.mask.size());
    cpu->sparse_select(Tensor(q.data(), DType::F32, {c.mq, c.hq * c.d}),
                       Tensor(k.data(), DType::F32, {c.mk, c.hkv * c.d}), c.hq, c.hkv, c.d, p,
                       cpu_mask.data());
    int clear = 0;
    for (int64_t r = 0; r < c.hq * ref.n_qb; ++r) {
      if (!ref.clear[static_cast<size_t>(r)]) continue;
      ++clear;
      for (int64_t kb = 0; kb < ref.n_kb; ++kb) {
        const auto i = static_cast<size_t>(r * ref.n_kb + kb);
        ASSERT_EQ(got[i], ref.mask[i]) << "query block row " << r << " key block " << kb;
        ASSERT_EQ(cpu_mask[i], ref.mask[i]) << "query block row " << r << " key block " << kb;
      }
    }
    EXPECT_GT(clear, c.hq * ref.n_qb / 2);
  }
}

}  // namespace
}  // namespace tessera
