// The argument checks of every Backend op, written once for all backends (op_checks.cpp). Each backend's
// op calls its check before it dispatches, so the implementations may assume valid arguments; they
// check only what their own kernels cannot do (a device limit, a quantized weight on CUDA) and, on the
// CPU, values in host memory (token ids, row indices). Each throws Error naming the op and what is
// wrong. `dev` names the calling backend where a message names it.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace tessera {

void check_embed(const Tensor& tokens, const Tensor& table, const Tensor& out);
void check_rmsnorm(const Tensor& x, const Tensor& w, const Tensor& y);
void check_gemm(const Tensor& a, const Tensor& w, const Tensor* bias, const Tensor& c, bool accumulate,
                Device dev);
void check_gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, const Tensor& c, Device dev);
void check_rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p);
void check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int n_heads,
                     int n_kv_heads, int head_dim, const AttnParams& p, Device dev);
void check_sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                         const SparseSelectParams& p);
void check_swiglu(const Tensor& gate, const Tensor& up, const Tensor& out);
void check_sample_rows(const Tensor& logits, const Tensor& row_keys, const Tensor& token, const Tensor& conf);
void check_token_logprob(const Tensor& logits, const Tensor& target, const Tensor& logprob);
// Returns K (the columns of ids). vocab: the whole vocabulary when logits are a rank's share of it.
int64_t check_top_logprobs(const Tensor& logits, const Tensor& token, const Tensor& chosen, const Tensor& ids,
                           const Tensor& lp, int64_t vocab = 0);

// What a backend's moe_route supports: experts per router, top_k, expert groups.
struct MoeRouteLimits {
  int experts = 0, top_k = 0, groups = 0;
};
void check_moe_route(const Tensor& logits, const MoeRouteParams& p, const Tensor& ids, const Tensor& weights,
                     const MoeRouteLimits& limits);
// `sh` fits a call of `rows` rows of an n_experts router with top_k (part of check_moe_route).
void check_moe_share(const MoeShare& sh, int64_t rows, int n_experts, int top_k);
void check_moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& e,
                   const Tensor& scratch, const Tensor& out);

// Uniform-noise diffusion ops (Backend: rmsnorm_ex ... soft_embed).
void check_rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, bool accumulate, const Tensor& y);
void check_scale(const Tensor& x, const char* op);
void check_canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p,
                         const Tensor& token, const Tensor& argmax, const Tensor& entropy);
void check_soft_embed(const Tensor& logits, const Tensor& table, float temperature, const Tensor& probs,
                      const Tensor& out);

void check_scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst);
void check_gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst);
void check_convert(const Tensor& src, const Tensor& dst);

}  // namespace tessera
