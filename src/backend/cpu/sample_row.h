// The per-row pieces of the CPU sampler (sample.cpp) that a vocabulary split across ranks reuses on its
// slice (engine/vocab_parallel.cpp): a row's view after temperature and suppression, and the softmax
// statistics of the tokens a cut keeps. See sample.cpp for the semantics.
#pragma once
#include <cstdint>
#include <limits>

namespace tessera::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Reads logit v after temperature scaling and suppression.
struct RowView {
  const float* L;
  int64_t V;
  int64_t suppress;  // -1 = none
  float t;           // temperature divisor (Dream: logits / T), used when scale
  bool scale;
  float operator()(int64_t v) const {
    if (v == suppress) return kNegInf;
    return scale ? L[v] / t : L[v];
  }
};

// Softmax statistics over the kept tokens (x >= cut, finite): max, argmax (lowest index on ties; -1 when
// none is kept), runner-up value and the normaliser sum exp(x - max).
struct RowStats {
  float m1 = kNegInf, m2 = kNegInf;
  int64_t arg = -1;
  double z = 0.0;
};
RowStats row_stats(const RowView& x, float cut);

// The K most likely of row[0, V): values descending, the lower id first on ties, NaN never; ids are id0 + v.
// Fills vals[0, n) and ids[0, n) and returns n = min(K, the row's non-NaN values).
int64_t row_top_k(const float* row, int64_t V, int64_t id0, int64_t K, float* vals, int32_t* ids);

}  // namespace tessera::cpu
