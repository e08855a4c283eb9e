// DiffusionGemma's graph (shared/specs/diffusion-gemma.md sections 3 and 4): the Gemma 4 text stack in
// its two modes over the same weights. Every intermediate is named as in blocks.cpp; the FFN (dense MLP
// and experts side by side) runs in the chunk loop over query rows, the logits in the loop over logit
// rows, so the planner chunks both.
#include <algorithm>
#include <cmath>

#include "models/diffusion_gemma.h"

namespace tessera {

using graph::OpKind;
using graph::OpParams;
using graph::Ref;
using graph::Sym;

namespace {

OpParams norm_params(float eps, int64_t group = 0, bool accumulate = false) {
  OpParams p;
  p.eps = eps;
  p.group = group;
  p.accumulate = accumulate;
  return p;
}

// x (f32) *= s in place.
void scale(graph::GraphTemplate& g, const std::string& name, int l, Ref x, float s) {
  OpParams p;
  p.scale = s;
  g.add_op(OpKind::Scale, name, l, {x}, {x}, p);
}

// out = down(gelu_tanh(gate(m)) * up(m)), accumulated into `out` or written over it.
void add_geglu(graph::GraphTemplate& g, const GraphOptions& o, const std::string& pre, int l, Ref m,
               const Tensor& wg, const Tensor& wu, const Tensor& wd, Sym rows, Ref out, bool accumulate) {
  const int64_t inter = wg.rows();
  const int gate = g.add_tensor(pre + "gate", l, o.act, rows, inter);
  const int up = g.add_tensor(pre + "up", l, o.act, rows, inter);
  g.add_op(OpKind::Gemm, pre + "gate", l, {m, {g.add_weight(pre + "gate.weight", l, wg)}}, {{gate}});
  g.add_op(OpKind::Gemm, pre + "up", l, {m, {g.add_weight(pre + "up.weight", l, wu)}}, {{up}});
  const int act = g.add_tensor(pre + "act", l, o.act, rows, inter);
  g.add_alias(act, gate);
  g.add_op(OpKind::Geglu, pre + "act", l, {{gate}, {up}}, {{act}});
  OpParams acc;
  acc.accumulate = accumulate;
  const int wdi = g.add_weight(pre + "down.weight", l, wd);
  if (accumulate)
    g.add_op(OpKind::Gemm, pre + "down", l, {{act}, {wdi}, out}, {out}, acc);
  else
    g.add_op(OpKind::Gemm, pre + "down", l, {{act}, {wdi}}, {out}, acc);
}

}  // namespace

graph::GraphTemplate build_diffusion_gemma_graph(const ModelConfig& c, const DenseWeights& w,
                                                 const GraphOptions& o, OutputMode mode) {
  TESSERA_CHECK(o.tp_size == 1 && o.ep_size == 1, "DiffusionGemma has no tensor or expert parallelism yet");
  const ModelConfig::Uniform& u = c.uniform;
  const bool encoder = o.mask == MaskKind::Causal;
  graph::GraphTemplate g;
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
  const int sc_in = encoder ? -1 : g.add_input("sc_in", DType::F32, Sym::NQuery, o.hidden);

  const float emb_scale = std::sqrt(static_cast<float>(o.hidden));
  const int embed = g.add_weight("token_embd", -1, w.embed);
  const int x = g.add_tensor("x", -1, DType::F32, Sym::NQuery, o.hidden);  // residual stream
  g.add_op(OpKind::Embed, "embed", -1, {{tokens}, {embed}}, {{x}});
  scale(g, "embed_scale", -1, {x}, emb_scale);
  if (!encoder) {  // x = rmsnorm_noscale(x + SC(sc_in)); SC(0) = 0 exactly (no biases)
    const int n = g.add_tensor("sc_norm", -1, o.act, Sym::NQuery, o.hidden);
    g.add_op(OpKind::RmsNorm, "sc_norm", -1, {{sc_in}, {g.add_weight("sc_norm.weight", -1, w.sc_norm)}},
             {{n}}, norm_params(o.eps));
    add_geglu(g, o, "sc_", -1, {n}, w.sc_gate, w.sc_up, w.sc_down, Sym::NQuery, {x}, true);
    g.add_op(OpKind::RmsNorm, "input_norm", -1, {{x}}, {{x}}, norm_params(o.eps, o.hidden));
  }

  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LayerWeights& L = w.layers[li];
    const int l = static_cast<int>(li);
    const bool global = c.is_global_layer(l);
    const int64_t hd = global ? u.global_head_dim : c.head_dim;
    const int64_t nkv = global ? u.global_kv_heads : c.n_kv_heads;
    const int64_t q_width = c.n_heads * hd, kv_width = nkv * hd;
    const int h = g.add_tensor("attn_norm", l, o.act, Sym::NQuery, o.hidden);
    g.add_op(OpKind::RmsNorm, "attn_norm", l, {{x}, {g.add_weight("attn_norm.weight", l, L.attn_norm)}},
             {{h}}, norm_params(o.eps));
    const int q = g.add_tensor("q", l, DType::F32, Sym::NQuery, q_width);
    const int k = g.add_tensor("k", l, DType::F32, Sym::NQuery, kv_width);
    const int v = g.add_tensor("v", l, DType::F32, Sym::NQuery, kv_width);
    g.add_op(OpKind::Gemm, "attn_q", l, {{h}, {g.add_weight("attn_q.weight", l, L.wq)}}, {{q}});
    g.add_op(OpKind::Gemm, "attn_k", l, {{h}, {g.add_weight("attn_k.weight", l, L.wk)}}, {{k}});
    if (global)  // K as V: v = rmsnorm_noscale(k before its norm)
      g.add_op(OpKind::RmsNorm, "attn_v_norm", l, {{k}}, {{v}}, norm_params(o.eps, hd));
    else {
      g.add_op(OpKind::Gemm, "attn_v", l, {{h}, {g.add_weight("attn_v.weight", l, L.wv)}}, {{v}});
      g.add_op(OpKind::RmsNorm, "attn_v_norm", l, {{v}}, {{v}}, norm_params(o.eps, hd));
    }
    g.add_op(OpKind::RmsNorm, "attn_q_norm", l, {{q}, {g.add_weight("attn_q_norm.weight", l, L.q_norm)}},
             {{q}}, norm_params(o.eps));
    g.add_op(OpKind::RmsNorm, "attn_k_norm", l, {{k}, {g.add_weight("attn_k_norm.weight", l, L.k_norm)}},
             {{k}}, norm_params(o.eps));
    OpParams rope;
    rope.head_dim = static_cast<int>(hd);
    rope.rope.neox = true;
    if (global) {  // proportional: the first global_rotary / 2 pairs (i, i + hd / 2) at theta^(-2i / hd)
      rope.rope.rotary_dim = static_cast<int>(u.global_rotary);
      rope.rope.theta = u.global_theta;
      rope.rope.pair_offset = static_cast<int>(hd / 2);
      rope.rope.freq_dim = static_cast<int>(hd);
    } else {
      rope.rope.rotary_dim = static_cast<int>(hd);
      rope.rope.theta = c.rope_theta;
    }
    g.add_op(OpKind::Rope, "rope_q", l, {{q}, {q_pos}}, {{q}}, rope);
    g.add_op(OpKind::Rope, "rope_k", l, {{k}, {q_pos}}, {{k}}, rope);
    int keys = k, values = v;
    if (o.kv_cache) add_kv_cache(g, o, l, kv_width, cache_rows, kv_rows, keys, values);
    OpParams attn;
    attn.n_heads = static_cast<int>(c.n_heads);
    attn.n_kv_heads = static_cast<int>(nkv);
    attn.head_dim = static_cast<int>(hd);
    attn.scale = 1.0f;
    attn.mask = encoder ? MaskKind::Causal : MaskKind::None;
    attn.window = global ? 0 : static_cast<int>(u.window);
    const int att = g.add_tensor("attn_out", l, o.act, Sym::NQuery, q_width);
    g.add_op(OpKind::Attention, "attention", l, {{q}, {keys}, {values}, {cu_q}, {cu_k}, {q_pos}, {k_pos}},
             {{att}}, attn);
    const int proj = g.add_tensor("attn_proj", l, DType::F32, Sym::NQuery, o.hidden);
    g.add_op(OpKind::Gemm, "attn_output", l, {{att}, {g.add_weight("attn_output.weight", l, L.wo)}},
             {{proj}});
    g.add_op(OpKind::RmsNorm, "post_attn_norm", l,
             {{proj}, {g.add_weight("post_attn_norm.weight", l, L.post_attn_norm)}, {x}}, {{x}},
             norm_params(o.eps, 0, true));

    // FFN over chunks of rows: the dense MLP and the experts read the same residual, their normalised
    // outputs are summed, normalised again and added; then the layer's scalar.
    g.begin_loop(Sym::NQuery, Sym::FfnRows);
    g.add_barrier(x);
    const Ref xc{x, true};
    const int m1 = g.add_tensor("ffn_norm", l, o.act, Sym::FfnRows, o.hidden);
    g.add_op(OpKind::RmsNorm, "ffn_norm", l, {xc, {g.add_weight("ffn_norm.weight", l, L.ffn_norm)}}, {{m1}},
             norm_params(o.eps));
    const int dense = g.add_tensor("ffn_dense", l, DType::F32, Sym::FfnRows, o.hidden);
    add_geglu(g, o, "ffn_", l, {m1}, L.w_gate, L.w_up, L.w_down, Sym::FfnRows, {dense}, false);
    const int sum = g.add_tensor("ffn_sum", l, DType::F32, Sym::FfnRows, o.hidden);
    g.add_op(OpKind::RmsNorm, "post_dense_norm", l,
             {{dense}, {g.add_weight("post_dense_norm.weight", l, L.post_dense_norm)}}, {{sum}},
             norm_params(o.eps));
    const int rn = g.add_tensor("router_norm", l, o.act, Sym::FfnRows, o.hidden);
    g.add_op(OpKind::RmsNorm, "router_norm", l, {xc, {g.add_weight("router_norm.weight", l, L.router_norm)}},
             {{rn}}, norm_params(o.eps));
    const MoeExperts& e = L.experts;
    const int64_t topk = c.moe.top_k;
    const int rl = g.add_tensor("ffn_router", l, DType::F32, Sym::FfnRows, e.n_experts);
    g.add_op(OpKind::Gemm, "ffn_router", l, {{rn}, {g.add_weight("ffn_router.weight", l, L.router)}}, {{rl}});
    const int ids = g.add_tensor("moe_ids", l, DType::I32, Sym::FfnRows, topk);
    const int wts = g.add_tensor("moe_weights", l, DType::F32, Sym::FfnRows, topk);
    OpParams rp;
    rp.route.score = MoeScore::Softmax;
    rp.route.top_k = static_cast<int>(topk);
    rp.route.norm_topk = true;
    rp.route.expert_scale = L.expert_scale.data != nullptr ? L.expert_scale.as<const float>() : nullptr;
    g.add_op(OpKind::MoeRoute, "moe_route", l, {{rl}}, {{ids}, {wts}}, rp);
    const int m2 = g.add_tensor("moe_norm", l, o.act, Sym::FfnRows, o.hidden);
    g.add_op(OpKind::RmsNorm, "moe_norm", l, {xc, {g.add_weight("moe_norm.weight", l, L.moe_norm)}}, {{m2}},
             norm_params(o.eps));
    const size_t fixed = moe_scratch_bytes(0, static_cast<int>(topk), e);
    const int scratch = g.add_scratch("moe_scratch", l, Sym::FfnRows,
                                      moe_scratch_bytes(1, static_cast<int>(topk), e) - fixed, fixed);
    const int moe = g.add_tensor("ffn_moe", l, DType::F32, Sym::FfnRows, o.hidden);
    std::vector<Ref> in{{m2}, {ids}, {wts}, {moe}};
    const char* names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    for (int i = 0; i < 3; ++i) {
      const int64_t rows = i < 2 ? e.inter : e.hidden, cols = i < 2 ? e.hidden : e.inter;
      in.push_back({g.add_weight(names[i], l, Tensor(nullptr, e.dtype, {e.n_experts, rows, cols}))});
    }
    OpParams fp;
    fp.experts = e;
    fp.experts.overwrite = true;  // moe = the weighted sum (not added to anything)
    g.add_op(OpKind::MoeFfn, "moe_ffn", l, in, {{scratch}, {moe}}, fp);
    g.add_op(OpKind::RmsNorm, "post_moe_norm", l,
             {{moe}, {g.add_weight("post_moe_norm.weight", l, L.post_moe_norm)}, {sum}}, {{sum}},
             norm_params(o.eps, 0, true));
    g.add_op(OpKind::RmsNorm, "post_ffn_norm", l,
             {{sum}, {g.add_weight("post_ffn_norm.weight", l, L.post_ffn_norm)}, xc}, {xc},
             norm_params(o.eps, 0, true));
    scale(g, "layer_scalar", l, xc, encoder ? L.scalar_enc : L.scalar_dec);
    g.end_loop();
  }

  const int hn = g.add_tensor("output_norm", -1, o.act, Sym::NQuery, o.hidden);
  g.add_op(OpKind::RmsNorm, "output_norm", -1, {{x}, {g.add_weight("output_norm.weight", -1, w.final_norm)}},
           {{hn}}, norm_params(o.eps));
  const int lm = g.add_weight("output.weight", -1, w.lm_head);
  OpParams cap;
  cap.scale = u.softcap;
  const bool capped = u.softcap > 0.0f;
  // Mask-only logits over the selected rows, chunked (K_logits), soft-capped in place.
  if (mode == OutputMode::Logits) {
    const int logits = g.add_output("logits", DType::F32, Sym::NLogits, o.vocab);
    g.begin_loop(Sym::NLogits, Sym::LogitRows);
    g.add_barrier(hn);
    g.add_barrier(logit_rows);
    g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{logits, true}});
    if (capped) g.add_op(OpKind::Softcap, "softcap", -1, {{logits, true}}, {{logits, true}}, cap);
    g.end_loop();
    return g;
  }
  const bool canvas = !encoder && mode == OutputMode::Sample;  // the entropy-bound sampler's step
  const bool sample = mode != OutputMode::LogProb;
  const int out_a = sample ? g.add_output("token", DType::I32, Sym::NLogits)
                           : g.add_output("logprob", DType::F32, Sym::NLogits);
  const int out_b = sample ? g.add_output("conf", DType::F32, Sym::NLogits) : -1;
  const int argmax = canvas ? g.add_output("argmax", DType::I32, Sym::NLogits) : -1;
  const int soft = canvas ? g.add_output("soft", DType::F32, Sym::NLogits, o.hidden) : -1;
  const int64_t n_top = std::min(kTopLogprobs, o.vocab);
  const bool with_lp = mode == OutputMode::SampleLogprobs;
  const int lp = with_lp ? g.add_output("logprob", DType::F32, Sym::NLogits) : -1;
  const int top_ids = with_lp ? g.add_output("top_ids", DType::I32, Sym::NLogits, n_top) : -1;
  const int top_lp = with_lp ? g.add_output("top_logprobs", DType::F32, Sym::NLogits, n_top) : -1;
  g.begin_loop(Sym::NLogits, Sym::LogitRows);
  g.add_barrier(hn);
  g.add_barrier(logit_rows);
  g.add_barrier(sample ? row_keys : target);
  const int logits = g.add_tensor("logits", -1, DType::F32, Sym::LogitRows, o.vocab);
  g.add_op(OpKind::GatherGemm, "logits", -1, {{hn}, {logit_rows, true}, {lm}}, {{logits}});
  if (capped) g.add_op(OpKind::Softcap, "softcap", -1, {{logits}}, {{logits}}, cap);
  if (canvas) {
    g.add_op(OpKind::CanvasSample, "canvas_sample", -1, {{logits}, {row_keys, true}},
             {{out_a, true}, {argmax, true}, {out_b, true}});
    const int probs = g.add_tensor("sc_probs", -1, w.embed.dtype, Sym::LogitRows, o.vocab);
    OpParams se;
    se.scale = emb_scale;
    g.add_op(OpKind::SoftEmbed, "soft_embed", -1, {{logits}, {embed}}, {{probs}, {soft, true}}, se);
  } else if (sample) {
    g.add_op(OpKind::SampleRows, "sample", -1, {{logits}, {row_keys, true}}, {{out_a, true}, {out_b, true}});
  } else {
    g.add_op(OpKind::TokenLogprob, "logprob", -1, {{logits}, {target, true}}, {{out_a, true}});
  }
  if (with_lp)
    g.add_op(OpKind::TopLogprobs, "top_logprobs", -1, {{logits}, {out_a, true}},
             {{lp, true}, {top_ids, true}, {top_lp, true}});
  g.end_loop();
  return g;
}

}  // namespace tessera
