// Tri-mode decoding (Nemotron-Labs-Diffusion, shared/specs/nemotron-labs-diffusion.md section 4): the KV
// cache is written only by causal forwards, so its rows are exactly those of autoregressive decoding;
// bidirectional forwards (drafts) read it and their own rows are rewritten by the next causal forward
// before anything reads them (the cache is "cropped" by recomputing from the first row that is not
// final). Three layouts share the causal step here:
//   causal-context diffusion (mode diffusion on a tri-mode model; the reference's `generate`): the
//     CausalRows row policy in the unmasking loops (transfer.cpp's blocks and schedules): a block's
//     first forward is preceded by a causal pass over the rows written since the last one (the prompt,
//     then the finished block) whose last logit decides the block's first position (the seed); the
//     block's other positions are denoised by bidirectional drafts over [block start, block end).
//   ar: one causal forward per position, computing the one row not yet in the cache.
//   spec (linear self-speculation, `linear_spec_generate`): after the causal prefill decides the seed,
//     each cycle drafts the block's other positions bidirectionally (one pass at threshold 0, else passes
//     deciding the most confident and every other above the threshold), verifies the block with one
//     causal pass, keeps the verified tokens of the longest run whose drafts matched plus one, and
//     returns the rest to masks; the next seed is the last kept token. At temperature 0 the output is
//     exactly ar's (each kept token is the causal argmax after the kept tokens before it). At temperature
//     > 0 drafts and verification sample independently and a draft is kept on an exact match (the
//     reference's rule; not distribution-preserving). Drafts add the checkpoint's draft adapter (its
//     LoRA on o_proj, linear_spec_lora/) when it has one; no other forward does.
// Every forward is one step (a StepEvent): drafts are provisional (editable_from), verified tokens final.
// Why both sampling rules keep the autoregressive distribution (temperature > 0): every kept token is a
// sample of the causal distribution given the kept tokens before it. Match keeps the verify pass's own
// samples (fresh noise per position and forward), and only how many it keeps depends on the drafts; the
// reference's spec text calls this rule lossy, but P(x0, x1) = p(x0) (q(x0) p(x1 | x0) + (1 - q(x0))
// p(x1 | x0)) = p(x0) p(x1 | x0) (the next cycle samples x1 afresh). Rejection (spec_sampling.cpp) is
// speculative sampling's rule: the same distribution, more drafts kept (tests/golden/nemotron_test.cpp
// checks both against the exact distribution).
#include <algorithm>
#include <climits>

#include "core/error.h"
#include "decode/policies.h"

namespace tessera::decode {
namespace {

// The RNG step counter of causal forwards, apart from the schedules' (g counts their steps).
constexpr uint64_t kCausalSalt = 0x7c3a9d5b1e2f4801ull;

// One causal forward computing canvas rows [from, to) (the rows before `from` are in the cache) and
// predicting positions `pos` (each from the row before it, every one in [from + 1, to]); their
// tokens land in L.tok / L.conf. The forward sees canvas[0, to + 1) (the last position is predicted, not
// read: a causal step reads no row after its last computed one).
void causal_forward(Loop& L, int from, int to, const SampleParams& sp) {
  Denoiser& d = L.den;
  d.set_causal(true);
  L.tok.assign(L.pos.size(), 0);
  L.conf.assign(L.pos.size(), 0.0f);
  ++L.forwards;
  const auto view =
      std::span<const int32_t>(L.canvas).first(std::min(static_cast<size_t>(to) + 1, L.canvas.size()));
  if (L.parts.guidance)  // structured output (mode ar): whole logit rows, the format's mask, host sampling
    L.parts.guidance->forward(L, RowSpec{RowSpec::Kind::Range, view.size(), from, to}, sp);
  else
    d.predict_cached(view, from, to, L.pos, sp, L.tok, L.conf);
  d.set_causal(false);
  if (L.o.logprobs) L.lp = L.parts.guidance ? &L.host_lp : &d.last_logprobs();
}

SampleParams causal_params(const Loop& L, uint64_t i) {
  return L.params(i ^ kCausalSalt);
}

// Decides position p from a causal forward over rows [from, p): the seed of a block, or an ar step. Under
// structured output (mode ar only: compat.cpp) the guidance sampled among the tokens the format allows
// at p, which the constraint then takes.
void causal_decide(Loop& L, int from, int p, uint64_t rng_step) {
  L.pos.assign(1, p);
  causal_forward(L, from, p, causal_params(L, rng_step));
  if (L.grammar && p < L.P + L.G) {
    TESSERA_CHECK(L.grammar->allows(L.tok[0], L.P + L.G - p - 1),
                  "structured output: internal error, the guided token is not allowed");
    L.grammar->take(L.tok[0]);
  }
  L.commit_all();
}

// Causal-context diffusion's rows: a block's forwards compute the block bidirectionally; its first is
// preceded by the causal pass that writes the rows finished since the last one and decides the seed.
class CausalRows final : public RowPolicy {
 public:
  void begin_block(Loop& L, int lo, int hi) override {
    (void)hi;
    if (lo >= L.P + L.G || L.decided[static_cast<size_t>(lo)]) return;
    causal_decide(L, written_, lo, static_cast<uint64_t>(lo));
    written_ = lo;
  }
  RowSpec next_rows(Loop& L) override {
    const int hi = std::min(L.block_lo + block_, L.P + L.G);
    return RowSpec{RowSpec::Kind::Range, static_cast<size_t>(hi), L.block_lo, hi};
  }
  explicit CausalRows(int block) : block_(block) {}

 private:
  int block_;
  int written_ = 0;  // rows [0, written_) hold causal K / V of final tokens
};

}  // namespace

std::unique_ptr<RowPolicy> make_causal_rows(const GenerateOptions& o) {
  return std::make_unique<CausalRows>(o.block_length);
}

void return_drafts(Loop& L, int lo, int hi) {
  for (int p = lo; p < hi; ++p) {
    L.decided[static_cast<size_t>(p)] = 0;
    L.canvas[static_cast<size_t>(p)] = L.mask;
  }
  L.editable_from = INT_MAX;
}

void run_autoregressive(Loop& L) {
  const int end = L.P + L.G;
  for (int p = L.P; p < end && !L.ended; ++p)
    causal_decide(L, p == L.P ? 0 : p - 1, p, static_cast<uint64_t>(p));
}

void run_speculative(Loop& L) {
  const GenerateOptions& o = L.o;
  const int end = L.P + L.G, B = o.block_length;
  causal_decide(L, 0, L.P, static_cast<uint64_t>(L.P));
  uint64_t g = 0;  // draft forwards
  // The checkpoint's draft adapter, if it has one, in the drafts only (o.draft_adapter: unless turned off).
  const bool adapter = o.draft_adapter && L.den.supports_draft_adapter();
  std::vector<int32_t> drafts;
  const bool rejection = o.spec_sampling == SpecSampling::Rejection && o.temperature > 0.0f;
  for (int c = L.P; !L.ended && c + 1 < end;) {  // c: the seed's position, rows [0, c) are final
    const int e = std::min(c + B, end);
    if (rejection) {
      c += speculative_sampling_cycle(L, c, e, adapter);
      continue;
    }
    // Draft: the positions (c, e), bidirectionally over the block [c, e) (CausalRows' rows from
    // block_lo), provisional until verified.
    L.editable_from = c + 1;
    L.block_lo = c;
    while (L.prepare(c + 1, e)) {
      if (adapter) L.den.set_draft_adapter(true);
      L.predict(L.params(g++));
      if (adapter) L.den.set_draft_adapter(false);
      size_t k = L.pos.size();
      if (o.draft_threshold > 0.0f) {
        L.rank(L.pos.size());
        k = 1;
        while (k < L.idx.size() && L.conf[static_cast<size_t>(L.idx[k])] >= o.draft_threshold) ++k;
        L.commit(k);
      } else {
        L.commit_all();
      }
    }
    drafts.assign(L.canvas.begin() + c + 1, L.canvas.begin() + e);
    // Verify: one causal pass over rows [c, e) predicts positions c + 1 .. e (e only inside the canvas).
    L.pos.clear();
    for (int p = c + 1; p <= std::min(e, end - 1); ++p) L.pos.push_back(p);
    causal_forward(L, c, e, causal_params(L, (uint64_t{1} << 40) + static_cast<uint64_t>(L.forwards)));
    size_t a = 1;  // kept: the matching run of drafts, then the verified token after it
    while (a < L.pos.size() && L.tok[a - 1] == drafts[a - 1]) ++a;
    // The drafts go back to masks; the kept positions take the verified tokens.
    return_drafts(L, c + 1, e);
    L.idx.resize(a);
    for (size_t i = 0; i < a; ++i) L.idx[i] = static_cast<int>(i);
    L.commit(a);
    c += static_cast<int>(a);
  }
}

}  // namespace tessera::decode
