// Hugging Face tokenizer.json tokenizers: byte-level BPE (GPT-2 / Qwen2 / Llama-3 style) and
// SentencePiece-style BPE with byte fallback (llama / Mistral tokenizer.json, converted llama2.c).
// Immutable after loading; copies share the loaded tables; encode/decode are thread-safe.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

namespace tok {
struct Impl;
}
class GgufFile;

class Tokenizer {
 public:
  // Loads a tokenizer.json. Unsupported model / normalizer / pre-tokenizer / decoder types throw
  // tessera::Error naming the type and the file.
  static Tokenizer from_file(const std::filesystem::path& path);
  // The vocabulary of a GGUF file (byte-level BPE, tokenizer.ggml.model "gpt2"; io/tokenizer_gguf.cpp).
  static Tokenizer from_gguf(const GgufFile& g);
  // Same, from the JSON text; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& source = "<memory>");

  // Token ids of `text` (no BOS/EOS is added). Added tokens are matched before pre-tokenization,
  // longest first; with parse_special = false, tokens flagged special are treated as plain text.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Exact bytes of the ids (byte-level / byte-fallback tokens give raw bytes back). Ids outside
  // the vocabulary throw.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Decoded bytes of one token (no leading-space stripping); added tokens give their content.
  std::string token_text(int32_t id) const;
  // Id of a vocabulary piece as written in tokenizer.json ("Ġthe", "▁the", "<|im_end|>"), or -1.
  int32_t token_id(std::string_view piece) const;
  // Largest id + 1 over the vocabulary and the added tokens.
  size_t vocab_size() const;
  bool is_special(int32_t id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const tok::Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const tok::Impl> impl_;
};

}  // namespace tessera
