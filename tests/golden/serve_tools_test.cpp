// Chat as the model defines it, through tessera serve (issue #32): a copy of the bundled model that ships
// Qwen3's published chat template (tools, tool results, a thinking switch). The prompt the server makes
// (POST /apply-template) is byte-identical to Python's jinja2 rendering of the same conversation (the
// oracle, tests/reference/chat_oracle.py); tools, tool_choice, tool calls with their arguments, tool
// results and chat_template_kwargs reach the template; answers keep OpenAI's shape, streamed and not; and
// what cannot be honoured is a 400 naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;
using test::ServerProcess;

// The bundled model with Qwen3's chat template in its tokenizer_config.json.
fs::path qwen3_templated_model() {
  const fs::path src = test::source_dir() / "models" / "tessera-tiny";
  const fs::path dir = test::temp_dir("serve_tools_model");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
    fs::create_symlink(src / f, dir / f);
  ojson tc = ojson::parse(test::read_text(src / "tokenizer_config.json"));
  tc["chat_template"] =
      test::read_text(test::source_dir() / "tests/data/chat_templates/Qwen-Qwen3-0.6B.jinja");
  std::ofstream(dir / "tokenizer_config.json") << tc.dump(2);
  return dir;
}

// jinja2's rendering of `context` with `template_text` (transformers' environment).
std::string oracle(const std::string& template_text, const ojson& context) {
  const fs::path dir = test::temp_dir("serve_tools_oracle");
  std::ofstream(dir / "in.json") << ojson{{"template", template_text}, {"context", context}}.dump();
  std::string log;
  const int rc = test::run_command(
      test::python() + " -B " + (test::source_dir() / "tests/reference/chat_oracle.py").string() +
          " render < " + (dir / "in.json").string() + " > " + (dir / "out.json").string(),
      &log);
  EXPECT_EQ(rc, 0) << log;
  const ojson out = ojson::parse(test::read_text(dir / "out.json"));
  EXPECT_TRUE(out.contains("expected")) << out.dump();
  return out.value("expected", "");
}

const ojson kWeather = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"parameters",
       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};

class ServeTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new fs::path(qwen3_templated_model());
    server_ = new ServerProcess("-m " + model_->string(), test::temp_dir("serve_tools"));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete model_;
  }
  static json post(const std::string& path, const ojson& body, int status) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, status) << r->body;
    return r->get_header_value("Content-Type").find("json") != std::string::npos ? json::parse(r->body)
                                                                                 : json(r->body);
  }
  static fs::path* model_;
  static ServerProcess* server_;
};
fs::path* ServeTools::model_ = nullptr;
ServerProcess* ServeTools::server_ = nullptr;

// The conversation of a tool-calling agent: the user asks, the assistant calls (arguments as OpenAI sends
// them: JSON text), the tool answers, the user follows up.
ojson agent_request() {
  return {{"messages",
           {{{"role", "developer"}, {"content", "Be brief."}},
            {{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"},
             {"content", nullptr},
             {"tool_calls",
              {{{"id", "call_1"},
                {"type", "function"},
                {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
            {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 C"}},
            {{"role", "user"}, {"content", "Rome?"}}}},
          {"tools", {kWeather}},
          {"max_tokens", 8}};
}

TEST_F(ServeTools, ThePromptIsTheTemplatesAsJinja2RendersIt) {
  if (!test::python_has("jinja2")) GTEST_SKIP() << "Python's jinja2 is missing (Debian: python3-jinja2)";
  ASSERT_GT(server_->port(), 0);
  const std::string tmpl =
      test::read_text(test::source_dir() / "tests/data/chat_templates/Qwen-Qwen3-0.6B.jinja");
  // What transformers gets from the same conversation: the developer turn as system, null content as "",
  // the arguments as an object, the model's special tokens.
  ojson messages = agent_request()["messages"];
  messages[0]["role"] = "system";
  messages[2]["content"] = "";
  messages[2]["tool_calls"][0]["function"]["arguments"] = {{"city", "Paris"}};
  const ojson base = {{"messages", messages},
                      {"tools", {kWeather}},
                      {"add_generation_prompt", true},
                      {"bos_token", "<|startoftext|>"},
                      {"eos_token", "<|endoftext|>"}};
  const json with_tools = post("/apply-template", agent_request(), 200);
  EXPECT_EQ(with_tools["prompt"].get<std::string>(), oracle(tmpl, base));
  EXPECT_NE(with_tools["prompt"].get<std::string>().find("<tools>"), std::string::npos);

  // Thinking off through chat_template_kwargs: Qwen3's template writes an empty thinking block.
  ojson req = agent_request();
  req["chat_template_kwargs"] = {{"enable_thinking", false}};
  ojson ctx = base;
  ctx["enable_thinking"] = false;
  const std::string off = post("/apply-template", req, 200)["prompt"];
  EXPECT_EQ(off, oracle(tmpl, ctx));
  EXPECT_NE(off.rfind("<think>\n\n</think>\n\n"), std::string::npos);

  // tool_choice "none": the tools are not offered.
  req = agent_request();
  req["tool_choice"] = "none";
  ctx = base;
  ctx.erase("tools");
  EXPECT_EQ(post("/apply-template", req, 200)["prompt"].get<std::string>(), oracle(tmpl, ctx));

  // A named tool_choice: the prompt ends with the start of that call, in the template's format.
  req = agent_request();
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  req["max_tokens"] = 32;  // room for the shortest call
  const std::string forced = post("/apply-template", req, 200)["prompt"];
  EXPECT_EQ(forced, oracle(tmpl, base) + "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
}

TEST_F(ServeTools, AnswersKeepOpenAisShapeStreamedAndNot) {
  ASSERT_GT(server_->port(), 0);
  const json a = post("/v1/chat/completions", agent_request(), 200);
  ASSERT_EQ(a["choices"].size(), 1u) << a.dump();
  const json& m = a["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  // The tiny model writes no tool call: its text is the content (trimmed), and the reason is not tool_calls.
  if (!m.contains("tool_calls")) {
    EXPECT_TRUE(m["content"].is_string()) << a.dump();
    EXPECT_NE(a["choices"][0]["finish_reason"], "tool_calls");
  } else {
    EXPECT_EQ(a["choices"][0]["finish_reason"], "tool_calls");
  }
  // Streamed: the deltas' content is the whole answer's content (same seed, same tokens).
  ojson s = agent_request();
  s["stream"] = true;
  const std::string body = post("/v1/chat/completions", s, 200).get<std::string>();
  std::string content, reason;
  for (const std::string& ev : test::events(body)) {
    if (ev == "[DONE]") break;
    const json j = json::parse(ev);
    const json& d = j["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) reason = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, m.value("content", json("")).is_string() ? m["content"].get<std::string>() : "");
  EXPECT_EQ(reason, a["choices"][0]["finish_reason"]);
}

// A forced call (a named function, or "required") is held to the tools' schemas: even the tiny model, which
// never learnt to call tools, answers with a call that parses, names a tool and fits its parameters;
// streamed as a tool-call delta. A budget too small for the shortest call is a 400 before any work.
TEST_F(ServeTools, ForcedToolCallsAlwaysParse) {
  ASSERT_GT(server_->port(), 0);
  ojson req = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
               {"tools", {kWeather}},
               {"max_tokens", 48},
               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  const auto check_call = [](const json& call) {
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], "get_weather");
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args.is_object() && args.contains("city") && args["city"].is_string()) << args.dump();
    EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  };
  for (const char* seed : {"1", "2"}) {
    req["seed"] = std::stoi(seed);
    const json a = post("/v1/chat/completions", req, 200);
    EXPECT_EQ(a["choices"][0]["finish_reason"], "tool_calls") << a.dump();
    ASSERT_EQ(a["choices"][0]["message"]["tool_calls"].size(), 1u) << a.dump();
    check_call(a["choices"][0]["message"]["tool_calls"][0]);
    EXPECT_TRUE(a["choices"][0]["message"]["content"].is_null());
  }
  req["tool_choice"] = "required";
  req["max_tokens"] = 64;
  req["stream"] = true;
  const std::string body = post("/v1/chat/completions", req, 200).get<std::string>();
  json calls = json::array();
  std::string reason;
  for (const std::string& ev : test::events(body)) {
    if (ev == "[DONE]") break;
    const json j = json::parse(ev);
    ASSERT_TRUE(j.contains("choices")) << ev;
    const json c = j["choices"][0];
    if (c["delta"].contains("tool_calls"))
      for (const json& t : c["delta"]["tool_calls"]) calls.push_back(t);
    if (!c["finish_reason"].is_null()) reason = c["finish_reason"];
  }
  ASSERT_EQ(calls.size(), 1u) << body;
  EXPECT_EQ(calls[0]["index"], 0);
  check_call(calls[0]);
  EXPECT_EQ(reason, "tool_calls");
  req["stream"] = false;
  req["max_tokens"] = 16;
  const json e = post("/v1/chat/completions", req, 400);
  EXPECT_NE(e.dump().find("cannot hold the shortest answer of the required tool call"), std::string::npos)
      << e.dump();
}

// Structured output through the API: response_format json_schema and json_object give content that parses
// (and fits the schema), streamed too; a schema keyword that cannot be enforced is a 400 naming it.
TEST_F(ServeTools, ResponseFormatAnswersParse) {
  ASSERT_GT(server_->port(), 0);
  const ojson schema = {
      {"type", "object"},
      {"properties", {{"city", {{"type", "string"}, {"maxLength", 10}}}, {"temp", {{"type", "integer"}}}}},
      {"required", {"city", "temp"}},
      {"additionalProperties", false}};
  ojson req = {
      {"messages", {{{"role", "user"}, {"content", "Weather as JSON"}}}},
      {"max_tokens", 40},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", schema}}}}}};
  const json a = post("/v1/chat/completions", req, 200);
  const json doc = json::parse(a["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_TRUE(doc["city"].is_string() && doc["temp"].is_number_integer()) << doc.dump();
  EXPECT_EQ(doc.size(), 2u);
  req["stream"] = true;
  const std::string body = post("/v1/chat/completions", req, 200).get<std::string>();
  std::string content;
  for (const std::string& ev : test::events(body)) {
    if (ev == "[DONE]") break;
    const json d = json::parse(ev)["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(json::parse(content), doc);  // the same seed: the same answer
  req = {{"messages", {{{"role", "user"}, {"content", "Anything"}}}},
         {"max_tokens", 24},
         {"response_format", {{"type", "json_object"}}}};
  EXPECT_TRUE(
      json::parse(
          post("/v1/chat/completions", req, 200)["choices"][0]["message"]["content"].get<std::string>())
          .is_object());
  req["response_format"] = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "^a"}}}}}};
  const json e = post("/v1/chat/completions", req, 400);
  EXPECT_NE(e.dump().find("'pattern'"), std::string::npos) << e.dump();
}

TEST_F(ServeTools, WhatCannotBeHonouredIsA400NamingTheField) {
  ASSERT_GT(server_->port(), 0);
  const auto refused = [&](ojson req, const std::string& want) {
    const json e = post("/v1/chat/completions", req, 400);
    EXPECT_NE(e.dump().find(want), std::string::npos) << e.dump();
  };
  ojson r = agent_request();
  r["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  refused(r, "get_time");
  r = agent_request();
  r["tools"][0]["function"].erase("name");
  refused(r, "tools[0].function.name");
  r = agent_request();
  r["messages"][3].erase("tool_call_id");
  refused(r, "messages[3].tool_call_id");
  r = agent_request();
  r["messages"][2]["tool_calls"][0]["function"]["arguments"] = 5;
  refused(r, "messages[2].tool_calls[0].function.arguments");
  r = agent_request();
  r["chat_template_kwargs"] = {{"enable_thinking", "no"}};
  refused(r, "enable_thinking");
  r = agent_request();
  r["tool_choice"] = "sometimes";
  refused(r, "tool_choice");
  r = agent_request();
  r["response_format"] = {{"type", "json_object"}};
  refused(r, "'response_format' and 'tools' cannot be combined");
}

// The bundled model has no chat template (it ships none, and its vocabulary lacks the built-in LLaDA
// template's tokens): tools and a thinking switch are refused rather than dropped.
TEST(ServeToolsBuiltin, ToolsAndThinkingNeedATemplateThatTakesThem) {
  ServerProcess server("-m " + (test::source_dir() / "models" / "tessera-tiny").string(),
                       test::temp_dir("serve_tools_builtin"));
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  ojson r = agent_request();
  auto res = c.Post("/v1/chat/completions", r.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("takes no tool calls ('messages[2].tool_calls'"), std::string::npos) << res->body;
  r = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"tools", {kWeather}}};
  res = c.Post("/v1/chat/completions", r.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("no chat template, so it cannot be offered tools"), std::string::npos)
      << res->body;
  r = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
       {"chat_template_kwargs", {{"enable_thinking", true}}}};
  res = c.Post("/v1/chat/completions", r.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("no thinking switch"), std::string::npos) << res->body;
  // Without tools the same conversation shape still works (no tool messages).
  r = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}};
  res = c.Post("/v1/chat/completions", r.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

}  // namespace
}  // namespace tessera
