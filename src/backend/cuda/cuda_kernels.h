// Launchers of the CUDA backend's kernels (internal to backend/cuda). Every launcher takes the
// backend's stream, checks the launch, and allocates nothing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace tessera::cuda {

// One GEMM problem for the hand-written kernels: C[r, :] = A[arow(r), :] * W_g^T for every output
// row r of group g. Plain gather-GEMM: one group, W = w, rows [0, m). Grouped (MoE): group g owns the
// output rows [group_offsets[g], group_offsets[g+1]) (device array) and uses W = w_table[g].
// arow(r) = a_rows ? a_rows[r] : r: rows of A are read by index straight into shared memory; no
// gathered copy of A is ever written to device memory.
struct MmaProblem {
  const void* a = nullptr;
  DType a_dtype = DType::BF16;
  int64_t lda = 0;                  // elements between rows of A
  const int32_t* a_rows = nullptr;  // [m] or nullptr
  const void* w = nullptr;          // [n, k] (one group)
  const void* const* w_table = nullptr;
  DType w_dtype = DType::BF16;
  const int32_t* group_offsets = nullptr;  // [groups + 1] (device) when grouped
  int groups = 1;
  void* c = nullptr;
  DType c_dtype = DType::F32;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;  // m: output rows (grouped: an upper bound, the total of all groups)
};
// Tensor-core path (bf16 operands, f32 accumulate) when the shapes allow it, else a SIMT kernel.
void mma_gemm(const MmaProblem& p, cudaStream_t s);
// Forces the SIMT kernel (the reference path inside the CUDA backend; also handles f32).
void simt_gemm(const MmaProblem& p, cudaStream_t s);
bool mma_supported(const MmaProblem& p);

void embed(const Tensor& tokens, const Tensor& table, Tensor& out, cudaStream_t s);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, cudaStream_t s);
void rope(Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p, cudaStream_t s);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t s);
// dst[rows[i], :] = src[i, :] (a copy, or f32 rounded into bf16); rows outside [0, dst.rows()) are
// skipped (the engine validates them).
void scatter_rows(const Tensor& src, const Tensor& rows, Tensor& dst, cudaStream_t s);
// dst = src converted elementwise (f32 <-> bf16, or a copy).
void convert(const Tensor& src, Tensor& dst, cudaStream_t s);
// dst[i] = src[rows[i]] (bf16 rows widened to f32, or copied); indices outside src leave the row unwritten.
void gather_rows(const Tensor& src, const Tensor& rows, Tensor& dst, cudaStream_t s);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads, int n_kv_heads,
               int head_dim, const AttnParams& p, cudaStream_t s);
// The generic attention kernel (any head_dim <= 512, sliding windows); the tensor-core kernel is tested
// against it.
void attention_simt(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, int n_heads,
                    int n_kv_heads, int head_dim, const AttnParams& p, cudaStream_t s);
void sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                   const SparseSelectParams& p, uint8_t* mask, cudaStream_t s);
void sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                 Tensor& conf, cudaStream_t s);
void token_logprob(const Tensor& logits, const Tensor& target, Tensor& logprob, cudaStream_t s);
void top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids, Tensor& lp,
                  cudaStream_t s);
void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights, cudaStream_t s);
void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& e, Tensor& scratch,
             Tensor& out, cudaStream_t s);
// Uniform-noise diffusion: the Backend ops of the same names (uniform.cu; canvas_sample and softmax_rows are
// sample.cu's, beside the other per-row sampling kernels).
void rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, float eps, bool accumulate, Tensor& y,
                cudaStream_t s);
void geglu(const Tensor& gate, const Tensor& up, Tensor& out, cudaStream_t s);
// x *= f, or with cap x = f * tanh(x / f) (Backend::scale and Backend::softcap).
void scale(Tensor& x, float f, bool cap, cudaStream_t s);
void canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                   Tensor& argmax, Tensor& entropy, cudaStream_t s);
// probs[r, :] = softmax(logits[r, :] / temperature) in probs' dtype (f32 or bf16): soft_embed's first half.
void softmax_rows(const Tensor& logits, float temperature, Tensor& probs, cudaStream_t s);

// Device top-k over positions: idx[0..k) = indices of the k largest values of conf[0..n) (f32),
// descending, ties to the lower index; entries with conf == -inf are never chosen (idx = -1 then).
void topk_positions(const Tensor& conf, int k, Tensor& idx, cudaStream_t s);

// --- Quantized (GGUF) weights (quant.cu) --------------------------------------------------------
// The types of cuda_keeps_quantized (backend.h); the f32 values are ggml's (core/ggml_quant.cpp) bit for
// bit, bf16 outputs rounded to nearest even. Both fail with one line for any other type.
// dst[i, :] = row r0 + i of the quantized [N, K] weight w for i < n, as `to` (bf16 or f32): a tile of
// n x K values at dst (16-byte aligned).
void dequantize_rows(const Tensor& w, int64_t r0, int64_t n, DType to, void* dst, cudaStream_t s);
// embed of a quantized table: out[r, :] = table[tokens[r], :] dequantized to out.dtype (an id outside
// the table writes NaN, as the plain embed does).
void embed_quant(const Tensor& tokens, const Tensor& table, Tensor& out, cudaStream_t s);

}  // namespace tessera::cuda
