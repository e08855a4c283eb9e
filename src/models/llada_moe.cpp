// LLaDA-MoE (LLaDA-MoE-7B-A1B; model_type "lladamoe" / "llada_moe", LLaDAMoEModelLM, OLMoE-style
// layers): bidirectional attention with qk-norm (per-head RMSNorm of q and k before RoPE), MoE FFN
// with a softmax router (mlp.gate) over mlp.experts.E.{gate,up,down}_proj, top-k weights not
// renormalised unless norm_topk_prob; dense layers (moe_layer_freq 0) use mlp.{gate,up,down}_proj;
// an optional shared expert (shared_expert_intermediate_size) is shared_expert.{gate,up,down}_proj.
// Logits are not shifted. GGUF: architecture "llada-moe", the experts stacked per projection.
#include "models/hf_layout.h"
#include "models/registry.h"

namespace tessera {
namespace {

// LLaDA-MoE checkpoints were published with model_type "llada" and the MoE field names.
bool claims(const std::string& model_type, const ConfigReader& r) {
  const bool moe_fields = r.j.contains("num_experts") && !r.j.contains("d_model");
  return model_type == "lladamoe" || model_type == "llada_moe" || (model_type == "llada" && moe_fields);
}

// LLaDA-MoE-7B-A1B (LLaDAMoEConfig; OLMoE-style layers): softmax router over the experts, top-k
// without renormalisation unless norm_topk_prob, optional dense layers (moe_layer_freq 0).
void read_config(const ConfigReader& r, ModelConfig& c) {
  c.hidden = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer_or("num_key_value_heads", c.n_heads);
  c.vocab = r.integer("vocab_size");
  c.max_positions = r.integer_or("max_position_embeddings", 4096);
  c.rope_theta = r.number_or("rope_theta", 10000.0f);
  c.rms_eps = r.number_or("rms_norm_eps", 1e-5f);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.qk_norm = r.boolean_or("qk_layernorm", true);
  r.one_of("hidden_act", {"silu"}, "is not supported (silu only)");
  if (r.boolean_or("attention_bias", false)) fail(r.where + ": attention_bias=true is not supported");
  if (!r.absent("clip_qkv")) r.bad("clip_qkv", "is not supported (must be null)");
  if (!r.absent("rope_scaling")) r.bad("rope_scaling", "is not supported (must be null)");

  MoeConfig& m = c.moe;
  m.n_experts = r.integer("num_experts");
  m.top_k = r.integer("num_experts_per_tok");
  if (m.top_k > m.n_experts) r.bad("num_experts_per_tok", "must not exceed num_experts");
  const bool has_expert = !r.absent("expert_intermediate_size"), has_moe = !r.absent("moe_intermediate_size");
  if (!has_expert && !has_moe) fail(r.where + ": missing field 'expert_intermediate_size'");
  m.expert_inter = has_expert ? r.integer("expert_intermediate_size") : r.integer("moe_intermediate_size");
  if (has_expert && has_moe && r.integer("moe_intermediate_size") != m.expert_inter)
    r.bad("moe_intermediate_size", "contradicts expert_intermediate_size");
  c.intermediate = r.size_or_none("dense_intermediate_size");
  m.shared_inter = r.size_or_none("shared_expert_intermediate_size");  // a shared expert on MoE layers
  m.n_shared = m.shared_inter > 0 ? 1 : 0;
  // The reference (modeling_lladamoe.py) always routes with softmax and, with expert bias on, adds
  // the bias to the routing WEIGHTS; tessera's router uses a bias for selection only.
  r.one_of("moe_router_score_function", {"softmax"}, "must be \"softmax\" for LLaDA-MoE (or null)");
  if (r.boolean_or("moe_router_enable_expert_bias", false)) {
    fail(r.where +
         ": moe_router_enable_expert_bias=true is not supported for LLaDA-MoE (its reference adds "
         "the bias to the routing weights; tessera applies a bias to expert selection only)");
  }
  m.score = RouterScore::Softmax;
  m.norm_topk = r.boolean_or("norm_topk_prob", false);
  m.routed_scale = r.number_or("routed_scaling_factor", 1.0f);
  m.moe_layer.assign(static_cast<size_t>(c.n_layers), 1);
  if (!r.absent("moe_layer_freq")) {
    const nlohmann::json& f = r.j["moe_layer_freq"];
    if (!f.is_array() || static_cast<int64_t>(f.size()) != c.n_layers)
      r.bad("moe_layer_freq", "must be a list of num_hidden_layers integers (0 = dense layer)");
    for (size_t l = 0; l < f.size(); ++l) {
      if (!f[l].is_number_integer() || f[l].get<int64_t>() < 0)
        r.bad("moe_layer_freq", "must hold non-negative integers");
      m.moe_layer[l] = f[l].get<int64_t>() != 0 ? 1 : 0;
    }
  }
  for (uint8_t is_moe : m.moe_layer) {
    if (is_moe == 0 && c.intermediate <= 0)
      fail(r.where + ": moe_layer_freq has dense layers but dense_intermediate_size is missing");
  }
}

// The MoE metadata of a GGUF file (a = "llada-moe."): experts, routing, and which layers are dense.
void read_gguf_ffn(const GgufFile& g, const std::string& a, ModelConfig& c) {
  const std::string where = g.path().string();
  MoeConfig& m = c.moe;
  m.n_experts = gguf_positive(g, a + "expert_count", g.require_int(a + "expert_count"));
  m.top_k = gguf_positive(g, a + "expert_used_count", g.require_int(a + "expert_used_count"));
  if (m.top_k > m.n_experts) fail(where + ": expert_used_count exceeds expert_count");
  m.score = RouterScore::Softmax;
  m.norm_topk = g.get_bool(a + "expert_weights_norm", false);
  m.routed_scale = static_cast<float>(g.get_float(a + "expert_weights_scale", 1.0));
  if (g.get_int(a + "expert_gating_func", 1) != 1)
    fail(where + ": " + a + "expert_gating_func is not softmax (the only router LLaDA-MoE has)");
  m.moe_layer.assign(static_cast<size_t>(c.n_layers), 1);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const GgufTensor* gate = g.find_tensor(b + "ffn_gate_exps.weight");
    if (gate == nullptr) {
      m.moe_layer[static_cast<size_t>(l)] = 0;
      const GgufTensor* dense = g.find_tensor(b + "ffn_gate.weight");
      if (dense == nullptr) fail(where + ": layer " + std::to_string(l) + " has neither experts nor an FFN");
      c.intermediate = dense->ne.size() == 2 ? dense->ne[1] : 0;
      continue;
    }
    if (gate->ne.size() != 3 || gate->ne[2] != m.n_experts)
      fail(where + ": " + gate->name + " does not stack expert_count experts");
    m.expert_inter = gate->ne[1];
    if (const GgufTensor* sh = g.find_tensor(b + "ffn_gate_shexp.weight")) {
      m.n_shared = 1;
      m.shared_inter = sh->ne.size() == 2 ? sh->ne[1] : 0;
    }
  }
  const int64_t declared = g.get_int(a + "expert_feed_forward_length", m.expert_inter);
  if (declared != m.expert_inter)
    fail(where + ": expert_feed_forward_length " + std::to_string(declared) +
         " contradicts the expert tensors");
}

constexpr GgufFormat gguf_format() {
  GgufFormat f = hf_gguf_format("llada-moe");
  f.ffn = read_gguf_ffn;
  return f;
}

// LLaDA-MoE-7B-A1B (specs/models.md; rope_theta, eps and context [verify] against its config.json).
void llada_moe_7b(ModelConfig& c) {
  c.model_type = "lladamoe";
  c.hidden = 2048;
  c.n_layers = 16;
  c.n_heads = c.n_kv_heads = 16;
  c.vocab = 157184;
  c.max_positions = 8192;
  c.rope_theta = 50000.0f;
  c.rms_eps = 1e-5f;
  c.qk_norm = true;
  c.moe.n_experts = 64;
  c.moe.top_k = 8;
  c.moe.expert_inter = 1024;
  c.moe.moe_layer.assign(16, 1);
  c.mask_id = 156895;
  c.eos_id = 156892;
}

// Its real layers, 4 of them.
void llada_moe_mid(ModelConfig& c) {
  llada_moe_7b(c);
  c.n_layers = 4;
  c.moe.moe_layer.resize(4);
}

constexpr GeometryPreset kGeometries[] = {{"llada-moe-7b", llada_moe_7b}, {"llada-moe-mid", llada_moe_mid}};

void bind(Model& m) {
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
    m.layer_bound(l);
  }
}

}  // namespace

constexpr FamilyInfo kLladaMoeFamily{
    .files = {.name = "llada-moe",
              .config = {.model_types = "lladamoe / llada_moe", .claims = claims, .read = read_config},
              .gguf = gguf_format()},
    .geometries = kGeometries,
    .bind = bind,
};

}  // namespace tessera
