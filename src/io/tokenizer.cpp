// Tokenizer: added-token splitting, then normalizer -> pre-tokenizer -> BPE per segment; decoding
// runs the file's decoder over each run of ordinary tokens and copies added tokens verbatim.
#include "io/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer_impl.h"

namespace tessera {

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open tokenizer file " + path.string() + ": " + std::strerror(errno));
  std::string text;
  f.seekg(0, std::ios::end);
  text.resize(static_cast<size_t>(f.tellg()));
  f.seekg(0);
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) fail("cannot read tokenizer file " + path.string());
  return from_json(text, path.string());
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  return Tokenizer(tok::load_impl(json_text, source));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const tok::Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  bool first_segment = true;
  auto encode_plain = [&](std::string_view seg) {
    if (seg.empty()) return;
    std::string norm = tok::normalize(im.normalizer, seg);
    if (im.pre_tokenizer.empty()) {
      im.bpe.encode_word(norm, out);
    } else {
      for (const auto& w : tok::pre_tokenize(im.pre_tokenizer, std::move(norm), first_segment))
        im.bpe.encode_word(w, out);
    }
    first_segment = false;
  };
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& cands = im.added_by_first[static_cast<uint8_t>(text[i])];
    const tok::AddedToken* hit = nullptr;
    for (int32_t idx : cands) {  // longest first
      const auto& a = im.added[static_cast<size_t>(idx)];
      if (a.special && !parse_special) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_start, i - plain_start));
    out.push_back(hit->id);
    first_segment = false;
    i += hit->content.size();
    plain_start = i;
  }
  encode_plain(text.substr(plain_start));
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const tok::Impl& im = *impl_;
  std::string out;
  std::vector<std::string> run;
  auto flush = [&] {
    if (!run.empty()) out += tok::decode_pieces(im.decoder, std::move(run));
    run.clear();
  };
  for (int32_t id : ids) {
    auto it = im.added_index.find(id);
    if (it != im.added_index.end()) {
      const auto& a = im.added[static_cast<size_t>(it->second)];
      flush();
      if (!(skip_special && a.special)) out += a.content;
      continue;
    }
    if (id < 0 || static_cast<size_t>(id) >= im.bpe.pieces.size() || im.bpe.pieces[id].empty())
      fail("token id " + std::to_string(id) + " is outside the vocabulary of " + im.source);
    run.push_back(im.bpe.pieces[id]);
  }
  flush();
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  const tok::Impl& im = *impl_;
  auto it = im.added_index.find(id);
  if (it != im.added_index.end()) return im.added[static_cast<size_t>(it->second)].content;
  if (id < 0 || static_cast<size_t>(id) >= im.bpe.pieces.size() || im.bpe.pieces[id].empty())
    fail("token id " + std::to_string(id) + " is outside the vocabulary of " + im.source);
  std::vector<tok::DecStep> steps;
  for (const auto& st : im.decoder) {  // per-token text: no stripping of leading spaces
    if (st.kind == tok::DecStep::Strip) continue;
    auto s = st;
    s.strip_first = false;
    steps.push_back(s);
  }
  return tok::decode_pieces(steps, {im.bpe.pieces[id]});
}

int32_t Tokenizer::token_id(std::string_view piece) const {
  const tok::Impl& im = *impl_;
  std::string key(piece);
  for (const auto& a : im.added)
    if (a.content == key) return a.id;
  auto it = im.bpe.vocab.find(key);
  return it == im.bpe.vocab.end() ? -1 : it->second;
}

size_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_index.find(id);
  return it != impl_->added_index.end() && impl_->added[static_cast<size_t>(it->second)].special;
}

}  // namespace tessera
