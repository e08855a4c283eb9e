// The narrow backend interface: every op the engine runs. Pointers inside Tensor views are device
// pointers of this backend. Every op's arguments are checked once for all backends (op_checks.h:
// check_<op>, called by each backend's op before dispatch), so implementations may assume valid
// arguments. Optional capabilities are queried, not assumed.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace tessera {

// Attention mask kinds. Bidirectional is the dLLM default; Causal and BlockCausal compare absolute
// positions of query and key (block-causal: key block <= query block, block = pos / block_size).
enum class MaskKind : uint8_t { None, Causal, BlockCausal };

// Several sequences packed without padding. Sequence s owns query rows [cu_q[s], cu_q[s+1]) and key
// rows [cu_k[s], cu_k[s+1]). Queries attend only to keys of their own sequence. Positions are the
// absolute positions used by RoPE and by causal masks. All four arrays are i32 device buffers.
struct AttnParams {
  MaskKind mask = MaskKind::None;
  int block_size = 0;  // for BlockCausal
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
  int n_seqs = 1;
  const int32_t* cu_q = nullptr;   // [n_seqs + 1]
  const int32_t* cu_k = nullptr;   // [n_seqs + 1]
  const int32_t* q_pos = nullptr;  // [n_query]
  const int32_t* k_pos = nullptr;  // [n_kv]
  // Optional block-sparse pattern (SparseD), device memory; nullptr = dense. Needs n_seqs == 1.
  // One byte per (query head h, query block qb, key block kb) at [(h * n_qb + qb) * n_kb + kb], with
  // n_qb = ceil(n_query / sparse_block), n_kb = ceil(n_kv / sparse_block); blocks count query rows and
  // key rows of the sequence (not positions). A zero byte skips that tile entirely; the causal /
  // block-causal mask still applies inside kept tiles. A query row that keeps no visible key gets 0.
  const uint8_t* block_mask = nullptr;
  int sparse_block = 0;
  // The pattern's strides when it was built for a whole canvas of which this call computes some rows
  // (a KV-cache step): n_qb, n_kb of that canvas, and every query / key row's block is that of its
  // position (q_pos / k_pos, each ascending) instead of its row. 0: the strides of this call's rows.
  // CPU only.
  int64_t sparse_q_blocks = 0, sparse_k_blocks = 0;
  // Optional planned scratch where a backend may stage K and V in bf16 (the CUDA tensor-core kernel
  // does; without it the CUDA backend runs its f32 SIMT kernel): attn_kv_scratch_bytes() bytes.
  void* kv_scratch = nullptr;
  // Optional scratch of attn_q_scratch_bytes() bytes that the backend may overwrite, possibly q's own
  // buffer (the graph passes q where attention is q's last use): the CUDA backend's cuDNN path stages
  // bf16 Q in `out` and lets cuDNN write O here, then copies O to `out`. Without it (or without
  // kv_scratch) that path is not taken.
  void* q_scratch = nullptr;
  // The narrowest dtype the backend may round q, k, v (and the probabilities) to while accumulating in
  // f32: BF16 where the graph computes in bf16 (the executor passes the output's dtype), F32 for f32
  // arithmetic throughout. The CPU backend's bf16 kernel (CpuAttention) runs only under BF16.
  DType operands = DType::F32;
  // Sliding-window attention (Gemma 4's sliding layers), 0 = none. Causal: a query at position
  // q sees keys k with q - window < k <= q. Bidirectional (mask None): every query of a sequence sees the
  // keys at or after q0 - (window - 1), q0 the position of the sequence's first query row (a canvas over
  // a cache sees the last window - 1 cached positions, identically for each of its rows: Hugging Face's
  // sliding cache in DiffusionGemma's decoder).
  int window = 0;
};
// SparseD pattern selection (sparse_select): block-wise importance of one layer's attention and the
// head-specific tiles kept, with the paper's isolated selection of prompt and generation keys.
struct SparseSelectParams {
  float scale = 0.0f;         // softmax scale of the scores (1/sqrt(head_dim))
  int block = 32;             // tile side in query rows and key rows
  float rho = 0.5f;           // kept fraction of each key set, in [0, 1]
  int64_t n_prompt_keys = 0;  // keys [0, n_prompt_keys) are the prompt
  // Block-causal models (LLaDA2; CPU only): the attention block of the mask (a query at position p sees
  // the keys of positions < (p / attn_block + 1) * attn_block; the others count 0), the query rows'
  // positions (ascending; the keys are positions [0, key rows)) and the pattern's strides (the whole
  // canvas's query and key blocks): the call writes the pattern rows of its rows' query blocks only,
  // every key block past its keys 0. attn_block 0: rows are positions 0.., strides from the rows.
  int attn_block = 0;
  const int32_t* q_pos = nullptr;
  int64_t n_qb = 0, n_kb = 0;
  DType operands = DType::F32;  // as AttnParams::operands: BF16 lets the scores use bf16 q and k
};
// Tiles kept per key set of n blocks: floor(n * rho) + 1, at most n (0 for an empty set).
inline int64_t sparse_keep(int64_t n, float rho) {
  if (n <= 0) return 0;
  return std::min<int64_t>(n, static_cast<int64_t>(std::floor(static_cast<double>(n) * rho)) + 1);
}
inline size_t attn_kv_scratch_bytes(int64_t n_kv, int64_t kv_width) {
  return static_cast<size_t>(n_kv * kv_width) * 2 * 2;  // K and V, bf16
}
inline size_t attn_q_scratch_bytes(int64_t n_q, int64_t q_width) {
  return static_cast<size_t>(n_q * q_width) * 2;  // bf16
}

// Mixture-of-experts routing (LLaDA-MoE: softmax, no renormalisation; LLaDA2: sigmoid + expert bias
// for selection, groups, renormalised and scaled).
enum class MoeScore : uint8_t { Softmax, Sigmoid };
struct MoeShare;
struct MoeRouteParams {
  MoeScore score = MoeScore::Softmax;
  int top_k = 1;
  bool norm_topk = false;               // weights /= sum of the top-k scores (+1e-20)
  float scale = 1.0f;                   // routed scaling factor applied to the final weights
  int n_group = 1, topk_group = 1;      // grouped selection: keep the topk_group groups whose top-2
                                        // (biased) scores sum highest, then pick top_k inside them
  const float* expert_bias = nullptr;   // [E] f32 device memory or nullptr; selection only
  const MoeShare* share = nullptr;      // Dynamic Expert Sharing for this call, or nullptr
  const float* expert_scale = nullptr;  // [E] f32 device memory or nullptr: weights *= expert_scale[id]
};

// Dynamic Expert Sharing (DES, algorithms.md 4): the tokens decoded in parallel agree on a coreset C of
// experts, and rows route inside it. Per layer and forward, a state of 5 * E f32 in backend memory
// (zeroed by the caller before the forward) accumulates over the calls of that layer:
//   [0, E)    votes V[e] = sum over voting rows n of s[n, e] * 1[e in TopK_n] (s the unbiased score,
//             TopK_n the row's normal selection)
//   [E, 2E)   seq[e] = voting rows with e among the first k of their TopK_n
//   [2E, 3E)  hit[e] = 1 when some row of the forward was routed to e (after sharing)
//   [3E, 4E)  hit_vote[e] = 1 when some voting row was routed to e
//   [4E, 5E)  core[e] = 1 for e in C (written by every applying call)
// C: Seq = {e : seq[e] > 0}; Vote = the m_core experts of highest V among V > 0 (ties to the lower id);
// then, while |C| < top_k, the best remaining expert by (V, lower id) joins. No voting row in the
// forward (V and seq all zero): C = every expert, routing is unchanged. Constrained routing of a share
// row: ids = its top_k experts of C by selection score b (group limits do not apply inside C), weights
// from s exactly as the model normalises them. Rows outside [share_lo, share_hi) route normally.
enum class DesMode : uint8_t { Off, Seq, Vote };
struct MoeShare {
  DesMode mode = DesMode::Off;         // Off: routing unchanged, only hit / hit_vote are recorded
  int k = 1;                           // Seq: experts per voting row that enter the union
  int m_core = 1;                      // Vote: coreset size before the top_k floor
  int64_t vote_lo = 0, vote_hi = 0;    // rows of this call that vote (the tokens decoded in parallel)
  int64_t share_lo = 0, share_hi = 0;  // rows of this call routed inside C
  bool vote = false;                   // add rows [vote_lo, vote_hi) to V and seq
  bool apply = false;                  // route (share rows inside C) and record hit, hit_vote, core
  float* state = nullptr;              // [5 * E] f32 backend memory, this layer's
};
// The coreset of MoeShare from one layer's votes and seq counts: core[e] = 1 in C, else 0 (host memory).
void des_coreset(const float* votes, const float* seq, int E, DesMode mode, int m_core, int top_k,
                 float* core);

// The experts of one MoE layer. `table` is backend memory holding 3 * n_experts pointers to
// backend memory: gate[0..E), up[0..E), down[0..E); gate/up are [inter, hidden], down [hidden, inter],
// all of dtype `dtype`.
// On the CPU the experts may stay quantized (GGUF): quant[0..3) are the Tensor::quant of the gate,
// up and down weights (-1: plain `dtype`), whose values compute as `dtype`.
struct MoeExperts {
  const void* const* table = nullptr;
  int n_experts = 0;
  int64_t hidden = 0, inter = 0;
  DType dtype = DType::BF16;
  std::array<int16_t, 3> quant{-1, -1, -1};
  // Expert parallelism: this rank computes only the (row, slot) pairs routed to experts
  // [local_lo, local_hi) (local_hi 0: every expert) and, with overwrite, writes out = their weighted sum
  // instead of adding it (a rank other than 0, whose partial sum the all-reduce adds to rank 0's x).
  int local_lo = 0, local_hi = 0;
  bool overwrite = false;
  bool gelu = false;  // gelu_tanh(gate) * up (Gemma 4's experts) instead of silu(gate) * up
  bool partitioned() const { return local_hi > 0 || overwrite; }
  bool local(int id) const { return local_hi == 0 || (id >= local_lo && id < local_hi); }
};
// Scratch bytes moe_ffn may use for M rows with top_k experts each (the graph plans this buffer).
inline size_t moe_scratch_bytes(int64_t rows, int top_k, const MoeExperts& e) {
  const int64_t pairs = rows * top_k;
  const size_t es = dtype_size(e.dtype);
  return static_cast<size_t>(pairs) * (static_cast<size_t>(e.hidden) * (es + 4) +  // gathered x, f32 out
                                       static_cast<size_t>(e.inter) * 2 * es +     // gate, up
                                       16) +                                       // sort keys
         static_cast<size_t>(e.n_experts + 1) * 8 +
         4096;  // + alignment of the sub-buffers
}

// --- Quantized (GGUF) weights on GPU backends ------------------------------------------------
// The ggml types the CUDA backend keeps quantized in device memory (GEMM weights and embedding tables;
// MoE experts are converted at load): its gemm dequantizes tiles of rows into one backend-owned bf16
// (f32 at --precision f32) tile and multiplies each with cuBLASLt; embed dequantizes the rows it reads.
// Other types are converted at load as before.
inline bool cuda_keeps_quantized(int16_t quant) {
  switch (static_cast<GgmlType>(quant)) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return quant >= 0;
    default:
      return false;
  }
}
// The tile: at most kQuantTileBytes (whole multiples of 128 rows, at least 128 rows). The Model counts
// the largest tile of its weights in weight_bytes() and has the backend allocate it at load
// (Backend::reserve_quant_tile); a GEMM of a larger weight grows it.
constexpr size_t kQuantTileBytes = size_t{32} << 20;
inline int64_t quant_tile_rows(int64_t n, int64_t k, DType dt) {
  const auto row = static_cast<int64_t>(static_cast<size_t>(k) * dtype_size(dt));
  const int64_t rows = std::max<int64_t>(128, static_cast<int64_t>(kQuantTileBytes) / row / 128 * 128);
  return std::min(n, rows);
}
inline size_t quant_tile_bytes(int64_t n, int64_t k, DType dt) {
  return static_cast<size_t>(quant_tile_rows(n, k, dt) * k) * dtype_size(dt);
}

// How one row of logits is turned into (token, confidence) on the device.
enum class ConfKind : uint8_t {
  Prob,        // softmax probability of the chosen token (LLaDA low_confidence, Dream maskgit_plus)
  Margin,      // p1 - p2 (Dream topk_margin)
  NegEntropy,  // sum p log(p + 1e-10) (Dream entropy); higher = more certain
  Random,      // uniform [0,1) from the counter RNG (LLaDA random remasking)
};

struct SampleParams {
  ConfKind conf = ConfKind::Prob;
  float temperature = 0.0f;  // 0 = argmax
  bool gumbel = false;       // LLaDA: x0 = argmax(exp(L) / (-log U)^T) with f64 noise; else Dream: sample P
  int top_k = 0;             // 0 = off (Dream)
  float top_p = 1.0f;        // 1 = off (Dream)
  int suppress_token = -1;   // logit set to -inf before anything (LLaDA logits_eos_inf); -1 = none
  uint64_t seed = 0;         // counter RNG key: noise = rng(seed, row_key[i], vocab index)
  // Also return the log-probabilities of the predictions (Denoiser::last_logprobs): the chosen token's
  // and those of the kTopLogprobs most likely tokens, from the raw logits (no temperature, no filter).
  bool logprobs = false;
};
constexpr int64_t kTopLogprobs = 20;  // most likely tokens returned per prediction (OpenAI's limit)

// A rank's rows [lo, lo + n) of a vocabulary of `vocab` tokens split over `ranks` (the LM head under tensor
// parallelism: rank r holds [r V / N, (r + 1) V / N)).
struct VocabShare {
  int64_t lo = 0, n = 0, vocab = 0;
};
inline VocabShare vocab_share(int64_t vocab, int ranks, int rank) {
  const int64_t lo = vocab * rank / ranks, hi = vocab * (rank + 1) / ranks;
  return {lo, hi - lo, vocab};
}

// Counter-based RNG shared by every backend so that CPU and CUDA draw identical noise:
// splitmix64 of (seed, a, b) -> uniform double in (0, 1).
inline uint64_t rng_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline double rng_uniform(uint64_t seed, uint64_t a, uint64_t b) {
  const uint64_t h = rng_mix(seed ^ rng_mix(a ^ rng_mix(b + 0x632be59bd9b4e019ull)));
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// theta^(-2i/rotary_dim) rounded once to f32 (computed in double so that every backend agrees: an
// ulp of inv_freq moves the angle of position 30000 by 2e-3 rad).
inline float rope_inv_freq(float theta, int i, int rotary_dim) {
  return static_cast<float>(1.0 / std::pow(static_cast<double>(theta), 2.0 * i / rotary_dim));
}

// The rotary embedding of one op: RoPE with theta, optionally YaRN-scaled (rope_type "yarn") and with
// the Llama-4 query scale (Ministral-3).
struct RopeParams {
  int rotary_dim = 0;  // rotated dims of each head
  float theta = 10000.0f;
  bool neox = true;  // rotate-half pairs (i, i + rot/2); false: interleaved pairs (2i, 2i+1)
  // YaRN (Hugging Face's _compute_yarn_parameters), on when yarn_factor > 0: pair i's frequency blends
  // theta's (extrapolation) and theta's / yarn_factor (interpolation) with ramp_i = clamp((i - ramp_lo) /
  // (ramp_hi - ramp_lo), 0, 1): inv_freq_i = theta_i * (1 - ramp_i) + theta_i / factor * ramp_i. cos and
  // sin are multiplied by attn_factor (so the rotated dims of q and k are).
  float yarn_factor = 0.0f, ramp_lo = 0.0f, ramp_hi = 0.0f, attn_factor = 1.0f;
  // Llama-4 position scale, on when pos_beta > 0: after the rotation every dim of a row at position p is
  // multiplied by 1 + pos_beta * ln(1 + floor(p / pos_orig)) (1 below pos_orig).
  float pos_beta = 0.0f;
  int pos_orig = 0;
  // Proportional RoPE (Gemma 4's global layers): pair i is (i, i + pair_offset) instead of
  // (i, i + rotary_dim / 2), and its frequency theta^(-2i / freq_dim) instead of theta^(-2i / rotary_dim);
  // 0 = the default. A 512-wide head with 64 rotated pairs: rotary_dim 128, pair_offset 256, freq_dim 512.
  int pair_offset = 0, freq_dim = 0;
};

// Pair i's inverse frequency under p (computed in double, rounded once: identical on every backend).
inline float rope_inv_freq(const RopeParams& p, int i) {
  const int dim = p.freq_dim > 0 ? p.freq_dim : p.rotary_dim;
  const double extra = 1.0 / std::pow(static_cast<double>(p.theta), 2.0 * i / dim);
  if (p.yarn_factor <= 0.0f) return static_cast<float>(extra);
  const double span = p.ramp_hi == p.ramp_lo ? 0.001 : static_cast<double>(p.ramp_hi) - p.ramp_lo;
  const double ramp = std::clamp((i - static_cast<double>(p.ramp_lo)) / span, 0.0, 1.0);
  return static_cast<float>(extra / p.yarn_factor * ramp + extra * (1.0 - ramp));
}

// The Llama-4 position scale of RopeParams at position pos (1 when off).
inline float rope_pos_scale(const RopeParams& p, int32_t pos) {
  if (p.pos_beta <= 0.0f || p.pos_orig <= 0) return 1.0f;
  return 1.0f + p.pos_beta * std::log(1.0f + static_cast<float>(pos / p.pos_orig));
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The device's queue the backend runs its work on (CUDA: its cudaStream_t), for a communicator whose
  // collectives must order with that work (NCCL); null on the CPU.
  virtual void* native_stream() { return nullptr; }

  // --- memory -------------------------------------------------------------------------------
  // Device memory for weights (not part of the planned workspace). Returns a device pointer.
  virtual void* alloc_weights(size_t bytes) = 0;
  virtual void free_weights(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  // Device memory to device memory (the KV cache pool when it grows).
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // --- ops (all outputs are written completely; none allocates memory) ----------------------
  // out[r, :] = table[tokens[r], :] converted to out.dtype. table [V, D] any float dtype.
  virtual void embed(const Tensor& tokens, const Tensor& table, Tensor& out) = 0;

  // y = round_act(x * rsqrt(mean(x^2) + eps)) * w over groups of `group` columns (group = cols for a
  // plain RMSNorm, head_dim for qk-norm). x f32; w [group] any float dtype; y f32 or bf16. When y is
  // bf16 the normalised value is rounded to bf16 before the multiply, then the product again (HF).
  // y may alias x (in place) when both are f32.
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;

  // c[M, N] (=|+=) a[M, K] * w[N, K]^T (+ bias[N]). a and w of one dtype, f32 or bf16 (a quantized w
  // computes as its dtype; on CUDA only the cuda_keeps_quantized types); bias f32 or nullptr; c f32 or
  // bf16. accumulate=true adds into c (c must be f32).
  virtual void gemm(const Tensor& a, const Tensor& w, const Tensor* bias, Tensor& c, bool accumulate) = 0;

  // Mask-only logits: c[i, :] = a[rows[i], :] * w^T for i < rows.numel(). Reads the selected rows
  // of `a` by index; never builds a gathered copy of them in device memory.
  virtual void gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, Tensor& c) = 0;

  // In-place rotary embedding on x [M, H * head_dim] f32 with positions [M] i32. Rotates the first
  // p.rotary_dim dims of each head (RopeParams: the pairs, YaRN, the Llama-4 scale). inv_freq_i =
  // rope_inv_freq(p, i) (the correctly rounded f32 value, identical on every backend); angle =
  // f32(position * inv_freq_i); cos/sin in f32, times p.attn_factor.
  virtual void rope(Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p) = 0;

  // Flash-style attention, never materialising scores: q [Mq, Hq*D] f32, k/v [Mk, Hk*D] f32,
  // out [Mq, Hq*D] f32 or bf16. GQA: query head h uses kv head h / (Hq / Hk).
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads,
                         int n_kv_heads, int head_dim, const AttnParams& p) = 0;

  // SparseD isolated selection for one layer (one sequence: q [Mq, Hq*D] f32 after RoPE, k [Mk, Hk*D]
  // f32 after RoPE; GQA as attention). For query head h and query block qb (rows [qb*B, qb*B+B) of q)
  // the importance of key block kb is the sum over the B x B tile of softmax_j(scale * q_r . k_j), the
  // softmax of each row over ALL keys (the paper's zero-padded mean times B*B: the same ranking). The key
  // blocks split into the prompt set [0, g), g = n_prompt_keys / B (the blocks made only of prompt keys), and
  // the generation set [g, n_kb); each set keeps its sparse_keep(size, rho) most important blocks (ties to
  // the lower block). mask [Hq, n_qb, n_kb] (device memory; AttnParams::block_mask layout) gets 1 for kept
  // tiles, 0 for the others. Nothing is allocated beyond O(Mk) per worker; the scores are never stored.
  virtual void sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                             const SparseSelectParams& p, uint8_t* mask) = 0;

  // out = silu(gate) * up, elementwise; gate/up/out same shape, f32 or bf16; out may alias gate.
  virtual void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) = 0;

  // Per row of logits [R, V] f32: token[r] (i32) and conf[r] (f32) per SampleParams. row_keys [R]
  // i32 (usually the absolute position) index the counter RNG so results do not depend on packing.
  virtual void sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                           Tensor& conf) = 0;

  // Per row of logits [R, V] f32: logprob[r] = log_softmax(logits[r])[target[r]] (f32).
  virtual void token_logprob(const Tensor& logits, const Tensor& target, Tensor& logprob) = 0;

  // Per row of logits [R, V] f32: chosen[r] = log_softmax(logits[r])[token[r]] (f32, as token_logprob),
  // and the K = ids.cols() (<= V) most likely tokens, most likely first (ties to the lower id; NaN
  // logits never chosen): ids [R, K] i32 and their log_softmax values lp [R, K] f32. A row with fewer
  // than K non-NaN logits pads with id -1 and NaN.
  virtual void top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids,
                            Tensor& lp) = 0;

  // Router: logits [M, E] f32 -> ids [M, top_k] i32 and weights [M, top_k] f32 per MoeRouteParams,
  // all in f32: s = softmax(logits) (max-subtracted) or sigmoid(logits); selection scores
  // b = s + expert_bias; with n_group > 1 the experts are split into n_group equal groups of
  // consecutive ids, each scored by the sum of its two highest b, and only the topk_group best groups
  // stay eligible; ids = the top_k eligible experts by b in descending order (ties to the lower expert
  // or group index); weights = s[id] (UNBIASED), / (sum of the top_k s + 1e-20) when norm_topk, then
  // * scale. With p.share (see MoeShare): the call votes and / or applies the layer's coreset; without
  // apply, ids and weights are the normal routing.
  virtual void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) = 0;

  // out[m, :] += sum_j weights[m, j] * down_e(silu(gate_e(x_m)) * up_e(x_m)), e = ids[m, j], computing
  // only the selected experts' rows (x [M, hidden] of the experts' dtype; out [M, hidden] f32). As the
  // dense FFN: gate_e(x) and up_e(x) are rounded to the act dtype, silu(gate) * up is rounded as swiglu
  // does, down_e(.) is f32; the sum over j runs in slot order in f32 and is then added to out. ids must
  // be in [0, n_experts). scratch: at least moe_scratch_bytes(M, top_k, experts) bytes of planned
  // workspace, the only memory used.
  virtual void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& experts,
                       Tensor& scratch, Tensor& out) = 0;

  // KV cache writes: dst[rows[i], :] = src[i, :] for every i < rows.numel(); src and dst have the same
  // columns and either the same dtype (a copy) or src f32 and dst bf16 (rounded to nearest even). rows
  // (i32) must lie in [0, dst.rows()) and be distinct. Other rows of dst keep their values.
  virtual void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst) = 0;
  // dst = src converted elementwise (same element count; f32 <-> bf16, or a copy for equal dtypes).
  virtual void convert(const Tensor& src, Tensor& dst) = 0;
  // KV cache reads: dst[i, :] = src[rows[i], :] for every i < dst.rows(), converted to dst's dtype (src
  // f32 or bf16, dst f32, or equal dtypes: a copy). rows (i32) must lie in [0, src.rows()).
  virtual void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst) = 0;

  // --- uniform-noise diffusion (DiffusionGemma, Gemma 4 blocks); the CPU and CUDA backends implement them,
  // others refuse with one line --------------------------------------------------------------------
  // y (= | +=) rmsnorm(x) * w over groups of `group` columns, w [group] any float dtype or nullptr (no
  // scale); x f32; y f32 (accumulate: y += ..., y f32, not aliasing x) or bf16 (rounded as rmsnorm). y
  // may alias x (f32, not accumulating).
  virtual void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool accumulate,
                          Tensor& y) {
    (void)x, (void)w, (void)group, (void)eps, (void)accumulate, (void)y;
    unsupported("rmsnorm_ex");
  }
  // out = gelu_tanh(gate) * up, elementwise (as swiglu: f32 or bf16, out may alias gate).
  virtual void geglu(const Tensor& gate, const Tensor& up, Tensor& out) {
    (void)gate, (void)up, (void)out;
    unsupported("geglu");
  }
  // x *= s (f32, in place).
  virtual void scale(Tensor& x, float s) {
    (void)x, (void)s;
    unsupported("scale");
  }
  // x = cap * tanh(x / cap) (f32, in place): final logit soft-capping.
  virtual void softcap(Tensor& x, float cap) {
    (void)x, (void)cap;
    unsupported("softcap");
  }
  // The entropy-bound sampler's per-row statistics of logits [R, V] f32 at temperature T = p.temperature
  // (> 0): token[r] = argmax_v L[v] - T log(-log U_v) in f64, U_v = rng_uniform(p.seed, row_keys[r], v) (a
  // sample of softmax(L / T)); argmax[r] = argmax_v L[v]; entropy[r] = -sum p log p of softmax(L / T)
  // (f64, written as f32). Ties go to the lower vocab index.
  virtual void canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p,
                             Tensor& token, Tensor& argmax, Tensor& entropy) {
    (void)logits, (void)row_keys, (void)p, (void)token, (void)argmax, (void)entropy;
    unsupported("canvas_sample");
  }
  // Self-conditioning's soft embeddings: out[R, H] f32 = softmax(logits / temperature) table * scale, with
  // table [V, H] (the embedding); probs [R, V] is scratch in the table's dtype (the probabilities rounded
  // to it, as Hugging Face casts them to the embedding dtype).
  virtual void soft_embed(const Tensor& logits, const Tensor& table, float temperature, float scale,
                          Tensor& probs, Tensor& out) {
    (void)logits, (void)table, (void)temperature, (void)scale, (void)probs, (void)out;
    unsupported("soft_embed");
  }

  // Optional capabilities.
  // Free device memory in bytes (GPU backends), or -1 where the backend does not track it.
  virtual int64_t device_free_bytes() const { return -1; }
  // Total device memory in bytes (GPU backends), or -1.
  virtual int64_t device_total_bytes() const { return -1; }
  // GPU backends: allocate now the tile quantized GEMM weights are dequantized into (quant_tile_bytes of
  // the largest; the Model calls it at load), so that no step allocates it (nor inside a graph capture).
  virtual void reserve_quant_tile(size_t bytes) { (void)bytes; }
  // Whether attention in a graph computing in act reads K and V staged in bf16 in AttnParams::kv_scratch
  // (the graph then plans that buffer: Model's graph_options).
  virtual bool stages_attention_kv(DType act) const {
    (void)act;
    return false;
  }
  // Attention calls a vendor library ran (the CUDA backend's cuDNN path), for tests and benchmarks.
  virtual int64_t attention_library_calls() const { return 0; }
  // Plans (cuDNN graphs) the attention library built: one per new shape; a build costs host time.
  virtual int64_t attention_library_plans() const { return 0; }
  // GEMM primitives (the CPU's oneDNN matmuls) made so far: one per new shape; a make costs host time.
  virtual int64_t gemm_primitives_created() const { return 0; }
  // Step graphs (CUDA graphs): between capture_begin() and capture_end() the ops issued are recorded,
  // not run; capture_end() returns a handle (>= 0) of the recorded sequence, or -1 when the capture
  // failed (an op that cannot be recorded: nothing ran, run the ops again without capture). replay(h)
  // runs a recorded sequence with the memory it was recorded with; graph_nodes(h) counts its kernels
  // and copies; release_graph(h) frees it. Backends without them return false from can_capture().
  virtual bool can_capture() const { return false; }
  virtual void capture_begin() {}
  virtual int64_t capture_end() { return -1; }
  virtual void replay(int64_t handle) {}
  virtual int64_t graph_nodes(int64_t handle) const { return 0; }
  virtual void release_graph(int64_t handle) {}
  // Changes whenever the backend releases memory or code that a recording may use (a library's plans or
  // workspace, a tile that grew): recordings made under an older value must not be replayed.
  virtual uint64_t recording_epoch() const { return 0; }

 protected:
  [[noreturn]] void unsupported(const char* op) const {
    fail(std::string(op) + ": not supported on the " + name() +
         " backend (DiffusionGemma's ops run on the CPU and CUDA backends)");
  }
};

// The CPU attention kernel (attention and sparse_select). Auto: bf16 operands with f32 accumulation
// where the CPU has AVX-512 BF16 and the call allows it (AttnParams::operands BF16), f32 otherwise; the
// environment variable TESSERA_CPU_ATTN=f32 (or bf16) turns Auto into that choice (A/B runs). F32: the
// f32 kernel always (the reference). BF16: the bf16 kernel wherever the call allows it; creating the
// backend fails on a CPU without AVX-512 BF16.
enum class CpuAttention { Auto, F32, BF16 };
// The CPU MoE FFN's schedule. PerExpert: one expert's GEMMs at a time, each spread over every thread (a
// parallel region per GEMM). AcrossExperts: the (expert, row window) items shared out among the threads,
// each item's three GEMMs and activation on one thread (one parallel region for all the experts). Auto:
// AcrossExperts where there are at least two items per thread, else PerExpert; the environment variable
// TESSERA_CPU_MOE=per-expert (or across) turns Auto into that choice (A/B runs). Both give the same bits.
enum class CpuMoe { Auto, PerExpert, AcrossExperts };
struct CpuBackendOptions {
  CpuAttention attention = CpuAttention::Auto;
  CpuMoe moe = CpuMoe::Auto;
  // The bf16 attention kernel rounds K and V to bf16 once per call into a buffer the graph plans
  // (attn_kv_bf16), where a sequence has enough query tiles to reuse them; false: every tile gathers
  // and rounds its own (no buffer planned). Same bits either way. The environment variable
  // TESSERA_CPU_KV_STAGE=0 turns it off (A/B runs).
  bool stage_kv = true;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});
// The kernel `choice` resolves to on this CPU and environment: F32 or BF16 (a BF16 this CPU cannot run
// is an error).
CpuAttention resolve_cpu_attention(CpuAttention choice);
// CpuBackendOptions::stage_kv under the environment (TESSERA_CPU_KV_STAGE=0 or 1; another value is an error).
bool resolve_cpu_kv_stage(bool choice);
// Backend::stages_attention_kv(act) of dev's default backend (make_cpu_backend(), the CUDA backend), for
// planning a graph without one.
inline bool default_stages_attention_kv(Device dev, DType act) {
  if (act != DType::BF16) return false;
  return dev == Device::CUDA ||
         (resolve_cpu_attention(CpuAttention::Auto) == CpuAttention::BF16 && resolve_cpu_kv_stage(true));
}
// Returns nullptr (with a reason) when tessera was built without CUDA or no device is present.
std::unique_ptr<Backend> make_cuda_backend(std::string* why_not);

}  // namespace tessera
