#include "memory/chunk_optimizer.h"

#include <algorithm>
#include <chrono>

namespace tessera::memory {
namespace {

enum class Bottleneck { Ffn, Logits, None };

// Which chunkable op sets the peak: the symbol of the tensors live when the most bytes are live.
Bottleneck find_bottleneck(const graph::GraphTemplate& g, const graph::Program& p) {
  std::vector<int> of;
  const std::vector<Buffer> bufs = program_buffers(g, p, &of);
  int t_max = 0;
  for (const Buffer& b : bufs) t_max = std::max(t_max, b.last);
  std::vector<size_t> live(static_cast<size_t>(t_max) + 1, 0);
  for (const Buffer& b : bufs) {
    for (int t = b.first; t <= b.last; ++t) live[static_cast<size_t>(t)] += b.size;
  }
  const int t_star = static_cast<int>(std::max_element(live.begin(), live.end()) - live.begin());
  size_t ffn = 0, logits = 0;
  const auto& decls = g.tensors();
  for (size_t i = 0; i < decls.size(); ++i) {
    if (of[i] < 0 || decls[i].alias_of >= 0) continue;
    const Buffer& b = bufs[static_cast<size_t>(of[i])];
    if (b.first > t_star || b.last < t_star) continue;
    if (decls[i].rows == graph::Sym::FfnRows) ffn += b.size;
    if (decls[i].rows == graph::Sym::LogitRows ||
        (decls[i].kind == graph::TensorKind::Output && decls[i].cols > 1)) {
      logits += b.size;  // per-chunk logits, or a full logits output written chunk by chunk
    }
  }
  if (ffn == 0 && logits == 0) return Bottleneck::None;
  return ffn >= logits ? Bottleneck::Ffn : Bottleneck::Logits;
}

graph::Program planned(const graph::GraphTemplate& g, graph::StepShape s, int64_t kf, int64_t kl, Fit fit) {
  s.k_ffn = kf;
  s.k_logits = kl;
  graph::Program p = graph::instantiate(g, s);
  plan(g, p, fit);
  return p;
}

}  // namespace

size_t planned_peak(const graph::GraphTemplate& g, graph::StepShape shape, int64_t k_ffn, int64_t k_logits,
                    Fit fit) {
  return planned(g, shape, k_ffn, k_logits, fit).peak;
}

size_t chunk_floor(const graph::GraphTemplate& g, const graph::StepShape& shape) {
  return planned_peak(g, shape, std::max<int64_t>(1, shape.n_query), std::max<int64_t>(1, shape.n_logits));
}

ChunkChoice choose_chunks(const graph::GraphTemplate& g, const graph::StepShape& shape, size_t budget) {
  const auto t0 = std::chrono::steady_clock::now();
  ChunkChoice c;
  const int64_t max_ffn = std::max<int64_t>(1, shape.n_query),
                max_logits = std::max<int64_t>(1, shape.n_logits);
  graph::Program p = planned(g, shape, 1, 1, Fit::First);
  c.plans = 1;
  while (p.peak > budget) {
    const Bottleneck b = find_bottleneck(g, p);
    const size_t before = p.peak;
    if (b == Bottleneck::Ffn && c.k_ffn < max_ffn) {
      ++c.k_ffn;
    } else if (b == Bottleneck::Logits && c.k_logits < max_logits) {
      ++c.k_logits;
    } else if (b != Bottleneck::None && (c.k_ffn < max_ffn || c.k_logits < max_logits)) {
      // The bottleneck op is at one row per chunk; the other chunkable op may still set a peak.
      if (c.k_ffn < max_ffn)
        ++c.k_ffn;
      else
        ++c.k_logits;
    } else {
      break;  // only non-chunkable tensors are live at the peak: the floor
    }
    p = planned(g, shape, c.k_ffn, c.k_logits, Fit::First);
    ++c.plans;
    (void)before;
  }
  c.peak = p.peak;
  c.fits = p.peak <= budget;
  c.floor = c.fits ? 0 : chunk_floor(g, shape);
  c.search_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

ChunkChoice choose_chunks_brute_force(const graph::GraphTemplate& g, const graph::StepShape& shape,
                                      size_t budget, int64_t max_k) {
  const auto t0 = std::chrono::steady_clock::now();
  ChunkChoice best;
  bool found = false;
  const int64_t mf = std::min(max_k, std::max<int64_t>(1, shape.n_query));
  const int64_t ml = std::min(max_k, std::max<int64_t>(1, shape.n_logits));
  for (int64_t kf = 1; kf <= mf; ++kf) {
    for (int64_t kl = 1; kl <= ml; ++kl) {
      const size_t peak = planned_peak(g, shape, kf, kl);
      ++best.plans;
      if (peak > budget) continue;
      const bool better = !found || kf + kl < best.k_ffn + best.k_logits ||
                          (kf + kl == best.k_ffn + best.k_logits && peak < best.peak);
      if (better) {
        found = true;
        best.k_ffn = kf;
        best.k_logits = kl;
        best.peak = peak;
      }
    }
  }
  best.fits = found;
  if (!found) {
    best.k_ffn = best.k_logits = 1;
    best.peak = planned_peak(g, shape, 1, 1);
  }
  best.search_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return best;
}

}  // namespace tessera::memory
