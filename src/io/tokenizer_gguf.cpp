// A GGUF vocabulary (tokenizer.ggml.*) as a Tokenizer: the byte-level BPE ("gpt2") vocabularies of
// the supported families, rebuilt as the tokenizer.json the GGUF was converted from and loaded by the
// same code. The pre-tokenizer is named by tokenizer.ggml.pre; its regex is the one of the original
// tokenizer.json of the models llama.cpp gives that name.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"
#include "io/tokenizer.h"

namespace tessera {
using json = nlohmann::json;

namespace {

// llama.cpp's token types (llama_token_type).
enum TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct PreRegex {
  std::initializer_list<const char*> names;
  const char* regex;
};

const PreRegex kPre[] = {
    {{"qwen2", "deepseek-r1-qwen", "stablelm2"},
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {{"llama-bpe", "llama3", "llama-v3", "smaug-bpe"},
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {{"llada-moe", "bailingmoe", "bailingmoe2"},
     "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|"
     "\\s+(?!\\S)|\\s+"},
    {{"gpt-2", "default", "olmo", "mpt"},
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
};

const char* pre_regex(const std::string& pre, const std::string& where) {
  std::string known;
  for (const PreRegex& p : kPre) {
    for (const char* n : p.names) {
      if (pre == n) return p.regex;
      known += std::string(known.empty() ? "" : ", ") + n;
    }
  }
  fail(where + ": tokenizer.ggml.pre '" + pre +
       "' is a pre-tokenizer tessera does not know (known: " + known + ")");
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& g) {
  const std::string where = g.path().string();
  const std::string model = g.get_string("tokenizer.ggml.model", "");
  if (model.empty()) fail(where + ": the GGUF has no vocabulary (tokenizer.ggml.model is missing)");
  if (model != "gpt2")
    fail(where + ": tokenizer.ggml.model '" + model +
         "' is not supported (tessera reads byte-level BPE vocabularies, \"gpt2\")");
  const GgufValue* tokens = g.find("tokenizer.ggml.tokens");
  const GgufValue* merges = g.find("tokenizer.ggml.merges");
  if (tokens == nullptr || tokens->type != GgufValue::Array || tokens->elem != GgufValue::String)
    fail(where + ": tokenizer.ggml.tokens is missing or not a string array");
  if (merges == nullptr || merges->type != GgufValue::Array || merges->elem != GgufValue::String)
    fail(where + ": tokenizer.ggml.merges is missing or not a string array");
  const GgufValue* types = g.find("tokenizer.ggml.token_type");
  if (types != nullptr && (types->type != GgufValue::Array || types->ints.size() != tokens->strs.size()))
    fail(where + ": tokenizer.ggml.token_type does not give one type per token");

  json vocab = json::object(), added = json::array();
  for (size_t id = 0; id < tokens->strs.size(); ++id) {
    const std::string& t = tokens->strs[id];
    const int64_t type = types != nullptr ? types->ints[id] : kNormal;
    if (type == kUnused) continue;
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id}, {"content", t}, {"special", type == kControl}});
      continue;
    }
    vocab[t] = id;
  }
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", merges->strs}};
  j["added_tokens"] = std::move(added);
  const std::string pre = g.get_string("tokenizer.ggml.pre", "default");
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", pre_regex(pre, where)}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  std::string text;
  try {
    text = j.dump();
  } catch (const json::type_error&) {  // a string that is not UTF-8: name the first one
    for (const auto* list : {tokens, merges}) {
      for (size_t i = 0; i < list->strs.size(); ++i) {
        try {
          (void)json(list->strs[i]).dump();
        } catch (const json::type_error&) {
          fail(where + ": " + (list == tokens ? "tokenizer.ggml.tokens" : "tokenizer.ggml.merges") + "[" +
               std::to_string(i) + "] is not valid UTF-8");
        }
      }
    }
    fail(where + ": the vocabulary holds a string that is not valid UTF-8");
  }
  return from_json(text, where);
}

}  // namespace tessera
