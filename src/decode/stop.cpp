// The stop conditions: an EOS, a stop sequence (stop_when) as soon as the final tokens hold one
// (mid_block_stop) or after a block, the window's early stop at a decided EOS; and the answer they leave.
#include <algorithm>

#include "decode/loop.h"

namespace tessera::decode {

bool Loop::is_eos(int32_t t) const {
  return std::find(o.eos_ids.begin(), o.eos_ids.end(), t) != o.eos_ids.end();
}

bool Loop::ends_before(int from, int to) {
  const int32_t* c = canvas.data();
  if (o.stop_at_eos && std::any_of(c + from, c + to, [&](int32_t t) { return is_eos(t); })) return true;
  if (o.stop_when && o.stop_when(std::span<const int32_t>(c + P, c + to))) stopped = true;
  return stopped;
}

void Loop::advance_committed() {
  const int from = committed, end = std::min(P + G, editable_from);
  while (committed < end && decided[static_cast<size_t>(committed)]) ++committed;
  if (o.mid_block_stop && !ended && committed != from) ended = ends_before(from, committed);
}

void Loop::decided_token(int32_t p, int32_t t) {
  if (o.window && o.window_early_stop && is_eos(t)) stop = std::min(stop, p + 1);
}

GenerateResult finish(Loop& L) {
  const GenerateOptions& o = L.o;
  GenerateResult res = std::move(L.res);
  res.forwards = L.forwards;
  // Window early stop: the positions after the stopping EOS were never generated; they read as it.
  if (o.window && L.stop < static_cast<int>(L.canvas.size())) {
    const int32_t eos = L.canvas[static_cast<size_t>(L.stop - 1)];
    for (size_t p = static_cast<size_t>(L.stop); p < L.canvas.size(); ++p)
      if (!L.decided[p]) L.canvas[p] = eos;
  }
  res.tokens.assign(L.canvas.begin() + L.P, L.canvas.begin() + L.P + L.G);
  if (L.stopped) {  // a stop sequence ended it: the answer ends before the first undecided position
    size_t n = 0;
    while (n < res.tokens.size() && L.decided[static_cast<size_t>(L.P) + n]) ++n;
    res.tokens.resize(n);
  }
  if (o.stop_at_eos) {
    auto it = std::find_if(res.tokens.begin(), res.tokens.end(), [&](int32_t t) { return L.is_eos(t); });
    res.tokens.erase(it, res.tokens.end());
  }
  if (o.logprobs) {
    L.gen_lp.resize(res.tokens.size());
    res.logprobs = std::move(L.gen_lp);
  }
  return res;
}

}  // namespace tessera::decode
