// Row policies without a window: every forward recomputes the visible canvas, or (Fast-dLLM's KV cache,
// algorithms.md 1D) the first forward of a block refreshes the whole canvas and later ones compute only
// [block start, end) (prefix) or the block (dual), reading the other rows' K / V from the cache. Both
// caches approximate bidirectional models (cached rows do not see the block's new tokens until the
// next block). On block-causal models they are exact and the same: the first forward of a block
// computes the previous block (final now) and this one, later forwards this block only; the first
// block's first forward starts after the prompt's whole blocks that the prefix cache restored.
#include "decode/policies.h"

namespace tessera::decode {
namespace {

class FullRows final : public RowPolicy {
 public:
  RowSpec next_rows(Loop& L) override { return RowSpec{RowSpec::Kind::Whole, L.visible()}; }
};

class CachedRows final : public RowPolicy {
 public:
  CachedRows(bool dual, bool block_causal) : dual_(dual), block_causal_(block_causal) {}
  void begin_block(Loop& L, int lo, int hi) override {
    lo_ = lo;
    hi_ = hi;
    fresh_ = true;
    // Block-causal, before the first forward: the prompt's whole blocks may come from the cross-request
    // prefix cache (exact). Not under SparseD or DES's expert sharing, whose forwards compute those rows
    // otherwise, nor cfg (its second canvas has other tokens); DES's expert counts change no row.
    if (block_causal_ && first_) {
      first_ = false;
      if (!L.parts.attention && L.o.des == DesMode::Off && !L.parts.guidance) {
        const int block = L.plan.attention_block;
        stale_from_ = static_cast<int>(
            L.den.kv_prefix(std::span<const int32_t>(L.canvas), static_cast<int64_t>(L.P / block) * block));
      }
    }
  }
  RowSpec next_rows(Loop& L) override {
    RowSpec r{RowSpec::Kind::Range, L.visible(), lo_, static_cast<int64_t>(L.visible())};
    if (block_causal_) {
      if (fresh_) r.lo = stale_from_;
      if (fresh_) stale_from_ = lo_;  // rows from here on were computed before their block was final
    } else if (fresh_) {
      r.lo = 0;
    } else if (dual_) {
      r.hi = hi_;
    }
    fresh_ = false;
    return r;
  }

 private:
  bool dual_, block_causal_;
  int lo_ = 0, hi_ = 0, stale_from_ = 0;
  bool fresh_ = true;  // until the block's first forward
  bool first_ = true;  // until the generation's first block
};

}  // namespace

std::unique_ptr<RowPolicy> make_cache_rows(const GenerateOptions& o, const RequestPlan& plan) {
  if (o.cache == KvCache::None) return std::make_unique<FullRows>();
  return std::make_unique<CachedRows>(o.cache == KvCache::Dual, plan.attention_block > 0);
}

}  // namespace tessera::decode
