// Converts a llama2.c tokenizer.bin (int32 max_token_length, then per token: float32 score,
// int32 length, bytes) into a SentencePiece-style tokenizer.json that tessera::Tokenizer loads.
#pragma once
#include <filesystem>
#include <string>

namespace tessera {

// Vocabulary: ' ' -> '▁', "<0xXX>" byte tokens kept, ids 0/1/2 become the added special tokens
// <unk>, <s>, </s>. Merges: for every token t longer than one byte and every split t = a + b with
// a and b in the vocabulary, merge (a, b), ranked by descending score of t (ties: lower id first),
// which reproduces llama2.c's greedy best-score merging. Normalizer: Prepend '▁' + Replace ' '
// -> '▁' (llama2.c's dummy prefix); decoder: Replace '▁' -> ' ', ByteFallback, Fuse, Strip one
// leading space (llama2.c strips the leading space of the first piece after BOS).
// Errors (missing / truncated file) throw tessera::Error naming the file.
std::string llama2c_tokenizer_to_json(const std::filesystem::path& tok_bin);

}  // namespace tessera
