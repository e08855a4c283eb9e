// LLaDA2.0 end to end on the tiny checkpoint in the real layout (tools/make_tiny_checkpoint.py --family
// llada2): the attention block follows the generation's block length, block-diffusion generation
// matches the numpy reference loop token for token, the fused q/k/v weights are views of the file,
// malformed configs fail clearly, and the CLI inspects and generates.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

constexpr const char* kArgs = "--seed 7";

using test::all_positions;

TEST(Llada2, ConfigHasTheRealGeometry) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  const ModelConfig c = load_config(dir);
  EXPECT_EQ(c.family, Family::LLaDA2);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.rotary(), 8);  // partial_rotary_factor 0.5 of head_dim 16
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.mask_block, 32);
  EXPECT_FALSE(c.is_moe_layer(0));  // first_k_dense_replace 1
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.moe.score, RouterScore::Sigmoid);
  EXPECT_TRUE(c.moe.expert_bias);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
  EXPECT_EQ(c.moe.shared_inter, 32);
  EXPECT_FLOAT_EQ(c.moe.routed_scale, 2.5f);
  // config.json names no mask / eos token, as the real one: they come from tokenizer.json.
  EXPECT_EQ(c.mask_id, 300 - 4);
  EXPECT_EQ(c.eos_id, 300 - 5);
  const auto [n, experts] = test::checkpoint_params(dir);
  EXPECT_EQ(c.param_count(), n);
  EXPECT_EQ(c.active_param_count(), n - experts + experts * 3 / 16);
}

// q, k and v are row ranges of attention.query_key_value, mapped from the file without a copy.
TEST(Llada2, FusedQkvRowsAreViewsOfTheFile) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto e = Engine::load(dir);  // bf16 checkpoint, bf16 compute: zero copy on the CPU
  const Checkpoint ck = Checkpoint::open(dir);
  const StTensor& fused = ck.get("model.layers.1.attention.query_key_value.weight", {128, 64});
  const LayerWeights& L = e->model().weights().layers[1];
  // Consecutive row ranges of one buffer (the engine's own mapping of the file), holding the file's bytes.
  const auto* q = static_cast<const char*>(L.wq.data);
  EXPECT_EQ(static_cast<const char*>(L.wk.data), q + 64 * 64 * 2);
  EXPECT_EQ(static_cast<const char*>(L.wv.data), q + (64 + 32) * 64 * 2);
  EXPECT_EQ(std::memcmp(q, fused.data, fused.bytes), 0);
  EXPECT_EQ(L.wq.rows(), 64);
  EXPECT_EQ(L.wk.rows(), 32);
  EXPECT_EQ(L.wv.rows(), 32);
}

// The block-causal mask follows the block set on the engine; the reference with the same block agrees,
// and a row's logits do not depend on the tokens of later blocks.
TEST(Llada2, AttentionBlockFollowsTheGenerationBlock) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  EXPECT_EQ(e->attention_block(), 32);
  const int64_t V = e->vocab_size(), n = 45;
  auto canvas = test::ordinary_tokens(n, V, 11);
  const auto pos = all_positions(n);
  std::vector<float> b32(static_cast<size_t>(n * V)), b8(b32.size());
  e->logits(canvas, pos, b32);
  e->set_attention_block(8);
  EXPECT_EQ(e->attention_block(), 8);
  e->logits(canvas, pos, b8);
  const auto ref8 = test::reference_logits(dir, canvas, pos, V, nullptr, "--block 8");
  ASSERT_EQ(ref8.size(), b8.size());
  const double err = test::rel_error(b8.data(), ref8.data(), b8.size());
  EXPECT_LE(err, 5e-6);  // observed 1.3e-6
  std::printf("llada2 f32, block 8: relative error %.2e against the reference\n", err);
  // Rows of block 0 (positions 0..7) see the same keys under both blocks only in part: they differ.
  EXPECT_GT(test::rel_error(b8.data(), b32.data(), static_cast<size_t>(8 * V)), 1e-3);
  // Changing the tokens of the last block (40..44) leaves every earlier row unchanged.
  for (int64_t i = 40; i < n; ++i) canvas[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % (V - 8));
  std::vector<float> later(b8.size());
  e->logits(canvas, pos, later);
  EXPECT_EQ(test::rel_error(later.data(), b8.data(), static_cast<size_t>(40 * V)), 0.0);
  EXPECT_GT(test::rel_error(later.data() + 40 * V, b8.data() + 40 * V, static_cast<size_t>(5 * V)), 1e-3);
  EXPECT_THROW(e->set_attention_block(0), Error);
  EXPECT_THROW(e->set_attention_block(513), Error);  // beyond max_position_embeddings
}

TEST(Llada2, OnlyBlockCausalModelsTakeAnAttentionBlock) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 3");
  auto e = Engine::load(dir);
  EXPECT_EQ(e->attention_block(), 0);
  try {
    e->set_attention_block(32);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("no block-causal attention mask"), std::string::npos)
        << err.what();
  }
}

// Block diffusion with a confidence threshold against the numpy reference of LLaDA2's generate loop:
// the same tokens and the same positions decided at every step. The prompt (11 tokens) ends inside the
// first block; 30 generated tokens end inside a block (the canvas is padded to 48).
TEST(Llada2, GenerateMatchesTheReferenceLoop) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto prompt = test::llada2_prompt(e->vocab_size());
  for (const GenerateOptions& o : test::llada2_generate_cases(e->config().eos_id)) {
    const int block = o.block_length;
    const GenerateResult r = generate(*e, prompt, o);
    EXPECT_EQ(e->attention_block(), block);
    std::string out;
    const std::string cmd =
        test::python() + " " + (test::source_dir() / "tests/reference/reference.py").string() +
        " generate --model " + dir.string() + " --prompt " + test::join_ids(prompt) + " --gen-length " +
        std::to_string(o.gen_length) + " --steps " + std::to_string(o.steps) + " --block-length " +
        std::to_string(block) + " --threshold " + std::to_string(o.threshold);
    ASSERT_EQ(test::run_command(cmd, &out), 0) << cmd << "\n" << out;
    const auto j = nlohmann::json::parse(out);
    std::vector<int32_t> want;
    for (size_t i = prompt.size(); i < j["tokens"].size(); ++i) {
      const auto t = j["tokens"][i].get<int32_t>();
      if (t == e->config().eos_id) break;
      want.push_back(t);
    }
    EXPECT_EQ(r.tokens, want) << "block " << block;
    const auto order = j["order"].get<std::vector<std::vector<int32_t>>>();
    EXPECT_EQ(r.order, order) << "block " << block;
    size_t parallel = 0;
    for (const auto& s : order) parallel += s.size() > 1 ? 1 : 0;
    EXPECT_GT(parallel, 0u) << "no step decided several positions: the threshold was not exercised";
    EXPECT_LT(order.size(), 37u);  // fewer forwards than masked positions (11 + 30 padded to 48)
  }
}

TEST(Llada2, MalformedConfigsFailClearly) {
  using test::expect_config_error;
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  using J = nlohmann::json;
  expect_config_error(
      dir, "score", [](J& c) { c["score_function"] = "softmax"; }, "field 'score_function' is not supported");
  expect_config_error(
      dir, "kv", [](J& c) { c.erase("num_key_value_heads"); }, "missing field 'num_key_value_heads'");
  expect_config_error(
      dir, "experts", [](J& c) { c.erase("num_experts"); }, "missing field 'num_experts'");
  expect_config_error(
      dir, "group", [](J& c) { c["n_group"] = 3; }, "field 'n_group' must divide num_experts");
  expect_config_error(
      dir, "topk_group", [](J& c) { c["topk_group"] = 5; }, "field 'topk_group'");
  expect_config_error(
      dir, "dense", [](J& c) { c["first_k_dense_replace"] = 9; }, "field 'first_k_dense_replace'");
  expect_config_error(
      dir, "bias", [](J& c) { c["use_bias"] = true; }, "use_bias=true");
  expect_config_error(
      dir, "norm", [](J& c) { c["norm_topk_prob"] = false; }, "norm_topk_prob=false");
  expect_config_error(
      dir, "rotary", [](J& c) { c["partial_rotary_factor"] = 0.3; }, "field 'partial_rotary_factor'");
  expect_config_error(
      dir, "rotary_dim", [](J& c) { c["rotary_dim"] = 16; }, "field 'rotary_dim' contradicts");
  expect_config_error(
      dir, "scaling",
      [](J& c) {
        c["rope_scaling"] = J{{"type", "yarn"}};
      },
      "field 'rope_scaling'");
}

TEST(Llada2, CliInspectAndGenerate) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", kArgs);
  const std::string bin = TESSERA_BINARY;
  std::string out;
  ASSERT_EQ(test::run_command(bin + " inspect " + dir.string(), &out), 0) << out;
  for (const char* want :
       {"family       llada2 (model_type llada2_moe), block-causal", "heads        4 (kv 2",
        "qk-norm, RoPE on 8 of 16 dims",
        "experts      16 routed (inter 32), top-3, 1 shared (inter 32); 2 of 3 layers MoE",
        "router       sigmoid + expert bias, 4 groups keep 2, top-k renormalised, scale 2.5"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
  for (const char* mode : {"--raw", "--chat"}) {
    ASSERT_EQ(test::run_command(bin + " generate -m " + dir.string() + " -p \"Once upon a time\" " + mode +
                                    " --gen-length 20 --block-length 8 --threshold 0.05 --json 2>/dev/null",
                                &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["block_length"], 8);
    EXPECT_LE(j["tokens"].size(), 20u);
  }
  // Defaults of a block-causal model: blocks of 32 (the model's), any gen-length, threshold 0.95.
  ASSERT_EQ(test::run_command(
                bin + " generate -m " + dir.string() + " -p hi --gen-length 37 --json 2>/dev/null", &out),
            0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out)["block_length"], 32);
}

}  // namespace
}  // namespace tessera
