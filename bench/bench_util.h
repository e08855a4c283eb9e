// Shared by the benchmarks: the best wall time of a timed call.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>

namespace tessera::bench {

// One untimed warm-up call (primitive creation, first touch), then the best of `reps` timed calls, in
// seconds.
inline double best_seconds(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace tessera::bench
