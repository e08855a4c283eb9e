// The CPU kernels of uniform-noise diffusion's sampling (DiffusionGemma; Backend::canvas_sample and
// Backend::soft_embed): per row of soft-capped logits, the entropy-bound sampler's statistics, and the
// soft embeddings of self-conditioning. Both read the [R, V] logits of one chunk of the logits loop: the
// full-vocabulary rows never leave the device.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/op_checks.h"
#include "core/dtype.h"
#include "core/error.h"

namespace tessera::cpu {

void canvas_sample(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                   Tensor& argmax, Tensor& entropy) {
  check_canvas_sample(logits, row_keys, p, token, argmax, entropy);
  const int64_t R = logits.rows(), V = logits.cols();
  const double T = p.temperature;
  const auto* keys = row_keys.as<const int32_t>();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < R; ++r) {
    const float* L = logits.as<const float>() + r * V;
    const auto key = static_cast<uint64_t>(static_cast<uint32_t>(keys[r]));
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (L[v] > L[best]) best = v;
    // Gumbel-max, exactly, drawing only where a token can still win: -log(-log U) <= 37.5 for every U the
    // RNG gives (U <= 1 - 2^-54), so v cannot beat the best so far once L[v] + 37.5 T <= it. The argmax is
    // drawn first (a high bar early); ties go to the lower index as in a plain left-to-right scan.
    auto gumbel = [&](int64_t v) {
      return static_cast<double>(L[v]) -
             T * std::log(-std::log(rng_uniform(p.seed, key, static_cast<uint64_t>(v))));
    };
    int64_t drawn = best;
    double best_g = gumbel(best);
    const double reach = 37.5 * T;
    for (int64_t v = 0; v < V; ++v) {
      if (static_cast<double>(L[v]) + reach < best_g) continue;
      const double g = gumbel(v);
      if (g > best_g || (g == best_g && v < drawn)) {
        best_g = g;
        drawn = v;
      }
    }
    // Entropy of softmax(L / T) in f64: H = log Z - sum p z with z = (L - max) / T.
    const double mx = L[best];
    double z = 0.0, pz = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const double zi = (static_cast<double>(L[v]) - mx) / T;
      const double e = std::exp(zi);
      z += e;
      pz += e * zi;
    }
    token.as<int32_t>()[r] = static_cast<int32_t>(drawn);
    argmax.as<int32_t>()[r] = static_cast<int32_t>(best);
    entropy.as<float>()[r] = static_cast<float>(std::log(z) - pz / z);
  }
}

void soft_embed(GemmEngine& gemm, const Tensor& logits, const Tensor& table, float temperature, float scale,
                Tensor& probs, Tensor& out) {
  check_soft_embed(logits, table, temperature, probs, out);
  const int64_t R = logits.rows(), V = logits.cols(), H = table.cols();
  if (R == 0) return;
  const bool bf16 = table.dtype == DType::BF16;
  const float inv_t = 1.0f / temperature;
  // softmax(L / T) per row in f32, rounded to the table's dtype; `scale` multiplies the f32 product.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < R; ++r) {
    const float* L = logits.as<const float>() + r * V;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, L[v] * inv_t);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(L[v] * inv_t - mx));
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t v = 0; v < V; ++v) {
      const float pv = std::exp(L[v] * inv_t - mx) * inv;
      if (bf16)
        probs.as<uint16_t>()[r * V + v] = f32_to_bf16(pv);
      else
        probs.as<float>()[r * V + v] = pv;
    }
  }
  Tensor pr(probs.data, probs.dtype, {R, V});
  gemm.gemm_nn(pr, table, out);
  float* o = out.as<float>();
#pragma omp parallel for simd if (R * H > 65536)
  for (int64_t i = 0; i < R * H; ++i) o[i] *= scale;
}

}  // namespace tessera::cpu
