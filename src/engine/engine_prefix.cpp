// The Engine's side of the cross-request prefix cache (prefix_cache.h): a request restores the longest
// stored prefix of its prompt's whole blocks into its slot of the KV pool, and the blocks after it are
// stored once a forward of the request wrote them. Under a memory budget a block is stored only while the
// weights, everything held and the largest step planned so far fit beside it; a step that would not fit
// empties the cache first (release_idle), so the cache never costs a request its memory.
#include <algorithm>

#include "engine/engine.h"

namespace tessera {

size_t Engine::prefix_bytes() const {
  return prefix_ != nullptr ? prefix_->bytes() : 0;
}

PrefixCache::Stats Engine::prefix_stats() const {
  return prefix_ != nullptr ? prefix_->stats() : PrefixCache::Stats{};
}

int64_t Engine::kv_prefix(std::span<const int32_t> canvas, int64_t rows) {
  return kv_prefix(0, canvas, rows, attention_block());
}

int64_t Engine::kv_prefix(int slot, std::span<const int32_t> canvas, int64_t rows, int block) {
  if (prefix_ == nullptr || block <= 0 || !kv_->is_open(slot) || kv_->row_bytes() == 0) return 0;
  rows = std::min<int64_t>(rows, static_cast<int64_t>(canvas.size()));
  const int64_t blocks = rows / block;
  if (blocks == 0) return 0;
  for (int64_t i = 0; i < blocks * block; ++i) check_token(canvas[static_cast<size_t>(i)]);
  const size_t block_bytes = kv_->row_bytes() * static_cast<size_t>(block);
  const std::vector<const void*> hit = prefix_->match(canvas, block, blocks, block_bytes);
  for (size_t b = 0; b < hit.size(); ++b)
    kv_->copy_in(slot, static_cast<int64_t>(b) * block, block, hit[b], block);
  if (static_cast<int64_t>(hit.size()) < blocks) {
    if (prefix_pending_.size() <= static_cast<size_t>(slot))
      prefix_pending_.resize(static_cast<size_t>(slot) + 1);
    PendingPrefix& p = prefix_pending_[static_cast<size_t>(slot)];
    p.tokens.assign(canvas.begin(), canvas.begin() + blocks * block);
    p.block = block;
    p.from = static_cast<int64_t>(hit.size());
    p.to = blocks;
  }
  return static_cast<int64_t>(hit.size()) * block;
}

void Engine::publish_prefix(int slot) {
  if (prefix_ == nullptr || static_cast<size_t>(slot) >= prefix_pending_.size()) return;
  PendingPrefix& p = prefix_pending_[static_cast<size_t>(slot)];
  if (p.to == 0 || !kv_->written(slot, p.from * p.block, p.to * p.block, p.block)) return;
  const size_t block_bytes = kv_->row_bytes() * static_cast<size_t>(p.block);
  // Beside the weights, the pool, the patterns, the cache itself and the largest step planned so far.
  const auto fits = [&](size_t bytes) {
    return opt_.memory_budget == 0 || held_fits(kv_->bytes() + others_held(false) + max_peak_, bytes);
  };
  const int64_t stored = prefix_->insert(
      p.tokens, p.block, p.from, p.to, block_bytes,
      [&](int64_t b, void* dst) { kv_->copy_out(slot, b * p.block, p.block, dst); }, fits);
  if (stored > 0) {
    backend_->synchronize();
    if (opt_.memory_budget > 0) plans_.clear();  // the activation budget shrank
  }
  p = {};
}

}  // namespace tessera
