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
  // Two greedy orders, the lower arena wins (ties: by size). By size (largest first; TFLite Micro's
  // order) packs the big short-lived buffers well; by lifetime (longest first, then by size) puts
  // the long-lived ones (the residual stream, step inputs) at the bottom, where a per-chunk buffer
  // larger than them would otherwise push them, and everything live beside them, up.
  std::vector<int> by_size(bufs.size());
  std::iota(by_size.begin(), by_size.end(), 0);
  std::vector<int> by_life = by_size;
  const auto size_first = [&](int a, int b) {
    const Buffer& x = bufs[static_cast<size_t>(a)];
    const Buffer& y = bufs[static_cast<size_t>(b)];
    if (x.size != y.size) return x.size > y.size;
    return x.first < y.first;
  };
  std::stable_sort(by_size.begin(), by_size.end(), size_first);
  std::stable_sort(by_life.begin(), by_life.end(), [&](int a, int b) {
    const Buffer& x = bufs[static_cast<size_t>(a)];
    const Buffer& y = bufs[static_cast<size_t>(b)];
    if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
    return size_first(a, b);
  });
  Placement a = place_order(bufs, by_size, fit);
  Placement b = place_order(bufs, by_life, fit);
  return b.peak < a.peak ? b : a;
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

std::vector<size_t> live_bytes(std::span<const Buffer> bufs) {
  int t_max = -1;
  for (const Buffer& b : bufs) t_max = std::max(t_max, b.last);
  // Difference array: +size at first, -size after last; a prefix sum gives the live bytes.
  std::vector<size_t> live(static_cast<size_t>(t_max + 1) + 1, 0);
  for (const Buffer& b : bufs) {
    live[static_cast<size_t>(b.first)] += align_up(b.size);
    live[static_cast<size_t>(b.last) + 1] -= align_up(b.size);
  }
  for (size_t t = 1; t < live.size(); ++t) live[t] += live[t - 1];
  live.pop_back();
  return live;
}

size_t live_lower_bound(std::span<const Buffer> bufs) {
  const std::vector<size_t> live = live_bytes(bufs);
  return live.empty() ? 0 : *std::max_element(live.begin(), live.end());
}

double live_average(std::span<const Buffer> bufs) {
  const std::vector<size_t> live = live_bytes(bufs);
  double total = 0;
  for (size_t v : live) total += static_cast<double>(v);
  return live.empty() ? 0.0 : total / static_cast<double>(live.size());
}

std::vector<Buffer> program_buffers(const graph::GraphTemplate& g, const graph::Program& prog,
                                    std::vector<int>* buffer_of) {
  const auto& decls = g.tensors();
  std::vector<Buffer> bufs;
  std::vector<int> of(decls.size(), -1);
  for (size_t i = 0; i < decls.size(); ++i) {
    if (decls[i].kind == graph::TensorKind::Weight || decls[i].kind == graph::TensorKind::State ||
        decls[i].alias_of >= 0)
      continue;
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
