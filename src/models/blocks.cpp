// The shared transformer blocks as a graph template: every intermediate tensor is named, sizes are
// symbolic (n_query rows; ffn_rows inside the FFN chunk loop; logit_rows inside the logits loop).
#include <cmath>

#include "models/model.h"

namespace tessera {

using graph::OpKind;
using graph::OpParams;
using graph::Ref;
using graph::Sym;

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

  const int embed = g.add_weight("token_embd", -1, w.embed);
  const int x = g.add_tensor("x", -1, DType::F32, Sym::NQuery, o.hidden);  // residual stream
  g.add_op(OpKind::Embed, "embed", -1, {{tokens}, {embed}}, {{x}});

  OpParams rope;
  rope.head_dim = static_cast<int>(o.head_dim);
  rope.rotary_dim = static_cast<int>(o.head_dim);
  rope.rope_theta = o.rope_theta;
  rope.neox = o.neox;
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
    g.add_op(OpKind::Rope, "rope_q", l, {{q}, {q_pos}}, {{q}}, rope);
    g.add_op(OpKind::Rope, "rope_k", l, {{k}, {q_pos}}, {{k}}, rope);
    const int att = g.add_tensor("attn_out", l, o.act, Sym::NQuery, q_width);
    g.add_op(OpKind::Attention, "attention", l, {{q}, {k}, {v}, {cu_q}, {cu_k}, {q_pos}, {k_pos}}, {{att}},
             attn);
    g.add_op(OpKind::Gemm, "attn_output", l, {{att}, {wo}, {x}}, {{x}}, acc);  // x += att wo^T

    // FFN, chunked over query rows (K_ffn); x is read and written chunk by chunk.
    const int fn = g.add_weight("ffn_norm.weight", l, L.ffn_norm);
    const int wg = g.add_weight("ffn_gate.weight", l, L.w_gate);
    const int wu = g.add_weight("ffn_up.weight", l, L.w_up);
    const int wd = g.add_weight("ffn_down.weight", l, L.w_down);
    g.begin_loop(Sym::NQuery, Sym::FfnRows);
    g.add_barrier(x);
    const int m = g.add_tensor("ffn_norm", l, o.act, Sym::FfnRows, o.hidden);
    g.add_op(OpKind::RmsNorm, "ffn_norm", l, {{x, true}, {fn}}, {{m}}, norm);
    const int gate = g.add_tensor("ffn_gate", l, o.act, Sym::FfnRows, o.intermediate);
    const int up = g.add_tensor("ffn_up", l, o.act, Sym::FfnRows, o.intermediate);
    g.add_op(OpKind::Gemm, "ffn_gate", l, {{m}, {wg}}, {{gate}});
    g.add_op(OpKind::Gemm, "ffn_up", l, {{m}, {wu}}, {{up}});
    const int act = g.add_tensor("ffn_act", l, o.act, Sym::FfnRows, o.intermediate);
    g.add_alias(act, gate);  // silu(gate) * up written over gate
    g.add_op(OpKind::Swiglu, "ffn_act", l, {{gate}, {up}}, {{act}});
    g.add_op(OpKind::Gemm, "ffn_down", l, {{act}, {wd}, {x, true}}, {{x, true}}, acc);
    g.end_loop();
  }

  const int wf = g.add_weight("output_norm.weight", -1, w.final_norm);
  const int hn = g.add_tensor("output_norm", -1, o.act, Sym::NQuery, o.hidden);
  g.add_op(OpKind::RmsNorm, "output_norm", -1, {{x}, {wf}}, {{hn}}, norm);
  const int lm = g.add_weight("output.weight", -1, w.lm_head);

  // Mask-only logits: gather-GEMM over the selected rows, chunked over them (K_logits).
  if (mode == OutputMode::Logits) {
    const int logits = g.add_output("logits", DType::F32, Sym::NLogits, o.vocab);
    g.begin_loop(Sym::NLogits, Sym::LogitRows);
    g.add_barrier(hn);
    g.add_barrier(logit_rows);
    g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{logits, true}});
    g.end_loop();
    return g;
  }
  const int out_a = mode == OutputMode::Sample ? g.add_output("token", DType::I32, Sym::NLogits)
                                               : g.add_output("logprob", DType::F32, Sym::NLogits);
  const int out_b = mode == OutputMode::Sample ? g.add_output("conf", DType::F32, Sym::NLogits) : -1;
  g.begin_loop(Sym::NLogits, Sym::LogitRows);
  g.add_barrier(hn);
  g.add_barrier(logit_rows);
  g.add_barrier(mode == OutputMode::Sample ? row_keys : target);
  const int logits = g.add_tensor("logits", -1, DType::F32, Sym::LogitRows, o.vocab);
  g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{logits}});
  if (mode == OutputMode::Sample) {
    g.add_op(OpKind::SampleRows, "sample", -1, {{logits}, {row_keys, true}}, {{out_a, true}, {out_b, true}});
  } else {
    g.add_op(OpKind::TokenLogprob, "logprob", -1, {{logits}, {target, true}}, {{out_a, true}});
  }
  g.end_loop();
  return g;
}

}  // namespace tessera
