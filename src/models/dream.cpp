// Dream (model_type "Dream", Qwen2 layout): GQA, QKV bias, shifted logits (the engine gathers
// hidden row i-1 for position i). Also carries tessera's converted llama2.c models (is_causal,
// rope_interleaved, tied embeddings). GGUF: architecture "dream" (no shift key: Dream shifts).
#include "models/hf_layout.h"
#include "models/registry.h"

namespace tessera {
namespace {

bool claims(const std::string& model_type, const ConfigReader&) {
  return model_type == "Dream" || model_type == "dream";
}

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.hidden = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer_or("num_key_value_heads", c.n_heads);
  c.intermediate = r.integer("intermediate_size");
  c.vocab = r.integer("vocab_size");
  c.max_positions = r.integer_or("max_position_embeddings", 32768);
  c.rope_theta = r.number_or("rope_theta", 10000.0f);
  c.rms_eps = r.number_or("rms_norm_eps", 1e-6f);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.qkv_bias = r.boolean_or("attention_bias", true);  // Qwen2 layouts: bias on q/k/v
  c.logit_shift = true;
  r.one_of("hidden_act", {"silu"}, "is not supported (silu only)");
}

constexpr GgufFormat gguf_format() {
  GgufFormat f = hf_gguf_format("dream");
  f.shift_logits = true;  // Dream's converter writes no shift key: Dream predicts position i from row i-1
  return f;
}

void dream_7b(ModelConfig& c) {
  c.model_type = "Dream";
  c.hidden = 3584;
  c.n_layers = 28;
  c.n_heads = 28;
  c.n_kv_heads = 4;
  c.intermediate = 18944;
  c.vocab = 152064;
  c.max_positions = 1 << 20;
  c.rope_theta = 1e6f;
  c.rms_eps = 1e-6f;
  c.qkv_bias = true;
  c.logit_shift = true;
  c.mask_id = 151666;
  c.eos_id = 151643;
}

constexpr GeometryPreset kGeometries[] = {{"dream-7b", dream_7b}};

void bind(Model& m) {
  const ModelConfig& c = m.config();
  bind_hf_embeddings(m);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.weights().layers[static_cast<size_t>(l)];
    bind_hf_attention(m, L, b);
    bind_swiglu(m, L, b + "mlp.", c.intermediate);
    m.layer_bound(l);
  }
}

}  // namespace

constexpr FamilyInfo kDreamFamily{
    .files = {.name = "dream",
              .config = {.model_types = "Dream", .claims = claims, .read = read_config},
              .gguf = gguf_format()},
    .geometries = kGeometries,
    .bind = bind,
};

}  // namespace tessera
