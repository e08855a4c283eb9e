// The tensor / expert parallel layout without ranks (tests/mpi runs it over mpirun): which layouts a
// model takes, one rank's geometry and parameters against hand-computed values, and the graph's
// all-reduces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "backend/backend.h"
#include "models/model.h"
#include "test_util.h"
#include "tiny_models.h"

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
  test::expect_error([&] { check_tensor_parallel(named_geometry("diffusiongemma-mid"), 2); },
                     "--tp 2: the diffusion-gemma family has no tensor or expert parallelism yet");
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

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.ndim, b.ndim) << what;
  if (a.ndim == 0) return;
  for (int i = 0; i < a.ndim; ++i)
    ASSERT_EQ(a.shape[static_cast<size_t>(i)], b.shape[static_cast<size_t>(i)]) << what;
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.quant, b.quant) << what;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << what;
}

constexpr Tensor LayerWeights::*kLayerTensors[] = {
    &LayerWeights::attn_norm, &LayerWeights::wq,         &LayerWeights::wk,     &LayerWeights::wv,
    &LayerWeights::bq,        &LayerWeights::bk,         &LayerWeights::bv,     &LayerWeights::wo,
    &LayerWeights::q_norm,    &LayerWeights::k_norm,     &LayerWeights::lora_a, &LayerWeights::lora_b,
    &LayerWeights::ffn_norm,  &LayerWeights::w_gate,     &LayerWeights::w_up,   &LayerWeights::w_down,
    &LayerWeights::router,    &LayerWeights::expert_bias};

// One expert's projection p (gate, up, down) as bind_experts binds it; an empty tensor where the table is
// null (another rank's expert).
Tensor expert(const MoeExperts& e, int p, int x) {
  const void* ptr = e.table[p * e.n_experts + x];
  if (ptr == nullptr) return Tensor();
  Tensor t(const_cast<void*>(ptr), e.dtype, {p < 2 ? e.inter : e.hidden, p < 2 ? e.hidden : e.inter});
  t.quant = e.quant[static_cast<size_t>(p)];
  return t;
}

size_t layer_bytes(const LayerWeights& L) {
  size_t n = 0;
  for (auto f : kLayerTensors) n += (L.*f).ndim > 0 ? (L.*f).nbytes() : 0;
  for (int p = 0; p < 3; ++p)
    for (int x = 0; x < L.experts.n_experts; ++x)
      n += expert(L.experts, p, x).ndim > 0 ? expert(L.experts, p, x).nbytes() : 0;
  return n;
}

// A load with a shard plan takes each layer's share as the family binds it (and never binds the other
// ranks' experts): the same weights, byte for byte, as sharding the whole model after loading it, while
// holding at most the share plus one whole layer (the LM head's share taken before the first layer's). f32
// compute from bf16 files: every weight is a copy the load makes, none a view of the file.
TEST(ParallelLayout, AShardedLoadKeepsTheSameShareWithoutHoldingTheWholeModel) {
  struct Case {
    const char* family;
    const char* args;
    int tp, ep;
  };
  const Case cases[] = {{"llada", "--layers 4", 2, 1},
                        {"dream", "--layers 4", 2, 1},
                        {"nemotron", "--layers 4 --nemotron-lora 4", 2, 1},
                        {"llada_moe", "--layers 4 --first-dense 1 --shared-inter 32", 1, 4},
                        {"llada_moe", "--layers 4 --first-dense 1 --shared-inter 32", 2, 2},
                        {"llada2", "--layers 4", 2, 2}};
  auto backend = make_cpu_backend();
  for (const Case& k : cases) {
    TESSERA_TINY_OR_SKIP(dir, k.family, k.args);
    const int world = std::max(k.tp, k.ep);
    for (int rank = 0; rank < world; ++rank) {
      const std::string what = std::string(k.family) + " --tp " + std::to_string(k.tp) + " --ep " +
                               std::to_string(k.ep) + ", rank " + std::to_string(rank);
      const ShardPlan plan{rank, k.tp, k.ep};
      auto loaded = Model::load(dir, *backend, Precision::F32, false, plan);
      auto whole = Model::load(dir, *backend, Precision::F32);
      const size_t all = whole->weight_bytes();
      EXPECT_EQ(whole->peak_weight_bytes(), all) << what;
      size_t largest_layer = 0;
      for (const LayerWeights& L : whole->weights().layers)
        largest_layer = std::max(largest_layer, layer_bytes(L));
      whole->shard_parallel(plan);
      EXPECT_EQ(loaded->weight_bytes(), whole->weight_bytes()) << what;
      EXPECT_LE(loaded->peak_weight_bytes(), loaded->weight_bytes() + largest_layer) << what;
      EXPECT_LT(loaded->peak_weight_bytes(), all) << what;
      EXPECT_EQ(loaded->options().n_heads, whole->options().n_heads) << what;
      EXPECT_EQ(loaded->options().intermediate, whole->options().intermediate) << what;
      EXPECT_EQ(loaded->options().vocab_split.n, whole->options().vocab_split.n) << what;
      EXPECT_EQ(loaded->options().ep_size, k.ep) << what;
      const DenseWeights &a = loaded->weights(), &b = whole->weights();
      expect_same(a.embed, b.embed, what + ": embedding");
      expect_same(a.final_norm, b.final_norm, what + ": final norm");
      expect_same(a.lm_head, b.lm_head, what + ": LM head");
      ASSERT_EQ(a.layers.size(), b.layers.size());
      int null_experts = 0;
      for (size_t l = 0; l < a.layers.size(); ++l) {
        const LayerWeights &x = a.layers[l], &y = b.layers[l];
        const std::string at = what + ", layer " + std::to_string(l);
        for (size_t f = 0; f < std::size(kLayerTensors); ++f)
          expect_same(x.*kLayerTensors[f], y.*kLayerTensors[f], at + ", weight " + std::to_string(f));
        ASSERT_EQ(x.experts.n_experts, y.experts.n_experts) << at;
        EXPECT_EQ(x.experts.local_lo, y.experts.local_lo) << at;
        EXPECT_EQ(x.experts.local_hi, y.experts.local_hi) << at;
        EXPECT_EQ(x.experts.overwrite, y.experts.overwrite) << at;
        for (int p = 0; p < 3; ++p) {
          for (int e = 0; e < x.experts.n_experts; ++e) {
            const Tensor ex = expert(x.experts, p, e);
            expect_same(ex, expert(y.experts, p, e), at + ", expert " + std::to_string(e));
            EXPECT_EQ(ex.ndim > 0, x.experts.local(e)) << at << ", expert " << e;
            null_experts += ex.ndim == 0 ? 1 : 0;
          }
        }
      }
      EXPECT_EQ(null_experts > 0, k.ep > 1) << what;
    }
  }
}

}  // namespace
}  // namespace tessera
