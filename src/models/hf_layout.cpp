// Weight names of the Hugging Face Llama-style layout shared by Dream (Qwen2) and LLaDA-MoE (OLMoE):
// model.embed_tokens / model.norm / lm_head and model.layers.N.{input_layernorm, self_attn.*,
// post_attention_layernorm}; and the FFN of the MoE families (LLaDA-MoE, LLaDA2), whose expert names
// they share.
#include "models/hf_layout.h"

namespace tessera {

void bind_hf_embeddings(Model& m, const std::string& prefix, const std::string& head) {
  const ModelConfig& c = m.config();
  DenseWeights& w = m.weights();
  w.embed = m.bind(prefix + "embed_tokens.weight", {c.vocab, c.hidden}, false);
  w.final_norm = m.bind(prefix + "norm.weight", {c.hidden}, false);
  w.lm_head = c.tie_embeddings ? m.bind(prefix + "embed_tokens.weight", {c.vocab, c.hidden}, true)
                               : m.bind(head, {c.vocab, c.hidden}, true);
  w.layers.resize(static_cast<size_t>(c.n_layers));
}

void bind_hf_attention(Model& m, LayerWeights& L, const std::string& b) {
  const ModelConfig& c = m.config();
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
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
}

void bind_swiglu(Model& m, LayerWeights& L, const std::string& prefix, int64_t inter) {
  const int64_t d = m.config().hidden;
  L.w_gate = m.bind(prefix + "gate_proj.weight", {inter, d}, true);
  L.w_up = m.bind(prefix + "up_proj.weight", {inter, d}, true);
  L.w_down = m.bind(prefix + "down_proj.weight", {d, inter}, true);
}

void bind_moe_model_ffn(Model& m, LayerWeights& L, int64_t l, const std::string& b,
                        const std::string& shared_prefix) {
  const ModelConfig& c = m.config();
  if (!c.is_moe_layer(l)) {
    bind_swiglu(m, L, b + "mlp.", c.intermediate);
    return;
  }
  L.router = m.bind(b + "mlp.gate.weight", {c.moe.n_experts, c.hidden}, true);
  if (c.moe.expert_bias) L.expert_bias = m.bind_bias(b + "mlp.gate.expert_bias", c.moe.n_experts);
  L.experts = m.bind_experts(
      [&](int64_t e, const char* proj) {
        return b + "mlp.experts." + std::to_string(e) + "." + proj + ".weight";
      },
      c.moe.n_experts, c.moe.expert_inter);
  if (c.moe.shared_inter > 0) bind_swiglu(m, L, b + shared_prefix, c.moe.shared_inter);
}

}  // namespace tessera
