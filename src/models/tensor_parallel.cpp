// Tensor parallelism (Megatron's split): rank r of N keeps heads [r H / N, (r + 1) H / N) of every
// attention (q / k / v column-parallel: their rows; o_proj row-parallel: its columns, and the draft
// adapter's lora_a with them) and the same share of every dense FFN's intermediate (gate / up: rows;
// down: columns). Expert parallelism: rank r of N computes experts [r E / N, (r + 1) E / N) of every MoE
// layer (all ranks route every row: the router is whole), and the shared expert's share under tensor
// parallelism. The graph (blocks.cpp) sums the partial outputs of o_proj and of each split FFN over the
// ranks with one all-reduce each. On the CPU the LM head splits by vocabulary (rank r: rows
// [r V / N, (r + 1) V / N)), its logits never gathered for sampling (engine/vocab_parallel.h). Embedding
// and norms stay whole on every rank.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "models/model.h"

namespace tessera {

namespace {

std::string split_error(const std::string& what, int64_t n, int size) {
  return std::string(what == "experts" ? "--ep " : "--tp ") + std::to_string(size) + ": the model's " + what +
         " (" + std::to_string(n) + ") cannot be split evenly over " + std::to_string(size) + " ranks";
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int size, int ep) {
  TESSERA_CHECK(size >= 1, "--tp must be at least 1");
  TESSERA_CHECK(ep >= 1, "--ep must be at least 1");
  if (ep > 1) {
    TESSERA_CHECK(c.moe.n_experts > 0,
                  "--ep " + std::to_string(ep) + ": this model has no experts (a dense model: use --tp)");
    TESSERA_CHECK(ep <= c.moe.n_experts, "--ep " + std::to_string(ep) + ": more ranks than the model's " +
                                             std::to_string(c.moe.n_experts) + " experts");
    TESSERA_CHECK(c.moe.n_experts % ep == 0, split_error("experts", c.moe.n_experts, ep));
  }
  if (size == 1) return;
  TESSERA_CHECK(c.n_heads % size == 0, split_error("attention heads", c.n_heads, size));
  // More ranks than key / value heads: each rank keeps the one its query heads read (replicated, as
  // Megatron and vLLM do), which needs the ranks to be a multiple of the key / value heads.
  TESSERA_CHECK(c.n_kv_heads % size == 0 || size % c.n_kv_heads == 0,
                split_error("key / value heads", c.n_kv_heads, size) + " (nor replicated: " +
                    std::to_string(size) + " is not a multiple of " + std::to_string(c.n_kv_heads) + ")");
  bool dense_layer = false;
  for (int64_t l = 0; l < c.n_layers; ++l) dense_layer = dense_layer || !c.is_moe_layer(l);
  if (dense_layer)
    TESSERA_CHECK(c.intermediate % size == 0, split_error("FFN intermediate size", c.intermediate, size));
  if (ep > 1 && c.moe.shared_inter > 0)
    TESSERA_CHECK(c.moe.shared_inter % size == 0,
                  split_error("shared expert's size", c.moe.shared_inter, size));
}

ModelConfig tensor_parallel_rank_config(const ModelConfig& c, int tp, int ep) {
  check_tensor_parallel(c, tp, ep);
  ModelConfig r = c;
  r.n_heads = c.n_heads / tp;
  r.n_kv_heads = std::max<int64_t>(1, c.n_kv_heads / tp);
  r.intermediate = c.intermediate / tp;
  if (ep > 1) r.moe.shared_inter = c.moe.shared_inter / tp;  // split with the experts' layer
  return r;
}

int64_t parallel_rank_params(const ModelConfig& c, int tp, int ep, bool split_vocab) {
  const ModelConfig r = tensor_parallel_rank_config(c, tp, ep);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  const int64_t other_experts = ep > 1 ? c.moe.n_experts - c.moe.n_experts / ep : 0;
  // An untied LM head split by vocabulary: rank 0's share (the largest is one row more at most).
  const int64_t other_vocab =
      split_vocab && tp > 1 && !c.tie_embeddings ? c.vocab - vocab_share(c.vocab, tp, 0).n : 0;
  return r.param_count() - moe_layers * other_experts * 3 * c.hidden * c.moe.expert_inter -
         other_vocab * c.hidden;
}

namespace {

// The byte offset and length of columns [col0, col0 + cols) inside a row of t (whole ggml blocks).
std::pair<size_t, size_t> column_bytes(const Tensor& t, int64_t col0, int64_t cols, const char* what) {
  if (!t.quantized())
    return {static_cast<size_t>(col0) * dtype_size(t.dtype), static_cast<size_t>(cols) * dtype_size(t.dtype)};
  const auto type = static_cast<GgmlType>(t.quant);
  const GgmlTypeInfo* info = ggml_type_info(type);
  TESSERA_CHECK(info != nullptr && col0 % info->block == 0 && cols % info->block == 0,
                std::string("--tp: the ") + what +
                    " weight's share of columns does not fall on its quantization " +
                    "blocks; load the model with --dequantize");
  return {ggml_bytes(type, col0), ggml_bytes(type, cols)};
}

}  // namespace

void Model::shard_parallel(int rank, int tp, int ep) {
  const int world = std::max(tp, ep);
  check_tensor_parallel(cfg_, tp, ep);
  TESSERA_CHECK(
      (tp == 1 || tp == world) && (ep == 1 || ep == world),
      "--tp " + std::to_string(tp) + " --ep " + std::to_string(ep) +
          ": each must be 1 or the number of ranks (tensor and expert parallelism share the ranks)");
  TESSERA_CHECK(rank >= 0 && rank < world,
                "rank " + std::to_string(rank) + " outside 0.." + std::to_string(world - 1));
  if (world == 1) return;
  const int64_t hd = cfg_.head_dim, q_heads = cfg_.n_heads / tp,
                kv_heads = std::max<int64_t>(1, cfg_.n_kv_heads / tp);
  // weight_bytes() counts what this rank holds: a slice of a mapped file drops the other rows (never read
  // again); a tensor copied at load is replaced by a copy of the rank's rows or columns and freed.
  auto rows = [&](const Tensor& t, int64_t row0, int64_t n) {
    weight_bytes_ -= static_cast<size_t>(t.rows() - n) * t.row_bytes();
    const Tensor v = t.row_view(row0, n);
    auto it = std::find(owned_.begin(), owned_.end(), t.data);
    if (it == owned_.end()) return v;  // a view of the mapped file: the other rows are never read
    // A copy made at load (converted, or on a device): the rank's rows move to an allocation of their own.
    void* dst = backend_->alloc_weights(v.nbytes());
    backend_->copy_on_device(dst, v.data, v.nbytes());
    backend_->free_weights(*it);
    *it = dst;
    Tensor r = v;
    r.data = dst;
    return r;
  };
  // Columns [col0, col0 + cols) of every row of t, copied into a backend buffer this model owns.
  auto columns = [&](const Tensor& t, int64_t col0, int64_t cols, const char* what) {
    const auto [off, len] = column_bytes(t, col0, cols, what);
    const size_t src_row = t.row_bytes();
    std::vector<char> host(src_row * static_cast<size_t>(t.rows())), out(len * static_cast<size_t>(t.rows()));
    backend_->copy_to_host(host.data(), t.data, host.size());
    for (int64_t r = 0; r < t.rows(); ++r)
      std::memcpy(out.data() + static_cast<size_t>(r) * len,
                  host.data() + static_cast<size_t>(r) * src_row + off, len);
    void* dst = backend_->alloc_weights(out.size());
    weight_bytes_ -= t.nbytes();
    if (auto it = std::find(owned_.begin(), owned_.end(), t.data); it != owned_.end()) {
      backend_->free_weights(t.data);
      owned_.erase(it);
    }
    owned_.push_back(dst);
    backend_->copy_to_device(dst, out.data(), out.size());
    Tensor v = t;
    v.data = dst;
    v.shape[static_cast<size_t>(t.ndim - 1)] = cols;
    weight_bytes_ += out.size();
    return v;
  };
  auto bias = [](Tensor& b, int64_t at, int64_t n) {
    if (b.ndim == 0) return;
    b.data = static_cast<float*>(b.data) + at;
    b.shape[0] = n;
  };
  // A SwiGLU FFN's share: gate / up rows, down columns.
  auto split_ffn = [&](LayerWeights& L, const char* what) {
    const int64_t f = L.w_gate.rows() / tp, f0 = rank * f;
    L.w_gate = rows(L.w_gate, f0, f);
    L.w_up = rows(L.w_up, f0, f);
    L.w_down = columns(L.w_down, f0, f, what);
  };
  // The key / value heads of the rank's query heads (GQA group g = H / KV): its own share, or with more
  // ranks than key / value heads the one head they all read.
  const int64_t group = cfg_.n_heads / cfg_.n_kv_heads;
  const int64_t q0 = rank * q_heads * hd, kv0 = rank * q_heads / group * hd;
  const int64_t qw = q_heads * hd, kvw = kv_heads * hd;
  std::vector<const void*> table;
  for (LayerWeights& L : w_.layers) {
    if (tp > 1) {
      L.wq = rows(L.wq, q0, qw);
      L.wk = rows(L.wk, kv0, kvw);
      L.wv = rows(L.wv, kv0, kvw);
      bias(L.bq, q0, qw);
      bias(L.bk, kv0, kvw);
      bias(L.bv, kv0, kvw);
      L.wo = columns(L.wo, q0, qw, "attention output");
      if (L.lora_a.ndim > 0) L.lora_a = columns(L.lora_a, q0, qw, "draft adapter");
      if (!L.is_moe() && L.w_gate.ndim > 0) split_ffn(L, "FFN down");
    }
    if (L.is_moe() && ep > 1) {
      MoeExperts& e = L.experts;
      const int per = e.n_experts / ep;
      e.local_lo = rank * per;
      e.local_hi = e.local_lo + per;
      e.overwrite = rank != 0;
      // The other ranks' experts are never read here: copies made at load are freed, pages mapped from the
      // file are never touched; both leave the count, and their table entries become null.
      table.resize(static_cast<size_t>(3 * e.n_experts));
      backend_->copy_to_host(table.data(), e.table, table.size() * sizeof(void*));
      for (int p = 0; p < 3; ++p) {
        const auto pq = static_cast<size_t>(p);
        Tensor one(nullptr, e.dtype, {p < 2 ? e.inter : e.hidden, p < 2 ? e.hidden : e.inter});
        one.quant = e.quant[pq];  // an expert's projection, as bind_experts bound it
        const size_t bytes = one.nbytes();
        for (int x = 0; x < e.n_experts; ++x) {
          const void*& ptr = table[static_cast<size_t>(p * e.n_experts + x)];
          if (e.local(x) || ptr == nullptr) continue;
          if (auto it = std::find(owned_.begin(), owned_.end(), ptr); it != owned_.end()) {
            backend_->free_weights(*it);
            owned_.erase(it);
          }
          weight_bytes_ -= bytes;
          ptr = nullptr;
        }
      }
      backend_->copy_to_device(const_cast<void*>(static_cast<const void*>(e.table)), table.data(),
                               table.size() * sizeof(void*));
      if (tp > 1 && L.w_gate.ndim > 0) split_ffn(L, "shared expert down");
    }
  }
  // The LM head by vocabulary (the CPU's samplers combine the ranks' summaries; elsewhere it stays whole).
  // Tied to the embedding, whose lookups need every row: a view of the rank's rows, nothing freed.
  if (tp > 1 && backend_->device() == Device::CPU) {
    const VocabShare share = vocab_share(cfg_.vocab, tp, rank);
    w_.lm_head = w_.lm_head.data == w_.embed.data ? w_.lm_head.row_view(share.lo, share.n)
                                                  : rows(w_.lm_head, share.lo, share.n);
    opts_.vocab_split = share;
  }
  opts_.n_heads = q_heads;
  opts_.n_kv_heads = kv_heads;
  opts_.intermediate = cfg_.intermediate / tp;
  opts_.tp_rank = rank;
  opts_.tp_size = tp;
  opts_.ep_size = ep;
  for (auto& g : graphs_) g.reset();
}

}  // namespace tessera
