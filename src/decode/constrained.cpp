// Structured output (GenerateOptions::constraint): the answer is written left to right under a
// TokenConstraint, so that whatever order the model would decide positions in, the text stays a prefix of
// a valid document and can always be completed in the positions left. A diffusion step may decide any
// position, but a token placed before its left neighbours are known cannot be checked against a grammar
// without solving for the holes; this is the documented fallback of issue #32 (docs/ARCHITECTURE.md,
// "Structured output"): each step runs one forward over the block's undecided positions (all of them, so
// the model still sees the whole canvas), the guidance keeps only the allowed tokens at the leftmost one
// (guidance.cpp), which is decided; then the run goes on rightwards over the adjacent positions whose
// predictions the constraint allows and whose confidence reaches the threshold (GenerateOptions::threshold,
// default 0.9), as threshold decoding accepts confident positions. A block loops until it is decided;
// `steps` is not split. Positions past the answer (a block-causal model's padding) are decided freely.
#include <algorithm>

#include "core/error.h"
#include "decode/policies.h"

namespace tessera::decode {
namespace {

class ConstrainedSteps final : public TransferSchedule {
 public:
  explicit ConstrainedSteps(float threshold) : threshold_(threshold) {}
  bool splits_steps() const override { return false; }
  void run_block(Loop& L, int lo, int hi, int steps, uint64_t& g) override {
    (void)steps;
    const int64_t end = static_cast<int64_t>(L.P) + L.G;  // the answer's end
    while (L.prepare(lo, hi)) {
      L.predict(L.params(g++));
      L.idx.clear();
      if (L.pos[0] >= end) {  // padding after the answer
        L.commit_all();
        if (L.ended) return;
        continue;
      }
      for (size_t j = 0; j < L.pos.size() && L.pos[j] < end; ++j) {
        if (j > 0 && (L.pos[j] != L.pos[j - 1] + 1 || !(L.conf[j] >= threshold_))) break;
        const int64_t left = end - L.pos[j] - 1;
        if (!L.grammar->allows(L.tok[j], left)) {
          TESSERA_CHECK(j > 0, "structured output: internal error, the guided token is not allowed");
          break;
        }
        L.grammar->take(L.tok[j]);
        L.idx.push_back(static_cast<int>(j));
      }
      L.commit(L.idx.size());
      if (L.ended) return;
    }
  }

 private:
  float threshold_;
};

}  // namespace

std::unique_ptr<TransferSchedule> make_constrained_schedule(const GenerateOptions& o) {
  return std::make_unique<ConstrainedSteps>(o.threshold > 0.0f ? o.threshold : 0.9f);
}

}  // namespace tessera::decode
