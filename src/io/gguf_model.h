// GGUF files of the diffusion LMs llama.cpp converts (architectures "llada", "dream", "llada-moe"),
// read as tessera's ModelConfig and as a Checkpoint under the Hugging Face tensor names the family
// loaders bind. Each family's own conventions (its architecture, tensor names, FFN metadata) are its
// GgufFormat (io/family_files.h) in models/<family>.cpp; the shared ones are those of llama.cpp's
// converter (convert_hf_to_gguf.py):
//   - metadata "<arch>.block_count", ".embedding_length", ".attention.head_count[_kv]", ...;
//     special tokens "tokenizer.ggml.{mask,bos,eos,padding}_token_id"; "diffusion.shift_logits";
//   - tensors token_embd / output_norm / output and blk.N.{attn_norm, attn_q, attn_k, attn_v,
//     attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down, ffn_gate_inp,
//     ffn_{gate,up,down}_exps (experts stacked), ffn_{gate,up,down}_shexp};
//   - LLaDA's q / k rows are permuted for ggml's interleaved RoPE: tessera keeps them and rotates
//     adjacent pairs (ModelConfig::rope_interleaved), which gives the same attention.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/safetensors.h"

namespace tessera {

// A per-layer tensor name `stem` N "." rest ("blk.3.attn_q.weight", "model.layers.3.mlp.gate.weight"):
// N (at most 10^6) and rest; false for other names.
bool split_layer(const std::string& name, std::string_view stem, int64_t& layer, std::string& rest);

// The config of a GGUF model. Errors name the file and the missing or unsupported key.
ModelConfig gguf_config(const GgufFile& g);

// The tensors of a GGUF model of config `c` (gguf_config(*g)) under the Hugging Face names of its
// family: plain tensors are views into the mapped file, quantized ones are converted to `dequant_to`
// (f32 or bf16). The checkpoint keeps the file mapped.
// With keep_quantized, quantized tensors stay views of their ggml blocks (StTensor::quant) instead.
Checkpoint gguf_checkpoint(std::shared_ptr<const GgufFile> g, const ModelConfig& c, DType dequant_to,
                           bool keep_quantized = false);

// Bytes the weights of a GGUF model take once loaded with quantized tensors converted to
// `dequant_to` (plain f32 / f16 / bf16 tensors keep their size).
size_t gguf_loaded_bytes(const GgufFile& g, DType dequant_to);

}  // namespace tessera
