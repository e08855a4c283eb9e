// Tensor parallelism (Megatron's split): rank r of N keeps heads [r H / N, (r + 1) H / N) of every
// attention (q / k / v column-parallel: their rows; o_proj row-parallel: its columns, and the draft
// adapter's lora_a with them) and the same share of every dense FFN's intermediate (gate / up: rows;
// down: columns). Expert parallelism: rank r of N computes experts [r E / N, (r + 1) E / N) of every MoE
// layer (all ranks route every row: the router is whole), and the shared expert's share under tensor
// parallelism. The graph (blocks.cpp) sums the partial outputs of o_proj and of each split FFN over the
// ranks with one all-reduce each. On the CPU the LM head splits by vocabulary (rank r: rows
// [r V / N, (r + 1) V / N)), its logits never gathered for sampling (engine/vocab_parallel.h). Embedding
// and norms stay whole on every rank. Model::load takes the share layer by layer as the family binds them
// (layer_bound), so a rank's load peaks at its share plus one whole layer, and a sharded load never binds
// the other ranks' experts.
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
  TESSERA_CHECK(!c.is_uniform() || (size == 1 && ep == 1),
                (size > 1 ? "--tp " + std::to_string(size) : "--ep " + std::to_string(ep)) + ": the " +
                    family_name(c.family) + " family has no tensor or expert parallelism yet");
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

int64_t parallel_load_extra_params(const ModelConfig& c, int tp, int ep) {
  if (tp == 1) return 0;
  const ModelConfig r = tensor_parallel_rank_config(c, tp, ep);
  const int64_t d = c.hidden;
  const auto width = [](const ModelConfig& m) {  // q, k, v rows and o_proj columns
    return 2 * m.n_heads * m.head_dim + 2 * m.n_kv_heads * m.head_dim;
  };
  int64_t extra = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    int64_t x = d * (width(c) - width(r)) + c.draft_adapter.rank * (c.n_heads - r.n_heads) * c.head_dim;
    if (!c.is_moe_layer(l))
      x += 3 * d * (c.intermediate - r.intermediate);
    else if (ep > 1)
      x += 3 * d * (c.moe.shared_inter - r.moe.shared_inter);
    extra = std::max(extra, x);
  }
  return extra;
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

void Model::check_shard(const ShardPlan& plan) const {
  const int world = plan.world();
  check_tensor_parallel(cfg_, plan.tp, plan.ep);
  TESSERA_CHECK(
      (plan.tp == 1 || plan.tp == world) && (plan.ep == 1 || plan.ep == world),
      "--tp " + std::to_string(plan.tp) + " --ep " + std::to_string(plan.ep) +
          ": each must be 1 or the number of ranks (tensor and expert parallelism share the ranks)");
  TESSERA_CHECK(plan.rank >= 0 && plan.rank < world,
                "rank " + std::to_string(plan.rank) + " outside 0.." + std::to_string(world - 1));
}

void Model::begin_shard(const ShardPlan& plan) {
  check_shard(plan);
  TESSERA_CHECK(shard_.world() == 1, "the model is already sharded");
  shard_ = plan;
  layer_sharded_.assign(static_cast<size_t>(cfg_.n_layers), 0);
}

void Model::shard_parallel(const ShardPlan& plan) {
  begin_shard(plan);
  if (plan.world() > 1) finish_shard();
}

void Model::layer_bound(int64_t l) {
  if (shard_.world() == 1) return;
  TESSERA_CHECK(l >= 0 && l < static_cast<int64_t>(w_.layers.size()),
                "layer_bound: no layer " + std::to_string(l));
  char& done = layer_sharded_[static_cast<size_t>(l)];
  if (done) return;
  shard_head();  // bound before the layers by every family: its share goes first
  peak_weight_bytes_ = std::max(peak_weight_bytes_, weight_bytes_);
  shard_layer(w_.layers[static_cast<size_t>(l)]);
  done = 1;
}

// weight_bytes() counts what this rank holds: a slice of a mapped file drops the other rows (never read
// again); a tensor copied at load is replaced by a copy of the rank's rows or columns and freed.
Tensor Model::shard_rows(const Tensor& t, int64_t row0, int64_t n) {
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
}

// Columns [col0, col0 + cols) of every row of t, copied into a backend buffer this model owns.
Tensor Model::shard_columns(const Tensor& t, int64_t col0, int64_t cols, const char* what) {
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
}

void Model::shard_layer(LayerWeights& L) {
  const int rank = shard_.rank, tp = shard_.tp, ep = shard_.ep;
  const int64_t hd = cfg_.head_dim, q_heads = cfg_.n_heads / tp,
                kv_heads = std::max<int64_t>(1, cfg_.n_kv_heads / tp);
  auto bias = [](Tensor& b, int64_t at, int64_t n) {
    if (b.ndim == 0) return;
    b.data = static_cast<float*>(b.data) + at;
    b.shape[0] = n;
  };
  // A SwiGLU FFN's share: gate / up rows, down columns.
  auto split_ffn = [&](const char* what) {
    const int64_t f = L.w_gate.rows() / tp, f0 = rank * f;
    L.w_gate = shard_rows(L.w_gate, f0, f);
    L.w_up = shard_rows(L.w_up, f0, f);
    L.w_down = shard_columns(L.w_down, f0, f, what);
  };
  // The key / value heads of the rank's query heads (GQA group g = H / KV): its own share, or with more
  // ranks than key / value heads the one head they all read.
  const int64_t group = cfg_.n_heads / cfg_.n_kv_heads;
  const int64_t q0 = rank * q_heads * hd, kv0 = rank * q_heads / group * hd;
  const int64_t qw = q_heads * hd, kvw = kv_heads * hd;
  if (tp > 1) {
    L.wq = shard_rows(L.wq, q0, qw);
    L.wk = shard_rows(L.wk, kv0, kvw);
    L.wv = shard_rows(L.wv, kv0, kvw);
    bias(L.bq, q0, qw);
    bias(L.bk, kv0, kvw);
    bias(L.bv, kv0, kvw);
    L.wo = shard_columns(L.wo, q0, qw, "attention output");
    if (L.lora_a.ndim > 0) L.lora_a = shard_columns(L.lora_a, q0, qw, "draft adapter");
    if (!L.is_moe() && L.w_gate.ndim > 0) split_ffn("FFN down");
  }
  if (L.is_moe() && ep > 1) {
    MoeExperts& e = L.experts;
    const auto [lo, hi] = shard_.experts(e.n_experts);
    e.local_lo = static_cast<int>(lo);
    e.local_hi = static_cast<int>(hi);
    e.overwrite = rank != 0;
    // The other ranks' experts are never read here: copies made at load are freed, pages mapped from the
    // file are never touched; both leave the count, and their table entries become null (a sharded load
    // never bound them: bind_experts left them null).
    std::vector<const void*> table(static_cast<size_t>(3 * e.n_experts));
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
    if (tp > 1 && L.w_gate.ndim > 0) split_ffn("shared expert down");
  }
}

// The LM head by vocabulary (the CPU's samplers combine the ranks' summaries; elsewhere it stays whole).
// Tied to the embedding, whose lookups need every row: a view of the rank's rows, nothing freed.
void Model::shard_head() {
  if (head_sharded_ || shard_.tp == 1 || backend_->device() != Device::CPU || w_.lm_head.ndim == 0) return;
  const VocabShare share = vocab_share(cfg_.vocab, shard_.tp, shard_.rank);
  w_.lm_head = w_.lm_head.data == w_.embed.data ? w_.lm_head.row_view(share.lo, share.n)
                                                : shard_rows(w_.lm_head, share.lo, share.n);
  opts_.vocab_split = share;
  head_sharded_ = true;
}

void Model::finish_shard() {
  for (size_t l = 0; l < w_.layers.size(); ++l) layer_bound(static_cast<int64_t>(l));
  shard_head();
  const int rank = shard_.rank, tp = shard_.tp;
  opts_.n_heads = cfg_.n_heads / tp;
  opts_.n_kv_heads = std::max<int64_t>(1, cfg_.n_kv_heads / tp);
  opts_.intermediate = cfg_.intermediate / tp;
  opts_.tp_rank = rank;
  opts_.tp_size = tp;
  opts_.ep_size = shard_.ep;
  for (auto& g : graphs_) g.reset();
}

}  // namespace tessera
