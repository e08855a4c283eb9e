#include "io/config.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf_model.h"

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
    // A default can be what is wrong (partial_rotary_factor's with an odd head_dim): j[key] of a const
    // json is undefined for an absent key.
    fail(where + ": field '" + key + "' " + want + ", got " +
         (absent(key) ? "none (the default)" : j.at(key).dump()));
  }
  int64_t integer(const char* key) const {
    if (absent(key)) fail(where + ": missing field '" + key + "'");
    // Below 2^31: sizes are multiplied together and some are stored as int.
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > INT32_MAX)
      bad(key, "must be a positive integer (below 2^31)");
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
    if (!j[key].is_number() || !(j[key].get<double>() > 0) || j[key].get<double>() > 3.4e38)
      bad(key, "must be a positive number");
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
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > INT32_MAX)
      fail(where + ": field '" + std::string(key) + "' must be a token id, got " + v.dump());
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

// LLaDA2.0 (model_type "llada2_moe", LLaDA2MoeModelLM; Ling-2.0 / BailingMoeV2 layers). Field names and
// semantics from inclusionAI's configuration_llada2_moe.py / modeling_llada2_moe.py (LLaDA2MoeConfig,
// LLaDA2MoeGate, LLaDA2MoeSparseMoeBlock; read in a public copy, dllm/pipelines/llada2/models/ of
// yks23/Information-Gain-Sampler) and the LLaDA2.0-mini config.json as quoted by xllm's loader test:
//   - layers >= first_k_dense_replace are MoE (num_experts routed experts of moe_intermediate_size, top
//     num_experts_per_tok), earlier ones a dense SwiGLU of intermediate_size;
//   - num_shared_experts (null/0 = none): one shared SwiGLU of moe_intermediate_size * num_shared_experts
//     (moe_shared_expert_intermediate_size, a Ling-2.0 field, is ignored as the reference ignores it);
//   - router: s = sigmoid(fp32 logits); selection on s + mlp.gate.expert_bias (a buffer that the
//     reference always has; zeros unless trained), groups: n_group groups scored by the sum of their
//     top-2 biased scores, topk_group groups kept; weights = the UNBIASED s of the chosen experts,
//     divided by their sum (+1e-20) when top_k > 1, times routed_scaling_factor. The reference always
//     renormalises (it has no norm_topk_prob switch): norm_topk_prob=false is rejected;
//   - attention.query_key_value fused [(H + 2 KV) * head_dim, hidden] (+ bias if use_qkv_bias),
//     qk-norm if use_qk_norm, attention.dense (+ bias if use_bias, which tessera does not support);
//   - partial_rotary_factor (default 0.5) of head_dim is rotated; rope_scaling must be null;
//   - score_function: the reference hard-codes sigmoid; any other value is refused.
// The block-causal attention block is not in config.json: it is the generation's block_length (32 by
// default in LLaDA2MoeModelLM.generate and SGLang's DLLM_PARAMS); mask_block starts at 32 and the
// engine follows the block length of each generation (Engine::set_attention_block).
void read_llada2(const Reader& r, ModelConfig& c) {
  c.family = Family::LLaDA2;
  c.hidden = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  // LLaDA2MoeConfig's default num_key_value_heads is 0: absent or 0 would break its own attention.
  c.n_kv_heads = r.integer("num_key_value_heads");
  c.vocab = r.integer("vocab_size");
  c.max_positions = r.integer_or("max_position_embeddings", 16384);
  c.rope_theta = r.number_or("rope_theta", 10000.0f);
  c.rms_eps = r.number_or("rms_norm_eps", 1e-5f);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.qk_norm = r.boolean_or("use_qk_norm", true);
  c.qkv_bias = r.boolean_or("use_qkv_bias", false);
  c.mask_block = 32;
  r.one_of("hidden_act", {"silu"}, "is not supported (silu only)");
  // use_bias (a bias on attention.dense; LLaDA2MoeConfig's default is true) is not supported: true is
  // refused here, and when the field is absent the binder refuses a checkpoint that has the bias.
  if (r.boolean_or("use_bias", false))
    fail(r.where + ": use_bias=true (a bias on attention.dense) is not supported");
  if (r.boolean_or("norm_head", false)) fail(r.where + ": norm_head=true is not supported");
  if (!r.absent("rope_scaling")) r.bad("rope_scaling", "is not supported (must be null)");
  if (r.boolean_or("use_sliding_window", false)) fail(r.where + ": use_sliding_window=true is not supported");
  if (!r.absent("num_nextn_predict_layers") && r.j["num_nextn_predict_layers"] != 0)
    r.bad("num_nextn_predict_layers", "is not supported (multi-token prediction layers; must be 0)");

  MoeConfig& m = c.moe;
  m.n_experts = r.integer("num_experts");
  m.top_k = r.integer("num_experts_per_tok");
  if (m.top_k > m.n_experts) r.bad("num_experts_per_tok", "must not exceed num_experts");
  m.expert_inter = r.integer("moe_intermediate_size");
  int64_t first_dense = 0;
  if (!r.absent("first_k_dense_replace")) {
    const json& f = r.j["first_k_dense_replace"];
    if (!f.is_number_integer() || f.get<int64_t>() < 0 || f.get<int64_t>() > c.n_layers)
      r.bad("first_k_dense_replace", "must be an integer in [0, num_hidden_layers]");
    first_dense = f.get<int64_t>();
  }
  m.moe_layer.assign(static_cast<size_t>(c.n_layers), 1);
  for (int64_t l = 0; l < first_dense; ++l) m.moe_layer[static_cast<size_t>(l)] = 0;
  c.intermediate = first_dense > 0 ? r.integer("intermediate_size") : r.size_or_none("intermediate_size");
  const int64_t n_shared = r.size_or_none("num_shared_experts");
  m.n_shared = n_shared > 0 ? 1 : 0;  // num_shared_experts experts run as one SwiGLU of their total size
  m.shared_inter = n_shared * m.expert_inter;
  r.one_of("score_function", {"sigmoid"}, "is not supported (LLaDA2 routes with \"sigmoid\")");
  m.score = RouterScore::Sigmoid;
  // The reference's gate always owns expert_bias; a checkpoint that says it has none is refused rather
  // than routed without the bias the weights may still carry.
  if (!r.boolean_or("moe_router_enable_expert_bias", true))
    fail(r.where +
         ": moe_router_enable_expert_bias=false is not supported (LLaDA2's router always adds "
         "mlp.gate.expert_bias)");
  m.expert_bias = true;
  if (!r.boolean_or("norm_topk_prob", true))
    fail(r.where +
         ": norm_topk_prob=false is not supported (LLaDA2's router always renormalises the top-k "
         "weights)");
  m.norm_topk = m.top_k > 1;
  m.routed_scale = r.number_or("routed_scaling_factor", 2.5f);
  m.n_group = r.integer_or("n_group", 8);
  m.topk_group = r.integer_or("topk_group", 4);
  if (m.n_experts % m.n_group != 0)
    r.bad("n_group", "must divide num_experts " + std::to_string(m.n_experts));
  if (m.n_experts / m.n_group < 2)
    r.bad("n_group", "must leave at least 2 experts per group (groups are scored by their top-2)");
  if (m.topk_group > m.n_group) r.bad("topk_group", "must not exceed n_group");
  if (m.topk_group * (m.n_experts / m.n_group) < m.top_k)
    r.bad("topk_group", "keeps fewer experts than num_experts_per_tok");
}

// partial_rotary_factor: RoPE on the first factor * head_dim dims of each head.
// LLaDA2MoeConfig defaults the factor to 0.5; a "rotary_dim" field (Ling-2.0 configs carry one), when
// present, must agree.
int64_t rotary_dim_of(const Reader& r, int64_t head_dim, float default_factor) {
  if (r.absent("partial_rotary_factor") && r.absent("rotary_dim") && default_factor == 1.0f &&
      head_dim % 2 != 0)
    fail(r.where + ": the head dimension " + std::to_string(head_dim) +
         " is odd; RoPE rotates pairs of dimensions (hidden size / heads, or head_dim, must be even)");
  const double f = r.number_or("partial_rotary_factor", default_factor);
  const double dims = f * static_cast<double>(head_dim);
  const auto rot = static_cast<int64_t>(std::llround(dims));
  if (f > 1.0 || rot <= 0 || rot % 2 != 0 || std::fabs(dims - static_cast<double>(rot)) > 1e-6)
    r.bad("partial_rotary_factor",
          "must be in (0, 1] and give an even number of rotary dims of head_dim " + std::to_string(head_dim));
  if (!r.absent("rotary_dim") && r.integer("rotary_dim") != rot)
    r.bad("rotary_dim", "contradicts partial_rotary_factor * head_dim = " + std::to_string(rot));
  return rot;
}

// The ids of the added tokens named in `want` from a tokenizer.json (-1 each where the file or the token
// is absent; the first match wins), read in one SAX pass that stops at the end of the top-level
// "added_tokens" array (Hugging Face files put it before the multi-megabyte vocabulary and merges): a
// full parse of a 157k-token file costs about 0.2 s. A syntax error before that point fails here; a
// later one is the tokenizer loader's to report.
class AddedTokenIds final : public nlohmann::json_sax<json> {
 public:
  explicit AddedTokenIds(std::vector<std::string> want) : want_(std::move(want)), ids_(want_.size(), -1) {}
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::string& error() const { return error_; }

  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(depth_ == 1 && key_ == "added_tokens"); }
  bool end_object() override {
    if (in_tokens_ && depth_ == 3 && elem_id_ >= 0) {
      for (size_t i = 0; i < want_.size(); ++i)
        if (ids_[i] < 0 && content_ == want_[i]) ids_[i] = static_cast<int32_t>(elem_id_);
    }
    --depth_;
    return true;
  }
  bool end_array() override {
    const bool done = in_tokens_ && depth_ == 2;
    --depth_;
    return !done;  // false stops the parse: everything wanted has been read
  }
  bool key(string_t& k) override {
    if (depth_ == 1) key_ = k;
    if (in_tokens_ && depth_ == 3) elem_key_ = k;
    return true;
  }
  bool string(string_t& v) override {
    if (in_tokens_ && depth_ == 3 && elem_key_ == "content") content_ = v;
    return true;
  }
  bool number_integer(number_integer_t v) override { return id(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return id(v <= static_cast<number_unsigned_t>(INT32_MAX) ? static_cast<int64_t>(v) : -1);
  }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool boolean(bool) override { return true; }
  bool null() override { return true; }
  bool binary(binary_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

 private:
  bool open(bool tokens_array) {
    ++depth_;
    if (tokens_array) in_tokens_ = true;
    if (in_tokens_ && depth_ == 3) {  // an element of added_tokens
      elem_key_.clear();
      content_.clear();
      elem_id_ = -1;
    }
    return true;
  }
  bool id(int64_t v) {
    if (in_tokens_ && depth_ == 3 && elem_key_ == "id") elem_id_ = v;
    return true;
  }
  std::vector<std::string> want_;
  std::vector<int32_t> ids_;
  std::string error_, key_, elem_key_, content_;
  int depth_ = 0;
  bool in_tokens_ = false;
  int64_t elem_id_ = -1;
};

std::vector<int32_t> added_token_ids(const fs::path& p, std::vector<std::string> want) {
  AddedTokenIds sax(std::move(want));
  std::ifstream f(p, std::ios::binary);
  if (!f) return sax.ids();
  json::sax_parse(f, &sax);
  if (!sax.error().empty()) fail(p.string() + ": not valid JSON: " + sax.error());
  return sax.ids();
}

}  // namespace

ModelConfig load_config(const fs::path& dir) {
  if (is_gguf_file(dir)) return gguf_config(*GgufFile::open(dir));
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
  } else if (c.model_type == "llada2_moe") {
    read_llada2(r, c);
  } else {
    fail(p.string() + ": model_type '" + c.model_type +
         "' is not supported (supported: llada, Dream, lladamoe / llada_moe, llada2_moe)");
  }
  if (r.absent("head_dim") && c.hidden % c.n_heads != 0)
    fail(p.string() + ": hidden size is not a multiple of the head count (and there is no head_dim)");
  if (c.n_heads % c.n_kv_heads != 0) fail(p.string() + ": head count is not a multiple of the KV head count");
  c.head_dim = r.integer_or("head_dim", c.hidden / c.n_heads);
  c.rotary_dim = rotary_dim_of(r, c.head_dim, c.family == Family::LLaDA2 ? 0.5f : 1.0f);
  c.causal = r.boolean_or("is_causal", false);
  c.rope_interleaved = r.boolean_or("rope_interleaved", false);
  c.mask_id = r.token_or("mask_token_id", -1);
  c.eos_id = r.token_or("eos_token_id", -1);
  c.bos_id = r.token_or("bos_token_id", -1);
  c.pad_id = r.token_or("pad_token_id", c.eos_id);
  if (c.family == Family::LLaDA2) {
    // LLaDA2.0's config.json names no mask or EOS token (LLaDA2MoeModelLM.generate takes mask_id 156895
    // and eos_id 156892 as arguments): they are the tokenizer's <|mask|> and <|endoftext|>.
    if (c.mask_id < 0 || c.eos_id < 0) {
      const auto ids = added_token_ids(dir / "tokenizer.json", {"<|mask|>", "<|endoftext|>"});
      if (c.mask_id < 0) c.mask_id = ids[0];
      if (c.eos_id < 0) c.eos_id = ids[1];
    }
  }
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
