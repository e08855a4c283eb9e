// How the files of each model family read: its config.json fields and its GGUF conventions. These are
// the io half of a family; each family defines its own in its file (models/<family>.cpp), and the
// models layer's registry (models/registry.cpp) lists them, indexed by Family, through family_files().
// load_config, gguf_config, gguf_checkpoint and family_name read them from there.
#pragma once
#include <climits>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "io/gguf.h"

namespace tessera {

// The fields of one config.json (`where`: its path, for messages). Errors name the field and say what
// was expected.
struct ConfigReader {
  const nlohmann::json& j;
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
    const nlohmann::json& v = j[key].is_array() && !j[key].empty() ? j[key][0] : j[key];
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

// A family's config.json. load_config gives a config to the family that claims its model_type, calls
// read, then reads the fields every family shares (head_dim, RoPE, is_causal, special tokens), then
// finish.
struct ConfigFormat {
  // The model_type values as the error for an unsupported one lists them ("lladamoe / llada_moe");
  // nullptr: the family has no config.json form.
  const char* model_types = nullptr;
  // Whether a config.json of this model_type (and these fields) is the family's.
  bool (*claims)(const std::string& model_type, const ConfigReader& r) = nullptr;
  // The family's own fields: sizes, norms, biases, the MoE FFN.
  void (*read)(const ConfigReader& r, ModelConfig& c) = nullptr;
  // partial_rotary_factor when the config names none.
  float rotary_factor = 1.0f;
  // After the shared fields (`dir`: the model directory), or nullptr.
  void (*finish)(const std::filesystem::path& dir, ModelConfig& c) = nullptr;
};

// A per-layer tensor: its name in GGUF after "blk.N." and in the family's checkpoint after its layer
// prefix.
struct GgufName {
  const char* gguf;
  const char* hf;
};

// A family's GGUF conventions (those of llama.cpp's converter): the metadata of architecture `arch`
// ("<arch>.block_count", ...) and the tensors named as the family's checkpoint names them, so that its
// weight loader binds a GGUF file unchanged. Stacked experts (blk.N.ffn_{gate,up,down}_exps) become
// <layer_prefix>N.mlp.experts.E.{gate,up,down}_proj.weight.
struct GgufFormat {
  const char* arch = nullptr;  // general.architecture; nullptr: the family has no GGUF form
  // The family's names of token_embd, output_norm and output.
  const char *embed = nullptr, *final_norm = nullptr, *lm_head = nullptr;
  const char* layer_prefix = nullptr;  // followed by the layer number and "."
  std::span<const GgufName> layer_names;
  const char* mask_token = "<|mask|>";  // the vocabulary's mask token, for files that name no mask id
  bool shift_logits = false;            // diffusion.shift_logits when the file has none
  bool rope_interleaved = false;        // the converter permuted q / k for ggml's interleaved RoPE
  // The FFN's metadata and tensors (`a`: "<arch>."); nullptr: a dense FFN of feed_forward_length.
  void (*ffn)(const GgufFile& g, const std::string& a, ModelConfig& c) = nullptr;
  // The family's own metadata after the shared keys (RoPE scaling, decoding modes), or nullptr. Only a
  // family with this reader may have a {arch}.rope.scaling.type other than "none"; it must check it.
  void (*read)(const GgufFile& g, const std::string& a, ModelConfig& c) = nullptr;
};

// The files of one family.
struct FamilyFiles {
  const char* name = nullptr;  // family_name()
  ConfigFormat config;
  GgufFormat gguf;
};

// Every family's files, indexed by Family (defined by the family registry, models/registry.cpp).
std::span<const FamilyFiles* const> family_files();

// The ids of the added tokens named in `want` from a tokenizer.json (-1 each where the file or the token
// is absent; the first match wins). Reads only up to the end of the top-level "added_tokens" array.
std::vector<int32_t> added_token_ids(const std::filesystem::path& p, std::vector<std::string> want);

// v, the value of GGUF metadata `key`; throws Error naming the file and the key unless v > 0.
int64_t gguf_positive(const GgufFile& g, const std::string& key, int64_t v);

}  // namespace tessera
