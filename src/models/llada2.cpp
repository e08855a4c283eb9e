// LLaDA2.0 (model_type "llada2_moe", LLaDA2MoeModelLM; names from inclusionAI's modeling_llada2_moe.py):
//   model.word_embeddings.weight, model.norm.weight, lm_head.weight (or tied);
//   per layer model.layers.N.: input_layernorm, attention.query_key_value (fused rows: H * head_dim of q,
//   then KV * head_dim of k, then of v; + .bias with use_qkv_bias), attention.query_layernorm and
//   attention.key_layernorm [head_dim] (use_qk_norm), attention.dense, post_attention_layernorm;
//   dense layers (< first_k_dense_replace) mlp.{gate,up,down}_proj; MoE layers mlp.gate.weight [E, d]
//   (router), mlp.gate.expert_bias [E], mlp.experts.E.{gate,up,down}_proj, and with shared experts
//   mlp.shared_experts.{gate,up,down}_proj. Block-causal attention, logits not shifted.
// q, k and v are zero-copy row views of the fused weight where the weights stay in the mapped file.
#include "core/error.h"
#include "models/model.h"

namespace tessera {

void bind_llada2(Model& m) {
  const ModelConfig& c = m.config();
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, qkv = q + 2 * kv;
  DenseWeights& w = m.weights();
  w.embed = m.bind("model.word_embeddings.weight", {c.vocab, d}, false);
  w.final_norm = m.bind("model.norm.weight", {d}, false);
  w.lm_head = c.tie_embeddings ? m.bind("model.word_embeddings.weight", {c.vocab, d}, true)
                               : m.bind("lm_head.weight", {c.vocab, d}, true);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = m.bind(b + "input_layernorm.weight", {d}, false);
    const std::string fused = b + "attention.query_key_value.weight";
    L.wq = m.bind_rows(fused, qkv, d, 0, q, true);
    L.wk = m.bind_rows(fused, qkv, d, q, kv, true);
    L.wv = m.bind_rows(fused, qkv, d, q + kv, kv, true);
    const std::string fused_bias = b + "attention.query_key_value.bias";
    if (c.qkv_bias) {
      L.bq = m.bind_bias_slice(fused_bias, qkv, 0, q);
      L.bk = m.bind_bias_slice(fused_bias, qkv, q, kv);
      L.bv = m.bind_bias_slice(fused_bias, qkv, q + kv, kv);
    } else if (m.has_tensor(fused_bias)) {
      fail(fused_bias + " is in the checkpoint but config.json has use_qkv_bias false");
    }
    // use_bias defaults to true in LLaDA2MoeConfig: a checkpoint whose config omits it may carry the bias.
    if (m.has_tensor(b + "attention.dense.bias"))
      fail(
          b +
          "attention.dense.bias is in the checkpoint: a bias on attention.dense (use_bias) is not supported");
    if (c.qk_norm) {
      L.q_norm = m.bind(b + "attention.query_layernorm.weight", {c.head_dim}, false);
      L.k_norm = m.bind(b + "attention.key_layernorm.weight", {c.head_dim}, false);
    }
    L.wo = m.bind(b + "attention.dense.weight", {d, q}, true);
    L.ffn_norm = m.bind(b + "post_attention_layernorm.weight", {d}, false);
    bind_moe_model_ffn(m, L, l, b, "mlp.shared_experts.");
  }
}

}  // namespace tessera
