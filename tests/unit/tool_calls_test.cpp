// The reply parser (src/io/tool_calls.h): expected values written by hand from the formats' documentation
// (Hermes / Qwen <tool_call>, Llama 3.x JSON calls, Mistral [TOOL_CALLS] v3 and v11+, FunctionGemma, Gemma 4,
// Gemma 3 tool_code, DeepSeek V3 / R1 / V3.1), and the stream's promise: every split of a text into growing
// prefixes gives, concatenated, what parse_reply gives on the whole.
#include "io/tool_calls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera {
namespace {

const ReasoningMarkers kNoThink;
const ReasoningMarkers kThink{"<think>", "</think>", false};
const ReasoningMarkers kThinkOpen{"<think>", "</think>", true};

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};
std::vector<Call> calls_of(const std::vector<ToolCall>& v) {
  std::vector<Call> out;
  for (const auto& c : v) out.push_back({c.name, c.arguments});
  return out;
}
ParsedReply parse(std::string_view text, ToolCallFormat f, const ReasoningMarkers& m = kNoThink) {
  return parse_reply(text, f, m, "req-1");
}

// ---- detection -------------------------------------------------------------------------------------------
TEST(ToolCallFormat, DetectsFromTemplateMarkers) {
  // Qwen2.5 / Qwen3 / Hermes 2 Pro system prompt.
  EXPECT_EQ(
      detect_tool_call_format(
          "{%- if tools %}...For each function call, return a json object with function name and arguments "
          "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
          "\"arguments\": <args-json-object>}\\n</tool_call>"),
      ToolCallFormat::Hermes);
  // Llama 3.1: built-in tools announce the ipython environment.
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|>system<|end_header_id|>\\n\\n{%- if builtin_tools is "
                                    "defined or tools is not none %}{{- \"Environment: ipython\\n\" }}"),
            ToolCallFormat::Llama3);
  // Llama 3.2 / 3.3: the JSON instruction only.
  EXPECT_EQ(
      detect_tool_call_format("{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}{{- 'Respond in the "
                              "format {\"name\": function name, \"parameters\": dictionary of argument name "
                              "and its value}.' }}"),
      ToolCallFormat::Llama3);
  EXPECT_EQ(detect_tool_call_format("{{- '<|python_tag|>' + tool_call.name + '.call(' }}"),
            ToolCallFormat::Llama3);
  EXPECT_EQ(detect_tool_call_format("{{- '[TOOL_CALLS][' }}{%- for tool in message.tool_calls %}"),
            ToolCallFormat::Mistral);
  EXPECT_EQ(detect_tool_call_format("{{- '<start_function_call>call:' + function['name'] + '{' -}}"),
            ToolCallFormat::Gemma);
  EXPECT_EQ(detect_tool_call_format("{{- '<|tool_call>call:' + function['name'] + '{' -}}"),
            ToolCallFormat::Gemma);
  EXPECT_EQ(detect_tool_call_format("wrap calls in ```tool_code``` and results in ```tool_output```"),
            ToolCallFormat::Gemma);
  EXPECT_EQ(detect_tool_call_format(
                "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
                "'<｜tool▁sep｜>' + tool['function']['name']}}"),
            ToolCallFormat::DeepSeek);
  // No tools at all (a Llama 2 style template), and tools without a known marker (the common convention).
  EXPECT_EQ(detect_tool_call_format(
                "{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}"),
            ToolCallFormat::None);
  EXPECT_EQ(detect_tool_call_format("{% if tools %}{{ tools | tojson }}{% endif %}"), ToolCallFormat::Hermes);
}

TEST(ToolCallFormat, NamesRoundTripAndUnknownNamesAreErrors) {
  for (auto f : {ToolCallFormat::None, ToolCallFormat::Hermes, ToolCallFormat::Llama3,
                 ToolCallFormat::Mistral, ToolCallFormat::Gemma, ToolCallFormat::DeepSeek})
    EXPECT_EQ(parse_tool_call_format(tool_call_format_name(f)), f);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::Llama3), "llama3");
  EXPECT_EQ(parse_tool_call_format("DeepSeek"), ToolCallFormat::DeepSeek);
  try {
    parse_tool_call_format("qwen-xml");
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("qwen-xml"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hermes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deepseek"), std::string::npos) << msg;
  }
}

TEST(ReasoningMarkers, DetectsThinkAndWhetherThePromptOpensIt) {
  // Qwen3: the generation prompt closes an empty block only when thinking is off.
  auto qwen3 = detect_reasoning_markers(
      "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
      "'\\n</think>\\n\\n' "
      "}}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined "
      "and "
      "enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}");
  EXPECT_EQ(qwen3.open, "<think>");
  EXPECT_EQ(qwen3.close, "</think>");
  EXPECT_FALSE(qwen3.starts_open);
  // DeepSeek-R1: the prompt ends with "<think>\n".
  auto r1 = detect_reasoning_markers(
      "{% set content = content.split('</think>')[-1] %}{% if add_generation_prompt and not ns.is_tool "
      "%}{{'<｜Assistant｜><think>\\n'}}{% endif %}");
  EXPECT_EQ(r1.open, "<think>");
  EXPECT_TRUE(r1.starts_open);
  auto none = detect_reasoning_markers("{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_TRUE(none.open.empty());
  EXPECT_FALSE(none.starts_open);
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", kThink));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", kThink));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n", kThink));
}

// ---- formats
// -----------------------------------------------------------------------------------------------
TEST(ToolCallParse, HermesCallsAndContentAround) {
  auto r = parse(
      "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": "
      "\"CET\"}}\n</tool_call>\n",
      ToolCallFormat::Hermes);
  EXPECT_EQ(r.content, "Let me check both.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"get_weather", "{\"city\":\"Paris\",\"unit\":\"c\"}"},
                                                       {"get_time", "{\"tz\":\"CET\"}"}}));
  // Whitespace-only content around calls comes out "".
  r = parse("\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n\n", ToolCallFormat::Hermes);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  // Key order is kept, nested values are compact, a missing close at the very end is forgiven.
  r = parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"z\": [1, {\"y\": null}], \"a\": \"é\"}}",
            ToolCallFormat::Hermes);
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"f", "{\"z\":[1,{\"y\":null}],\"a\":\"é\"}"}}));
  // Arguments given as a string holding JSON, and "parameters" for "arguments".
  r = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
            ToolCallFormat::Hermes);
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"f", "{\"a\":1}"}}));
  r = parse("<tool_call>{\"name\": \"f\", \"parameters\": {\"b\": true}}</tool_call>",
            ToolCallFormat::Hermes);
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"f", "{\"b\":true}"}}));
}

TEST(ToolCallParse, HermesThatDoesNotParseStaysContent) {
  std::string bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
  auto r = parse(bad, ToolCallFormat::Hermes);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, bad);
  r = parse("use <tool_call> tags to call tools", ToolCallFormat::Hermes);
  EXPECT_EQ(r.content, "use <tool_call> tags to call tools");
  // A good call after a bad one is still a call.
  r = parse("<tool_call>oops</tool_call> <tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
            ToolCallFormat::Hermes);
  EXPECT_EQ(r.content, "<tool_call>oops</tool_call>");
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"g", "{}"}}));
  // Hermes markers mean nothing to other formats.
  r = parse("<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", ToolCallFormat::Mistral);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolCallParse, Llama3WholeReplyOnly) {
  auto r =
      parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", ToolCallFormat::Llama3);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"get_weather", "{\"city\":\"Paris\"}"}}));
  r = parse(
      "<|python_tag|>{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
      "\"arguments\": {\"x\": 1}}\n{\"name\": \"c\", \"parameters\": {}}",
      ToolCallFormat::Llama3);
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"a", "{}"}, {"b", "{\"x\":1}"}, {"c", "{}"}}));
  // Ordinary JSON answers, and calls inside prose, are content.
  for (std::string text :
       {"{\"answer\": 42}", "{\"name\": \"Bob\", \"age\": 3}",
        "{\"name\": \"f\", \"parameters\": {}} and then more text",
        "Sure: {\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": 3}",
        "{\"name\": \"f\", \"parameters\": {}, \"extra\": 1}"}) {
    r = parse(text, ToolCallFormat::Llama3);
    EXPECT_TRUE(r.tool_calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCallParse, MistralArrayAndArgsForms) {
  // v3 / Nemo: a JSON array; the model's own id is replaced by ours.
  auto r = parse(
      "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 3.5, \"b\": 4}, \"id\": \"abcdefghi\"}, "
      "{\"name\": \"mul\", \"arguments\": {\"a\": 2}}]",
      ToolCallFormat::Mistral);
  EXPECT_EQ(calls_of(r.tool_calls),
            (std::vector<Call>{{"add", "{\"a\":3.5,\"b\":4}"}, {"mul", "{\"a\":2}"}}));
  EXPECT_NE(r.tool_calls[0].id, "abcdefghi");
  // v11+: name[ARGS]{...}, with [CALL_ID] (v13), and with [ARGS] dropped by the detokeniser.
  r = parse(
      "Sure.[TOOL_CALLS]add_this_and_that[ARGS]{\"a\": 3.5, \"b\": 4}[TOOL_CALLS]get_weather[CALL_ID]"
      "a1B2c3D4e[ARGS]{\"city\": \"San Francisco\"}[TOOL_CALLS]now{}",
      ToolCallFormat::Mistral);
  EXPECT_EQ(r.content, "Sure.");
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"add_this_and_that", "{\"a\":3.5,\"b\":4}"},
                                                       {"get_weather", "{\"city\":\"San Francisco\"}"},
                                                       {"now", "{}"}}));
  r = parse("[TOOL_CALLS]f[ARGS]{\"a\": ", ToolCallFormat::Mistral);  // cut off
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "[TOOL_CALLS]f[ARGS]{\"a\":");
}

TEST(ToolCallParse, GemmaForms) {
  // FunctionGemma: <escape>-quoted strings, bare numbers / booleans, nested objects and lists.
  auto r = parse(
      "<start_function_call>call:get_weather{city:<escape>Paris, {FR}<escape>,days:3,metric:true,"
      "where:{lat:48.8,lon:2.3},tags:[<escape>a<escape>,1]}<end_function_call>"
      "<start_function_call>call:now{}<end_function_call>",
      ToolCallFormat::Gemma);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(calls_of(r.tool_calls),
            (std::vector<Call>{
                {"get_weather",
                 "{\"city\":\"Paris, {FR}\",\"days\":3,\"metric\":true,\"where\":{\"lat\":48.8,\"lon\":2.3},"
                 "\"tags\":[\"a\",1]}"},
                {"now", "{}"}}));
  // Gemma 4: the same grammar with <|tool_call> ... <tool_call|> and <|"|> quotes.
  r = parse("<|tool_call>call:search{query:<|\"|>a, b<|\"|>,n:2}<tool_call|>", ToolCallFormat::Gemma);
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"search", "{\"query\":\"a, b\",\"n\":2}"}}));
  // Gemma 3 prompted tool_code: Python calls, keyword arguments, print(...) and [...] wrappers.
  r = parse(
      "I'll look it up.\n```tool_code\nprint(get_weather(city=\"Tokyo\", days=2, hourly=False, "
      "extra=None, units=['c', \"f\"], opts={'a': 1.5}))\n```",
      ToolCallFormat::Gemma);
  EXPECT_EQ(r.content, "I'll look it up.");
  EXPECT_EQ(calls_of(r.tool_calls),
            (std::vector<Call>{{"get_weather",
                                "{\"city\":\"Tokyo\",\"days\":2,\"hourly\":false,\"extra\":null,"
                                "\"units\":[\"c\",\"f\"],\"opts\":{\"a\":1.5}}"}}));
  r = parse("```tool_code\n[a(x=1), b(s='it\\'s')]\n```", ToolCallFormat::Gemma);
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"a", "{\"x\":1}"}, {"b", "{\"s\":\"it's\"}"}}));
  // Positional arguments cannot be named: the block stays content.
  r = parse("```tool_code\nf(1, 2)\n```", ToolCallFormat::Gemma);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "```tool_code\nf(1, 2)\n```");
}

TEST(ToolCallParse, DeepSeekForms) {
  auto r = parse(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
      "\"Hangzhou\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{"
      "}"
      "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      ToolCallFormat::DeepSeek);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(calls_of(r.tool_calls),
            (std::vector<Call>{{"get_weather", "{\"city\":\"Hangzhou\"}"}, {"get_time", "{}"}}));
  // V3.1: name<｜tool▁sep｜>{...}.
  r = parse(
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Beijing\"}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      ToolCallFormat::DeepSeek);
  EXPECT_EQ(r.content, "Checking.");
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"get_weather", "{\"city\":\"Beijing\"}"}}));
  r = parse("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>no separator<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ToolCallFormat::DeepSeek);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<｜tool▁call▁begin｜>no separator<｜tool▁call▁end｜>");
}

TEST(ToolCallParse, NoneFormatIsVerbatimContent) {
  auto r = parse("  <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n", ToolCallFormat::None);
  EXPECT_EQ(r.content, "  <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolCallParse, IdsAreStableShortAndDistinct) {
  auto a = parse("<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
                 ToolCallFormat::Hermes);
  auto b = parse("<tool_call>{\"name\": \"h\", \"arguments\": {}}</tool_call>", ToolCallFormat::Hermes);
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].arguments, "{}");         // missing arguments
  EXPECT_EQ(a.tool_calls[0].id, b.tool_calls[0].id);  // same (prefix, index)
  EXPECT_NE(a.tool_calls[0].id, a.tool_calls[1].id);
  EXPECT_EQ(a.tool_calls[0].id, tool_call_id("req-1", 0));
  EXPECT_NE(tool_call_id("req-1", 0), tool_call_id("req-2", 0));
  std::string id = a.tool_calls[1].id;
  ASSERT_EQ(id.size(), 14u);
  EXPECT_EQ(id.substr(0, 5), "call_");
  for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
}

// ---- reasoning
// ---------------------------------------------------------------------------------------------
TEST(ReasoningParse, BlocksOpenClosedAndUnclosed) {
  auto r = parse("<think>\nThe user wants weather.\n</think>\n\nIt is sunny.", ToolCallFormat::None, kThink);
  EXPECT_EQ(r.reasoning, "The user wants weather.");
  EXPECT_EQ(r.content, "It is sunny.");
  // The prompt opened the block; the model may or may not write the open marker again.
  r = parse("Plan: call f.\n</think>\n\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            ToolCallFormat::Hermes, kThinkOpen);
  EXPECT_EQ(r.reasoning, "Plan: call f.");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.tool_calls.size(), 1u);
  r = parse("<think>x</think>y", ToolCallFormat::None, kThinkOpen);
  EXPECT_EQ(r.reasoning, "x");
  EXPECT_EQ(r.content, "y");
  // Out of tokens inside the block: all reasoning.
  r = parse("<think>still thinking <tool_call>{\"name\": \"f\"}</tool_call>", ToolCallFormat::Hermes, kThink);
  EXPECT_EQ(r.reasoning, "still thinking <tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.tool_calls.empty());
  // A stray close marker is dropped; no markers otherwise means no reasoning.
  r = parse("answer</think> done", ToolCallFormat::None, kThink);
  EXPECT_EQ(r.content, "answer done");
  r = parse("<think>a</think>", ToolCallFormat::None, kNoThink);
  EXPECT_EQ(r.content, "<think>a</think>");
  // Llama 3's whole-reply rule applies after the reasoning block.
  r = parse("<think>call it</think>\n{\"name\": \"f\", \"parameters\": {}}", ToolCallFormat::Llama3, kThink);
  EXPECT_EQ(r.reasoning, "call it");
  EXPECT_EQ(calls_of(r.tool_calls), (std::vector<Call>{{"f", "{}"}}));
}

// ---- streaming
// ---------------------------------------------------------------------------------------------
struct Example {
  std::string text;
  ToolCallFormat f;
  ReasoningMarkers m;
};
std::vector<Example> examples() {
  return {
      {"Hello there!\n\nHow can I help?  ", ToolCallFormat::None, kNoThink},
      {"<think>\nhmm\n</think>\n\nHi <b>there</b>", ToolCallFormat::None, kThink},
      {"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>\nDone < ok",
       ToolCallFormat::Hermes, kThink},
      {"I think </think> <tool_call>bad</tool_call> x <tool_call>{\"name\": \"f\"}", ToolCallFormat::Hermes,
       kThinkOpen},
      {"<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, \\\"}\\\"]}\"}</tool_call> tail",
       ToolCallFormat::Hermes, kNoThink},
      {"{\"name\": \"f\", \"parameters\": {\"q\": \"a;b\"}}; {\"name\": \"g\", \"parameters\": {}}",
       ToolCallFormat::Llama3, kNoThink},
      {"<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", ToolCallFormat::Llama3, kThink},
      {"{\"answer\": 42}", ToolCallFormat::Llama3, kNoThink},
      {"The JSON is {\"name\": \"f\", \"parameters\": {}}", ToolCallFormat::Llama3, kNoThink},
      {"<think>x</think>  {\"name\": \"f\", \"parameters\": {}}", ToolCallFormat::Llama3, kThink},
      {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": \"]\"}}]", ToolCallFormat::Mistral, kNoThink},
      {"Ok [TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[CALL_ID]abc123XYZ[ARGS]{}[TOOL_CALLS] nope",
       ToolCallFormat::Mistral, kNoThink},
      {"<start_function_call>call:f{a:<escape>x,}<escape>,b:[1,2]}<end_function_call> and "
       "<|tool_call>call:g{q:<|\"|>y<|\"|>}<tool_call|>",
       ToolCallFormat::Gemma, kNoThink},
      {"Text ```tool_code\nf(a='x', b=[1, 2.5e3])\ng(c={\"k\": None})\n``` more ```python\nx\n```",
       ToolCallFormat::Gemma, kNoThink},
      {"<think>r</"
       "think>A<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```"
       "<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       ToolCallFormat::DeepSeek, kThink},
  };
}

void expect_same(const ParsedReply& got, const ParsedReply& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  EXPECT_EQ(got.reasoning, want.reasoning) << what;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << what;
  for (size_t k = 0; k < want.tool_calls.size(); ++k) {
    EXPECT_EQ(got.tool_calls[k].id, want.tool_calls[k].id) << what;
    EXPECT_EQ(got.tool_calls[k].name, want.tool_calls[k].name) << what;
    EXPECT_EQ(got.tool_calls[k].arguments, want.tool_calls[k].arguments) << what;
  }
}

// Feeds text in the growing prefixes ending at cuts (sorted), then the whole with final=true.
ParsedReply stream(const std::string& text, ToolCallFormat f, const ReasoningMarkers& m,
                   const std::vector<size_t>& cuts, const std::string& id_prefix = "req-1") {
  ReplyStream s(f, m, id_prefix);
  ParsedReply out;
  auto take = [&](const ReplyDelta& d) {
    EXPECT_EQ(d.first_tool_index, out.tool_calls.size());
    out.content += d.content;
    out.reasoning += d.reasoning;
    out.tool_calls.insert(out.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    EXPECT_EQ(s.tool_calls(), out.tool_calls.size());
  };
  for (size_t c : cuts) take(s.update(std::string_view(text).substr(0, c), false));
  take(s.update(text, true));
  ReplyDelta after = s.update(text, true);
  EXPECT_TRUE(after.content.empty() && after.reasoning.empty() && after.tool_calls.empty());
  return out;
}

std::vector<size_t> random_cuts(std::mt19937& rng, size_t n) {
  std::vector<size_t> cuts;
  size_t count = rng() % 12;
  for (size_t k = 0; k < count; ++k) cuts.push_back(n ? rng() % (n + 1) : 0);
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

TEST(ReplyStream, EverySplitAgreesWithTheWholeParse) {
  std::mt19937 rng(7);
  for (const auto& ex : examples()) {
    ParsedReply whole = parse_reply(ex.text, ex.f, ex.m, "req-1");
    std::vector<size_t> every;  // one byte at a time
    for (size_t k = 0; k <= ex.text.size(); ++k) every.push_back(k);
    expect_same(stream(ex.text, ex.f, ex.m, every), whole, "bytewise: " + ex.text);
    for (int trial = 0; trial < 300; ++trial) {
      auto cuts = random_cuts(rng, ex.text.size());
      expect_same(stream(ex.text, ex.f, ex.m, cuts), whole, "random: " + ex.text);
    }
  }
}

TEST(ReplyStream, SendsEarlyWhatIsSafe) {
  ReplyStream s(ToolCallFormat::Hermes, kThink, "req-1");
  auto d = s.update("<think>Need the", false);
  EXPECT_EQ(d.reasoning, "Need the");
  d = s.update("<think>Need the weather</thi", false);  // the close marker is held back
  EXPECT_EQ(d.reasoning, " weather");
  d = s.update("<think>Need the weather</think>\n\nChecking <tool", false);  // so is "<tool"
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Checking");  // the trailing space waits for more text
  std::string first =
      "<think>Need the weather</think>\n\nChecking <tool_call>{\"name\": \"a\", \"arguments\": {}}"
      "</tool_call>\n<tool_call>{\"name\": \"b\",";
  d = s.update(first, false);
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 1u);  // the first call is complete, the second is not
  EXPECT_EQ(d.tool_calls[0].name, "a");
  EXPECT_EQ(d.first_tool_index, 0u);
  d = s.update(first + " \"arguments\": {\"k\": 1}}</tool_call>", true);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "b");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"k\":1}");
  EXPECT_EQ(d.first_tool_index, 1u);
  EXPECT_EQ(s.tool_calls(), 2u);

  // Llama 3: a reply that starts like JSON is held to the end; one that does not streams at once.
  ReplyStream l(ToolCallFormat::Llama3, kNoThink, "x");
  EXPECT_EQ(l.update("{\"name\": \"f\", ", false).content, "");
  ReplyStream p(ToolCallFormat::Llama3, kNoThink, "x");
  EXPECT_EQ(p.update("The answer is", false).content, "The answer is");
}

TEST(ReplyStream, NeverThrowsOnRandomOrTruncatedText) {
  std::mt19937 rng(11);
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           "\\",
                                           ":",
                                           ",",
                                           "name",
                                           "\"name\"",
                                           "\"arguments\"",
                                           "\"parameters\"",
                                           "<think>",
                                           "</think>",
                                           "[TOOL_CALLS]",
                                           "[ARGS]",
                                           "[CALL_ID]",
                                           "<|python_tag|>",
                                           "<start_function_call>",
                                           "<end_function_call>",
                                           "call:",
                                           "<escape>",
                                           "<|tool_call>",
                                           "<tool_call|>",
                                           "```tool_code",
                                           "```",
                                           "(",
                                           ")",
                                           "=",
                                           "'",
                                           "<｜tool▁calls▁begin｜>",
                                           "<｜tool▁call▁begin｜>",
                                           "<｜tool▁sep｜>",
                                           "<｜tool▁call▁end｜>",
                                           "function",
                                           "\n",
                                           " ",
                                           "x",
                                           "1",
                                           "\xff",
                                           "\xe2\x96"};
  const ToolCallFormat formats[] = {ToolCallFormat::None,   ToolCallFormat::Hermes,
                                    ToolCallFormat::Llama3, ToolCallFormat::Mistral,
                                    ToolCallFormat::Gemma,  ToolCallFormat::DeepSeek};
  const ReasoningMarkers markers[] = {kNoThink, kThink, kThinkOpen};
  std::vector<std::string> texts;
  for (const auto& ex : examples())
    for (size_t cut = 0; cut <= ex.text.size(); cut += 3) texts.push_back(ex.text.substr(0, cut));
  for (int k = 0; k < 300; ++k) {
    std::string t;
    size_t n = rng() % 40;
    for (size_t j = 0; j < n; ++j) {
      if (rng() % 3 == 0)
        t += char(rng() % 256);
      else
        t += pieces[rng() % pieces.size()];
    }
    texts.push_back(t);
  }
  texts.push_back(std::string(5000, '{'));  // deep nesting
  texts.push_back("<tool_call>" + std::string(3000, '[') + std::string(3000, ']') + "</tool_call>");
  texts.push_back("```tool_code\nf(a=" + std::string(2000, '[') + ")\n```");
  texts.push_back("<start_function_call>call:f{a:" + std::string(2000, '{') + "<end_function_call>");
  for (const auto& t : texts) {
    for (auto f : formats) {
      const auto& m = markers[rng() % 3];
      ParsedReply whole;
      ASSERT_NO_THROW(whole = parse_reply(t, f, m, "fuzz"));
      auto cuts = random_cuts(rng, t.size());
      ParsedReply streamed;
      ASSERT_NO_THROW(streamed = stream(t, f, m, cuts, "fuzz"));
      expect_same(streamed, whole, std::string("fuzz format ") + tool_call_format_name(f));
    }
  }
}

TEST(ReplyStream, LinearOnLongReplies) {
  // 200k of content with many near-markers, fed in 64-byte steps: must finish quickly.
  std::string text;
  while (text.size() < 200000) text += "a <tool b [TOOL c <｜tool x\n";
  ReplyStream s(ToolCallFormat::Hermes, kThink, "req");
  size_t got = 0;
  for (size_t n = 64; n < text.size(); n += 64)
    got += s.update(std::string_view(text).substr(0, n), false).content.size();
  got += s.update(text, true).content.size();
  EXPECT_EQ(got, text.size() - 1);  // all content, less the trailing newline
}

}  // namespace
}  // namespace tessera
