// Structured output over a model's vocabulary: the TokenConstraint (decode/constraint.h) of a JsonGrammar
// (io/json_grammar.h, a JSON Schema or any JSON object), token by token through the tokens' bytes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "decode/constraint.h"
#include "io/json_grammar.h"
#include "io/tokenizer.h"

namespace tessera {

// The bytes of every token id below `vocab` (the model's), and which ids can never be written under a
// constraint (special tokens, and ids without text).
struct VocabBytes {
  std::vector<std::string> bytes;
  std::vector<char> usable;
  // Throws tessera::Error when a byte a completion may need (printable ASCII, UTF-8 continuation bytes)
  // has no token of its own: the guarantee that every answer completes rests on them.
  static std::shared_ptr<const VocabBytes> of(const Tokenizer& t, int64_t vocab);
};

// The constraint: tokens whose bytes keep the document a valid prefix that min_completion() bytes (one
// token each) can complete in the positions left; then, when `suffix` is given, exactly those bytes (the end
// of a forced tool call after its arguments, e.g. "}\n</tool_call>"); an EOS of `eos` once complete, and
// only EOS after it. Bytes go to the document while it takes them, to the suffix once it is complete.
std::shared_ptr<const TokenConstraint> json_constraint(std::shared_ptr<const JsonGrammar> grammar,
                                                       std::shared_ptr<const VocabBytes> vocab,
                                                       std::vector<int32_t> eos, std::string suffix = "");

}  // namespace tessera
