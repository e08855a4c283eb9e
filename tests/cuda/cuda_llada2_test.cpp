// LLaDA2.0 on the GPU, on the tiny checkpoint in the real layout (tools/make_tiny_checkpoint.py --family
// llada2: a dense first layer then MoE layers with a sigmoid router, expert bias, 4 groups keeping 2,
// renormalised top-3 scaled by 2.5 and a shared expert; fused query_key_value, qk-norm, RoPE on 8 of 16
// dims, block-causal attention). The logits match the numpy reference with the bounds and the routing-tie
// exclusion of the CPU test (Reference.Llada2F32 / Llada2Bf16), and block-diffusion generation decides
// on the GPU what it decides on the CPU (where it matches the reference loop:
// Llada2.GenerateMatchesTheReferenceLoop).
#include "cuda_test_util.h"
#include "decode/generate.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::cuda_engine_options;
using test::CudaTest;

// Default attention block 32: the canvases of 33 and 130 tokens span several blocks, the last one partial.
TEST_F(CudaTest, TinyLlada2MatchesTheNumpyReferenceF32) {
  test::check_logits_against_reference("llada2", "--seed 3", cuda_engine_options(Precision::F32), 1e-3);
}

// bf16: rows whose router margin is below 5e-3 (sigmoid score units) may route differently and are left
// out, as on the CPU; the margins come from the reference, so the same rows are kept as there.
TEST_F(CudaTest, TinyLlada2MatchesTheNumpyReferenceBf16) {
  test::check_logits_against_reference("llada2", "--seed 3", cuda_engine_options(Precision::BF16), 3e-2);
}

// f32, greedy: the same tokens, the same positions decided at every step and the same number of steps
// as the CPU engine, for the block / step / threshold cases of the CPU test; `cache` as in
// GenerateOptions (prefix and dual are exact for block-causal models).
void expect_generate_matches_cpu(const std::string& cache) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  auto on_cpu = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  auto on_gpu = Engine::load(dir, cuda_engine_options(Precision::F32));
  const auto prompt = test::llada2_prompt(on_cpu->vocab_size());
  for (GenerateOptions o : test::llada2_generate_cases(on_cpu->config().eos_id)) {
    o.cache = parse_kv_cache(cache);
    const GenerateResult want = generate(*on_cpu, prompt, o);
    const GenerateResult got = generate(*on_gpu, prompt, o);
    EXPECT_EQ(on_gpu->attention_block(), o.block_length);
    EXPECT_FALSE(got.tokens.empty()) << "block " << o.block_length << " cache " << cache;
    EXPECT_EQ(got.tokens, want.tokens) << "block " << o.block_length << " cache " << cache;
    EXPECT_EQ(got.order, want.order) << "block " << o.block_length << " cache " << cache;
    EXPECT_EQ(got.steps_run, want.steps_run) << "block " << o.block_length << " cache " << cache;
  }
}

TEST_F(CudaTest, TinyLlada2GenerateMatchesTheCpu) {
  expect_generate_matches_cpu("none");
}

TEST_F(CudaTest, TinyLlada2CachedGenerateMatchesTheCpu) {
  expect_generate_matches_cpu("prefix");
  expect_generate_matches_cpu("dual");
}

}  // namespace
}  // namespace tessera
