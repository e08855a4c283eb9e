// The chat side of a request: OpenAI's messages (with tool calls and tool results), tools, tool_choice,
// parallel_tool_calls and chat_template_kwargs turned into the Conversation the model's chat template
// reads, and into how the reply is read back (serve_request.h: ReplyFormat).
#include <algorithm>
#include <set>

#include "apps/tessera/serve_request.h"
#include "core/error.h"
#include "core/utf8.h"

namespace tessera::cli {
namespace {
using ojson = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& msg) {
  throw BadRequest{400, "invalid_request_error", msg};
}

bool given(const ojson& o, const char* key) {
  return o.is_object() && o.contains(key) && !o[key].is_null();
}

std::string text_field(const ojson& o, const char* key, const std::string& where) {
  const ojson& v = o.at(key);
  if (!v.is_string()) bad("'" + where + key + "' must be a string");
  return v.get<std::string>();
}

void only(const ojson& o, std::initializer_list<const char*> known, const std::string& where) {
  for (auto it = o.begin(); it != o.end(); ++it)
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return it.key() == k; }) == known.end())
      bad("unknown field '" + where + it.key() + "'");
}

// A message's content: a string, or OpenAI's array of content parts, of which only text parts
// ({"type": "text", "text": "..."}) can be honoured; their texts are joined with newlines.
std::string content_text(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad("every message needs a string 'role' and a 'content' (a string or an array of text parts); '" +
        where + "content' is neither");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& p = content[i];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad("every content part needs a string 'type'");
    const auto type = p["type"].get<std::string>();
    if (type != "text") bad("content parts of type '" + type + "' are not supported (only text)");
    if (!p.contains("text") || !p["text"].is_string()) bad("a text content part needs a string 'text'");
    if (i > 0) text += '\n';
    text += p["text"].get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls: OpenAI's [{"id", "type": "function", "function": {"name",
// "arguments": JSON text}}]. Templates read the arguments as an object (transformers' convention, which
// vLLM follows): text that parses as a JSON object is given as one, other text as it is.
ojson tool_calls(const ojson& calls, const std::string& where) {
  if (!calls.is_array()) bad("'" + where + "tool_calls' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = where + "tool_calls[" + std::to_string(i) + "].";
    const ojson& c = calls[i];
    if (!c.is_object()) bad("'" + at.substr(0, at.size() - 1) + "' must be an object");
    only(c, {"id", "type", "function"}, at);
    if (given(c, "type") && c["type"] != "function") bad("'" + at + "type' must be \"function\"");
    if (!given(c, "function") || !c["function"].is_object()) bad("'" + at + "function' must be an object");
    const ojson& f = c["function"];
    only(f, {"name", "arguments"}, at + "function.");
    if (!given(f, "name")) bad("'" + at + "function.name' is required");
    ojson call = {{"id", given(c, "id") ? text_field(c, "id", at) : std::string()},
                  {"type", "function"},
                  {"function", {{"name", text_field(f, "name", at + "function.")}}}};
    ojson args = ojson::object();
    if (given(f, "arguments")) {
      const ojson& a = f["arguments"];
      if (a.is_object()) {
        args = a;
      } else if (a.is_string()) {
        const ojson parsed = ojson::parse(a.get<std::string>(), nullptr, false);
        args = parsed.is_object() ? parsed : a;
      } else {
        bad("'" + at + "function.arguments' must be a JSON text (a string)");
      }
    }
    call["function"]["arguments"] = std::move(args);
    out.push_back(std::move(call));
  }
  return out;
}

// OpenAI's tools: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}],
// passed to the template as they were given (key order kept). Their names, for tool_choice.
ojson tools_of(const ojson& tools, std::set<std::string>& names) {
  if (!tools.is_array()) bad("'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "].";
    const ojson& t = tools[i];
    if (!t.is_object()) bad("'tools[" + std::to_string(i) + "]' must be an object");
    only(t, {"type", "function"}, at);
    if (!given(t, "type") || t["type"] != "function") bad("'" + at + "type' must be \"function\"");
    if (!given(t, "function") || !t["function"].is_object()) bad("'" + at + "function' must be an object");
    const ojson& f = t["function"];
    only(f, {"name", "description", "parameters", "strict"}, at + "function.");
    if (!given(f, "name")) bad("'" + at + "function.name' is required");
    const std::string name = text_field(f, "name", at + "function.");
    if (name.empty() || name.size() > 64) bad("'" + at + "function.name' must be 1 to 64 characters");
    if (!names.insert(name).second) bad("two tools are named '" + name + "'");
    if (given(f, "description")) (void)text_field(f, "description", at + "function.");
    if (given(f, "parameters") && !f["parameters"].is_object())
      bad("'" + at + "function.parameters' must be a JSON Schema object");
  }
  return tools;
}

// The start of a reply that must call a tool (tool_choice "required", or the function `name`), in the
// template's format: it ends the prompt, so the model writes the rest of the call. Where the format names
// the function before its arguments, a named choice writes the name too.
std::string tool_call_prefix(ToolCallFormat f, const std::string& name, const std::string& source) {
  const std::string quoted = ojson(name).dump();
  switch (f) {
    case ToolCallFormat::Hermes:
      return "<tool_call>\n" + (name.empty() ? "" : "{\"name\": " + quoted + ", \"arguments\": ");
    case ToolCallFormat::Llama3:  // the whole reply is the call: required starts it with nothing
      return name.empty() ? "" : "{\"name\": " + quoted + ", \"parameters\": ";
    case ToolCallFormat::Mistral:  // the two generations write the name differently: the marker only
      return "[TOOL_CALLS]";
    case ToolCallFormat::Gemma:
      return (source.find("<|tool_call>") != std::string::npos ? "<|tool_call>call:"
                                                               : "<start_function_call>call:") +
             name;
    case ToolCallFormat::DeepSeek:
      return "<\uFF5Ctool\u2581calls\u2581begin\uFF5C><\uFF5Ctool\u2581call\u2581begin\uFF5C>";
    case ToolCallFormat::None:
      break;
  }
  return "";
}

// OpenAI's response_format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}: the grammar the answer is written under.
std::shared_ptr<const JsonGrammar> response_format(const ojson& v) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    bad("'response_format' must be an object with a string 'type'");
  const auto type = v["type"].get<std::string>();
  if (type == "text") {
    only(v, {"type"}, "response_format.");
    return nullptr;
  }
  if (type == "json_object") {
    only(v, {"type"}, "response_format.");
    return JsonGrammar::any_object();
  }
  if (type != "json_schema")
    bad("'response_format' of type '" + type + "' is not supported (text, json_object or json_schema)");
  only(v, {"type", "json_schema"}, "response_format.");
  if (!given(v, "json_schema") || !v["json_schema"].is_object())
    bad("'response_format.json_schema' must be an object with a 'schema'");
  const ojson& js = v["json_schema"];
  only(js, {"name", "schema", "strict", "description"}, "response_format.json_schema.");
  if (!given(js, "schema") || !js["schema"].is_object())
    bad("'response_format.json_schema.schema' must be a JSON Schema object");
  try {
    return JsonGrammar::from_schema(js["schema"]);
  } catch (const Error& e) {
    bad(std::string("'response_format.json_schema.schema': ") + e.what());
  }
}

// A forced call (tool_choice "required" or a named function) in a format whose call is JSON (Hermes,
// Llama 3): the answer after the start is held to the tools' schemas, so the call always parses and its
// arguments fit the function's parameters. Named: the arguments object, then the call's end; required:
// one of {"name": a tool, "arguments": its parameters}. Returns the grammar and sets `suffix`.
std::shared_ptr<const JsonGrammar> forced_call_grammar(ToolCallFormat f, const ojson& tools,
                                                       const std::string& name, std::string& suffix) {
  const char* args = f == ToolCallFormat::Hermes ? "arguments" : "parameters";
  const auto params = [](const ojson& fn) {
    return fn.contains("parameters") ? fn["parameters"] : ojson{{"type", "object"}};
  };
  ojson schema;
  std::string where;
  if (!name.empty()) {
    for (size_t i = 0; i < tools.size(); ++i)
      if (tools[i]["function"]["name"] == name) {
        schema = params(tools[i]["function"]);
        where = "tools[" + std::to_string(i) + "].function.parameters";
      }
    suffix = f == ToolCallFormat::Hermes ? "}\n</tool_call>" : "}";
  } else {
    schema = {{"anyOf", ojson::array()}};
    for (const ojson& t : tools)
      schema["anyOf"].push_back(
          {{"type", "object"},
           {"properties", {{"name", {{"const", t["function"]["name"]}}}, {args, params(t["function"])}}},
           {"required", {"name", args}},
           {"additionalProperties", false}});
    where = "tools[*].function.parameters";
    suffix = f == ToolCallFormat::Hermes ? "\n</tool_call>" : "";
  }
  try {
    return JsonGrammar::from_schema(schema);
  } catch (const Error& e) {
    bad("'" + where + "' (a forced tool call's arguments are held to it): " + e.what());
  }
}

// A budget too small for the answer's format is refused before any work, not in the middle of a stream.
void check_budget(const ChatPrompt& out, const GenerateOptions& o) {
  if (!out.constraint) return;
  const int64_t need = out.constraint->start()->min_tokens();
  if (need > o.gen_length)
    bad("'max_tokens' " + std::to_string(o.gen_length) + " cannot hold the shortest answer of the required " +
        (out.reply.tools == ToolCallFormat::None ? "format" : "tool call") + " (" + std::to_string(need) +
        " tokens)");
}

}  // namespace

ChatPrompt chat_prompt(const ojson& body, const Session& session, const GenerateOptions& o) {
  ChatPrompt out;
  Conversation conv;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    bad("'messages' must be a non-empty array of {\"role\", \"content\"}");
  const ojson& all = body["messages"];
  std::vector<ChatMessage> plain;  // for a model without a chat template
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "].";
    const ojson& m = all[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("every message needs a string 'role' and a 'content' (a string or an array of text parts)");
    const auto role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      bad("message role must be system, developer, user, assistant or tool, got '" + role + "'");
    if (role == "assistant")
      only(m, {"role", "content", "name", "tool_calls", "reasoning_content", "refusal"}, at);
    else if (role == "tool")
      only(m, {"role", "content", "tool_call_id", "name"}, at);
    else
      only(m, {"role", "content", "name"}, at);
    ojson msg = {{"role", role == "developer" ? "system" : role}};
    const bool calls = role == "assistant" && given(m, "tool_calls");
    if (given(m, "content")) {
      msg["content"] = content_text(m["content"], at);
      check_utf8(msg["content"].get_ref<const std::string&>(), "a message");
    } else if (calls) {
      // OpenAI sends null content with tool calls; templates expect a string (Qwen3's, Phi's and Granite's
      // fail on None), so it is given as "" (as vLLM gives it).
      msg["content"] = "";
    } else {
      bad("every message needs a string 'role' and a 'content' (a string or an array of text parts)");
    }
    if (given(m, "name")) msg["name"] = text_field(m, "name", at);
    if (calls) msg["tool_calls"] = tool_calls(m["tool_calls"], at);
    if (given(m, "reasoning_content")) msg["reasoning_content"] = text_field(m, "reasoning_content", at);
    if (role == "tool") {
      if (!given(m, "tool_call_id")) bad("'" + at + "tool_call_id' is required in a tool message");
      msg["tool_call_id"] = text_field(m, "tool_call_id", at);
    }
    plain.push_back({msg["role"].get<std::string>(),
                     msg["content"].is_string() ? msg["content"].get<std::string>() : ""});
    conv.messages.push_back(std::move(msg));
  }

  if (given(body, "response_format")) {
    if (const auto g = response_format(body["response_format"])) {
      try {
        out.constraint = session.json_output(g);
      } catch (const Error& e) {
        bad(e.what());
      }
    }
  }
  const ChatTemplate& tmpl = session.chat_template();
  std::set<std::string> names;
  if (given(body, "tools")) conv.tools = tools_of(body["tools"], names);
  if (names.empty()) conv.tools = nullptr;
  std::string forced;  // a named tool_choice
  bool required = false;
  if (given(body, "tool_choice")) {
    const ojson& c = body["tool_choice"];
    if (c.is_string()) {
      const auto v = c.get<std::string>();
      if (v != "none" && v != "auto" && v != "required")
        bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
            "\"function\": "
            "{\"name\": ...}}");
      if (v == "none") conv.tools = nullptr;  // as OpenAI: the model is not offered the tools
      required = v == "required";
    } else if (c.is_object() && given(c, "function") && c["function"].is_object() &&
               given(c["function"], "name")) {
      forced = text_field(c["function"], "name", "tool_choice.function.");
      if (names.count(forced) == 0)
        bad("'tool_choice' names the function '" + forced + "', which is not in 'tools'");
    } else {
      bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
          "{\"name\": ...}}");
    }
    if ((required || !forced.empty()) && names.empty())
      bad("'tool_choice' asks for a tool call but 'tools' is empty");
  }
  if (given(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean()) bad("'parallel_tool_calls' must be true or false");
    out.reply.parallel = body["parallel_tool_calls"].get<bool>();
  }
  if (given(body, "chat_template_kwargs")) {
    const ojson& k = body["chat_template_kwargs"];
    if (!k.is_object()) bad("'chat_template_kwargs' must be an object");
    for (auto it = k.begin(); it != k.end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools" || it.key() == "add_generation_prompt" ||
          it.key() == "bos_token" || it.key() == "eos_token")
        bad("'chat_template_kwargs." + it.key() + "' is set by the server");
      if (it.key() == "enable_thinking") {
        if (!it->is_boolean()) bad("'chat_template_kwargs.enable_thinking' must be true or false");
        if (!tmpl.takes_thinking())
          bad("this model's chat template has no thinking switch ('chat_template_kwargs.enable_thinking')");
        conv.enable_thinking = it->get<bool>();
      } else {
        conv.kwargs[it.key()] = *it;
      }
    }
  }
  for (size_t i = 0; i < conv.messages.size(); ++i)
    if (conv.messages[i].contains("tool_calls") && tmpl.source().find("tool_calls") == std::string::npos)
      bad((tmpl.empty() ? std::string("this model has no chat template: it") : tmpl.origin()) +
          " takes no tool calls ('messages[" + std::to_string(i) + "].tool_calls' would be dropped)");
  if (tmpl.empty()) {
    if (!conv.tools.is_null()) bad("this model has no chat template, so it cannot be offered tools");
    check_budget(out, o);
    for (const ChatMessage& m : plain) out.text += m.content;
    try {
      out.ids = session.prompt_ids(plain, false, o);
    } catch (const Error& e) {
      bad(e.what());
    }
    return out;
  }
  if (!conv.tools.is_null() && out.constraint)
    bad("'response_format' and 'tools' cannot be combined: the answer is held to the format, so no tool call "
        "could be written (set 'tool_choice': \"none\" or drop one)");
  if (!conv.tools.is_null()) {
    if (!tmpl.takes_tools()) bad(tmpl.origin() + " takes no tools ('tools' would be dropped)");
    if (tmpl.tool_format() == ToolCallFormat::None)
      bad(tmpl.origin() + " takes tools in a tool-call format this server does not read");
    out.reply.tools = tmpl.tool_format();
    if (required || !forced.empty()) {
      out.reply.start = tool_call_prefix(out.reply.tools, forced, tmpl.source());
      if (out.reply.tools == ToolCallFormat::Hermes || out.reply.tools == ToolCallFormat::Llama3) {
        std::string suffix;
        const auto g = forced_call_grammar(out.reply.tools, conv.tools, forced, suffix);
        try {
          out.constraint = session.json_output(g, suffix);
        } catch (const Error& e) {
          bad(e.what());
        }
      }
    }
  }
  out.reply.reasoning = tmpl.reasoning();
  check_budget(out, o);
  std::string& text = out.text;
  try {
    out.ids = session.prompt_ids(conv, out.reply.start, o, &text);
  } catch (const Error& e) {
    bad(e.what());
  }
  // A prompt that ends inside an open thinking block (e.g. DeepSeek-R1's "<think>\n"): the reply starts in
  // it.
  if (!out.reply.reasoning.open.empty())
    out.reply.reasoning.starts_open = prompt_opens_reasoning(text, out.reply.reasoning);
  return out;
}

}  // namespace tessera::cli
