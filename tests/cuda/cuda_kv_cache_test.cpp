// The KV cache on the GPU: scatter_rows against the CPU backend (rows not named keep their values),
// and a cached step of the engine (rows [lo, hi) computed, the rest from the cache of an earlier
// canvas) against the numpy reference, as tests/golden/kv_cache_test.cpp does on the CPU; Window-Diffusion's
// row-list steps against the reference and windowed generations against the CPU engine.
#include "core/error.h"
#include "cuda_test_util.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::CudaTest;
using test::DevBuf;
using test::random_floats;

TEST_F(CudaTest, ScatterRowsMatchesCpu) {
  for (const int64_t cols : {256, 6, 12}) {  // 16-byte rows and 4-byte rows (f32), bf16 below
    for (DType t : {DType::F32, DType::BF16}) {
      if (t == DType::BF16 && cols % 2 != 0) continue;
      const int64_t dst_rows = 50, src_rows = 17;
      const size_t es = dtype_size(t);
      std::vector<unsigned char> src(static_cast<size_t>(src_rows * cols) * es),
          dst(static_cast<size_t>(dst_rows * cols) * es);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(rng_mix(i) & 0xFF);
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<unsigned char>(rng_mix(i + 999) & 0xFF);
      std::vector<int32_t> rows;
      for (int64_t i = 0; i < src_rows; ++i) rows.push_back(static_cast<int32_t>((i * 7 + 3) % dst_rows));
      DevBuf ds(*gpu, src.size()), dd(*gpu, dst.size()), dr(*gpu, rows.size() * 4);
      ds.upload(src);
      dd.upload(dst);
      dr.upload(rows);
      std::vector<unsigned char> ref = dst;
      Tensor ref_t(ref.data(), t, {dst_rows, cols});
      cpu->scatter_rows(Tensor(src.data(), t, {src_rows, cols}), Tensor(rows.data(), DType::I32, {src_rows}),
                        ref_t);
      Tensor out = dd.view(t, {dst_rows, cols});
      gpu->scatter_rows(ds.view(t, {src_rows, cols}), dr.view(DType::I32, {src_rows}), out);
      EXPECT_EQ(dd.download<unsigned char>(dst.size()), ref) << "cols " << cols;
    }
  }
}

// f32 rows rounded into a bf16 cache, and read back: bit-identical to the CPU backend.
TEST_F(CudaTest, ScatterRowsIntoBf16AndConvertMatchCpu) {
  const int64_t cols = 72, dst_rows = 40, src_rows = 9;
  const auto src = random_floats(static_cast<size_t>(src_rows * cols), 41, 3.0f);
  std::vector<uint16_t> dst(static_cast<size_t>(dst_rows * cols), 0x3f80);  // 1.0
  std::vector<int32_t> rows;
  for (int64_t i = 0; i < src_rows; ++i) rows.push_back(static_cast<int32_t>((i * 5 + 2) % dst_rows));
  std::vector<uint16_t> ref = dst;
  Tensor ref_t(ref.data(), DType::BF16, {dst_rows, cols});
  std::vector<float> s = src;
  cpu->scatter_rows(Tensor(s.data(), DType::F32, {src_rows, cols}),
                    Tensor(rows.data(), DType::I32, {src_rows}), ref_t);
  std::vector<float> ref32(ref.size());
  Tensor ref32_t(ref32.data(), DType::F32, {dst_rows, cols});
  cpu->convert(ref_t, ref32_t);
  DevBuf ds(*gpu, src.size() * 4), dd(*gpu, dst.size() * 2), dr(*gpu, rows.size() * 4),
      d32(*gpu, ref32.size() * 4);
  ds.upload(src);
  dd.upload(dst);
  dr.upload(rows);
  d32.poison();
  Tensor out = dd.view(DType::BF16, {dst_rows, cols});
  gpu->scatter_rows(ds.view(DType::F32, {src_rows, cols}), dr.view(DType::I32, {src_rows}), out);
  EXPECT_EQ(dd.download<uint16_t>(dst.size()), ref);
  Tensor out32 = d32.view(DType::F32, {dst_rows, cols});
  gpu->convert(out, out32);
  EXPECT_CLOSE_TO_CPU(d32.download<float>(ref32.size()), ref32, 0.0);
}

// KV cache reads (the keys of a packed cached step, gathered from the pool): bit-identical to the CPU
// backend for f32 and bf16 rows (copies) and bf16 widened to f32; every destination row is written.
TEST_F(CudaTest, GatherRowsMatchesCpu) {
  for (const int64_t cols : {256, 6, 72}) {
    for (const auto& [from, to] : {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
                                   std::pair{DType::BF16, DType::F32}}) {
      const int64_t src_rows = 50, dst_rows = 23;
      std::vector<unsigned char> src(static_cast<size_t>(src_rows * cols) * dtype_size(from));
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(rng_mix(i + 7) & 0x7F);
      std::vector<int32_t> rows;
      for (int64_t i = 0; i < dst_rows; ++i) rows.push_back(static_cast<int32_t>((i * 11 + 5) % src_rows));
      const size_t dst_bytes = static_cast<size_t>(dst_rows * cols) * dtype_size(to);
      std::vector<unsigned char> ref(dst_bytes);
      Tensor ref_t(ref.data(), to, {dst_rows, cols});
      cpu->gather_rows(Tensor(src.data(), from, {src_rows, cols}),
                       Tensor(rows.data(), DType::I32, {dst_rows}), ref_t);
      DevBuf ds(*gpu, src.size()), dd(*gpu, dst_bytes), dr(*gpu, rows.size() * 4);
      ds.upload(src);
      dr.upload(rows);
      dd.poison();
      Tensor out = dd.view(to, {dst_rows, cols});
      gpu->gather_rows(ds.view(from, {src_rows, cols}), dr.view(DType::I32, {dst_rows}), out);
      EXPECT_EQ(dd.download<unsigned char>(dst_bytes), ref) << "cols " << cols;
    }
  }
}

TEST_F(CudaTest, KvCacheStepMatchesTheNumpyReference) {
  for (const char* fam : {"llada", "dream", "llada_moe", "llada2"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, test::cuda_engine_options(Precision::F32));
    const test::CachedStep c = test::run_cached_step(*e, dir);
    ASSERT_EQ(c.reference.size(), c.got.size());
    EXPECT_LE(test::rel_error(c.got.data(), c.reference.data(), c.got.size()), 1e-3) << fam;
  }
}

TEST_F(CudaTest, RowListStepMatchesTheNumpyReference) {
  test::expect_row_list_steps_match_reference(test::cuda_engine_options(Precision::F32), 1e-3);
}

// f32, greedy: phases, refreshes, row-list steps and pruning decide on the GPU what they decide on the
// CPU (where they match reference.py generate --window: tests/golden/window_test.cpp).
TEST_F(CudaTest, WindowGenerateMatchesTheCpu) {
  for (const char* fam : {"llada", "dream"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 7");
    auto on_cpu = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    auto on_gpu = Engine::load(dir, test::cuda_engine_options(Precision::F32));
    const auto prompt = test::random_canvas(9, on_cpu->vocab_size() - 8, 5, 0, 0.0);
    GenerateOptions o;
    o.alg = std::string(fam) == "dream" ? Unmask::Entropy : Unmask::LowConfidence;
    o.gen_length = 48;
    o.block_length = std::string(fam) == "dream" ? 48 : 16;
    o.steps = 24;
    o.stop_at_eos = false;
    o.window = true;
    o.window_ex = 16;
    o.window_in = 6;
    for (const int refresh : {4, 0}) {
      o.window_refresh = refresh;
      const GenerateResult want = generate(*on_cpu, prompt, o);
      const GenerateResult got = generate(*on_gpu, prompt, o);
      EXPECT_EQ(got.tokens, want.tokens) << fam << " refresh " << refresh;
      EXPECT_EQ(got.order, want.order) << fam << " refresh " << refresh;
      EXPECT_EQ(got.steps_run, want.steps_run) << fam << " refresh " << refresh;
    }
  }
}

}  // namespace
}  // namespace tessera
