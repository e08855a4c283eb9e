// Chat templates. What runs is the model's own Jinja template (chat_template.jinja, tokenizer_config.json's
// chat_template, a GGUF's tokenizer.chat_template) through tessera's Jinja interpreter (io/jinja), with
// the variables Hugging Face transformers gives it. A model that ships none gets the built-in template
// of its family (detected from config.json or the GGUF architecture), written in Jinja too, and
// ChatTemplate::builtin() says so; a base model with neither has no template.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/tool_calls.h"

namespace tessera {

namespace jinja {
class Template;
}

// The families of the built-in templates.
enum class ChatFamily {
  LladaInstruct,  // Llama-3 headers: <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  ChatML,         // Dream / Qwen2.5: <|im_start|>role\n...<|im_end|>\n (with Qwen2.5's tools)
  LladaMoE,       // <role>HUMAN</role>...<|role_end|>
  Gemma4,         // DiffusionGemma: <|turn>user\n...<turn|>\n, replies after <|turn>model\n
  None,           // base model: the message contents are concatenated as they are
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
};

const char* chat_family_name(ChatFamily f);

// Looks in the model's chat template for "<|start_header_id|>", "<|im_start|>" or "<role>"; otherwise
// uses config.json model_type / architectures (llada -> LladaInstruct, dream / qwen2 -> ChatML, a MoE
// llada -> LladaMoE) or the GGUF architecture; otherwise None. Malformed JSON throws tessera::Error.
ChatFamily detect_chat_family(const std::filesystem::path& model_dir);

// What a template reads, shaped as OpenAI and transformers shape it: messages (role, content, and where
// given tool_calls with their arguments as JSON objects, tool_call_id, name, reasoning_content), tools
// ({"type": "function", "function": {...}}; null: none), add_generation_prompt, enable_thinking when
// set, and any further variables (a request's chat_template_kwargs).
struct Conversation {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  static Conversation of(const std::vector<ChatMessage>& msgs, bool add_generation_prompt = true);
};

class ChatTemplate {
 public:
  ChatTemplate();  // none: render() throws
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `source`: Jinja text (parsed here: a template that does not parse is kept with its error, which
  // render() throws, naming its line);
  // `tool_use`: the model's separate tool template ("" when none); `origin`: where it came from, for
  // messages; bos / eos: the text of the model's special tokens (the variables bos_token, eos_token).
  ChatTemplate(const std::string& source, const std::string& tool_use, std::string origin, std::string bos,
               std::string eos, bool builtin);
  static ChatTemplate of_family(ChatFamily f, std::string bos, std::string eos);
  // The model's own template, else its family's built-in one, else none; `file`, when given, instead of
  // them all (a template the user supplies). bos / eos as above, used when tokenizer_config.json does not
  // name them.
  static ChatTemplate for_model(const std::filesystem::path& model_dir, const std::string& bos,
                                const std::string& eos, const std::filesystem::path& file = {});

  bool empty() const { return main_ == nullptr && error_.empty(); }
  bool builtin() const { return builtin_; }
  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }  // the Jinja text (and the tool_use one's)
  // Whether the template reads `tools` (a template that does not would drop them silently).
  bool takes_tools() const { return takes_tools_; }
  // Whether it reads enable_thinking (a thinking switch).
  bool takes_thinking() const { return takes_thinking_; }
  ToolCallFormat tool_format() const { return tool_format_; }
  const ReasoningMarkers& reasoning() const { return reasoning_; }

  // The prompt text. A template's own error (raise_exception, a type error, a limit) throws
  // tessera::Error naming the template's line.
  std::string render(const Conversation& c) const;

 private:
  std::unique_ptr<jinja::Template> main_, tool_use_;
  std::string origin_, source_, bos_, eos_;
  std::string error_;  // the parse error of a template that does not parse
  bool builtin_ = false, takes_tools_ = false, takes_thinking_ = false;
  ToolCallFormat tool_format_ = ToolCallFormat::None;
  ReasoningMarkers reasoning_;
};

// The Jinja text of the family's built-in template.
const char* builtin_chat_template(ChatFamily f);

// The family's built-in template on plain messages (the tests' and simple callers' form). An unknown
// role throws tessera::Error; None concatenates the contents.
std::string apply_chat_template(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt = true);

}  // namespace tessera
