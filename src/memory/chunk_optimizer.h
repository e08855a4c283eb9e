// Lazy chunking (Mosaic 4.4): no chunking unless the planned peak exceeds the budget; then the
// bottleneck-driven search grows the chunk count of whichever chunkable op sets the peak (FFN rows
// K_ffn or logit rows K_logits), re-plans, and stops when the plan fits or when only the
// non-chunkable floor is left. A brute-force search is kept as the test oracle. Also: the activation
// figures of a plan, the largest context that fits a budget, and memory sizes ("24GiB").
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "graph/graph.h"
#include "memory/planner.h"

namespace tessera::memory {

struct ChunkChoice {
  int64_t k_ffn = 1, k_logits = 1;
  size_t peak = 0;   // planned activation peak with these chunk counts
  size_t floor = 0;  // the non-chunkable floor; computed only when the unchunked plan does not fit
  bool fits = false;
  int plans = 0;  // plans evaluated by the search
  double search_ms = 0.0;
};

// Planned peak of `shape` with the given chunk counts.
size_t planned_peak(const graph::GraphTemplate& g, graph::StepShape shape, int64_t k_ffn, int64_t k_logits,
                    Fit fit = Fit::First);
// The non-chunkable floor of `shape`: the planned peak with FFN and logits at one row per chunk.
size_t chunk_floor(const graph::GraphTemplate& g, const graph::StepShape& shape, Fit fit = Fit::First);
// The smallest chunk count above k whose chunks have fewer rows than k's (K values that give the
// same rows per chunk give the same program, so the searches skip them): n rows in chunks of
// ceil(n / k); returns k when the chunks are already one row.
int64_t next_chunk_count(int64_t k, int64_t n);

// The bottleneck-driven search (shape.k_ffn / k_logits are ignored). Starts at K = (1, 1); when
// that plan exceeds `budget`, plans the floor once (above the budget: no search, fits = false);
// otherwise, while the plan exceeds the budget and its floor, grows the chunk count of the phase
// with the most live bytes (an FFN loop: K_ffn, the logits loop: K_logits), each to its next
// distinct chunk size, and re-plans.
ChunkChoice choose_chunks(const graph::GraphTemplate& g, const graph::StepShape& shape, size_t budget,
                          Fit fit = Fit::First);
// Oracle: among all (K_ffn, K_logits) up to max_k each, the pairs that fit with the smallest
// K_ffn + K_logits, and among those the smallest peak (then the smaller K_ffn). Enumerates the
// pairs in order of K_ffn + K_logits and stops after the first total that has a fitting pair (the
// same answer as the full grid, at a fraction of its cost). Not fitting: K = (1, 1), fits = false.
ChunkChoice choose_chunks_brute_force(const graph::GraphTemplate& g, const graph::StepShape& shape,
                                      size_t budget, int64_t max_k);

// Activation figures of a planned program (bytes).
struct ActivationStats {
  size_t peak = 0;         // the plan's arena
  size_t lower_bound = 0;  // max over ops of the live bytes (no placement can beat it)
  double average = 0.0;    // mean over ops of the live bytes
  size_t no_reuse = 0;     // one buffer per tensor for the whole forward: the sum of all buffers
  double peak_to_average() const { return average > 0 ? static_cast<double>(lower_bound) / average : 0.0; }
};
ActivationStats activation_stats(const graph::GraphTemplate& g, const graph::Program& planned);

// One packed sequence of `context` tokens of which ceil(mask_ratio * context) need logits.
graph::StepShape step_shape(int64_t context, double mask_ratio);
// The largest L in [0, hi] with fits(L), for a predicate that holds up to some L and not above
// (0 when fits(1) is false). Doubling, then bisection: about 2 log2(L) calls.
int64_t largest_fitting(const std::function<bool(int64_t)>& fits, int64_t hi = int64_t{1} << 26);
// L_max: the largest context whose non-chunkable floor fits `activation_budget` at this mask ratio
// (what the lazy chunking optimizer can reach). held(L), when given, is the memory a request of context
// L holds besides its plan (a KV cache, SparseD patterns; non-decreasing in L): floor + held(L) must fit.
int64_t largest_context(const graph::GraphTemplate& g, double mask_ratio, size_t activation_budget,
                        const std::function<size_t(int64_t)>& held = {});

// Memory sizes: "24GiB", "512 MiB", "1.5GB", "4096" (bytes). Units (case-insensitive): B; KB, MB,
// GB, TB (powers of 1000); KiB, MiB, GiB, TiB and K, M, G, T (powers of 1024). Throws Error with
// the accepted forms for anything else, and for sizes that are not positive.
size_t parse_size(const std::string& text);
// "24.0 GiB"
std::string format_bytes(double bytes);

}  // namespace tessera::memory
