#include "io/llama2c.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/llama2c_tokenizer.h"
#include "io/safetensors.h"

namespace tessera {
namespace fs = std::filesystem;

void convert_llama2c(const fs::path& model_bin, const fs::path& tokenizer_bin, const fs::path& out_dir) {
  std::ifstream f(model_bin, std::ios::binary);
  if (!f) fail("cannot open " + model_bin.string());
  int32_t h[7];
  f.read(reinterpret_cast<char*>(h), sizeof h);
  if (!f) fail(model_bin.string() + ": truncated header (expected 7 int32 fields)");
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], seq_len = h[6];
  const bool shared = h[5] > 0;
  const int64_t vocab = shared ? h[5] : -int64_t{h[5]};
  if (dim <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || vocab <= 0 || seq_len <= 0 ||
      dim % heads != 0 || heads % kv_heads != 0 || (dim / heads) % 2 != 0) {
    fail(model_bin.string() + ": implausible llama2.c header (dim " + std::to_string(dim) + ", hidden " +
         std::to_string(hidden) + ", layers " + std::to_string(layers) + ", heads " + std::to_string(heads) +
         ", kv heads " + std::to_string(kv_heads) + ", vocab " + std::to_string(h[5]) + ", seq_len " +
         std::to_string(seq_len) +
         "): every size must be positive, dim a multiple of heads with an even "
         "head size, heads a multiple of kv heads");
  }
  const int64_t hd = dim / heads, kvd = kv_heads * hd;
  const std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> all(raw.size() / 4);
  if (!all.empty()) std::memcpy(all.data(), raw.data(), all.size() * 4);
  size_t at = 0;
  // The tensor of the product of `dims` floats; the product is checked (a corrupt header can give
  // sizes whose product overflows).
  auto take = [&](std::initializer_list<int64_t> dims, const char* what) {
    int64_t n = 1;
    for (const int64_t d : dims) {
      if (__builtin_mul_overflow(n, d, &n)) n = INT64_MAX;
    }
    if (static_cast<uint64_t>(n) > all.size() - at) {
      fail(model_bin.string() + ": file ends inside " + std::string(what) + " (truncated?)");
    }
    const float* p = all.data() + at;
    at += static_cast<size_t>(n);
    return p;
  };
  const float* emb = take({vocab, dim}, "token_embedding_table");
  const float* rms_att = take({layers, dim}, "rms_att_weight");
  const float* wq = take({layers, dim, dim}, "wq");
  const float* wk = take({layers, dim, kvd}, "wk");
  const float* wv = take({layers, dim, kvd}, "wv");
  const float* wo = take({layers, dim, dim}, "wo");
  const float* rms_ffn = take({layers, dim}, "rms_ffn_weight");
  const float* w1 = take({layers, dim, hidden}, "w1");
  const float* w2 = take({layers, hidden, dim}, "w2");
  const float* w3 = take({layers, dim, hidden}, "w3");
  const float* rms_final = take({dim}, "rms_final_weight");
  take({seq_len, hd}, "freq_cis");  // real + imag halves, unused (RoPE is recomputed)
  const float* wcls = shared ? emb : take({vocab, dim}, "wcls");

  fs::create_directories(out_dir);
  std::vector<StWrite> t;
  t.push_back({"model.embed_tokens.weight", DType::F32, {vocab, dim}, emb});
  if (!shared) t.push_back({"lm_head.weight", DType::F32, {vocab, dim}, wcls});
  t.push_back({"model.norm.weight", DType::F32, {dim}, rms_final});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    t.push_back({b + "input_layernorm.weight", DType::F32, {dim}, rms_att + l * dim});
    t.push_back({b + "self_attn.q_proj.weight", DType::F32, {dim, dim}, wq + l * dim * dim});
    t.push_back({b + "self_attn.k_proj.weight", DType::F32, {kvd, dim}, wk + l * dim * kvd});
    t.push_back({b + "self_attn.v_proj.weight", DType::F32, {kvd, dim}, wv + l * dim * kvd});
    t.push_back({b + "self_attn.o_proj.weight", DType::F32, {dim, dim}, wo + l * dim * dim});
    t.push_back({b + "post_attention_layernorm.weight", DType::F32, {dim}, rms_ffn + l * dim});
    t.push_back({b + "mlp.gate_proj.weight", DType::F32, {hidden, dim}, w1 + l * dim * hidden});
    t.push_back({b + "mlp.down_proj.weight", DType::F32, {dim, hidden}, w2 + l * hidden * dim});
    t.push_back({b + "mlp.up_proj.weight", DType::F32, {hidden, dim}, w3 + l * dim * hidden});
  }
  write_safetensors(out_dir / "model.safetensors", t);

  nlohmann::json cfg = {
      {"architectures", {"DreamModel"}},
      {"model_type", "Dream"},
      {"hidden_size", dim},
      {"intermediate_size", hidden},
      {"num_hidden_layers", layers},
      {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads},
      {"vocab_size", vocab},
      {"max_position_embeddings", seq_len},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", shared},
      {"attention_bias", false},
      {"is_causal", true},
      {"rope_interleaved", true},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"pad_token_id", 0},
      {"mask_token_id", 0},
      {"torch_dtype", "float32"},
      {"converted_from", "llama2.c " + model_bin.filename().string()},
  };
  std::ofstream(out_dir / "config.json") << cfg.dump(2) << "\n";
  std::ofstream(out_dir / "tokenizer.json") << llama2c_tokenizer_to_json(tokenizer_bin);
  nlohmann::json tc = {
      {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"add_bos_token", true}};
  std::ofstream(out_dir / "tokenizer_config.json") << tc.dump(2) << "\n";
  // tessera keys: a causal model decodes one position per block, left to right.
  nlohmann::json gc = {{"bos_token_id", 1},
                       {"eos_token_id", 2},
                       {"temperature", 0.0},
                       {"block_length", 1},
                       {"alg", "low_confidence"}};
  std::ofstream(out_dir / "generation_config.json") << gc.dump(2) << "\n";
}

}  // namespace tessera
