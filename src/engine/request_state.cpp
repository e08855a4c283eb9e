#include "engine/request_state.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "memory/chunk_optimizer.h"

namespace tessera {

void HeldBuffer::free(Backend& backend) {
  if (data != nullptr) backend.free_weights(data);
  data = nullptr;
  bytes = 0;
}

size_t SparseState::check(const ModelConfig& cfg, bool causal, int64_t canvas_len, const SparseConfig& c) {
  TESSERA_CHECK(!causal,
                "sparse attention needs a bidirectional or block-causal model (a causal model's rows see "
                "only the keys before them)");
  TESSERA_CHECK(c.block > 0, "sparse block must be > 0 (got " + std::to_string(c.block) + ")");
  TESSERA_CHECK(std::isfinite(c.rho) && c.rho >= 0.0f && c.rho <= 1.0f,
                "sparse rho must be in [0, 1] (got " + std::to_string(c.rho) + ")");
  TESSERA_CHECK(canvas_len > 0 && canvas_len <= cfg.max_positions,
                "sparse attention: a canvas of " + std::to_string(canvas_len) +
                    " positions does not fit the model's " + std::to_string(cfg.max_positions) +
                    " positions");
  TESSERA_CHECK(c.prompt_len >= 0 && c.prompt_len <= canvas_len,
                "sparse attention: the prompt length must lie in [0, canvas length]");
  return static_cast<size_t>(cfg.sparse_pattern_bytes(canvas_len, c.block));
}

std::string SparseState::describe(int64_t canvas_len, const SparseConfig& c, size_t bytes) {
  return "the sparse attention patterns of a " + std::to_string(canvas_len) + "-position canvas (" +
         memory::format_bytes(static_cast<double>(bytes)) + " at sparse block " + std::to_string(c.block) +
         "; a larger block needs fewer)";
}

void SparseState::begin(int64_t canvas_len, const SparseConfig& c, size_t bytes, int64_t n_layers,
                        int attn_block) {
  canvas_ = canvas_len;
  exec_ = SparseExec{};
  exec_.p.attn_block = attn_block;
  exec_.patterns = static_cast<uint8_t*>(buf_.data);
  exec_.layer_bytes = bytes / static_cast<size_t>(n_layers);
  exec_.p.block = c.block;
  exec_.p.rho = c.rho;
  exec_.p.n_prompt_keys = c.prompt_len;
  on_ = true;
  ready_ = false;
  selected_ = selecting_ = 0;
  phase_ = SparsePhase::Dense;
}

void SparseState::set_phase(SparsePhase p) {
  TESSERA_CHECK(on_, "sparse attention: sparse_begin must start the request first");
  TESSERA_CHECK(p != SparsePhase::Sparse || ready_,
                "sparse attention: no pattern yet; a Select forward must build it first");
  phase_ = p;
}

const SparseExec* SparseState::step(const graph::StepShape& shape, bool kv_cache) {
  if (!on_ || phase_ == SparsePhase::Dense) return nullptr;
  exec_.select = phase_ == SparsePhase::Select;
  // A Select forward computes every row of its view (uncached, a KV-cache refresh, a window's refresh);
  // a Sparse one any of its rows against all its keys, over a view no longer than the selected one.
  const int64_t n = shape.n_kv;
  const bool block_causal = exec_.p.attn_block > 0;
  if (block_causal) {  // rows by position at the canvas's strides, selecting or reading
    TESSERA_CHECK(shape.n_seqs == 1 && n <= canvas_,
                  "sparse attention: the patterns are for one canvas of " + std::to_string(canvas_) +
                      " positions; this forward has " + std::to_string(shape.n_seqs) + " sequence(s) of " +
                      std::to_string(n) + " key rows");
    if (exec_.select) selecting_ = n;
    exec_.q_blocks = exec_.k_blocks = (canvas_ + exec_.p.block - 1) / exec_.p.block;
    return &exec_;
  }
  TESSERA_CHECK(shape.n_seqs == 1 && n <= canvas_ && (exec_.select ? shape.n_query == n : n <= selected_),
                "sparse attention: the patterns are for one canvas of " + std::to_string(canvas_) +
                    " positions, selected from a forward over all rows of a prefix of it (the last over " +
                    std::to_string(selected_) + "); this forward has " + std::to_string(shape.n_seqs) +
                    " sequence(s) of " + std::to_string(shape.n_query) + " query and " + std::to_string(n) +
                    " key rows");
  if (exec_.select) {
    selecting_ = n;
    exec_.q_blocks = exec_.k_blocks = 0;
    return &exec_;
  }
  // Rows read the pattern by position unless the forward computes exactly the selected view.
  const bool by_position = kv_cache || n != selected_;
  exec_.q_blocks = by_position ? (selected_ + exec_.p.block - 1) / exec_.p.block : 0;
  exec_.k_blocks = exec_.q_blocks;
  return &exec_;
}

void SparseState::step_done() {
  if (on_ && phase_ != SparsePhase::Dense && exec_.select) {
    ready_ = true;
    selected_ = selecting_;
  }
}

std::vector<uint8_t> SparseState::patterns(Backend& backend, int64_t n_layers) const {
  std::vector<uint8_t> v(ready_ ? exec_.layer_bytes * static_cast<size_t>(n_layers) : 0);
  if (!v.empty()) {
    backend.synchronize();
    backend.copy_to_host(v.data(), buf_.data, v.size());
  }
  return v;
}

bool SparseState::release_if_idle(Backend& backend) {
  if (buf_.data == nullptr || on_) return false;
  buf_.free(backend);
  canvas_ = 0;
  ready_ = false;
  return true;
}

void DesState::check(const ModelConfig& cfg, const DesConfig& c) {
  TESSERA_CHECK(cfg.moe.n_experts > 0, "expert sharing needs a mixture-of-experts model; this " +
                                           cfg.model_type + " model has no experts");
  const int K = static_cast<int>(cfg.moe.top_k);
  TESSERA_CHECK(c.mode != DesMode::Seq || (c.k >= 1 && c.k <= K),
                "des-k must be in [1, " + std::to_string(K) + "] (the model routes each token to " +
                    std::to_string(K) + " experts; got " + std::to_string(c.k) + ")");
  TESSERA_CHECK(c.mode != DesMode::Vote || (std::isfinite(c.beta) && c.beta > 0.0f && c.beta <= 1.0f),
                "des-beta must be in (0, 1] (got " + std::to_string(c.beta) + ")");
}

void DesState::begin(Backend& backend, const ModelConfig& cfg, const DesConfig& c) {
  check(cfg, c);
  const int E = static_cast<int>(cfg.moe.n_experts);
  const size_t layer = static_cast<size_t>(5 * E);
  const size_t bytes = layer * static_cast<size_t>(cfg.n_layers) * sizeof(float);
  if (bytes > buf_.bytes) {
    buf_.free(backend);
    buf_.data = backend.alloc_weights(bytes);
    buf_.bytes = bytes;
  }
  host_.assign(buf_.bytes / sizeof(float), 0.0f);
  exec_ = DesExec{};
  exec_.share.mode = c.mode;
  exec_.share.k = c.mode == DesMode::Seq ? c.k : 1;
  exec_.share.m_core = std::clamp(static_cast<int>(std::floor(static_cast<double>(c.beta) * E)), 1, E);
  exec_.all_rows = c.all_rows;
  exec_.state = static_cast<float*>(buf_.data);
  exec_.layer_floats = layer;
  stats_ = MoeStats{};
  lo_ = hi_ = 0;
  on_ = true;
}

void DesState::set_rows(int64_t lo, int64_t hi) {
  TESSERA_CHECK(0 <= lo && lo <= hi,
                "expert sharing: the decoded rows must be a range [lo, hi) with 0 <= lo <= hi");
  lo_ = lo;
  hi_ = hi;
}

void DesState::step_rows(std::span<const int32_t> q_pos) {
  if (!on_) return;  // (q_pos is ascending whenever DES is on: one sequence per forward)
  exec_.vote_lo = std::lower_bound(q_pos.begin(), q_pos.end(), lo_) - q_pos.begin();
  exec_.vote_hi = std::lower_bound(q_pos.begin(), q_pos.end(), hi_) - q_pos.begin();
}

const DesExec* DesState::step(Backend& backend, const graph::StepShape& shape) {
  if (!on_) return nullptr;
  TESSERA_CHECK(shape.n_seqs == 1, "expert sharing: one sequence per forward (this forward has " +
                                       std::to_string(shape.n_seqs) + ")");
  std::fill(host_.begin(), host_.end(), 0.0f);
  backend.copy_to_device(buf_.data, host_.data(), buf_.bytes);
  return &exec_;
}

void DesState::step_done(Backend& backend, const ModelConfig& cfg) {
  if (!on_) return;
  backend.synchronize();
  backend.copy_to_host(host_.data(), buf_.data, buf_.bytes);
  const auto E = static_cast<size_t>(cfg.moe.n_experts);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    const float* st = host_.data() + static_cast<size_t>(l) * exec_.layer_floats;
    for (size_t e = 0; e < E; ++e) {
      stats_.unique += st[2 * E + e] > 0.0f ? 1 : 0;
      stats_.unique_voting += st[3 * E + e] > 0.0f ? 1 : 0;
      stats_.coreset += st[4 * E + e] > 0.0f ? 1 : 0;
    }
    ++stats_.layer_forwards;
  }
  ++stats_.forwards;
}

}  // namespace tessera
