// tokenizer.json -> tok::Impl. Every unsupported type is an error naming the type and the file.
#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer_impl.h"

namespace tessera::tok {

namespace {
using json = nlohmann::json;

struct Ctx {
  const std::string& source;
  [[noreturn]] void unsupported(const std::string& what, const std::string& type) const {
    fail("unsupported tokenizer " + what + " type '" + type + "' in " + source +
         " (tessera supports BPE models: byte-level or SentencePiece-style with byte fallback)");
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail("malformed tokenizer file " + source + ": " + what);
  }
};

std::string str_or(const json& j, const char* key, const std::string& dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}
bool bool_or(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}
int int_or(const json& j, const char* key, int dflt) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return dflt;
  if (it->get<int64_t>() < INT32_MIN || it->get<int64_t>() > INT32_MAX ||
      (it->is_number_unsigned() && it->get<uint64_t>() > INT32_MAX))
    fail(std::string("tokenizer: '") + key + "' is out of range");
  return it->get<int>();
}

// {"String": s} or {"Regex": r}: returns the text and whether it is a regex.
std::pair<std::string, bool> pattern_of(const json& j, const Ctx& c) {
  auto it = j.find("pattern");
  if (it == j.end()) c.bad("a Split/Replace step has no \"pattern\"");
  if (it->is_string()) return {it->get<std::string>(), false};
  if (it->contains("String")) return {(*it)["String"].get<std::string>(), false};
  if (it->contains("Regex")) return {(*it)["Regex"].get<std::string>(), true};
  c.bad("pattern is neither {\"String\": ...} nor {\"Regex\": ...}");
}

void load_normalizer(const json& j, const Ctx& c, std::vector<NormStep>& out) {
  if (j.is_null()) return;
  std::string type = str_or(j, "type", "");
  if (type == "Sequence") {
    for (const auto& s : j.at("normalizers")) load_normalizer(s, c, out);
  } else if (type == "NFC") {
    out.push_back({NormStep::NFC, "", "", {}});
  } else if (type == "Lowercase") {
    out.push_back({NormStep::Lowercase, "", "", {}});
  } else if (type == "Prepend") {
    out.push_back({NormStep::Prepend, "", str_or(j, "prepend", ""), {}});
  } else if (type == "Replace") {
    auto [pat, is_regex] = pattern_of(j, c);
    NormStep st{NormStep::Replace, pat, str_or(j, "content", ""), {}};
    if (is_regex) st.regex = Regex(pat, false);
    out.push_back(std::move(st));
  } else {
    c.unsupported("normalizer", type);
  }
}

SplitBehavior behavior_of(const std::string& b, const Ctx& c) {
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  c.unsupported("Split behavior", b);
}

std::string metaspace_scheme(const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
    return j["prepend_scheme"].get<std::string>();
  return bool_or(j, "add_prefix_space", true) ? "always" : "never";
}

void load_pre_tokenizer(const json& j, const Ctx& c, std::vector<PreStep>& out) {
  if (j.is_null()) return;
  std::string type = str_or(j, "type", "");
  PreStep st;
  if (type == "Sequence") {
    for (const auto& s : j.at("pretokenizers")) load_pre_tokenizer(s, c, out);
    return;
  } else if (type == "Split") {
    auto [pat, is_regex] = pattern_of(j, c);
    st.kind = PreStep::Split;
    st.regex = Regex(pat, !is_regex);
    st.behavior = behavior_of(str_or(j, "behavior", "Isolated"), c);
    st.invert = bool_or(j, "invert", false);
  } else if (type == "ByteLevel") {
    st.kind = PreStep::ByteLevel;
    st.add_prefix_space = bool_or(j, "add_prefix_space", false);
    st.use_regex = bool_or(j, "use_regex", true);
  } else if (type == "Metaspace") {
    st.kind = PreStep::Metaspace;
    st.replacement = str_or(j, "replacement", "\xE2\x96\x81");
    st.prepend_scheme = metaspace_scheme(j);
    st.split = bool_or(j, "split", true);
    st.regex = Regex(st.replacement, true);
  } else {
    c.unsupported("pre_tokenizer", type);
  }
  out.push_back(std::move(st));
}

void load_decoder(const json& j, const Ctx& c, std::vector<DecStep>& out) {
  if (j.is_null()) return;
  std::string type = str_or(j, "type", "");
  DecStep st;
  if (type == "Sequence") {
    for (const auto& s : j.at("decoders")) load_decoder(s, c, out);
    return;
  } else if (type == "ByteLevel") {
    st.kind = DecStep::ByteLevel;
  } else if (type == "ByteFallback") {
    st.kind = DecStep::ByteFallback;
  } else if (type == "Fuse") {
    st.kind = DecStep::Fuse;
  } else if (type == "Replace") {
    auto [pat, is_regex] = pattern_of(j, c);
    if (is_regex) c.unsupported("decoder Replace pattern", "Regex");
    st.kind = DecStep::Replace;
    st.pattern = pat;
    st.content = str_or(j, "content", "");
  } else if (type == "Strip") {
    st.kind = DecStep::Strip;
    st.content = str_or(j, "content", " ");
    st.start = int_or(j, "start", 0);
    st.stop = int_or(j, "stop", 0);
  } else if (type == "Metaspace") {
    st.kind = DecStep::Metaspace;
    st.content = str_or(j, "replacement", "\xE2\x96\x81");
    st.strip_first = metaspace_scheme(j) != "never";
  } else {
    c.unsupported("decoder", type);
  }
  out.push_back(std::move(st));
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

void load_model(const json& m, const Ctx& c, Bpe& bpe) {
  std::string type = str_or(m, "type", m.contains("merges") ? "BPE" : "");
  if (type != "BPE") c.unsupported("model", type.empty() ? "<missing>" : type);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!str_or(m, k, "").empty()) c.unsupported(std::string("BPE option ") + k, str_or(m, k, ""));
  const auto& vocab = m.at("vocab");
  if (!vocab.is_object()) c.bad("model.vocab is not an object");
  bpe.vocab.reserve(vocab.size() * 2);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (1 << 30))
      c.bad("the vocab id of '" + it.key() + "' is not an integer in [0, 2^30]");
    const int64_t id = it.value().get<int64_t>();
    if (static_cast<size_t>(id) >= bpe.pieces.size()) bpe.pieces.resize(static_cast<size_t>(id) + 1);
    bpe.pieces[static_cast<size_t>(id)] = it.key();
    bpe.vocab.emplace(it.key(), static_cast<int32_t>(id));
  }
  std::fill(std::begin(bpe.byte_ids), std::end(bpe.byte_ids), -1);
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = bpe.vocab.find(name);
    if (it != bpe.vocab.end()) bpe.byte_ids[b] = it->second;
  }
  for (size_t id = 0; id < bpe.pieces.size(); ++id) {
    const std::string& p = bpe.pieces[id];
    if (p.empty()) continue;
    size_t i = 0;
    uint32_t cp = next_codepoint(p, i);
    if (i == p.size()) bpe.char_ids.emplace(cp, static_cast<int32_t>(id));
  }
  bpe.byte_fallback = bool_or(m, "byte_fallback", false);
  bpe.fuse_unk = bool_or(m, "fuse_unk", false);
  bpe.ignore_merges = bool_or(m, "ignore_merges", false);
  std::string unk = str_or(m, "unk_token", "");
  if (!unk.empty()) {
    auto it = bpe.vocab.find(unk);
    if (it == bpe.vocab.end()) c.bad("unk_token '" + unk + "' is not in the vocabulary");
    bpe.unk_id = it->second;
  }
  const auto& merges = m.at("merges");
  bpe.merges.reserve(merges.size() * 2);
  int32_t rank = 0;
  std::string a, b;
  auto lookup = [&](const std::string& s) {
    auto it = bpe.vocab.find(s);
    if (it == bpe.vocab.end()) c.bad("merge part '" + s + "' is not in the vocabulary");
    return it->second;
  };
  for (const auto& mj : merges) {
    if (mj.is_string()) {
      const auto& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);  // a piece may not contain a space, but guard a leading one
      if (sp == std::string::npos) c.bad("merge '" + s + "' has no space");
      a.assign(s, 0, sp);
      b.assign(s, sp + 1, std::string::npos);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      c.bad("a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
    int32_t ia = lookup(a), ib = lookup(b), ir = lookup(a + b);
    bpe.merges.emplace(pair_key(ia, ib), MergeRule{rank++, ir});  // first (lowest rank) wins
  }
}
}  // namespace

std::shared_ptr<Impl> load_impl(std::string_view json_text, const std::string& source) {
  Ctx c{source};
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("tokenizer file " + source + " is not valid JSON: " + e.what());
  }
  auto im = std::make_shared<Impl>();
  im->source = source;
  std::string section;  // where a JSON type error happened, for its message
  try {
    if (!j.is_object()) c.bad("the top level is not an object");
    if (!j.contains("model")) c.bad("no \"model\" section");
    section = "model";
    load_model(j["model"], c, im->bpe);
    section = "normalizer";
    if (j.contains("normalizer")) load_normalizer(j["normalizer"], c, im->normalizer);
    section = "pre_tokenizer";
    if (j.contains("pre_tokenizer")) load_pre_tokenizer(j["pre_tokenizer"], c, im->pre_tokenizer);
    section = "decoder";
    if (j.contains("decoder")) load_decoder(j["decoder"], c, im->decoder);
    section = "added_tokens";
    if (j.contains("added_tokens")) {
      if (!j["added_tokens"].is_array()) c.bad("\"added_tokens\" is not an array");
      size_t i = 0;
      for (const auto& a : j["added_tokens"]) {
        section = "added_tokens[" + std::to_string(i++) + "]";
        const json& id = a.at("id");
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 30))
          c.bad("the id of an added token is not an integer in [0, 2^30]");
        AddedToken t{a.at("content").get<std::string>(), id.get<int32_t>(), bool_or(a, "special", false)};
        if (t.content.empty() || t.id < 0) c.bad("an added token is empty or has a negative id");
        auto [it, fresh] = im->added_index.emplace(t.id, static_cast<int32_t>(im->added.size()));
        if (!fresh) continue;
        im->added.push_back(std::move(t));
      }
    }
  } catch (const json::exception& e) {
    // nlohmann's messages open with "[json.exception.type_error.302] ": the section says more.
    std::string what = e.what();
    if (const size_t at = what.find("] "); what.rfind("[json.exception.", 0) == 0 && at != std::string::npos)
      what.erase(0, at + 2);
    fail("malformed tokenizer file " + source + ", in \"" + section + "\": " + what);
  }
  for (size_t i = 0; i < im->added.size(); ++i)
    im->added_by_first[static_cast<uint8_t>(im->added[i].content[0])].push_back(static_cast<int32_t>(i));
  for (auto& v : im->added_by_first)
    std::stable_sort(v.begin(), v.end(), [&](int32_t x, int32_t y) {
      return im->added[x].content.size() > im->added[y].content.size();
    });
  size_t n = im->bpe.pieces.size();
  for (const auto& a : im->added) n = std::max(n, static_cast<size_t>(a.id) + 1);
  im->vocab_size = n;
  return im;
}

}  // namespace tessera::tok
