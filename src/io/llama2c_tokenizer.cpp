// llama2.c tokenizer.bin -> SentencePiece-style tokenizer.json text.
#include "io/llama2c_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace tessera {

namespace {
const std::string kMeta = "\xE2\x96\x81";  // '▁'

std::string to_piece(const std::string& raw) {
  std::string out;
  for (char c : raw) {
    if (c == ' ')
      out += kMeta;
    else
      out += c;
  }
  return out;
}
}  // namespace

std::string llama2c_tokenizer_to_json(const std::filesystem::path& tok_bin) {
  std::ifstream f(tok_bin, std::ios::binary);
  if (!f) fail("cannot open llama2.c tokenizer " + tok_bin.string() + ": " + std::strerror(errno));
  int32_t max_len = 0;
  if (!f.read(reinterpret_cast<char*>(&max_len), 4) || max_len <= 0 || max_len > 1 << 16)
    fail("llama2.c tokenizer " + tok_bin.string() + " has no valid max_token_length header");
  std::vector<std::string> raw;
  std::vector<float> score;
  while (true) {
    float s;
    int32_t len;
    if (!f.read(reinterpret_cast<char*>(&s), 4)) break;  // clean EOF
    if (!f.read(reinterpret_cast<char*>(&len), 4) || len < 0 || len > max_len)
      fail("llama2.c tokenizer " + tok_bin.string() + " is truncated or corrupt at token " +
           std::to_string(raw.size()));
    std::string bytes(static_cast<size_t>(len), '\0');
    if (!f.read(bytes.data(), len))
      fail("llama2.c tokenizer " + tok_bin.string() + " is truncated at token " + std::to_string(raw.size()));
    raw.push_back(std::move(bytes));
    score.push_back(s);
  }
  if (raw.size() < 3 + 256)
    fail("llama2.c tokenizer " + tok_bin.string() + " has " + std::to_string(raw.size()) +
         " tokens; expected <unk>, <s>, </s>, 256 byte tokens and the pieces");

  const size_t n = raw.size();
  std::vector<std::string> piece(n);
  piece[0] = "<unk>";
  piece[1] = "<s>";
  piece[2] = "</s>";
  for (size_t i = 3; i < n; ++i) piece[i] = to_piece(raw[i]);
  std::unordered_map<std::string, int32_t> id_of;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i) {
    if (!id_of.emplace(piece[i], static_cast<int32_t>(i)).second)
      fail("llama2.c tokenizer " + tok_bin.string() + " has the piece '" + raw[i] + "' twice");
    vocab[piece[i]] = i;
  }

  // Merge candidates: t = a + b (byte splits), ranked by descending score of t, then id.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return score[x] > score[y]; });
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (int32_t t : order) {
    if (t < 3) continue;
    const std::string& p = piece[t];
    if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p.back() == '>') continue;  // byte token
    for (size_t k = 1; k < p.size(); ++k) {
      std::string a = p.substr(0, k), b = p.substr(k);
      auto ia = id_of.find(a), ib = id_of.find(b);
      if (ia == id_of.end() || ib == id_of.end() || ia->second < 3 || ib->second < 3) continue;
      merges.push_back({a, b});
    }
  }

  using oj = nlohmann::ordered_json;
  oj j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  oj added = oj::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", i},
                     {"content", piece[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  j["added_tokens"] = added;
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       oj::array({{{"type", "Prepend"}, {"prepend", kMeta}},
                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}};
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders", oj::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                              {{"type", "ByteFallback"}},
                              {{"type", "Fuse"}},
                              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  try {
    return j.dump(1);
  } catch (const nlohmann::json::exception& e) {
    fail("llama2.c tokenizer " + tok_bin.string() + " has a piece that is not valid UTF-8: " + e.what());
  }
}

}  // namespace tessera
