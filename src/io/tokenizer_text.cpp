// Text stages of the tokenizer: PCRE2 regex, GPT-2 byte map, normalizers, pre-tokenizers, decoders.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "io/tokenizer_impl.h"

namespace tessera::tok {

// ---------------------------------------------------------------- regex
Regex::Regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0u);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    fail("tokenizer regex does not compile at offset " + std::to_string(off) + ": " +
         reinterpret_cast<const char*>(buf) + " (pattern: " + pattern + ")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* code = static_cast<const pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer regex match failed with PCRE2 error " + std::to_string(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {  // empty match: step over one character
      if (b >= text.size()) break;
      size_t i = b;
      next_codepoint(text, i);
      pos = i;
    }
  }
  return out;
}

// ---------------------------------------------------------------- UTF-8 and the byte map
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_codepoint(std::string_view s, size_t& i) {
  auto c = static_cast<uint8_t>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 1 || n == 0 || i + n > s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) {
    auto cc = static_cast<uint8_t>(s[i + k]);
    if ((cc & 0xC0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += n;
  return cp;
}

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = keep ? b : 256 + n++;
      append_utf8(to_utf8[b], to_cp[b]);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

std::string nfc(std::string_view s) {
  if (is_ascii(s)) return std::string(s);
  utf8proc_uint8_t* dst = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                        static_cast<utf8proc_ssize_t>(s.size()), &dst,
                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // invalid UTF-8: leave the bytes as they are
  std::string out(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

std::string lowercase(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = next_codepoint(s, i);
    append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

// Splits `s` by the regex matches according to HF's SplitDelimiterBehavior.
void split_by(const Regex& re, SplitBehavior behavior, bool invert, const std::string& s,
              std::vector<std::string>& out) {
  auto matches = re.find_all(s);
  // (begin, end, is_delimiter) covering s
  struct Part {
    size_t b, e;
    bool delim;
  };
  std::vector<Part> parts;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) parts.push_back({pos, b, invert});
    parts.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < s.size()) parts.push_back({pos, s.size(), invert});
  std::vector<std::pair<size_t, size_t>> spans;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (auto& p : parts) spans.emplace_back(p.b, p.e);
      break;
    case SplitBehavior::Removed:
      for (auto& p : parts)
        if (!p.delim) spans.emplace_back(p.b, p.e);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_open = false;
      for (auto& p : parts) {
        if (p.delim && prev_open)
          spans.back().second = p.e;
        else
          spans.emplace_back(p.b, p.e);
        prev_open = !p.delim;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool pending = false;
      for (auto& p : parts) {
        if (pending)
          spans.back().second = p.e;
        else
          spans.emplace_back(p.b, p.e);
        pending = p.delim;
      }
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_delim = false;
      for (size_t k = 0; k < parts.size(); ++k) {
        auto& p = parts[k];
        if (k > 0 && p.delim && prev_delim)
          spans.back().second = p.e;
        else
          spans.emplace_back(p.b, p.e);
        prev_delim = p.delim;
      }
      break;
    }
  }
  for (auto [b, e] : spans)
    if (e > b) out.emplace_back(s.substr(b, e - b));
}
}  // namespace

std::string byte_to_unicode_utf8(uint8_t b) {
  return byte_map().to_utf8[b];
}

int unicode_to_byte(uint32_t cp) {
  static const auto inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[byte_map().to_cp[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

// ---------------------------------------------------------------- normalizer
std::string normalize(const std::vector<NormStep>& steps, std::string_view text) {
  std::string s(text);
  for (const auto& st : steps) {
    switch (st.kind) {
      case NormStep::NFC:
        s = nfc(s);
        break;
      case NormStep::Lowercase:
        s = lowercase(s);
        break;
      case NormStep::Prepend:
        if (!s.empty()) s = st.content + s;
        break;
      case NormStep::Replace:
        if (st.regex.valid()) {
          std::string out;
          size_t pos = 0;
          for (auto [b, e] : st.regex.find_all(s)) {
            out.append(s, pos, b - pos);
            out += st.content;
            pos = e;
          }
          out.append(s, pos, std::string::npos);
          s = std::move(out);
        } else {
          replace_all(s, st.pattern, st.content);
        }
        break;
    }
  }
  return s;
}

// ---------------------------------------------------------------- pre-tokenizer
std::vector<std::string> pre_tokenize(const std::vector<PreStep>& steps, std::string text,
                                      bool first_segment) {
  std::vector<std::string> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(std::move(text));
  for (const auto& st : steps) {
    std::vector<std::string> next;
    next.reserve(pieces.size());
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::string& p = pieces[k];
      switch (st.kind) {
        case PreStep::Split:
          split_by(st.regex, st.behavior, st.invert, p, next);
          break;
        case PreStep::ByteLevel: {
          if (st.add_prefix_space && !p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
          std::vector<std::string> words;
          if (st.use_regex) {
            static const Regex gpt2(kGpt2Pattern, false);
            split_by(gpt2, SplitBehavior::Isolated, false, p, words);
          } else {
            words.push_back(std::move(p));
          }
          const auto& map = byte_map();
          for (auto& w : words) {
            std::string mapped;
            mapped.reserve(w.size() * 2);
            for (char c : w) mapped += map.to_utf8[static_cast<uint8_t>(c)];
            next.push_back(std::move(mapped));
          }
          break;
        }
        case PreStep::Metaspace: {
          replace_all(p, " ", st.replacement);
          bool prepend =
              st.prepend_scheme == "always" || (st.prepend_scheme == "first" && first_segment && k == 0);
          if (prepend && p.compare(0, st.replacement.size(), st.replacement) != 0) p = st.replacement + p;
          if (st.split) {
            split_by(st.regex, SplitBehavior::MergedWithNext, false, p, next);
          } else {
            next.push_back(std::move(p));
          }
          break;
        }
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

// ---------------------------------------------------------------- decoder
namespace {
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}
}  // namespace

std::string decode_pieces(const std::vector<DecStep>& steps, std::vector<std::string> tokens) {
  for (const auto& st : steps) {
    switch (st.kind) {
      case DecStep::ByteLevel:
        for (auto& t : tokens) {
          std::string out;
          out.reserve(t.size());
          for (size_t i = 0; i < t.size();) {
            size_t start = i;
            uint32_t cp = next_codepoint(t, i);
            int b = unicode_to_byte(cp);
            if (b >= 0)
              out += static_cast<char>(b);
            else
              out.append(t, start, i - start);
          }
          t = std::move(out);
        }
        break;
      case DecStep::Replace:
        for (auto& t : tokens) replace_all(t, st.pattern, st.content);
        break;
      case DecStep::ByteFallback:
        for (auto& t : tokens) {
          int b = parse_byte_token(t);
          if (b >= 0) t = std::string(1, static_cast<char>(b));
        }
        break;
      case DecStep::Fuse: {
        std::string all;
        for (auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecStep::Strip:
        for (auto& t : tokens) {
          size_t b = 0, e = t.size();
          for (int k = 0;
               k < st.start && t.compare(b, st.content.size(), st.content) == 0 && b + st.content.size() <= e;
               ++k)
            b += st.content.size();
          for (int k = 0; k < st.stop && e >= b + st.content.size() &&
                          t.compare(e - st.content.size(), st.content.size(), st.content) == 0;
               ++k)
            e -= st.content.size();
          t = t.substr(b, e - b);
        }
        break;
      case DecStep::Metaspace:
        for (size_t k = 0; k < tokens.size(); ++k) {
          replace_all(tokens[k], st.content, " ");
          if (k == 0 && st.strip_first && !tokens[k].empty() && tokens[k][0] == ' ') tokens[k].erase(0, 1);
        }
        break;
    }
  }
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

}  // namespace tessera::tok
