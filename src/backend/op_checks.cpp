#include "backend/op_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace tessera {
namespace {

const char* device_tag(Device dev) {
  return dev == Device::CUDA ? "cuda" : "cpu";
}

bool f32_or_bf16(DType t) {
  return t == DType::F32 || t == DType::BF16;
}

}  // namespace

void check_embed(const Tensor& tokens, const Tensor& table, const Tensor& out) {
  TESSERA_CHECK(out.rows() == tokens.numel() && out.cols() == table.cols(), "embed: output shape mismatch");
  TESSERA_CHECK(f32_or_bf16(out.dtype), "embed: output must be f32 or bf16");
}

void check_rmsnorm(const Tensor& x, const Tensor& w, const Tensor& y) {
  TESSERA_CHECK(x.dtype == DType::F32, "rmsnorm: input must be f32");
  const int64_t group = w.numel();
  TESSERA_CHECK(group > 0 && x.numel() % group == 0 && y.numel() == x.numel(), "rmsnorm: shape mismatch");
  TESSERA_CHECK(f32_or_bf16(y.dtype), "rmsnorm: output must be f32 or bf16");
}

void check_gemm(const Tensor& a, const Tensor& w, const Tensor* bias, const Tensor& c, bool accumulate,
                Device dev) {
  TESSERA_CHECK(w.cols() == a.cols(), "gemm: inner dimensions differ");
  TESSERA_CHECK(c.rows() == a.rows() && c.cols() == w.rows(), "gemm: output shape mismatch");
  TESSERA_CHECK(a.dtype == w.dtype,
                std::string("gemm (") + device_tag(dev) + "): activation and weight dtypes must match");
  TESSERA_CHECK(!accumulate || c.dtype == DType::F32, "gemm: accumulate needs an f32 output");
  TESSERA_CHECK(bias == nullptr || (bias->dtype == DType::F32 && bias->numel() == w.rows()),
                "gemm: bias must be f32 [N]");
}

void check_gather_gemm(const Tensor& a, const Tensor& rows, const Tensor& w, const Tensor& c, Device dev) {
  TESSERA_CHECK(w.cols() == a.cols(), "gather_gemm: inner dimensions differ");
  TESSERA_CHECK(c.rows() == rows.numel() && c.cols() == w.rows(), "gather_gemm: output shape mismatch");
  TESSERA_CHECK(a.dtype == w.dtype, std::string("gather_gemm (") + device_tag(dev) +
                                        "): activation and weight dtypes must match");
  TESSERA_CHECK(f32_or_bf16(c.dtype), "gather_gemm: output must be f32 or bf16");
}

void check_rope(const Tensor& x, const Tensor& positions, int head_dim, const RopeParams& p) {
  TESSERA_CHECK(p.pair_offset == 0 ||
                    (p.pair_offset >= p.rotary_dim / 2 && p.pair_offset + p.rotary_dim / 2 <= head_dim),
                "rope: pair_offset must keep every pair inside the head");
  TESSERA_CHECK(p.freq_dim >= 0, "rope: freq_dim must not be negative");
  TESSERA_CHECK(x.dtype == DType::F32, "rope: input must be f32");
  TESSERA_CHECK(p.rotary_dim % 2 == 0 && p.rotary_dim <= head_dim && p.rotary_dim > 0,
                "rope: bad rotary_dim");
  TESSERA_CHECK(head_dim > 0 && x.cols() % head_dim == 0,
                "rope: the row width is not a multiple of head_dim");
  TESSERA_CHECK(positions.numel() == x.rows(), "rope: one position per row expected");
  TESSERA_CHECK(p.theta > 0.0f && std::isfinite(p.theta), "rope: theta must be positive");
  TESSERA_CHECK(p.yarn_factor <= 0.0f || (p.yarn_factor >= 1.0f && p.ramp_lo <= p.ramp_hi),
                "rope: YaRN needs factor >= 1 and ramp_lo <= ramp_hi");
  TESSERA_CHECK(p.pos_beta <= 0.0f || p.pos_orig > 0, "rope: the position scale needs pos_orig > 0");
}

void check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int n_heads,
                     int n_kv_heads, int head_dim, const AttnParams& p, Device dev) {
  TESSERA_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32 && v.dtype == DType::F32,
                std::string("attention (") + device_tag(dev) + "): q, k, v must be f32");
  TESSERA_CHECK(f32_or_bf16(out.dtype), "attention: output must be f32 or bf16");
  TESSERA_CHECK(f32_or_bf16(p.operands), "attention: operands must be f32 or bf16");
  TESSERA_CHECK(head_dim > 0 && head_dim <= 512,
                std::string("attention (") + device_tag(dev) + "): head_dim above 512 is not supported");
  TESSERA_CHECK(p.window >= 0, "attention: the window must not be negative");
  TESSERA_CHECK(
      p.window == 0 || (p.mask != MaskKind::BlockCausal && p.block_mask == nullptr),
      "attention: a sliding window combines with causal or bidirectional attention only, not sparse");
  TESSERA_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "attention: n_heads must be a multiple of n_kv_heads");
  TESSERA_CHECK(q.cols() == int64_t{n_heads} * head_dim && k.cols() == int64_t{n_kv_heads} * head_dim,
                "attention: q/k widths do not match the head counts");
  TESSERA_CHECK(p.block_mask == nullptr || (p.n_seqs == 1 && p.sparse_block > 0),
                "attention: a block-sparse pattern needs one sequence and sparse_block > 0");
  TESSERA_CHECK((p.sparse_q_blocks == 0 && p.sparse_k_blocks == 0) ||
                    (p.block_mask != nullptr && p.sparse_q_blocks > 0 && p.sparse_k_blocks > 0),
                "attention: pattern strides need a block-sparse pattern, and both must be positive");
  TESSERA_CHECK(
      p.sparse_q_blocks == 0 || dev == Device::CPU,
      std::string("attention (") + device_tag(dev) +
          "): a pattern read by position (sparse attention with a KV cache) runs on the CPU backend only");
}

void check_sparse_select(const Tensor& q, const Tensor& k, int n_heads, int n_kv_heads, int head_dim,
                         const SparseSelectParams& p) {
  TESSERA_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32, "sparse_select: q and k must be f32");
  TESSERA_CHECK(head_dim <= 256, "sparse_select: head_dim above 256 is not supported");
  TESSERA_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                "sparse_select: n_heads must be a multiple of n_kv_heads");
  TESSERA_CHECK(q.cols() == int64_t{n_heads} * head_dim && k.cols() == int64_t{n_kv_heads} * head_dim,
                "sparse_select: q/k widths do not match the head counts");
  TESSERA_CHECK(p.block > 0, "sparse_select: block must be > 0");
  TESSERA_CHECK(f32_or_bf16(p.operands), "sparse_select: operands must be f32 or bf16");
  TESSERA_CHECK(p.rho >= 0.0f && p.rho <= 1.0f, "sparse_select: rho must be in [0, 1]");
  TESSERA_CHECK(p.n_prompt_keys >= 0 && p.n_prompt_keys <= k.rows(),
                "sparse_select: n_prompt_keys must be in [0, key rows]");
  TESSERA_CHECK(p.attn_block == 0 ||
                    (p.attn_block > 0 && p.q_pos != nullptr && p.n_kb * p.block >= k.rows() && p.n_qb > 0),
                "sparse_select: a block-causal selection needs the query positions and pattern strides that "
                "cover the keys");
}

void check_swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  TESSERA_CHECK(gate.numel() == up.numel() && out.numel() == gate.numel(), "swiglu: shape mismatch");
  TESSERA_CHECK(f32_or_bf16(gate.dtype) && up.dtype == gate.dtype && out.dtype == gate.dtype,
                "swiglu: dtypes must all be f32 or all bf16");
}

void check_sample_rows(const Tensor& logits, const Tensor& row_keys, const Tensor& token,
                       const Tensor& conf) {
  TESSERA_CHECK(logits.dtype == DType::F32, "sample_rows: logits must be f32");
  auto one_per_row = [&](const Tensor& a, const char* what, DType t) {
    TESSERA_CHECK(a.numel() == logits.rows() && a.dtype == t,
                  std::string("sample_rows: ") + what + " must have one " +
                      (t == DType::I32 ? "i32" : "f32") + " entry per logits row");
  };
  one_per_row(row_keys, "row_keys", DType::I32);
  one_per_row(token, "token", DType::I32);
  one_per_row(conf, "conf", DType::F32);
  TESSERA_CHECK(logits.cols() > 0, "sample_rows: logits have no columns (vocab size 0)");
}

void check_token_logprob(const Tensor& logits, const Tensor& target, const Tensor& logprob) {
  TESSERA_CHECK(logits.dtype == DType::F32, "token_logprob: logits must be f32");
  TESSERA_CHECK(target.numel() == logits.rows() && target.dtype == DType::I32,
                "token_logprob: target must have one i32 entry per logits row");
  TESSERA_CHECK(logprob.numel() == logits.rows() && logprob.dtype == DType::F32,
                "token_logprob: logprob must have one f32 entry per logits row");
}

int64_t check_top_logprobs(const Tensor& logits, const Tensor& token, const Tensor& chosen, const Tensor& ids,
                           const Tensor& lp, int64_t vocab) {
  TESSERA_CHECK(logits.dtype == DType::F32, "top_logprobs: logits must be f32");
  const int64_t R = logits.rows(), V = vocab > 0 ? vocab : logits.cols(), K = ids.ndim == 2 ? ids.cols() : 0;
  TESSERA_CHECK(
      token.numel() == R && token.dtype == DType::I32 && chosen.numel() == R && chosen.dtype == DType::F32,
      "top_logprobs: one i32 token and one f32 output per logits row expected");
  TESSERA_CHECK(ids.dtype == DType::I32 && ids.ndim == 2 && ids.rows() == R && K >= 1 && K <= V,
                "top_logprobs: ids must be i32 [rows, K] with 1 <= K <= vocab");
  TESSERA_CHECK(lp.dtype == DType::F32 && lp.numel() == R * K, "top_logprobs: lp must be f32 [rows, K]");
  return K;
}

void check_moe_route(const Tensor& logits, const MoeRouteParams& p, const Tensor& ids, const Tensor& weights,
                     const MoeRouteLimits& limits) {
  TESSERA_CHECK(logits.dtype == DType::F32, "moe_route: router logits must be f32");
  const int64_t M = logits.rows();
  const int E = static_cast<int>(logits.cols());
  TESSERA_CHECK(E >= 1 && E <= limits.experts,
                "moe_route: 1 to " + std::to_string(limits.experts) + " experts supported");
  TESSERA_CHECK(p.top_k >= 1 && p.top_k <= std::min(E, limits.top_k),
                "moe_route: top_k must be in [1, min(E, " + std::to_string(limits.top_k) + ")]");
  TESSERA_CHECK(
      p.n_group >= 1 && p.n_group <= limits.groups && E % p.n_group == 0 && p.topk_group >= 1 &&
          p.topk_group <= p.n_group,
      std::string("moe_route: n_group must divide the expert count and topk_group be in [1, n_group]") +
          (p.n_group > limits.groups ? " (at most " + std::to_string(limits.groups) + " groups)"
                                     : std::string()));
  TESSERA_CHECK(p.n_group == 1 || int64_t{p.topk_group} * (E / p.n_group) >= p.top_k,
                "moe_route: the kept groups hold fewer than top_k experts");
  TESSERA_CHECK(ids.dtype == DType::I32 && ids.numel() == M * p.top_k,
                "moe_route: ids must be i32 [M, top_k]");
  TESSERA_CHECK(weights.dtype == DType::F32 && weights.numel() == M * p.top_k,
                "moe_route: weights must be f32 [M, top_k]");
  if (p.share != nullptr) check_moe_share(*p.share, M, E, p.top_k);
}

void check_moe_share(const MoeShare& sh, int64_t rows, int n_experts, int top_k) {
  TESSERA_CHECK(sh.state != nullptr, "moe_route: expert sharing needs its state buffer");
  TESSERA_CHECK(0 <= sh.vote_lo && sh.vote_lo <= sh.vote_hi && sh.vote_hi <= rows && 0 <= sh.share_lo &&
                    sh.share_lo <= sh.share_hi && sh.share_hi <= rows,
                "moe_route: expert sharing rows outside the call's " + std::to_string(rows) + " rows");
  TESSERA_CHECK(sh.mode != DesMode::Seq || (sh.k >= 1 && sh.k <= top_k),
                "moe_route: DES-Seq k must be in [1, top_k = " + std::to_string(top_k) + "]");
  TESSERA_CHECK(sh.mode != DesMode::Vote || (sh.m_core >= 1 && sh.m_core <= n_experts),
                "moe_route: the DES-Vote coreset size must be in [1, " + std::to_string(n_experts) + "]");
}

void check_moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExperts& e,
                   const Tensor& scratch, const Tensor& out) {
  const int64_t M = x.rows(), H = e.hidden;
  TESSERA_CHECK(e.n_experts >= 1 && e.table != nullptr, "moe_ffn: no expert table");
  TESSERA_CHECK(x.cols() == H && x.dtype == e.dtype, "moe_ffn: x must be [M, hidden] of the experts' dtype");
  TESSERA_CHECK(out.dtype == DType::F32 && out.rows() == M && out.cols() == H,
                "moe_ffn: out must be f32 [M, hidden]");
  TESSERA_CHECK(e.local_hi == 0 || (e.local_lo >= 0 && e.local_lo < e.local_hi && e.local_hi <= e.n_experts),
                "moe_ffn: the rank's experts [" + std::to_string(e.local_lo) + ", " +
                    std::to_string(e.local_hi) + ") must be a range inside [0, " +
                    std::to_string(e.n_experts) + ")");
  if (M == 0) return;
  TESSERA_CHECK(ids.dtype == DType::I32 && ids.numel() % M == 0, "moe_ffn: ids must be i32 [M, top_k]");
  const int64_t k = ids.numel() / M;
  TESSERA_CHECK(weights.dtype == DType::F32 && weights.numel() == M * k,
                "moe_ffn: weights must be f32 [M, top_k]");
  const size_t contract = moe_scratch_bytes(M, static_cast<int>(k), e);
  TESSERA_CHECK(scratch.nbytes() >= contract,
                "moe_ffn: scratch of " + std::to_string(scratch.nbytes()) +
                    " bytes is smaller than moe_scratch_bytes() = " + std::to_string(contract));
}

void check_scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  const bool round = src.dtype == DType::F32 && dst.dtype == DType::BF16;
  TESSERA_CHECK((src.dtype == dst.dtype || round) && src.cols() == dst.cols(),
                "scatter_rows: src and dst must have the same columns and dtype (or f32 into bf16)");
  TESSERA_CHECK(rows.dtype == DType::I32 && rows.numel() == src.rows(),
                "scatter_rows: one i32 row index per source row expected");
}

void check_gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  const bool widen = src.dtype == DType::BF16 && dst.dtype == DType::F32;
  TESSERA_CHECK((src.dtype == dst.dtype || widen) && src.cols() == dst.cols(),
                "gather_rows: src and dst must have the same columns and dtype (or bf16 into f32)");
  TESSERA_CHECK(rows.dtype == DType::I32 && rows.numel() == dst.rows(),
                "gather_rows: one i32 row index per destination row expected");
}

void check_convert(const Tensor& src, const Tensor& dst) {
  TESSERA_CHECK(src.numel() == dst.numel(), "convert: element counts differ");
  TESSERA_CHECK(src.dtype == dst.dtype || (f32_or_bf16(src.dtype) && f32_or_bf16(dst.dtype)),
                "convert: only f32 <-> bf16");
}

void check_rmsnorm_ex(const Tensor& x, const Tensor* w, int64_t group, bool accumulate, const Tensor& y) {
  TESSERA_CHECK(x.dtype == DType::F32, "rmsnorm: input must be f32");
  TESSERA_CHECK(group > 0 && x.numel() % group == 0 && y.numel() == x.numel(), "rmsnorm: shape mismatch");
  TESSERA_CHECK(w == nullptr || w->numel() == group, "rmsnorm: the weight must have `group` values");
  TESSERA_CHECK(f32_or_bf16(y.dtype), "rmsnorm: output must be f32 or bf16");
  TESSERA_CHECK(!accumulate || (y.dtype == DType::F32 && y.data != x.data),
                "rmsnorm: accumulating needs an f32 output apart from the input");
}

void check_scale(const Tensor& x, const char* op) {
  TESSERA_CHECK(x.dtype == DType::F32, std::string(op) + ": f32 expected");
}

void check_canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p,
                         const Tensor& token, const Tensor& argmax, const Tensor& entropy) {
  const int64_t R = logits.rows();
  TESSERA_CHECK(logits.dtype == DType::F32 && logits.cols() > 0, "canvas_sample: logits must be f32 [R, V]");
  TESSERA_CHECK(row_keys.dtype == DType::I32 && row_keys.numel() == R,
                "canvas_sample: row_keys must be i32 [R]");
  TESSERA_CHECK(token.dtype == DType::I32 && token.numel() == R && argmax.dtype == DType::I32 &&
                    argmax.numel() == R && entropy.dtype == DType::F32 && entropy.numel() == R,
                "canvas_sample: token and argmax i32 [R], entropy f32 [R] expected");
  TESSERA_CHECK(p.temperature > 0.0f && std::isfinite(p.temperature),
                "canvas_sample: the temperature must be positive");
}

void check_soft_embed(const Tensor& logits, const Tensor& table, float temperature, const Tensor& probs,
                      const Tensor& out) {
  const int64_t R = logits.rows(), V = logits.cols();
  TESSERA_CHECK(logits.dtype == DType::F32, "soft_embed: logits must be f32");
  TESSERA_CHECK(table.rows() == V && !table.quantized() && f32_or_bf16(table.dtype),
                "soft_embed: the table must be [V, H] f32 or bf16 (not quantized)");
  TESSERA_CHECK(probs.dtype == table.dtype && probs.numel() >= R * V,
                "soft_embed: probs must hold [R, V] of the table's dtype");
  TESSERA_CHECK(out.dtype == DType::F32 && out.rows() == R && out.cols() == table.cols(),
                "soft_embed: out must be f32 [R, H]");
  TESSERA_CHECK(temperature > 0.0f && std::isfinite(temperature),
                "soft_embed: the temperature must be positive");
}

}  // namespace tessera
