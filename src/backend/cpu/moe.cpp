// Mixture-of-experts on the CPU: the router (scores, grouped selection, top-k) and the expert FFN
// over the selected experts only. The (row, slot) pairs are bucketed by expert inside the planned
// scratch buffer (a counting sort: deterministic, stable in pair order), each expert's rows are
// gathered into one contiguous block, the gate/up/down GEMMs run per expert on its block, and the
// weighted expert outputs are added to the residual row by row in slot order.
//
// GEMM row counts: oneDNN primitives are cached per shape, so the row count of an expert's GEMM is
// rounded up to a bucket (1, 2, 4, 8, 16, then multiples of 16 up to 256; more rows run as 256-row
// tiles plus one bucketed rest). Each expert's weights are thus streamed once per projection (small
// expert GEMMs are memory-bound) and a fixed set of primitives, created on the first call, serves
// every later call without allocating. A bucketed window ends at the expert's last row and extends
// DOWN into the rows of lower experts: its extra rows read and write garbage there, which is then
// overwritten because experts run in descending order. Where no such window fits (the first rows of
// the buffer) the rows run as exact power-of-two tiles.
//
// Two schedules give the same bits (CpuMoe). Per expert: the windows one after another, each GEMM spread
// over the threads by oneDNN (three parallel regions per window). Across experts: the windows shared out
// among the threads, each window's gate, up, activation and down computed by one thread with one-thread
// primitives into that thread's own tiles, and only the expert's own rows of the result copied out (so
// windows reaching into lower experts' rows write nothing there): one parallel region for all experts,
// where a small model's per-expert GEMMs cost less than waking the threads for each.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tessera {

void des_coreset(const float* votes, const float* seq, int E, DesMode mode, int m_core, int top_k,
                 float* core) {
  bool any = false;
  for (int e = 0; e < E; ++e) any = any || seq[e] > 0.0f;
  // Rank by (votes descending, lower id) among the experts not yet in the coreset.
  auto best_outside = [&](bool need_vote) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (core[e] != 0.0f || (need_vote && !(votes[e] > 0.0f))) continue;
      if (best < 0 || votes[e] > votes[best]) best = e;
    }
    return best;
  };
  int n = 0;
  for (int e = 0; e < E; ++e) {
    core[e] = !any || mode == DesMode::Off || (mode == DesMode::Seq && seq[e] > 0.0f) ? 1.0f : 0.0f;
    n += core[e] != 0.0f ? 1 : 0;
  }
  if (any && mode == DesMode::Vote) {
    for (; n < m_core; ++n) {
      const int e = best_outside(true);
      if (e < 0) break;
      core[e] = 1.0f;
    }
  }
  for (; n < top_k; ++n) core[best_outside(false)] = 1.0f;
}

}  // namespace tessera

namespace tessera::cpu {
namespace {

constexpr int kMaxExperts = 1024;  // router rows live on the stack
constexpr int kMaxTopK = 64;
constexpr int64_t kMaxTile = 256;  // largest GEMM row tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Index of the highest value among the entries not yet taken, ties to the lower index.
int best_untaken(const float* v, const bool* taken, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  }
  return best;
}

// Router scores of one row: s (softmax or sigmoid of the f32 logits) and selection scores b = s + bias.
void scores(const float* logits, int E, const MoeRouteParams& p, float* s, float* b) {
  if (p.score == MoeScore::Softmax) {
    float mx = kNegInf;
    for (int e = 0; e < E; ++e) mx = std::max(mx, logits[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(logits[e] - mx));
    for (int e = 0; e < E; ++e) s[e] /= sum;
  } else {
    for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  }
  for (int e = 0; e < E; ++e) b[e] = s[e] + (p.expert_bias != nullptr ? p.expert_bias[e] : 0.0f);
}

// top_k of b (ineligible experts at -inf), weights from the unbiased s.
void select_top_k(const float* s, const float* b, int E, const MoeRouteParams& p, int32_t* ids, float* w) {
  bool taken[kMaxExperts] = {};
  float sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    const int e = best_untaken(b, taken, E);
    taken[e] = true;
    ids[j] = e;
    w[j] = s[e];
    sum += s[e];
  }
  for (int j = 0; j < p.top_k; ++j) {
    if (p.norm_topk) w[j] /= sum + 1e-20f;
    w[j] *= p.scale;
    if (p.expert_scale != nullptr) w[j] *= p.expert_scale[ids[j]];
  }
}

// One router row: scores, optional grouped pre-selection, top-k of b, weights from the unbiased s.
void route_row(const float* logits, int E, const MoeRouteParams& p, int32_t* ids, float* w) {
  float s[kMaxExperts], b[kMaxExperts];
  scores(logits, E, p, s, b);
  if (p.n_group > 1) {
    // Group score = sum of the two highest selection scores of the group; keep the topk_group
    // best groups (ties to the lower group), drop every expert of the others.
    const int gsize = E / p.n_group;
    float gscore[kMaxExperts];
    for (int g = 0; g < p.n_group; ++g) {
      float t1 = kNegInf, t2 = kNegInf;
      for (int e = g * gsize; e < (g + 1) * gsize; ++e) {
        if (b[e] > t1) {
          t2 = t1;
          t1 = b[e];
        } else if (b[e] > t2) {
          t2 = b[e];
        }
      }
      gscore[g] = t1 + t2;
    }
    bool keep[kMaxExperts] = {};
    for (int r = 0; r < p.topk_group; ++r) keep[best_untaken(gscore, keep, p.n_group)] = true;
    for (int e = 0; e < E; ++e) {
      if (!keep[e / gsize]) b[e] = kNegInf;
    }
  }
  select_top_k(s, b, E, p, ids, w);
}

// A row routed inside the coreset (core[e] != 0): top_k of b among its experts, no group limits.
void route_row_in(const float* logits, int E, const MoeRouteParams& p, const float* core, int32_t* ids,
                  float* w) {
  float s[kMaxExperts], b[kMaxExperts];
  scores(logits, E, p, s, b);
  for (int e = 0; e < E; ++e) {
    if (core[e] == 0.0f) b[e] = kNegInf;
  }
  select_top_k(s, b, E, p, ids, w);
}

// DES on the host-visible state of one layer (MoeShare): votes of rows [vote_lo, vote_hi) in row order,
// then the coreset, constrained routing of the share rows and the hit flags.
void moe_share(const float* L, int E, const MoeRouteParams& p, const MoeShare& sh, int64_t M, int32_t* id,
               float* w) {
  float* V = sh.state;
  float* seq = V + E;
  float* hit = V + 2 * E;
  float* hit_vote = V + 3 * E;
  float* core = V + 4 * E;
  const int K = p.top_k;
  if (sh.vote) {
    for (int64_t r = sh.vote_lo; r < sh.vote_hi; ++r) {
      float s[kMaxExperts], b[kMaxExperts];
      scores(L + r * E, E, p, s, b);
      for (int j = 0; j < K; ++j) {
        const int32_t e = id[r * K + j];
        V[e] += s[e];
        if (j < std::max(1, sh.k)) seq[e] += 1.0f;  // the first expert always: marks a vote
      }
    }
  }
  if (!sh.apply) return;
  des_coreset(V, seq, E, sh.mode, sh.m_core, K, core);
  if (sh.mode != DesMode::Off) {
#pragma omp parallel for if (sh.share_hi - sh.share_lo > 16)
    for (int64_t r = sh.share_lo; r < sh.share_hi; ++r)
      route_row_in(L + r * E, E, p, core, id + r * K, w + r * K);
  }
  for (int64_t r = 0; r < M; ++r) {
    const bool voting = r >= sh.vote_lo && r < sh.vote_hi;
    for (int j = 0; j < K; ++j) {
      hit[id[r * K + j]] = 1.0f;
      if (voting) hit_vote[id[r * K + j]] = 1.0f;
    }
  }
}

// The scratch buffer of moe_ffn, carved in order; every sub-buffer 64-byte aligned.
struct Layout {
  int32_t* offsets;   // [E + 1] first sorted pair of each expert
  int32_t* cursor;    // [E] fill counters of the scatter
  int32_t* pair_row;  // [P] row of x of the sorted pair
  int32_t* pair_pos;  // [P] sorted position of pair (m, j)
  char* xg;           // [P, hidden] act: x rows gathered in sorted order
  char* gate;         // [P, inter] act: gate, then silu(gate) * up
  char* up;           // [P, inter] act
  float* y;           // [P, hidden] f32: expert outputs
  size_t bytes;       // total used
};

Layout carve(void* base, int64_t P, const MoeExperts& e) {
  Layout l{};
  char* p = static_cast<char*>(base);
  size_t at = 0;
  auto take = [&](size_t n) {
    char* q = p == nullptr ? nullptr : p + at;
    at += (n + 63) / 64 * 64;
    return q;
  };
  const size_t es = dtype_size(e.dtype), E = static_cast<size_t>(e.n_experts), np = static_cast<size_t>(P);
  const auto H = static_cast<size_t>(e.hidden), I = static_cast<size_t>(e.inter);
  l.offsets = reinterpret_cast<int32_t*>(take((E + 1) * 4));
  l.cursor = reinterpret_cast<int32_t*>(take(E * 4));
  l.pair_row = reinterpret_cast<int32_t*>(take(np * 4));
  l.pair_pos = reinterpret_cast<int32_t*>(take(np * 4));
  l.xg = take(np * H * es);
  l.gate = take(np * I * es);
  l.up = take(np * I * es);
  l.y = reinterpret_cast<float*>(take(np * H * 4));
  l.bytes = at + 64;  // + the alignment of the base
  return l;
}

// A view of rows [r0, r0 + n) of a row-major [*, cols] buffer.
Tensor rows_of(char* base, DType dt, int64_t r0, int64_t n, int64_t cols) {
  return Tensor(base + static_cast<size_t>(r0 * cols) * dtype_size(dt), dt, {n, cols});
}

// GEMM row buckets: powers of two up to 16, then multiples of 16 up to kMaxTile.
int64_t bucket(int64_t n) {
  if (n > 16) return std::min(kMaxTile, (n + 15) / 16 * 16);
  int64_t t = 1;
  while (t < n) t *= 2;
  return t;
}

// Calls fn(expert, first row, rows) for GEMM windows covering every expert's sorted rows, experts in
// descending order, each expert's rows from the end: 256-row tiles, then the rest as one bucketed
// window reaching down into lower experts' rows (or exact power-of-two tiles at the buffer start).
template <typename Fn>
void for_windows(const int32_t* offsets, int E, Fn&& fn) {
  for (int ex = E - 1; ex >= 0; --ex) {
    for (int64_t hi = offsets[ex + 1]; hi > offsets[ex];) {
      const int64_t n = hi - offsets[ex];
      int64_t t = n >= kMaxTile ? kMaxTile : bucket(n);
      if (hi - t < 0) {  // no room below: the largest power of two <= n, exact
        t = 1;
        while (t * 2 <= n) t *= 2;
      }
      fn(ex, hi - t, t);
      hi -= std::min(t, n);
    }
  }
}

}  // namespace

void moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
  // (the CPU's router takes every group count a supported expert count divides into)
  check_moe_route(logits, p, ids, weights, MoeRouteLimits{kMaxExperts, kMaxTopK, kMaxExperts});
  const int64_t M = logits.rows();
  const int E = static_cast<int>(logits.cols());
  const float* L = logits.as<const float>();
  auto* id = ids.as<int32_t>();
  auto* w = weights.as<float>();
#pragma omp parallel for if (M > 16)
  for (int64_t r = 0; r < M; ++r) route_row(L + r * E, E, p, id + r * p.top_k, w + r * p.top_k);
  if (p.share != nullptr) moe_share(L, E, p, *p.share, M, id, w);
}

CpuMoe resolve_cpu_moe(CpuMoe choice) {
  if (choice != CpuMoe::Auto) return choice;
  const char* env = std::getenv("TESSERA_CPU_MOE");
  const std::string v = env != nullptr ? env : "";
  if (v.empty() || v == "auto") return CpuMoe::Auto;
  if (v == "per-expert") return CpuMoe::PerExpert;
  if (v == "across") return CpuMoe::AcrossExperts;
  fail("TESSERA_CPU_MOE='" + v + "': expected per-expert, across or auto");
}

void moe_ffn(GemmEngine& gemm, MoeState& state, const Tensor& x, const Tensor& ids, const Tensor& weights,
             const MoeExperts& e, Tensor& scratch, Tensor& out) {
  const int64_t M = x.rows(), H = e.hidden, I = e.inter;
  const int E = e.n_experts;
  check_moe_ffn(x, ids, weights, e, scratch, out);
  if (M == 0) return;
  const int64_t k = ids.numel() / M, P = M * k;
  const size_t contract = moe_scratch_bytes(M, static_cast<int>(k), e);
  TESSERA_CHECK(carve(nullptr, P, e).bytes <= contract,
                "moe_ffn: the CPU layout exceeds moe_scratch_bytes()");
  auto* base = static_cast<char*>(scratch.data);
  const Layout l = carve(base + (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64, P, e);

  // Bucket the pairs by expert: counts, exclusive scan, stable scatter.
  const auto* id = ids.as<const int32_t>();
  std::memset(l.offsets, 0, static_cast<size_t>(E + 1) * 4);
  for (int64_t i = 0; i < P; ++i) {
    if (id[i] < 0 || id[i] >= E)
      fail("moe_ffn: expert id " + std::to_string(id[i]) + " is outside [0, " + std::to_string(E) + ")");
    if (e.local(id[i])) ++l.offsets[id[i] + 1];
  }
  for (int i = 0; i < E; ++i) {
    l.offsets[i + 1] += l.offsets[i];
    l.cursor[i] = 0;
  }
  for (int64_t i = 0; i < P; ++i) {
    if (!e.local(id[i])) {  // another rank's expert (expert parallelism)
      l.pair_pos[i] = -1;
      continue;
    }
    const int32_t pos = l.offsets[id[i]] + l.cursor[id[i]]++;
    l.pair_row[pos] = static_cast<int32_t>(i / k);
    l.pair_pos[i] = pos;
  }
  const int64_t local_pairs = l.offsets[E];
  // Gather the rows of x in sorted order.
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(e.dtype);
  const auto* xs = static_cast<const char*>(x.data);
#pragma omp parallel for if (local_pairs * H > 65536)
  for (int64_t i = 0; i < local_pairs; ++i) {
    std::memcpy(l.xg + static_cast<size_t>(i) * row_bytes,
                xs + static_cast<size_t>(l.pair_row[i]) * row_bytes, row_bytes);
  }
  auto& items = state.items;
  items.clear();
  for_windows(l.offsets, E, [&](int ex, int64_t r0, int64_t n) { items.push_back({ex, r0, n}); });
  const int threads = omp_get_max_threads();
  const bool across = !omp_in_parallel() && threads > 1 &&
                      (state.schedule == CpuMoe::AcrossExperts ||
                       (state.schedule == CpuMoe::Auto && items.size() >= 2 * static_cast<size_t>(threads)));
  const void* const* table = e.table;
  auto weight = [&](int which, int ex) {
    void* p = const_cast<void*>(table[which * E + ex]);
    Tensor w = which < 2 ? Tensor(p, e.dtype, {I, H}) : Tensor(p, e.dtype, {H, I});
    w.quant = e.quant[static_cast<size_t>(which)];
    return w;
  };
  if (across) {
    // Each thread's tiles: gate, up (then the activation) and the f32 output of one window.
    const size_t act_bytes = (static_cast<size_t>(kMaxTile * I) * dtype_size(e.dtype) + 63) / 64 * 64;
    gemm.prepare_slots(threads, 2 * act_bytes + static_cast<size_t>(kMaxTile * H) * 4);
    for (int64_t t = 1; t <= kMaxTile; t = t < 16 ? t * 2 : t + 16) {
      for (const int16_t q : {e.quant[0], e.quant[1]}) gemm.prepare_serial(t, I, H, e.dtype, e.dtype, q >= 0);
      gemm.prepare_serial(t, H, I, e.dtype, DType::F32, e.quant[2] >= 0);
    }
    const auto n_items = static_cast<int64_t>(items.size());
    std::string error;  // an exception may not leave the parallel region: the first one is raised after it
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t it = 0; it < n_items; ++it) {
      try {
        const int slot = omp_get_thread_num();
        const auto [ex, r0, n] = items[static_cast<size_t>(it)];
        auto* ws = static_cast<char*>(gemm.slot_workspace(slot));
        const Tensor a = rows_of(l.xg, e.dtype, r0, n, H);
        Tensor g = rows_of(ws, e.dtype, 0, n, I), u = rows_of(ws + act_bytes, e.dtype, 0, n, I);
        Tensor y = rows_of(ws + 2 * act_bytes, DType::F32, 0, n, H);
        gemm.gemm_in_slot(slot, a, weight(0, static_cast<int>(ex)), g);
        gemm.gemm_in_slot(slot, a, weight(1, static_cast<int>(ex)), u);
        (e.gelu ? geglu_serial : swiglu_serial)(g, u, g);
        gemm.gemm_in_slot(slot, g, weight(2, static_cast<int>(ex)), y);
        const int64_t own = std::max(r0, static_cast<int64_t>(l.offsets[ex]));  // the expert's first row here
        std::memcpy(l.y + own * H, y.as<const float>() + (own - r0) * H,
                    static_cast<size_t>((r0 + n - own) * H) * 4);
      } catch (const std::exception& err) {
#pragma omp critical(tessera_moe_error)
        if (error.empty()) error = err.what();
      }
    }
    if (!error.empty()) fail(error);
  } else {
    // The primitives of every bucket, created once (after that a call allocates nothing).
    for (int64_t t = 1; t <= kMaxTile; t = t < 16 ? t * 2 : t + 16) {
      for (const int16_t q : {e.quant[0], e.quant[1]}) gemm.prepare(t, I, H, e.dtype, e.dtype, q >= 0);
      gemm.prepare(t, H, I, e.dtype, DType::F32, e.quant[2] >= 0);
    }
    // gate and up per expert, then (after one swiglu, or geglu, over all pairs) down.
    for (const auto& [ex, r0, n] : items) {
      const Tensor a = rows_of(l.xg, e.dtype, r0, n, H);
      Tensor g = rows_of(l.gate, e.dtype, r0, n, I), u = rows_of(l.up, e.dtype, r0, n, I);
      gemm.gemm(a, weight(0, static_cast<int>(ex)), nullptr, g, false);
      gemm.gemm(a, weight(1, static_cast<int>(ex)), nullptr, u, false);
    }
    Tensor g_all(l.gate, e.dtype, {local_pairs, I}), u_all(l.up, e.dtype, {local_pairs, I});
    if (local_pairs > 0) (e.gelu ? geglu : swiglu)(g_all, u_all, g_all);
    for (const auto& [ex, r0, n] : items) {
      const Tensor a = rows_of(l.gate, e.dtype, r0, n, I);
      Tensor y = rows_of(reinterpret_cast<char*>(l.y), DType::F32, r0, n, H);
      gemm.gemm(a, weight(2, static_cast<int>(ex)), nullptr, y, false);
    }
  }
  // out[m] += sum_j w[m, j] * y[pair (m, j)], summed in slot order.
  const auto* w = weights.as<const float>();
  float* o = out.as<float>();
#pragma omp parallel for if (M * H > 65536)
  for (int64_t m = 0; m < M; ++m) {
    constexpr int64_t kCols = 64;
    for (int64_t c0 = 0; c0 < H; c0 += kCols) {
      const int64_t nc = std::min(kCols, H - c0);
      float acc[kCols] = {};
      for (int64_t j = 0; j < k; ++j) {
        if (l.pair_pos[m * k + j] < 0) continue;  // another rank's expert
        const float wj = w[m * k + j];
        const float* yr = l.y + static_cast<int64_t>(l.pair_pos[m * k + j]) * H + c0;
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) acc[c] += wj * yr[c];
      }
      float* orow = o + m * H + c0;
      if (e.overwrite) {
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) orow[c] = acc[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) orow[c] += acc[c];
      }
    }
  }
}

}  // namespace tessera::cpu
