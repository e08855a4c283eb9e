// The canvas of a request: the prompt, gen_length masks and an infilling suffix (never predicted,
// seen by every forward); block-causal models pad it with masks to whole blocks. Also the sampling
// parameters every step starts from.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "decode/loop.h"

namespace tessera::decode {

void init_canvas(Loop& L, std::span<const int32_t> prompt) {
  const GenerateOptions& o = L.o;
  L.V = L.den.vocab_size();
  L.mask = L.den.mask_token();
  L.P = static_cast<int>(prompt.size());
  L.G = o.gen_length;
  L.canvas.assign(prompt.begin(), prompt.end());
  L.canvas.resize(static_cast<size_t>(L.plan.canvas) - o.suffix.size(), L.mask);
  for (size_t i = 0; i < o.suffix.size(); ++i)
    TESSERA_CHECK(o.suffix[i] != L.mask, "suffix token " + std::to_string(i) +
                                             " is the mask token: the suffix is given text, not a gap");
  L.canvas.insert(L.canvas.end(), o.suffix.begin(), o.suffix.end());
  L.decided.assign(L.canvas.size(), 0);
  std::fill(L.decided.begin(), L.decided.begin() + L.P, 1);
  std::fill(L.decided.end() - static_cast<std::ptrdiff_t>(o.suffix.size()), L.decided.end(), 1);
  L.stop = static_cast<int>(L.canvas.size());
  L.committed = L.P;

  const UnmaskPolicy& u = *L.parts.unmask;
  L.base.conf = u.confidence();
  L.base.temperature = o.temperature;
  L.base.gumbel = u.gumbel();
  L.base.top_k = o.top_k;
  L.base.top_p = o.top_p;
  // Token editing never proposes the mask token (a step could then re-mask a position and repeat).
  L.base.suppress_token = o.logits_eos_inf ? o.eos_ids.front() : o.edit ? L.mask : -1;
  L.base.logprobs = o.logprobs && !L.parts.guidance;  // cfg: the host computes them
  if (o.logprobs)  // the generated positions (block-causal: with the padding after them)
    L.gen_lp.assign(L.canvas.size() - static_cast<size_t>(L.P) - o.suffix.size(), TokenLogprob{});
}

}  // namespace tessera::decode
