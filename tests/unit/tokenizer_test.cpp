// Tokenizer: llama.cpp's Qwen2 test vectors, round trips, added tokens, errors, exact bytes.
#include "io/tokenizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::filesystem::path qwen2_dir() {
  return test::shared_dir() / "tokenizers/qwen2";
}

const Tokenizer& qwen2() {
  static const Tokenizer t = Tokenizer::from_file(qwen2_dir() / "tokenizer.json");
  return t;
}

std::string nfc(const std::string& s) {
  auto* p = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string out(reinterpret_cast<char*>(p));
  std::free(p);
  return out;
}

// llama.cpp's format: each text is followed by "\n__ggml_vocab_test__\n"; the newline before the
// separator is not part of the text.
std::vector<std::string> read_inputs(const std::filesystem::path& p) {
  std::string all = read_all(p);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t f = all.find(sep, pos);
    if (f == std::string::npos) break;
    texts.push_back(all.substr(pos, f - pos));
    pos = f + sep.size();
  }
  return texts;
}

std::vector<std::vector<int32_t>> read_outputs(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    int32_t id;
    while (ls >> id) ids.push_back(id);
    out.push_back(ids);
  }
  return out;
}

TEST(Tokenizer, Qwen2TestVectorsAllPass) {
  TESSERA_SKIP_WITHOUT_SHARED("tokenizers/qwen2");
  auto texts = read_inputs(qwen2_dir() / "test-vectors.inp");
  auto expected = read_outputs(qwen2_dir() / "test-vectors.out");
  ASSERT_EQ(texts.size(), 46u);
  ASSERT_EQ(texts.size(), expected.size());
  int pass = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = qwen2().encode(texts[i]);
    EXPECT_EQ(ids, expected[i]) << "vector " << i << ": '" << texts[i] << "'";
    if (ids == expected[i]) ++pass;
    EXPECT_EQ(qwen2().decode(ids), nfc(texts[i])) << "vector " << i;
  }
  EXPECT_EQ(pass, static_cast<int>(texts.size()));
}

TEST(Tokenizer, Qwen2BasicFacts) {
  TESSERA_SKIP_WITHOUT_SHARED("tokenizers/qwen2");
  const auto& t = qwen2();
  EXPECT_EQ(t.vocab_size(), 151669u);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_id("Hello"), 9707);
  EXPECT_EQ(t.token_id("ĠHello"), 21927);
  EXPECT_EQ(t.token_id("no-such-piece-xyz"), -1);
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(9707));
  EXPECT_EQ(t.token_text(21927), " Hello");
  EXPECT_EQ(t.token_text(151644), "<|im_start|>");
  EXPECT_EQ(t.encode(""), std::vector<int32_t>{});
}

TEST(Tokenizer, SpecialTokensAreNeverSplit) {
  TESSERA_SKIP_WITHOUT_SHARED("tokenizers/qwen2");
  const auto& t = qwen2();
  std::string text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  auto ids = t.encode(text);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids[0], 151644);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);
  EXPECT_EQ(t.decode(ids), text);
  // glued to letters and punctuation on both sides, still one token
  auto glued = t.encode("abc<|endoftext|>def!<|endoftext|><|endoftext|>");
  EXPECT_EQ(std::count(glued.begin(), glued.end(), 151643), 3);
  EXPECT_EQ(t.decode(glued, /*skip_special=*/true), "abcdef!");
  // with parse_special = false they are plain text
  auto plain = t.encode(text, /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151644), 0);
  EXPECT_EQ(t.decode(plain), text);
  // random texts with specials embedded: every special comes back as its single id
  std::mt19937 rng(7);
  const char* parts[] = {"<|im_start|>", "<|im_end|>", " the", "<", "|", "im_", "x", "\n", "é", "<|"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    int n_special = 0;
    for (int k = 0; k < 12; ++k) {
      int p = static_cast<int>(rng() % 10);
      s += parts[p];
      n_special += p < 2;
    }
    auto v = t.encode(s);
    int got =
        static_cast<int>(std::count(v.begin(), v.end(), 151644) + std::count(v.begin(), v.end(), 151645));
    ASSERT_EQ(got, n_special) << s;
    ASSERT_EQ(t.decode(v), s);
  }
}

// Random valid UTF-8 from several scripts, emoji, combining marks; decode(encode(s)) == NFC(s).
TEST(Tokenizer, FuzzRoundTripIsNfcOfInput) {
  TESSERA_SKIP_WITHOUT_SHARED("tokenizers/qwen2");
  const auto& t = qwen2();
  std::mt19937 rng(1234);
  const std::pair<uint32_t, uint32_t> ranges[] = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x17F},    {0x300, 0x36F},     {0x391, 0x3C9},
      {0x400, 0x44F},   {0x5D0, 0x5EA},   {0x620, 0x64A},   {0x900, 0x97F},     {0xE00, 0xE5B},
      {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F6FF}, {0x2000, 0x206F}};
  for (int trial = 0; trial < 500; ++trial) {
    std::string s;
    int len = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) {
      auto [lo, hi] = ranges[rng() % std::size(ranges)];
      uint32_t cp = lo + rng() % (hi - lo + 1);
      if (!utf8proc_codepoint_valid(static_cast<utf8proc_int32_t>(cp))) continue;
      utf8proc_uint8_t buf[4];
      auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
      s.append(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
    }
    auto ids = t.encode(s);
    ASSERT_EQ(t.decode(ids), nfc(s)) << "trial " << trial;
    // concatenated single-token texts are the same bytes
    std::string cat;
    for (int32_t id : ids) cat += t.token_text(id);
    ASSERT_EQ(cat, nfc(s));
  }
}

TEST(Tokenizer, DecodeGivesExactUtf8Bytes) {
  TESSERA_SKIP_WITHOUT_SHARED("tokenizers/qwen2");
  const auto& t = qwen2();
  // " 🦙" is split over byte tokens: each alone is a fragment, together the exact bytes
  std::vector<int32_t> ids = {11162, 99, 247};
  EXPECT_EQ(t.decode(ids), " \xF0\x9F\xA6\x99");
  EXPECT_EQ(t.token_text(11162), " \xF0\x9F");
  EXPECT_EQ(t.token_text(99), "\xA6");
  std::string mixed = "naïve café — 東京 🦙\t\r\n  end";
  EXPECT_EQ(t.decode(t.encode(mixed)), mixed);
  // invalid UTF-8 is tokenized byte by byte and comes back unchanged
  std::string invalid = "ab\xFF\xFE c\xC3(\xE2\x82 end\x80";
  EXPECT_EQ(t.decode(t.encode(invalid)), invalid);
  EXPECT_THROW(t.decode(std::vector<int32_t>{-1}), Error);
  EXPECT_THROW(t.decode(std::vector<int32_t>{1 << 24}), Error);
}

std::string tiny_json(const std::string& model, const std::string& extra = "") {
  return R"({"added_tokens": [], "normalizer": null, "pre_tokenizer": null, "decoder": null, )" + extra +
         R"("model": )" + model + "}";
}

TEST(Tokenizer, UnsupportedTypesNameTheTypeAndFile) {
  auto expect_msg = [](const std::string& json, const std::string& needle) {
    try {
      Tokenizer::from_json(json, "my/tokenizer.json");
      FAIL() << "expected an Error mentioning " << needle;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_NE(m.find("my/tokenizer.json"), std::string::npos) << m;
    }
  };
  expect_msg(tiny_json(R"({"type": "WordPiece", "vocab": {"a": 0}})"), "WordPiece");
  expect_msg(tiny_json(R"({"type": "Unigram", "vocab": [["a", 0.0]]})"), "Unigram");
  const std::string bpe = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  auto with = [&](const std::string& field, const std::string& value) {
    std::string j = tiny_json(bpe);
    auto pos = j.find("\"" + field + "\": null");
    return j.replace(pos, field.size() + 8, "\"" + field + "\": " + value);
  };
  expect_msg(with("normalizer", R"({"type": "NFKD"})"), "NFKD");
  expect_msg(with("pre_tokenizer", R"({"type": "BertPreTokenizer"})"), "BertPreTokenizer");
  expect_msg(with("decoder", R"({"type": "WordPiece", "prefix": "##"})"), "WordPiece");
  expect_msg(with("pre_tokenizer", R"({"type": "Sequence", "pretokenizers": [{"type": "Digits"}]})"),
             "Digits");
  // Fields of the wrong JSON type: the message names the section (nlohmann's own prefix dropped).
  const std::string added = R"({"added_tokens": [{"id": 0, "content": "a"}, {"id": 1, "content": 7}])";
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {added + tiny_json(bpe).substr(19), "in \"added_tokens[1]\": type must be string, but is number"},
           {tiny_json(R"({"type": "BPE", "vocab": {"a": 0}})"), "in \"model\": key 'merges' not found"},
           {tiny_json(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [["a", 1]]})"),
            "a merge is neither \"a b\" nor [\"a\", \"b\"]"},
           {R"(["model"])", "the top level is not an object"},
           {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": 1})",
            "\"added_tokens\" is not an array"}}) {
    expect_msg(json, needle);
    try {
      Tokenizer::from_json(json, "my/tokenizer.json");
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("[json.exception"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Tokenizer::from_json("{not json", "x.json"), Error);
  EXPECT_THROW(Tokenizer::from_file("/no/such/dir/tokenizer.json"), Error);
  // the supported minimal file loads and merges
  auto t = Tokenizer::from_json(tiny_json(bpe));
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{2, 2}));
}

// A SentencePiece-style BPE file as llama / Mistral tokenizer.json write it.
TEST(Tokenizer, SentencePieceStyleBpe) {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, R"(, "<0x%02X>": %d)", b, 3 + b);
    vocab += buf;
  }
  vocab += R"(, "▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263, "é": 264)";
  std::string json = R"({"added_tokens": [
      {"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
      {"id": 2, "content": "</s>", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
      "vocab": {)" + vocab +
                     R"(}, "merges": [["▁", "h"], ["▁h", "i"]]}})";
  auto t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode("hi hi"), (std::vector<int32_t>{263, 263}));
  EXPECT_EQ(t.decode(t.encode("hi hi")), "hi hi");
  // 'ü' is not in the vocabulary: byte fallback to <0xC3> <0xBC>
  EXPECT_EQ(t.encode("ü"), (std::vector<int32_t>{259, 3 + 0xC3, 3 + 0xBC}));
  EXPECT_EQ(t.decode(t.encode("hi ü é")), "hi ü é");
  EXPECT_EQ(t.encode("<s>hi"), (std::vector<int32_t>{1, 263}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 263, 263}, true), "hi hi");
  EXPECT_EQ(t.token_text(263), " hi");
  EXPECT_EQ(t.token_text(3 + 'A'), "A");
}

}  // namespace
}  // namespace tessera
