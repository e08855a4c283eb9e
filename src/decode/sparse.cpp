// SparseD's attention policy (algorithms.md 2): the first floor(steps * sparse_skip) forwards of the
// request attend exactly, the next one also builds every layer's head-specific pattern over the canvas,
// every later one attends only to the pattern's tiles. Forwards are counted as run (threshold decoding
// too, with `steps` as its nominal length). With a KV cache the selection waits for the first forward
// at or after that count that computes the whole canvas (a block's refresh); later forwards that
// compute some rows read the pattern rows of their positions (the engine's CPU backend).
#include <cmath>

#include "decode/policies.h"

namespace tessera::decode {
namespace {

class SparseD final : public AttentionPolicy {
 public:
  explicit SparseD(int64_t select_at) : select_at_(select_at) {}
  void before_forward(Loop& L, const RowSpec& rows) override {
    if (selected_ > 0) {  // Sparse from the forward after the selection on
      if (selected_ == 1) L.den.sparse_phase(SparsePhase::Sparse);
      selected_ = 2;
      return;
    }
    // The selection needs every row of the canvas as queries and keys: an uncached forward, or a KV
    // cache's refresh (the first forward of a block).
    const bool whole =
        rows.view == L.canvas.size() &&
        (rows.kind == RowSpec::Kind::Whole ||
         (rows.kind == RowSpec::Kind::Range && rows.lo == 0 && rows.hi == static_cast<int64_t>(rows.view)));
    const bool select = L.forwards >= select_at_ && whole;
    L.den.sparse_phase(select ? SparsePhase::Select : SparsePhase::Dense);
    if (select) selected_ = 1;
  }

 private:
  int64_t select_at_;
  int selected_ = 0;  // 0 before the selection, 1 after it, 2 once the Sparse phase is set
};

}  // namespace

std::unique_ptr<AttentionPolicy> make_sparse(const GenerateOptions& o) {
  return std::make_unique<SparseD>(
      static_cast<int64_t>(std::floor(static_cast<double>(o.steps) * o.sparse_skip)));
}

}  // namespace tessera::decode
