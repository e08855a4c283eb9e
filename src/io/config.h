// config.json of the supported families, read with the real checkpoints' field names.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tessera {

// A model family: its index in the family registry (models/registry.cpp), where each family's file
// (models/<family>.cpp) gives its config.json fields, GGUF conventions, geometries and weight loader.
// The enumerators name the families that code outside their file refers to, in registry order; a new
// family needs none. LLaDA2: LLaDA2.0 (model_type "llada2_moe", LLaDA2MoeModelLM).
enum class Family { LLaDA, Dream, LLaDAMoE, LLaDA2 };
// The family's short name ("llada", "dream", "llada-moe", "llada2").
const char* family_name(Family f);

// Router score of a mixture-of-experts FFN.
enum class RouterScore : uint8_t { Softmax, Sigmoid };

// Mixture-of-experts FFN (n_experts == 0: a dense model). MoE layers replace the dense FFN by
// top_k of n_experts routed SwiGLU experts, plus an optional shared expert (a dense SwiGLU FFN of
// shared_inter run on every row and added to the routed output).
struct MoeConfig {
  int64_t n_experts = 0, top_k = 0, expert_inter = 0;
  int64_t n_shared = 0, shared_inter = 0;  // shared experts and their total intermediate size
  RouterScore score = RouterScore::Softmax;
  bool expert_bias = false;  // a per-expert bias added to the scores for selection only
  bool norm_topk = false;    // renormalise the top-k weights to sum 1
  float routed_scale = 1.0f;
  int64_t n_group = 1, topk_group = 1;  // grouped selection (LLaDA2)
  std::vector<uint8_t> moe_layer;       // per layer: 1 = MoE FFN, 0 = dense FFN; empty = all MoE
};

struct ModelConfig {
  Family family = Family::LLaDA;
  std::string model_type;
  int64_t hidden = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t intermediate = 0;  // the dense FFN (MoE models: the dense layers' FFN, 0 if none)
  int64_t vocab = 0;         // rows of the embedding / LM head (LLaDA embedding_size)
  int64_t max_positions = 0;
  int64_t rotary_dim = 0;  // dims of each head that RoPE rotates (partial rotary); 0 = head_dim
  float rope_theta = 10000.0f, rms_eps = 1e-5f;
  bool tie_embeddings = false;
  bool qkv_bias = false;
  bool qk_norm = false;           // per-head RMSNorm of q and k before RoPE
  bool logit_shift = false;       // Dream: logits of position i come from hidden row i-1
  bool causal = false;            // tessera extension "is_causal" (converted llama2.c models)
  bool rope_interleaved = false;  // tessera extension "rope_interleaved"
  // > 0: block-causal attention with blocks of this size (LLaDA2). Not a checkpoint field: LLaDA2's
  // block is the generation's block_length (load_config sets the reference default 32; the engine
  // follows each generation's block length, see Engine::set_attention_block).
  int64_t mask_block = 0;
  MoeConfig moe;
  // YaRN RoPE scaling (rope_type "yarn", on when factor > 0; Hugging Face's _compute_yarn_parameters
  // names) and the Llama-4 query scale (Ministral-3: llama_4_scaling_beta, 0 = none).
  struct RopeScaling {
    float factor = 0.0f, beta_fast = 32.0f, beta_slow = 1.0f;
    float attn_factor = 1.0f;  // cos / sin scale (HF's attention_factor, from mscale / mscale_all_dim)
    int64_t original_max = 0;  // original_max_position_embeddings
    bool truncate = true;
    float llama4_beta = 0.0f;
  } rope_scaling;
  // Tri-mode models (Nemotron-Labs-Diffusion): one checkpoint whose forwards are causal (autoregressive
  // prefill and steps, the verify pass) or bidirectional (diffusion drafts), chosen per forward
  // (Denoiser::set_causal). default_mode: the generation mode the checkpoint names ("ar" unless said).
  bool tri_mode = false;
  int64_t diffusion_block = 0;  // config.json block_size: the trained block length (0: not given)
  // A draft adapter (Nemotron's PEFT `linear_spec_lora/`): a LoRA on o_proj that self-speculation's
  // bidirectional drafts use and no other forward does. rank 0: none. dir: its folder, relative to the
  // model directory; scale: lora_alpha / r (/ sqrt(r) with use_rslora).
  struct DraftAdapter {
    int64_t rank = 0;
    float scale = 1.0f;
    std::string dir;
  } draft_adapter;
  // Uniform-noise block diffusion (DiffusionGemma: shared/specs/diffusion-gemma.md; canvas > 0). Gemma 4
  // layers: sliding ones (n_kv_heads x head_dim, RoPE over the whole head at rope_theta, attention within
  // `window`) and global ones where global_layer[l] (global_kv_heads x global_head_dim, K as V,
  // proportional RoPE: global_rotary of the head's dims rotate, pairs (i, i + head / 2), at
  // global_theta); attention scale 1; a dense GeGLU MLP (intermediate) beside the routed experts
  // (moe: softmax, top_k renormalised, per-expert scales); sandwich norms; per-layer scalars; final
  // soft-capping. No mask token: canvases of `canvas` random tokens are denoised against a KV cache that
  // causal (encoder) forwards write. The sampler's defaults come from generation_config.json.
  struct Uniform {
    int64_t canvas = 0;
    int64_t window = 0;
    std::vector<uint8_t> global_layer;
    int64_t global_kv_heads = 0, global_head_dim = 0, global_rotary = 0;
    float global_theta = 1e6f;
    float softcap = 0.0f;  // final_logit_softcapping (0: none)
    // generation_config.json
    int64_t max_new_tokens = 256;
    int steps = 48;  // max_denoising_steps
    double t_min = 0.4, t_max = 0.8, entropy_bound = 0.1, confidence = 0.005;
    int stability = 1;
    std::vector<int32_t> eos_ids;  // every end-of-sequence id (eos_token_id's list)
  } uniform;
  bool is_uniform() const { return uniform.canvas > 0; }
  bool is_global_layer(int64_t l) const {
    return is_uniform() && uniform.global_layer.at(static_cast<size_t>(l)) != 0;
  }
  int32_t mask_id = -1, eos_id = -1, bos_id = -1, pad_id = -1;

  bool is_moe_layer(int64_t layer) const {
    return moe.n_experts > 0 && (moe.moe_layer.empty() || moe.moe_layer.at(static_cast<size_t>(layer)) != 0);
  }
  int64_t rotary() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // Every parameter, all experts included.
  int64_t param_count() const;
  // Bytes a KV cache (--cache) holds per canvas position: K and V of every layer, in the compute
  // dtype (elem_bytes: 2 for bf16, 4 for f32).
  int64_t kv_cache_bytes_per_token(int64_t elem_bytes) const {
    if (!is_uniform()) return 2 * elem_bytes * n_layers * n_kv_heads * head_dim;
    int64_t width = 0;  // every layer's key / value width
    for (int64_t l = 0; l < n_layers; ++l)
      width += is_global_layer(l) ? uniform.global_kv_heads * uniform.global_head_dim : n_kv_heads * head_dim;
    return 2 * elem_bytes * width;
  }
  // Bytes of the SparseD patterns (--sparse) of a canvas of L positions with tiles of `block`: one per
  // (layer, head, query block, key block).
  int64_t sparse_pattern_bytes(int64_t L, int64_t block) const {
    const int64_t nb = (L + block - 1) / block;
    return n_layers * n_heads * nb * nb;
  }
  // The parameters one token uses: as param_count() but only top_k of the routed experts per
  // MoE layer (the router, the shared expert, embeddings and LM head count in full).
  int64_t active_param_count() const;
};

// Reads DIR/config.json, or the metadata of a GGUF file (io/gguf_model.h) when DIR is one, as the
// family that claims its model_type reads it (io/family_files.h). Errors name the field and say what
// was expected.
ModelConfig load_config(const std::filesystem::path& dir);

}  // namespace tessera
