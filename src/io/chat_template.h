// Built-in chat templates of the supported families (no Jinja engine): the family is detected from
// the model's tokenizer_config.json chat_template text, else from config.json.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace tessera {

enum class ChatFamily {
  LladaInstruct,  // Llama-3 headers: <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  ChatML,         // Dream / Qwen2.5: <|im_start|>role\n...<|im_end|>\n
  LladaMoE,       // <role>HUMAN</role>...<|role_end|>
  None,           // base model: the message contents are concatenated as they are
};

struct ChatMessage {
  std::string role;  // system | user | assistant (ChatML also: tool)
  std::string content;
};

const char* chat_family_name(ChatFamily f);

// Looks in MODEL_DIR/tokenizer_config.json's chat_template for "<|start_header_id|>",
// "<|im_start|>" or "<role>"; otherwise uses config.json model_type / architectures
// (llada -> LladaInstruct, dream / qwen2 -> ChatML, a MoE llada -> LladaMoE); otherwise None.
// Malformed JSON throws tessera::Error.
ChatFamily detect_chat_family(const std::filesystem::path& model_dir);

// Renders the conversation as the family's official template does. The default system turn is
// added when the conversation has no system message (ChatML: "You are a helpful assistant.",
// LLaDA-MoE: "detailed thinking off"). An unknown role throws tessera::Error.
std::string apply_chat_template(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt = true);

}  // namespace tessera
