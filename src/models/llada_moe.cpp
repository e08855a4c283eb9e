// LLaDA-MoE (LLaDA-MoE-7B-A1B; model_type "lladamoe" / "llada_moe", LLaDAMoEModelLM, OLMoE-style
// layers): bidirectional attention with qk-norm (per-head RMSNorm of q and k before RoPE), MoE FFN
// with a softmax router (mlp.gate) over mlp.experts.E.{gate,up,down}_proj, top-k weights not
// renormalised unless norm_topk_prob; dense layers (moe_layer_freq 0) use mlp.{gate,up,down}_proj;
// an optional shared expert (shared_expert_intermediate_size) is shared_expert.{gate,up,down}_proj.
// Logits are not shifted.
#include "models/model.h"

namespace tessera {

void bind_llada_moe(Model& m) {
  const ModelConfig& c = m.config();
  bind_hf_embeddings(m);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.weights().layers[static_cast<size_t>(l)];
    bind_hf_attention(m, L, b);
    if (c.qk_norm) {
      L.q_norm = m.bind(b + "self_attn.q_norm.weight", {c.head_dim}, false);
      L.k_norm = m.bind(b + "self_attn.k_norm.weight", {c.head_dim}, false);
    }
    bind_moe_model_ffn(m, L, l, b, "shared_expert.");
  }
}

}  // namespace tessera
