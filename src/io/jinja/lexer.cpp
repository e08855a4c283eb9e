// The lexer: jinja2's, with trim_blocks and lstrip_blocks on and keep_trailing_newline off.
#include <cstring>

#include "io/jinja/ast.h"

namespace tessera::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

[[noreturn]] void lex_fail(int line, std::string msg) {
  throw RenderError{std::move(msg), line};
}

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '\\' || k + 1 == s.size()) {
      out += s[k];
      continue;
    }
    char c = s[++k];
    auto hex = [&](size_t n) {
      uint32_t cp = 0;
      for (size_t d = 1; d <= n; ++d) {
        if (k + d >= s.size()) lex_fail(line, "truncated \\x / \\u escape in a string");
        char h = s[k + d];
        int v = is_digit(h)              ? h - '0'
                : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                         : -1;
        if (v < 0) lex_fail(line, "truncated \\x / \\u escape in a string");
        cp = cp * 16 + static_cast<uint32_t>(v);
      }
      k += n;
      append_utf8(out, cp);
    };
    switch (c) {
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = 0;
          size_t n = 0;
          for (; n < 3 && k < s.size() && s[k] >= '0' && s[k] <= '7'; ++n, ++k) cp = cp * 8 + (s[k] - '0');
          --k;
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t tag = find_tag(pos_);
      std::string text = s_.substr(pos_, tag - pos_);
      if (tag == s_.size()) {
        emit_data(text, line_);
        break;
      }
      char kind = s_[tag + 1];  // '{', '%', '#'
      char sign = tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+') ? s_[tag + 2] : 0;
      strip_text(text, sign, kind != '{', line_starting);
      int text_line = line_;
      advance_to(tag);
      emit_data(text, text_line);
      size_t after = tag + 2 + (sign ? 1 : 0);
      if (kind == '%' && is_raw(after)) {
        line_starting = lex_raw();
      } else if (kind == '#') {
        line_starting = lex_comment(after);
      } else {
        line_starting = lex_tag(kind, after);
      }
    }
    out_.push_back({Tok::Eof, "", line_});
    return std::move(out_);
  }

 private:
  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;

  void advance_to(size_t p) {
    for (; pos_ < p; ++pos_)
      if (s_[pos_] == '\n') ++line_;
  }
  void emit_data(const std::string& text, int line) {
    if (!text.empty()) out_.push_back({Tok::Data, text, line});
  }
  size_t find_tag(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1)) {
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    }
    return s_.size();
  }
  // '-' strips all whitespace before the tag; otherwise lstrip_blocks strips a line's indentation before a
  // block or comment tag (unless '+').
  static void strip_text(std::string& text, char sign, bool block, bool line_starting) {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_space(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && block) {
      size_t l = text.rfind('\n');
      l = l == std::string::npos ? 0 : l + 1;
      if ((l > 0 || line_starting) && l < text.size()) {
        bool ws = true;
        for (size_t k = l; k < text.size(); ++k) ws = ws && is_space(text[k]);
        if (ws) text.resize(l);
      }
    }
  }
  size_t skip_ws(size_t p) const {
    while (p < s_.size() && is_space(s_[p])) ++p;
    return p;
  }
  bool word_at(size_t p, const char* w) const {
    size_t n = std::strlen(w);
    return s_.compare(p, n, w) == 0 && (p + n >= s_.size() || !is_name_char(s_[p + n]));
  }
  // At `p`, a block end: "+%}", "-%}" + whitespace, or "%}" + one newline. Returns the end, or npos.
  size_t block_end(size_t p, char close) const {
    if (p + 2 < s_.size() && ((s_[p] == '+' && close == '%') || s_[p] == '-') && s_[p + 1] == close &&
        s_[p + 2] == '}') {
      return s_[p] == '+' ? p + 3 : skip_ws(p + 3);
    }
    if (p + 1 < s_.size() && s_[p] == close && s_[p + 1] == '}') {
      if (close == '}') return p + 2;
      return p + 2 < s_.size() && s_[p + 2] == '\n' ? p + 3 : p + 2;
    }
    return std::string::npos;
  }
  bool is_raw(size_t p) const {
    p = skip_ws(p);
    if (!word_at(p, "raw")) return false;
    p = skip_ws(p + 3);
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0;
  }
  // {% raw %}...{% endraw %}: the start tag has no trim_blocks.
  bool lex_raw() {
    size_t p = skip_ws(s_.find("raw", pos_) + 3);
    p = s_[p] == '-' ? skip_ws(p + 3) : p + 2;
    advance_to(p);
    for (size_t q = s_.find("{%", p); q != std::string::npos; q = s_.find("{%", q + 1)) {
      char sign = q + 2 < s_.size() && (s_[q + 2] == '-' || s_[q + 2] == '+') ? s_[q + 2] : 0;
      size_t w = skip_ws(q + 2 + (sign ? 1 : 0));
      if (!word_at(w, "endraw")) continue;
      size_t e = block_end(skip_ws(w + 6), '%');
      if (e == std::string::npos) continue;
      std::string text = s_.substr(p, q - p);
      strip_text(text, sign, true, false);
      int line = line_;
      advance_to(e);
      emit_data(text, line);
      return s_[e - 1] == '\n';
    }
    lex_fail(line_, "missing end of raw directive");
  }
  bool lex_comment(size_t p) {
    for (size_t q = s_.find("#}", p); q != std::string::npos; q = s_.find("#}", q + 1)) {
      size_t e;
      if (q > p && s_[q - 1] == '-')
        e = skip_ws(q + 2);
      else if (q > p && s_[q - 1] == '+')
        e = q + 2;
      else
        e = q + 2 < s_.size() && s_[q + 2] == '\n' ? q + 3 : q + 2;
      advance_to(e);
      return s_[e - 1] == '\n';
    }
    lex_fail(line_, "missing end of comment tag");
  }
  bool lex_tag(char kind, size_t p) {
    out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", line_});
    advance_to(p);
    char close = kind == '{' ? '}' : '%';
    std::vector<char> braces;
    bool after_dot = false;
    while (true) {
      size_t q = skip_ws(pos_);
      advance_to(q);
      if (pos_ >= s_.size())
        lex_fail(line_, kind == '{' ? "unexpected end of template, expected '}}'"
                                    : "unexpected end of template, expected '%}'");
      if (braces.empty()) {
        size_t e = block_end(pos_, close);
        if (e != std::string::npos) {
          out_.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line_});
          advance_to(e);
          return s_[e - 1] == '\n';
        }
      }
      char c = s_[pos_];
      int line = line_;
      size_t start = pos_;
      if (is_digit(c)) {
        size_t e = pos_;
        while (e < s_.size() && (is_digit(s_[e]) || s_[e] == '_')) ++e;
        bool is_float = false;
        if (!after_dot && e + 1 < s_.size() && s_[e] == '.' && is_digit(s_[e + 1])) {
          is_float = true;
          ++e;
          while (e < s_.size() && (is_digit(s_[e]) || s_[e] == '_')) ++e;
        }
        if (!after_dot && e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
          size_t x = e + 1;
          if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
          if (x < s_.size() && is_digit(s_[x])) {
            is_float = true;
            e = x;
            while (e < s_.size() && (is_digit(s_[e]) || s_[e] == '_')) ++e;
          }
        }
        std::string digits;
        for (size_t k = start; k < e; ++k)
          if (s_[k] != '_') digits += s_[k];
        out_.push_back({is_float ? Tok::Float : Tok::Int, digits, line});
        advance_to(e);
      } else if (is_name_start(c) || static_cast<unsigned char>(c) >= 0x80) {
        size_t e = pos_;
        while (e < s_.size() && (is_name_char(s_[e]) || static_cast<unsigned char>(s_[e]) >= 0x80)) ++e;
        out_.push_back({Tok::Name, s_.substr(start, e - start), line});
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < s_.size() && s_[e] != c) e += s_[e] == '\\' ? 2 : 1;
        if (e >= s_.size()) lex_fail(line, "unexpected end of string");
        out_.push_back(
            {Tok::String, unescape(std::string_view(s_).substr(start + 1, e - start - 1), line), line});
        advance_to(e + 1);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/",
                                          "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                          "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : ops)
          if (s_.compare(pos_, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) lex_fail(line, std::string("unexpected char '") + c + "'");
        if (*op == '(' || *op == '[' || *op == '{') braces.push_back(*op);
        if (*op == ')' || *op == ']' || *op == '}') {
          char open = *op == ')' ? '(' : *op == ']' ? '[' : '{';
          if (braces.empty()) lex_fail(line, std::string("unexpected '") + op + "'");
          if (braces.back() != open)
            lex_fail(line, std::string("unexpected '") + op + "', expected '" +
                               (braces.back() == '('   ? ")"
                                : braces.back() == '[' ? "]"
                                                       : "}") +
                               "'");
          braces.pop_back();
        }
        out_.push_back({Tok::Op, op, line});
        advance_to(pos_ + std::strlen(op));
      }
      after_dot = out_.back().type == Tok::Op && out_.back().text == ".";
    }
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  // Newlines normalised to "\n"; one trailing newline dropped (keep_trailing_newline=False).
  std::string s;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      s += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s += source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s)).run();
}

}  // namespace tessera::jinja
