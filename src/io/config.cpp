#include "io/config.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/family_files.h"
#include "io/gguf_model.h"

namespace tessera {
namespace fs = std::filesystem;
using json = nlohmann::json;

const char* family_name(Family f) {
  const auto files = family_files();
  const auto i = static_cast<size_t>(f);
  return i < files.size() ? files[i]->name : "?";
}

namespace {

// partial_rotary_factor: RoPE on the first factor * head_dim dims of each head.
// LLaDA2MoeConfig defaults the factor to 0.5; a "rotary_dim" field (Ling-2.0 configs carry one), when
// present, must agree.
int64_t rotary_dim_of(const ConfigReader& r, int64_t head_dim, float default_factor) {
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

}  // namespace

std::vector<int32_t> added_token_ids(const fs::path& p, std::vector<std::string> want) {
  AddedTokenIds sax(std::move(want));
  std::ifstream f(p, std::ios::binary);
  if (!f) return sax.ids();
  json::sax_parse(f, &sax);
  if (!sax.error().empty()) fail(p.string() + ": not valid JSON: " + sax.error());
  return sax.ids();
}

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
  const ConfigReader r{j, p.string()};
  ModelConfig c;
  if (!j.contains("model_type") || !j["model_type"].is_string())
    fail(p.string() + ": missing field 'model_type'");
  c.model_type = j["model_type"].get<std::string>();
  // The family that claims the model_type (LLaDA-MoE checkpoints were published with model_type
  // "llada" and the MoE field names: models/llada_moe.cpp).
  const auto families = family_files();
  const ConfigFormat* fam = nullptr;
  for (size_t i = 0; i < families.size() && fam == nullptr; ++i) {
    const ConfigFormat& cf = families[i]->config;
    if (cf.claims != nullptr && cf.claims(c.model_type, r)) {
      c.family = static_cast<Family>(i);
      fam = &cf;
    }
  }
  if (fam == nullptr) {
    std::string names;
    for (const FamilyFiles* ff : families) {
      if (ff->config.model_types == nullptr) continue;
      names += (names.empty() ? "" : ", ") + std::string(ff->config.model_types);
    }
    fail(p.string() + ": model_type '" + c.model_type + "' is not supported (supported: " + names + ")");
  }
  fam->read(r, c);
  if (r.absent("head_dim") && c.hidden % c.n_heads != 0)
    fail(p.string() + ": hidden size is not a multiple of the head count (and there is no head_dim)");
  if (c.n_heads % c.n_kv_heads != 0) fail(p.string() + ": head count is not a multiple of the KV head count");
  c.head_dim = r.integer_or("head_dim", c.hidden / c.n_heads);
  c.rotary_dim = rotary_dim_of(r, c.head_dim, fam->rotary_factor);
  c.causal = r.boolean_or("is_causal", false);
  c.rope_interleaved = r.boolean_or("rope_interleaved", false);
  c.mask_id = r.token_or("mask_token_id", -1);
  c.eos_id = r.token_or("eos_token_id", -1);
  c.bos_id = r.token_or("bos_token_id", -1);
  c.pad_id = r.token_or("pad_token_id", c.eos_id);
  if (fam->finish != nullptr) fam->finish(dir, c);
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
  if (c.is_uniform()) {  // Gemma 4 layers: the dense MLP and the experts side by side
    const ModelConfig::Uniform& u = c.uniform;
    const int64_t gq = c.n_heads * u.global_head_dim, gkv = u.global_kv_heads * u.global_head_dim;
    const int64_t global_attn = 2 * d * gq + d * gkv + 2 * u.global_head_dim;  // q, o, k (= v), norms
    const int64_t sliding_attn = 2 * d * q + 2 * d * kv + 2 * c.head_dim;
    const int64_t per_layer = 3 * d * c.intermediate + routed * 3 * d * m.expert_inter + m.n_experts * d + d +
                              m.n_experts + 7 * d + 1;  // router, its scales, 7 norms, the scalar
    for (int64_t l = 0; l < c.n_layers; ++l)
      total += (c.is_global_layer(l) ? global_attn : sliding_attn) + per_layer;
    return total + 3 * d * c.intermediate + d;  // self-conditioning's MLP and pre-norm
  }
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
