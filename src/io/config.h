// config.json of the supported families, read with the real checkpoints' field names.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace tessera {

enum class Family { LLaDA, Dream };
const char* family_name(Family f);

struct ModelConfig {
  Family family = Family::LLaDA;
  std::string model_type;
  int64_t hidden = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;  // rows of the embedding / LM head (LLaDA embedding_size)
  int64_t max_positions = 0;
  float rope_theta = 10000.0f, rms_eps = 1e-5f;
  bool tie_embeddings = false;
  bool qkv_bias = false;
  bool logit_shift = false;       // Dream: logits of position i come from hidden row i-1
  bool causal = false;            // tessera extension "is_causal" (converted llama2.c models)
  bool rope_interleaved = false;  // tessera extension "rope_interleaved"
  int32_t mask_id = -1, eos_id = -1, bos_id = -1, pad_id = -1;
  int64_t param_count() const;
};

// Reads DIR/config.json. Errors name the field and say what was expected.
ModelConfig load_config(const std::filesystem::path& dir);

}  // namespace tessera
