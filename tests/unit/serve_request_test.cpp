// serve_request: which of OpenAI's fields each route takes, and with which values.
#include "apps/tessera/serve_request.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/tessera/cli_session.h"

namespace tessera::cli {
namespace {

using json = nlohmann::json;

Session& tiny_session() {
  static Session* s = [] {
    SessionArgs a;
    a.model = (std::filesystem::path(TESSERA_SOURCE_DIR) / "models" / "tessera-tiny").string();
    a.no_progress = true;
    return new Session(a);
  }();
  return *s;
}

ParsedRequest parse(const json& body, bool chat) {
  return parse_request(body.dump(), chat, tiny_session(), "tessera-tiny");
}

// The refusal of a body: its HTTP status and message (status 0: it was accepted).
BadRequest refusal(const json& body, bool chat) {
  try {
    (void)parse(body, chat);
  } catch (const BadRequest& b) {
    return b;
  }
  return {0, "", ""};
}

// The tokens `body` generates (8 at temperature 0.7 with a fixed seed: a field that changed the
// sampling would change them).
std::vector<int32_t> tokens_of(json body, bool chat) {
  body["max_tokens"] = 8;
  body["temperature"] = 0.7;
  body["seed"] = 5;
  const ParsedRequest r = parse(body, chat);
  return tiny_session().run(r.prompts.front(), r.options, {}).result.tokens;
}

const json kChat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}}};
const json kCompletion = {{"prompt", "Once upon a time"}};

// OpenAI's fields that clients send with their no-op values (no tools, text output, nothing stored,
// no logit bias, best_of = n) are taken and change nothing: the same tokens as without them.
TEST(ServeRequest, NoOpValuesOfOpenAiFieldsAreTakenAndChangeNothing) {
  json chat = kChat;
  chat["logit_bias"] = json::object();
  chat["response_format"] = {{"type", "text"}};
  chat["tools"] = json::array();
  chat["tool_choice"] = "none";
  chat["parallel_tool_calls"] = false;
  chat["store"] = false;
  chat["metadata"] = {{"team", "a"}};
  chat["service_tier"] = "auto";
  chat["modalities"] = {"text"};
  chat["user"] = "u1";
  chat["messages"][0]["name"] = "alice";
  EXPECT_EQ(tokens_of(chat, true), tokens_of(kChat, true));

  json completion = kCompletion;
  completion["best_of"] = 1;
  completion["logit_bias"] = nullptr;
  completion["echo"] = false;
  EXPECT_EQ(tokens_of(completion, false), tokens_of(kCompletion, false));
  completion["n"] = 3;
  completion["best_of"] = 3;
  EXPECT_EQ(parse(completion, false).n, 3);
}

// Any value that would change the answer is a 400 naming the field, never a silently different answer;
// so is a field of the other route (a chat request's "prompt" would otherwise be ignored).
TEST(ServeRequest, ValuesThatWouldChangeTheAnswerAreRefused) {
  const struct {
    bool chat;
    json extra;
    std::string message;
  } cases[] = {
      {true, {{"logit_bias", {{"50", 10}}}}, "'logit_bias' is not supported"},
      {false, {{"logit_bias", {{"50", -100}}}}, "'logit_bias' is not supported"},
      {true, {{"logit_bias", 3}}, "'logit_bias' must be an object"},
      {true,
       {{"response_format", {{"type", "xml"}}}},
       "of type 'xml' is not supported (text, json_object or json_schema)"},
      {true, {{"response_format", "text"}}, "must be an object with a string 'type'"},
      {true, {{"tools", {{{"type", "function"}}}}}, "'tools[0].function' must be an object"},
      {true, {{"tool_choice", "required"}}, "'tool_choice' asks for a tool call but 'tools' is empty"},
      {true, {{"tool_choice", "maybe"}}, "'tool_choice' must be \"none\", \"auto\", \"required\""},
      {true,
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}},
       "this model has no chat template, so it cannot be offered tools"},
      {true, {{"chat_template_kwargs", {{"enable_thinking", true}}}}, "has no thinking switch"},
      {true, {{"parallel_tool_calls", "yes"}}, "'parallel_tool_calls' must be true or false"},
      {true, {{"store", true}}, "'store': true is not supported"},
      {true, {{"metadata", "x"}}, "'metadata' must be an object"},
      {true, {{"service_tier", "fastest"}}, "'service_tier' must be auto, default"},
      {true, {{"modalities", {"text", "audio"}}}, "other than \"text\" are not supported"},
      {true, {{"user", 7}}, "'user' must be a string"},
      {false, {{"best_of", 2}}, "'best_of' is supported only equal to 'n' (1)"},
      {false, {{"n", 2}, {"best_of", 4}}, "equal to 'n' (2)"},
      // The other route's fields.
      {true, {{"prompt", "x"}}, "'prompt' is a completions field; this route takes none"},
      {true, {{"suffix", "x"}}, "'suffix' is a completions field"},
      {true, {{"echo", false}}, "'echo' is a completions field"},
      {false, {{"top_logprobs", 2}}, "'top_logprobs' is a chat completions field"},
      {false, {{"messages", json::array()}}, "'messages' is a chat completions field"},
      {false, {{"tools", json::array()}}, "'tools' is a chat completions field"},
      {true, {{"functions", json::array()}}, "unknown field 'functions'"},
  };
  for (const auto& c : cases) {
    json body = c.chat ? kChat : kCompletion;
    body.update(c.extra);
    const BadRequest b = refusal(body, c.chat);
    EXPECT_EQ(b.status, 400) << body.dump();
    EXPECT_NE(b.message.find(c.message), std::string::npos) << body.dump() << " -> " << b.message;
  }
  // A message's keys: role, content and name (and an assistant's tool calls, a tool's call id); a tool call
  // that the model's template does not read would be dropped, so it is refused.
  json tool = kChat;
  tool["messages"].push_back(
      {{"role", "assistant"},
       {"content", "ok"},
       {"tool_calls",
        {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}});
  EXPECT_NE(refusal(tool, true).message.find("takes no tool calls ('messages[1].tool_calls'"),
            std::string::npos)
      << refusal(tool, true).message;
  tool["messages"][1]["refund"] = 1;
  EXPECT_NE(refusal(tool, true).message.find("unknown field 'messages[1].refund'"), std::string::npos);
  json named = kChat;
  named["messages"][0]["name"] = 3;
  EXPECT_NE(refusal(named, true).message.find("'messages[0].name' must be a string"), std::string::npos);
}

// Refusing what the client sent never echoes it whole: a 1 MB number, a 100 KB field name, a huge
// value quoted by the engine's message and an invalid body each get an error of a bounded size that
// names no library internals (#31: a 1 MB number gave a 1 MB error naming json.exception.out_of_range).
TEST(ServeRequest, ErrorsDoNotEchoTheirInputWhole) {
  auto body_of = [](const std::string& text, bool chat) {
    try {
      (void)parse_request(text, chat, tiny_session(), "tessera-tiny");
    } catch (const BadRequest& b) {
      return std::make_pair(b.status, error_body(b));
    }
    return std::make_pair(0, std::string());
  };
  const std::string big_number = "{\"prompt\": \"x\", \"max_tokens\": 1" + std::string(1 << 20, '0') + "}";
  const std::string big_key = "{\"" + std::string(100000, 'k') + "\": 1}";
  const std::string big_alg = json{{"prompt", "x"}, {"alg", std::string(200000, 'a')}}.dump();
  for (const auto& [text, what] :
       {std::pair{big_number, "not valid JSON"}, std::pair{big_key, "unknown field"},
        std::pair{big_alg, "alg"}, std::pair{std::string("{\"prompt\": [1, 2"), "at byte"}}) {
    const auto [status, err] = body_of(text, false);
    EXPECT_EQ(status, 400) << what;
    EXPECT_LT(err.size(), kMaxErrorMessage + 200) << what;
    const std::string msg = json::parse(err)["error"]["message"];
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
  }
  // A message cut inside a multi-byte character keeps whole characters (valid UTF-8, nothing replaced).
  const std::string cut =
      error_body({400, "invalid_request_error", std::string(kMaxErrorMessage - 1, 'a') + "\xc3\xa9tail"});
  EXPECT_NE(cut.find(std::string(kMaxErrorMessage - 1, 'a') + "... ("), std::string::npos) << cut;
}
}  // namespace
}  // namespace tessera::cli
