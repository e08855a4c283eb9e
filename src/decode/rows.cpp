// Row policies without a window: every forward recomputes the visible canvas, or (Fast-dLLM's KV cache,
// algorithms.md 1D) the first forward of a block refreshes the whole canvas and later ones compute only
// [block start, end) (prefix) or the block (dual), reading the other rows' K / V from the cache. Both
// caches approximate bidirectional models (cached rows do not see the block's new tokens until the
// next block). On block-causal models they are exact and the same: the first forward of a block
// computes the previous block (final now) and this one, later forwards this block only.
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
    (void)L;
    lo_ = lo;
    hi_ = hi;
    fresh_ = true;
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
};

}  // namespace

std::unique_ptr<RowPolicy> make_cache_rows(const GenerateOptions& o, const RequestPlan& plan) {
  if (o.cache == KvCache::None) return std::make_unique<FullRows>();
  return std::make_unique<CachedRows>(o.cache == KvCache::Dual, plan.attention_block > 0);
}

}  // namespace tessera::decode
