// What the unmasking loops need from the engine: one forward over a canvas, reduced on the device to
// (token, confidence) for the positions that need a prediction. The decode layer never sees kernels.
#pragma once
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace tessera {

class Denoiser {
 public:
  virtual ~Denoiser() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t mask_token() const = 0;
  // Runs one forward over `canvas` (a single sequence, absolute positions 0..n-1) and, for each
  // position in `positions`, writes the token chosen by `sp` and its confidence (ConfKind). The
  // counter RNG is keyed by (sp.seed, position, vocab index), so results never depend on batching.
  virtual void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                       const SampleParams& sp, std::span<int32_t> tokens, std::span<float> conf) = 0;
  // Full logits [positions.size(), vocab] in f32 for the given positions (host memory). Slower:
  // used only where a policy needs whole rows on the host (classifier-free guidance).
  virtual void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                      std::span<float> out) = 0;
  // Block-causal models (LLaDA2): the block size of the attention mask (positions p attend to keys of
  // blocks <= p / block); 0 for bidirectional or causal models. The block is a generation parameter:
  // generate() sets it to the generation's block length before the first forward.
  virtual int attention_block() const { return 0; }
  virtual void set_attention_block(int block) { (void)block; }
};

}  // namespace tessera
