#include "engine/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/sample_row.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera {
namespace {

using cpu::kNegInf;
using cpu::RowStats;
using cpu::RowView;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every rank's `mine` (the same length on each), rank after rank.
template <class T>
std::vector<T> gather_all(dist::Communicator& comm, const std::vector<T>& mine) {
  std::vector<T> all(mine.size() * static_cast<size_t>(comm.size()));
  if (!mine.empty()) comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(T));
  return all;
}

// The f32 values in their total order as unsigned keys (negative values reversed), and back.
uint32_t key_of(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
float value_of(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

bool finite_kept(float a) {
  return a != kNegInf && !std::isnan(a);
}

struct Views {
  const float* L;
  int64_t n;
  int64_t suppress;
  float t;
  bool scale;
  RowView operator()(int64_t r) const { return RowView{L + r * n, n, suppress, t, scale}; }
};

// The largest finite value c of each whole (split) row such that pred(row, sum over the ranks of the
// weights of the row's values >= c) holds, or -inf where pred fails at the row's smallest finite value (or
// the row has none). weight(row, a) > 0 is a finite value's share (its mass, or 1 to count); pred is
// monotone (true below the answer, false above). The first round probes the row's max minus kGap (as
// top_p_cut's first gap): a peaked row's answer lies above it, and only the values above it are ever
// weighed; otherwise the values below it are collected and the row's smallest value is checked. Then
// bisection over the values' f32 keys: at most 32 rounds, each an all-gather of one double per row. Each
// rank keeps the values still inside the interval with their weights (the ones above it summed once), so a
// round costs what is left, not the slice; rows go in groups of kGroup to bound that memory.
template <class W, class P>
std::vector<float> largest_value_where(const Views& view, int64_t R, dist::Communicator& comm, W weight,
                                       P pred) {
  constexpr int64_t kGroup = 64;
  constexpr float kGap = 8.0f;  // the first probe: the row's max minus this (top_p_cut's first gap)
  const int ranks = comm.size();
  std::vector<float> out(static_cast<size_t>(R), kNegInf);
  for (int64_t g0 = 0; g0 < R; g0 += kGroup) {
    const int64_t n = std::min(kGroup, R - g0);
    const auto un = static_cast<size_t>(n);
    std::vector<std::vector<std::pair<float, double>>> cand(un);
    std::vector<double> above(un, 0.0), part(un, 0.0);
    std::vector<float> mm(2 * un);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const RowView x = view(g0 + i);
      float lo = std::numeric_limits<float>::infinity(), hi = kNegInf;
      for (int64_t v = 0; v < x.V; ++v) {
        const float a = x(v);
        if (!finite_kept(a)) continue;
        lo = std::min(lo, a);
        hi = std::max(hi, a);
      }
      mm[2 * static_cast<size_t>(i)] = lo;
      mm[2 * static_cast<size_t>(i) + 1] = hi;
    }
    const std::vector<float> all = gather_all(comm, mm);
    std::vector<uint32_t> lo(un), hi(un);
    std::vector<char> active(un, 0);
    std::vector<float> probe(un), smallest(un);
    for (size_t i = 0; i < un; ++i) {
      float a = std::numeric_limits<float>::infinity(), b = kNegInf;
      for (int k = 0; k < ranks; ++k) {
        a = std::min(a, all[static_cast<size_t>(k) * mm.size() + 2 * i]);
        b = std::max(b, all[static_cast<size_t>(k) * mm.size() + 2 * i + 1]);
      }
      if (b == kNegInf) continue;  // no finite value: -inf (keep everything)
      lo[i] = key_of(a);
      hi[i] = key_of(b) + 1;
      smallest[i] = a;
      probe[i] = std::max(a, b - kGap);
      active[i] = 3;  // 3: the first round probes max - gap; 2: the smallest value; 1: bisection
    }
    // The values a round can still count: at or above the first probe (most of a peaked row is below it).
    const auto collect = [&](int64_t i, float from, float below) {
      const RowView x = view(g0 + i);
      auto& c = cand[static_cast<size_t>(i)];
      c.clear();
      for (int64_t v = 0; v < x.V; ++v) {
        const float a = x(v);
        if (finite_kept(a) && a >= from && a < below) c.emplace_back(a, weight(g0 + i, a));
      }
    };
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      if (active[static_cast<size_t>(i)] != 0)
        collect(i, probe[static_cast<size_t>(i)], std::numeric_limits<float>::infinity());
    for (;;) {
      bool any = false;
      for (char a : active) any = any || a != 0;
      if (!any) break;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const auto u = static_cast<size_t>(i);
        double sum = above[u];
        if (active[u] != 0)
          for (const auto& [a, w] : cand[u]) sum += a >= probe[u] ? w : 0.0;
        part[u] = sum;
      }
      const std::vector<double> sums = gather_all(comm, part);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const auto u = static_cast<size_t>(i);
        if (active[u] == 0) continue;
        double total = 0.0;
        for (int k = 0; k < ranks; ++k) total += sums[static_cast<size_t>(k) * un + u];
        const bool ok = pred(g0 + i, total);
        auto& c = cand[u];
        const float at = probe[u];
        if (active[u] == 3 && !ok && at > smallest[u]) {
          // The answer lies below the first probe: every value at or above it counts from now on, and the
          // values below it are collected (a second pass over this row); then the smallest value is checked.
          for (const auto& e : c) above[u] += e.second;
          hi[u] = key_of(at);
          collect(i, smallest[u], at);
          probe[u] = smallest[u];
          active[u] = 2;
          continue;
        }
        if (active[u] >= 2) {  // at the smallest value (or the first probe): below it, everything is kept
          active[u] = ok ? 1 : 0;
          if (!ok) continue;
          lo[u] = key_of(at);
        } else if (ok) {  // the answer is at or above the probe: the values below it no longer count
          lo[u] = key_of(at);
          c.erase(std::remove_if(c.begin(), c.end(), [&](const auto& e) { return e.first < at; }), c.end());
        } else {  // below the probe: the values at or above it count in every later round
          hi[u] = key_of(at);
          for (const auto& [a, w] : c) above[u] += a >= at ? w : 0.0;
          c.erase(std::remove_if(c.begin(), c.end(), [&](const auto& e) { return e.first >= at; }), c.end());
        }
        if (hi[u] - lo[u] <= 1) {
          out[static_cast<size_t>(g0 + i)] = value_of(lo[u]);
          active[u] = 0;
        } else {
          probe[u] = value_of(lo[u] + (hi[u] - lo[u]) / 2);
        }
      }
    }
  }
  return out;
}

// One rank's summary of a row for the combine (round 1).
struct Summary {
  float m1 = kNegInf, m2 = kNegInf;
  float x_draw = 0.0f;  // the value at g_arg (Gumbel)
  float x_last = 0.0f;  // the value at last (Dream's draw past the end of the CDF)
  int64_t arg = -1, g_arg = -1, last = -1;
  double z = 0.0;                                       // sum of e^(x - m1) over the kept (row_stats)
  double acc = 0.0;                                     // the same in f64, element by element (Dream's CDF)
  double g = -std::numeric_limits<double>::infinity();  // the Gumbel winner's value
};
// Round 2: the Dream draw's token from the rank whose slice holds it, and the entropy's partial sum.
struct Draw {
  int64_t token = -1;
  float x = 0.0f;
  float pad = 0.0f;
  double h = 0.0;
};

}  // namespace

void split_sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p,
                       const VocabShare& s, dist::Communicator& comm, Tensor& token, Tensor& conf) {
  check_sample_rows(logits, row_keys, token, conf);
  TESSERA_CHECK(logits.cols() == s.n,
                "split sampling: the logits are not this rank's share of the vocabulary");
  const int64_t R = logits.rows(), V = s.vocab;
  const int ranks = comm.size();
  const int32_t* keys = row_keys.as<const int32_t>();
  const int64_t sup =
      p.suppress_token >= s.lo && p.suppress_token < s.lo + s.n ? p.suppress_token - s.lo : -1;
  const bool dream = !p.gumbel;
  const Views view{logits.as<const float>(), s.n, sup, p.temperature, dream && p.temperature > 0.0f};
  const auto key = [&](int64_t r) { return static_cast<uint64_t>(static_cast<int64_t>(keys[r])); };

  // Dream's filters: top_p, then top_k (the larger cut wins), over the whole row.
  std::vector<float> cut(static_cast<size_t>(R), kNegInf);
  if (dream && p.top_p < 1.0f && R > 0) {
    // The row's max first.
    std::vector<float> mx(static_cast<size_t>(R), kNegInf);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const RowView x = view(r);
      for (int64_t v = 0; v < x.V; ++v)
        mx[static_cast<size_t>(r)] = std::max(mx[static_cast<size_t>(r)], x(v));
    }
    const std::vector<float> all_mx = gather_all(comm, mx);
    for (int64_t r = 0; r < R; ++r)
      for (int k = 0; k < ranks; ++k)
        mx[static_cast<size_t>(r)] =
            std::max(mx[static_cast<size_t>(r)], all_mx[static_cast<size_t>(k * R + r)]);
    const auto mass_of = [&](int64_t r, float a) {
      return std::exp(static_cast<double>(a) - mx[static_cast<size_t>(r)]);
    };
    // The normaliser, as top_p_cut's: the plain f64 sum over every token of the row.
    std::vector<double> zp(static_cast<size_t>(R), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const RowView x = view(r);
      for (int64_t v = 0; v < x.V; ++v)
        if (finite_kept(x(v))) zp[static_cast<size_t>(r)] += mass_of(r, x(v));
    }
    const std::vector<double> all_z = gather_all(comm, zp);
    std::vector<double> z(static_cast<size_t>(R), 0.0);
    for (int k = 0; k < ranks; ++k)
      for (int64_t r = 0; r < R; ++r) z[static_cast<size_t>(r)] += all_z[static_cast<size_t>(k * R + r)];
    const double top_p = p.top_p;
    // The nucleus's cut: the largest logit whose tokens at or above it hold more than top_p.
    cut = largest_value_where(view, R, comm, mass_of, [&](int64_t r, double mass) {
      return mass / z[static_cast<size_t>(r)] > top_p;
    });
  }
  if (dream && p.top_k > 0 && p.top_k < V && R > 0) {
    const auto k = static_cast<double>(p.top_k);
    const std::vector<float> kc = largest_value_where(
        view, R, comm, [](int64_t, float) { return 1.0; }, [&](int64_t, double n) { return n >= k; });
    for (int64_t r = 0; r < R; ++r)
      cut[static_cast<size_t>(r)] = std::max(cut[static_cast<size_t>(r)], kc[static_cast<size_t>(r)]);
  }

  // Round 1: each rank's statistics of its kept tokens, its Gumbel winner, its mass in f64.
  const bool gumbel_draw = p.gumbel && p.temperature > 0.0f, dream_draw = dream && p.temperature > 0.0f;
  std::vector<Summary> mine(static_cast<size_t>(R));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const RowView x = view(r);
    const float c = cut[static_cast<size_t>(r)];
    Summary& o = mine[static_cast<size_t>(r)];
    const RowStats st = cpu::row_stats(x, c);
    if (st.arg < 0) continue;
    o.m1 = st.m1;
    o.m2 = st.m2;
    o.arg = s.lo + st.arg;
    o.z = st.z;
    if (gumbel_draw) {
      const double t = p.temperature;
      for (int64_t v = 0; v < x.V; ++v) {
        const float a = x(v);
        if (a == kNegInf) continue;
        const double u = rng_uniform(p.seed, key(r), static_cast<uint64_t>(s.lo + v));
        const double g = static_cast<double>(a) - t * std::log(-std::log(u));
        if (g > o.g) {
          o.g = g;
          o.g_arg = s.lo + v;
          o.x_draw = a;
        }
      }
    }
    if (dream_draw) {
      for (int64_t v = 0; v < x.V; ++v) {
        const float a = x(v);
        if (a == kNegInf || a < c) continue;
        o.acc += std::exp(static_cast<double>(a) - st.m1);
        o.last = s.lo + v;
        o.x_last = a;
      }
    }
  }
  const std::vector<Summary> all = gather_all(comm, mine);
  const auto at = [&](int k, int64_t r) -> const Summary& { return all[static_cast<size_t>(k * R + r)]; };

  // The combine, the same on every rank: the ranks in vocabulary order, so strict comparisons keep the
  // lower id on ties as the single-device scan does.
  struct Row {
    int best = -1;
    float m1 = kNegInf, m2 = kNegInf, x0v = 0.0f;
    int64_t x0 = 0;
    double z = 0.0, target = 0.0;
  };
  std::vector<Row> rows(static_cast<size_t>(R));
  std::vector<Draw> draws(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    Row& w = rows[static_cast<size_t>(r)];
    for (int k = 0; k < ranks; ++k)
      if (at(k, r).arg >= 0 && (w.best < 0 || at(k, r).m1 > w.m1)) {
        w.best = k;
        w.m1 = at(k, r).m1;
      }
    if (w.best < 0) continue;  // every logit is -inf
    for (int k = 0; k < ranks; ++k) {
      if (at(k, r).arg < 0) continue;
      w.m2 = std::max(w.m2, k == w.best ? at(k, r).m2 : at(k, r).m1);
      w.z += at(k, r).z * std::exp(static_cast<double>(at(k, r).m1) - w.m1);
    }
    w.x0 = at(w.best, r).arg;
    w.x0v = w.m1;
    if (gumbel_draw) {
      double g = -std::numeric_limits<double>::infinity();
      for (int k = 0; k < ranks; ++k)
        if (at(k, r).g_arg >= 0 && at(k, r).g > g) {
          g = at(k, r).g;
          w.x0 = at(k, r).g_arg;
          w.x0v = at(k, r).x_draw;
        }
    }
    if (dream_draw) w.target = rng_uniform(p.seed, key(r), static_cast<uint64_t>(V)) * w.z;
  }

  // Round 2 (Dream's draw, entropy): the rank whose slice holds the CDF's target finds the token.
  const bool entropy = p.conf == ConfKind::NegEntropy;
  if (dream_draw || entropy) {
    const int me = comm.rank();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const Row& w = rows[static_cast<size_t>(r)];
      Draw& d = draws[static_cast<size_t>(r)];
      if (w.best < 0 || mine[static_cast<size_t>(r)].arg < 0) continue;
      const RowView x = view(r);
      const float c = cut[static_cast<size_t>(r)];
      if (dream_draw) {
        double acc = 0.0;  // the lower ranks' mass, then this slice's element by element
        for (int k = 0; k < me; ++k)
          if (at(k, r).arg >= 0) acc += at(k, r).acc * std::exp(static_cast<double>(at(k, r).m1) - w.m1);
        // Every rank scans (one past the target stops it at once); the lowest rank that passes it wins.
        for (int64_t v = 0; v < x.V; ++v) {
          const float a = x(v);
          if (a == kNegInf || a < c) continue;
          acc += std::exp(static_cast<double>(a) - w.m1);
          if (acc > w.target) {
            d.token = s.lo + v;
            d.x = a;
            break;
          }
        }
      }
      if (entropy) {
        for (int64_t v = 0; v < x.V; ++v) {
          const float a = x(v);
          if (a == kNegInf || a < c) continue;
          const double pv = std::exp(static_cast<double>(a) - w.m1) / w.z;
          d.h += pv * std::log(pv + 1e-10);
        }
      }
    }
    const std::vector<Draw> got = gather_all(comm, draws);
    for (int64_t r = 0; r < R; ++r) {
      Row& w = rows[static_cast<size_t>(r)];
      Draw& d = draws[static_cast<size_t>(r)];
      d.h = 0.0;
      bool found = false;
      for (int k = 0; k < ranks; ++k) {
        const Draw& g = got[static_cast<size_t>(k * R + r)];
        d.h += g.h;
        if (dream_draw && !found && g.token >= 0) {  // the lowest rank whose scan passed the target
          found = true;
          w.x0 = g.token;
          w.x0v = g.x;
        }
      }
      if (dream_draw && !found && w.best >= 0) {  // rounding at the very end of the CDF: the last kept token
        for (int k = 0; k < ranks; ++k)
          if (at(k, r).last >= 0) {
            w.x0 = at(k, r).last;
            w.x0v = at(k, r).x_last;
          }
      }
    }
  }

  int32_t* tok = token.as<int32_t>();
  float* cf = conf.as<float>();
  for (int64_t r = 0; r < R; ++r) {
    const Row& w = rows[static_cast<size_t>(r)];
    if (w.best < 0) {
      tok[r] = 0;
      cf[r] = 0.0f;
      continue;
    }
    tok[r] = static_cast<int32_t>(w.x0);
    switch (p.conf) {
      case ConfKind::Prob:
        cf[r] = static_cast<float>(std::exp(static_cast<double>(w.x0v) - w.m1) / w.z);
        break;
      case ConfKind::Margin: {
        const double p2 = w.m2 == kNegInf ? 0.0 : std::exp(static_cast<double>(w.m2) - w.m1) / w.z;
        cf[r] = static_cast<float>(1.0 / w.z - p2);
        break;
      }
      case ConfKind::NegEntropy:
        cf[r] = static_cast<float>(draws[static_cast<size_t>(r)].h);
        break;
      case ConfKind::Random:
        cf[r] = static_cast<float>(rng_uniform(p.seed, key(r), static_cast<uint64_t>(V) + 1));
        break;
    }
  }
}

namespace {

// A rank's max and normaliser of a row of raw logits (token_logprob's: NaN never the max), and the value of
// the global id t where this rank holds it (NaN elsewhere).
struct Norm {
  float m = kNegInf, xt = kNaN;
  double z = 0.0;
};
Norm row_norm(const float* row, int64_t n, int64_t lo, int64_t t) {
  Norm o;
  for (int64_t v = 0; v < n; ++v) o.m = std::max(o.m, row[v]);
  for (int64_t v = 0; v < n; ++v) o.z += std::exp(static_cast<double>(row[v]) - o.m);
  if (t >= lo && t < lo + n) o.xt = row[t - lo];
  return o;
}
// The global max and log-normaliser of row r from every rank's Norm.
std::pair<double, double> combine_norm(const std::vector<Norm>& all, int ranks, int64_t R, int64_t r) {
  float m = kNegInf;
  for (int k = 0; k < ranks; ++k) m = std::max(m, all[static_cast<size_t>(k * R + r)].m);
  double z = 0.0;
  for (int k = 0; k < ranks; ++k) {
    const Norm& o = all[static_cast<size_t>(k * R + r)];
    if (o.m != kNegInf) z += o.z * std::exp(static_cast<double>(o.m) - m);
  }
  return {m, std::log(z)};
}
float owner_value(const std::vector<Norm>& all, int ranks, int64_t R, int64_t r) {
  for (int k = 0; k < ranks; ++k)
    if (!std::isnan(all[static_cast<size_t>(k * R + r)].xt)) return all[static_cast<size_t>(k * R + r)].xt;
  return kNaN;
}

}  // namespace

void split_token_logprob(const Tensor& logits, const Tensor& target, const VocabShare& s,
                         dist::Communicator& comm, Tensor& logprob) {
  check_token_logprob(logits, target, logprob);
  TESSERA_CHECK(logits.cols() == s.n, "split log-probabilities: the logits are not this rank's share");
  const int64_t R = logits.rows();
  const float* L = logits.as<const float>();
  const int32_t* tg = target.as<const int32_t>();
  std::vector<Norm> mine(static_cast<size_t>(R));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) mine[static_cast<size_t>(r)] = row_norm(L + r * s.n, s.n, s.lo, tg[r]);
  const std::vector<Norm> all = gather_all(comm, mine);
  float* out = logprob.as<float>();
  for (int64_t r = 0; r < R; ++r) {
    if (tg[r] < 0 || tg[r] >= s.vocab) {
      out[r] = kNaN;
      continue;
    }
    const auto [m, log_z] = combine_norm(all, comm.size(), R, r);
    out[r] = static_cast<float>(static_cast<double>(owner_value(all, comm.size(), R, r)) - m - log_z);
  }
}

void split_top_logprobs(const Tensor& logits, const Tensor& token, const VocabShare& s,
                        dist::Communicator& comm, Tensor& chosen, Tensor& ids, Tensor& lp) {
  const int64_t K = check_top_logprobs(logits, token, chosen, ids, lp, s.vocab);  // K of the whole vocabulary
  TESSERA_CHECK(logits.cols() == s.n, "split log-probabilities: the logits are not this rank's share");
  const int64_t R = logits.rows(), ranks = comm.size();
  const float* L = logits.as<const float>();
  const int32_t* tok = token.as<const int32_t>();
  std::vector<Norm> norms(static_cast<size_t>(R));
  // Each rank's K best (value descending, ids ascending on ties; NaN never), padded with -1.
  std::vector<float> vals(static_cast<size_t>(R * K), kNaN);
  std::vector<int32_t> vids(static_cast<size_t>(R * K), -1);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* row = L + r * s.n;
    norms[static_cast<size_t>(r)] = row_norm(row, s.n, s.lo, tok[r]);
    cpu::row_top_k(row, s.n, s.lo, K, vals.data() + r * K, vids.data() + r * K);
  }
  const std::vector<Norm> all = gather_all(comm, norms);
  const std::vector<float> all_vals = gather_all(comm, vals);
  const std::vector<int32_t> all_ids = gather_all(comm, vids);
  float* ch = chosen.as<float>();
  int32_t* id = ids.as<int32_t>();
  float* out = lp.as<float>();
  std::vector<std::pair<float, int32_t>> cand;
  for (int64_t r = 0; r < R; ++r) {
    const auto [m, log_z] = combine_norm(all, static_cast<int>(ranks), R, r);
    const int64_t t = tok[r];
    ch[r] = t < 0 || t >= s.vocab
                ? kNaN
                : static_cast<float>(static_cast<double>(owner_value(all, static_cast<int>(ranks), R, r)) -
                                     m - log_z);
    cand.clear();
    for (int64_t k = 0; k < ranks; ++k)
      for (int64_t j = 0; j < K; ++j) {
        const auto i = static_cast<size_t>((k * R + r) * K + j);
        if (all_ids[i] >= 0) cand.emplace_back(all_vals[i], all_ids[i]);
      }
    std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int64_t j = 0; j < K; ++j) {
      if (j < static_cast<int64_t>(cand.size())) {
        id[r * K + j] = cand[static_cast<size_t>(j)].second;
        out[r * K + j] =
            static_cast<float>(static_cast<double>(cand[static_cast<size_t>(j)].first) - m - log_z);
      } else {
        id[r * K + j] = -1;
        out[r * K + j] = kNaN;
      }
    }
  }
}

void gather_vocab(const Tensor& local, const VocabShare& s, dist::Communicator& comm, Tensor& full) {
  TESSERA_CHECK(local.dtype == DType::F32 && full.dtype == DType::F32 && local.cols() == s.n &&
                    full.cols() == s.vocab && full.rows() == local.rows(),
                "gather_vocab: f32 [R, share] into [R, vocab] expected");
  const int ranks = comm.size();
  const int64_t R = local.rows();
  int64_t width = 0;  // the widest share: every rank sends that many columns a row
  for (int k = 0; k < ranks; ++k) width = std::max(width, vocab_share(s.vocab, ranks, k).n);
  std::vector<float> send(static_cast<size_t>(R * width), 0.0f);
  const float* in = local.as<const float>();
  for (int64_t r = 0; r < R; ++r) std::copy(in + r * s.n, in + (r + 1) * s.n, send.begin() + r * width);
  const std::vector<float> all = gather_all(comm, send);
  float* out = full.as<float>();
  for (int k = 0; k < ranks; ++k) {
    const VocabShare q = vocab_share(s.vocab, ranks, k);
    for (int64_t r = 0; r < R; ++r) {
      const float* src = all.data() + (static_cast<int64_t>(k) * R + r) * width;
      std::copy(src, src + q.n, out + r * s.vocab + q.lo);
    }
  }
}

}  // namespace tessera
