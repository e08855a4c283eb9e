// The reply parser: tool calls, reasoning and content out of a model's text (see tool_calls.h).
//
// One state machine serves whole replies and streams: parse_reply() is a stream fed the whole text once.
// Outside a reasoning block the machine looks for the earliest marker ("trigger") of the format; text before
// it is content, and a trigger starts a unit (one or more tool calls) that a format-specific parser takes
// whole or rejects (the trigger then stays in content, and so does the rest, as plain text). A unit parser
// answers "need more text" only while the text could still grow into a different answer, so no answer given
// on a prefix changes on a longer text: that is what makes every split of a stream agree with parse_reply.
#include "io/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "io/tool_calls_impl.h"

namespace tessera {
namespace {

using namespace tool_calls_impl;

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]", kMistralId = "[CALL_ID]";
constexpr std::string_view kFnGemmaOpen = "<start_function_call>", kFnGemmaClose = "<end_function_call>",
                           kFnGemmaQuote = "<escape>";
constexpr std::string_view kGemma4Open = "<|tool_call>", kGemma4Close = "<tool_call|>",
                           kGemma4Quote = "<|\"|>";
constexpr std::string_view kToolCode = "```tool_code", kFence = "```";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>", kDsCallsEnd = "<｜tool▁calls▁end｜>",
                           kDsCallBegin = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>",
                           kDsSep = "<｜tool▁sep｜>";

enum Kind {
  kReasonOpen,
  kDrop,
  kUnitHermes,
  kUnitMistral,
  kUnitFnGemma,
  kUnitGemma4,
  kUnitToolCode,
  kUnitDsCall
};

bool contains(std::string_view s, std::string_view x) {
  return s.find(x) != npos;
}
// s is a proper, non-empty prefix of marker: the text may still grow into it.
bool partial_of(std::string_view s, std::string_view marker) {
  return !s.empty() && s.size() < marker.size() && marker.starts_with(s);
}

// The first position at or after from where the rest of text is a proper prefix of marker, or npos.
size_t partial_start(std::string_view text, size_t from, std::string_view marker) {
  for (size_t q = std::max(from, text.size() > marker.size() ? text.size() - marker.size() : 0);
       q < text.size(); ++q)
    if (partial_of(text.substr(q), marker)) return q;
  return npos;
}

// The end (exclusive) of the JSON object or array opening at s[i]: kIncomplete when the text ends first,
// kBad when it nests too deep. Only brackets and strings are followed; parse_json judges the rest.
constexpr size_t kIncomplete = npos, kBad = npos - 1;
size_t json_extent(std::string_view s, size_t i) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return kBad;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return kIncomplete;
}

// Arguments as compact JSON object text: an object, a string holding one, or nothing ("{}").
std::optional<std::string> arguments_text(const ojson* v) {
  if (!v || v->is_null()) return std::string("{}");
  if (v->is_object()) return dump(*v);
  if (v->is_string()) {
    auto inner = parse_json(v->get_ref<const std::string&>());
    if (inner && inner->is_object()) return dump(*inner);
  }
  return std::nullopt;
}

// {"name": ..., "arguments"|"parameters": ...}. strict (Llama 3's bare JSON): the arguments must be present
// and no keys but name, parameters / arguments and "type": "function".
std::optional<ToolCall> call_from_object(const ojson& o, bool strict) {
  if (!o.is_object()) return std::nullopt;
  auto n = o.find("name");
  if (n == o.end() || !n->is_string() || !valid_name(n->get_ref<const std::string&>())) return std::nullopt;
  const ojson* args = nullptr;
  if (auto a = o.find("arguments"); a != o.end())
    args = &*a;
  else if (auto p = o.find("parameters"); p != o.end())
    args = &*p;
  if (strict) {
    if (!args) return std::nullopt;
    for (auto it = o.begin(); it != o.end(); ++it) {
      const std::string& k = it.key();
      if (k == "type" && it->is_string() && it->get_ref<const std::string&>() == "function") continue;
      if (k != "name" && k != "parameters" && k != "arguments") return std::nullopt;
    }
    if (o.contains("arguments") && o.contains("parameters")) return std::nullopt;
  }
  auto text = arguments_text(args);
  if (!text) return std::nullopt;
  return ToolCall{"", n->get<std::string>(), std::move(*text)};
}

// The JSON object or array at s[i], whole: its value and end, or why not.
enum class Got { Ok, NeedMore, Fail };
Got json_at(std::string_view s, size_t i, bool final, ojson& v, size_t& end) {
  if (i >= s.size()) return final ? Got::Fail : Got::NeedMore;
  if (s[i] != '{' && s[i] != '[') return Got::Fail;
  size_t x = json_extent(s, i);
  if (x == kIncomplete) return final ? Got::Fail : Got::NeedMore;
  if (x == kBad) return Got::Fail;
  auto parsed = parse_json(s.substr(i, x - i));
  if (!parsed) return Got::Fail;
  v = std::move(*parsed);
  end = x;
  return Got::Ok;
}

struct Unit {
  Got got = Got::Fail;
  size_t end = 0;
  std::vector<ToolCall> calls;
};
Unit need() {
  return {Got::NeedMore, 0, {}};
}
Unit fail() {
  return {};
}
Unit need_or_fail(bool final) {
  return final ? fail() : need();
}

// ---- Hermes: <tool_call> JSON </tool_call> --------------------------------------------------------------
Unit hermes_unit(std::string_view s, size_t a, bool final) {
  size_t q = skip_ws(s, a);
  ojson v;
  size_t x = 0;
  Got g = json_at(s, q, final, v, x);
  if (g != Got::Ok) return {g, 0, {}};
  auto call = call_from_object(v, false);
  if (!call) return fail();
  size_t r = skip_ws(s, x);
  std::string_view rest = s.substr(r);
  if (rest.starts_with(kHermesClose)) return {Got::Ok, r + kHermesClose.size(), {*call}};
  if (rest.empty()) return final ? Unit{Got::Ok, s.size(), {*call}} : need();  // a missing close at the end
  if (partial_of(rest, kHermesClose) && !final) return need();
  return fail();
}

// ---- Mistral: [TOOL_CALLS][{...}, ...]  or  [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} -----------------------
Unit mistral_unit(std::string_view s, size_t a, bool final) {
  size_t q = skip_ws(s, a);
  if (q >= s.size()) return need_or_fail(final);
  ojson v;
  size_t x = 0;
  if (s[q] == '[') {
    Got g = json_at(s, q, final, v, x);
    if (g != Got::Ok) return {g, 0, {}};
    if (!v.is_array() || v.empty()) return fail();
    Unit u{Got::Ok, x, {}};
    for (const auto& e : v) {
      auto call = call_from_object(e, false);
      if (!call) return fail();
      u.calls.push_back(std::move(*call));
    }
    return u;
  }
  auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  };
  size_t r = q;
  while (r < s.size() && name_char(s[r])) ++r;
  if (r == s.size()) return need_or_fail(final);
  std::string name(s.substr(q, r - q));
  if (name.empty()) return fail();
  if (!final && (partial_of(s.substr(r), kMistralId) || partial_of(s.substr(r), kMistralArgs))) return need();
  if (s.substr(r).starts_with(kMistralId)) {
    r += kMistralId.size();
    while (r < s.size() && std::isalnum(static_cast<unsigned char>(s[r]))) ++r;
    if (r == s.size()) return need_or_fail(final);
    if (!final && partial_of(s.substr(r), kMistralArgs)) return need();
  }
  if (s.substr(r).starts_with(kMistralArgs)) r += kMistralArgs.size();
  r = skip_ws(s, r);
  Got g = json_at(s, r, final, v, x);
  if (g != Got::Ok) return {g, 0, {}};
  auto args = arguments_text(&v);
  if (!args || !valid_name(name)) return fail();
  return {Got::Ok, x, {ToolCall{"", std::move(name), std::move(*args)}}};
}

// ---- DeepSeek: <｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}\n```<｜tool▁call▁end｜>
Unit deepseek_unit(std::string_view s, size_t a, bool final) {
  size_t e = s.find(kDsCallEnd, a), end = e + kDsCallEnd.size();
  if (e == npos) {
    if (!final) return need();
    e = end = s.size();
  }
  std::string_view body = s.substr(a, e - a);
  size_t sep = body.find(kDsSep);
  if (sep == npos) return fail();
  std::string_view left = trim(body.substr(0, sep)), right = trim(body.substr(sep + kDsSep.size()));
  std::string_view name, json;
  if (right.starts_with("{")) {  // V3.1: name<｜tool▁sep｜>{...}
    name = left;
    json = right;
  } else {  // V3 / R1: function<｜tool▁sep｜>name\n```json\n{...}\n```
    if (left != "function") return fail();
    size_t nl = right.find('\n');
    if (nl == npos) return fail();
    name = trim(right.substr(0, nl));
    json = trim(right.substr(nl + 1));
    if (json.starts_with(kFence)) {
      json.remove_prefix(kFence.size());
      if (json.starts_with("json")) json.remove_prefix(4);
      size_t close = json.rfind(kFence);
      if (close == npos) return fail();
      json = trim(json.substr(0, close));
    }
  }
  auto v = parse_json(json);
  if (!v || !v->is_object() || !valid_name(name)) return fail();
  return {Got::Ok, end, {ToolCall{"", std::string(name), dump(*v)}}};
}

// ---- Gemma: call:name{key:<escape>text<escape>,n:1,o:{...},l:[...]} (tool_calls_syntax.cpp) -------------
Unit gemma_unit(std::string_view s, size_t a, bool final, std::string_view close, std::string_view quote) {
  size_t e = s.find(close, a), end = e + close.size();
  if (e == npos) {
    if (!final) return need();
    e = end = s.size();
  }
  std::string_view body = trim(s.substr(a, e - a));
  if (!body.starts_with("call:")) return fail();
  body.remove_prefix(5);
  size_t brace = body.find('{');
  if (brace == npos) return fail();
  std::string_view name = trim(body.substr(0, brace));
  ojson args;
  if (!valid_name(name) || !gemma_call_args(body, brace, quote, args)) return fail();
  return {Got::Ok, end, {ToolCall{"", std::string(name), dump(args)}}};
}

Unit tool_code_unit(std::string_view s, size_t a, bool final) {
  size_t e = s.find(kFence, a), end = e + kFence.size();
  if (e == npos) {
    if (!final) return need();
    e = end = s.size();
  }
  Unit u{Got::Ok, end, {}};
  if (!python_calls(s.substr(a, e - a), u.calls)) return fail();
  return u;
}

// ---- Llama 3: the whole reply is {"name": ..., "parameters": {...}} objects -------------------------------
bool llama_calls(std::string_view s, std::vector<ToolCall>& out) {
  size_t r = skip_ws(s, 0);
  if (s.substr(r).starts_with(kPythonTag)) r += kPythonTag.size();
  for (;;) {
    while (r < s.size() && (is_ws(s[r]) || s[r] == ';')) ++r;
    if (r == s.size()) return !out.empty();
    ojson v;
    size_t x = 0;
    if (json_at(s, r, true, v, x) != Got::Ok) return false;
    auto call = call_from_object(v, true);
    if (!call) return false;
    out.push_back(std::move(*call));
    r = x;
  }
}

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

// ---- names and detection ----------------------------------------------------------------------------------
const char* tool_call_format_name(ToolCallFormat f) {
  static const char* const kNames[] = {"none", "hermes", "llama3", "mistral", "gemma", "deepseek"};
  size_t k = static_cast<size_t>(f);
  return k < std::size(kNames) ? kNames[k] : "none";
}

ToolCallFormat parse_tool_call_format(std::string_view name) {
  std::string lower;
  for (char c : name) lower += char(std::tolower(static_cast<unsigned char>(c)));
  for (auto f : {ToolCallFormat::None, ToolCallFormat::Hermes, ToolCallFormat::Llama3,
                 ToolCallFormat::Mistral, ToolCallFormat::Gemma, ToolCallFormat::DeepSeek})
    if (lower == tool_call_format_name(f)) return f;
  fail("unknown tool call format '" + std::string(name) +
       "': expected one of none, hermes, llama3, mistral, gemma, deepseek");
}

ToolCallFormat detect_tool_call_format(std::string_view t) {
  if (contains(t, kDsCallsBegin) || contains(t, kDsCallBegin)) return ToolCallFormat::DeepSeek;
  if (contains(t, kMistralCalls)) return ToolCallFormat::Mistral;
  if (contains(t, kFnGemmaOpen) || contains(t, kGemma4Open) || contains(t, "tool_code"))
    return ToolCallFormat::Gemma;
  if (contains(t, kHermesOpen)) return ToolCallFormat::Hermes;
  if (contains(t, kPythonTag) || contains(t, "Environment: ipython") ||
      (contains(t, "<|start_header_id|>") && contains(t, "\"parameters\"")))
    return ToolCallFormat::Llama3;
  if (contains(t, "tools")) return ToolCallFormat::Hermes;
  return ToolCallFormat::None;
}

ReasoningMarkers detect_reasoning_markers(std::string_view t) {
  ReasoningMarkers m;
  if (contains(t, "<think>") || contains(t, "</think>")) {
    m.open = "<think>";
    m.close = "</think>";
  } else if (contains(t, "<|channel>") && contains(t, "<channel|>")) {
    m.open = "<|channel>thought";
    m.close = "<channel|>";
  } else {
    return m;
  }
  size_t g = t.rfind("add_generation_prompt");
  if (g == npos) return m;
  for (size_t o = t.find(m.open, g); o != npos; o = t.find(m.open, o + 1)) {
    size_t after = o + m.open.size(), c = t.find(m.close, after);
    std::string_view between = t.substr(after, c == npos ? npos : c - after);
    if (c == npos || contains(between, "{{") || contains(between, "{%")) {
      m.starts_open = true;
      break;
    }
  }
  return m;
}

bool prompt_opens_reasoning(std::string_view prompt, const ReasoningMarkers& m) {
  if (m.open.empty() || m.close.empty()) return false;
  size_t o = prompt.rfind(m.open), c = prompt.rfind(m.close);
  return o != npos && (c == npos || c < o);
}

std::string tool_call_id(std::string_view id_prefix, size_t index) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the prefix, then the index mixed in
  for (unsigned char c : id_prefix) h = (h ^ c) * 0x100000001b3ULL;
  h = mix64(h ^ mix64(uint64_t(index) + 1));
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int k = 0; k < 9; ++k, h /= 62) id += kAlnum[h % 62];  // 62^9 < 2^64
  return id;
}

// ---- the stream ------------------------------------------------------------------------------------------
void ReplyStream::Sink::add(std::string_view s, std::string& out) {
  if (!trim) {
    out.append(s);
    return;
  }
  if (!started) {
    size_t b = skip_ws(s, 0);
    if (b == s.size()) return;
    s.remove_prefix(b);
    started = true;
  }
  size_t last = s.find_last_not_of(" \t\n\r");
  if (last == npos) {
    pending.append(s);
    return;
  }
  out += pending;
  out.append(s.substr(0, last + 1));
  pending.assign(s.substr(last + 1));
}

ReplyStream::ReplyStream(ToolCallFormat f, ReasoningMarkers m, std::string id_prefix)
    : f_(f), m_(std::move(m)), id_prefix_(std::move(id_prefix)) {
  bool reasoning = !m_.open.empty() && !m_.close.empty();
  passthrough_ = f_ == ToolCallFormat::None && !reasoning;
  content_.trim = !passthrough_;
  auto add = [&](std::string_view t, int kind) { triggers_.push_back(Trigger{std::string(t), kind}); };
  if (reasoning) {
    add(m_.open, kReasonOpen);
    add(m_.close, kDrop);  // a close marker outside a block
    in_reasoning_ = open_may_repeat_ = m_.starts_open;
  }
  switch (f_) {
    case ToolCallFormat::Hermes:
      add(kHermesOpen, kUnitHermes);
      break;
    case ToolCallFormat::Mistral:
      add(kMistralCalls, kUnitMistral);
      break;
    case ToolCallFormat::Gemma:
      add(kFnGemmaOpen, kUnitFnGemma);
      add(kGemma4Open, kUnitGemma4);
      add(kToolCode, kUnitToolCode);
      break;
    case ToolCallFormat::DeepSeek:
      add(kDsCallsBegin, kDrop);
      add(kDsCallsEnd, kDrop);
      add(kDsCallBegin, kUnitDsCall);
      break;
    case ToolCallFormat::None:
    case ToolCallFormat::Llama3:
      break;
  }
}

size_t ReplyStream::next_trigger(std::string_view text, size_t from, size_t& which) {
  size_t best = npos, best_len = 0;
  for (size_t k = 0; k < triggers_.size(); ++k) {
    Trigger& t = triggers_[k];
    if (t.found != npos && t.found < from) {
      t.searched_to = t.found + 1;
      t.found = npos;
    }
    if (t.found == npos) {
      size_t start = std::max(from, t.searched_to), f = text.find(t.text, start);
      if (f == npos)
        t.searched_to =
            std::max(start, text.size() + 1 > t.text.size() ? text.size() + 1 - t.text.size() : 0);
      else
        t.found = f;
    }
    if (t.found != npos && (t.found < best || (t.found == best && t.text.size() > best_len))) {
      best = t.found;
      best_len = t.text.size();
      which = k;
    }
  }
  return best;
}

size_t ReplyStream::partial_trigger_start(std::string_view text, size_t from) const {
  size_t best = npos;
  for (const auto& t : triggers_) best = std::min(best, partial_start(text, from, t.text));
  return best;
}

// Llama 3's rule: before any content, text that starts with '{' or <|python_tag|> is held to the end, where
// it is tool calls if the whole of it parses as calls. True: stop this update (wait, or done).
bool ReplyStream::llama_whole_reply(std::string_view text, bool final, ReplyDelta& d) {
  if (content_.started || emitted_calls_ > 0) {
    llama_decided_ = true;
    return false;
  }
  std::string_view rest = text.substr(skip_ws(text, pos_));
  auto reasoning_marker = [&](std::string_view marker) {
    return !marker.empty() && (rest.starts_with(marker) || partial_of(rest, marker));
  };
  if (rest.empty()) {
    if (!final) return true;
  } else if (rest[0] == '{' || rest.starts_with(kPythonTag) || partial_of(rest, kPythonTag)) {
    if (!final) return true;
    std::vector<ToolCall> calls;
    if (llama_calls(rest, calls)) {
      for (auto& c : calls) {
        c.id = tool_call_id(id_prefix_, emitted_calls_++);
        d.tool_calls.push_back(std::move(c));
      }
      pos_ = text.size();
      llama_decided_ = true;
      return true;
    }
  } else if (reasoning_marker(m_.open) || reasoning_marker(m_.close)) {
    return false;  // a reasoning block first: decide after it
  }
  llama_decided_ = true;
  return false;
}

ReplyDelta ReplyStream::update(std::string_view text, bool final) {
  ReplyDelta d;
  d.first_tool_index = emitted_calls_;
  if (finished_) return d;
  pos_ = std::min(pos_, text.size());
  try {
    for (;;) {
      if (in_reasoning_) {
        if (open_may_repeat_) {  // the model may write the open marker the prompt already wrote
          size_t q = skip_ws(text, pos_);
          std::string_view rest = text.substr(q);
          if (rest.starts_with(m_.open)) {
            pos_ = q + m_.open.size();
            open_may_repeat_ = false;
            continue;
          }
          if (!final && (rest.empty() || partial_of(rest, m_.open))) break;
          open_may_repeat_ = false;
        }
        size_t e = text.find(m_.close, pos_);
        if (e != npos) {
          reasoning_.add(text.substr(pos_, e - pos_), d.reasoning);
          pos_ = e + m_.close.size();
          in_reasoning_ = false;
          continue;
        }
        size_t stop = final ? npos : partial_start(text, pos_, m_.close);
        if (stop == npos) stop = text.size();
        reasoning_.add(text.substr(pos_, stop - pos_), d.reasoning);
        pos_ = stop;
        break;
      }
      if (passthrough_) {
        content_.add(text.substr(pos_), d.content);
        pos_ = text.size();
        break;
      }
      if (f_ == ToolCallFormat::Llama3 && !llama_decided_ && llama_whole_reply(text, final, d)) break;
      size_t which = 0, p = next_trigger(text, pos_, which);
      size_t partial = final ? npos : partial_trigger_start(text, pos_);
      if (p == npos || (partial != npos && partial <= p)) {  // content up to a possible marker
        size_t stop = partial != npos ? partial : text.size();
        content_.add(text.substr(pos_, stop - pos_), d.content);
        pos_ = stop;
        break;
      }
      content_.add(text.substr(pos_, p - pos_), d.content);
      pos_ = p;
      const Trigger& t = triggers_[which];
      size_t a = p + t.text.size();
      if (t.kind == kReasonOpen || t.kind == kDrop) {
        in_reasoning_ = t.kind == kReasonOpen;
        pos_ = a;
        continue;
      }
      Unit u;
      switch (t.kind) {
        case kUnitHermes:
          u = hermes_unit(text, a, final);
          break;
        case kUnitMistral:
          u = mistral_unit(text, a, final);
          break;
        case kUnitFnGemma:
          u = gemma_unit(text, a, final, kFnGemmaClose, kFnGemmaQuote);
          break;
        case kUnitGemma4:
          u = gemma_unit(text, a, final, kGemma4Close, kGemma4Quote);
          break;
        case kUnitToolCode:
          u = tool_code_unit(text, a, final);
          break;
        case kUnitDsCall:
          u = deepseek_unit(text, a, final);
          break;
        default:
          break;
      }
      if (u.got == Got::NeedMore) break;
      if (u.got == Got::Fail) {  // not a call after all: the marker is text
        content_.add(t.text, d.content);
        pos_ = a;
        continue;
      }
      for (auto& c : u.calls) {
        c.id = tool_call_id(id_prefix_, emitted_calls_++);
        d.tool_calls.push_back(std::move(c));
      }
      pos_ = u.end;
    }
  } catch (...) {  // out of memory or a bug: never lose the text, never throw at the server
    if (pos_ < text.size()) d.content.append(text.substr(pos_));
    pos_ = text.size();
  }
  if (final) finished_ = true;  // held-back trailing whitespace is dropped
  return d;
}

ParsedReply parse_reply(std::string_view text, ToolCallFormat f, const ReasoningMarkers& m,
                        std::string_view id_prefix) {
  ReplyStream s(f, m, std::string(id_prefix));
  ReplyDelta d = s.update(text, true);
  return ParsedReply{std::move(d.content), std::move(d.reasoning), std::move(d.tool_calls)};
}

}  // namespace tessera
