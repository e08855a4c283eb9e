// Step schedules of the unmasking loops (how many positions are decided at each step) and the
// validation of the block / step layout. Host-side integer logic only.
#pragma once
#include <cstdint>
#include <vector>

namespace tessera {

// LLaDA get_num_transfer_tokens: n masked positions over `steps` steps, n / steps each and the
// first n % steps steps one more. Requires steps > 0, n >= 0.
std::vector<int> llada_schedule(int n, int steps);

// Dream's timesteps torch.linspace(1, eps, steps + 1) in f32, computed as torch's CUDA kernel does
// (first half start + step * i, second half end - step * (n - 1 - i), fused multiply-add).
std::vector<float> dream_timesteps(int steps, float eps);

// Dream's per-step count: int(n_masked * (1 - s / t)) in f32; the last step takes all n_masked.
int dream_transfer_count(int n_masked, float t, float s, bool last_step);

// Dream's per-position transfer probability for alg 'origin': 1 - s / t, 1 on the last step.
float dream_transfer_prob(float t, float s, bool last_step);

// The whole Dream schedule for n masked positions (each step's count from the positions still
// masked). Sums to n.
std::vector<int> dream_schedule(int n, int steps, float eps);

// Block layout of a generation: num_blocks blocks of block_length positions, steps_per_block steps
// each (0 when the steps are not split, e.g. threshold decoding).
struct BlockLayout {
  int num_blocks = 1;
  int block_length = 0;
  int steps_per_block = 0;
};

// Validates and returns the layout. block_length >= gen_length means one block of gen_length.
// Throws Error when gen_length % block_length != 0, or (split_steps) steps % num_blocks != 0.
BlockLayout block_layout(int gen_length, int block_length, int steps, bool split_steps);

}  // namespace tessera
