// What a model path names: a Hugging Face directory (config.json, *.safetensors, tokenizer.json,
// tokenizer_config.json) or a GGUF file, which holds all of it. The readers that take a model path
// (load_config, Model::load, detect_chat_family and these) accept both.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace tessera {

// The model's tokenizer: DIR/tokenizer.json, or the GGUF file's vocabulary.
Tokenizer load_model_tokenizer(const std::filesystem::path& model);

// Whether prompts start with BOS: tokenizer_config.json's add_bos_token, or the GGUF's
// tokenizer.ggml.add_bos_token (false when absent).
bool model_adds_bos(const std::filesystem::path& model);

// The model's chat templates, as transformers finds them: DIR/chat_template.jinja, else
// tokenizer_config.json's chat_template (a string: "default"; or a list of named ones, e.g. "default"
// and "tool_use"); a GGUF's tokenizer.chat_template ("default") and tokenizer.chat_template.tool_use.
// Empty when the model ships none.
struct NamedChatTemplate {
  std::string name, text;
};
std::vector<NamedChatTemplate> model_chat_templates(const std::filesystem::path& model);
// Every chat template text of the model joined ("" when there is none): for detecting markers.
std::string model_chat_template(const std::filesystem::path& model);
// tokenizer_config.json's special token `key` ("bos_token", "eos_token"; a string or {"content": ...});
// "" when absent and for GGUF files (whose token ids say it).
std::string model_special_token(const std::filesystem::path& model, const char* key);

// The JSON file at `p`, or an empty object when it does not exist; malformed JSON throws naming the file.
nlohmann::json read_json_or_empty(const std::filesystem::path& p);

// A path that can be a model: a directory or a GGUF file. Throws naming the path otherwise.
void check_model_path(const std::filesystem::path& model);

}  // namespace tessera
