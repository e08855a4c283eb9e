// llama2.c tokenizer.bin -> tokenizer.json: ids and text agree with llama2.c's own algorithm.
#include "io/llama2c_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

std::filesystem::path tok_bin() {
  return test::shared_dir() / "models/stories260K/tok512.bin";
}

// A direct port of llama2.c run.c encode() / decode(), the oracle.
struct Llama2c {
  std::vector<std::string> vocab;
  std::vector<float> scores;
  explicit Llama2c(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    int32_t max_len;
    f.read(reinterpret_cast<char*>(&max_len), 4);
    float s;
    int32_t len;
    while (f.read(reinterpret_cast<char*>(&s), 4)) {
      f.read(reinterpret_cast<char*>(&len), 4);
      std::string b(static_cast<size_t>(len), '\0');
      f.read(b.data(), len);
      vocab.push_back(b);
      scores.push_back(s);
    }
  }
  int lookup(const std::string& s) const {
    auto it = std::find(vocab.begin(), vocab.end(), s);
    return it == vocab.end() ? -1 : static_cast<int>(it - vocab.begin());
  }
  std::vector<int32_t> encode(const std::string& text) const {
    std::vector<int32_t> tokens;
    if (!text.empty()) tokens.push_back(lookup(" "));
    for (size_t i = 0; i < text.size();) {
      size_t len = 1;
      while (i + len < text.size() && (static_cast<uint8_t>(text[i + len]) & 0xC0) == 0x80 && len < 4) ++len;
      std::string ch = text.substr(i, len);
      int id = lookup(ch);
      if (id >= 0)
        tokens.push_back(id);
      else
        for (char c : ch) tokens.push_back(static_cast<uint8_t>(c) + 3);
      i += len;
    }
    while (true) {
      float best = -1e10f;
      int best_id = -1, best_idx = -1;
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        int id = lookup(vocab[tokens[i]] + vocab[tokens[i + 1]]);
        if (id != -1 && scores[id] > best) {
          best = scores[id];
          best_id = id;
          best_idx = static_cast<int>(i);
        }
      }
      if (best_idx == -1) break;
      tokens[best_idx] = best_id;
      tokens.erase(tokens.begin() + best_idx + 1);
    }
    return tokens;
  }
  std::string decode(int prev, int token) const {
    std::string piece = vocab[token];
    if (prev == 1 && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    unsigned int byte;
    if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1)
      piece = std::string(1, static_cast<char>(byte));
    return piece;
  }
};

const Tokenizer& stories() {
  static const Tokenizer t = Tokenizer::from_json(llama2c_tokenizer_to_json(tok_bin()), "tok512.bin");
  return t;
}

TEST(Llama2cTokenizer, VocabAndKnownIds) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K/tok512.bin");
  const auto& t = stories();
  EXPECT_EQ(t.vocab_size(), 512u);
  EXPECT_TRUE(t.is_special(0) && t.is_special(1) && t.is_special(2));
  EXPECT_EQ(t.token_id("<s>"), 1);
  EXPECT_EQ(t.token_id("<0x41>"), 3 + 0x41);
  EXPECT_EQ(t.token_id("▁t"), 259);
  EXPECT_EQ(t.token_text(259), " t");
  EXPECT_EQ(t.token_text(260), "he");
  EXPECT_EQ(t.token_text(3 + 0x0A), "\n");
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 259, 260}, true), "the");
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 259, 260, 261}, true), "the a");
}

TEST(Llama2cTokenizer, EncodeMatchesLlama2cAndRoundTrips) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K/tok512.bin");
  const auto& t = stories();
  Llama2c ref(tok_bin());
  std::vector<std::string> texts = {
      "Once upon a time",
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
      "Lily's mom said, \"Lily, let's go to the park.\"\nLily was sad and didn't know what to do.",
      "  two  spaces\tand tab",
      "numbers 1234567890 and symbols #$%^&*()",
      "café 東京 🦙 ünïcödé",
      "x"};
  std::mt19937 rng(99);
  const std::string words[] = {"the",  " ",  "ball", "Tim", "happy", ",",  ".",  "!",  "\n",  "é",
                               "play", "ed", "ing",  "  ",  "Z",     "qu", "\"", "'s", "big", "red"};
  for (int k = 0; k < 200; ++k) {
    std::string s;
    for (int w = 0; w < 1 + static_cast<int>(rng() % 15); ++w) s += words[rng() % std::size(words)];
    texts.push_back(s);
  }
  for (const auto& text : texts) {
    auto ids = t.encode(text);
    ASSERT_EQ(ids, ref.encode(text)) << "'" << text << "'";
    // decode as llama2.c prints it: BOS, then each piece (leading space stripped after BOS)
    std::vector<int32_t> with_bos = {1};
    with_bos.insert(with_bos.end(), ids.begin(), ids.end());
    std::string printed;
    for (size_t i = 1; i < with_bos.size(); ++i) printed += ref.decode(with_bos[i - 1], with_bos[i]);
    ASSERT_EQ(t.decode(with_bos, /*skip_special=*/true), printed) << "'" << text << "'";
    ASSERT_EQ(printed, text);
  }
  auto once = t.encode("Once upon a time");
  EXPECT_LE(once.size(), 8u);  // whole-word pieces, not characters
}

TEST(Llama2cTokenizer, MissingOrTruncatedFileThrows) {
  EXPECT_THROW(llama2c_tokenizer_to_json("/no/such/tok.bin"), Error);
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K/tok512.bin");
  auto d = test::temp_dir("l2c_trunc");
  std::ifstream in(tok_bin(), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(d / "t.bin", std::ios::binary) << all.substr(0, all.size() - 3);
  EXPECT_THROW(llama2c_tokenizer_to_json(d / "t.bin"), Error);
}

}  // namespace
}  // namespace tessera
