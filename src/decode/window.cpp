// Window-Diffusion's row policy (algorithms.md 3), bidirectional models: forwards run in phases of
// window_refresh forwards. A phase's first forward (the refresh) computes the canvas up to the end of
// its external window (the first window_ex undecided positions from the first undecided one) and
// caches every row's K / V; the far field after it is in no forward of the phase (positions stay
// absolute). Each step's candidates are the active set (the first window_in undecided positions of the
// window) inside the current block; later forwards of the phase compute only the positions that were
// undecided at the phase start up to the active set's end, and reuse the cached K / V of every other
// row. A phase ends early when its window has no undecided position left. window_refresh 0: no cache,
// every forward computes the whole window (pruning only). A schedule's counts are capped at the active
// set (the rest carries to the next step); what a block's schedule leaves undecided is decided a whole
// active set per step (finish_block). With an infilling suffix the far field lies between the window
// and the suffix: it stays in every forward (the suffix must be seen), so the window selects the active
// set and caches rows but prunes nothing.
// Block-causal models (LLaDA2) keep their block grid: forwards see at most the canvas up to the current
// block's end (later blocks are not yet visible), every block starts a new phase, and a refresh
// recomputes only the rows whose cached K / V are stale (from the previous block's start at the block's
// first refresh, from the block's start after it): earlier blocks are final, and exact in the cache.
#include <algorithm>

#include "decode/policies.h"

namespace tessera::decode {
namespace {

class WindowRows final : public RowPolicy {
 public:
  WindowRows(int ex, int in, int refresh, bool block_causal)
      : ex_(ex), in_(in), refresh_(refresh), block_causal_(block_causal) {}

  void begin_block(Loop& L, int lo, int hi) override {
    (void)L, (void)hi;
    if (!block_causal_) return;  // bidirectional: a phase may go on into the next block
    phase_left_ = 0;
    refresh_from_ = block_lo_;
    block_lo_ = lo;
  }

  bool candidates(Loop& L, int lo, int hi) override {
    const int end = std::min(hi, bound(L));
    bool started = false;
    if (phase_left_ <= 0) {
      new_phase(L);
      started = true;
    }
    for (;;) {
      // The active set: the first in_ positions of the window that are still undecided.
      L.pos.clear();
      int n = 0;
      a_end_ = u0_;
      for (int p = u0_; p < std::min(ext_end_, bound(L)) && n < in_; ++p) {
        if (L.decided[static_cast<size_t>(p)]) continue;
        ++n;
        a_end_ = p + 1;
        if (p >= lo && p < end) L.pos.push_back(p);
      }
      if (!L.pos.empty() || started) return !L.pos.empty();
      new_phase(L);  // the phase's window is used up before its refresh is due
      started = true;
    }
  }

  RowSpec next_rows(Loop& L) override {
    // The far field [ext_end, ...) and everything past an early stop are not part of the forward
    // (with a suffix after it, the far field stays).
    const int n_win = L.o.suffix.empty() ? std::min(ext_end_, bound(L)) : L.stop;
    RowSpec r{RowSpec::Kind::Whole, static_cast<size_t>(n_win)};
    if (refresh_ > 0 && fresh_) {  // refresh: the whole window, every row's K / V into the cache
      r.kind = RowSpec::Kind::Range;
      r.lo = block_causal_ ? refresh_from_ : 0;
      r.hi = n_win;
      if (block_causal_) refresh_from_ = block_lo_;  // the rows before the block are final now
    } else if (refresh_ > 0) {                       // the active set and the positions decided in this phase
      step_rows_.clear();
      for (int32_t row : phase_rows_)
        if (row < a_end_ && row < n_win) step_rows_.push_back(row);
      r.kind = RowSpec::Kind::List;
      r.rows = step_rows_;
    }
    fresh_ = false;
    --phase_left_;
    return r;
  }

  void finish_block(Loop& L, int lo, int hi) override {
    while (!L.ended && candidates(L, lo, hi)) {
      L.predict(L.params(L.g_extra++));
      L.commit_all();
    }
  }

 private:
  // Starts a phase: the external window is the first ex_ undecided positions from the first undecided
  // one (every decided position before stop lies inside it: tokens are only decided inside the active
  // set, which is a prefix of at most in_ <= ex_ of them).
  // Positions from here on are in no forward: an early stop, or (block-causal) the blocks after the
  // current one.
  static int bound(const Loop& L) { return std::min(L.stop, static_cast<int>(L.visible())); }

  void new_phase(Loop& L) {
    const int stop = bound(L);
    u0_ = stop;
    for (int p = L.P; p < stop; ++p) {
      if (!L.decided[static_cast<size_t>(p)]) {
        u0_ = p;
        break;
      }
    }
    phase_rows_.clear();
    ext_end_ = stop;
    for (int p = u0_; p < stop; ++p) {
      if (L.decided[static_cast<size_t>(p)]) continue;
      phase_rows_.push_back(p);
      if (static_cast<int>(phase_rows_.size()) == ex_) {
        ext_end_ = p + 1;
        break;
      }
    }
    phase_left_ = refresh_;
    fresh_ = true;
  }

  int ex_, in_, refresh_;
  bool block_causal_;
  int block_lo_ = 0, refresh_from_ = 0;  // block-causal: the current block's start, the first stale row
  int u0_ = 0, ext_end_ = 0, a_end_ = 0, phase_left_ = 0;
  bool fresh_ = false;
  std::vector<int32_t> phase_rows_, step_rows_;
};

}  // namespace

std::unique_ptr<RowPolicy> make_window_rows(const GenerateOptions& o, const RequestPlan& plan) {
  return std::make_unique<WindowRows>(window_external(o), o.window_in, o.window_refresh,
                                      plan.attention_block > 0);
}

}  // namespace tessera::decode
