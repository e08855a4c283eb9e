// Token editing: LLaDA2.1's draft-and-edit decoding (the joint threshold; specs/llada21-editing.md
// section 3, the official LLaDA2MoeModelLM.generate loop), a transfer schedule for every family: on the
// block grid of block-causal LLaDA2, in the blocks of the generation for the bidirectional models. Each
// step of a block runs one forward over every non-prompt position of the block and, from it:
//   M2T  fills the masks whose candidate's probability is > threshold, or, when there is none, the most
//        confident mask (ties to the lower position);
//   T2T  rewrites the positions decided before the step whose candidate differs from their token with a
//        probability > edit_threshold (0: whenever it differs).
// Both are written at once. A step that starts without a mask is a post step: the block ends before
// the forward once more than max_post_steps of them have run, and after a post step that rewrites
// nothing. Comparisons are strict, and the mask token is never a candidate (a step always fills a mask).
// Sampling is Dream's (decode/unmask.cpp's maskgit_plus): argmax and its probability at temperature 0; at
// temperature > 0 a draw from the tempered, top-k / top-p filtered distribution and its probability there.
// The block's tokens are not final until it ends (Loop::editable_from): stop conditions and
// StepEvent::committed wait for it. With edit_penalty > 0 (SGLang's 2-gram penalty) the forward returns whole
// logit rows (guidance.cpp subtracts the penalty). With LLaDA2's KV cache the next block's first forward
// recomputes this block from its final tokens (rows.cpp), so cached and uncached runs decide the same.
#include <algorithm>
#include <cmath>

#include "decode/policies.h"

namespace tessera::decode {
namespace {

class DraftAndEdit final : public TransferSchedule {
 public:
  DraftAndEdit(float threshold, float edit_threshold, int max_post)
      : threshold_(threshold), edit_threshold_(edit_threshold), max_post_(max_post) {}
  bool splits_steps() const override { return false; }

  void run_block(Loop& L, int lo, int hi, int steps, uint64_t& g) override {
    (void)steps;
    L.editable_from = lo;
    int post = 0;
    for (;;) {
      L.pos.clear();  // every non-prompt position of the block (lo is past the prompt)
      bool active = false;
      for (int p = lo; p < std::min(hi, L.stop); ++p) {
        L.pos.push_back(p);
        active = active || !L.decided[static_cast<size_t>(p)];
      }
      if (L.pos.empty() || (!active && ++post > max_post_)) break;
      L.predict(L.params(g++));
      fill_.clear();
      rewrite_.clear();
      int best = -1;  // the most confident mask (NaN ranks last)
      float best_c = -INFINITY;
      for (size_t i = 0; i < L.pos.size(); ++i) {
        const float c = L.conf[i];
        if (!L.decided[static_cast<size_t>(L.pos[i])]) {
          if (c > threshold_) fill_.push_back(static_cast<int>(i));
          const float key = std::isnan(c) ? -INFINITY : c;
          if (best < 0 || key > best_c) {
            best = static_cast<int>(i);
            best_c = key;
          }
        } else if (c > edit_threshold_ && L.tok[i] != L.canvas[static_cast<size_t>(L.pos[i])]) {
          rewrite_.push_back(static_cast<int>(i));
        }
      }
      if (active && fill_.empty()) fill_.push_back(best);
      L.commit_edits(fill_, rewrite_);
      if (L.ended || (!active && rewrite_.empty())) break;
    }
    // The block is final now: the stop conditions may look at it.
    L.editable_from = INT32_MAX;
    L.advance_committed();
  }

 private:
  float threshold_, edit_threshold_;
  int max_post_;
  std::vector<int> fill_, rewrite_;
};

// Dream's sampler with the probability of the candidate as its confidence (spec section 3 d).
class EditSampling final : public UnmaskPolicy {
 public:
  ConfKind confidence() const override { return ConfKind::Prob; }
  bool gumbel() const override { return false; }
};

}  // namespace

std::unique_ptr<TransferSchedule> make_edit_schedule(const GenerateOptions& o) {
  return std::make_unique<DraftAndEdit>(o.threshold, o.edit_threshold, o.max_post_steps);
}

std::unique_ptr<UnmaskPolicy> make_edit_sampling() {
  return std::make_unique<EditSampling>();
}

}  // namespace tessera::decode
