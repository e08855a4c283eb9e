// Lazy chunking: the bottleneck-driven search against the brute-force oracle on the real graph
// templates (dense LLaDA, Dream with GQA and biases, LLaDA-MoE) at toy widths, no chunking when the
// budget is ample, floor detection, L_max, and memory-size parsing.
#include "memory/chunk_optimizer.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "models/model.h"

namespace tessera::memory {
namespace {

// Toy widths where the three peaks (attention, FFN chunk, logits chunk) are of the same order, so
// every bottleneck occurs within the tested mask ratios.
ModelConfig toy(const std::string& geometry) {
  ModelConfig c = named_geometry(geometry);
  c.hidden = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = c.family == Family::Dream ? 2 : 4;
  c.head_dim = 16;
  c.intermediate = 256;
  c.vocab = 512;
  if (c.moe.n_experts > 0) {
    c.moe.n_experts = 8;
    c.moe.top_k = 2;
    c.moe.expert_inter = 64;
    c.moe.moe_layer.assign(2, 1);
  }
  return c;
}

graph::GraphTemplate toy_graph(const std::string& geometry) {
  const ModelConfig c = toy(geometry);
  return build_dense_graph(shape_only_weights(c, DType::BF16), graph_options(c, DType::BF16),
                           OutputMode::Sample);
}

// A real geometry (widths, vocabulary, layer kinds) cut to two layers: the same per-row sizes of the
// attention, FFN and logits phases, at a sixteenth of the planning time.
graph::GraphTemplate two_layers(const std::string& geometry) {
  ModelConfig c = named_geometry(geometry);
  c.n_layers = 2;
  if (!c.moe.moe_layer.empty()) c.moe.moe_layer.resize(2);
  return build_dense_graph(shape_only_weights(c, DType::BF16), graph_options(c, DType::BF16),
                           OutputMode::Sample);
}

TEST(ChunkOptimizer, NextChunkCountSkipsCountsWithTheSameRows) {
  EXPECT_EQ(next_chunk_count(1, 10), 2);   // 10 -> 5 rows
  EXPECT_EQ(next_chunk_count(2, 10), 3);   // 5 -> 4
  EXPECT_EQ(next_chunk_count(3, 10), 4);   // 4 -> 3
  EXPECT_EQ(next_chunk_count(4, 10), 5);   // 3 -> 2 (no K gives 3 rows but 4)
  EXPECT_EQ(next_chunk_count(5, 10), 10);  // 2 -> 1: K = 6..9 also give 2 rows
  EXPECT_EQ(next_chunk_count(10, 10), 10);
  EXPECT_EQ(next_chunk_count(1, 1), 1);
}

TEST(ChunkOptimizer, NoChunkingWhenTheBudgetIsAmple) {
  const graph::GraphTemplate g = toy_graph("llada-8b");
  const graph::StepShape s = step_shape(300, 0.9);
  const size_t unchunked = planned_peak(g, s, 1, 1);
  for (size_t budget : {unchunked, unchunked + 1, size_t{1} << 40}) {
    const ChunkChoice c = choose_chunks(g, s, budget);
    EXPECT_TRUE(c.fits);
    EXPECT_EQ(c.k_ffn, 1);
    EXPECT_EQ(c.k_logits, 1);
    EXPECT_EQ(c.peak, unchunked);
    EXPECT_EQ(c.plans, 1);  // one plan, no search
  }
}

TEST(ChunkOptimizer, AnImpossibleBudgetIsDetectedAtTheFloor) {
  const graph::GraphTemplate g = toy_graph("llada-8b");
  const graph::StepShape s = step_shape(300, 0.5);
  const size_t floor = chunk_floor(g, s);
  const ChunkChoice c = choose_chunks(g, s, floor - 1);
  EXPECT_FALSE(c.fits);
  EXPECT_EQ(c.floor, floor);
  EXPECT_EQ(c.plans, 2);  // the unchunked plan and the floor: no search below the floor
  EXPECT_EQ(c.peak, planned_peak(g, s, 1, 1));
  // At exactly the floor it fits; the floor is below the unchunked peak and the live lower bound of
  // the unchunked plan is above it (chunking removed bytes that were live at the peak).
  const ChunkChoice at = choose_chunks(g, s, floor);
  EXPECT_TRUE(at.fits);
  EXPECT_LE(at.peak, floor);
  EXPECT_LT(floor, planned_peak(g, s, 1, 1));
}

TEST(ChunkOptimizer, ChunkingTheBottleneckShrinksThePeakMonotonically) {
  const graph::GraphTemplate g = toy_graph("llada-8b");
  const graph::StepShape s = step_shape(256, 0.9);  // logits-dominated
  size_t prev = planned_peak(g, s, 1, 1);
  for (int64_t k = 2; k <= 16; k *= 2) {
    const size_t p = planned_peak(g, s, 1, k);
    EXPECT_LE(p, prev) << "K_logits " << k;
    prev = p;
  }
  EXPECT_LT(prev, planned_peak(g, s, 1, 1));
}

// Bottleneck search vs brute force, on every geometry, at budgets from just below the floor to the
// unchunked peak: floor + f * (unchunked peak - floor). The comparison, stated exactly:
//  - always: the same verdict (fits / does not fit), and a fitting plan within the budget;
//  - realistic contexts (1000 to 32768 tokens) with f >= 0.05: the same (K_ffn, K_logits);
//  - realistic contexts with 0 < f < 0.05: K_ffn + K_logits at most one above the oracle's minimum;
//  - f = 0 (the budget is the floor to the byte) and toy contexts: the verdict only.
// Why the search finds the oracle's pair: the FFN loops, the logits loop and the attention ops are
// disjoint in time, so the live peak is max(F(K_ffn), G(K_logits), N) with F and G non-increasing;
// the search grows only a K whose phase is above the budget, so it stops at the componentwise
// minimum, the unique fitting pair of least total.
// Where they legitimately differ: within a few percent of the floor, whether a pair fits depends on
// first-fit fragmentation (placement, not live bytes), which couples K_ffn and K_logits and is not
// monotone in either (llada2-mini, n = 61, ratio 1.0: (5, 21) misses the budget by 0.3%, (6, 21) and
// (5, 31) fit). The search then steps by simulating both candidates, a local choice that can end one
// chunk above the oracle (llada-moe-7b, ratio 0.5: (6, 13) vs (5, 13)) or on another pair of the
// same total. At f = 0 only a plan with no fragmentation at all fits, and the local steps can end far
// from the oracle (llada2-mini, ratio 0.5: (9, 26) vs (15, 16)). At toy contexts (24 to 130 tokens) the MoE
// scratch's fixed part and the step inputs make fragmentation a large share of the floor and only the verdict
// is compared.
struct Sweep {
  int cases = 0, identical = 0, chunked = 0, infeasible = 0;
  double search_ms = 0, brute_ms = 0;
};

void compare_with_brute_force(const char* geometry, int64_t n, bool realistic, Sweep& sw) {
  const graph::GraphTemplate g = two_layers(geometry);
  for (double ratio : {0.1, 0.5, 0.9, 1.0}) {
    const graph::StepShape s = step_shape(n, ratio);
    const size_t top = planned_peak(g, s, 1, 1), floor = chunk_floor(g, s);
    for (double f : {-0.01, 0.0, 0.003, 0.01, 0.02, 0.05, 0.1, 0.2, 0.45, 0.7, 0.95, 1.0}) {
      if (realistic && f < 0) continue;  // the oracle would walk the whole n x n grid
      const auto budget =
          static_cast<size_t>(static_cast<double>(floor) + f * static_cast<double>(top - floor));
      const ChunkChoice a = choose_chunks(g, s, budget);
      const ChunkChoice b = choose_chunks_brute_force(g, s, budget, n);
      const std::string what = std::string(geometry) + " n=" + std::to_string(n) +
                               " ratio=" + std::to_string(ratio) + " f=" + std::to_string(f) + ": search (" +
                               std::to_string(a.k_ffn) + ", " + std::to_string(a.k_logits) + "), oracle (" +
                               std::to_string(b.k_ffn) + ", " + std::to_string(b.k_logits) + ")";
      ASSERT_EQ(a.fits, b.fits) << what;
      ++sw.cases;
      sw.search_ms += a.search_ms;
      sw.brute_ms += b.search_ms;
      if (!a.fits) {
        ++sw.infeasible;
        EXPECT_GT(a.floor, budget) << what;
        continue;
      }
      EXPECT_LE(a.peak, budget) << what;
      EXPECT_EQ(a.peak, planned_peak(g, s, a.k_ffn, a.k_logits)) << what;
      const bool same = a.k_ffn == b.k_ffn && a.k_logits == b.k_logits;
      if (realistic) {
        EXPECT_TRUE(same || f < 0.05) << what;
        EXPECT_TRUE(f == 0.0 || a.k_ffn + a.k_logits <= b.k_ffn + b.k_logits + 1) << what;
      }
      sw.identical += same;
      sw.chunked += a.k_ffn + a.k_logits > 2;
    }
  }
}

TEST(ChunkOptimizer, BottleneckSearchMatchesBruteForce) {
  Sweep sw;
  for (const char* geometry : {"llada-8b", "dream-7b", "llada-moe-7b", "llada2-mini"}) {
    for (int64_t n : {1000, 4096, 32768}) compare_with_brute_force(geometry, n, true, sw);
    for (int64_t n : {24, 61, 130}) compare_with_brute_force(geometry, n, false, sw);
  }
  std::printf(
      "%d cases (%d chunked, %d infeasible): %d identical (K_ffn, K_logits); search %.1f ms, "
      "brute force %.1f ms in all\n",
      sw.cases, sw.chunked, sw.infeasible, sw.identical, sw.search_ms, sw.brute_ms);
  EXPECT_GT(sw.chunked, sw.cases / 2);  // the sweep exercises the search, not just the trivial cases
  EXPECT_GT(sw.infeasible, 0);
  EXPECT_GT(sw.identical, sw.cases * 9 / 10 - sw.infeasible);
  EXPECT_LT(sw.search_ms, sw.brute_ms);
}

TEST(ChunkOptimizer, FullLogitsOutputIsNotChunkable) {
  // The Logits mode writes a [n_logits, vocab] output: K_logits cannot shrink it, so the search
  // must not spin through K_logits values and must report the verdict of the floor.
  const ModelConfig c = toy("llada-8b");
  const graph::GraphTemplate g = build_dense_graph(shape_only_weights(c, DType::BF16),
                                                   graph_options(c, DType::BF16), OutputMode::Logits);
  const graph::StepShape s = step_shape(200, 1.0);
  const size_t floor = chunk_floor(g, s);
  const ChunkChoice fit = choose_chunks(g, s, floor);
  EXPECT_TRUE(fit.fits);
  EXPECT_EQ(fit.k_logits, 1);
  EXPECT_LT(fit.plans, 20);
  EXPECT_FALSE(choose_chunks(g, s, floor - 1).fits);
}

TEST(ChunkOptimizer, ActivationStatsAreOrdered) {
  const graph::GraphTemplate g = toy_graph("dream-7b");
  graph::Program p = graph::instantiate(g, step_shape(100, 0.5));
  plan(g, p);
  const ActivationStats a = activation_stats(g, p);
  EXPECT_EQ(a.peak, p.peak);
  EXPECT_EQ(a.lower_bound, p.lower_bound);
  EXPECT_GE(a.no_reuse, a.peak);
  EXPECT_GE(a.peak, a.lower_bound);
  EXPECT_GT(a.peak_to_average(), 1.0);
}

TEST(ChunkOptimizer, LargestFittingBisects) {
  for (int64_t limit : {0, 1, 2, 3, 1000, 1023, 1024, 1025, 987654}) {
    int calls = 0;
    const int64_t got = largest_fitting([&](int64_t L) {
      ++calls;
      return L <= limit;
    });
    EXPECT_EQ(got, limit);
    EXPECT_LE(calls, 45);
  }
  EXPECT_EQ(largest_fitting([](int64_t) { return true; }, 5000), 5000);
}

TEST(ChunkOptimizer, LargestContextIsTheLastContextWhoseFloorFits) {
  const graph::GraphTemplate g = toy_graph("llada-8b");
  const size_t budget = chunk_floor(g, step_shape(5000, 0.3)) + 12345;
  const int64_t L = largest_context(g, 0.3, budget);
  EXPECT_GE(L, 5000);
  EXPECT_LE(chunk_floor(g, step_shape(L, 0.3)), budget);
  EXPECT_GT(chunk_floor(g, step_shape(L + 1, 0.3)), budget);
  EXPECT_TRUE(choose_chunks(g, step_shape(L, 0.3), budget).fits);
  EXPECT_FALSE(choose_chunks(g, step_shape(L + 1, 0.3), budget).fits);
}

// A KV cache held for the request: the floor plus L x bytes per token must fit, so L_max shrinks.
TEST(ChunkOptimizer, LargestContextCountsAKvCachePerToken) {
  const graph::GraphTemplate g = toy_graph("llada-8b");
  const size_t budget = chunk_floor(g, step_shape(5000, 0.3)) + 12345, per_token = 4096;
  const int64_t plain = largest_context(g, 0.3, budget);
  const auto cache = [&](int64_t n) { return static_cast<size_t>(n) * per_token; };
  const int64_t L = largest_context(g, 0.3, budget, cache);
  EXPECT_LT(L, plain);
  EXPECT_LE(chunk_floor(g, step_shape(L, 0.3)) + static_cast<size_t>(L) * per_token, budget);
  EXPECT_GT(chunk_floor(g, step_shape(L + 1, 0.3)) + static_cast<size_t>(L + 1) * per_token, budget);
  EXPECT_EQ(largest_context(g, 0.3, 1000, [](int64_t n) { return static_cast<size_t>(n) * 4096; }),
            0);  // not even one token's cache fits
  // Memory quadratic in L (SparseD patterns): the same rule.
  const auto quad = [](int64_t n) { return static_cast<size_t>(n * n); };
  const int64_t Q = largest_context(g, 0.3, budget, quad);
  EXPECT_LT(Q, plain);
  EXPECT_LE(chunk_floor(g, step_shape(Q, 0.3)) + quad(Q), budget);
  EXPECT_GT(chunk_floor(g, step_shape(Q + 1, 0.3)) + quad(Q + 1), budget);
}

TEST(ChunkOptimizer, StepShapeRoundsMaskedUp) {
  EXPECT_EQ(step_shape(4096, 0.1).n_logits, 410);
  EXPECT_EQ(step_shape(4096, 0.5).n_logits, 2048);
  EXPECT_EQ(step_shape(10, 1.0).n_logits, 10);
  EXPECT_EQ(step_shape(10, 0.0).n_logits, 0);
  EXPECT_EQ(step_shape(10, 0.5).n_kv, 10);
}

TEST(MemorySize, ParsesUnits) {
  EXPECT_EQ(parse_size("24GiB"), size_t{24} << 30);
  EXPECT_EQ(parse_size("512MiB"), size_t{512} << 20);
  EXPECT_EQ(parse_size("1.5GB"), size_t{1500000000});
  EXPECT_EQ(parse_size("4096"), size_t{4096});
  EXPECT_EQ(parse_size("4096B"), size_t{4096});
  EXPECT_EQ(parse_size("40 gib"), size_t{40} << 30);
  EXPECT_EQ(parse_size("2G"), size_t{2} << 30);
  EXPECT_EQ(parse_size("1.5k"), size_t{1536});
  EXPECT_EQ(parse_size("3TB"), size_t{3000000000000});
}

TEST(MemorySize, RejectsBadSizesClearly) {
  for (const char* bad :
       {"", "GiB", "24XB", "24 GiBs", "-1GiB", "0", "nan", "inf", "0x10", "1e30TiB", "24GiB!"}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(MemorySize, Formats) {
  EXPECT_EQ(format_bytes(0), "0.0 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(24.0 * (1 << 30)), "24.0 GiB");
}

}  // namespace
}  // namespace tessera::memory
