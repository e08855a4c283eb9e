// Built-in chat templates; the strings follow the families' official Jinja templates exactly.
#include "io/chat_template.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"
#include "io/model_files.h"

namespace tessera {

namespace {
using json = nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Jinja's `trim`: strips leading and trailing whitespace.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

void check_role(const ChatMessage& m, std::initializer_list<const char*> allowed, ChatFamily f) {
  for (const char* r : allowed)
    if (m.role == r) return;
  std::string list;
  for (const char* r : allowed) list += std::string(list.empty() ? "" : ", ") + r;
  fail("chat message role '" + m.role + "' is not supported by the " + chat_family_name(f) +
       " template (use one of: " + list + ")");
}

std::string llada(const std::vector<ChatMessage>& msgs, bool gen) {
  // LLaDA-8B-Instruct: bos + per message header, trimmed content, <|eot_id|>.
  std::string out = "<|startoftext|>";
  for (const auto& m : msgs) {
    check_role(m, {"system", "user", "assistant"}, ChatFamily::LladaInstruct);
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string chatml(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  if (msgs.empty() || msgs[0].role != "system")
    out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
  for (size_t i = 0; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    check_role(m, {"system", "user", "assistant", "tool"}, ChatFamily::ChatML);
    if (m.role == "tool") {  // consecutive tool results share one user turn
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string llada_moe(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  if (msgs.empty() || msgs[0].role != "system") out += "<role>SYSTEM</role>detailed thinking off<|role_end|>";
  for (const auto& m : msgs) {
    check_role(m, {"system", "user", "assistant"}, ChatFamily::LladaMoE);
    const char* tag = m.role == "system" ? "SYSTEM" : m.role == "user" ? "HUMAN" : "ASSISTANT";
    out += std::string("<role>") + tag + "</role>" + m.content + "<|role_end|>";
  }
  if (gen) out += "<role>ASSISTANT</role>";
  return out;
}
}  // namespace

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::LladaInstruct:
      return "LLaDA-Instruct";
    case ChatFamily::ChatML:
      return "ChatML";
    case ChatFamily::LladaMoE:
      return "LLaDA-MoE";
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
  return ChatFamily::None;
}

std::string apply_chat_template(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  switch (family) {
    case ChatFamily::LladaInstruct:
      return llada(messages, add_generation_prompt);
    case ChatFamily::ChatML:
      return chatml(messages, add_generation_prompt);
    case ChatFamily::LladaMoE:
      return llada_moe(messages, add_generation_prompt);
    case ChatFamily::None:
      break;
  }
  std::string out;
  for (const auto& m : messages) out += m.content;
  return out;
}

}  // namespace tessera
