// A request planned once. plan_request derives from the options and the prompt everything the
// generation will ask of the engine (the canvas, its largest step, the forwards' output, and the state
// held across forwards: KV cache rows, SparseD patterns, DES), before the first forward. A
// RequestScope holds that state open on a Denoiser from its construction to its end, however the
// request ends; the CLI session, the batcher, eval and generate() itself all use it, and the memory
// budget is checked against the same plan (engine/request_budget.h).
#pragma once
#include <cstdint>

#include "decode/denoiser.h"
#include "decode/options.h"

namespace tessera {

struct RequestPlan {
  int64_t prompt_len = 0;
  int64_t canvas = 0;       // prompt + gen_length + suffix, padded to whole blocks when block-causal
  int attention_block = 0;  // block-causal models: the generation's block length (0: bidirectional)
  // The largest forward: every canvas row, and at most logit_rows predicted positions (a block).
  int64_t logit_rows = 0;
  bool host_logits = false;  // the forwards return whole logit rows (cfg, editing's penalty: guidance.cpp)
  bool logprobs = false;     // the forwards return log-probabilities beside the tokens
  int64_t kv_capacity = 0;   // rows of KV cache held for the request (0: none)
  int kv_streams = 0;        // its caches: 1, or 2 under cfg (the unconditional canvas has its own)
  bool sparse = false;       // SparseD patterns held for the canvas
  SparseConfig sparse_config;
  bool des = false;  // DES state (or only its unique-expert counts: des_config.mode Off)
  DesConfig des_config;
  // Tri-mode decoding (GenerateOptions::causal()): some forwards are causal; the KV cache holds the
  // canvas, written causally (decode/causal.cpp).
  bool causal = false;
  bool uniform = false;  // uniform-noise canvases (decode/uniform.cpp; causal is set too)
  // Whether its forwards can be packed with other requests' (no per-request attention or expert state,
  // no whole logit rows from a KV cache, not uniform-noise canvases: their steps run on the engine's cache).
  bool shares_forwards() const {
    return !sparse && !des && !uniform && kv_streams < 2 && !(host_logits && kv_capacity > 0);
  }
};

// The plan of a generation of `o` after a prompt of prompt_len tokens (o validated), for a
// block-causal model when block_causal.
RequestPlan plan_request(const GenerateOptions& o, int64_t prompt_len, bool block_causal);

// The canvas a generation uses: prompt + gen_length (+ the suffix), padded to whole blocks for
// block-causal models.
int64_t canvas_length(int64_t prompt_len, const GenerateOptions& o, bool block_causal);

// The DesConfig of the options' des, des_k, des_beta and des_scope (Denoiser::des_begin).
DesConfig des_config(const GenerateOptions& o);

// Opens a plan's engine state on a denoiser (the attention block, the KV cache, DES, the SparseD
// patterns) and closes it when destroyed. Throws Error, with nothing left open, when the denoiser lacks
// something the plan needs.
class RequestScope {
 public:
  RequestScope(Denoiser& d, const RequestPlan& p);
  ~RequestScope();
  RequestScope(const RequestScope&) = delete;
  RequestScope& operator=(const RequestScope&) = delete;
  Denoiser& denoiser() const { return d_; }
  const RequestPlan& plan() const { return p_; }

 private:
  void close() noexcept;
  Denoiser& d_;
  RequestPlan p_;
  bool kv_ = false, des_ = false, sparse_ = false;
};

}  // namespace tessera
