// The tensor / expert parallel layout without ranks (tests/mpi runs it over mpirun): which layouts a
// model takes, one rank's geometry and parameters against hand-computed values, and the graph's
// all-reduces.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/model.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(ParallelLayout, OneRanksParametersAreTheWholeMinusTheOtherRanksShares) {
  const ModelConfig c = named_geometry("llada-8b");  // 32 layers, d 4096, 32 heads and key / value heads
  ASSERT_EQ(c.hidden, 4096);
  ASSERT_EQ(c.intermediate, 12288);
  // Per layer the attention projections (4 d^2) and the FFN (3 d x 12288) split in two; the rest whole.
  const int64_t split_per_layer = 4 * 4096LL * 4096 + 3 * 4096LL * 12288;
  EXPECT_EQ(parallel_rank_params(c, 2, 1), c.param_count() - 32 * split_per_layer / 2);
  EXPECT_EQ(parallel_rank_params(c, 2, 1), 4525920256LL);
  // On the CPU the untied LM head (126464 x 4096) splits by vocabulary too: 63232 rows each.
  ASSERT_FALSE(c.tie_embeddings);
  EXPECT_EQ(parallel_rank_params(c, 2, 1, true), 4525920256LL - 63232LL * 4096);
  EXPECT_EQ(vocab_share(c.vocab, 2, 1).lo, 63232);
  EXPECT_EQ(vocab_share(126465, 2, 1).n, 63233);  // an odd vocabulary: the last rank's one row more
  const ModelConfig r = tensor_parallel_rank_config(c, 2);
  EXPECT_EQ(r.n_heads, 16);
  EXPECT_EQ(r.n_kv_heads, 16);
  EXPECT_EQ(r.intermediate, 6144);
  EXPECT_EQ(r.kv_cache_bytes_per_token(2), c.kv_cache_bytes_per_token(2) / 2);
}

TEST(ParallelLayout, MoreRanksThanKeyValueHeadsReplicateThem) {
  const ModelConfig c = named_geometry("llada2-flash");  // 32 heads, 4 key / value heads, 256 experts
  const ModelConfig r = tensor_parallel_rank_config(c, 8, 8);
  EXPECT_EQ(r.n_heads, 4);
  EXPECT_EQ(r.n_kv_heads, 1);  // each rank keeps the one its 4 query heads read
  EXPECT_EQ(r.intermediate, 9216 / 8);
  EXPECT_EQ(r.moe.shared_inter, 1024 / 8);
  // 31 MoE layers lose 7/8 of their 256 experts of 3 x 4096 x 1024.
  EXPECT_EQ(parallel_rank_params(c, 8, 8), r.param_count() - 31LL * 224 * 3 * 4096 * 1024);
  // The whole model is LLaDA2.0-flash's 100B (6.1B active).
  EXPECT_NEAR(static_cast<double>(c.param_count()) / 1e9, 102.9, 0.5);
  EXPECT_NEAR(static_cast<double>(c.active_param_count()) / 1e9, 6.1, 0.2);
}

TEST(ParallelLayout, LayoutsAModelCannotTakeAreOneLineErrors) {
  const ModelConfig dense = named_geometry("llada-8b"), moe = named_geometry("llada2-flash");
  test::expect_error([&] { check_tensor_parallel(dense, 3); },
                     "--tp 3: the model's attention heads (32) cannot be split evenly over 3 ranks");
  ModelConfig odd = dense;
  odd.n_heads = 12;
  odd.n_kv_heads = 8;
  test::expect_error([&] { check_tensor_parallel(odd, 6); },
                     "--tp 6: the model's key / value heads (8) cannot be split evenly over 6 ranks (nor "
                     "replicated: 6 is not a multiple of 8)");
  test::expect_error([&] { check_tensor_parallel(dense, 1, 2); }, "--ep 2: this model has no experts");
  test::expect_error([&] { check_tensor_parallel(moe, 1, 512); },
                     "--ep 512: more ranks than the model's 256 experts");
  test::expect_error([&] { check_tensor_parallel(moe, 1, 3); },
                     "--ep 3: the model's experts (256) cannot be split evenly over 3 ranks");
  ModelConfig ffn = dense;
  ffn.intermediate = 12289;
  test::expect_error([&] { check_tensor_parallel(ffn, 2); },
                     "--tp 2: the model's FFN intermediate size (12289) cannot be split evenly over 2 ranks");
}

// One rank's graph: an all-reduce after each attention and each split FFN; rank 0 adds its partial sums
// to the residual, the others write theirs over it.
TEST(ParallelLayout, TheGraphSumsEverySplitSubLayer) {
  const ModelConfig c = named_geometry("llada2-mid");  // 4 layers: 1 dense, 3 MoE with a shared expert
  for (int rank : {0, 1}) {
    const ModelConfig r = tensor_parallel_rank_config(c, 2, 2);
    GraphOptions o = graph_options(r, DType::BF16);
    o.tp_rank = rank;
    o.tp_size = 2;
    o.ep_size = 2;
    const graph::GraphTemplate g =
        build_dense_graph(shape_only_weights(r, DType::BF16), o, OutputMode::Sample);
    int reduces = 0;
    for (const graph::OpDecl& op : g.ops()) {
      reduces += op.kind == graph::OpKind::AllReduce ? 1 : 0;
      if (op.kind == graph::OpKind::Gemm && (op.name == "attn_output" || op.name == "ffn_down")) {
        EXPECT_EQ(op.p.accumulate, rank == 0) << op.name << ", rank " << rank;
      }
      if (op.kind == graph::OpKind::Gemm && op.name == "ffn_down_shexp") {
        EXPECT_TRUE(op.p.accumulate);
      }
    }
    EXPECT_EQ(reduces, 2 * 4) << "rank " << rank;  // attention and FFN of each of the 4 layers
  }
}

// An LM head split by vocabulary: the logits are the rank's columns, the sampler combines the ranks'
// summaries (never the logits), and logits asked for whole are gathered after the GEMM.
TEST(ParallelLayout, TheSplitLmHeadSamplesItsColumnsAndGathersOnlyWholeLogits) {
  const ModelConfig c = named_geometry("llada-8b");
  const ModelConfig r = tensor_parallel_rank_config(c, 4);
  GraphOptions o = graph_options(r, DType::BF16);
  o.tp_rank = 1;
  o.tp_size = 4;
  o.vocab_split = vocab_share(c.vocab, 4, 1);
  for (OutputMode mode :
       {OutputMode::Sample, OutputMode::Logits, OutputMode::LogProb, OutputMode::SampleLogprobs}) {
    const graph::GraphTemplate g = build_dense_graph(shape_only_weights(r, DType::BF16), o, mode);
    int gathers = 0, split_ops = 0;
    for (const graph::OpDecl& op : g.ops()) {
      gathers += op.kind == graph::OpKind::GatherVocab ? 1 : 0;
      if (op.kind == graph::OpKind::GatherGemm) {
        EXPECT_EQ(g.tensors()[static_cast<size_t>(op.out[0].id)].cols, 126464 / 4);
      }
      if (op.kind == graph::OpKind::SampleRows || op.kind == graph::OpKind::TokenLogprob ||
          op.kind == graph::OpKind::TopLogprobs || op.kind == graph::OpKind::GatherVocab) {
        EXPECT_EQ(op.p.vocab_split.lo, 126464 / 4);
        EXPECT_EQ(op.p.vocab_split.vocab, 126464);
        ++split_ops;
      }
    }
    EXPECT_EQ(gathers, mode == OutputMode::Logits ? 1 : 0);
    EXPECT_EQ(split_ops, mode == OutputMode::SampleLogprobs ? 2 : 1);
  }
}

}  // namespace
}  // namespace tessera
