// LLaDA (model_type "llada", LLaDAModelLM): bidirectional, no biases, untied LM head, no shift.
#include "models/model.h"

namespace tessera {

void bind_llada(Model& m) {
  const ModelConfig& c = m.config();
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const std::string p = "model.transformer.";
  DenseWeights& w = m.weights();
  w.embed = m.bind(p + "wte.weight", {c.vocab, d}, false);
  w.final_norm = m.bind(p + "ln_f.weight", {d}, false);
  w.lm_head = c.tie_embeddings ? m.bind(p + "wte.weight", {c.vocab, d}, true)
                               : m.bind(p + "ff_out.weight", {c.vocab, d}, true);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = p + "blocks." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = m.bind(b + "attn_norm.weight", {d}, false);
    L.wq = m.bind(b + "q_proj.weight", {q, d}, true);
    L.wk = m.bind(b + "k_proj.weight", {kv, d}, true);
    L.wv = m.bind(b + "v_proj.weight", {kv, d}, true);
    if (c.qkv_bias) {
      L.bq = m.bind_bias(b + "q_proj.bias", q);
      L.bk = m.bind_bias(b + "k_proj.bias", kv);
      L.bv = m.bind_bias(b + "v_proj.bias", kv);
    }
    L.wo = m.bind(b + "attn_out.weight", {d, q}, true);
    L.ffn_norm = m.bind(b + "ff_norm.weight", {d}, false);
    L.w_gate = m.bind(b + "ff_proj.weight", {c.intermediate, d}, true);
    L.w_up = m.bind(b + "up_proj.weight", {c.intermediate, d}, true);
    L.w_down = m.bind(b + "ff_out.weight", {d, c.intermediate}, true);
  }
}

}  // namespace tessera
