// The step mechanics the parts share: candidates, one forward through the row policy, ranking and
// committing decided positions.
#include "decode/loop.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace tessera::decode {

bool RowPolicy::candidates(Loop& L, int lo, int hi) {
  L.undecided(lo, std::min(hi, L.stop));
  return !L.pos.empty();
}

SampleParams Loop::params(uint64_t g) const {
  SampleParams sp = base;
  sp.seed = rng_mix(o.seed + g);
  return sp;
}

void Loop::undecided(int lo, int hi) {
  pos.clear();
  for (int p = lo; p < hi; ++p)
    if (!decided[static_cast<size_t>(p)]) pos.push_back(p);
}

void Loop::predict(const SampleParams& sp) {
  const RowSpec r = parts.rows->next_rows(*this);
  if (parts.attention) parts.attention->before_forward(*this, r);
  ++forwards;
  const size_t n = pos.size();
  tok.assign(n, 0);
  conf.assign(n, 0.0f);
  if (parts.experts) parts.experts->before_forward(*this);
  const auto view = std::span<const int32_t>(canvas).first(r.view);
  if (parts.guidance) {
    parts.guidance->forward(*this, r, sp);
  } else if (r.kind == RowSpec::Kind::Whole) {
    den.predict(view, pos, sp, tok, conf);
  } else if (r.kind == RowSpec::Kind::Range) {
    den.predict_cached(view, r.lo, r.hi, pos, sp, tok, conf);
  } else {
    den.predict_rows(view, r.rows, pos, sp, tok, conf);
  }
  if (o.logprobs) {
    lp = parts.guidance ? &host_lp : &den.last_logprobs();
    TESSERA_CHECK(
        lp->chosen.size() == pos.size() && lp->top_lp.size() == pos.size() * static_cast<size_t>(lp->top),
        "generate: the denoiser returned log-probabilities for another number of positions");
  }
}

void Loop::rank(size_t k) {
  idx.resize(pos.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
  auto key = [&](int i) {
    const float c = conf[static_cast<size_t>(i)];
    return std::isnan(c) ? -INFINITY : c;
  };
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(std::min(k, idx.size())),
                    idx.end(), [&](int a, int b) {
                      const float ca = key(a), cb = key(b);
                      return ca > cb || (ca == cb && a < b);
                    });
}

void Loop::commit_all() {
  idx.resize(pos.size());
  for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<int>(j);
  commit(pos.size());
}

void Loop::commit(size_t k) {
  chosen.clear();
  step_edits.clear();
  for (size_t j = 0; j < k; ++j) set_token(static_cast<size_t>(idx[j]), false);
  end_step();
}

void Loop::commit_edits(std::span<const int> fill, std::span<const int> rewrite) {
  chosen.clear();
  step_edits.clear();
  for (int i : fill) set_token(static_cast<size_t>(i), false);
  for (int i : rewrite) set_token(static_cast<size_t>(i), true);
  if (chosen.empty()) return;  // a step that changes nothing is no step (its forward is counted)
  std::sort(step_edits.begin(), step_edits.end(),
            [](const TokenEdit& a, const TokenEdit& b) { return a.position < b.position; });
  res.edits.insert(res.edits.end(), step_edits.begin(), step_edits.end());
  end_step();
}

void Loop::set_token(size_t i, bool rewrite) {
  const int32_t p = pos[i];
  TESSERA_CHECK(decided[static_cast<size_t>(p)] == (rewrite ? 1 : 0),
                "generate: internal error, position " + std::to_string(p) +
                    (rewrite ? " rewritten before it was decided" : " decided twice"));
  if (rewrite) step_edits.push_back(TokenEdit{res.steps_run, p, canvas[static_cast<size_t>(p)], tok[i]});
  decided[static_cast<size_t>(p)] = 1;
  canvas[static_cast<size_t>(p)] = tok[i];
  chosen.push_back(p);
  if (o.logprobs) {
    TokenLogprob& t = gen_lp[static_cast<size_t>(p - P)];
    t.logprob = lp->chosen[i];
    t.step = res.steps_run;
    const auto top = static_cast<size_t>(lp->top);
    t.top.clear();
    for (size_t a = i * top; a < (i + 1) * top && lp->top_ids[a] >= 0; ++a)
      t.top.emplace_back(lp->top_ids[a], lp->top_lp[a]);
  }
  decided_token(p, tok[i]);
}

void Loop::end_step() {
  std::sort(chosen.begin(), chosen.end());
  res.order.push_back(chosen);
  ++res.steps_run;
  advance_committed();
  if (on_step) {
    const auto shown = std::span<const int32_t>(canvas).first(static_cast<size_t>(P + G));
    on_step(StepEvent{res.steps_run - 1, shown, res.order.back(), gen_lp, committed, step_edits});
  }
}

}  // namespace tessera::decode
