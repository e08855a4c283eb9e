// Lazy chunking (Mosaic 4.4): no chunking unless the planned peak exceeds the budget; then the
// bottleneck-driven search grows the chunk count of whichever chunkable op sets the peak, re-plans,
// and stops when the plan fits or only the non-chunkable floor is left. A brute-force search over
// all (K_ffn, K_logits) is kept as the test oracle.
#pragma once
#include <cstddef>
#include <cstdint>

#include "graph/graph.h"
#include "memory/planner.h"

namespace tessera::memory {

struct ChunkChoice {
  int64_t k_ffn = 1, k_logits = 1;
  size_t peak = 0;   // planned activation peak with these chunk counts
  size_t floor = 0;  // peak with every chunkable op at one row per chunk (the non-chunkable floor)
  bool fits = false;
  int plans = 0;  // plans evaluated by the search
  double search_ms = 0.0;
};

// Planned peak of `shape` with the given chunk counts.
size_t planned_peak(const graph::GraphTemplate& g, graph::StepShape shape, int64_t k_ffn, int64_t k_logits,
                    Fit fit = Fit::First);
// The non-chunkable floor of `shape` (FFN and logits chunked down to one row per chunk).
size_t chunk_floor(const graph::GraphTemplate& g, const graph::StepShape& shape);

ChunkChoice choose_chunks(const graph::GraphTemplate& g, const graph::StepShape& shape, size_t budget);
// Oracle: the (K_ffn, K_logits) with the smallest K_ffn + K_logits (then the smaller peak) that fits,
// over all pairs up to max_k each.
ChunkChoice choose_chunks_brute_force(const graph::GraphTemplate& g, const graph::StepShape& shape,
                                      size_t budget, int64_t max_k);

}  // namespace tessera::memory
