// Dream (model_type "Dream", Qwen2 layout): GQA, QKV bias, shifted logits (the engine gathers
// hidden row i-1 for position i). Also carries tessera's converted llama2.c models (is_causal,
// rope_interleaved, tied embeddings).
#include "models/model.h"

namespace tessera {

void bind_dream(Model& m) {
  const ModelConfig& c = m.config();
  bind_hf_embeddings(m);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.weights().layers[static_cast<size_t>(l)];
    bind_hf_attention(m, L, b);
    bind_swiglu(m, L, b + "mlp.", c.intermediate);
  }
}

}  // namespace tessera
