// DiffusionGemma (model_type "diffusion_gemma", DiffusionGemmaForBlockDiffusion; Google, June 2026;
// shared/specs/diffusion-gemma.md): uniform-noise block diffusion on a Gemma 4 26B-A4B text stack. One
// set of weights runs two ways: causal (encoder) forwards write the prompt's and each finished canvas's
// K / V, and bidirectional (decoder) forwards denoise a canvas of random tokens against that read-only
// cache with self-conditioning on the previous step's distribution (decode/uniform.cpp runs the loop).
// Layers: sliding (8 KV heads x 256, RoPE theta 1e4, window 1024) and global (2 KV heads x 512, K as V,
// proportional RoPE: 64 of 256 pairs rotate, theta 1e6) in config.json's layer_types; q / k / v norms
// (v without scale), attention scale 1; the dense GeGLU MLP beside the 128 routed experts (softmax top 8,
// renormalised, per-expert scales), sandwich norms, a scalar per layer and mode; tied embeddings scaled
// by sqrt(hidden); final logits soft-capped at 30. Names: model.decoder.{embed_tokens, norm, layers.N.*,
// self_conditioning.*}, the encoder's own layer scalars at model.encoder.language_model.layers.N.
// layer_scalar (the decoder's where the checkpoint has none). The vision tower (model.encoder.vision_tower,
// embed_vision) is not loaded: tessera takes text. No GGUF form: llama.cpp's converter has none merged
// (README). The graph is this family's own (diffusion_gemma_graph.cpp).
#include "models/diffusion_gemma.h"

#include <cmath>
#include <fstream>

#include "models/registry.h"

namespace tessera {
namespace {

bool claims(const std::string& model_type, const ConfigReader&) {
  return model_type == "diffusion_gemma";
}

// rope_parameters per layer type (transformers 5): {"sliding_attention": {...}, "full_attention": {...}}.
void read_rope(const ConfigReader& t, ModelConfig& c) {
  c.rope_theta = 10000.0f;
  ModelConfig::Uniform& u = c.uniform;
  u.global_theta = 1e6f;
  float factor = 0.25f;
  if (!t.absent("rope_parameters")) {
    if (!t.j["rope_parameters"].is_object()) t.bad("rope_parameters", "must be an object");
    const ConfigReader p{t.j["rope_parameters"], t.where + " rope_parameters"};
    if (!p.absent("sliding_attention")) {
      const ConfigReader s{p.j["sliding_attention"], p.where + " sliding_attention"};
      s.one_of("rope_type", {"default"}, "is not supported on sliding layers (default only)");
      c.rope_theta = s.number_or("rope_theta", c.rope_theta);
    }
    if (!p.absent("full_attention")) {
      const ConfigReader f{p.j["full_attention"], p.where + " full_attention"};
      f.one_of("rope_type", {"proportional", "default"}, "is not supported on global layers");
      u.global_theta = f.number_or("rope_theta", u.global_theta);
      factor = f.number_or("partial_rotary_factor", f.j.value("rope_type", "") == "default" ? 1.0f : factor);
      if (factor > 1.0f) f.bad("partial_rotary_factor", "must be in (0, 1]");
    }
  }
  // Hugging Face's _compute_proportional_rope_parameters: int(factor * head / 2) pairs rotate.
  u.global_rotary = 2 * static_cast<int64_t>(factor * static_cast<float>(u.global_head_dim) / 2.0f);
  if (u.global_rotary <= 0) t.bad("rope_parameters", "leaves no rotated dimension on the global layers");
}

void read_text(const ConfigReader& t, ModelConfig& c) {
  ModelConfig::Uniform& u = c.uniform;
  c.hidden = t.integer("hidden_size");
  c.n_layers = t.integer("num_hidden_layers");
  c.n_heads = t.integer("num_attention_heads");
  c.n_kv_heads = t.integer("num_key_value_heads");
  c.head_dim = t.integer("head_dim");
  u.global_kv_heads = t.integer_or("num_global_key_value_heads", c.n_kv_heads);
  u.global_head_dim = t.integer_or("global_head_dim", c.head_dim);
  c.intermediate = t.integer("intermediate_size");
  c.vocab = t.integer("vocab_size");
  c.max_positions = t.integer_or("max_position_embeddings", 262144);
  c.rms_eps = t.number_or("rms_norm_eps", 1e-6f);
  c.tie_embeddings = t.boolean_or("tie_word_embeddings", true);
  if (!c.tie_embeddings)
    t.bad("tie_word_embeddings", "must be true (self-conditioning reads the embeddings)");
  if (t.boolean_or("attention_bias", false)) t.bad("attention_bias", "is not supported (Gemma 4 has none)");
  t.one_of("hidden_activation", {"gelu_pytorch_tanh"}, "is not supported (gelu_pytorch_tanh only)");
  if (!t.boolean_or("attention_k_eq_v", true))
    t.bad("attention_k_eq_v", "must be true (the released weights have no v_proj on global layers)");
  u.window = t.integer("sliding_window");
  u.softcap = t.absent("final_logit_softcapping") ? 0.0f : t.number_or("final_logit_softcapping", 30.0f);
  if (t.absent("layer_types") || !t.j["layer_types"].is_array() ||
      t.j["layer_types"].size() != static_cast<size_t>(c.n_layers))
    t.bad("layer_types", "must list num_hidden_layers layer types");
  for (const auto& v : t.j["layer_types"]) {
    const std::string s = v.is_string() ? v.get<std::string>() : "";
    if (s != "sliding_attention" && s != "full_attention")
      t.bad("layer_types", "may hold only sliding_attention and full_attention");
    u.global_layer.push_back(s == "full_attention" ? 1 : 0);
  }
  if (c.n_heads % c.n_kv_heads != 0 || c.n_heads % u.global_kv_heads != 0)
    t.bad("num_attention_heads", "must be a multiple of both key / value head counts");
  read_rope(t, c);
  MoeConfig& m = c.moe;
  if (!t.boolean_or("enable_moe_block", true)) t.bad("enable_moe_block", "must be true (26B-A4B's experts)");
  m.n_experts = t.integer("num_experts");
  m.top_k = t.integer("top_k_experts");
  m.expert_inter = t.integer("moe_intermediate_size");
  m.norm_topk = true;
  if (m.top_k > m.n_experts) t.bad("top_k_experts", "must not exceed num_experts");
}

void read_config(const ConfigReader& r, ModelConfig& c) {
  if (r.absent("text_config") || !r.j["text_config"].is_object())
    r.bad("text_config", "must be an object (the text model)");
  read_text(ConfigReader{r.j["text_config"], r.where + " text_config"}, c);
  c.uniform.canvas = r.integer_or("canvas_length", 256);
  for (const auto* key : {"eos_token_id"}) {
    const nlohmann::json& e = !r.absent(key) ? r.j[key] : r.j["text_config"].value(key, nlohmann::json());
    if (e.is_number_integer()) c.uniform.eos_ids.push_back(e.get<int32_t>());
    for (const auto& v : e.is_array() ? e : nlohmann::json::array())
      if (v.is_number_integer()) c.uniform.eos_ids.push_back(v.get<int32_t>());
  }
}

// After the shared fields (load_config reads head_dim and the special tokens from the top level, where
// this config has none): the text model's head size, then generation_config.json's sampler defaults.
void finish(const std::filesystem::path& dir, ModelConfig& c) {
  const nlohmann::json j = [&] {
    std::ifstream f(dir / "config.json");
    return nlohmann::json::parse(f, nullptr, false);
  }();
  const ConfigReader t{j["text_config"], (dir / "config.json").string() + " text_config"};
  c.head_dim = t.integer("head_dim");
  c.rotary_dim = c.head_dim;
  c.mask_id = -1;
  if (c.eos_id < 0 && !c.uniform.eos_ids.empty()) c.eos_id = c.uniform.eos_ids[0];
  if (c.bos_id < 0) c.bos_id = t.token_or("bos_token_id", -1);
  if (c.pad_id < 0 || c.pad_id == c.eos_id) c.pad_id = t.token_or("pad_token_id", 0);
  for (const int32_t e : c.uniform.eos_ids)
    if (e < 0 || e >= c.vocab)
      fail(t.where + ": eos_token_id " + std::to_string(e) + " is outside the vocabulary");
  const std::filesystem::path gp = dir / "generation_config.json";
  if (!std::filesystem::exists(gp)) return;
  std::ifstream f(gp);
  const nlohmann::json g = nlohmann::json::parse(f, nullptr, false);
  if (!g.is_object()) fail(gp.string() + ": not a JSON object");
  const ConfigReader r{g, gp.string()};
  ModelConfig::Uniform& u = c.uniform;
  u.max_new_tokens = r.integer_or("max_new_tokens", u.max_new_tokens);
  u.steps = static_cast<int>(r.integer_or("max_denoising_steps", u.steps));
  // Numbers >= 0 read as doubles (the reference's Python floats; 0 means "no early stop" for two of them).
  auto number = [&](const nlohmann::json& o, const ConfigReader& rd, const char* key, double def) {
    if (!o.contains(key) || o[key].is_null()) return def;
    if (!o[key].is_number() || o[key].get<double>() < 0) rd.bad(key, "must be a number >= 0");
    return o[key].get<double>();
  };
  u.t_min = number(g, r, "t_min", u.t_min);
  u.t_max = number(g, r, "t_max", u.t_max);
  if (!(u.t_min > 0 && u.t_min <= u.t_max)) r.bad("t_min", "must be positive and not exceed t_max");
  u.stability = static_cast<int>(number(g, r, "stability_threshold", u.stability));
  u.confidence = number(g, r, "confidence_threshold", u.confidence);
  if (!r.absent("sampler_config")) {
    const ConfigReader s{g["sampler_config"], gp.string() + " sampler_config"};
    if (!s.j.is_object()) r.bad("sampler_config", "must be an object");
    const std::string type =
        s.j.value("type", s.j.value("_target_", std::string("EntropyBoundSamplerConfig")));
    if (type.find("EntropyBound") == std::string::npos)
      s.bad("type", "is not supported (EntropyBoundSamplerConfig only)");
    u.entropy_bound = number(g["sampler_config"], s, "entropy_bound", u.entropy_bound);
  }
}

// google/diffusiongemma-26B-A4B-it (spec section 1).
void diffusiongemma_26b(ModelConfig& c) {
  c.model_type = "diffusion_gemma";
  c.hidden = 2816;
  c.n_layers = 30;
  c.n_heads = 16;
  c.n_kv_heads = 8;
  c.head_dim = 256;
  c.intermediate = 2112;
  c.vocab = 262144;
  c.max_positions = 262144;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-6f;
  c.tie_embeddings = true;
  c.moe.n_experts = 128;
  c.moe.top_k = 8;
  c.moe.expert_inter = 704;
  c.moe.norm_topk = true;
  ModelConfig::Uniform& u = c.uniform;
  u.canvas = 256;
  u.window = 1024;
  for (int l = 0; l < 30; ++l) u.global_layer.push_back(l % 6 == 5 ? 1 : 0);
  u.global_kv_heads = 2;
  u.global_head_dim = 512;
  u.global_rotary = 128;
  u.global_theta = 1e6f;
  u.softcap = 30.0f;
  u.eos_ids = {1, 106, 50};
  c.eos_id = 1;
  c.bos_id = 2;
  c.pad_id = 0;
}

// Its real layers, one period of the pattern (5 sliding, 1 global): a step of the 30 layers costs five of
// these layers' share plus the same embedding, LM head and self-conditioning (benchmarks within 24 GiB).
void diffusiongemma_mid(ModelConfig& c) {
  diffusiongemma_26b(c);
  c.n_layers = 6;
  c.uniform.global_layer.resize(6);
}

constexpr GeometryPreset kGeometries[] = {{"diffusiongemma-26b-a4b", diffusiongemma_26b},
                                          {"diffusiongemma-mid", diffusiongemma_mid}};

void bind(Model& m) {
  const ModelConfig& c = m.config();
  TESSERA_CHECK(m.options().act == DType::BF16 || m.options().act == DType::F32,
                "DiffusionGemma computes in bf16 or f32");
  const ModelConfig::Uniform& u = c.uniform;
  const int64_t d = c.hidden, E = c.moe.n_experts, I = c.moe.expert_inter;
  DenseWeights& w = m.weights();
  const std::string top = "model.decoder.";
  w.embed = m.bind(top + "embed_tokens.weight", {c.vocab, d}, true);  // also the LM head and SC's table
  w.lm_head = w.embed;
  w.final_norm = m.bind(top + "norm.weight", {d}, false);
  const std::string sc = top + "self_conditioning.";
  w.sc_norm = m.bind(sc + "pre_norm.weight", {d}, false);
  w.sc_gate = m.bind(sc + "gate_proj.weight", {c.intermediate, d}, true);
  w.sc_up = m.bind(sc + "up_proj.weight", {c.intermediate, d}, true);
  w.sc_down = m.bind(sc + "down_proj.weight", {d, c.intermediate}, true);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    const std::string b = top + "layers." + std::to_string(l) + ".";
    const bool global = c.is_global_layer(l);
    const int64_t hd = global ? u.global_head_dim : c.head_dim;
    const int64_t kv = (global ? u.global_kv_heads : c.n_kv_heads) * hd, q = c.n_heads * hd;
    L.attn_norm = m.bind(b + "input_layernorm.weight", {d}, false);
    L.wq = m.bind(b + "self_attn.q_proj.weight", {q, d}, true);
    L.wk = m.bind(b + "self_attn.k_proj.weight", {kv, d}, true);
    if (!global) L.wv = m.bind(b + "self_attn.v_proj.weight", {kv, d}, true);
    L.wo = m.bind(b + "self_attn.o_proj.weight", {d, q}, true);
    L.q_norm = m.bind(b + "self_attn.q_norm.weight", {hd}, false);
    L.k_norm = m.bind(b + "self_attn.k_norm.weight", {hd}, false);
    L.post_attn_norm = m.bind(b + "post_attention_layernorm.weight", {d}, false);
    L.ffn_norm = m.bind(b + "pre_feedforward_layernorm.weight", {d}, false);
    L.moe_norm = m.bind(b + "pre_feedforward_layernorm_2.weight", {d}, false);
    L.post_dense_norm = m.bind(b + "post_feedforward_layernorm_1.weight", {d}, false);
    L.post_moe_norm = m.bind(b + "post_feedforward_layernorm_2.weight", {d}, false);
    L.post_ffn_norm = m.bind(b + "post_feedforward_layernorm.weight", {d}, false);
    L.w_gate = m.bind(b + "mlp.gate_proj.weight", {c.intermediate, d}, true);
    L.w_up = m.bind(b + "mlp.up_proj.weight", {c.intermediate, d}, true);
    L.w_down = m.bind(b + "mlp.down_proj.weight", {d, c.intermediate}, true);
    // The router reads rmsnorm(h) * router.scale * hidden^-1/2: the constant is folded into its weight.
    L.router = m.bind_scaled(b + "router.proj.weight", {E, d}, 1.0f / std::sqrt(static_cast<float>(d)));
    L.router_norm = m.bind(b + "router.scale", {d}, false);
    L.expert_scale = m.bind_bias(b + "router.per_expert_scale", E);
    // The experts: gate_up_proj [E, 2I, d] (gate rows, then up rows) and down_proj [E, d, I], as views.
    const Tensor gu = m.bind(b + "experts.gate_up_proj", {E, 2 * I, d}, true);
    const Tensor dn = m.bind(b + "experts.down_proj", {E, d, I}, true);
    TESSERA_CHECK(!gu.quantized() && !dn.quantized(), "DiffusionGemma: quantized experts are not supported");
    std::vector<Tensor> t;
    const size_t es = dtype_size(gu.dtype);
    for (int p = 0; p < 3; ++p) {
      for (int64_t e = 0; e < E; ++e) {
        const char* base = static_cast<const char*>(p < 2 ? gu.data : dn.data);
        const size_t off =
            p < 2 ? static_cast<size_t>((e * 2 * I + p * I) * d) * es : static_cast<size_t>(e * d * I) * es;
        void* at = const_cast<char*>(base + off);
        t.push_back(p < 2 ? Tensor(at, gu.dtype, {I, d}, gu.device)
                          : Tensor(at, gu.dtype, {d, I}, gu.device));
      }
    }
    L.experts = MoeExperts{m.expert_table(t), static_cast<int>(E), d, I, gu.dtype};
    L.experts.gelu = true;
    L.scalar_dec = m.scalar(b + "layer_scalar");
    const std::string enc = "model.encoder.language_model.layers." + std::to_string(l) + ".layer_scalar";
    L.scalar_enc = m.has_tensor(enc) ? m.scalar(enc) : L.scalar_dec;
  }
}

}  // namespace

// Every weight of config c in a fixed order (Model::synthetic, planning): random scalars near 1.
DenseWeights diffusion_gemma_layout(const ModelConfig& c, DType act, const WeightMaker& make) {
  const ModelConfig::Uniform& u = c.uniform;
  const int64_t d = c.hidden, E = c.moe.n_experts, I = c.moe.expert_inter, F = c.intermediate;
  auto sd = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  DenseWeights w;
  w.embed = make.tensor({c.vocab, d}, act, 1.0f / std::sqrt(static_cast<float>(d)));
  w.lm_head = w.embed;
  w.final_norm = make.tensor({d}, act, 0.1f);
  w.sc_norm = make.tensor({d}, act, 0.1f);
  w.sc_gate = make.tensor({F, d}, act, sd(d));
  w.sc_up = make.tensor({F, d}, act, sd(d));
  w.sc_down = make.tensor({d, F}, act, sd(F));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    const bool global = c.is_global_layer(l);
    const int64_t hd = global ? u.global_head_dim : c.head_dim;
    const int64_t kv = (global ? u.global_kv_heads : c.n_kv_heads) * hd, q = c.n_heads * hd;
    L.attn_norm = make.tensor({d}, act, 0.1f);
    L.wq = make.tensor({q, d}, act, sd(d));
    L.wk = make.tensor({kv, d}, act, sd(d));
    if (!global) L.wv = make.tensor({kv, d}, act, sd(d));
    L.wo = make.tensor({d, q}, act, sd(q));
    L.q_norm = make.tensor({hd}, act, 0.1f);
    L.k_norm = make.tensor({hd}, act, 0.1f);
    for (Tensor* t : {&L.post_attn_norm, &L.ffn_norm, &L.moe_norm, &L.post_dense_norm, &L.post_moe_norm,
                      &L.post_ffn_norm, &L.router_norm})
      *t = make.tensor({d}, act, 0.1f);
    L.w_gate = make.tensor({F, d}, act, sd(d));
    L.w_up = make.tensor({F, d}, act, sd(d));
    L.w_down = make.tensor({d, F}, act, sd(F));
    L.router = make.tensor({E, d}, act, sd(d));
    L.expert_scale = make.tensor({E}, DType::F32, 0.1f);
    std::vector<Tensor> experts;
    const auto& expert = make.expert ? make.expert : make.tensor;
    for (int p = 0; p < 3; ++p)
      for (int64_t e = 0; e < E; ++e)
        experts.push_back(p < 2 ? expert({I, d}, act, sd(d)) : expert({d, I}, act, sd(I)));
    L.experts = MoeExperts{make.table(experts), static_cast<int>(E), d, I, act};
    L.experts.gelu = true;
  }
  return w;
}

constexpr FamilyInfo kDiffusionGemmaFamily{
    .files = {.name = "diffusion-gemma",
              .config = {.model_types = "diffusion_gemma",
                         .claims = claims,
                         .read = read_config,
                         .finish = finish}},
    .geometries = kGeometries,
    .bind = bind,
    .layout = diffusion_gemma_layout,
    .graph = build_diffusion_gemma_graph,
};

}  // namespace tessera
