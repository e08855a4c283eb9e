// The Hugging Face Llama-style layout shared by Dream (Qwen2) and LLaDA-MoE (OLMoE), and the MoE FFN
// names shared by LLaDA-MoE and LLaDA2 (hf_layout.cpp): weight binding and the GGUF names of the layout.
#pragma once
#include <string>

#include "io/family_files.h"
#include "models/model.h"

namespace tessera {

// PREFIXembed_tokens, PREFIXnorm, `head` (or tied to the embeddings); sizes the layer table.
void bind_hf_embeddings(Model& m, const std::string& prefix = "model.",
                        const std::string& head = "lm_head.weight");
// Per layer (b = "model.layers.N."): input_layernorm, self_attn.{q,k,v,o}_proj (+ q/k/v biases when the
// config has them), post_attention_layernorm.
void bind_hf_attention(Model& m, LayerWeights& L, const std::string& layer_prefix);
// A SwiGLU FFN PREFIX{gate,up,down}_proj.
void bind_swiglu(Model& m, LayerWeights& L, const std::string& prefix, int64_t inter);
// The FFN of layer l (b = "model.layers.N.") shared by LLaDA-MoE and LLaDA2: dense layers a SwiGLU
// mlp.{gate,up,down}_proj; MoE layers the router mlp.gate.weight (+ mlp.gate.expert_bias when the config
// has one), the routed experts mlp.experts.E.{gate,up,down}_proj and, when the config has one, a shared
// SwiGLU under b + shared_prefix.
void bind_moe_model_ffn(Model& m, LayerWeights& L, int64_t l, const std::string& b,
                        const std::string& shared_prefix);

// The layout's per-layer names in GGUF (llama.cpp's names after "blk.N.") and in the checkpoint (after
// "model.layers.N."); the MoE tensors are LLaDA-MoE's.
inline constexpr GgufName kHfGgufLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"ffn_gate_shexp.weight", "shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "shared_expert.down_proj.weight"},
};
// The GGUF conventions of the layout (Dream and LLaDA-MoE): its global and per-layer tensor names.
constexpr GgufFormat hf_gguf_format(const char* arch) {
  GgufFormat f;
  f.arch = arch;
  f.embed = "model.embed_tokens.weight";
  f.final_norm = "model.norm.weight";
  f.lm_head = "lm_head.weight";
  f.layer_prefix = "model.layers.";
  f.layer_names = kHfGgufLayerNames;
  return f;
}

}  // namespace tessera
