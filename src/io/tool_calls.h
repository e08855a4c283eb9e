// What a chat model writes, turned into the OpenAI chat fields: tool calls (`tool_calls`), reasoning text
// (`reasoning_content`) and content. One parser for whole replies and for streams that grow left to right.
//
// Formats accepted (the markers are the models' special tokens, written out as text):
//  Hermes    <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, several in a row
//            (Hermes 2 Pro, Qwen2.5, Qwen3 and the many templates that copy them; "parameters" is accepted
//            for "arguments"). A missing </tool_call> at the very end is forgiven when the JSON is whole.
//  Llama3    {"name": "f", "parameters": {...}} (or "arguments"; an extra "type": "function" is allowed),
//            optionally after <|python_tag|>, several separated by ';' or whitespace. Only when the whole
//            reply (after any reasoning block) is nothing but such objects: otherwise it is content.
//            (Llama 3.1/3.2/3.3 JSON tool calling; the pythonic and built-in-tool forms are content.)
//  Mistral   [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abcdefghi"}, ...]   (v3, Nemo, Small 3)
//            [TOOL_CALLS]f[ARGS]{...}, [TOOL_CALLS]f[CALL_ID]abcdefghi[ARGS]{...}      (v11+ / v13
//            tokenizers: Magistral, Mistral Small 3.2, Ministral 3, Devstral), and [TOOL_CALLS]f{...} (the
//            same with the [ARGS] token dropped by the detokeniser). A model-written id is not kept: ids come
//            from us.
//  Gemma     <start_function_call>call:f{key:<escape>text<escape>,n:3,o:{...},l:[...]}<end_function_call>
//            (FunctionGemma); <|tool_call>call:f{key:<|"|>text<|"|>,...}<tool_call|> (Gemma 4, the same
//            grammar with its own tokens); and Gemma 3's prompted ```tool_code\nf(a="x", b=2)\n``` block with
//            Python call syntax: keyword arguments only, several calls per line / ';' / ',' and optionally
//            wrapped in [...] or print(...); literals '..' ".." numbers True False None [..] (..) {k: v}.
//  DeepSeek
//  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>
//            ...<｜tool▁calls▁end｜> (V3, R1) and the V3.1 form
//            <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>.
// Sources: llama.cpp common/chat.cpp and models/templates/*.jinja (Hermes, Llama 3.x, Mistral Nemo,
// FunctionGemma, gemma4.jinja, DeepSeek R1/V3.1), vLLM's tool parsers and their tests (mistral v11 [ARGS]
// forms), Google's Gemma function-calling docs (ai.google.dev/gemma/docs/capabilities/function-calling and
// the FunctionGemma formatting guide).
//
// Output rules:
//  - A tool call that does not parse stays in content, verbatim (never lost, never an exception).
//  - Arguments are a JSON object as compact text (key order kept); an arguments value that is a JSON string
//    holding a JSON object is accepted, and missing arguments are "{}".
//  - Content and reasoning are each trimmed of surrounding whitespace (so whitespace-only content around tool
//    calls comes out ""): the rule cannot depend on whether calls come later, since a stream cannot take text
//    back. The one exception is format None without reasoning markers: the text is content verbatim.
//  - Reasoning: text between the open and close markers (anywhere outside a tool call); with starts_open the
//    reply starts inside a block; an unclosed block at the end is reasoning; a stray close marker is dropped.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

enum class ToolCallFormat { None, Hermes, Llama3, Mistral, Gemma, DeepSeek };

// The format a chat template's text implies, from the markers it writes; a template that mentions tools
// but no known marker gets Hermes (the most common convention); None when it mentions no tools.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);
const char* tool_call_format_name(
    ToolCallFormat f);  // "none", "hermes", "llama3", "mistral", "gemma", "deepseek"
// The inverse of tool_call_format_name (case-insensitive); tessera::Error listing the names otherwise.
ToolCallFormat parse_tool_call_format(std::string_view name);

// The thinking block a template opens and closes. Empty open = no reasoning.
struct ReasoningMarkers {
  std::string open, close;
  bool starts_open = false;  // the generation prompt already opened the block: the reply starts inside it
};
// "<think>" / "</think>" when the template mentions them (Gemma 4: "<|channel>thought" / "<channel|>");
// starts_open when the text after the template's last add_generation_prompt writes the open marker without
// closing it in the same literal (DeepSeek-R1, Qwen3 thinking models). prompt_opens_reasoning() on the
// rendered prompt is the surer test where the prompt is at hand.
ReasoningMarkers detect_reasoning_markers(std::string_view chat_template);
// Whether a rendered prompt ends inside an open reasoning block (its last open marker is after its last
// close).
bool prompt_opens_reasoning(std::string_view rendered_prompt, const ReasoningMarkers& m);

struct ToolCall {
  std::string id, name, arguments;  // arguments: a JSON object as compact text (OpenAI's form)
};
struct ParsedReply {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
};

// The id of the index-th call of a reply: "call_" + 9 letters and digits hashed from (id_prefix, index);
// the caller passes something unique to the request (e.g. its seed and creation time) as id_prefix.
std::string tool_call_id(std::string_view id_prefix, size_t index);

// A whole reply (non-streamed answer). Equals the concatenation of a ReplyStream's deltas over any growing
// prefixes of the same text.
ParsedReply parse_reply(std::string_view text, ToolCallFormat f, const ReasoningMarkers& m,
                        std::string_view id_prefix);

// What update() may send now, never to be taken back.
struct ReplyDelta {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;  // newly completed calls, in order, each whole
  size_t first_tool_index = 0;       // OpenAI index of tool_calls[0]
};

// Streaming: call update() with the whole committed text so far each time it grows, and final=true once at
// the end (later calls return nothing). Text that could still become a marker is held back; a tool call is
// sent once complete. Text that does not extend the previous text is treated as if it did (the model's
// committed text only grows). Linear in the text's length over the whole stream.
class ReplyStream {
 public:
  ReplyStream(ToolCallFormat f, ReasoningMarkers m, std::string id_prefix);
  ReplyDelta update(std::string_view text_so_far, bool final);
  size_t tool_calls() const { return emitted_calls_; }  // how many were emitted so far

 private:
  // Whitespace trimming for a stream: leading whitespace is dropped, trailing whitespace is held back
  // until more text follows (and dropped at the end).
  struct Sink {
    bool trim = true, started = false;
    std::string pending;
    void add(std::string_view s, std::string& out);
  };
  struct Trigger {
    std::string text;
    int kind = 0;
    size_t found = std::string::npos;  // cached next occurrence at or after searched_from
    size_t searched_to = 0;            // occurrences starting before this have been looked for
  };
  size_t next_trigger(std::string_view text, size_t from, size_t& which);
  size_t partial_trigger_start(std::string_view text, size_t from) const;
  bool llama_whole_reply(std::string_view text, bool final, ReplyDelta& d);

  ToolCallFormat f_;
  ReasoningMarkers m_;
  std::string id_prefix_;
  std::vector<Trigger> triggers_;
  bool passthrough_ = false, in_reasoning_ = false, open_may_repeat_ = false;
  bool llama_decided_ = false, finished_ = false;
  size_t pos_ = 0, emitted_calls_ = 0;
  Sink content_, reasoning_;
};

}  // namespace tessera
