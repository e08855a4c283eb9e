// The pieces of the reply parser (io/tool_calls.cpp) that its call-syntax parsers (tool_calls_syntax.cpp)
// share: whitespace and JSON helpers, and the two literal syntaxes that are not JSON: Gemma's
// call:name{key:<escape>text<escape>,...} arguments and Python calls (Gemma 3's ```tool_code).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tool_calls.h"

namespace tessera::tool_calls_impl {

using ojson = nlohmann::ordered_json;
constexpr size_t npos = std::string_view::npos;
constexpr int kMaxDepth = 256;  // deeper JSON / literals are rejected (keeps recursion and dump() bounded)

inline bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
inline size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}
inline std::string_view trim(std::string_view s) {
  size_t b = skip_ws(s, 0), e = s.size();
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}
inline std::string dump(const ojson& v) {
  return v.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

inline std::optional<ojson> parse_json(std::string_view s) {
  try {
    ojson v = ojson::parse(s.begin(), s.end(), nullptr, false);
    if (v.is_discarded()) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

inline bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 256) return false;
  for (unsigned char c : n)
    if (c <= ' ' || c == '{' || c == '}' || c == '(' || c == ')' || c == '"' || c == ',') return false;
  return true;
}

// Gemma's arguments: the object at body[brace] ({key:<escape>text<escape>,n:1,o:{...},l:[...]}, quote the
// string delimiter) into args; false unless it parses and only whitespace follows it.
bool gemma_call_args(std::string_view body, size_t brace, std::string_view quote, ojson& args);
// Python calls (name(kw=value, ...) or print(name(...))), separated by newlines, ';' or ',', optionally in
// one [...] list, appended to out; false unless the whole of s is such calls, at least one.
bool python_calls(std::string_view s, std::vector<ToolCall>& out);

}  // namespace tessera::tool_calls_impl
