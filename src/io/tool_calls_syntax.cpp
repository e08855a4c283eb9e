// The call-syntax parsers of the reply parser (io/tool_calls_impl.h): Gemma's argument literals and
// Python calls, both into JSON arguments.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "io/tool_calls_impl.h"

namespace tessera::tool_calls_impl {
namespace {

// A cursor over call syntax shared by the Gemma and Python literal parsers.
struct Cursor {
  std::string_view s;
  size_t i = 0;
  int depth = 0;

  bool at(char c) {
    i = skip_ws(s, i);
    return i < s.size() && s[i] == c && (++i, true);
  }
  // Items up to the close, each followed by ',' or the close (the opener is already consumed).
  template <class Item>
  bool seq(char close, Item item) {
    while (!at(close)) {
      if (!item()) return false;
      if (at(close)) return true;
      if (!at(',')) return false;
    }
    return true;
  }
  std::string ident() {
    size_t b = i = skip_ws(s, i);
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_' || s[i] == '.'))
      ++i;
    return std::string(s.substr(b, i - b));
  }
};

// ---- Gemma: call:name{key:<escape>text<escape>,n:1,o:{...},l:[...]} ---------------------------------------
struct GemmaArgs : Cursor {
  std::string_view quote;

  bool quoted(std::string& out) {
    i = skip_ws(s, i);
    if (!s.substr(i).starts_with(quote)) return false;
    size_t b = i + quote.size(), e = s.find(quote, b);
    if (e == npos) return false;
    out.assign(s.substr(b, e - b));
    i = e + quote.size();
    return true;
  }
  bool value(ojson& out) {
    i = skip_ws(s, i);
    if (i >= s.size() || ++depth > kMaxDepth) return false;
    std::string str;
    if (s.substr(i).starts_with(quote)) {
      if (!quoted(str)) return false;
      out = std::move(str);
    } else if (s[i] == '{') {
      if (!object(out)) return false;
    } else if (at('[')) {
      out = ojson::array();
      if (!seq(']', [&] { return value(out.emplace_back()); })) return false;
    } else {  // a bare number / true / false / null, or unquoted text
      size_t b = i;
      while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']') ++i;
      std::string_view bare = trim(s.substr(b, i - b));
      if (bare.empty()) return false;
      auto v = parse_json(bare);
      out =
          v && (v->is_number() || v->is_boolean() || v->is_null()) ? std::move(*v) : ojson(std::string(bare));
    }
    --depth;
    return true;
  }
  bool object(ojson& out) {
    out = ojson::object();
    return at('{') && seq('}', [&] {
             std::string key;
             if (!quoted(key)) {
               size_t b = i;
               while (i < s.size() && s[i] != ':' && s[i] != ',' && s[i] != '}') ++i;
               key.assign(trim(s.substr(b, i - b)));
             }
             return !key.empty() && at(':') && value(out[key]);
           });
  }
};

// ---- Gemma 3 ```tool_code: f(a="x", b=[1, 2]) in Python syntax ------------------------------------------
struct PyCalls : Cursor {
  bool string(std::string& out) {  // '...' or "..." with the common escapes
    static constexpr std::string_view kFrom = "ntr\\'\"", kTo = "\n\t\r\\'\"";
    for (char q = s[i++]; i < s.size(); ++i) {
      if (s[i] == q) return ++i, true;
      size_t k = s[i] == '\\' && i + 1 < s.size() ? kFrom.find(s[i + 1]) : npos;
      if (k != npos) ++i;
      out += k != npos ? kTo[k] : s[i];
    }
    return false;
  }
  bool value(ojson& out) {
    i = skip_ws(s, i);
    if (i >= s.size() || ++depth > kMaxDepth) return false;
    char c = s[i];
    std::string str;
    if (c == '"' || c == '\'') {
      if (!string(str)) return false;
      out = std::move(str);
    } else if (at('[') || at('(')) {
      out = ojson::array();
      if (!seq(c == '[' ? ']' : ')', [&] { return value(out.emplace_back()); })) return false;
    } else if (at('{')) {
      out = ojson::object();
      if (!seq('}', [&] {
            ojson k;
            return value(k) && k.is_string() && at(':') && value(out[k.get<std::string>()]);
          }))
        return false;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') {
      size_t b = i;
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || std::strchr(".+-_", s[i])))
        ++i;
      std::string tok(s.substr(b, i - b));
      tok.erase(std::remove(tok.begin(), tok.end(), '_'), tok.end());
      if (tok[0] == '+') tok.erase(0, 1);
      auto v = parse_json(tok);
      char* endp = nullptr;
      double d = std::strtod(tok.c_str(), &endp);
      if (v && v->is_number())
        out = std::move(*v);
      else if (!tok.empty() && endp == tok.c_str() + tok.size() && std::isfinite(d))
        out = d;
      else
        return false;
    } else {
      std::string id = ident();
      if (id == "True" || id == "False")
        out = id == "True";
      else if (id == "None")
        out = nullptr;
      else
        return false;
    }
    --depth;
    return true;
  }
  // name(kw=value, ...), or print(name(...)).
  bool call(std::vector<ToolCall>& out) {
    std::string name = ident();
    if (!valid_name(name) || !at('(')) return false;
    if (name == "print") return call(out) && at(')');
    ojson args = ojson::object();
    if (!seq(')', [&] {
          std::string key = ident();
          return !key.empty() && at('=') && value(args[key]);
        }))
      return false;
    out.push_back(ToolCall{"", std::move(name), dump(args)});
    return true;
  }
  // Calls separated by newlines, ';' or ',', optionally in one [...] list.
  bool calls(std::vector<ToolCall>& out) {
    auto separators = [&] {
      while (at(';') || at(',')) {
      }
    };
    bool list = at('[');
    for (;;) {
      separators();
      if (list && at(']')) {
        separators();
        return skip_ws(s, i) >= s.size() && !out.empty();
      }
      if (skip_ws(s, i) >= s.size()) return !list && !out.empty();
      if (!call(out)) return false;
    }
  }
};

}  // namespace

bool gemma_call_args(std::string_view body, size_t brace, std::string_view quote, ojson& args) {
  GemmaArgs p{{body, brace}, quote};
  return p.object(args) && skip_ws(body, p.i) == body.size();
}

bool python_calls(std::string_view s, std::vector<ToolCall>& out) {
  PyCalls p{{s}};
  return p.calls(out);
}

}  // namespace tessera::tool_calls_impl
