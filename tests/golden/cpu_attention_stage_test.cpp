// The CPU bf16 attention's K / V staging (CpuBackendOptions::stage_kv: K and V rounded to bf16 once per
// call into a planned buffer instead of per query tile) on a whole model: the same bits, so the same
// decisions. The kernel-level checks (every mask, packed sequences, sparse patterns) are in
// unit/cpu_attention_bf16_test.cpp.
#include <gtest/gtest.h>

#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(CpuAttentionStage, AWholeModelDecidesTheSameWithAndWithoutStaging) {
  if (resolve_cpu_attention(CpuAttention::Auto) != CpuAttention::BF16) GTEST_SKIP() << "no AVX-512 BF16";
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto staged = Engine::load(dir, EngineOptions{});
  auto gathered = Engine::load(dir, EngineOptions{.cpu_stage_kv = false});
  ASSERT_EQ(staged->model().act_dtype(), DType::BF16);
  EXPECT_TRUE(staged->model().options().stage_kv_bf16);  // the graph plans the buffer
  EXPECT_FALSE(gathered->model().options().stage_kv_bf16);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 200; ++i) prompt.push_back(static_cast<int32_t>(40 + (37 * i) % 3000));
  // SparseD with blocks of 32: every 32 canvas rows are a query tile, so a 456-token canvas has 15 and
  // its K / V are staged whatever the thread count; then a dense canvas, staged or not by the threads.
  for (const bool sparse : {true, false}) {
    GenerateOptions o;
    o.gen_length = 256;
    o.block_length = 64;
    o.steps = 32;
    o.stop_at_eos = false;
    o.sparse = sparse;
    o.sparse_block = 32;
    const GenerateResult want = generate(*gathered, prompt, o);
    const GenerateResult got = generate(*staged, prompt, o);
    EXPECT_EQ(got.tokens, want.tokens) << (sparse ? "sparse" : "dense");
    EXPECT_EQ(got.order, want.order) << (sparse ? "sparse" : "dense");
    EXPECT_GE(staged->max_planned_peak(), gathered->max_planned_peak());
  }
}

}  // namespace
}  // namespace tessera
