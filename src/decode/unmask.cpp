// Unmask policies: which of a step's candidates it decides. The confidence of each prediction comes
// from the device (ConfKind: probability, margin, negative entropy, random); a policy ranks by it,
// samples positions from it (Dream's alg_temp), or decides by a coin per position (Dream's origin).
#include <algorithm>
#include <cmath>

#include "decode/loop.h"
#include "decode/policies.h"

namespace tessera::decode {

void UnmaskPolicy::choose(Loop& L, size_t k, uint64_t host_seed) const {
  (void)host_seed;
  L.rank(k);
}

namespace {

// The k most confident candidates (ties to the lower position): LLaDA's low_confidence and random,
// Dream's maskgit_plus, topk_margin and entropy.
class Ranked final : public UnmaskPolicy {
 public:
  Ranked(ConfKind c, bool gumbel) : conf_(c), gumbel_(gumbel) {}
  ConfKind confidence() const override { return conf_; }
  bool gumbel() const override { return gumbel_; }

 private:
  ConfKind conf_;
  bool gumbel_;
};

// Dream's alg_temp: k candidates sampled without replacement from softmax(conf / alg_temp), the j-th
// draw u = rng_uniform(host_seed, j, 1).
class Sampled final : public UnmaskPolicy {
 public:
  Sampled(ConfKind c, float temp) : conf_(c), temp_(temp) {}
  ConfKind confidence() const override { return conf_; }
  bool gumbel() const override { return false; }
  void choose(Loop& L, size_t k, uint64_t host_seed) const override {
    const std::vector<float>& conf = L.conf;
    const size_t n = L.pos.size();
    float cmax = -INFINITY;
    for (size_t i = 0; i < n; ++i)
      if (!std::isnan(conf[i])) cmax = std::max(cmax, conf[i]);
    std::vector<double> w(n, 0.0);
    for (size_t i = 0; i < n; ++i)
      if (!std::isnan(conf[i]) && conf[i] != -INFINITY)
        w[i] = std::exp((static_cast<double>(conf[i]) - cmax) / temp_);
    std::vector<int>& idx = L.idx;
    idx.clear();
    for (size_t j = 0; j < k; ++j) {
      double total = 0.0;
      for (double x : w) total += x;
      size_t pick = n;
      if (total > 0.0) {
        const double target = rng_uniform(host_seed, j, 1) * total;
        double acc = 0.0;
        for (size_t i = 0; i < n; ++i) {
          if (w[i] <= 0.0) continue;
          acc += w[i];
          pick = i;
          if (acc > target) break;
        }
      }
      if (pick == n) {  // every remaining weight underflowed: lowest undecided position
        for (size_t i = 0; i < n && pick == n; ++i)
          if (std::find(idx.begin(), idx.end(), static_cast<int>(i)) == idx.end()) pick = i;
      }
      idx.push_back(static_cast<int>(pick));
      w[pick] = 0.0;
    }
  }

 private:
  ConfKind conf_;
  float temp_;
};

// Dream's origin: each candidate transfers with probability 1 - s / t (u = rng_uniform(host_seed,
// position, 0)), decided before the forward; every kept one is decided.
class OriginCoin final : public UnmaskPolicy {
 public:
  ConfKind confidence() const override { return ConfKind::Prob; }
  bool gumbel() const override { return false; }
  bool by_coin() const override { return true; }
};

}  // namespace

std::unique_ptr<UnmaskPolicy> make_unmask(const GenerateOptions& o) {
  switch (o.alg) {
    case Unmask::LowConfidence:
      return std::make_unique<Ranked>(ConfKind::Prob, true);
    case Unmask::Random:
      return std::make_unique<Ranked>(ConfKind::Random, true);
    case Unmask::Origin:
      return std::make_unique<OriginCoin>();
    case Unmask::MaskgitPlus:
    case Unmask::TopkMargin:
    case Unmask::Entropy: {
      const ConfKind c = o.alg == Unmask::TopkMargin ? ConfKind::Margin
                         : o.alg == Unmask::Entropy  ? ConfKind::NegEntropy
                                                     : ConfKind::Prob;
      if (o.alg_temp > 0.0f) return std::make_unique<Sampled>(c, o.alg_temp);
      return std::make_unique<Ranked>(c, false);
    }
  }
  return nullptr;
}

}  // namespace tessera::decode
