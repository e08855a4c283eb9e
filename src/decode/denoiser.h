// What the unmasking loops need from the engine: one forward over a canvas, reduced on the device to
// (token, confidence) for the positions that need a prediction. The decode layer never sees kernels.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace tessera {

// SparseD (head-specific block-sparse attention; algorithms.md 2). A request that uses it calls
// sparse_begin once, then sets the phase of its next forwards: Dense (exact attention), Select (exact
// attention, and every layer's pattern is built from that forward's queries and keys), Sparse
// (attention restricted to the pattern's tiles). sparse_end returns to exact attention.
enum class SparsePhase : uint8_t { Dense, Select, Sparse };
struct SparseConfig {
  int block = 32;          // tile side in positions
  float rho = 0.5f;        // kept fraction of the prompt key blocks and of the generation key blocks
  int64_t prompt_len = 0;  // keys [0, prompt_len) are the prompt (isolated selection)
};

// Dynamic Expert Sharing (DES, algorithms.md 4; MoE models): in every MoE layer the tokens decoded in
// parallel (the rows set by des_rows) agree on a coreset of experts and route inside it. Seq: the union
// of each token's first k experts; Vote: the floor(beta * n_experts) experts with the highest summed
// router score over the tokens that selected them. With all_rows every other row of the forward
// (prompt, other blocks) routes inside the coreset too; otherwise those rows route normally. Off: no
// sharing, only the unique-expert counts. The coreset always holds at least top_k experts.
struct DesConfig {
  DesMode mode = DesMode::Off;
  int k = 2;
  float beta = 0.4f;
  bool all_rows = false;
};

// predict_cached's computed rows: [q_lo, q_hi) of a canvas of n positions, as the row list of
// predict_rows (throws Error unless it is a non-empty range of the canvas).
inline void cached_range(int64_t q_lo, int64_t q_hi, int64_t n, std::vector<int32_t>& rows) {
  TESSERA_CHECK(0 <= q_lo && q_lo < q_hi && q_hi <= n,
                "KV cache: the computed rows [" + std::to_string(q_lo) + ", " + std::to_string(q_hi) +
                    ") are not a non-empty range of the canvas of " + std::to_string(n));
  rows.resize(static_cast<size_t>(q_hi - q_lo));
  for (int64_t r = q_lo; r < q_hi; ++r) rows[static_cast<size_t>(r - q_lo)] = static_cast<int32_t>(r);
}

// The log-probabilities of one predict call's positions, in its order (SampleParams::logprobs).
struct PredictLogprobs {
  int64_t top = 0;               // most likely tokens per position: min(kTopLogprobs, vocab)
  std::vector<float> chosen;     // log_softmax(logits)[token] of the predicted token
  std::vector<int32_t> top_ids;  // [n * top], most likely first
  std::vector<float> top_lp;     // [n * top]
};

// One denoising step of a uniform-noise canvas (Denoiser::denoise_canvas), per canvas row: the token
// sampled at the step's temperature, the argmax, the entropy of the tempered distribution, and the soft
// embeddings [rows, soft_width] the next step conditions on.
struct CanvasPrediction {
  std::vector<int32_t> sampled, argmax;
  std::vector<float> entropy, soft;
};

class Denoiser {
 public:
  virtual ~Denoiser() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t mask_token() const = 0;
  // Runs one forward over `canvas` (a single sequence, absolute positions 0..n-1) and, for each
  // position in `positions`, writes the token chosen by `sp` and its confidence (ConfKind). The
  // counter RNG is keyed by (sp.seed, position, vocab index), so results never depend on batching.
  virtual void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                       const SampleParams& sp, std::span<int32_t> tokens, std::span<float> conf) = 0;
  // After a predict / predict_cached / predict_rows call whose SampleParams asked for logprobs: those
  // of its positions (valid until the next call).
  virtual const PredictLogprobs& last_logprobs() const { fail("this denoiser returns no log-probabilities"); }
  // Full logits [positions.size(), vocab] in f32 for the given positions (host memory). Slower:
  // used only where a policy needs whole rows on the host (classifier-free guidance).
  virtual void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                      std::span<float> out) = 0;
  // Block-causal models (LLaDA2): the block size of the attention mask (positions p attend to keys of
  // blocks <= p / block); 0 for bidirectional or causal models. The block is a generation parameter:
  // generate() sets it to the generation's block length before the first forward.
  virtual int attention_block() const { return 0; }
  virtual void set_attention_block(int block) { (void)block; }
  // Tri-mode models (Nemotron-Labs-Diffusion): the attention of the next forwards. Causal: position p
  // attends to positions <= p, the logits of position p come from row p - 1 (the next-token prediction;
  // position 0 has none), and a KV-cache step reads only the rows up to its last computed one (a later
  // row, even one never computed, is invisible to it). Not causal: the model's own (bidirectional)
  // attention. Models without the mode refuse set_causal(true).
  virtual bool supports_causal() const { return false; }
  virtual void set_causal(bool causal) {
    if (causal) fail("this model has no causal (autoregressive) mode");
  }
  // Tri-mode models with a draft adapter (Nemotron's linear_spec_lora: a LoRA on o_proj): whether the
  // next forwards add it (self-speculation's drafts do; no other forward).
  virtual bool supports_draft_adapter() const { return false; }
  virtual void set_draft_adapter(bool on) {
    if (on) fail("this model has no draft adapter");
  }

  // Uniform-noise block diffusion (DiffusionGemma; decode/uniform.cpp). The cache is written by causal
  // forwards (set_causal(true), then predict_cached over the rows to write, with no positions);
  // denoise_canvas runs the bidirectional (decoder) forward of canvas rows [lo, hi) = the canvas against
  // the cached rows [0, lo) (read, not changed; the canvas rows' own K / V are scratch until a causal
  // forward rewrites them), conditioned on `sc` ([hi - lo, soft_width()] f32: the previous step's soft
  // embeddings; empty: none), sampling with sp (temperature > 0, seed; each row keyed by its position).
  virtual bool supports_uniform_canvas() const { return false; }
  virtual int64_t soft_width() const { return 0; }
  virtual void denoise_canvas(std::span<const int32_t> canvas, int64_t lo, int64_t hi,
                              std::span<const float> sc, const SampleParams& sp, CanvasPrediction& out) {
    (void)canvas, (void)lo, (void)hi, (void)sc, (void)sp, (void)out;
    fail("this model has no uniform-noise canvases");
  }

  // KV cache (Fast-dLLM prefix / dual cache; the engine's State tensors). kv_cache_reset starts a
  // request: a cache for canvases of up to `capacity` positions with every row unwritten.
  // predict_cached is predict computing only canvas rows [q_lo, q_hi) (widened to cover the rows
  // whose hidden states give the logits of `positions`): the keys and values of the other rows come
  // from the cache, where an earlier call must have written them, and the computed rows' keys and
  // values replace theirs in the cache. q_lo = 0, q_hi = canvas size recomputes the whole cache and
  // equals predict. Reusing a row whose tokens (or whose context) changed since it was written is
  // the approximation a cache makes; exact for rows that no changed row can influence.
  virtual bool supports_kv_cache() const { return false; }
  virtual void kv_cache_reset(int64_t capacity) {
    (void)capacity;
    fail("this denoiser has no KV cache");
  }
  // The request that kv_cache_reset started has ended: its cache may be freed (an engine frees it only
  // when memory is short; the next request reuses it otherwise). generate() calls it however it ends.
  virtual void kv_cache_end() {}
  virtual void predict_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                              std::span<const int32_t> positions, const SampleParams& sp,
                              std::span<int32_t> tokens, std::span<float> conf) {
    (void)canvas, (void)q_lo, (void)q_hi, (void)positions, (void)sp, (void)tokens, (void)conf;
    fail("this denoiser has no KV cache");
  }
  // The cross-request prefix cache (block-causal models; engine/prefix_cache.h), after kv_cache_reset and
  // before the request's first forward: `rows` (whole attention blocks) of `canvas` are final and exact
  // for any request that begins with them (the prompt's whole blocks). Restores into the request's cache
  // the longest prefix of them that an earlier request computed and returns its rows (0: none, or no
  // prefix cache); the rows after it are stored for later requests once a forward of this one wrote them.
  virtual int64_t kv_prefix(std::span<const int32_t> canvas, int64_t rows) {
    (void)canvas, (void)rows;
    return 0;
  }
  // predict_cached computing exactly the canvas rows `rows` (ascending, distinct; the logit rows of
  // `positions` are added): Window-Diffusion's active set, which need not be one range.
  virtual void predict_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                            std::span<const int32_t> positions, const SampleParams& sp,
                            std::span<int32_t> tokens, std::span<float> conf) {
    (void)canvas, (void)rows, (void)positions, (void)sp, (void)tokens, (void)conf;
    fail("this denoiser has no KV cache");
  }

  // Classifier-free guidance with a KV cache: the unconditional canvas (the prompt masked) keeps its own
  // cache, stream 1 (stream 0 is kv_cache_reset's). kv_stream_reset(1, capacity) starts it with every
  // row unwritten (kv_cache_end ends both); logits_rows is predict_rows returning full logits
  // [positions, vocab] (host memory) from the cache of `stream`.
  virtual bool supports_kv_streams() const { return false; }
  virtual void kv_stream_reset(int stream, int64_t capacity) {
    (void)stream, (void)capacity;
    fail("this denoiser has no second KV cache stream");
  }
  virtual void logits_rows(int stream, std::span<const int32_t> canvas, std::span<const int32_t> rows,
                           std::span<const int32_t> positions, std::span<float> out) {
    (void)stream, (void)canvas, (void)rows, (void)positions, (void)out;
    fail("this denoiser has no KV cache logits");
  }

  // SparseD (see SparsePhase): patterns for single-sequence, uncached forwards over a canvas of exactly
  // `canvas_len` positions (the pattern's tiles are canvas rows). Memory for the patterns is taken
  // here, before any forward, and counted against a memory budget.
  virtual bool supports_sparse_attention() const { return false; }
  virtual void sparse_begin(int64_t canvas_len, const SparseConfig& c) {
    (void)canvas_len, (void)c;
    fail("this denoiser has no sparse attention");
  }
  virtual void sparse_phase(SparsePhase p) {
    (void)p;
    fail("this denoiser has no sparse attention");
  }
  virtual void sparse_end() {}

  // DES (see DesConfig): des_begin starts it for the next forwards, des_rows sets the canvas positions
  // [lo, hi) decoded in parallel (the current block), des_end returns to normal routing.
  virtual bool supports_expert_sharing() const { return false; }
  virtual void des_begin(const DesConfig& c) {
    (void)c;
    fail("this denoiser has no expert sharing");
  }
  virtual void des_rows(int64_t lo, int64_t hi) { (void)lo, (void)hi; }
  virtual void des_end() {}
};

}  // namespace tessera
