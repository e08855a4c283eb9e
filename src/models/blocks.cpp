// The shared transformer blocks as a graph template: every intermediate tensor is named, sizes are
// symbolic (n_query rows; ffn_rows inside the FFN chunk loop; logit_rows inside the logits loop).
#include <algorithm>
#include <cmath>

#include "models/model.h"

namespace tessera {

using graph::OpKind;
using graph::OpParams;
using graph::Ref;
using graph::Sym;

namespace {

// x[chunk] += down(silu(gate(m)) * up(m)) (accumulate; else x[chunk] = the FFN: a rank other than 0 whose
// partial sum the all-reduce adds); tensor names get `sfx` ("_shexp" for a shared expert).
void add_swiglu_ffn(graph::GraphTemplate& g, const LayerWeights& L, const GraphOptions& o, int l, int m,
                    int x, const std::string& sfx, bool accumulate) {
  const int64_t inter = L.w_gate.rows();
  const int wg = g.add_weight("ffn_gate" + sfx + ".weight", l, L.w_gate);
  const int wu = g.add_weight("ffn_up" + sfx + ".weight", l, L.w_up);
  const int wd = g.add_weight("ffn_down" + sfx + ".weight", l, L.w_down);
  const int gate = g.add_tensor("ffn_gate" + sfx, l, o.act, Sym::FfnRows, inter);
  const int up = g.add_tensor("ffn_up" + sfx, l, o.act, Sym::FfnRows, inter);
  g.add_op(OpKind::Gemm, "ffn_gate" + sfx, l, {{m}, {wg}}, {{gate}});
  g.add_op(OpKind::Gemm, "ffn_up" + sfx, l, {{m}, {wu}}, {{up}});
  const int act = g.add_tensor("ffn_act" + sfx, l, o.act, Sym::FfnRows, inter);
  g.add_alias(act, gate);  // silu(gate) * up written over gate
  g.add_op(OpKind::Swiglu, "ffn_act" + sfx, l, {{gate}, {up}}, {{act}});
  OpParams acc;
  acc.accumulate = accumulate;
  if (accumulate)
    g.add_op(OpKind::Gemm, "ffn_down" + sfx, l, {{act}, {wd}, {x, true}}, {{x, true}}, acc);
  else
    g.add_op(OpKind::Gemm, "ffn_down" + sfx, l, {{act}, {wd}}, {{x, true}}, acc);
}

// Routed experts: router logits -> (ids, weights) -> x[chunk] += sum of the selected experts.
void add_moe_ffn(graph::GraphTemplate& g, const LayerWeights& L, const GraphOptions& o, int l, int m, int x) {
  const MoeExperts& e = L.experts;
  const int64_t k = o.route.top_k;
  const int logits = g.add_tensor("ffn_router", l, DType::F32, Sym::FfnRows, e.n_experts);
  g.add_op(OpKind::Gemm, "ffn_router", l, {{m}, {g.add_weight("ffn_router.weight", l, L.router)}},
           {{logits}});
  std::vector<Ref> route_in{{logits}};
  if (L.expert_bias.ndim > 0) route_in.push_back({g.add_weight("ffn_router_bias.weight", l, L.expert_bias)});
  const int ids = g.add_tensor("moe_ids", l, DType::I32, Sym::FfnRows, k);
  const int weights = g.add_tensor("moe_weights", l, DType::F32, Sym::FfnRows, k);
  OpParams rp;
  rp.route = o.route;
  g.add_op(OpKind::MoeRoute, "moe_route", l, route_in, {{ids}, {weights}}, rp);
  // moe_scratch_bytes is linear in the rows: a per-row part and a fixed part.
  const size_t fixed = moe_scratch_bytes(0, static_cast<int>(k), e);
  const int scratch = g.add_scratch("moe_scratch", l, Sym::FfnRows,
                                    moe_scratch_bytes(1, static_cast<int>(k), e) - fixed, fixed);
  // The experts are reached through the table; these shape-only weights document (and count) them.
  std::vector<Ref> in{{m}, {ids}, {weights}, {x, true}};
  const char* names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
  for (int i = 0; i < 3; ++i) {
    const int64_t rows = i < 2 ? e.inter : e.hidden, cols = i < 2 ? e.hidden : e.inter;
    in.push_back({g.add_weight(names[i], l, Tensor(nullptr, e.dtype, {e.n_experts, rows, cols}))});
  }
  OpParams fp;
  fp.experts = e;
  g.add_op(OpKind::MoeFfn, "moe_ffn", l, in, {{scratch}, {x, true}}, fp);
}

}  // namespace

void add_kv_cache(graph::GraphTemplate& g, const GraphOptions& o, int l, int64_t kv_width, int cache_rows,
                  int kv_rows, int& keys, int& values) {
  // The cache pool holds the canvases of every request with a cache (the Engine's slots), in the compute
  // dtype: bf16 models hold half the bytes. cache_rows: the pool row of each computed row; kv_rows: the pool
  // rows of the step's keys, sequence after sequence, gathered (bf16 -> f32 is exact) into a planned
  // transient that attention reads like uncached keys.
  const DType cdt = o.act == DType::BF16 ? DType::BF16 : DType::F32;
  const int k = keys, v = values;
  keys = g.add_state("k_cache", l, cdt, Sym::NKv, kv_width);
  values = g.add_state("v_cache", l, cdt, Sym::NKv, kv_width);
  g.add_op(OpKind::ScatterRows, "k_cache", l, {{k}, {cache_rows}}, {{keys}});
  g.add_op(OpKind::ScatterRows, "v_cache", l, {{v}, {cache_rows}}, {{values}});
  const int k32 = g.add_tensor("k_all", l, DType::F32, Sym::NKv, kv_width);
  const int v32 = g.add_tensor("v_all", l, DType::F32, Sym::NKv, kv_width);
  g.add_op(OpKind::GatherRows, "k_all", l, {{keys}, {kv_rows}}, {{k32}});
  g.add_op(OpKind::GatherRows, "v_all", l, {{values}, {kv_rows}}, {{v32}});
  keys = k32;
  values = v32;
}

graph::GraphTemplate build_dense_graph(const DenseWeights& w, const GraphOptions& o, OutputMode mode) {
  graph::GraphTemplate g;
  const int64_t q_width = o.n_heads * o.head_dim, kv_width = o.n_kv_heads * o.head_dim;
  // Step inputs (written by the engine before op 0).
  const int tokens = g.add_input("tokens", DType::I32, Sym::NQuery);
  const int q_pos = g.add_input("q_pos", DType::I32, Sym::NQuery);
  const int k_pos = g.add_input("k_pos", DType::I32, Sym::NKv);
  const int cu_q = g.add_input("cu_q", DType::I32, Sym::NSeqsPlus1);
  const int cu_k = g.add_input("cu_k", DType::I32, Sym::NSeqsPlus1);
  const int logit_rows = g.add_input("logit_rows", DType::I32, Sym::NLogits);
  const int row_keys = g.add_input("row_keys", DType::I32, Sym::NLogits);
  const int target = mode == OutputMode::LogProb ? g.add_input("target", DType::I32, Sym::NLogits) : -1;
  const int cache_rows = o.kv_cache ? g.add_input("cache_rows", DType::I32, Sym::NQuery) : -1;
  const int kv_rows = o.kv_cache ? g.add_input("kv_rows", DType::I32, Sym::NKv) : -1;

  const int embed = g.add_weight("token_embd", -1, w.embed);
  const int x = g.add_tensor("x", -1, DType::F32, Sym::NQuery, o.hidden);  // residual stream
  g.add_op(OpKind::Embed, "embed", -1, {{tokens}, {embed}}, {{x}});

  OpParams rope_k;  // the keys' rotation; the queries' adds the Llama-4 position scale, if any
  rope_k.head_dim = static_cast<int>(o.head_dim);
  rope_k.rope = o.rope;
  rope_k.rope.pos_beta = 0.0f;
  OpParams rope_q = rope_k;
  rope_q.rope.pos_beta = o.rope.pos_beta;
  OpParams attn;
  attn.n_heads = static_cast<int>(o.n_heads);
  attn.n_kv_heads = static_cast<int>(o.n_kv_heads);
  attn.head_dim = static_cast<int>(o.head_dim);
  attn.scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
  attn.mask = o.mask;
  attn.block_size = o.mask_block;
  OpParams norm;
  norm.eps = o.eps;
  OpParams acc;
  acc.accumulate = true;

  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LayerWeights& L = w.layers[li];
    const int l = static_cast<int>(li);
    const int wn = g.add_weight("attn_norm.weight", l, L.attn_norm);
    const int wq = g.add_weight("attn_q.weight", l, L.wq);
    const int wk = g.add_weight("attn_k.weight", l, L.wk);
    const int wv = g.add_weight("attn_v.weight", l, L.wv);
    const int wo = g.add_weight("attn_output.weight", l, L.wo);
    const int h = g.add_tensor("attn_norm", l, o.act, Sym::NQuery, o.hidden);
    g.add_op(OpKind::RmsNorm, "attn_norm", l, {{x}, {wn}}, {{h}}, norm);
    const int q = g.add_tensor("q", l, DType::F32, Sym::NQuery, q_width);
    const int k = g.add_tensor("k", l, DType::F32, Sym::NQuery, kv_width);
    const int v = g.add_tensor("v", l, DType::F32, Sym::NQuery, kv_width);
    auto proj = [&](int out, int wt, const Tensor& bias, const char* name) {
      std::vector<Ref> in{{h}, {wt}};
      if (bias.data != nullptr) in.push_back({g.add_weight(std::string(name) + ".bias", l, bias)});
      g.add_op(OpKind::Gemm, name, l, in, {{out}});
    };
    proj(q, wq, L.bq, "attn_q");
    proj(k, wk, L.bk, "attn_k");
    proj(v, wv, L.bv, "attn_v");
    if (L.q_norm.ndim > 0) {  // qk-norm: RMSNorm of every head (groups of head_dim columns), in place
      g.add_op(OpKind::RmsNorm, "attn_q_norm", l, {{q}, {g.add_weight("attn_q_norm.weight", l, L.q_norm)}},
               {{q}}, norm);
      g.add_op(OpKind::RmsNorm, "attn_k_norm", l, {{k}, {g.add_weight("attn_k_norm.weight", l, L.k_norm)}},
               {{k}}, norm);
    }
    g.add_op(OpKind::Rope, "rope_q", l, {{q}, {q_pos}}, {{q}}, rope_q);
    g.add_op(OpKind::Rope, "rope_k", l, {{k}, {q_pos}}, {{k}}, rope_k);
    int keys = k, values = v;
    if (o.kv_cache) add_kv_cache(g, o, l, kv_width, cache_rows, kv_rows, keys, values);
    const int att = g.add_tensor("attn_out", l, o.act, Sym::NQuery, q_width);
    std::vector<Ref> attn_outs{{att}};
    if (o.stage_kv_bf16) {  // bf16 copies of K and V, planned like any tensor; and q, which attention
                            // may overwrite (its last use): cuDNN's output lands there first
      attn_outs.push_back({g.add_tensor("attn_kv_bf16", l, DType::BF16, Sym::NKv, 2 * kv_width)});
      if (o.attn_q_scratch) attn_outs.push_back({q});
    }
    g.add_op(OpKind::Attention, "attention", l, {{q}, {keys}, {values}, {cu_q}, {cu_k}, {q_pos}, {k_pos}},
             attn_outs, attn);
    // x += att wo^T. Tensor-parallel: each rank's heads give a partial sum; rank 0 adds its own to x, the
    // others write theirs over x, and the all-reduce after the adapter sums them.
    if (o.tp_size == 1 || o.tp_rank == 0) {
      g.add_op(OpKind::Gemm, "attn_output", l, {{att}, {wo}, {x}}, {{x}}, acc);
    } else {
      g.add_op(OpKind::Gemm, "attn_output", l, {{att}, {wo}}, {{x}}, OpParams{});
    }
    if (o.draft_adapter && L.lora_a.ndim > 0) {  // x += (att lora_a^T) lora_b^T (scale folded into b)
      const int mid = g.add_tensor("attn_lora", l, o.act, Sym::NQuery, L.lora_a.rows());
      g.add_op(OpKind::Gemm, "attn_lora_a", l, {{att}, {g.add_weight("attn_lora_a.weight", l, L.lora_a)}},
               {{mid}});
      g.add_op(OpKind::Gemm, "attn_lora_b", l,
               {{mid}, {g.add_weight("attn_lora_b.weight", l, L.lora_b)}, {x}}, {{x}}, acc);
    }
    if (o.tp_size > 1) g.add_op(OpKind::AllReduce, "attn_all_reduce", l, {{x}}, {{x}});

    // FFN, chunked over query rows (K_ffn); x is read and written chunk by chunk. A dense layer runs
    // the SwiGLU FFN, an MoE layer the routed experts and, if it has one, the shared expert.
    const int fn = g.add_weight("ffn_norm.weight", l, L.ffn_norm);
    g.begin_loop(Sym::NQuery, Sym::FfnRows);
    g.add_barrier(x);
    const int m = g.add_tensor("ffn_norm", l, o.act, Sym::FfnRows, o.hidden);
    g.add_op(OpKind::RmsNorm, "ffn_norm", l, {{x, true}, {fn}}, {{m}}, norm);
    // Parallel ranks (o.tp_size / o.ep_size > 1; models/tensor_parallel.cpp): a split FFN's ranks each
    // hold a partial sum, rank 0's added to x and the others' written over it, summed by one all-reduce.
    // A dense FFN splits with tensor parallelism. An MoE layer splits with expert parallelism (each rank
    // its experts; the shared expert split too under tensor parallelism, else rank 0's alone), otherwise
    // every rank runs it whole.
    const bool rank0 = o.tp_rank == 0;
    if (L.is_moe()) {
      const bool ep = o.ep_size > 1;
      add_moe_ffn(g, L, o, l, m, x);  // L.experts: the rank's experts, and whether it overwrites x
      if (L.w_gate.ndim > 0 && (!ep || o.tp_size > 1 || rank0))
        add_swiglu_ffn(g, L, o, l, m, x, "_shexp", true);
      if (ep) g.add_op(OpKind::AllReduce, "ffn_all_reduce", l, {{x, true}}, {{x, true}});
    } else if (L.w_gate.ndim > 0) {
      const bool split = o.tp_size > 1;
      add_swiglu_ffn(g, L, o, l, m, x, "", !split || rank0);
      if (split) g.add_op(OpKind::AllReduce, "ffn_all_reduce", l, {{x, true}}, {{x, true}});
    }
    g.end_loop();
  }

  const int wf = g.add_weight("output_norm.weight", -1, w.final_norm);
  const int hn = g.add_tensor("output_norm", -1, o.act, Sym::NQuery, o.hidden);
  g.add_op(OpKind::RmsNorm, "output_norm", -1, {{x}, {wf}}, {{hn}}, norm);
  const int lm = g.add_weight("output.weight", -1, w.lm_head);

  // Mask-only logits: gather-GEMM over the selected rows, chunked over them (K_logits). An LM head split
  // by vocabulary computes this rank's columns; the ops after it combine the ranks' summaries, and logits
  // asked for whole are gathered (GatherVocab).
  const bool split = o.vocab_split.n > 0;
  OpParams vp;
  vp.vocab_split = o.vocab_split;
  const int64_t vocab_cols = split ? o.vocab_split.n : o.vocab;
  if (mode == OutputMode::Logits) {
    const int logits = g.add_output("logits", DType::F32, Sym::NLogits, o.vocab);
    g.begin_loop(Sym::NLogits, Sym::LogitRows);
    g.add_barrier(hn);
    g.add_barrier(logit_rows);
    if (split) {
      const int mine = g.add_tensor("logits_share", -1, DType::F32, Sym::LogitRows, vocab_cols);
      g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{mine}});
      g.add_op(OpKind::GatherVocab, "gather_vocab", -1, {{mine}}, {{logits, true}}, vp);
    } else {
      g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{logits, true}});
    }
    g.end_loop();
    return g;
  }
  const bool sample = mode != OutputMode::LogProb;
  const int out_a = sample ? g.add_output("token", DType::I32, Sym::NLogits)
                           : g.add_output("logprob", DType::F32, Sym::NLogits);
  const int out_b = sample ? g.add_output("conf", DType::F32, Sym::NLogits) : -1;
  const int64_t n_top = std::min(kTopLogprobs, o.vocab);
  const bool with_lp = mode == OutputMode::SampleLogprobs;
  const int lp = with_lp ? g.add_output("logprob", DType::F32, Sym::NLogits) : -1;
  const int top_ids = with_lp ? g.add_output("top_ids", DType::I32, Sym::NLogits, n_top) : -1;
  const int top_lp = with_lp ? g.add_output("top_logprobs", DType::F32, Sym::NLogits, n_top) : -1;
  g.begin_loop(Sym::NLogits, Sym::LogitRows);
  g.add_barrier(hn);
  g.add_barrier(logit_rows);
  g.add_barrier(sample ? row_keys : target);
  const int logits = g.add_tensor("logits", -1, DType::F32, Sym::LogitRows, vocab_cols);
  g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{logits}});
  if (sample) {
    g.add_op(OpKind::SampleRows, "sample", -1, {{logits}, {row_keys, true}}, {{out_a, true}, {out_b, true}},
             vp);
  } else {
    g.add_op(OpKind::TokenLogprob, "logprob", -1, {{logits}, {target, true}}, {{out_a, true}}, vp);
  }
  if (with_lp) {  // the chosen tokens' log-probabilities and the most likely tokens'
    g.add_op(OpKind::TopLogprobs, "top_logprobs", -1, {{logits}, {out_a, true}},
             {{lp, true}, {top_ids, true}, {top_lp, true}}, vp);
  }
  g.end_loop();
  return g;
}

}  // namespace tessera
