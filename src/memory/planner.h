// The memory planner: liveness over the whole forward, then an offset for every transient tensor
// in one arena (first-fit by default, best-fit as an option). An exhaustive optimum for small
// problems serves as the test oracle.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "graph/graph.h"

namespace tessera::memory {

struct Buffer {
  size_t size = 0;
  int first = 0, last = 0;  // live over op indices [first, last]
};

enum class Fit { First, Best };

struct Placement {
  std::vector<size_t> offsets;
  size_t peak = 0;
};

constexpr size_t kAlign = 256;  // every offset is a multiple of this (GPU-friendly)

// Greedy placement: buffers in order, each at the lowest (First) or the tightest (Best) gap among
// the placed buffers whose lifetimes overlap it. Two orders are tried, the lower arena is kept:
// by size (largest first) and by lifetime (longest first, then largest).
Placement place(std::span<const Buffer> bufs, Fit fit = Fit::First);
// Places buffers in the given order at the lowest feasible offset.
Placement place_in_order(std::span<const Buffer> bufs, std::span<const int> order);
// Exact minimum arena over all placement orders (n <= 9): lowest-offset placement in the order of
// an optimal solution's offsets reproduces it, so trying every order is exact.
Placement place_optimal(std::span<const Buffer> bufs);
// Bytes live at each op index 0..max(last) (sizes rounded up to kAlign).
std::vector<size_t> live_bytes(std::span<const Buffer> bufs);
// max over ops of the bytes live at that op: no placement can beat it.
size_t live_lower_bound(std::span<const Buffer> bufs);
// Mean over ops of the bytes live at that op.
double live_average(std::span<const Buffer> bufs);

// Plans a program: fills every non-weight tensor's offset, prog.peak, prog.lower_bound, plan_ms.
void plan(const graph::GraphTemplate& g, graph::Program& prog, Fit fit = Fit::First);
// The buffers (one per alias root) the program's tensors map to; buffer_of[i] = -1 for weights.
std::vector<Buffer> program_buffers(const graph::GraphTemplate& g, const graph::Program& prog,
                                    std::vector<int>* buffer_of);

}  // namespace tessera::memory
