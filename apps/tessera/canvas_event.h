// The canvas of a generation step as JSON, for clients that watch it denoise (serve's "canvas": true
// stream events, generate --json --canvas): the committed text (final: never retracted), the
// provisional rest of the generation (decided tokens that may still change, and the masks), the
// positions this step changed and the tokens it rewrote (token editing).
#pragma once
#include <nlohmann/json.hpp>
#include <span>

#include "decode/generate.h"
#include "io/tokenizer.h"

namespace tessera::cli {

// ev of a generation after a prompt of prompt_len tokens; positions count from the generation's start.
// The committed text ends at the first EOS of eos_ids (the answer's end).
nlohmann::json canvas_event_json(const StepEvent& ev, const Tokenizer& t, size_t prompt_len, int32_t mask,
                                 std::span<const int32_t> eos_ids);

}  // namespace tessera::cli
