// Transfer schedules (how many positions each step decides) and the block layouts they run in.
//   LLaDA 1A      semi-autoregressive blocks; get_num_transfer_tokens splits a block's masks over its steps.
//   Dream 1B      timesteps linspace(1, eps, steps + 1); int(n * (1 - s / t)) per step, the last takes
//                 the rest (origin: a coin per position instead). In blocks when block_length < gen_length.
//   threshold 1C  every candidate with conf >= threshold, at least the most confident; the block loops
//                 until decided (steps is not split). LLaDA2: conf > threshold, and at least
//                 max(1, llada_schedule(block_length, steps)[i]) positions at step i of a block.
// RNG: step g (counted over the whole generation: block b, step i -> g = b * steps_per_block + i; one
// per forward under threshold decoding) uses SampleParams.seed = rng_mix(seed + g); host-side draws of
// that step (origin's coin, alg_temp's multinomial) use host_seed = rng_mix(that seed ^
// 0xd1b54a32d192ed03). Steps whose schedule decides nothing run no forward and produce no event.
//
// Block-causal models (LLaDA2MoeModelLM.generate): the blocks are the model's attention blocks on the
// grid of absolute positions [b * block_length, (b + 1) * block_length); the canvas is padded with masks
// to whole blocks (the padding is decided like the rest and dropped); `steps` counts per block; every
// forward sees only the canvas up to the current block's end (exact: earlier blocks never attend to
// later ones).
#include <algorithm>

#include "decode/policies.h"
#include "decode/schedule.h"

namespace tessera::decode {
namespace {

constexpr uint64_t kHostSalt = 0xd1b54a32d192ed03ull;

class LladaSteps final : public TransferSchedule {
 public:
  void run_block(Loop& L, int lo, int hi, int steps, uint64_t& g) override {
    const uint64_t g0 = g;
    g += static_cast<uint64_t>(steps);
    L.undecided(lo, std::min(hi, L.stop));
    const std::vector<int> sched = llada_schedule(static_cast<int>(L.pos.size()), steps);
    size_t owed = 0;  // what the row policy's candidates could not take carries to the next step
    for (int i = 0; i < steps; ++i) {
      const size_t k = static_cast<size_t>(sched[static_cast<size_t>(i)]) + owed;
      if (k == 0) continue;
      if (!L.prepare(lo, hi)) return;
      const SampleParams sp = L.params(g0 + static_cast<uint64_t>(i));
      L.predict(sp);
      const size_t kk = std::min(k, L.pos.size());
      owed = k - kk;
      L.parts.unmask->choose(L, kk, rng_mix(sp.seed ^ kHostSalt));
      L.commit(kk);
      if (L.ended) return;
    }
    L.parts.rows->finish_block(L, lo, hi);
  }
};

class DreamSteps final : public TransferSchedule {
 public:
  explicit DreamSteps(float eps) : eps_(eps) {}
  void run_block(Loop& L, int lo, int hi, int steps, uint64_t& g) override {
    const uint64_t g0 = g;
    g += static_cast<uint64_t>(steps);
    const std::vector<float> ts = dream_timesteps(steps, eps_);
    const UnmaskPolicy& u = *L.parts.unmask;
    for (int i = 0; i < steps; ++i) {
      const float t = ts[static_cast<size_t>(i)], s = ts[static_cast<size_t>(i) + 1];
      const bool last = i == steps - 1;
      const SampleParams sp = L.params(g0 + static_cast<uint64_t>(i));
      const uint64_t host_seed = rng_mix(sp.seed ^ kHostSalt);
      L.undecided(lo, std::min(hi, L.stop));
      if (L.pos.empty()) continue;
      if (u.by_coin()) {
        const float pt = dream_transfer_prob(t, s, last);
        if (!L.prepare(lo, hi)) break;
        size_t m = 0;
        for (int32_t p : L.pos)
          if (rng_uniform(host_seed, static_cast<uint64_t>(p), 0) < pt) L.pos[m++] = p;
        L.pos.resize(m);
        if (m == 0) continue;
        L.predict(sp);
        L.commit_all();
        if (L.ended) return;
        continue;
      }
      const auto k = static_cast<size_t>(dream_transfer_count(static_cast<int>(L.pos.size()), t, s, last));
      if (k == 0) continue;
      if (!L.prepare(lo, hi)) break;
      L.predict(sp);
      const size_t kk = std::min(k, L.pos.size());
      u.choose(L, kk, host_seed);
      L.commit(kk);
      if (L.ended) return;
    }
    L.parts.rows->finish_block(L, lo, hi);
  }

 private:
  float eps_;
};

class ThresholdSteps final : public TransferSchedule {
 public:
  ThresholdSteps(float threshold, bool strict, std::vector<int> min_sched)
      : threshold_(threshold), strict_(strict), min_sched_(std::move(min_sched)) {}
  bool splits_steps() const override { return false; }
  void run_block(Loop& L, int lo, int hi, int steps, uint64_t& g) override {
    (void)steps;
    for (size_t step = 0;; ++step) {
      if (!L.prepare(lo, hi)) return;
      L.predict(L.params(g++));
      L.rank(L.pos.size());
      size_t k = 1;
      auto accept = [&](float c) { return strict_ ? c > threshold_ : c >= threshold_; };
      while (k < L.idx.size() && accept(L.conf[static_cast<size_t>(L.idx[k])])) ++k;
      if (step < min_sched_.size())
        k = std::max(k, std::min(L.idx.size(), static_cast<size_t>(min_sched_[step])));
      else if (!min_sched_.empty())  // LLaDA2 past its `steps` (a window held the block back): all of them
        k = L.idx.size();
      L.commit(k);
      if (L.ended) return;
    }
  }

 private:
  float threshold_;
  bool strict_;
  std::vector<int> min_sched_;
};

void begin_block(Loop& L, int lo, int hi) {
  L.block_lo = lo;
  L.parts.rows->begin_block(L, lo, hi);
  if (L.parts.attention) L.parts.attention->begin_block(L, lo, hi);
  if (L.parts.experts) L.parts.experts->begin_block(L, lo, hi);
}

}  // namespace

std::unique_ptr<TransferSchedule> make_schedule(const GenerateOptions& o, const RequestPlan& plan) {
  if (o.threshold > 0.0f) {
    const bool llada2 = plan.attention_block > 0;  // LLaDA2's strict rule and per-step minimum
    return std::make_unique<ThresholdSteps>(
        o.threshold, llada2, llada2 ? llada_schedule(o.block_length, o.steps) : std::vector<int>{});
  }
  if (is_llada(o.alg)) return std::make_unique<LladaSteps>();
  return std::make_unique<DreamSteps>(o.eps);
}

void run_bidirectional(Loop& L) {
  const GenerateOptions& o = L.o;
  const bool split = L.parts.schedule->splits_steps() && (is_llada(o.alg) || o.block_length < o.gen_length);
  BlockLayout lay = block_layout(o.gen_length, o.block_length, o.steps, split);
  if (!split && L.parts.schedule->splits_steps())
    lay.steps_per_block = o.steps;  // Dream over the whole generation
  L.g_extra =
      L.parts.schedule->splits_steps() ? static_cast<uint64_t>(lay.num_blocks) * lay.steps_per_block : 0;
  uint64_t g = 0;  // the RNG step counter
  for (int b = 0; b < lay.num_blocks; ++b) {
    const int lo = L.P + b * lay.block_length, hi = lo + lay.block_length;
    begin_block(L, lo, hi);
    if (L.ended) break;  // the row policy decided an EOS before the block's steps (tri-mode's seed)
    L.parts.schedule->run_block(L, lo, hi, lay.steps_per_block, g);
    // Every position before hi is decided: an EOS (or a stop sequence) there ends the answer, later
    // blocks are skipped (mid_block_stop: as soon as the decided prefix held it).
    if (L.ended || (!o.mid_block_stop && b + 1 < lay.num_blocks && L.ends_before(L.P, hi))) break;
  }
}

void run_block_causal(Loop& L) {
  const GenerateOptions& o = L.o;
  const int BL = o.block_length;
  const auto total = static_cast<int>(L.canvas.size());
  uint64_t g = 0;
  for (int b = L.P / BL; b < total / BL; ++b) {
    const int lo = std::max(b * BL, L.P), hi = (b + 1) * BL;
    L.seen = hi;
    begin_block(L, b * BL, hi);
    L.parts.schedule->run_block(L, lo, hi, o.steps, g);
    if (L.ended || (!o.mid_block_stop && hi < total && L.ends_before(L.P, hi))) break;
  }
}

}  // namespace tessera::decode
