// Quantized (GGUF) weights kept quantized on the GPU (cuda_keeps_quantized: q8_0, q4_0, q4_K, q5_K,
// q6_K): gemm dequantizes tiles of rows and multiplies them with cuBLASLt, embed dequantizes the rows it
// reads. Against the CPU backend on the same blocks: the dequantized values bit for bit (embed, and gemm
// of one-hot rows, which picks single weights out of every tile), gemm with bias / accumulate / several
// M and an N spanning partial tiles within the bf16 bound of the plain GEMM tests; then GGUF models
// loaded on CUDA keep those tensors quantized and compute what the CPU computes.
#include <filesystem>

#include "cuda_test_util.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "tiny_models.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::CudaTest;
using test::DevBuf;
using test::from_bf16;
using test::random_floats;
using test::to_bf16;

constexpr GgmlType kTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K,
                               GgmlType::Q6_K};

// Random blocks of type t for rows x cols values: every byte random (quants, sub-block scales), the f16
// scales set to moderate values (random bytes there could be inf or NaN). As tests/unit/quant_gemm_test.cpp.
std::vector<uint8_t> random_blocks(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
  const GgmlTypeInfo* info = ggml_type_info(t);
  std::vector<uint8_t> b(static_cast<size_t>(rows) * ggml_bytes(t, cols));
  uint64_t s = seed;
  for (auto& x : b) x = static_cast<uint8_t>((s = rng_mix(s)) >> 56);
  const std::vector<size_t> f16_at = t == GgmlType::Q4_K || t == GgmlType::Q5_K ? std::vector<size_t>{0, 2}
                                     : t == GgmlType::Q6_K                      ? std::vector<size_t>{208}
                                                                                : std::vector<size_t>{0};
  for (size_t blk = 0; blk < b.size() / info->block_bytes; ++blk) {
    uint8_t* p = b.data() + blk * info->block_bytes;
    for (size_t o : f16_at) {
      const uint16_t h = f32_to_f16(static_cast<float>(((s = rng_mix(s)) % 2000) + 1) * 1e-5f);
      p[o] = static_cast<uint8_t>(h & 0xff);
      p[o + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return b;
}

std::string type_name(GgmlType t) {
  return ggml_type_info(t)->name;
}

// ---- embed: the dequantized rows bit for bit -----------------------------------------------------
TEST_F(CudaTest, QuantizedEmbedIsBitExact) {
  const int64_t V = 300, D = 512, R = 37;
  for (GgmlType t : kTypes) {
    const auto blocks = random_blocks(t, V, D, 11 + static_cast<uint64_t>(t));
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 97 + 5) % V);
    ids.back() = static_cast<int32_t>(V - 1);
    Tensor host_table(const_cast<uint8_t*>(blocks.data()), DType::F32, {V, D});
    host_table.quant = static_cast<int16_t>(t);
    DevBuf dt(*gpu, blocks.size()), di(*gpu, ids.size() * 4), dout(*gpu, static_cast<size_t>(R * D) * 4);
    dt.upload(blocks);
    di.upload(ids);
    Tensor table = dt.view(DType::F32, {V, D});
    table.quant = static_cast<int16_t>(t);
    for (DType out : {DType::F32, DType::BF16}) {
      std::vector<uint8_t> want(static_cast<size_t>(R * D) * dtype_size(out));
      Tensor co(want.data(), out, {R, D});
      cpu->embed(Tensor(ids.data(), DType::I32, {R}), host_table, co);
      dout.poison();
      Tensor go = dout.view(out, {R, D});
      gpu->embed(di.view(DType::I32, {R}), table, go);
      const auto got = dout.download<uint8_t>(want.size());
      EXPECT_EQ(got, want) << type_name(t) << (out == DType::F32 ? " f32" : " bf16");
    }
  }
}

// ---- gemm --------------------------------------------------------------------------------------
// The CPU backend's gemm of the same blocks (host memory) and the GPU's; returns both outputs as f32.
struct QuantGemmRun {
  std::vector<float> cpu, gpu;
};
QuantGemmRun run_quant_gemm(Backend& cpu, Backend& gpu, GgmlType t, int64_t m, int64_t n, int64_t k, DType in,
                            DType out, bool bias, bool acc, const std::vector<float>& a_f32, uint64_t seed) {
  const auto blocks = random_blocks(t, n, k, seed);
  auto bv = random_floats(static_cast<size_t>(n), seed + 2);
  auto c0 = random_floats(static_cast<size_t>(m * n), seed + 3);
  const bool bf = in == DType::BF16;
  std::vector<uint16_t> ab = to_bf16(a_f32);
  std::vector<float> af = a_f32;
  QuantGemmRun r;
  std::vector<float> cref = c0;
  std::vector<uint16_t> cref_b(static_cast<size_t>(m * n));
  {
    Tensor ta(bf ? static_cast<void*>(ab.data()) : af.data(), in, {m, k});
    Tensor tw(const_cast<uint8_t*>(blocks.data()), in, {n, k});
    tw.quant = static_cast<int16_t>(t);
    Tensor tb(bv.data(), DType::F32, {n});
    Tensor tc(out == DType::F32 ? static_cast<void*>(cref.data()) : cref_b.data(), out, {m, n});
    cpu.gemm(ta, tw, bias ? &tb : nullptr, tc, acc);
  }
  r.cpu = out == DType::F32 ? cref : from_bf16(cref_b);
  DevBuf da(gpu, af.size() * 4), dw(gpu, blocks.size()), db(gpu, bv.size() * 4), dc(gpu, c0.size() * 4);
  if (bf) {
    da.upload(ab);
  } else {
    da.upload(af);
  }
  dw.upload(blocks);
  db.upload(bv);
  if (acc) {
    dc.upload(c0);
  } else {
    dc.poison();
  }
  Tensor ta = da.view(in, {m, k}), tw = dw.view(in, {n, k}), tb = db.view(DType::F32, {n});
  tw.quant = static_cast<int16_t>(t);
  Tensor tc = dc.view(out, {m, n});
  gpu.gemm(ta, tw, bias ? &tb : nullptr, tc, acc);
  r.gpu =
      out == DType::F32 ? dc.download<float>(cref.size()) : from_bf16(dc.download<uint16_t>(cref_b.size()));
  return r;
}

struct QuantGemmCase {
  GgmlType type;
  int64_t m, n, k;
  DType in, out;
  bool bias, acc;
};

class CudaQuantGemm : public CudaTest, public ::testing::WithParamInterface<QuantGemmCase> {};

TEST_P(CudaQuantGemm, MatchesCpu) {
  const QuantGemmCase c = GetParam();
  const uint64_t seed = 500 + static_cast<uint64_t>(c.m * 31 + c.n + c.k + static_cast<int64_t>(c.type));
  const QuantGemmRun r = run_quant_gemm(*cpu, *gpu, c.type, c.m, c.n, c.k, c.in, c.out, c.bias, c.acc,
                                        random_floats(static_cast<size_t>(c.m * c.k), seed), seed);
  SCOPED_TRACE(type_name(c.type));
  EXPECT_CLOSE_TO_CPU(r.gpu, r.cpu, c.out == DType::F32 ? 1e-3 : 1e-2);
}

std::vector<QuantGemmCase> quant_gemm_cases() {
  std::vector<QuantGemmCase> v;
  // One tile: M of 1, 7 and 300, every type, with and without bias / accumulate, bf16 and f32 outputs
  // (a bias needs an f32 output on CUDA: cuBLASLt's bias epilogue takes the output's dtype).
  for (GgmlType t : kTypes) {
    v.push_back({t, 1, 300, 512, DType::BF16, DType::F32, false, false});
    v.push_back({t, 7, 300, 512, DType::BF16, DType::BF16, false, false});
    v.push_back({t, 7, 300, 512, DType::BF16, DType::F32, true, false});
    v.push_back({t, 300, 300, 512, DType::BF16, DType::F32, true, true});
  }
  // Several tiles: quant_tile_rows(600, 65536, bf16) = 256, so tiles of 256, 256 and 88 rows (the last
  // neither a multiple of the tile nor of 128); f32 activations (--precision f32): tiles of 128 rows.
  v.push_back({GgmlType::Q4_K, 7, 600, 65536, DType::BF16, DType::F32, true, true});
  v.push_back({GgmlType::Q8_0, 300, 600, 65536, DType::BF16, DType::F32, true, false});
  v.push_back({GgmlType::Q5_K, 7, 600, 65536, DType::BF16, DType::BF16, false, false});
  v.push_back({GgmlType::Q6_K, 1, 600, 65536, DType::BF16, DType::F32, false, false});
  v.push_back({GgmlType::Q4_K, 7, 300, 65536, DType::F32, DType::F32, true, true});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuantGemm, ::testing::ValuesIn(quant_gemm_cases()),
                         test::case_index_name);

// One-hot rows of `a` pick single weights: c[i, j] = w[j, k_i] exactly (one bf16 product by 1, f32
// accumulation of zeros), so every tile's dequantization is checked bit for bit against the CPU's.
TEST_F(CudaTest, QuantizedGemmTilesAreBitExact) {
  EXPECT_EQ(quant_tile_rows(600, 65536, DType::BF16), 256);
  for (GgmlType t : kTypes) {
    const int64_t m = 5, n = 600, k = 65536;
    std::vector<float> a(static_cast<size_t>(m * k), 0.0f);
    const int64_t at[m] = {0, 31, 255, 4097, k - 1};
    for (int64_t i = 0; i < m; ++i) a[static_cast<size_t>(i * k + at[i])] = 1.0f;
    const QuantGemmRun r = run_quant_gemm(*cpu, *gpu, t, m, n, k, DType::BF16, DType::F32, false, false, a,
                                          900 + static_cast<uint64_t>(t));
    ASSERT_EQ(r.gpu.size(), r.cpu.size());
    size_t differ = 0;
    for (size_t i = 0; i < r.cpu.size(); ++i) differ += r.gpu[i] != r.cpu[i] ? 1 : 0;
    EXPECT_EQ(differ, 0u) << type_name(t);
  }
}

// ---- GGUF models on CUDA -------------------------------------------------------------------------
fs::path fixtures() {
  return test::source_dir() / "tests/data/gguf";
}

// The q4_K fixture (q4_K GEMM weights, LM head and embedding table) and the LLaDA-MoE fixture
// requantized to q8_0 / q4_0 (its routed experts converted at load on CUDA, the rest kept): the GPU keeps
// the tensors quantized, in the memory the CPU takes for them plus the tile, and its logits are the CPU's.
TEST_F(CudaTest, GgufQuantizedWeightsStayQuantizedOnTheGpu) {
  const fs::path moe_q = test::temp_dir("cuda_gguf_quant") / "llada-moe-q8_0.gguf";
  test::requantize_gguf(fixtures() / "llada-moe-bf16.gguf", moe_q);
  for (const fs::path& path : {fixtures() / "llada-w256-q4_k.gguf", moe_q}) {
    // Fixture vocabularies hold 300 tokens; 296 is the mask.
    const std::vector<int32_t> tokens = {62, 245, 121, 45, 171, 253, 49, 127, 296, 296, 296, 296, 244, 66};
    const auto pos = test::all_positions(static_cast<int64_t>(tokens.size()));
    // bf16 routing may flip near-tied experts between devices: the MoE model in f32 only.
    const std::vector<Precision> precisions = path == moe_q
                                                  ? std::vector<Precision>{Precision::F32}
                                                  : std::vector<Precision>{Precision::F32, Precision::BF16};
    for (Precision p : precisions) {
      auto on_cpu = Engine::load(path, EngineOptions{.precision = p});
      auto on_gpu = Engine::load(path, test::cuda_engine_options(p));
      auto converted = Engine::load(path, [&] {
        EngineOptions o = test::cuda_engine_options(p);
        o.dequantize = true;
        return o;
      }());
      const DenseWeights& w = on_gpu->model().weights();
      EXPECT_TRUE(w.lm_head.quantized()) << path;
      EXPECT_TRUE(w.embed.quantized()) << path;
      EXPECT_TRUE(w.layers[0].wq.quantized()) << path;
      EXPECT_FALSE(converted->model().weights().lm_head.quantized()) << path;
      for (const LayerWeights& L : w.layers) EXPECT_LT(L.experts.quant[0], 0) << path;
      EXPECT_LT(on_gpu->model().weight_bytes(), converted->model().weight_bytes()) << path;
      const auto V = static_cast<size_t>(on_cpu->vocab_size());
      std::vector<float> lc(tokens.size() * V), lg(lc.size()), ld(lc.size());
      on_cpu->logits(tokens, pos, lc);
      on_gpu->logits(tokens, pos, lg);
      converted->logits(tokens, pos, ld);
      EXPECT_EQ(test::count_nan(lg), 0u) << path;
      // The tile was allocated at load: forwards allocate nothing.
      const int64_t free0 = on_gpu->backend().device_free_bytes();
      on_gpu->logits(tokens, pos, lg);
      EXPECT_EQ(on_gpu->backend().device_free_bytes(), free0) << path;
      const double err = test::rel_error(lg.data(), lc.data(), lc.size());
      std::printf("%-24s %s: GPU kept quantized vs CPU: relative error %.1e; weights %zu vs %zu converted\n",
                  path.filename().c_str(), p == Precision::F32 ? "f32" : "bf16", err,
                  on_gpu->model().weight_bytes(), converted->model().weight_bytes());
      EXPECT_LE(err, p == Precision::F32 ? 1e-3 : 3e-2) << path;
      // Converting at load computes the same weights (bf16: its embedding table rounded to bf16).
      EXPECT_LE(test::rel_error(ld.data(), lg.data(), lg.size()), p == Precision::F32 ? 1e-3 : 3e-2) << path;
    }
  }
}

// Greedy generation (f32) on the q4_K fixture: the GPU with quantized weights decides what the CPU does.
TEST_F(CudaTest, GgufQuantizedGenerateMatchesTheCpu) {
  const fs::path path = fixtures() / "llada-w256-q4_k.gguf";
  auto on_cpu = Engine::load(path, EngineOptions{.precision = Precision::F32});
  auto on_gpu = Engine::load(path, test::cuda_engine_options(Precision::F32));
  ASSERT_TRUE(on_gpu->model().weights().lm_head.quantized());
  GenerateOptions o;
  o.gen_length = 16;
  o.steps = 16;
  o.block_length = 8;
  o.temperature = 0.0f;
  o.alg = Unmask::LowConfidence;
  const std::vector<int32_t> prompt = {62, 245, 121, 45, 171, 253, 49};
  const GenerateResult want = generate(*on_cpu, prompt, o);
  const GenerateResult got = generate(*on_gpu, prompt, o);
  EXPECT_FALSE(got.tokens.empty());
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.order, want.order);
}

}  // namespace
}  // namespace tessera
