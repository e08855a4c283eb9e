// CPU reference of sample_rows, token_logprob and top_logprobs: one row of f32 logits -> (token,
// confidence), the log-probability of a target token, or the most likely tokens with theirs. The CUDA backend
// is tested against these.
//
// Semantics of one row L[V] with row key r (the absolute position) and seed = p.seed:
//   suppress_token in [0, V): L[suppress] = -inf first.
//   gumbel (LLaDA):  T == 0: x0 = argmax L.  T > 0: x0 = argmax_v L[v] - T * log(-log U_v) in f64,
//                    U_v = rng_uniform(seed, r, v) (log-space form of argmax exp(L) / (-log U)^T).
//                    P = softmax(L) without temperature.
//   not gumbel (Dream sample_tokens): x = L / T (T > 0); top_p filter; then top_k filter (this order,
//                    as Dream does); P = softmax over the kept tokens. T == 0: x0 = argmax P;
//                    T > 0: x0 = inverse CDF of P (ascending vocab order) at u = rng_uniform(seed, r, V).
//   Filters are cut values: a token is kept when its (scaled) logit >= cut, so ties with the last kept
//   logit are kept (Dream's top_k does this; its top_p differs only on exact ties).
//   top_p keeps sorted token i when the cumulative probability before it is <= top_p (Dream), so the
//   most likely token is always kept.
//   Confidence: Prob = P[x0]; Margin = P(1st) - P(2nd); NegEntropy = sum P log(P + 1e-10);
//   Random = rng_uniform(seed, r, V + 1). Ties in argmax go to the lowest vocab index.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/sample_row.h"
#include "backend/cpu/simd.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera {
namespace {

struct RowResult {
  int32_t token = 0;
  float conf = 0.0f;
};

using cpu::kNegInf;
using cpu::RowView;
using Stats = cpu::RowStats;

// Cut value of Dream's top_p filter over the row. The nucleus is found among candidates with
// x >= max - gap: when their mass exceeds top_p, the sorted prefix that crosses top_p lies inside
// them, so only they are sorted (in a thread-local buffer); otherwise the gap widens.
float top_p_cut(const RowView& x, float top_p) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(x.V)) buf.resize(static_cast<size_t>(x.V));
  float m = kNegInf;
  for (int64_t v = 0; v < x.V; ++v) m = std::max(m, x(v));
  if (m == kNegInf) return kNegInf;
  double z = 0.0;
  for (int64_t v = 0; v < x.V; ++v) z += std::exp(static_cast<double>(x(v)) - m);
  for (float gap = 8.0f;; gap *= 2.0f) {
    const float lo = gap > 1e30f ? kNegInf : m - gap;
    size_t n = 0;
    double mass = 0.0;
    for (int64_t v = 0; v < x.V; ++v) {
      const float a = x(v);
      if (a >= lo) {
        buf[n++] = a;
        mass += std::exp(static_cast<double>(a) - m) / z;
      }
    }
    if (mass <= top_p && lo != kNegInf) continue;
    std::sort(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n), std::greater<float>());
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      cum += std::exp(static_cast<double>(buf[i]) - m) / z;
      // Token i + 1 is removed once the cumulative probability up to i exceeds top_p.
      if (cum > top_p) return buf[i];
    }
    return kNegInf;  // rounding: the whole row sums to <= top_p, keep everything
  }
}

// The k-th largest (scaled) logit: Dream's top_k keeps every logit >= it.
float top_k_cut(const RowView& x, int64_t k) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(x.V)) buf.resize(static_cast<size_t>(x.V));
  for (int64_t v = 0; v < x.V; ++v) buf[static_cast<size_t>(v)] = x(v);
  std::nth_element(buf.begin(), buf.begin() + (k - 1), buf.begin() + x.V, std::greater<float>());
  return buf[static_cast<size_t>(k - 1)];
}

// sum over the kept tokens (x >= cut, finite) of e^(x - m), m the row's max kept value. Whole vectors
// of kW logits: e^ in f32 (simd::exp, within 2 ulp) summed per lane over blocks of 64 vectors, each
// block's sum added in f64; the vector holding the suppressed token and the tail: f64 per element.
// Relative to an all-f64 sum the result differs by about 1e-7.
double exp_sum(const RowView& x, float cut, float m) {
  using namespace cpu::simd;
  auto scalar = [&](int64_t a, int64_t b) {
    double z = 0.0;
    for (int64_t v = a; v < b; ++v) {
      const float l = x(v);
      if (l == kNegInf || l < cut) continue;
      z += std::exp(static_cast<double>(l) - m);
    }
    return z;
  };
  const int64_t whole = x.V / kW * kW;
  const vf vcut = splat(cut), vinf = splat(kNegInf);
  double z = 0.0;
  for (int64_t b0 = 0; b0 < whole; b0 += 64 * kW) {
    const int64_t b1 = std::min(whole, b0 + 64 * kW);
    vf acc{};
    for (int64_t v = b0; v < b1; v += kW) {
      if (x.suppress >= v && x.suppress < v + kW) {
        z += scalar(v, v + kW);
        continue;
      }
      vf l = load(x.L + v);
      if (x.scale) l = l / x.t;
      const vi keep = ~(l < vcut) & (l != vinf);  // as the scalar test: NaN is kept (and propagates)
      acc += select(keep, cpu::simd::exp(l - m), vf{});
    }
    z += static_cast<double>(hsum(acc));
  }
  return z + scalar(whole, x.V);
}

}  // namespace

// Max, argmax and runner-up of the kept tokens: per lane over whole vectors of kW logits (each lane
// keeps its first index of its max, its own runner-up), then the lanes merged; the tail element by
// element. Equal to the scalar scan: the runner-up of the multiset is the larger of the lanes'
// runners-up and the other lanes' maxima; NaN logits compare false, so they are never the max.
cpu::RowStats cpu::row_stats(const RowView& x, float cut) {
  using namespace cpu::simd;
  Stats s;
  const int64_t whole = x.V <= std::numeric_limits<int32_t>::max() ? x.V / kW * kW : 0;
  if (whole > 0) {
    vi idx, arg{};
    for (int i = 0; i < kW; ++i) idx[i] = i;
    const vf vcut = splat(cut), vinf = splat(kNegInf);
    vf m1 = vinf, m2 = vinf;
    for (int64_t v = 0; v < whole; v += kW, idx += kW) {
      vf l = load(x.L + v);
      if (x.scale) l = l / x.t;
      l = select(l < vcut, vinf, l);
      if (x.suppress >= v && x.suppress < v + kW)
        l = select(idx == static_cast<int32_t>(x.suppress), vinf, l);
      const vi gt1 = l > m1;
      m2 = select(gt1, m1, select(l > m2, l, m2));
      m1 = select(gt1, l, m1);
      arg = (gt1 & idx) | (~gt1 & arg);
    }
    int best = -1;
    for (int i = 0; i < kW; ++i) {
      if (m1[i] == kNegInf) continue;
      if (best < 0 || m1[i] > m1[best] || (m1[i] == m1[best] && arg[i] < arg[best])) best = i;
    }
    if (best >= 0) {
      s.m1 = m1[best];
      s.arg = arg[best];
      for (int i = 0; i < kW; ++i) s.m2 = std::max(s.m2, i == best ? m2[i] : m1[i]);
    }
  }
  for (int64_t v = whole; v < x.V; ++v) {
    const float a = x(v);
    if (a == kNegInf || a < cut) continue;
    if (a > s.m1) {
      s.m2 = s.m1;
      s.m1 = a;
      s.arg = v;
    } else if (a > s.m2) {
      s.m2 = a;
    }
  }
  if (s.arg < 0) return s;
  s.z = exp_sum(x, cut, s.m1);
  return s;
}

namespace {

float confidence(const RowView& x, float cut, const Stats& s, int64_t x0, const SampleParams& p,
                 uint64_t key) {
  switch (p.conf) {
    case ConfKind::Prob:
      return static_cast<float>(std::exp(static_cast<double>(x(x0)) - s.m1) / s.z);
    case ConfKind::Margin: {
      const double p2 = s.m2 == kNegInf ? 0.0 : std::exp(static_cast<double>(s.m2) - s.m1) / s.z;
      return static_cast<float>(1.0 / s.z - p2);
    }
    case ConfKind::NegEntropy: {
      double h = 0.0;
      for (int64_t v = 0; v < x.V; ++v) {
        const float a = x(v);
        if (a == kNegInf || a < cut) continue;
        const double pv = std::exp(static_cast<double>(a) - s.m1) / s.z;
        h += pv * std::log(pv + 1e-10);
      }
      return static_cast<float>(h);
    }
    case ConfKind::Random:
      return static_cast<float>(rng_uniform(p.seed, key, static_cast<uint64_t>(x.V) + 1));
  }
  return 0.0f;
}

RowResult sample_row(const float* L, int64_t V, uint64_t key, const SampleParams& p) {
  RowView x{L, V, (p.suppress_token >= 0 && p.suppress_token < V) ? p.suppress_token : -1, 1.0f, false};
  float cut = kNegInf;
  if (!p.gumbel) {
    if (p.temperature > 0.0f) {
      x.scale = true;
      x.t = p.temperature;
    }
    if (p.top_p < 1.0f) cut = top_p_cut(x, p.top_p);
    if (p.top_k > 0 && p.top_k < V) cut = std::max(cut, top_k_cut(x, p.top_k));
  }
  const Stats s = row_stats(x, cut);
  if (s.arg < 0) return {0, 0.0f};  // every logit is -inf: nothing to choose from
  int64_t x0 = s.arg;
  if (p.temperature > 0.0f) {
    if (p.gumbel) {
      double best = -std::numeric_limits<double>::infinity();
      const double t = p.temperature;
      for (int64_t v = 0; v < V; ++v) {
        const float a = x(v);
        if (a == kNegInf) continue;
        const double u = rng_uniform(p.seed, key, static_cast<uint64_t>(v));
        const double g = static_cast<double>(a) - t * std::log(-std::log(u));
        if (g > best) {
          best = g;
          x0 = v;
        }
      }
    } else {
      const double target = rng_uniform(p.seed, key, static_cast<uint64_t>(V)) * s.z;
      double acc = 0.0;
      int64_t last = s.arg;
      bool found = false;
      for (int64_t v = 0; v < V; ++v) {
        const float a = x(v);
        if (a == kNegInf || a < cut) continue;
        acc += std::exp(static_cast<double>(a) - s.m1);
        last = v;
        if (acc > target) {
          x0 = v;
          found = true;
          break;
        }
      }
      if (!found) x0 = last;  // rounding at the very end of the CDF
    }
  }
  return {static_cast<int32_t>(x0), confidence(x, cut, s, x0, p, key)};
}

}  // namespace

int64_t cpu::row_top_k(const float* row, int64_t V, int64_t id0, int64_t K, float* vals, int32_t* ids) {
  // A sorted list of the best n so far (value descending; ascending ids enter after equal values, so ties
  // keep the lower id).
  int64_t n = 0;
  for (int64_t v = 0; v < V; ++v) {
    const float x = row[v];
    if (std::isnan(x) || (n == K && !(x > vals[K - 1]))) continue;
    int64_t at = std::min(n, K - 1);
    while (at > 0 && x > vals[at - 1]) {
      vals[at] = vals[at - 1];
      ids[at] = ids[at - 1];
      --at;
    }
    vals[at] = x;
    ids[at] = static_cast<int32_t>(id0 + v);
    n = std::min(n + 1, K);
  }
  return n;
}

void cpu_sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                     Tensor& conf) {
  check_sample_rows(logits, row_keys, token, conf);
  const int64_t R = logits.rows(), V = logits.cols();
  const float* L = logits.as<const float>();
  const int32_t* keys = row_keys.as<const int32_t>();
  int32_t* tok = token.as<int32_t>();
  float* cf = conf.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const auto key = static_cast<uint64_t>(static_cast<int64_t>(keys[r]));
    const RowResult out = sample_row(L + r * V, V, key, p);
    tok[r] = out.token;
    cf[r] = out.conf;
  }
}

void cpu_token_logprob(const Tensor& logits, const Tensor& target, Tensor& logprob) {
  check_token_logprob(logits, target, logprob);
  const int64_t R = logits.rows(), V = logits.cols();
  const float* L = logits.as<const float>();
  const int32_t* tg = target.as<const int32_t>();
  float* out = logprob.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* row = L + r * V;
    const int64_t t = tg[r];
    if (t < 0 || t >= V) {
      out[r] = std::numeric_limits<float>::quiet_NaN();  // out-of-range target: no log-probability
      continue;
    }
    float m = kNegInf;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, row[v]);
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - m);
    out[r] = static_cast<float>(static_cast<double>(row[t]) - m - std::log(z));
  }
}

void cpu_top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids, Tensor& lp) {
  const int64_t R = logits.rows(), V = logits.cols(), K = check_top_logprobs(logits, token, chosen, ids, lp);
  const float* L = logits.as<const float>();
  const int32_t* tok = token.as<const int32_t>();
  float* ch = chosen.as<float>();
  int32_t* id = ids.as<int32_t>();
  float* out = lp.as<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* row = L + r * V;
    int32_t* ri = id + r * K;
    float* ro = out + r * K;
    const int64_t n = cpu::row_top_k(row, V, 0, K, ro, ri);
    float m = kNegInf;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, row[v]);
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - m);
    const double log_z = std::log(z);
    const int64_t t = tok[r];
    ch[r] = t < 0 || t >= V ? std::numeric_limits<float>::quiet_NaN()
                            : static_cast<float>(static_cast<double>(row[t]) - m - log_z);
    for (int64_t j = 0; j < K; ++j) {
      if (j < n) {
        ro[j] = static_cast<float>(static_cast<double>(ro[j]) - m - log_z);  // as token_logprob
      } else {
        ri[j] = -1;
        ro[j] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
}

}  // namespace tessera
