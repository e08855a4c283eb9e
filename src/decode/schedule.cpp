#include "decode/schedule.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace tessera {

std::vector<int> llada_schedule(int n, int steps) {
  TESSERA_CHECK(steps > 0, "schedule: steps must be > 0 (got " + std::to_string(steps) + ")");
  TESSERA_CHECK(n >= 0,
                "schedule: the number of masked positions must be >= 0 (got " + std::to_string(n) + ")");
  std::vector<int> s(static_cast<size_t>(steps), n / steps);
  for (int i = 0; i < n % steps; ++i) ++s[static_cast<size_t>(i)];
  return s;
}

std::vector<float> dream_timesteps(int steps, float eps) {
  TESSERA_CHECK(steps > 0, "schedule: steps must be > 0 (got " + std::to_string(steps) + ")");
  const int64_t n = steps + 1;
  const float start = 1.0f, end = eps;
  const float step = (end - start) / static_cast<float>(n - 1);
  const int64_t halfway = n / 2;
  std::vector<float> ts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ts[static_cast<size_t>(i)] = i < halfway ? std::fma(step, static_cast<float>(i), start)
                                             : std::fma(-step, static_cast<float>(n - 1 - i), end);
  }
  return ts;
}

float dream_transfer_prob(float t, float s, bool last_step) {
  if (last_step) return 1.0f;
  const float ratio = s / t;
  return 1.0f - ratio;
}

int dream_transfer_count(int n_masked, float t, float s, bool last_step) {
  if (last_step) return n_masked;
  const float p = dream_transfer_prob(t, s, false);
  const float k = static_cast<float>(n_masked) * p;
  return static_cast<int>(k);  // truncation, as Python's int()
}

std::vector<int> dream_schedule(int n, int steps, float eps) {
  const std::vector<float> ts = dream_timesteps(steps, eps);
  std::vector<int> out(static_cast<size_t>(steps));
  int masked = n;
  for (int i = 0; i < steps; ++i) {
    const int k = dream_transfer_count(masked, ts[static_cast<size_t>(i)], ts[static_cast<size_t>(i) + 1],
                                       i == steps - 1);
    out[static_cast<size_t>(i)] = k;
    masked -= k;
  }
  return out;
}

BlockLayout block_layout(int gen_length, int block_length, int steps, bool split_steps) {
  TESSERA_CHECK(gen_length > 0, "gen-length must be > 0 (got " + std::to_string(gen_length) + ")");
  TESSERA_CHECK(block_length > 0, "block-length must be > 0 (got " + std::to_string(block_length) + ")");
  TESSERA_CHECK(steps > 0, "steps must be > 0 (got " + std::to_string(steps) + ")");
  BlockLayout b;
  b.block_length = block_length >= gen_length ? gen_length : block_length;
  TESSERA_CHECK(gen_length % b.block_length == 0,
                "gen-length " + std::to_string(gen_length) + " is not divisible by block-length " +
                    std::to_string(b.block_length) + "; choose a block-length that divides gen-length");
  b.num_blocks = gen_length / b.block_length;
  if (split_steps) {
    TESSERA_CHECK(steps % b.num_blocks == 0,
                  "steps " + std::to_string(steps) + " is not divisible by the number of blocks " +
                      std::to_string(b.num_blocks) + " (gen-length " + std::to_string(gen_length) +
                      " / block-length " + std::to_string(b.block_length) +
                      "); choose steps as a multiple of " + std::to_string(b.num_blocks));
    b.steps_per_block = steps / b.num_blocks;
  }
  return b;
}

}  // namespace tessera
