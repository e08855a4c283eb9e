#include "io/config.h"

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
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  std::string where;
  int64_t integer(const char* key) const {
    if (!j.contains(key) || j[key].is_null()) fail(where + ": missing field '" + key + "'");
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0) {
      fail(where + ": field '" + std::string(key) + "' must be a positive integer, got " + j[key].dump());
    }
    return j[key].get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    return integer(key);
  }
  float number_or(const char* key, float def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_number() || j[key].get<double>() <= 0) {
      fail(where + ": field '" + std::string(key) + "' must be a positive number, got " + j[key].dump());
    }
    return j[key].get<float>();
  }
  bool boolean_or(const char* key, bool def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_boolean()) fail(where + ": field '" + std::string(key) + "' must be true or false");
    return j[key].get<bool>();
  }
  int32_t token_or(const char* key, int32_t def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    const json& v = j[key].is_array() && !j[key].empty() ? j[key][0] : j[key];
    if (!v.is_number_integer()) fail(where + ": field '" + std::string(key) + "' must be a token id");
    return v.get<int32_t>();
  }
};

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
  if (c.model_type == "llada") {
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
    if (j.contains("activation_type") && j["activation_type"] != "silu") {
      fail(p.string() + ": activation_type " + j["activation_type"].dump() + " is not supported (silu only)");
    }
    if (r.boolean_or("alibi", false)) fail(p.string() + ": alibi=true is not supported (RoPE only)");
    c.mask_id = r.token_or("mask_token_id", -1);
  } else if (c.model_type == "Dream" || c.model_type == "dream") {
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
    if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
      fail(p.string() + ": hidden_act " + j["hidden_act"].dump() + " is not supported (silu only)");
    }
    c.mask_id = r.token_or("mask_token_id", -1);
  } else {
    fail(p.string() + ": model_type '" + c.model_type + "' is not supported (supported: llada, Dream)");
  }
  if (c.hidden % c.n_heads != 0) fail(p.string() + ": hidden size is not a multiple of the head count");
  if (c.n_heads % c.n_kv_heads != 0) fail(p.string() + ": head count is not a multiple of the KV head count");
  c.head_dim = r.integer_or("head_dim", c.hidden / c.n_heads);
  c.causal = r.boolean_or("is_causal", false);
  c.rope_interleaved = r.boolean_or("rope_interleaved", false);
  c.eos_id = r.token_or("eos_token_id", -1);
  c.bos_id = r.token_or("bos_token_id", -1);
  c.pad_id = r.token_or("pad_token_id", c.eos_id);
  if (c.mask_id >= c.vocab) fail(p.string() + ": mask_token_id is outside the vocabulary");
  return c;
}

int64_t ModelConfig::param_count() const {
  const int64_t d = hidden, kv = n_kv_heads * head_dim, q = n_heads * head_dim;
  int64_t per_layer = d * q + 2 * d * kv + q * d + 3 * d * intermediate + 2 * d;
  if (qkv_bias) per_layer += q + 2 * kv;
  return vocab * d * (tie_embeddings ? 1 : 2) + n_layers * per_layer + d;
}

}  // namespace tessera
