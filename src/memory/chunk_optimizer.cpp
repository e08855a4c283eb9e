#include "memory/chunk_optimizer.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace tessera::memory {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

graph::Program planned(const graph::GraphTemplate& g, graph::StepShape s, int64_t kf, int64_t kl, Fit fit) {
  s.k_ffn = kf;
  s.k_logits = kl;
  graph::Program p = graph::instantiate(g, s);
  plan(g, p, fit);
  return p;
}

// The live bytes of each chunkable phase at its worst op: the FFN loops (per-chunk tensors of rows
// ffn_rows) and the logits loop (rows logit_rows). A phase without per-chunk tensors (the logits
// loop of the full-logits graph writes straight into its output) cannot shrink: 0.
struct PhasePeaks {
  size_t ffn = 0, logits = 0;
};
PhasePeaks phase_peaks(const graph::GraphTemplate& g, const graph::Program& p) {
  const std::vector<size_t> live = live_bytes(program_buffers(g, p, nullptr));
  bool has_ffn = false, has_logits = false;
  for (const graph::TensorDecl& d : g.tensors()) {
    has_ffn |= d.kind == graph::TensorKind::Transient && d.rows == graph::Sym::FfnRows;
    has_logits |= d.kind == graph::TensorKind::Transient && d.rows == graph::Sym::LogitRows;
  }
  PhasePeaks pp;
  for (const graph::LoopDecl& l : g.loops()) {
    const bool ffn = l.chunk_rows == graph::Sym::FfnRows;
    if (!(ffn ? has_ffn : has_logits)) continue;
    size_t& slot = ffn ? pp.ffn : pp.logits;
    for (int t = l.begin; t < l.end && t < static_cast<int>(live.size()); ++t) {
      slot = std::max(slot, live[static_cast<size_t>(t)]);
    }
  }
  return pp;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

size_t planned_peak(const graph::GraphTemplate& g, graph::StepShape shape, int64_t k_ffn, int64_t k_logits,
                    Fit fit) {
  return planned(g, shape, k_ffn, k_logits, fit).peak;
}

size_t chunk_floor(const graph::GraphTemplate& g, const graph::StepShape& shape, Fit fit) {
  return planned_peak(g, shape, std::max<int64_t>(1, shape.n_query), std::max<int64_t>(1, shape.n_logits),
                      fit);
}

int64_t next_chunk_count(int64_t k, int64_t n) {
  const int64_t rows = ceil_div(n, k);
  return rows <= 1 ? k : ceil_div(n, rows - 1);
}

ChunkChoice choose_chunks(const graph::GraphTemplate& g, const graph::StepShape& shape, size_t budget,
                          Fit fit) {
  const auto t0 = Clock::now();
  ChunkChoice c;
  const int64_t nq = std::max<int64_t>(1, shape.n_query), nl = std::max<int64_t>(1, shape.n_logits);
  graph::Program p = planned(g, shape, 1, 1, fit);
  const size_t unchunked = p.peak;
  c.plans = 1;
  if (p.peak > budget) {
    c.floor = chunk_floor(g, shape, fit);
    ++c.plans;
  }
  // The paper's loop: grow the chunk count of the op that sets the peak, re-plan, until the plan
  // fits or its peak is the non-chunkable floor.
  while (p.peak > budget && c.floor <= budget && p.peak > c.floor) {
    const PhasePeaks pp = phase_peaks(g, p);
    const bool can_ffn = pp.ffn > 0 && c.k_ffn < nq;
    const bool can_logits = pp.logits > 0 && c.k_logits < nl;
    if (!can_ffn && !can_logits) break;  // both at one row per chunk
    const int64_t kf = can_ffn ? next_chunk_count(c.k_ffn, nq) : c.k_ffn;
    const int64_t kl = can_logits ? next_chunk_count(c.k_logits, nl) : c.k_logits;
    bool grow_ffn = can_ffn && (!can_logits || pp.ffn >= pp.logits);
    const bool over_ffn = can_ffn && pp.ffn > budget, over_logits = can_logits && pp.logits > budget;
    if (over_ffn || over_logits) {
      grow_ffn = over_ffn && (!over_logits || pp.ffn >= pp.logits);
    } else if (can_ffn && can_logits) {
      // Every chunkable phase has its live bytes within the budget: the plan's excess is placement
      // (e.g. a per-chunk buffer larger than the residual stream, placed first, pushes the
      // long-lived tensors up). Simulate both: keep the one that fits with fewer chunks, else the
      // lower plan (ties: the larger phase).
      graph::Program pf = planned(g, shape, kf, c.k_logits, fit);
      graph::Program pl = planned(g, shape, c.k_ffn, kl, fit);
      c.plans += 2;
      const bool fits_f = pf.peak <= budget, fits_l = pl.peak <= budget;
      if (fits_f != fits_l) {
        grow_ffn = fits_f;
      } else if (fits_f) {
        grow_ffn = kf + c.k_logits < c.k_ffn + kl || (kf + c.k_logits == c.k_ffn + kl && pf.peak <= pl.peak);
      } else {
        grow_ffn = pf.peak < pl.peak || (pf.peak == pl.peak && grow_ffn);
      }
      (grow_ffn ? c.k_ffn : c.k_logits) = grow_ffn ? kf : kl;
      p = std::move(grow_ffn ? pf : pl);
      continue;
    }
    (grow_ffn ? c.k_ffn : c.k_logits) = grow_ffn ? kf : kl;
    p = planned(g, shape, c.k_ffn, c.k_logits, fit);
    ++c.plans;
  }
  c.fits = p.peak <= budget;
  if (!c.fits) c.k_ffn = c.k_logits = 1;
  c.peak = c.fits ? p.peak : unchunked;
  c.search_ms = ms_since(t0);
  return c;
}

ChunkChoice choose_chunks_brute_force(const graph::GraphTemplate& g, const graph::StepShape& shape,
                                      size_t budget, int64_t max_k) {
  const auto t0 = Clock::now();
  ChunkChoice best;
  const int64_t mf = std::min(max_k, std::max<int64_t>(1, shape.n_query));
  const int64_t ml = std::min(max_k, std::max<int64_t>(1, shape.n_logits));
  for (int64_t sum = 2; sum <= mf + ml && !best.fits; ++sum) {
    for (int64_t kf = std::max<int64_t>(1, sum - ml); kf <= std::min(mf, sum - 1); ++kf) {
      const int64_t kl = sum - kf;
      const size_t peak = planned_peak(g, shape, kf, kl);
      ++best.plans;
      if (peak > budget || (best.fits && peak >= best.peak)) continue;
      best.fits = true;
      best.k_ffn = kf;
      best.k_logits = kl;
      best.peak = peak;
    }
  }
  if (!best.fits) best.peak = planned_peak(g, shape, 1, 1);
  best.search_ms = ms_since(t0);
  return best;
}

ActivationStats activation_stats(const graph::GraphTemplate& g, const graph::Program& planned_prog) {
  const std::vector<Buffer> bufs = program_buffers(g, planned_prog, nullptr);
  ActivationStats s;
  s.peak = planned_prog.peak;
  s.lower_bound = live_lower_bound(bufs);
  s.average = live_average(bufs);
  for (const Buffer& b : bufs) s.no_reuse += b.size;
  return s;
}

graph::StepShape step_shape(int64_t context, double mask_ratio) {
  graph::StepShape s;
  s.n_query = s.n_kv = context;
  const auto masked = static_cast<int64_t>(std::ceil(mask_ratio * static_cast<double>(context) - 1e-9));
  s.n_logits = std::clamp<int64_t>(masked, 0, context);
  s.n_seqs = 1;
  return s;
}

int64_t largest_fitting(const std::function<bool(int64_t)>& fits, int64_t hi) {
  if (hi < 1 || !fits(1)) return 0;
  int64_t lo = 1, step = 2;  // fits(lo) holds
  while (step <= hi && fits(step)) {
    lo = step;
    step *= 2;
  }
  int64_t bad = std::min(step, hi + 1);  // fits(bad) fails (or is beyond hi)
  while (bad - lo > 1) {
    const int64_t mid = lo + (bad - lo) / 2;
    (fits(mid) ? lo : bad) = mid;
  }
  return lo;
}

int64_t largest_context(const graph::GraphTemplate& g, double mask_ratio, size_t activation_budget,
                        const std::function<size_t(int64_t)>& held) {
  return largest_fitting([&](int64_t L) {
    const size_t h = held ? held(L) : 0;
    return h <= activation_budget && chunk_floor(g, step_shape(L, mask_ratio)) <= activation_budget - h;
  });
}

size_t parse_size(const std::string& text) {
  const std::string forms =
      "expected a positive number with an optional unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, "
      "GiB, TiB, K, M, G, T (powers of 1024), e.g. 24GiB, 512MiB, 1.5GB or 4096";
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("bad memory size '" + text + "': " + forms);
  }
  std::string unit;
  for (size_t i = used; i < text.size(); ++i) {
    if (text[i] != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit units[] = {{"", 1},         {"b", 1},        {"kb", 1e3},     {"mb", 1e6},
                               {"gb", 1e9},     {"tb", 1e12},    {"kib", 0x1p10}, {"mib", 0x1p20},
                               {"gib", 0x1p30}, {"tib", 0x1p40}, {"k", 0x1p10},   {"m", 0x1p20},
                               {"g", 0x1p30},   {"t", 0x1p40}};
  const Unit* u =
      std::find_if(std::begin(units), std::end(units), [&](const Unit& x) { return unit == x.name; });
  if (u == std::end(units) || !std::isfinite(v) || text.find_first_of("xXpP") < used) {
    fail("bad memory size '" + text + "': " + forms);
  }
  const double bytes = v * u->scale;
  if (!(bytes >= 1)) fail("bad memory size '" + text + "': the size must be positive (at least one byte)");
  if (bytes >= 0x1p63) fail("bad memory size '" + text + "': too large");
  return static_cast<size_t>(bytes);
}

std::string format_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  char s[32];
  std::snprintf(s, sizeof s, "%.1f %s", b, u[i]);
  return s;
}

}  // namespace tessera::memory
