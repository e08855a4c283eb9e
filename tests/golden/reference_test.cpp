// tessera's forward against the independent numpy reference (tests/reference/reference.py) on tiny
// random LLaDA, Dream, LLaDA-MoE and LLaDA2 checkpoints in the real layouts; plus mask-only, packing and
// chunking equivalences on the same models.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/engine.h"
#include "io/config.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::all_positions;
using test::random_canvas;

// The comparison (canvases, bf16 rows near a routing tie left out) is test::check_logits_against_reference,
// which the CUDA tests run on --device cuda. Bounds: f32 1e-5 (the observed relative errors are 2e-7 to
// 1.7e-6 on every family), bf16 3e-2.
void check_against_reference(const std::string& family, Precision prec, double tol,
                             const std::string& args = "--seed 3") {
  test::check_logits_against_reference(family, args, EngineOptions{.precision = prec}, tol);
}

TEST(Reference, LladaF32) {
  check_against_reference("llada", Precision::F32, 1e-5);
}
TEST(Reference, DreamF32GqaBiasShift) {
  check_against_reference("dream", Precision::F32, 1e-5);
}
TEST(Reference, LladaBf16) {
  check_against_reference("llada", Precision::BF16, 3e-2);
}
TEST(Reference, DreamBf16) {
  check_against_reference("dream", Precision::BF16, 3e-2);
}

// LLaDA-MoE: 2 layers, hidden 64, 4 heads, qk-norm, 8 experts top-2 of inter 32, softmax router
// without renormalisation.
TEST(Reference, LladaMoeF32) {
  check_against_reference("llada_moe", Precision::F32, 1e-5);
}
TEST(Reference, LladaMoeBf16) {
  check_against_reference("llada_moe", Precision::BF16, 3e-2);
}
// A dense first layer (moe_layer_freq 0), a shared expert, renormalised and scaled top-3 weights,
// partial rotary (half of each head), GQA.
constexpr const char* kMoeVariant =
    "--seed 5 --layers 3 --first-dense 1 --shared-inter 24 --top-k 3 --norm-topk --routed-scale 1.5 "
    "--partial-rotary 0.5 --kv-heads 2";
TEST(Reference, LladaMoeVariantF32) {
  check_against_reference("llada_moe", Precision::F32, 1e-5, kMoeVariant);
}
TEST(Reference, LladaMoeVariantBf16) {
  check_against_reference("llada_moe", Precision::BF16, 3e-2, kMoeVariant);
}

// LLaDA2.0 (the LLaDA2.0-mini layout in small, tools/make_tiny_checkpoint.py --family llada2): 3 layers
// (a dense first layer, then MoE), hidden 64, 4 heads / 2 KV heads, fused query_key_value, qk-norm,
// RoPE on 8 of 16 dims, 16 experts top-3 in 4 groups keeping 2, sigmoid scores with a non-zero
// expert_bias, renormalised and scaled by 2.5, one shared expert; block-causal attention with the
// default block 32 (L = 33 and 130: not multiples of the block, more than one block).
TEST(Reference, Llada2F32) {
  check_against_reference("llada2", Precision::F32, 1e-5);
}
TEST(Reference, Llada2Bf16) {
  check_against_reference("llada2", Precision::BF16, 3e-2);
}

TEST(LladaMoe, ParameterCountsMatchTheCheckpoint) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", kMoeVariant);
  const ModelConfig c = load_config(dir);
  const auto [n, experts] = test::checkpoint_params(dir);
  EXPECT_EQ(c.param_count(), n);
  // Active: 3 of the 8 routed experts of each of the 2 MoE layers.
  EXPECT_EQ(c.active_param_count(), n - experts + experts * 3 / 8);
}

TEST(LladaMoe, CliInspectAndGenerate) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", kMoeVariant);
  const std::string bin = TESSERA_BINARY;
  std::string out;
  ASSERT_EQ(test::run_command(bin + " inspect " + dir.string(), &out), 0) << out;
  for (const char* want : {"family       llada-moe (model_type lladamoe)", "qk-norm, RoPE on 8 of 16 dims",
                           "experts      8 routed (inter 32), top-3, 1 shared (inter 24); 2 of 3 layers MoE",
                           "router       softmax, top-k renormalised, scale 1.5", "active "}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
  for (const char* mode : {"--raw", "--chat"}) {
    ASSERT_EQ(test::run_command(bin + " generate -m " + dir.string() + " -p \"Once upon a time\" " + mode +
                                    " --gen-length 16 --steps 8 --block-length 8 --no-progress",
                                &out),
              0)
        << out;
    EXPECT_NE(out.find(" steps · "), std::string::npos) << out;  // the stats line
  }
}

TEST(MaskOnlyLogits, EqualTheMatchingRowsOfFullLogits) {
  for (const char* fam : {"llada", "dream", "llada_moe", "llada2"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir);
    const int64_t V = e->vocab_size(), n = 300;
    const auto canvas = random_canvas(n, V, 9, e->mask_token(), 0.5);
    std::vector<float> full(static_cast<size_t>(n * V));
    e->logits(canvas, all_positions(n), full);
    std::vector<int32_t> masked;
    for (int64_t i = 0; i < n; ++i) {
      if (canvas[static_cast<size_t>(i)] == e->mask_token()) masked.push_back(static_cast<int32_t>(i));
    }
    ASSERT_GT(masked.size(), 100u);
    std::vector<float> part(masked.size() * static_cast<size_t>(V));
    e->logits(canvas, masked, part);
    for (size_t r = 0; r < masked.size(); ++r) {
      const float* a = part.data() + r * static_cast<size_t>(V);
      const float* b = full.data() + static_cast<size_t>(masked[r]) * static_cast<size_t>(V);
      ASSERT_LE(test::rel_error(a, b, static_cast<size_t>(V)), 1e-6) << fam << " position " << masked[r];
    }
  }
}

TEST(Packing, TwoSequencesInOneForwardEqualSeparateForwards) {
  TESSERA_TINY_OR_SKIP(dir, "dream", "--seed 5");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size();
  const auto a = random_canvas(41, V, 1, e->mask_token(), 0.5),
             b = random_canvas(70, V, 2, e->mask_token(), 0.5);
  const std::vector<int32_t> pa = {0, 3, 40}, pb = {1, 69};
  std::vector<float> sa(3 * static_cast<size_t>(V)), sb(2 * static_cast<size_t>(V)),
      both(5 * static_cast<size_t>(V));
  e->logits(a, pa, sa);
  e->logits(b, pb, sb);
  const SeqInput seqs[2] = {{a, pa}, {b, pb}};
  e->forward_logits(seqs, both);
  EXPECT_LE(test::rel_error(both.data(), sa.data(), sa.size()), 1e-5);
  EXPECT_LE(test::rel_error(both.data() + sa.size(), sb.data(), sb.size()), 1e-5);
}

void check_chunking(const std::string& family, const std::string& args) {
  TESSERA_TINY_OR_SKIP(dir, family, args);
  auto plain = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  auto chunked = Engine::load(dir, EngineOptions{.precision = Precision::F32, .k_ffn = 3, .k_logits = 4});
  const int64_t V = plain->vocab_size(), n = 97;
  const auto canvas = random_canvas(n, V, 3, plain->mask_token(), 0.6);
  const auto pos = all_positions(n);
  std::vector<float> x(static_cast<size_t>(n * V)), y(x.size());
  plain->logits(canvas, pos, x);
  chunked->logits(canvas, pos, y);
  EXPECT_LE(test::rel_error(y.data(), x.data(), x.size()), 1e-6) << family;
  EXPECT_LT(chunked->last_step().planned_peak, plain->last_step().planned_peak);
  // Sampling through the chunked logits loop gives the same tokens.
  SampleParams sp;
  std::vector<int32_t> t1(static_cast<size_t>(n)), t2(t1.size());
  std::vector<float> c1(t1.size()), c2(t1.size());
  plain->predict(canvas, pos, sp, t1, c1);
  chunked->predict(canvas, pos, sp, t2, c2);
  EXPECT_EQ(t1, t2) << family;
  EXPECT_LE(test::rel_error(c2.data(), c1.data(), c1.size()), 1e-6) << family;
}

TEST(Chunking, ChunkedFfnAndLogitsEqualUnchunked) {
  check_chunking("llada", "--seed 6");
}
TEST(Chunking, ChunkedMoeFfnEqualsUnchunked) {
  check_chunking("llada_moe", kMoeVariant);
}
TEST(Chunking, ChunkedLlada2EqualsUnchunked) {
  check_chunking("llada2", "--seed 6");
}

TEST(Errors, BadTokensAndTooLongCanvasFailClearly) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 3");
  auto e = Engine::load(dir);
  std::vector<int32_t> bad = {1, 2, static_cast<int32_t>(e->vocab_size())};
  std::vector<float> out(static_cast<size_t>(e->vocab_size()));
  const std::vector<int32_t> p = {0};
  EXPECT_THROW(e->logits(bad, p, out), Error);
  std::vector<int32_t> long_canvas(static_cast<size_t>(e->config().max_positions + 1), 1);
  try {
    e->logits(long_canvas, p, out);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("exceeds the model's context"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace tessera
