// generate(): the unmasking loop of masked diffusion LMs over the Denoiser interface, composed of the
// parts in decode/loop.h (transfer schedule, unmask policy, row policy, attention and expert policies,
// guidance, canvas and stop conditions; each file describes its part). A request is planned once
// (decode/request.h) and its engine state held by a RequestScope; decode/compat.h says which options
// combine.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decode/denoiser.h"
#include "decode/options.h"
#include "decode/request.h"

namespace tessera {

// A generated token's log-probability: log_softmax of the model's logits at its position, in the
// forward of the step that decided it (raw logits: no temperature, no top-k / top-p filter; with cfg the
// guided logits), and the most likely tokens of that distribution.
struct TokenLogprob {
  float logprob = NAN;                         // of the token; NaN for a position never decided
  int step = -1;                               // the executed step that decided it (index into order)
  std::vector<std::pair<int32_t, float>> top;  // min(kTopLogprobs, vocab) (token, logprob), most likely first
};

// A token rewritten by token editing (GenerateOptions::edit).
struct TokenEdit {
  int step;          // the executed step that rewrote it (index into order)
  int32_t position;  // absolute canvas position
  int32_t from, to;  // the token before and after
  bool operator==(const TokenEdit&) const = default;
};

struct StepEvent {
  int step;                                          // 0-based index of the executed step
  std::span<const int32_t> canvas;                   // the whole canvas (prompt + generation)
  std::span<const int32_t> newly_decided_positions;  // absolute canvas positions changed, ascending
  std::span<const TokenLogprob> logprobs;            // GenerateOptions::logprobs: per generated position
  // Canvas positions [prompt, committed) hold final tokens: no later step changes them (the decided run
  // from the prompt on; with token editing, only up to the current block). Positions after it are
  // provisional: masks, and (with editing) decided tokens that may still be rewritten.
  int committed = 0;
  std::span<const TokenEdit> edits;  // the tokens this step rewrote (token editing), by position
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated part only (trimmed at the first EOS if stop_at_eos)
  std::vector<std::vector<int32_t>>
      order;                           // absolute positions decided (or rewritten) at each step, ascending
  int steps_run = 0;                   // executed steps (each one forward; two with cfg)
  std::vector<TokenLogprob> logprobs;  // GenerateOptions::logprobs: one per token of `tokens`
  std::vector<TokenEdit> edits;        // token editing: every rewrite, in step order
  int64_t forwards = 0;                // forwards run (editing runs some that change nothing)
};

// Plans the request, opens its engine state on `den` (RequestScope) and runs it. Throws Error for
// invalid options or prompt tokens, before any forward.
GenerateResult generate(Denoiser& den, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(const StepEvent&)>& on_step = {});
// Checks the options and the prompt tokens (vocab: the model's; block_causal: a block-causal model) and
// plans the request: what the callers that hold a request open themselves (RequestScope) run first.
RequestPlan plan_checked(std::span<const int32_t> prompt, const GenerateOptions& opt, int64_t vocab,
                         bool block_causal);
// Runs a request whose state the caller holds open: the plan_checked plan of these options and prompt.
GenerateResult generate(RequestScope& request, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(const StepEvent&)>& on_step = {});

}  // namespace tessera
