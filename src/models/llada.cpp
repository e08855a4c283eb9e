// LLaDA (model_type "llada", LLaDAModelLM): bidirectional, no biases, untied LM head, no shift.
// GGUF: architecture "llada" (llama.cpp's converter permutes the q / k rows of each head for ggml's
// interleaved RoPE: tessera keeps them and rotates adjacent pairs, the same attention).
#include "models/registry.h"

namespace tessera {
namespace {

// A "llada" config with the MoE field names and no d_model is LLaDA-MoE's (models/llada_moe.cpp).
bool claims(const std::string& model_type, const ConfigReader& r) {
  return model_type == "llada" && !(r.j.contains("num_experts") && !r.j.contains("d_model"));
}

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.hidden = r.integer("d_model");
  c.n_layers = r.integer("n_layers");
  c.n_heads = r.integer("n_heads");
  c.n_kv_heads = r.integer_or("n_kv_heads", c.n_heads);
  c.intermediate = r.integer("mlp_hidden_size");
  c.vocab = r.integer_or("embedding_size", r.integer("vocab_size"));
  c.max_positions = r.integer_or("max_sequence_length", 4096);
  c.rope_theta = r.number_or("rope_theta", 10000.0f);
  c.rms_eps = r.number_or("rms_norm_eps", 1e-5f);
  c.tie_embeddings = r.boolean_or("weight_tying", false);
  c.qkv_bias = r.boolean_or("include_qkv_bias", false) || r.boolean_or("include_bias", false);
  r.one_of("activation_type", {"silu"}, "is not supported (silu only)");
  if (r.boolean_or("alibi", false)) fail(r.where + ": alibi=true is not supported (RoPE only)");
}

constexpr GgufName kGgufLayerNames[] = {
    {"attn_norm.weight", "attn_norm.weight"}, {"attn_q.weight", "q_proj.weight"},
    {"attn_k.weight", "k_proj.weight"},       {"attn_v.weight", "v_proj.weight"},
    {"attn_q.bias", "q_proj.bias"},           {"attn_k.bias", "k_proj.bias"},
    {"attn_v.bias", "v_proj.bias"},           {"attn_output.weight", "attn_out.weight"},
    {"ffn_norm.weight", "ff_norm.weight"},    {"ffn_gate.weight", "ff_proj.weight"},
    {"ffn_up.weight", "up_proj.weight"},      {"ffn_down.weight", "ff_out.weight"},
};

void llada_8b(ModelConfig& c) {
  c.model_type = "llada";
  c.hidden = 4096;
  c.n_layers = 32;
  c.n_heads = c.n_kv_heads = 32;
  c.intermediate = 12288;
  c.vocab = 126464;
  c.max_positions = 1 << 20;
  c.rope_theta = 500000.0f;
  c.rms_eps = 1e-5f;
  c.mask_id = 126336;
  c.eos_id = 126081;
}

// The LLaDA block at 1/4 width and 4 layers, real vocabulary.
void llada_mid(ModelConfig& c) {
  llada_8b(c);
  c.hidden = 1024;
  c.n_layers = 4;
  c.n_heads = c.n_kv_heads = 8;
  c.intermediate = 3072;
}

constexpr GeometryPreset kGeometries[] = {{"llada-8b", llada_8b}, {"llada-mid", llada_mid}};

void bind(Model& m) {
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
    m.layer_bound(l);
  }
}

}  // namespace

constexpr FamilyInfo kLladaFamily{
    .files = {.name = "llada",
              .config = {.model_types = "llada", .claims = claims, .read = read_config},
              .gguf = {.arch = "llada",
                       .embed = "model.transformer.wte.weight",
                       .final_norm = "model.transformer.ln_f.weight",
                       .lm_head = "model.transformer.ff_out.weight",
                       .layer_prefix = "model.transformer.blocks.",
                       .layer_names = kGgufLayerNames,
                       .mask_token = "<|mdm_mask|>",
                       .rope_interleaved = true}},
    .geometries = kGeometries,
    .bind = bind,
};

}  // namespace tessera
