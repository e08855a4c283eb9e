// Logits guided on the host (guidance.cpp): each forward returns whole logit rows of the candidates,
// which the host changes and samples (through the host's CPU backend: the same kernels as the device's
// sampling), log-probabilities included:
//   classifier-free guidance (LLaDA's cfg_scale, algorithms.md 1A): the canvas and the unconditional
//     canvas (the prompt and an infilling suffix masked), combined as u + (scale + 1) * (c - u). Under
//     a row policy that caches (prefix / dual cache, the window's phases) both canvases compute the same
//     rows, each reading the other rows from its own cache (KV stream 0 and 1). Under SparseD both
//     canvases attend over the conditional canvas's pattern.
//   token editing's 2-gram penalty (edit_penalty; SGLang's JointThreshold penalty_lambda): the logit of
//     the token before each candidate in its block (its token at the step's start, a mask or a prompt
//     token included) is lowered by the penalty; the block's first position is not penalised.
//   structured output (GenerateOptions::constraint, constrained.cpp): the first candidate, the leftmost
//     undecided position of the answer, keeps only the tokens the constraint allows there (the text
//     stays completable in the positions after it); the other candidates are left as they are.
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "decode/policies.h"

namespace tessera::decode {
namespace {

class Cfg final : public Guidance {
 public:
  Cfg(float scale, float penalty) : scale_(scale), penalty_(penalty), host_(make_cpu_backend()) {}
  void forward(Loop& L, const RowSpec& rows, const SampleParams& sp) override {
    const size_t n = L.pos.size(), seen = rows.view;
    const auto V = L.V;
    const size_t nv = n * static_cast<size_t>(V);
    lc_.resize(nv);
    const auto view = std::span<const int32_t>(L.canvas).first(seen);
    if (scale_ > 0.0f) {
      lu_.resize(nv);
      uncond_.assign(view.begin(), view.end());
      std::fill(uncond_.begin(), uncond_.begin() + L.P, L.mask);  // the condition: the prompt and the suffix
      if (seen > static_cast<size_t>(L.P + L.G))
        std::fill(uncond_.begin() + L.P + L.G, uncond_.end(), L.mask);
    }
    // The unconditional canvas first: under SparseD a Select step's pattern is then the conditional
    // canvas's, which both canvases read in the Sparse steps after it.
    std::span<const int32_t> computed = rows.rows;
    if (rows.kind == RowSpec::Kind::Range) {
      cached_range(rows.lo, rows.hi, static_cast<int64_t>(seen), range_);
      computed = range_;
    }
    auto forward = [&](int stream, std::span<const int32_t> canvas, std::vector<float>& out) {
      if (rows.kind == RowSpec::Kind::Whole)
        L.den.logits(canvas, L.pos, out);
      else
        L.den.logits_rows(stream, canvas, computed, L.pos, out);
    };
    if (scale_ > 0.0f) forward(1, uncond_, lu_);
    forward(0, view, lc_);
    if (scale_ > 0.0f) {
      const float g = scale_ + 1.0f;
      for (size_t i = 0; i < nv; ++i) lc_[i] = lu_[i] + g * (lc_[i] - lu_[i]);
    }
    if (penalty_ > 0.0f) {
      for (size_t i = 0; i < n; ++i) {
        const int32_t p = L.pos[i];
        if (p - 1 >= L.block_lo)
          lc_[i * static_cast<size_t>(V) + static_cast<size_t>(L.canvas[p - 1])] -= penalty_;
      }
    }
    if (L.grammar && n > 0 && L.pos[0] < L.P + L.G) {
      const int64_t left = static_cast<int64_t>(L.P) + L.G - L.pos[0] - 1;
      float* row = lc_.data();
      bool any = false;
      for (int64_t t = 0; t < V; ++t) {
        if (L.grammar->allows(static_cast<int32_t>(t), left))
          any = true;
        else
          row[t] = -std::numeric_limits<float>::infinity();
      }
      if (!any) fail("structured output: no token of the vocabulary can continue the answer here");
    }
    const auto R = static_cast<int64_t>(n);
    const Tensor logits(lc_.data(), DType::F32, {R, V});
    const Tensor keys(L.pos.data(), DType::I32, {R});
    Tensor t(L.tok.data(), DType::I32, {R}), c(L.conf.data(), DType::F32, {R});
    host_->sample_rows(logits, keys, sp, t, c);
    if (L.o.logprobs) {  // of the guided logits, as the device computes them
      PredictLogprobs& h = L.host_lp;
      h.top = std::min(kTopLogprobs, V);
      h.chosen.resize(n);
      h.top_ids.resize(n * static_cast<size_t>(h.top));
      h.top_lp.resize(h.top_ids.size());
      Tensor chosen(h.chosen.data(), DType::F32, {R});
      Tensor ids(h.top_ids.data(), DType::I32, {R, h.top}), top(h.top_lp.data(), DType::F32, {R, h.top});
      host_->top_logprobs(logits, t, chosen, ids, top);
    }
  }

 private:
  float scale_, penalty_;
  std::unique_ptr<Backend> host_;
  std::vector<float> lc_, lu_;
  std::vector<int32_t> uncond_, range_;
};

}  // namespace

std::unique_ptr<Guidance> make_guidance(const GenerateOptions& o) {
  return std::make_unique<Cfg>(o.cfg_scale, o.edit_penalty);
}

}  // namespace tessera::decode
