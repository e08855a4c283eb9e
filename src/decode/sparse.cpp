// SparseD's attention policy (algorithms.md 2): the first floor(steps * sparse_skip) forwards of the
// request attend exactly, the next one that computes every row of its view also builds every layer's
// head-specific pattern over that view, and every later one attends only to the pattern's tiles.
// Forwards are counted as run (threshold decoding too, with `steps` as its nominal length).
//   A KV cache: the selection waits for the first forward at or after that count that computes the
//   whole canvas (a block's refresh); later forwards that compute some rows read the pattern rows of
//   their positions (the engine's CPU backend).
//   Window-Diffusion: a forward's view is the canvas up to the end of its window. The pattern is
//   selected again at the first forward after the count that computes every row of its view (a
//   phase's refresh; with window-refresh 0, every forward) when that view differs from the one it was
//   selected over; a forward over a view no longer than the selected one reads it by position, and a
//   longer view the pattern does not cover attends exactly (until its phase's refresh selects).
//   Block-causal models (LLaDA2), within the block grid: in every block, its first floor(steps * skip)
//   forwards attend exactly, the next one selects the pattern rows of the positions it computes (over
//   the keys each sees), and the block's later forwards read them; every pattern row is indexed by
//   position over the whole canvas (the engine's CPU backend).
//   cfg: both canvases run in the same phase; the unconditional forward runs first, so a Select step's
//   pattern is the conditional canvas's (guidance.cpp).
#include <cmath>

#include "decode/policies.h"

namespace tessera::decode {
namespace {

class SparseD final : public AttentionPolicy {
 public:
  SparseD(int64_t select_at, bool block_causal) : select_at_(select_at), block_causal_(block_causal) {}
  void begin_block(Loop& L, int lo, int hi) override {
    (void)L, (void)lo, (void)hi;
    in_block_ = 0;
  }
  void before_forward(Loop& L, const RowSpec& rows) override {
    if (block_causal_) {
      const int64_t i = in_block_++;
      set(L, i < select_at_    ? SparsePhase::Dense
             : i == select_at_ ? SparsePhase::Select
                               : SparsePhase::Sparse);
      return;
    }
    const bool whole =
        rows.kind == RowSpec::Kind::Whole ||
        (rows.kind == RowSpec::Kind::Range && rows.lo == 0 && rows.hi == static_cast<int64_t>(rows.view));
    SparsePhase p = SparsePhase::Dense;
    if (L.forwards >= select_at_ && whole && rows.view != selected_) {
      p = SparsePhase::Select;
      selected_ = rows.view;
    } else if (selected_ > 0 && rows.view <= selected_) {
      p = SparsePhase::Sparse;
    }
    set(L, p);
  }

 private:
  void set(Loop& L, SparsePhase p) {
    if (p != phase_) L.den.sparse_phase(p);
    phase_ = p;
  }
  int64_t select_at_;
  bool block_causal_;
  int64_t in_block_ = 0;  // block-causal: forwards run in the current block
  size_t selected_ = 0;   // the view of the last selection (0: none yet)
  SparsePhase phase_ = SparsePhase::Dense;
};

}  // namespace

std::unique_ptr<AttentionPolicy> make_sparse(const GenerateOptions& o, const RequestPlan& plan) {
  return std::make_unique<SparseD>(
      static_cast<int64_t>(std::floor(static_cast<double>(o.steps) * o.sparse_skip)),
      plan.attention_block > 0);
}

}  // namespace tessera::decode
