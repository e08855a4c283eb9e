// Nemotron-Labs-Diffusion (model_type "nemotron_labs_diffusion", NemotronLabsDiffusionModel; NVIDIA 2026;
// shared/specs/nemotron-labs-diffusion.md): a Ministral-3 dense decoder (GQA, SwiGLU, RMSNorm, no
// biases) with an explicit head_dim (q_proj's width is not hidden on the 3B and 14B), YaRN RoPE and the
// Llama-4 query scale past the original context, and an untied `diffusion_head`. One checkpoint decodes
// three ways (tri_mode): causal forwards (autoregressive prefill and steps, the verify pass of
// self-speculation, the pass that writes a finished block's K / V) and bidirectional ones (diffusion
// drafts over a block against the causal cache). Names: encoder.embed_tokens, encoder.layers.N.{
// input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj},
// encoder.norm, diffusion_head; the draft adapter (linear_spec_lora/, PEFT) on o_proj. GGUF: architecture
// "nemotron-diffusion" (read_gguf below), tessera's own choice: the spec's converter maps the model onto
// llama.cpp's DREAM, which drops YaRN, the query scale and the causal modes.
#include <cmath>
#include <fstream>

#include "models/hf_layout.h"
#include "models/registry.h"

namespace tessera {
namespace {

bool claims(const std::string& model_type, const ConfigReader&) {
  return model_type == "nemotron_labs_diffusion";
}

// HF's get_mscale.
double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// rope_parameters (transformers 5) or rope_scaling (older configs): default RoPE or YaRN, and
// Ministral-3's llama_4_scaling_beta. rope_theta may sit inside it or at the top level.
void read_rope(const ConfigReader& r, ModelConfig& c) {
  c.rope_theta = r.number_or("rope_theta", 1e6f);
  const char* key = !r.absent("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (r.absent(key)) return;
  if (!r.j[key].is_object()) r.bad(key, "must be an object");
  const ConfigReader p{r.j[key], r.where + " " + key};
  c.rope_theta = p.number_or("rope_theta", c.rope_theta);
  const char* type_key = !p.absent("rope_type") ? "rope_type" : "type";
  const std::string type = p.one_of(type_key, {"default", "yarn"}, "is not supported (default or yarn)");
  ModelConfig::RopeScaling& y = c.rope_scaling;
  y.original_max = p.integer_or("original_max_position_embeddings", c.max_positions);
  if (!p.absent("llama_4_scaling_beta") &&
      !(p.j["llama_4_scaling_beta"].is_number() && p.j["llama_4_scaling_beta"].get<double>() == 0.0))
    y.llama4_beta = p.number_or("llama_4_scaling_beta", 0.0f);
  if (type == "yarn") {
    y.factor = p.number_or("factor", 1.0f);
    if (y.factor < 1.0f) p.bad("factor", "must be at least 1");
    y.beta_fast = p.number_or("beta_fast", 32.0f);
    y.beta_slow = p.number_or("beta_slow", 1.0f);
    y.truncate = p.boolean_or("truncate", true);
    const auto opt = [&](const char* k) {
      return p.absent(k) ? 0.0 : static_cast<double>(p.number_or(k, 1.0f));
    };
    const double mscale = opt("mscale"), mscale_all = opt("mscale_all_dim");
    if (!p.absent("attention_factor"))
      y.attn_factor = p.number_or("attention_factor", 1.0f);
    else if (mscale > 0.0 && mscale_all > 0.0)
      y.attn_factor = static_cast<float>(yarn_mscale(y.factor, mscale) / yarn_mscale(y.factor, mscale_all));
    else
      y.attn_factor = static_cast<float>(yarn_mscale(y.factor, 1.0));
  }
}

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.hidden = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer_or("num_key_value_heads", c.n_heads);
  c.intermediate = r.integer("intermediate_size");
  c.vocab = r.integer("vocab_size");
  c.max_positions = r.integer_or("max_position_embeddings", 262144);
  c.rms_eps = r.number_or("rms_norm_eps", 1e-5f);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  if (r.boolean_or("attention_bias", false))
    r.bad("attention_bias", "is not supported (Ministral-3 has none)");
  if (!r.absent("sliding_window")) r.bad("sliding_window", "is not supported (full attention only)");
  r.one_of("hidden_act", {"silu"}, "is not supported (silu only)");
  r.one_of(
      "dlm_paradigm", {"bidirectional"},
      "is not supported: the released checkpoints' 'bidirectional' only (the others are training variants)");
  read_rope(r, c);
  c.tri_mode = true;
  c.diffusion_block = r.integer_or("block_size", 32);
}

// The draft adapter shipped with the instruct checkpoints (spec section 2): PEFT's LoRA in
// linear_spec_lora/ (adapter_config.json + adapter_model.safetensors) on o_proj, used by
// self-speculation's drafts only. Other target modules are refused: tessera would drop them silently.
void read_adapter(const std::filesystem::path& dir, ModelConfig& c) {
  const std::filesystem::path p = dir / "linear_spec_lora" / "adapter_config.json";
  if (!std::filesystem::exists(p)) return;
  std::ifstream f(p);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail(p.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) fail(p.string() + ": expected a JSON object");
  const ConfigReader r{j, p.string()};
  r.one_of("peft_type", {"LORA"}, "is not supported (LORA only)");
  const int64_t rank = r.integer("r");
  const double alpha = r.number_or("lora_alpha", static_cast<float>(rank));
  const bool rs = r.boolean_or("use_rslora", false);
  if (!r.absent("target_modules")) {
    const nlohmann::json& t = j["target_modules"];
    const bool only_o =
        (t.is_string() && t.get<std::string>() == "o_proj") ||
        (t.is_array() && t.size() == 1 && t[0].is_string() && t[0].get<std::string>() == "o_proj");
    if (!only_o) r.bad("target_modules", "is not supported (the draft adapter targets o_proj only)");
  }
  if (r.boolean_or("fan_in_fan_out", false)) r.bad("fan_in_fan_out", "is not supported");
  c.draft_adapter.rank = rank;
  c.draft_adapter.scale = static_cast<float>(alpha / (rs ? std::sqrt(static_cast<double>(rank)) : rank));
  c.draft_adapter.dir = "linear_spec_lora";
}

// GGUF (tools/gguf/hf_to_gguf.py; spec open point 9, chosen here): architecture "nemotron-diffusion" with
// llama.cpp's names for the shared keys and tensors (blk.N.attn_q ..., output = diffusion_head), RoPE
// scaling in llama.cpp's keys ({arch}.rope.scaling.type none | yarn, .factor, .original_context_length,
// .yarn_beta_fast, .yarn_beta_slow, .attn_factor), the Llama-4 query scale as
// {arch}.attention.temperature_scale (beta, from original_context_length on), and the trained block
// length as diffusion.block_size. The draft adapter has no GGUF form: such a model drafts with the base.
void read_gguf(const GgufFile& g, const std::string& a, ModelConfig& c) {
  const std::string where = g.path().string();
  ModelConfig::RopeScaling& y = c.rope_scaling;
  y.original_max = gguf_positive(g, a + "rope.scaling.original_context_length",
                                 g.get_int(a + "rope.scaling.original_context_length", c.max_positions));
  const std::string type = g.get_string(a + "rope.scaling.type", "none");
  if (type == "yarn") {
    y.factor = static_cast<float>(g.get_float(a + "rope.scaling.factor", 1.0));
    if (!(y.factor >= 1.0f)) fail(where + ": " + a + "rope.scaling.factor must be at least 1");
    y.beta_fast = static_cast<float>(g.get_float(a + "rope.scaling.yarn_beta_fast", 32.0));
    y.beta_slow = static_cast<float>(g.get_float(a + "rope.scaling.yarn_beta_slow", 1.0));
    y.truncate = g.get_bool(a + "rope.scaling.yarn_truncate", true);
    y.attn_factor =
        static_cast<float>(g.get_float(a + "rope.scaling.attn_factor", yarn_mscale(y.factor, 1.0)));
    if (!(y.attn_factor > 0.0f)) fail(where + ": " + a + "rope.scaling.attn_factor must be positive");
  } else if (type != "none") {
    fail(where + ": RoPE scaling '" + type + "' (" + a +
         "rope.scaling.type) is not supported (none or yarn)");
  }
  y.llama4_beta = static_cast<float>(g.get_float(a + "attention.temperature_scale", 0.0));
  if (y.llama4_beta < 0.0f) fail(where + ": " + a + "attention.temperature_scale must not be negative");
  if (c.logit_shift) fail(where + ": diffusion.shift_logits is true; Nemotron-Labs-Diffusion does not shift");
  c.tri_mode = true;
  c.diffusion_block = gguf_positive(g, "diffusion.block_size", g.get_int("diffusion.block_size", 32));
}

constexpr GgufFormat gguf_format() {
  GgufFormat f;
  f.arch = "nemotron-diffusion";
  f.embed = "encoder.embed_tokens.weight";
  f.final_norm = "encoder.norm.weight";
  f.lm_head = "diffusion_head.weight";
  f.layer_prefix = "encoder.layers.";
  f.layer_names = kHfGgufLayerNames;
  f.mask_token = "<mask>";
  f.read = read_gguf;
  return f;
}

// The real geometries (spec section 1): 32 q heads, 8 KV heads, head_dim 128, vocabulary 131072, YaRN
// factor 16 over 16384 original positions (mscale = mscale_all_dim: cos / sin unscaled), Llama-4 beta 0.1.
void nemotron_common(ModelConfig& c) {
  c.model_type = "nemotron_labs_diffusion";
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.vocab = 131072;
  c.max_positions = 262144;
  c.rope_theta = 1e6f;
  c.rms_eps = 1e-5f;
  c.rope_scaling.factor = 16.0f;
  c.rope_scaling.original_max = 16384;
  c.rope_scaling.llama4_beta = 0.1f;
  c.tri_mode = true;
  c.diffusion_block = 32;
  c.mask_id = 100;
  c.bos_id = 1;
  c.eos_id = 11;
}

void nemotron_3b(ModelConfig& c) {
  nemotron_common(c);
  c.hidden = 3072;
  c.n_layers = 26;
  c.intermediate = 9216;
}

void nemotron_8b(ModelConfig& c) {
  nemotron_common(c);
  c.hidden = 4096;
  c.n_layers = 34;
  c.intermediate = 14336;
}

void nemotron_14b(ModelConfig& c) {
  nemotron_common(c);
  c.hidden = 5120;
  c.n_layers = 40;
  c.intermediate = 16384;
}

constexpr GeometryPreset kGeometries[] = {
    {"nemotron-diffusion-3b", nemotron_3b},
    {"nemotron-diffusion-8b", nemotron_8b},
    {"nemotron-diffusion-14b", nemotron_14b},
};

void bind(Model& m) {
  const ModelConfig& c = m.config();
  bind_hf_embeddings(m, "encoder.", "diffusion_head.weight");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "encoder.layers." + std::to_string(l) + ".";
    LayerWeights& L = m.weights().layers[static_cast<size_t>(l)];
    bind_hf_attention(m, L, b);
    bind_swiglu(m, L, b + "mlp.", c.intermediate);
    const ModelConfig::DraftAdapter& a = c.draft_adapter;
    if (a.rank > 0) {
      const std::string o = "base_model.model." + b + "self_attn.o_proj.";
      L.lora_a = m.bind(o + "lora_A.weight", {a.rank, c.n_heads * c.head_dim}, true);
      L.lora_b = m.bind_scaled(o + "lora_B.weight", {c.hidden, a.rank}, a.scale);
    }
    m.layer_bound(l);
  }
}

}  // namespace

constexpr FamilyInfo kNemotronFamily{
    .files = {.name = "nemotron-diffusion",
              .config = {.model_types = "nemotron_labs_diffusion",
                         .claims = claims,
                         .read = read_config,
                         .finish = read_adapter},
              .gguf = gguf_format()},
    .geometries = kGeometries,
    .bind = bind,
};

}  // namespace tessera
