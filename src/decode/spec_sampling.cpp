// Speculative sampling for linear self-speculation at temperature > 0 (SpecSampling::Rejection; Leviathan
// et al. 2023, Chen et al. 2023). One cycle from the seed at c over the block [c, e):
//   draft   one bidirectional forward (the draft adapter on, if any) gives q_i = softmax(logits / T) at
//           every position of (c, e); d_i ~ q_i, independently (a one-pass draft proposes each position
//           without the drafts before it: a valid proposal, since acceptance only needs q_i(d_i));
//   verify  one causal forward over [c, e) gives p_i = softmax(logits / T) at c + 1 .. e (each given the
//           drafts before it);
//   keep    d_i while u_i < min(1, p_i(d_i) / q_i(d_i)); the first rejected position takes a sample of
//           the residual max(0, p_i - q_i) (normalised; p_i where it is zero); if every draft was kept,
//           the verify pass's last position gives one more sample of p.
// Each kept token is then an exact sample of the causal distribution given the kept tokens before it.
// Whole logit rows come to the host (Denoiser::logits_rows), so such requests run alone in serve
// (RequestPlan::host_logits). Host draws: rng_uniform(seed of the cycle, position, purpose).
#include <algorithm>
#include <cmath>

#include "decode/loop.h"

namespace tessera::decode {
namespace {

constexpr uint64_t kSpecSalt = 0x51ed270b2a4f93c7ull;

// Rows of logits [n, V] into probabilities softmax(l / T), in place.
void softmax_rows(std::vector<float>& l, int64_t V, float T) {
  for (size_t r = 0; r * static_cast<size_t>(V) < l.size(); ++r) {
    float* x = l.data() + r * static_cast<size_t>(V);
    const float m = *std::max_element(x, x + V);
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += x[i] = std::exp((x[i] - m) / T);
    for (int64_t i = 0; i < V; ++i) x[i] = static_cast<float>(x[i] / s);
  }
}

// A draw from the distribution w (unnormalised, sum > 0) with the uniform u.
int32_t draw(const float* w, int64_t V, double u) {
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += w[i];
  double acc = 0, t = u * s;
  for (int64_t i = 0; i < V; ++i) {
    acc += w[i];
    if (t < acc && w[i] > 0) return static_cast<int32_t>(i);
  }
  for (int64_t i = V - 1; i >= 0; --i)  // rounding left t at the end: the last token with weight
    if (w[i] > 0) return static_cast<int32_t>(i);
  return 0;
}

}  // namespace

int speculative_sampling_cycle(Loop& L, int c, int e, bool adapter) {
  Denoiser& d = L.den;
  const int64_t V = L.V;
  const float T = L.o.temperature;
  const int end = L.P + L.G;
  const uint64_t seed = rng_mix(L.o.seed ^ kSpecSalt ^ rng_mix(static_cast<uint64_t>(L.forwards)));
  std::vector<int32_t> rows;
  for (int r = c; r < e; ++r) rows.push_back(r);
  // Draft: q at (c, e), d ~ q.
  L.undecided(c + 1, e);
  const size_t nd = L.pos.size();
  std::vector<float> q(nd * static_cast<size_t>(V)), p;
  std::vector<int32_t> drafts(nd);
  if (nd > 0) {
    d.set_causal(false);
    if (adapter) d.set_draft_adapter(true);
    ++L.forwards;
    d.logits_rows(0, std::span<const int32_t>(L.canvas).first(static_cast<size_t>(e)), rows, L.pos, q);
    if (adapter) d.set_draft_adapter(false);
    softmax_rows(q, V, T);
    L.tok.resize(nd);
    L.conf.resize(nd);
    for (size_t i = 0; i < nd; ++i) {
      const float* qi = q.data() + i * static_cast<size_t>(V);
      drafts[i] = draw(qi, V, rng_uniform(seed, static_cast<uint64_t>(L.pos[i]), 1));
      L.tok[i] = drafts[i];
      L.conf[i] = qi[drafts[i]];
    }
    L.editable_from = c + 1;  // provisional until verified
    L.commit_all();
  }
  // Verify: p at c + 1 .. e (e only inside the canvas), each given the drafts before it.
  L.pos.clear();
  for (int pos = c + 1; pos <= std::min(e, end - 1); ++pos) L.pos.push_back(pos);
  p.resize(L.pos.size() * static_cast<size_t>(V));
  d.set_causal(true);
  ++L.forwards;
  d.logits_rows(
      0, std::span<const int32_t>(L.canvas).first(std::min(static_cast<size_t>(e) + 1, L.canvas.size())),
      rows, L.pos, p);
  d.set_causal(false);
  softmax_rows(p, V, T);
  // Keep: accepted drafts, then one sample (of the residual at the first rejection, else of p).
  std::vector<int32_t> kept;
  std::vector<float> kept_p;
  for (size_t i = 0; i < L.pos.size(); ++i) {
    const float* pi = p.data() + i * static_cast<size_t>(V);
    const auto position = static_cast<uint64_t>(L.pos[i]);
    if (i < nd) {
      const float* qi = q.data() + i * static_cast<size_t>(V);
      const int32_t t = drafts[i];
      if (rng_uniform(seed, position, 2) * qi[t] < pi[t]) {  // u < p / q, without dividing by q
        kept.push_back(t);
        kept_p.push_back(pi[t]);
        continue;
      }
      std::vector<float> residual(static_cast<size_t>(V));
      double mass = 0;
      for (int64_t k = 0; k < V; ++k)
        mass += residual[static_cast<size_t>(k)] = std::max(0.0f, pi[k] - qi[k]);
      const int32_t r = draw(mass > 0 ? residual.data() : pi, V, rng_uniform(seed, position, 3));
      kept.push_back(r);
      kept_p.push_back(pi[r]);
      break;
    }
    const int32_t t = draw(pi, V, rng_uniform(seed, position, 3));
    kept.push_back(t);
    kept_p.push_back(pi[t]);
    break;
  }
  // The drafts go back to masks; the kept positions take their tokens (final).
  return_drafts(L, c + 1, e);
  L.pos.resize(kept.size());
  L.tok = kept;
  L.conf = kept_p;
  L.commit_all();
  return static_cast<int>(kept.size());
}

}  // namespace tessera::decode
