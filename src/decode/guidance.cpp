// Classifier-free guidance (LLaDA's cfg_scale, algorithms.md 1A): each forward runs the canvas and the
// unconditional canvas (the prompt and an infilling suffix masked) for whole logit rows, combines them
// on the host as u + (scale + 1) * (c - u), and samples those rows there (through the host's CPU
// backend: the same kernels as the device's sampling), log-probabilities included. Under a row policy
// that caches (prefix / dual cache, the window's phases) both canvases compute the same rows, each
// reading the other rows from its own cache (KV stream 0 and 1).
#include <algorithm>

#include "core/error.h"
#include "decode/policies.h"

namespace tessera::decode {
namespace {

class Cfg final : public Guidance {
 public:
  explicit Cfg(float scale) : scale_(scale), host_(make_cpu_backend()) {}
  void forward(Loop& L, const RowSpec& rows, const SampleParams& sp) override {
    const size_t n = L.pos.size(), seen = rows.view;
    const auto V = L.V;
    const size_t nv = n * static_cast<size_t>(V);
    lc_.resize(nv);
    lu_.resize(nv);
    const auto view = std::span<const int32_t>(L.canvas).first(seen);
    uncond_.assign(view.begin(), view.end());
    std::fill(uncond_.begin(), uncond_.begin() + L.P, L.mask);  // the condition: the prompt and the suffix
    if (seen > static_cast<size_t>(L.P + L.G)) std::fill(uncond_.begin() + L.P + L.G, uncond_.end(), L.mask);
    if (rows.kind == RowSpec::Kind::Whole) {
      L.den.logits(view, L.pos, lc_);
      L.den.logits(uncond_, L.pos, lu_);
    } else {
      std::span<const int32_t> computed = rows.rows;
      if (rows.kind == RowSpec::Kind::Range) {
        cached_range(rows.lo, rows.hi, static_cast<int64_t>(seen), range_);
        computed = range_;
      }
      L.den.logits_rows(0, view, computed, L.pos, lc_);
      L.den.logits_rows(1, uncond_, computed, L.pos, lu_);
    }
    const float g = scale_ + 1.0f;
    for (size_t i = 0; i < nv; ++i) lc_[i] = lu_[i] + g * (lc_[i] - lu_[i]);
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
  float scale_;
  std::unique_ptr<Backend> host_;
  std::vector<float> lc_, lu_;
  std::vector<int32_t> uncond_, range_;
};

}  // namespace

std::unique_ptr<Guidance> make_guidance(const GenerateOptions& o) {
  return std::make_unique<Cfg>(o.cfg_scale);
}

}  // namespace tessera::decode
