#include "memory/planner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace tessera::memory {
namespace {

size_t align_up(size_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}
bool overlaps(const Buffer& a, const Buffer& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Lowest (first-fit) or tightest (best-fit) offset for buffer i given the placed ones.
size_t find_offset(std::span<const Buffer> bufs, const std::vector<size_t>& off,
                   const std::vector<int>& placed, int i, Fit fit, std::vector<int>& scratch) {
  scratch.clear();
  for (int j : placed) {
    if (overlaps(bufs[static_cast<size_t>(i)], bufs[static_cast<size_t>(j)])) scratch.push_back(j);
  }
  std::sort(scratch.begin(), scratch.end(),
            [&](int a, int b) { return off[static_cast<size_t>(a)] < off[static_cast<size_t>(b)]; });
  const size_t need = align_up(bufs[static_cast<size_t>(i)].size);
  size_t cursor = 0;
  size_t best = std::numeric_limits<size_t>::max(), best_gap = std::numeric_limits<size_t>::max();
  for (int j : scratch) {
    const size_t o = off[static_cast<size_t>(j)];
    if (o >= cursor && o - cursor >= need) {
      if (fit == Fit::First) return cursor;
      if (o - cursor < best_gap) {
        best_gap = o - cursor;
        best = cursor;
      }
    }
    cursor = std::max(cursor, o + align_up(bufs[static_cast<size_t>(j)].size));
  }
  return best != std::numeric_limits<size_t>::max() ? best : cursor;
}

Placement place_order(std::span<const Buffer> bufs, std::span<const int> order, Fit fit) {
  Placement p;
  p.offsets.assign(bufs.size(), 0);
  std::vector<int> placed, scratch;
  placed.reserve(bufs.size());
  for (int i : order) {
    if (bufs[static_cast<size_t>(i)].size == 0) continue;
    const size_t o = find_offset(bufs, p.offsets, placed, i, fit, scratch);
    p.offsets[static_cast<size_t>(i)] = o;
    p.peak = std::max(p.peak, o + align_up(bufs[static_cast<size_t>(i)].size));
    placed.push_back(i);
  }
  return p;
}

}  // namespace

Placement place(std::span<const Buffer> bufs, Fit fit) {
  std::vector<int> order(bufs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const Buffer& x = bufs[static_cast<size_t>(a)];
    const Buffer& y = bufs[static_cast<size_t>(b)];
    if (x.size != y.size) return x.size > y.size;
    return x.first < y.first;
  });
  return place_order(bufs, order, fit);
}

Placement place_in_order(std::span<const Buffer> bufs, std::span<const int> order) {
  return place_order(bufs, order, Fit::First);
}

Placement place_optimal(std::span<const Buffer> bufs) {
  TESSERA_CHECK(bufs.size() <= 9, "place_optimal: at most 9 buffers");
  std::vector<int> order(bufs.size());
  std::iota(order.begin(), order.end(), 0);
  Placement best;
  best.peak = std::numeric_limits<size_t>::max();
  do {
    Placement p = place_order(bufs, order, Fit::First);
    if (p.peak < best.peak) best = std::move(p);
  } while (std::next_permutation(order.begin(), order.end()));
  if (bufs.empty()) best.peak = 0;
  return best;
}

size_t live_lower_bound(std::span<const Buffer> bufs) {
  int t_max = 0;
  for (const Buffer& b : bufs) t_max = std::max(t_max, b.last);
  std::vector<size_t> live(static_cast<size_t>(t_max) + 2, 0);
  for (const Buffer& b : bufs) {
    for (int t = b.first; t <= b.last; ++t) live[static_cast<size_t>(t)] += align_up(b.size);
  }
  return live.empty() ? 0 : *std::max_element(live.begin(), live.end());
}

double live_average(std::span<const Buffer> bufs) {
  int t_max = 0;
  for (const Buffer& b : bufs) t_max = std::max(t_max, b.last);
  double total = 0;
  for (const Buffer& b : bufs) total += static_cast<double>(align_up(b.size)) * (b.last - b.first + 1);
  return total / (t_max + 1);
}

std::vector<Buffer> program_buffers(const graph::GraphTemplate& g, const graph::Program& prog,
                                    std::vector<int>* buffer_of) {
  const auto& decls = g.tensors();
  std::vector<Buffer> bufs;
  std::vector<int> of(decls.size(), -1);
  for (size_t i = 0; i < decls.size(); ++i) {
    if (decls[i].kind == graph::TensorKind::Weight || decls[i].alias_of >= 0) continue;
    const auto& t = prog.tensors[i];
    of[i] = static_cast<int>(bufs.size());
    bufs.push_back(Buffer{t.bytes, t.first, t.last});
  }
  for (size_t i = 0; i < decls.size(); ++i) {
    if (decls[i].alias_of >= 0) of[i] = of[static_cast<size_t>(decls[i].alias_of)];
  }
  if (buffer_of != nullptr) *buffer_of = std::move(of);
  return bufs;
}

void plan(const graph::GraphTemplate& g, graph::Program& prog, Fit fit) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> of;
  const std::vector<Buffer> bufs = program_buffers(g, prog, &of);
  const Placement p = place(bufs, fit);
  for (size_t i = 0; i < prog.tensors.size(); ++i) {
    if (of[i] >= 0) prog.tensors[i].offset = p.offsets[static_cast<size_t>(of[i])];
  }
  prog.peak = p.peak;
  prog.lower_bound = live_lower_bound(bufs);
  prog.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tessera::memory
