// LLaDA2.0 (model_type "llada2_moe", LLaDA2MoeModelLM; names from inclusionAI's modeling_llada2_moe.py):
//   model.word_embeddings.weight, model.norm.weight, lm_head.weight (or tied);
//   per layer model.layers.N.: input_layernorm, attention.query_key_value (fused rows: H * head_dim of q,
//   then KV * head_dim of k, then of v; + .bias with use_qkv_bias), attention.query_layernorm and
//   attention.key_layernorm [head_dim] (use_qk_norm), attention.dense, post_attention_layernorm;
//   dense layers (< first_k_dense_replace) mlp.{gate,up,down}_proj; MoE layers mlp.gate.weight [E, d]
//   (router), mlp.gate.expert_bias [E], mlp.experts.E.{gate,up,down}_proj, and with shared experts
//   mlp.shared_experts.{gate,up,down}_proj. Block-causal attention, logits not shifted.
// q, k and v are zero-copy row views of the fused weight where the weights stay in the mapped file.
// No GGUF form (llama.cpp has no LLaDA2 architecture).
#include "core/error.h"
#include "models/hf_layout.h"
#include "models/registry.h"

namespace tessera {
namespace {

bool claims(const std::string& model_type, const ConfigReader&) {
  return model_type == "llada2_moe";
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
void read_config(const ConfigReader& r, ModelConfig& c) {
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
    const nlohmann::json& f = r.j["first_k_dense_replace"];
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

// LLaDA2.0's config.json names no mask or EOS token (LLaDA2MoeModelLM.generate takes mask_id 156895 and
// eos_id 156892 as arguments): they are the tokenizer's <|mask|> and <|endoftext|>.
void finish_config(const std::filesystem::path& dir, ModelConfig& c) {
  if (c.mask_id < 0 || c.eos_id < 0) {
    const auto ids = added_token_ids(dir / "tokenizer.json", {"<|mask|>", "<|endoftext|>"});
    if (c.mask_id < 0) c.mask_id = ids[0];
    if (c.eos_id < 0) c.eos_id = ids[1];
  }
}

// LLaDA2.0-mini (specs/models.md; the dimensions agree with its config.json as quoted in public loader
// tests, see read_config above): layer 0 dense, then 256 routed experts (sigmoid + expert bias, 8 groups
// / top-4, renormalised, x2.5) plus one shared expert, partial rotary 0.5, block-causal attention with
// blocks of 32 (the generation's default block length).
void llada2_mini(ModelConfig& c) {
  c.model_type = "llada2_moe";
  c.hidden = 2048;
  c.n_layers = 20;
  c.n_heads = 16;
  c.n_kv_heads = 4;
  c.intermediate = 5120;
  c.vocab = 157184;
  c.max_positions = 32768;
  c.rope_theta = 600000.0f;
  c.rms_eps = 1e-6f;
  c.qk_norm = true;
  c.rotary_dim = 64;
  c.mask_block = 32;
  MoeConfig& m = c.moe;
  m.n_experts = 256;
  m.top_k = 8;
  m.expert_inter = 512;
  m.n_shared = 1;
  m.shared_inter = 512;
  m.score = RouterScore::Sigmoid;
  m.expert_bias = true;
  m.norm_topk = true;
  m.routed_scale = 2.5f;
  m.n_group = 8;
  m.topk_group = 4;
  m.moe_layer.assign(20, 1);
  m.moe_layer[0] = 0;  // first_k_dense_replace 1
  c.mask_id = 156895;
  c.eos_id = 156892;
}

// Its real layers, 4 of them (1 dense).
void llada2_mid(ModelConfig& c) {
  llada2_mini(c);
  c.n_layers = 4;
  c.moe.moe_layer.resize(4);
}

// LLaDA2.0-flash / LLaDA2.1-flash (100B total, 6.1B active; Ling-flash-2.0's layers): 32 layers of hidden
// 4096, 32 query heads and 4 key / value heads of 128, layer 0 dense (9216), then 256 routed experts of
// 1024 (top-8) and one shared expert of 1024, the router as mini's. Not in specs/models.md: the layer,
// hidden, expert and top-k figures agree with a public serving log of the checkpoint; heads and the dense
// FFN are Ling-flash-2.0's config. Check: 102.5B parameters, 6.1B active (the model card's 100B / 6.1B).
void llada2_flash(ModelConfig& c) {
  llada2_mini(c);
  c.hidden = 4096;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.head_dim = 128;
  c.rotary_dim = 64;
  c.intermediate = 9216;
  c.moe.expert_inter = 1024;
  c.moe.shared_inter = 1024;
  c.moe.moe_layer.assign(32, 1);
  c.moe.moe_layer[0] = 0;
}

constexpr GeometryPreset kGeometries[] = {
    {"llada2-mini", llada2_mini}, {"llada2-mid", llada2_mid}, {"llada2-flash", llada2_flash}};

void bind(Model& m) {
  const ModelConfig& c = m.config();
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, qkv = q + 2 * kv;
  DenseWeights& w = m.weights();
  w.embed = m.bind("model.word_embeddings.weight", {c.vocab, d}, false);
  w.final_norm = m.bind("model.norm.weight", {d}, false);
  w.lm_head = c.tie_embeddings ? m.bind("model.word_embeddings.weight", {c.vocab, d}, true)
                               : m.bind("lm_head.weight", {c.vocab, d}, true);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = m.bind(b + "input_layernorm.weight", {d}, false);
    const std::string fused = b + "attention.query_key_value.weight";
    L.wq = m.bind_rows(fused, qkv, d, 0, q, true);
    L.wk = m.bind_rows(fused, qkv, d, q, kv, true);
    L.wv = m.bind_rows(fused, qkv, d, q + kv, kv, true);
    const std::string fused_bias = b + "attention.query_key_value.bias";
    if (c.qkv_bias) {
      L.bq = m.bind_bias_slice(fused_bias, qkv, 0, q);
      L.bk = m.bind_bias_slice(fused_bias, qkv, q, kv);
      L.bv = m.bind_bias_slice(fused_bias, qkv, q + kv, kv);
    } else if (m.has_tensor(fused_bias)) {
      fail(fused_bias + " is in the checkpoint but config.json has use_qkv_bias false");
    }
    // use_bias defaults to true in LLaDA2MoeConfig: a checkpoint whose config omits it may carry the bias.
    if (m.has_tensor(b + "attention.dense.bias"))
      fail(
          b +
          "attention.dense.bias is in the checkpoint: a bias on attention.dense (use_bias) is not supported");
    if (c.qk_norm) {
      L.q_norm = m.bind(b + "attention.query_layernorm.weight", {c.head_dim}, false);
      L.k_norm = m.bind(b + "attention.key_layernorm.weight", {c.head_dim}, false);
    }
    L.wo = m.bind(b + "attention.dense.weight", {d, q}, true);
    L.ffn_norm = m.bind(b + "post_attention_layernorm.weight", {d}, false);
    bind_moe_model_ffn(m, L, l, b, "mlp.shared_experts.");
    m.layer_bound(l);
  }
}

}  // namespace

constexpr FamilyInfo kLlada2Family{
    .files = {.name = "llada2",
              .config = {.model_types = "llada2_moe",
                         .claims = claims,
                         .read = read_config,
                         .rotary_factor = 0.5f,
                         .finish = finish_config}},
    .geometries = kGeometries,
    .bind = bind,
};

}  // namespace tessera
