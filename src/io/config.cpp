#include "io/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera {
namespace fs = std::filesystem;
using json = nlohmann::json;

const char* family_name(Family f) {
  switch (f) {
    case Family::LLaDA:
      return "llada";
    case Family::Dream:
      return "dream";
    case Family::LLaDAMoE:
      return "llada-moe";
    case Family::LLaDA2:
      return "llada2";
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  std::string where;
  bool absent(const char* key) const { return !j.contains(key) || j[key].is_null(); }
  [[noreturn]] void bad(const char* key, const std::string& want) const {
    fail(where + ": field '" + key + "' " + want + ", got " + j[key].dump());
  }
  int64_t integer(const char* key) const {
    if (absent(key)) fail(where + ": missing field '" + key + "'");
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0) bad(key, "must be a positive integer");
    return j[key].get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t def) const { return absent(key) ? def : integer(key); }
  // An optional size: null, absent, 0 or -1 (LLaDAMoEConfig's "unset" default) mean none (0).
  int64_t size_or_none(const char* key) const {
    if (absent(key)) return 0;
    if (j[key].is_number_integer() && (j[key].get<int64_t>() == 0 || j[key].get<int64_t>() == -1)) return 0;
    return integer(key);
  }
  float number_or(const char* key, float def) const {
    if (absent(key)) return def;
    if (!j[key].is_number() || j[key].get<double>() <= 0) bad(key, "must be a positive number");
    return j[key].get<float>();
  }
  bool boolean_or(const char* key, bool def) const {
    if (absent(key)) return def;
    if (!j[key].is_boolean()) bad(key, "must be true or false");
    return j[key].get<bool>();
  }
  int32_t token_or(const char* key, int32_t def) const {
    if (absent(key)) return def;
    const json& v = j[key].is_array() && !j[key].empty() ? j[key][0] : j[key];
    if (!v.is_number_integer()) fail(where + ": field '" + std::string(key) + "' must be a token id");
    return v.get<int32_t>();
  }
  // A string field that, when present, must be one of the values tessera implements.
  std::string one_of(const char* key, std::initializer_list<const char*> ok, const std::string& why) const {
    if (absent(key)) return *ok.begin();
    for (const char* v : ok)
      if (j[key].is_string() && j[key].get<std::string>() == v) return v;
    bad(key, why);
  }
};

void read_llada(const Reader& r, ModelConfig& c) {
  c.family = Family::LLaDA;
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

void read_dream(const Reader& r, ModelConfig& c) {
  c.family = Family::Dream;
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

// LLaDA-MoE-7B-A1B (LLaDAMoEConfig; OLMoE-style layers): softmax router over the experts, top-k
// without renormalisation unless norm_topk_prob, optional dense layers (moe_layer_freq 0).
void read_llada_moe(const Reader& r, ModelConfig& c) {
  c.family = Family::LLaDAMoE;
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
    const json& f = r.j["moe_layer_freq"];
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

// partial_rotary_factor: RoPE on the first factor * head_dim dims of each head.
int64_t rotary_dim_of(const Reader& r, int64_t head_dim) {
  const double f = r.number_or("partial_rotary_factor", 1.0f);
  const double dims = f * static_cast<double>(head_dim);
  const auto rot = static_cast<int64_t>(std::llround(dims));
  if (f > 1.0 || rot <= 0 || rot % 2 != 0 || std::fabs(dims - static_cast<double>(rot)) > 1e-6)
    r.bad("partial_rotary_factor",
          "must be in (0, 1] and give an even number of rotary dims of head_dim " + std::to_string(head_dim));
  return rot;
}

}  // namespace

ModelConfig load_config(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  if (!fs::is_directory(dir)) fail("model directory " + dir.string() + " does not exist");
  std::ifstream f(p);
  if (!f) fail("cannot read " + p.string() + " (is " + dir.string() + " a model directory?)");
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    fail(p.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) fail(p.string() + ": expected a JSON object");
  const Reader r{j, p.string()};
  ModelConfig c;
  if (!j.contains("model_type") || !j["model_type"].is_string())
    fail(p.string() + ": missing field 'model_type'");
  c.model_type = j["model_type"].get<std::string>();
  // LLaDA-MoE checkpoints were published with model_type "llada" and the MoE field names.
  const bool moe_fields = j.contains("num_experts") && !j.contains("d_model");
  if (c.model_type == "lladamoe" || c.model_type == "llada_moe" || (c.model_type == "llada" && moe_fields)) {
    read_llada_moe(r, c);
  } else if (c.model_type == "llada") {
    read_llada(r, c);
  } else if (c.model_type == "Dream" || c.model_type == "dream") {
    read_dream(r, c);
  } else {
    fail(p.string() + ": model_type '" + c.model_type +
         "' is not supported (supported: llada, Dream, lladamoe / llada_moe)");
  }
  if (c.hidden % c.n_heads != 0) fail(p.string() + ": hidden size is not a multiple of the head count");
  if (c.n_heads % c.n_kv_heads != 0) fail(p.string() + ": head count is not a multiple of the KV head count");
  c.head_dim = r.integer_or("head_dim", c.hidden / c.n_heads);
  c.rotary_dim = rotary_dim_of(r, c.head_dim);
  c.causal = r.boolean_or("is_causal", false);
  c.rope_interleaved = r.boolean_or("rope_interleaved", false);
  c.mask_id = r.token_or("mask_token_id", -1);
  c.eos_id = r.token_or("eos_token_id", -1);
  c.bos_id = r.token_or("bos_token_id", -1);
  c.pad_id = r.token_or("pad_token_id", c.eos_id);
  if (c.mask_id >= c.vocab) fail(p.string() + ": mask_token_id is outside the vocabulary");
  return c;
}

namespace {

int64_t count_params(const ModelConfig& c, bool active) {
  const int64_t d = c.hidden, kv = c.n_kv_heads * c.head_dim, q = c.n_heads * c.head_dim;
  int64_t attn = d * q + 2 * d * kv + q * d + 2 * d;
  if (c.qkv_bias) attn += q + 2 * kv;
  if (c.qk_norm) attn += 2 * c.head_dim;
  const MoeConfig& m = c.moe;
  const int64_t routed = active ? m.top_k : m.n_experts;
  const int64_t moe_ffn = routed * 3 * d * m.expert_inter + m.n_experts * d +
                          (m.expert_bias ? m.n_experts : 0) + 3 * d * m.shared_inter;
  int64_t total = c.vocab * d * (c.tie_embeddings ? 1 : 2) + d;
  for (int64_t l = 0; l < c.n_layers; ++l)
    total += attn + (c.is_moe_layer(l) ? moe_ffn : 3 * d * c.intermediate);
  return total;
}

}  // namespace

int64_t ModelConfig::param_count() const {
  return count_params(*this, false);
}
int64_t ModelConfig::active_param_count() const {
  return count_params(*this, true);
}

}  // namespace tessera
