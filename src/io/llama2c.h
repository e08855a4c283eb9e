// Converts a llama2.c checkpoint (legacy fp32 format) + tokenizer.bin into a checkpoint directory
// tessera loads: Dream/Qwen2 tensor names, f32 safetensors, a config.json marking the model as
// causal with interleaved RoPE and shifted logits, and a SentencePiece-style tokenizer.json.
// With causal attention, the shift and one token per step, diffusion decoding is greedy AR decoding.
#pragma once
#include <filesystem>

namespace tessera {

void convert_llama2c(const std::filesystem::path& model_bin, const std::filesystem::path& tokenizer_bin,
                     const std::filesystem::path& out_dir);

}  // namespace tessera
