// Mosaic: activation peaks of four memory schemes on the real geometries, the largest context that
// fits 24 GiB and 40 GiB in all (weights included), peak-to-average of live bytes, bottleneck vs
// brute-force search time, first-fit vs the exhaustive optimum, and measurements of a real CPU
// forward of llada-mid (RSS growth vs plan, step latency with chunking off vs on).
//   (i)   one buffer per tensor, full logits: the sum of every activation buffer of the unchunked
//         full-logits program (no reuse at all; an upper bound, not what PyTorch does);
//   (ii)  liveness reuse, full logits: the planned peak of that program;
//   (iii) + mask-only logits: the planned peak of the sampling program (logits of masked rows only);
//   (iv)  + lazy chunking: the sampling program with the K_ffn / K_logits the optimizer picks.
// Usage: mosaic_bench [--json FILE] [--no-cpu] [--cpu-context 2048] [--reps 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "memory/chunk_optimizer.h"

using namespace tessera;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
const double GiB = 1073741824.0;
std::string gib(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", b / GiB);
  return s;
}

struct Geometry {
  std::string name;
  ModelConfig cfg;
  size_t weights = 0;                 // bf16: parameters x 2
  graph::GraphTemplate sample, full;  // mask-only sampling / full-logits programs
};

// A geometry with its graphs, or nothing when this build does not know it (yet).
std::optional<Geometry> load_geometry(const std::string& name) {
  try {
    Geometry g;
    g.name = name;
    g.cfg = named_geometry(name);
    g.weights = static_cast<size_t>(g.cfg.param_count()) * 2;
    const DenseWeights w = shape_only_weights(g.cfg, DType::BF16);
    const GraphOptions o = graph_options(g.cfg, DType::BF16);
    g.sample = build_dense_graph(w, o, OutputMode::Sample);
    g.full = build_dense_graph(w, o, OutputMode::Logits);
    return g;
  } catch (const std::exception& e) {
    std::printf("# %s: not available (%s)\n", name.c_str(), e.what());
    return std::nullopt;
  }
}

memory::ActivationStats stats(const graph::GraphTemplate& g, graph::StepShape s, int64_t kf = 1,
                              int64_t kl = 1) {
  s.k_ffn = kf;
  s.k_logits = kl;
  graph::Program p = graph::instantiate(g, s);
  memory::plan(g, p);
  return memory::activation_stats(g, p);
}

// The four schemes' activation bytes at one point; lazy under `act_budget` (fits = false: none).
struct Point {
  memory::ActivationStats none, reuse, mask, lazy;
  memory::ChunkChoice choice;
};
Point measure_point(const Geometry& geo, int64_t L, double r, size_t act_budget) {
  Point p;
  const graph::StepShape full = memory::step_shape(L, 1.0), masked = memory::step_shape(L, r);
  p.reuse = stats(geo.full, full);
  p.none = p.reuse;  // no_reuse of the same program
  p.mask = stats(geo.sample, masked);
  p.choice = memory::choose_chunks(geo.sample, masked, act_budget);
  if (p.choice.fits) p.lazy = stats(geo.sample, masked, p.choice.k_ffn, p.choice.k_logits);
  return p;
}

// L_max of each scheme for an activation budget.
struct Lmax {
  int64_t none = 0, reuse = 0, mask = 0, lazy = 0;
};
Lmax l_max(const Geometry& geo, double r, size_t budget) {
  Lmax m;
  if (budget == 0) return m;
  m.none = memory::largest_fitting(
      [&](int64_t L) { return stats(geo.full, memory::step_shape(L, 1.0)).no_reuse <= budget; });
  m.reuse = memory::largest_fitting(
      [&](int64_t L) { return memory::planned_peak(geo.full, memory::step_shape(L, 1.0), 1, 1) <= budget; });
  m.mask = memory::largest_fitting(
      [&](int64_t L) { return memory::planned_peak(geo.sample, memory::step_shape(L, r), 1, 1) <= budget; });
  m.lazy = memory::largest_context(geo.sample, r, budget);
  return m;
}

size_t act_budget(const Geometry& geo, double total_gib) {
  const auto total = static_cast<size_t>(total_gib * GiB);
  return total > geo.weights ? total - geo.weights : 0;
}

const std::vector<int64_t> kContexts = {4096, 32768, 131072};
const std::vector<double> kRatios = {0.1, 0.5, 0.9};
const std::vector<double> kBudgets = {24, 40};

json peaks_table(const std::vector<Geometry>& geos, std::vector<double>& par_reduction, double& worst_frag) {
  json rows = json::array();
  std::printf("\n## Activation peak (GiB) per scheme; (iv) under a 24 GiB total budget\n");
  std::printf(
      "| geometry | context | mask | (i) no reuse | (ii) reuse | (iii) mask-only | (iv) lazy | K_ffn, "
      "K_logits "
      "| floor | PAR (ii) | PAR (iv) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Geometry& geo : geos) {
    for (int64_t L : kContexts) {
      for (double r : kRatios) {
        const Point p = measure_point(geo, L, r, act_budget(geo, 24));
        const size_t floor = memory::chunk_floor(geo.sample, memory::step_shape(L, r));
        worst_frag = std::max({worst_frag, static_cast<double>(p.reuse.peak) / p.reuse.lower_bound,
                               static_cast<double>(p.mask.peak) / p.mask.lower_bound});
        std::string lazy = "does not fit", ks = "-", par_iv = "-";
        if (p.choice.fits) {
          lazy = gib(static_cast<double>(p.lazy.peak));
          ks = std::to_string(p.choice.k_ffn) + ", " + std::to_string(p.choice.k_logits);
          char b[16];
          std::snprintf(b, sizeof b, "%.2f", p.lazy.peak_to_average());
          par_iv = b;
          par_reduction.push_back(p.reuse.peak_to_average() / p.lazy.peak_to_average());
        }
        std::printf("| %s | %lld | %.1f | %s | %s | %s | %s | %s | %s | %.2f | %s |\n", geo.name.c_str(),
                    static_cast<long long>(L), r, gib(static_cast<double>(p.none.no_reuse)).c_str(),
                    gib(static_cast<double>(p.reuse.peak)).c_str(),
                    gib(static_cast<double>(p.mask.peak)).c_str(), lazy.c_str(), ks.c_str(),
                    gib(static_cast<double>(floor)).c_str(), p.reuse.peak_to_average(), par_iv.c_str());
        rows.push_back({{"geometry", geo.name},
                        {"context", L},
                        {"mask_ratio", r},
                        {"no_reuse_full", p.none.no_reuse},
                        {"reuse_full", p.reuse.peak},
                        {"mask_only", p.mask.peak},
                        {"lazy_fits", p.choice.fits},
                        {"lazy", p.choice.fits ? p.lazy.peak : 0},
                        {"k_ffn", p.choice.k_ffn},
                        {"k_logits", p.choice.k_logits},
                        {"floor", floor},
                        {"par_reuse_full", p.reuse.peak_to_average()},
                        {"par_mask_only", p.mask.peak_to_average()},
                        {"par_lazy", p.choice.fits ? p.lazy.peak_to_average() : 0.0}});
      }
    }
  }
  return rows;
}

json lmax_table(const std::vector<Geometry>& geos, std::vector<double>& vs_none,
                std::vector<double>& vs_reuse) {
  json rows = json::array();
  std::printf("\n## L_max (tokens) at a total memory budget (bf16 weights included)\n");
  std::printf(
      "| geometry | budget | weights | mask | (i) | (ii) | (iii) | (iv) | (iv)/(i) | (iv)/(ii) |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Geometry& geo : geos) {
    for (double total : kBudgets) {
      const size_t b = act_budget(geo, total);
      for (double r : kRatios) {
        const Lmax m = l_max(geo, r, b);
        const double a = m.none > 0 ? static_cast<double>(m.lazy) / static_cast<double>(m.none) : 0;
        const double c = m.reuse > 0 ? static_cast<double>(m.lazy) / static_cast<double>(m.reuse) : 0;
        if (b == 0) {
          std::printf("| %s | %.0f GiB | %s GiB | %.1f | the weights exceed the budget |||||\n",
                      geo.name.c_str(), total, gib(static_cast<double>(geo.weights)).c_str(), r);
        } else {
          std::printf("| %s | %.0f GiB | %s GiB | %.1f | %lld | %lld | %lld | %lld | %.1fx | %.1fx |\n",
                      geo.name.c_str(), total, gib(static_cast<double>(geo.weights)).c_str(), r,
                      static_cast<long long>(m.none), static_cast<long long>(m.reuse),
                      static_cast<long long>(m.mask), static_cast<long long>(m.lazy), a, c);
          vs_none.push_back(a);
          vs_reuse.push_back(c);
        }
        rows.push_back({{"geometry", geo.name},
                        {"budget_gib", total},
                        {"weights", geo.weights},
                        {"mask_ratio", r},
                        {"l_max_no_reuse_full", m.none},
                        {"l_max_reuse_full", m.reuse},
                        {"l_max_mask_only", m.mask},
                        {"l_max_lazy", m.lazy}});
      }
    }
  }
  return rows;
}

// Bottleneck-driven search vs the brute-force oracle at points where chunking is needed.
// The paper's brute force: every (K_ffn, K_logits) in a G x G grid planned (G = 32 here).
constexpr int64_t kGrid = 32;
double full_grid_ms(const graph::GraphTemplate& g, const graph::StepShape& s) {
  const auto t0 = Clock::now();
  size_t best = SIZE_MAX;
  for (int64_t kf = 1; kf <= kGrid; ++kf) {
    for (int64_t kl = 1; kl <= kGrid; ++kl) best = std::min(best, memory::planned_peak(g, s, kf, kl));
  }
  if (best == 0) std::printf("(a zero peak)");  // uses the result, so the loop is not optimised away
  return ms_since(t0);
}

json search_table(const std::vector<Geometry>& geos, std::vector<double>& pct,
                  std::vector<double>& grid_pct) {
  json rows = json::array();
  std::printf(
      "\n## Chunk search: bottleneck-driven vs brute force (budget 24 GiB; 40 GiB where the weights "
      "exceed 24)\n");
  std::printf(
      "| geometry | context | mask | bottleneck (K_ffn, K_logits) | plans | ms | brute force (K_ffn, "
      "K_logits) | plans | ms | time | full 32x32 grid ms | time "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Geometry& geo : geos) {
    const size_t b = act_budget(geo, 24) > 0 ? act_budget(geo, 24) : act_budget(geo, 40);
    for (int64_t L : {int64_t{32768}, int64_t{131072}}) {
      for (double r : kRatios) {
        const graph::StepShape s = memory::step_shape(L, r);
        std::vector<double> t;
        memory::ChunkChoice a;
        for (int rep = 0; rep < 5; ++rep) {
          a = memory::choose_chunks(geo.sample, s, b);
          t.push_back(a.search_ms);
        }
        std::sort(t.begin(), t.end());
        if (!a.fits || a.k_ffn + a.k_logits <= 2 || a.k_ffn + a.k_logits > 90)
          continue;  // no search / too costly
        const memory::ChunkChoice o = memory::choose_chunks_brute_force(geo.sample, s, b, L);
        const double ratio = t[2] / o.search_ms * 100.0;
        pct.push_back(ratio);
        const double grid = full_grid_ms(geo.sample, s);
        grid_pct.push_back(t[2] / grid * 100.0);
        std::printf(
            "| %s | %lld | %.1f | %lld, %lld | %d | %.2f | %lld, %lld | %d | %.1f | %.2f%% | %.0f | %.2f%% "
            "|\n",
            geo.name.c_str(), static_cast<long long>(L), r, static_cast<long long>(a.k_ffn),
            static_cast<long long>(a.k_logits), a.plans, t[2], static_cast<long long>(o.k_ffn),
            static_cast<long long>(o.k_logits), o.plans, o.search_ms, ratio, grid, grid_pct.back());
        rows.push_back({{"geometry", geo.name},
                        {"context", L},
                        {"mask_ratio", r},
                        {"k_ffn", a.k_ffn},
                        {"k_logits", a.k_logits},
                        {"plans", a.plans},
                        {"ms", t[2]},
                        {"bf_k_ffn", o.k_ffn},
                        {"bf_k_logits", o.k_logits},
                        {"bf_plans", o.plans},
                        {"bf_ms", o.search_ms},
                        {"grid_ms", grid}});
      }
    }
  }
  return rows;
}

// First-fit (the planner) vs the exhaustive optimum on random small graphs, as in the planner test.
json first_fit_vs_optimum() {
  std::mt19937 rng(7);
  double worst = 1, sum = 0, ff_ms = 0, opt_ms = 0;
  const int trials = 300;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<memory::Buffer> b(static_cast<size_t>(3 + rng() % 6));  // 3..8 buffers
    for (auto& x : b) {
      x.size = (1 + rng() % 8) * memory::kAlign;
      x.first = static_cast<int>(rng() % 8);
      x.last = x.first + static_cast<int>(rng() % 4);
    }
    auto t0 = Clock::now();
    const size_t ff = memory::place(b).peak;
    ff_ms += ms_since(t0);
    t0 = Clock::now();
    const size_t opt = memory::place_optimal(b).peak;
    opt_ms += ms_since(t0);
    const double ratio = static_cast<double>(ff) / static_cast<double>(opt);
    worst = std::max(worst, ratio);
    sum += ratio;
  }
  std::printf("\n## First-fit vs the exhaustive optimum, %d random graphs of 3-8 buffers\n", trials);
  std::printf(
      "first-fit / optimum: mean %.3f, worst %.3f; planning time %.3f ms vs %.1f ms in all (%.3f%%)\n",
      sum / trials, worst, ff_ms, opt_ms, ff_ms / opt_ms * 100);
  return {{"graphs", trials},
          {"mean_ratio", sum / trials},
          {"worst_ratio", worst},
          {"first_fit_ms", ff_ms},
          {"optimum_ms", opt_ms}};
}

// ---- CPU: a real forward of llada-mid ----------------------------------------------------------

struct Canvas {
  std::vector<int32_t> tokens, masked;
};
Canvas make_canvas(const ModelConfig& c, int64_t L, double r) {
  Canvas cv;
  for (int64_t i = 0; i < L; ++i) {
    const bool m = static_cast<double>(rng_mix(static_cast<uint64_t>(i)) % 10000) < r * 10000;
    cv.tokens.push_back(m ? c.mask_id : static_cast<int32_t>((i * 7919) % 100000));
    if (m) cv.masked.push_back(static_cast<int32_t>(i));
  }
  return cv;
}

// Step time (ms) and the step's RSS growth (high-water mark over the RSS before it).
std::pair<double, size_t> timed_step(Engine& e, const Canvas& cv) {
  std::vector<int32_t> tok(cv.masked.size());
  std::vector<float> conf(cv.masked.size());
  reset_peak_rss();
  const size_t rss0 = process_memory().rss;
  const auto t0 = Clock::now();
  e.predict(cv.tokens, cv.masked, SampleParams{}, tok, conf);
  const double ms = ms_since(t0);
  return {ms, process_memory().peak - rss0};
}

json cpu_forward(int64_t L, int reps) {
  const ModelConfig c = named_geometry("llada-mid");
  const Canvas cv = make_canvas(c, L, 0.5), warm = make_canvas(c, 64, 0.5);
  auto off = Engine::synthetic(c, EngineOptions{}, DType::BF16);
  timed_step(*off, warm);  // threads and small primitives; the workspace below is measured fresh
  const size_t ws_before = off->workspace_resident();
  const auto [ms0, rss_growth] = timed_step(*off, cv);
  const size_t plan_off = off->last_step().planned_peak, ws_after = off->workspace_resident();
  // A budget that forces chunking: a third of the unchunked activation peak.
  EngineOptions o;
  o.memory_budget = off->model().weight_bytes() + plan_off / 3;
  auto on = Engine::synthetic(c, o, DType::BF16);
  timed_step(*on, warm);
  const size_t on_before = on->workspace_resident();
  const auto [ms1, rss_on] = timed_step(*on, cv);
  const StepStats st = on->last_step();
  // Latency: alternate the two engines step by step, median of each.
  std::vector<double> t_off{ms0}, t_on{ms1};
  for (int i = 1; i < reps; ++i) {
    t_off.push_back(timed_step(*off, cv).first);
    t_on.push_back(timed_step(*on, cv).first);
  }
  std::sort(t_off.begin(), t_off.end());
  std::sort(t_on.begin(), t_on.end());
  const double m_off = t_off[t_off.size() / 2], m_on = t_on[t_on.size() / 2];
  const double mib = 1048576.0;
  std::printf("\n## CPU: llada-mid (synthetic bf16 weights %.1f MiB), context %lld, mask ratio 0.5\n",
              static_cast<double>(off->model().weight_bytes()) / mib, static_cast<long long>(L));
  std::printf(
      "| chunking | K_ffn, K_logits | planned peak | RSS growth of the step (+ resident before) | RSS / plan "
      "| step ms (median of %d) |\n|---|---|---|---|---|---|\n",
      reps);
  std::printf("| off | 1, 1 | %.1f MiB | %.1f MiB (+ %.1f) | %.3f | %.0f |\n", plan_off / mib,
              rss_growth / mib, ws_before / mib, static_cast<double>(rss_growth + ws_before) / plan_off,
              m_off);
  std::printf("| on (budget %.1f MiB) | %lld, %lld | %.1f MiB | %.1f MiB (+ %.1f) | %.3f | %.0f |\n",
              static_cast<double>(o.memory_budget) / mib, static_cast<long long>(st.shape.k_ffn),
              static_cast<long long>(st.shape.k_logits), st.planned_peak / mib, rss_on / mib, on_before / mib,
              static_cast<double>(rss_on + on_before) / st.planned_peak, m_on);
  std::printf(
      "chunking overhead: %+.1f%% step latency; resident workspace after the unchunked step %.1f MiB\n",
      (m_on / m_off - 1) * 100, ws_after / mib);
  return {{"geometry", "llada-mid"},
          {"context", L},
          {"mask_ratio", 0.5},
          {"planned_off", plan_off},
          {"rss_growth_off", rss_growth},
          {"resident_before_off", ws_before},
          {"planned_on", st.planned_peak},
          {"rss_growth_on", rss_on},
          {"resident_before_on", on_before},
          {"k_ffn_on", st.shape.k_ffn},
          {"k_logits_on", st.shape.k_logits},
          {"ms_off", t_off},
          {"ms_on", t_on},
          {"overhead_pct", (m_on / m_off - 1) * 100}};
}

std::string range(std::vector<double> v, const char* fmt) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  char s[64];
  std::snprintf(s, sizeof s, fmt, v.front(), v.back());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool cpu = true;
  int64_t cpu_context = 2048;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const bool has = i + 1 < argc;
    if (k == "--json" && has) {
      json_path = argv[++i];
    } else if (k == "--no-cpu") {
      cpu = false;
    } else if (k == "--cpu-context" && has) {
      cpu_context = std::stoll(argv[++i]);
    } else if (k == "--reps" && has) {
      reps = std::max(1, std::stoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: mosaic_bench [--json FILE] [--no-cpu] [--cpu-context N] [--reps N]\n");
      return 2;
    }
  }
  std::vector<Geometry> geos;
  for (const char* name : {"llada-8b", "dream-7b", "llada-moe-7b", "llada2-mini"}) {
    if (auto g = load_geometry(name)) geos.push_back(std::move(*g));
  }
  json out;
  std::vector<double> par, vs_none, vs_reuse, search_pct, grid_pct;
  double worst_frag = 1.0;
  out["peaks"] = peaks_table(geos, par, worst_frag);
  out["l_max"] = lmax_table(geos, vs_none, vs_reuse);
  out["search"] = search_table(geos, search_pct, grid_pct);
  out["first_fit_vs_optimum"] = first_fit_vs_optimum();
  double par_mean = 0;
  for (double x : par) par_mean += x / static_cast<double>(par.size());
  std::printf("\n## Headline\n");
  std::printf("L_max (iv) / (i): %s; (iv) / (ii): %s (paper: 15.89-32.98x over its baselines)\n",
              range(vs_none, "%.1fx-%.1fx").c_str(), range(vs_reuse, "%.1fx-%.1fx").c_str());
  std::printf("peak-to-average of live bytes, (ii) / (iv): mean %.2fx, %s (paper: 2.71x lower)\n", par_mean,
              range(par, "%.2fx-%.2fx").c_str());
  std::printf(
      "bottleneck search time / pruned brute force: %s; / the full 32x32 grid: %s (paper: 0.28-0.32%%)\n",
      range(search_pct, "%.2f%%-%.2f%%").c_str(), range(grid_pct, "%.2f%%-%.2f%%").c_str());
  std::printf("first-fit peak / live lower bound on the real graphs, worst over the table: %.4f\n",
              worst_frag);
  out["headline"] = {{"l_max_vs_no_reuse", vs_none},
                     {"l_max_vs_reuse", vs_reuse},
                     {"par_reduction", par},
                     {"search_pct_of_brute_force", search_pct},
                     {"search_pct_of_full_grid", grid_pct},
                     {"worst_first_fit_over_lower_bound", worst_frag}};
  if (cpu) out["cpu"] = cpu_forward(cpu_context, reps);
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
