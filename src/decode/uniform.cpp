// Uniform-noise block diffusion (DiffusionGemma; shared/specs/diffusion-gemma.md section 6, Hugging
// Face's generate): there is no mask token. The prompt is encoded causally into the KV cache (in chunks
// of kPrefillRows, so a long prompt is many forwards of the memory plan, not one); then canvas after
// canvas of `block_length` positions:
//   a canvas starts as uniformly random tokens; each step s = steps .. 1 runs the bidirectional decoder
//   over it (against the read-only cache, conditioned on the previous step's soft embeddings) at
//   temperature T = t_min + (t_max - t_min) s / steps, and on the device gets per position a sample d of
//   softmax(logits / T), the argmax a and the entropy H of that distribution. Positions sorted by H keep
//   their sample while the entropies before them sum to at most entropy_bound (the first always); every
//   other position is re-noised. The canvas is stable when the last `stability` argmax canvases equal a,
//   confident when mean H < confidence; both end its steps early.
//   The canvas commits a of its last step; an EOS in it ends the generation (the answer ends before it),
//   otherwise the committed canvas is encoded causally (its K / V appended to the cache) and the next
//   canvas starts.
// Random tokens come from the counter RNG: the noise of position p entering forward t (forwards counted
// over the whole generation) is floor(V * rng_uniform(seed_t, p, V + 2)) with seed_t = rng_mix(seed + t),
// the seed of forward t's own Gumbel samples (tests/reference/ref_diffusion_gemma.py draws the same).
// Each forward is one step (a StepEvent): the canvas shows the current noisy canvas, committed the end
// of the last committed canvas; the last step of a canvas shows the committed argmax.
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "decode/loop.h"

namespace tessera::decode {
namespace {

constexpr int kPrefillRows = 512;  // rows per causal forward of the prompt

int32_t noise_token(uint64_t seed_t, int p, int64_t V) {
  const double u = rng_uniform(seed_t, static_cast<uint64_t>(p), static_cast<uint64_t>(V + 2));
  return static_cast<int32_t>(std::min<int64_t>(V - 1, static_cast<int64_t>(u * static_cast<double>(V))));
}

// Causal forwards writing the K / V of canvas rows [from, to) (the rows before `from` are cached).
void encode(Loop& L, int from, int to) {
  Denoiser& d = L.den;
  d.set_causal(true);
  for (int a = from; a < to; a += kPrefillRows) {
    const int b = std::min(to, a + kPrefillRows);
    d.predict_cached(std::span<const int32_t>(L.canvas).first(static_cast<size_t>(b)), a, b, {}, L.base, {},
                     {});
  }
  d.set_causal(false);
}

}  // namespace

void run_uniform(Loop& L) {
  const GenerateOptions& o = L.o;
  const UniformSampling& u = o.uniform;
  Denoiser& d = L.den;
  const int C = o.block_length, N = o.steps, P = L.P, end = static_cast<int>(L.canvas.size());
  // Positions not yet reached show the pad token (no mask token exists).
  std::fill(L.canvas.begin() + P, L.canvas.end(), u.pad_id);
  if (P > 0) encode(L, 0, P);
  uint64_t t = 0;  // denoising forwards so far
  CanvasPrediction pred;
  std::vector<float> sc;  // the last step's soft embeddings (empty: none yet)
  std::vector<int32_t> history, order(static_cast<size_t>(C));
  for (int lo = P; lo < end && !L.ended; lo += C) {
    const int hi = lo + C;
    const auto view = std::span<const int32_t>(L.canvas).first(static_cast<size_t>(hi));
    const uint64_t seed0 = rng_mix(o.seed + t);
    for (int p = lo; p < hi; ++p) L.canvas[static_cast<size_t>(p)] = noise_token(seed0, p, L.V);
    sc.clear();
    history.assign(static_cast<size_t>(u.stability) * static_cast<size_t>(C), -1);
    for (int s = N; s >= 1; --s) {
      SampleParams sp = L.params(t);
      sp.temperature =
          static_cast<float>(static_cast<double>(u.t_min) + (static_cast<double>(u.t_max) - u.t_min) * s / N);
      d.denoise_canvas(view, lo, hi, sc, sp, pred);
      ++L.forwards;
      ++t;
      // Accept by ascending entropy (ties: the lower position) while the entropies before sum <= bound.
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return pred.entropy[static_cast<size_t>(a)] < pred.entropy[static_cast<size_t>(b)];
      });
      std::vector<char> keep(static_cast<size_t>(C), 0);
      double before = 0.0, mean = 0.0;
      for (int j = 0; j < C; ++j) {
        const auto i = static_cast<size_t>(order[static_cast<size_t>(j)]);
        if (j == 0 || before <= u.entropy_bound) keep[i] = 1;
        before += pred.entropy[i];
      }
      for (int i = 0; i < C; ++i) mean += pred.entropy[static_cast<size_t>(i)];
      mean /= C;
      bool stable = true;  // the last `stability` argmax canvases all equal this one
      for (size_t i = 0; i < history.size(); ++i)
        stable = stable && history[i] == pred.argmax[i % static_cast<size_t>(C)];
      if (u.stability > 0) {
        std::rotate(history.begin(), history.begin() + C, history.end());
        std::copy(pred.argmax.begin(), pred.argmax.end(), history.end() - C);
      }
      const bool last = s == 1 || (stable && mean < u.confidence);
      L.chosen.clear();
      const uint64_t seed_next = rng_mix(o.seed + t);
      for (int i = 0; i < C; ++i) {
        const int p = lo + i;
        const int32_t next = last                           ? pred.argmax[static_cast<size_t>(i)]
                             : keep[static_cast<size_t>(i)] ? pred.sampled[static_cast<size_t>(i)]
                                                            : noise_token(seed_next, p, L.V);
        if (next != L.canvas[static_cast<size_t>(p)]) L.chosen.push_back(p);
        L.canvas[static_cast<size_t>(p)] = next;
      }
      sc.swap(pred.soft);
      if (last) {
        std::fill(L.decided.begin() + lo, L.decided.begin() + hi, 1);
        L.editable_from = INT32_MAX;
      } else {
        L.editable_from = lo;  // the canvas is provisional until it commits
      }
      L.step_edits.clear();
      L.end_step();  // the committed boundary moves past a committed canvas; an EOS in it ends the answer
      if (last) break;
    }
    if (!L.ended && hi < end) encode(L, lo, hi);
  }
}

}  // namespace tessera::decode
