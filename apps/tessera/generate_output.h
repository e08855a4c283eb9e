// What generate and chat print: the answer's statistics line, its JSON object, its log-probabilities.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/tessera/cli_session.h"

namespace tessera::cli {

// The line after an answer: steps, tokens, time, speed and memory.
void print_stats(const Session::Output& o, Session& s, FILE* f);
// One line of JSON. Generated text need not be valid UTF-8 (a byte-level model may stop inside a
// character): invalid bytes are written as U+FFFD, the token ids stay exact.
std::string json_line(const nlohmann::json& j);
// --logprobs without --json: one line per generated token after the text.
void print_logprobs(const Session::Output& o, const Session& s, FILE* f);
// Whether a raw prompt gets the chat template: --chat, or a model that has one unless --raw, an empty
// prompt or an infilling --suffix.
bool uses_chat(const SessionArgs& a, const Session& s, const std::string& prompt);
// The result object of generate --json and chat --json.
nlohmann::json result_json(const Session::Output& o, Session& s, size_t prompt_tokens);

}  // namespace tessera::cli
