// Chat templates: the model's own, or the built-in one of its family, run by io/jinja.
#include "io/chat_template.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"
#include "io/jinja/jinja.h"
#include "io/model_files.h"

namespace tessera {

namespace {
using json = nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The built-in templates (for models that ship none), in Jinja. LLaDA's is LLaDA-8B-Instruct's published
// template (tests/data/chat_templates) with add_generation_prompt honoured and a role check; ChatML is
// Qwen2.5-Instruct's published template (tools included) with Dream's default system turn and a role
// check; LLaDA-MoE's renders what specs/models.md gives.
const char* const kLlada = R"J(
{%- for m in messages %}
  {%- if m.role not in ['system', 'user', 'assistant'] %}
    {{- raise_exception("chat message role '" ~ m.role ~ "' is not supported by the LLaDA-Instruct template (use one of: system, user, assistant)") }}
  {%- endif %}
{%- endfor %}
{%- set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})J";

const char* const kChatML = R"J(
{%- for m in messages %}
  {%- if m.role not in ['system', 'user', 'assistant', 'tool'] %}
    {{- raise_exception("chat message role '" ~ m.role ~ "' is not supported by the ChatML template (use one of: system, user, assistant, tool)") }}
  {%- endif %}
{%- endfor %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %})J";

const char* const kLladaMoe = R"J(
{%- set tags = {'system': 'SYSTEM', 'user': 'HUMAN', 'assistant': 'ASSISTANT'} %}
{%- for m in messages %}
  {%- if m.role not in tags %}
    {{- raise_exception("chat message role '" ~ m.role ~ "' is not supported by the LLaDA-MoE template (use one of: system, user, assistant)") }}
  {%- endif %}
{%- endfor %}
{%- if not messages or messages[0].role != 'system' %}
  {{- '<role>SYSTEM</role>detailed thinking off<|role_end|>' }}
{%- endif %}
{%- for m in messages %}
  {{- '<role>' + tags[m.role] + '</role>' + m.content + '<|role_end|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<role>ASSISTANT</role>' }}
{%- endif %})J";

// Gemma 4 (DiffusionGemma's processor; shared/specs/diffusion-gemma.md section 7): turns
// <|turn>ROLE\n...<turn|>\n with the model's role "model"; thinking off (the default), the generation prompt
// closes an empty thought channel, <|channel>thought\n<channel|>, which the reference prompt tokenises
// to; thinking on puts <|think|> at the start of the system turn and leaves the channel to the model. The
// published Jinja file was not read (the spec's open point): the system turn and the refusal of tool turns
// are tessera's choice.
const char* const kGemma4 = R"J(
{%- for m in messages %}
  {%- if m.role not in ['system', 'user', 'assistant'] %}
    {{- raise_exception("chat message role '" ~ m.role ~ "' is not supported by the built-in Gemma 4 template (use one of: system, user, assistant)") }}
  {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- set think = enable_thinking is defined and enable_thinking %}
{%- if think or (messages and messages[0].role == 'system') %}
  {{- '<|turn>system\n' }}
  {%- if think %}{{- '<|think|>' }}{%- endif %}
  {%- if messages and messages[0].role == 'system' %}{{- messages[0].content | trim }}{%- endif %}
  {{- '<turn|>\n' }}
{%- endif %}
{%- for m in messages %}
  {%- if m.role != 'system' or not loop.first %}
    {{- '<|turn>' + ('model' if m.role == 'assistant' else m.role) + '\n' + m.content | trim + '<turn|>\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|turn>model\n' }}
  {%- if not think %}{{- '<|channel>thought\n<channel|>' }}{%- endif %}
{%- endif %})J";

// A base model: the contents as they are.
const char* const kNone = "{%- for m in messages %}{{ m.content }}{% endfor %}";

}  // namespace

const char* builtin_chat_template(ChatFamily f) {
  switch (f) {
    case ChatFamily::LladaInstruct:
      return kLlada;
    case ChatFamily::ChatML:
      return kChatML;
    case ChatFamily::LladaMoE:
      return kLladaMoe;
    case ChatFamily::Gemma4:
      return kGemma4;
    case ChatFamily::None:
      break;
  }
  return kNone;
}

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::LladaInstruct:
      return "LLaDA-Instruct";
    case ChatFamily::ChatML:
      return "ChatML";
    case ChatFamily::LladaMoE:
      return "LLaDA-MoE";
    case ChatFamily::Gemma4:
      return "Gemma 4";
    case ChatFamily::None:
      return "none";
  }
  return "?";
}

ChatFamily detect_chat_family(const std::filesystem::path& model_dir) {
  const std::string tmpl = model_chat_template(model_dir);
  if (tmpl.find("<|start_header_id|>") != std::string::npos) return ChatFamily::LladaInstruct;
  if (tmpl.find("<|im_start|>") != std::string::npos) return ChatFamily::ChatML;
  if (tmpl.find("<role>") != std::string::npos) return ChatFamily::LladaMoE;
  if (tmpl.find("<|turn>") != std::string::npos) return ChatFamily::Gemma4;

  if (is_gguf_file(model_dir)) {  // the architecture stands in for config.json
    const std::string arch = GgufFile::open(model_dir)->get_string("general.architecture", "");
    return arch == "llada"       ? ChatFamily::LladaInstruct
           : arch == "llada-moe" ? ChatFamily::LladaMoE
           : arch == "dream"     ? ChatFamily::ChatML
                                 : ChatFamily::None;
  }
  json cfg = read_json_or_empty(model_dir / "config.json");
  if (!cfg.is_object()) return ChatFamily::None;
  std::string type = cfg.contains("model_type") && cfg["model_type"].is_string()
                         ? lower(cfg["model_type"].get<std::string>())
                         : "";
  std::string arch;
  if (cfg.contains("architectures") && cfg["architectures"].is_array())
    for (const auto& a : cfg["architectures"])
      if (a.is_string()) arch += lower(a.get<std::string>()) + " ";
  bool moe = type.find("moe") != std::string::npos || arch.find("moe") != std::string::npos;
  if (type.find("llada") != std::string::npos || arch.find("llada") != std::string::npos)
    return moe ? ChatFamily::LladaMoE : ChatFamily::LladaInstruct;
  if (type == "dream" || type == "qwen2" || arch.find("dream") != std::string::npos)
    return ChatFamily::ChatML;
  if (type.find("gemma") != std::string::npos) return ChatFamily::Gemma4;
  return ChatFamily::None;
}

Conversation Conversation::of(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  Conversation c;
  for (const auto& m : msgs) c.messages.push_back({{"role", m.role}, {"content", m.content}});
  c.add_generation_prompt = add_generation_prompt;
  return c;
}

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate::ChatTemplate(const std::string& source, const std::string& tool_use, std::string origin,
                           std::string bos, std::string eos, bool builtin)
    : origin_(std::move(origin)), bos_(std::move(bos)), eos_(std::move(eos)), builtin_(builtin) {
  // A template that does not parse fails where it is used (a chat prompt), not when the model loads: raw
  // prompts still work, and the error names the template's line.
  try {
    main_ = std::make_unique<jinja::Template>(source, origin_);
    if (!tool_use.empty()) tool_use_ = std::make_unique<jinja::Template>(tool_use, origin_ + " (tool_use)");
  } catch (const Error& e) {
    main_.reset();
    tool_use_.reset();
    error_ = e.what();
  }
  source_ = source + tool_use;
  takes_tools_ = source_.find("tools") != std::string::npos;
  takes_thinking_ = source_.find("enable_thinking") != std::string::npos;
  tool_format_ = takes_tools_ ? detect_tool_call_format(source_) : ToolCallFormat::None;
  reasoning_ = detect_reasoning_markers(source_);
}

ChatTemplate ChatTemplate::of_family(ChatFamily f, std::string bos, std::string eos) {
  return ChatTemplate(builtin_chat_template(f), "",
                      std::string("the built-in ") + chat_family_name(f) + " template", std::move(bos),
                      std::move(eos), true);
}

ChatTemplate ChatTemplate::for_model(const std::filesystem::path& model_dir, const std::string& bos,
                                     const std::string& eos, const std::filesystem::path& file) {
  std::string bos_text = model_special_token(model_dir, "bos_token");
  std::string eos_text = model_special_token(model_dir, "eos_token");
  if (bos_text.empty()) bos_text = bos;
  if (eos_text.empty()) eos_text = eos;
  if (!file.empty()) {
    std::ifstream f(file, std::ios::binary);
    if (!f) fail(file.string() + ": the chat template cannot be read (" + std::strerror(errno) + ")");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return ChatTemplate(text, "", file.string(), std::move(bos_text), std::move(eos_text), false);
  }
  std::string main, tool_use;
  for (const auto& t : model_chat_templates(model_dir)) {
    if (t.name == "tool_use")
      tool_use = t.text;
    else if (main.empty() || t.name == "default")
      main = t.text;
  }
  if (main.empty()) main = tool_use;
  if (!main.empty())
    return ChatTemplate(main, main == tool_use ? "" : tool_use,
                        model_dir.filename().string() + "'s chat template", std::move(bos_text),
                        std::move(eos_text), false);
  const ChatFamily f = detect_chat_family(model_dir);
  if (f == ChatFamily::None) return ChatTemplate();
  return of_family(f, std::move(bos_text), std::move(eos_text));
}

std::string ChatTemplate::render(const Conversation& c) const {
  if (!error_.empty()) fail(error_);
  if (!main_) fail("the model has no chat template (use --raw)");
  nlohmann::ordered_json ctx = c.kwargs.is_object() ? c.kwargs : nlohmann::ordered_json::object();
  ctx["messages"] = c.messages;
  const bool tools = c.tools.is_array() && !c.tools.empty();
  if (tools) ctx["tools"] = c.tools;
  ctx["add_generation_prompt"] = c.add_generation_prompt;
  ctx["bos_token"] = bos_;
  ctx["eos_token"] = eos_;
  if (c.enable_thinking) ctx["enable_thinking"] = *c.enable_thinking;
  return (tools && tool_use_ ? *tool_use_ : *main_).render(ctx);
}

std::string apply_chat_template(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  return ChatTemplate::of_family(family, "<|startoftext|>", "<|endoftext|>")
      .render(Conversation::of(messages, add_generation_prompt));
}

}  // namespace tessera
