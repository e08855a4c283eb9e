// The request side of `tessera serve`: a POST body (JSON text) of /v1/completions or
// /v1/chat/completions turned into generation options and prompt token ids, or refused with the HTTP
// status and the OpenAI error object. Kept apart from the HTTP server so that it can be tested and
// fuzzed on its own (tests/fuzz: the `request` target).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "apps/tessera/cli_session.h"
#include "decode/generate.h"

namespace tessera::cli {

// A request the server refuses: HTTP status, OpenAI error type, message.
struct BadRequest {
  int status;
  std::string type, message;
};

// Throws BadRequest 404 unless `asked` names the model served as `model_id` (or is "tessera").
void check_model(const std::string& asked, const std::string& model_id);

// {"error": {"message", "type", "param", "code"}} as text (bytes of the message that are not UTF-8,
// from an invalid body quoted by the JSON parser, are replaced).
// The message is cut to kMaxErrorMessage bytes (a message may quote the request).
inline constexpr size_t kMaxErrorMessage = 512;
// A request body may nest arrays and objects this deep at most (checked before it is parsed).
inline constexpr int kMaxNesting = 32;
std::string error_body(const BadRequest& b);

// The most choices (OpenAI's "n") one request may ask for, and the most prompts times choices of a
// completions request with several prompts: they run as that many sequences at once.
constexpr int kMaxChoices = 16;
constexpr int kMaxSequences = 64;

// How a chat reply is read back into OpenAI's fields (serve_chat.cpp).
struct ReplyFormat {
  ToolCallFormat tools = ToolCallFormat::None;  // tool calls parsed in this format (None: no tools offered)
  ReasoningMarkers reasoning;                   // the thinking block split off (open empty: none)
  std::string start;     // text the prompt ends with that belongs to the reply (a forced tool call's start)
  bool parallel = true;  // parallel_tool_calls: false keeps only the first call
  bool parses() const { return tools != ToolCallFormat::None || !reasoning.open.empty(); }
};

struct ParsedRequest {
  GenerateOptions options;  // the session's defaults, then the request's fields; validated
  // Token ids of each prompt (chat: one, the chat template applied). A completions "prompt" may be a
  // string, token ids, or an array of either; choice p * n + i is prompt p's choice i.
  std::vector<std::vector<int32_t>> prompts;
  bool stream = false, include_usage = false;
  // Streamed: also one "tessera.canvas" event per step of each choice (canvas_event.h), before its delta.
  bool canvas = false;
  int n = 1;  // choices: choice i samples with seed + i (at temperature 0 they are all the same)
  // Log-probabilities of the generated tokens (completions: "logprobs": N; chat: "logprobs": true with
  // "top_logprobs": N) with the N most likely tokens at each; -1: none. options.logprobs is set with it.
  int logprobs = -1;
  ReplyFormat reply;        // chat
  std::string prompt_text;  // chat: the rendered prompt (POST /apply-template shows it)
};

// A chat request's prompt (its messages, tools and switches through the model's chat template) and how its
// reply is read; a model without a chat template gets the contents concatenated. BadRequest naming the field.
struct ChatPrompt {
  std::vector<int32_t> ids;
  std::string text;
  std::shared_ptr<const TokenConstraint> constraint;  // response_format json_object / json_schema
  ReplyFormat reply;
};
ChatPrompt chat_prompt(const nlohmann::ordered_json& body, const Session& session, const GenerateOptions& o);

// The server's limits on one request (serve's --max-sequences, --max-tokens), checked before any prompt
// is tokenized.
struct RequestLimits {
  int max_sequences = kMaxSequences;  // prompts x n
  int max_tokens = 0;                 // the longest generation; 0: the model's context
};

// Parses and checks a request for the model of `session`, served under the name `model_id`; throws
// BadRequest (400, or 404 for another model) with a message naming the field.
ParsedRequest parse_request(std::string_view body_text, bool chat, const Session& session,
                            const std::string& model_id, const RequestLimits& limits = {});

// POST /tokenize as llama.cpp's server takes it: {"content": text, "add_special": false, "with_pieces":
// false}; add_special puts the model's BOS first where it adds one (no chat template).
struct TokenizeRequest {
  std::vector<int32_t> tokens;
  bool with_pieces = false;
};
TokenizeRequest parse_tokenize(std::string_view body_text, const Session& session);
// POST /detokenize: {"tokens": [ids]} -> the text (special tokens kept, as llama.cpp's server does);
// every id must lie in the model's vocabulary.
std::string parse_detokenize(std::string_view body_text, const Session& session);

}  // namespace tessera::cli
