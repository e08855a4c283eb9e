// Dream (model_type "Dream", Qwen2 layout): GQA, QKV bias, shifted logits (the engine gathers
// hidden row i-1 for position i). Also carries tessera's converted llama2.c models (is_causal,
// rope_interleaved, tied embeddings).
#include "models/model.h"

namespace tessera {

void bind_dream(Model& m) {
  const ModelConfig& c = m.config();
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  DenseWeights& w = m.weights();
  w.embed = m.bind("model.embed_tokens.weight", {c.vocab, d}, false);
  w.final_norm = m.bind("model.norm.weight", {d}, false);
  w.lm_head = c.tie_embeddings ? m.bind("model.embed_tokens.weight", {c.vocab, d}, true)
                               : m.bind("lm_head.weight", {c.vocab, d}, true);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = m.bind(b + "input_layernorm.weight", {d}, false);
    L.wq = m.bind(b + "self_attn.q_proj.weight", {q, d}, true);
    L.wk = m.bind(b + "self_attn.k_proj.weight", {kv, d}, true);
    L.wv = m.bind(b + "self_attn.v_proj.weight", {kv, d}, true);
    if (c.qkv_bias) {
      L.bq = m.bind_bias(b + "self_attn.q_proj.bias", q);
      L.bk = m.bind_bias(b + "self_attn.k_proj.bias", kv);
      L.bv = m.bind_bias(b + "self_attn.v_proj.bias", kv);
    }
    L.wo = m.bind(b + "self_attn.o_proj.weight", {d, q}, true);
    L.ffn_norm = m.bind(b + "post_attention_layernorm.weight", {d}, false);
    L.w_gate = m.bind(b + "mlp.gate_proj.weight", {c.intermediate, d}, true);
    L.w_up = m.bind(b + "mlp.up_proj.weight", {c.intermediate, d}, true);
    L.w_down = m.bind(b + "mlp.down_proj.weight", {d, c.intermediate}, true);
  }
}

}  // namespace tessera
