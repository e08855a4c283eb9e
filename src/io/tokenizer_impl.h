// Internal pieces of Tokenizer (not a public header): regex wrapper, normalizer / pre-tokenizer /
// decoder steps, the BPE model. Built by tokenizer_load.cpp, run by tokenizer.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::tok {

// A PCRE2 pattern compiled with UTF | UCP (and JIT when available). Shareable across threads.
class Regex {
 public:
  Regex() = default;
  Regex(const std::string& pattern, bool literal);
  // [begin, end) byte ranges of all non-overlapping matches, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  bool valid() const { return code_ != nullptr; }

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8*
};

// GPT-2 bytes <-> unicode map of byte-level BPE.
std::string byte_to_unicode_utf8(uint8_t b);
// Maps a codepoint back to its byte; -1 if it is not one of the 256 byte characters.
int unicode_to_byte(uint32_t cp);
// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, uint32_t cp);
// Decodes one codepoint at s[i] (advancing i); invalid bytes decode as themselves (0x80..0xFF).
uint32_t next_codepoint(std::string_view s, size_t& i);

struct NormStep {
  enum Kind { NFC, Replace, Prepend, Lowercase } kind = NFC;
  std::string pattern, content;  // Replace: literal pattern -> content; Prepend: content
  Regex regex;                   // Replace with a Regex pattern
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreStep {
  enum Kind { Split, ByteLevel, Metaspace } kind = Split;
  Regex regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel (GPT-2 regex, Isolated)
  std::string replacement;        // Metaspace
  std::string prepend_scheme;     // Metaspace: always | first | never
  bool split = false;             // Metaspace
};

struct DecStep {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind = ByteLevel;
  std::string pattern, content;  // Replace; Strip content; Metaspace replacement
  int start = 0, stop = 0;       // Strip
  bool strip_first = true;       // Metaspace: drop the leading space of the first token
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
};

struct MergeRule {
  int32_t rank;
  int32_t result;
};

struct Bpe {
  std::vector<std::string> pieces;                 // id -> piece as written in the file
  std::unordered_map<std::string, int32_t> vocab;  // piece -> id
  std::unordered_map<uint32_t, int32_t> char_ids;  // single-codepoint pieces
  std::unordered_map<uint64_t, MergeRule> merges;  // (left id << 32 | right id) -> rule
  int32_t byte_ids[256];                           // "<0xXX>" ids for byte fallback, or -1
  int32_t unk_id = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;

  // Appends the tokens of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
};

struct Impl {
  std::string source;  // the file, for messages
  Bpe bpe;
  std::vector<NormStep> normalizer;
  std::vector<PreStep> pre_tokenizer;
  std::vector<DecStep> decoder;
  std::vector<AddedToken> added;                     // all added tokens
  std::vector<int32_t> added_by_first[256];          // indices into added, longest content first
  std::unordered_map<int32_t, int32_t> added_index;  // id -> index into added
  size_t vocab_size = 0;
};

// Parses a tokenizer.json text into an Impl; errors name `source`.
std::shared_ptr<Impl> load_impl(std::string_view json_text, const std::string& source);

// Pipelines (tokenizer_text.cpp).
std::string normalize(const std::vector<NormStep>& steps, std::string_view text);
std::vector<std::string> pre_tokenize(const std::vector<PreStep>& steps, std::string text,
                                      bool first_segment);
// Decodes a run of ordinary (non-added) tokens given as file pieces.
std::string decode_pieces(const std::vector<DecStep>& steps, std::vector<std::string> tokens);

}  // namespace tessera::tok
