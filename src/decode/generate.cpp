#include "decode/generate.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "decode/schedule.h"

namespace tessera {
namespace {

constexpr uint64_t kHostSalt = 0xd1b54a32d192ed03ull;

bool is_llada(const std::string& a) {
  return a == "low_confidence" || a == "random";
}
bool is_dream(const std::string& a) {
  return a == "origin" || a == "maskgit_plus" || a == "topk_margin" || a == "entropy";
}
std::string num(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

ConfKind conf_kind(const std::string& a) {
  if (a == "random") return ConfKind::Random;
  if (a == "topk_margin") return ConfKind::Margin;
  if (a == "entropy") return ConfKind::NegEntropy;
  return ConfKind::Prob;  // low_confidence, origin, maskgit_plus
}

struct Loop {
  Loop(Denoiser& d, const GenerateOptions& opt, const std::function<void(const StepEvent&)>& cb)
      : den(d), o(opt), on_step(cb) {}
  Denoiser& den;
  const GenerateOptions& o;
  const std::function<void(const StepEvent&)>& on_step;
  int64_t V = 0;
  int32_t mask = 0;
  int P = 0;  // prompt length
  int G = 0;  // generation length
  // Block-causal models: forwards see only canvas[0, window) (later blocks cannot change earlier
  // rows); 0 = the whole canvas. Threshold steps accept conf > threshold (LLaDA2's rule) and at
  // least min_sched[i] positions at step i of a block (LLaDA2's per-step minimum).
  int window = 0;
  bool strict_threshold = false;
  std::vector<int> min_sched;
  std::vector<int32_t> canvas;
  std::vector<char> decided;  // per canvas position
  // KV cache: 0 none, 1 prefix, 2 dual. The current block's rows [blk_lo, blk_hi); blk_fresh until its
  // first forward. Block-causal: rows >= stale_from hold K / V computed before their block was final.
  int cache = 0;
  int blk_lo = 0, blk_hi = 0, stale_from = 0;
  bool blk_fresh = true;
  // SparseD: forwards run so far, and the index of the forward that builds the patterns (-1: off).
  int64_t forwards = 0, sparse_select_at = -1;
  bool des = false;  // DES (or its counts): the block's positions are the rows decoded in parallel
  // Window-Diffusion (win): positions >= stop are dropped (early stop: one past the first decided
  // EOS). A phase is fixed at its refresh forward: the external window ends at ext_end, phase_rows
  // are the positions then undecided in [u0, ext_end); phase_left forwards remain (0: the next
  // forward starts a phase). a_end ends the active set of the step being prepared.
  bool win = false, early_stop = false, fresh = false;
  int w_ex = 0, w_in = 0, w_refresh = 0;
  int stop = 0, u0 = 0, ext_end = 0, a_end = 0, phase_left = 0;
  uint64_t g_extra = 0;  // RNG step counter of the steps that finish a block after its schedule
  std::vector<int32_t> phase_rows, step_rows;
  // The first undecided generated position: every token before it is final. With mid_block_stop, once
  // the tokens before it hold an EOS (stop_at_eos) or a stop sequence (stop_when), no later step can
  // change the answer and the generation ends at once (`ended`), inside a block too.
  int prefix_end = 0;
  bool ended = false;
  SampleParams base;
  GenerateResult res;
  // logprobs: those of the last forward's positions (pos), the denoiser's (valid until its next call)
  // or, with cfg, host_lp computed here from the guided logits.
  const PredictLogprobs* lp = nullptr;
  PredictLogprobs host_lp;
  std::vector<TokenLogprob> gen_lp;  // logprobs: per generated position, set when it is decided
  // Scratch reused across steps.
  std::vector<int32_t> pos, tok, chosen;
  std::vector<float> conf, lc, lu;
  std::vector<int32_t> ucanvas;
  std::vector<int> idx;
  std::vector<double> w;

  SampleParams params(uint64_t g) const {
    SampleParams sp = base;
    sp.seed = rng_mix(o.seed + g);
    return sp;
  }

  // Undecided positions in [lo, hi), ascending, into pos.
  void undecided(int lo, int hi) {
    pos.clear();
    for (int p = lo; p < hi; ++p)
      if (!decided[static_cast<size_t>(p)]) pos.push_back(p);
  }

  // The rows that need a forward now: pos = the undecided positions of [lo, hi) (window: those of the
  // active set). False when none is left.
  bool prepare(int lo, int hi) {
    if (!win) {
      undecided(lo, hi);
      return !pos.empty();
    }
    const int end = std::min(hi, stop);
    bool started = false;
    if (phase_left <= 0) {
      new_phase();
      started = true;
    }
    for (;;) {
      // The active set: the first w_in positions of the window that are still undecided.
      pos.clear();
      int seen = 0;
      a_end = u0;
      for (int p = u0; p < std::min(ext_end, stop) && seen < w_in; ++p) {
        if (decided[static_cast<size_t>(p)]) continue;
        ++seen;
        a_end = p + 1;
        if (p >= lo && p < end) pos.push_back(p);
      }
      if (!pos.empty() || started) return !pos.empty();
      new_phase();  // the phase's window is used up before its refresh is due
      started = true;
    }
  }

  // Starts a Window-Diffusion phase: the external window is the first w_ex undecided positions from
  // the first undecided one (every decided position before stop lies inside it: tokens are only
  // decided inside the active set, which is a prefix of at most w_in <= w_ex of them).
  void new_phase() {
    u0 = stop;
    for (int p = P; p < stop; ++p) {
      if (!decided[static_cast<size_t>(p)]) {
        u0 = p;
        break;
      }
    }
    phase_rows.clear();
    ext_end = stop;
    for (int p = u0; p < stop; ++p) {
      if (decided[static_cast<size_t>(p)]) continue;
      phase_rows.push_back(p);
      if (static_cast<int>(phase_rows.size()) == w_ex) {
        ext_end = p + 1;
        break;
      }
    }
    phase_left = w_refresh;
    fresh = true;
  }

  // (token, conf) for every position of pos, on the device or (cfg) on the host; with logprobs, theirs.
  void predict(const SampleParams& sp) {
    forward(sp);
    if (o.logprobs) {
      lp = o.cfg_scale > 0.0f ? &host_lp : &den.last_logprobs();
      TESSERA_CHECK(
          lp->chosen.size() == pos.size() && lp->top_lp.size() == pos.size() * static_cast<size_t>(lp->top),
          "generate: the denoiser returned log-probabilities for another number of positions");
    }
  }
  void forward(const SampleParams& sp) {
    if (sparse_select_at >= 0 && forwards <= sparse_select_at + 1) {
      den.sparse_phase(forwards < sparse_select_at    ? SparsePhase::Dense
                       : forwards == sparse_select_at ? SparsePhase::Select
                                                      : SparsePhase::Sparse);
    }
    ++forwards;
    const size_t n = pos.size();
    tok.assign(n, 0);
    conf.assign(n, 0.0f);
    const size_t seen = window > 0 ? static_cast<size_t>(window) : canvas.size();
    if (win) {
      // The far field [ext_end, ...) and everything past an early stop are not part of the forward.
      const int n_win = std::min(ext_end, stop);
      const auto view = std::span<const int32_t>(canvas).first(static_cast<size_t>(n_win));
      if (des) den.des_rows(pos.front(), pos.back() + 1);
      if (w_refresh == 0) {
        den.predict(view, pos, sp, tok, conf);
      } else if (fresh) {  // refresh: the whole window, every row's K / V into the cache
        den.predict_cached(view, 0, n_win, pos, sp, tok, conf);
      } else {  // the active set and the positions decided in this phase; the rest from the cache
        step_rows.clear();
        for (int32_t r : phase_rows)
          if (r < a_end && r < n_win) step_rows.push_back(r);
        den.predict_rows(view, step_rows, pos, sp, tok, conf);
      }
      fresh = false;
      --phase_left;
      return;
    }
    if (cache > 0) {
      int64_t q_lo = blk_lo, q_hi = static_cast<int64_t>(seen);
      if (window > 0) {
        if (blk_fresh) q_lo = stale_from;
      } else if (blk_fresh) {
        q_lo = 0;
      } else if (cache == 2) {
        q_hi = blk_hi;
      }
      den.predict_cached(std::span<const int32_t>(canvas).first(seen), q_lo, q_hi, pos, sp, tok, conf);
      if (window > 0 && blk_fresh) stale_from = blk_lo;
      blk_fresh = false;
      return;
    }
    if (o.cfg_scale <= 0.0f) {
      den.predict(std::span<const int32_t>(canvas).first(seen), pos, sp, tok, conf);
      return;
    }
    const size_t nv = n * static_cast<size_t>(V);
    lc.resize(nv);
    lu.resize(nv);
    den.logits(std::span<const int32_t>(canvas).first(seen), pos, lc);
    ucanvas.assign(canvas.begin(), canvas.begin() + static_cast<std::ptrdiff_t>(seen));
    std::fill(ucanvas.begin(), ucanvas.begin() + P, mask);  // the condition: the prompt and the suffix
    if (seen > static_cast<size_t>(P + G)) std::fill(ucanvas.begin() + P + G, ucanvas.end(), mask);
    den.logits(ucanvas, pos, lu);
    const float g = o.cfg_scale + 1.0f;
    for (size_t i = 0; i < nv; ++i) lc[i] = lu[i] + g * (lc[i] - lu[i]);
    const auto rows = static_cast<int64_t>(n);
    const Tensor L(lc.data(), DType::F32, {rows, V});
    const Tensor keys(pos.data(), DType::I32, {rows});
    Tensor t(tok.data(), DType::I32, {rows}), c(conf.data(), DType::F32, {rows});
    cpu_sample_rows(L, keys, sp, t, c);
    if (o.logprobs) {  // of the guided logits, as the device computes them
      PredictLogprobs& h = host_lp;
      h.top = std::min(kTopLogprobs, V);
      h.chosen.resize(n);
      h.top_ids.resize(n * static_cast<size_t>(h.top));
      h.top_lp.resize(h.top_ids.size());
      Tensor lc_tok(h.chosen.data(), DType::F32, {rows});
      Tensor ids(h.top_ids.data(), DType::I32, {rows, h.top}),
          top(h.top_lp.data(), DType::F32, {rows, h.top});
      cpu_top_logprobs(L, t, lc_tok, ids, top);
    }
  }

  // Indices into pos ordered by confidence, highest first, ties to the lower position (NaN last).
  void rank(size_t k) {
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

  // Dream alg_temp: k indices into pos sampled without replacement from softmax(conf / alg_temp).
  void sample_positions(size_t k, uint64_t host_seed) {
    const size_t n = pos.size();
    float cmax = -INFINITY;
    for (size_t i = 0; i < n; ++i)
      if (!std::isnan(conf[i])) cmax = std::max(cmax, conf[i]);
    w.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i)
      if (!std::isnan(conf[i]) && conf[i] != -INFINITY)
        w[i] = std::exp((static_cast<double>(conf[i]) - cmax) / o.alg_temp);
    idx.clear();
    for (size_t j = 0; j < k; ++j) {
      double total = 0.0;
      for (double x : w) total += x;
      size_t pick = n;
      if (total > 0.0) {
        const double target = rng_uniform(host_seed, j, 1) * total;
        double acc = 0.0;
        for (size_t i = 0; i < n; ++i) {
          if (w[i] <= 0.0) continue;
          acc += w[i];
          pick = i;
          if (acc > target) break;
        }
      }
      if (pick == n) {  // every remaining weight underflowed: lowest undecided position
        for (size_t i = 0; i < n && pick == n; ++i)
          if (std::find(idx.begin(), idx.end(), static_cast<int>(i)) == idx.end()) pick = i;
      }
      idx.push_back(static_cast<int>(pick));
      w[pick] = 0.0;
    }
  }

  // Decides pos[idx[0..k)] with their predicted tokens; records the step and emits the event.
  void commit(size_t k) {
    chosen.clear();
    for (size_t j = 0; j < k; ++j) {
      const auto i = static_cast<size_t>(idx[j]);
      const int32_t p = pos[i];
      TESSERA_CHECK(!decided[static_cast<size_t>(p)],
                    "generate: internal error, position " + std::to_string(p) + " decided twice");
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
      if (early_stop && is_eos(tok[i])) stop = std::min(stop, p + 1);
    }
    std::sort(chosen.begin(), chosen.end());
    res.order.push_back(chosen);
    ++res.steps_run;
    if (on_step) {
      const auto shown = std::span<const int32_t>(canvas).first(static_cast<size_t>(P + G));
      on_step(StepEvent{res.steps_run - 1, shown, res.order.back(), gen_lp});
    }
    if (o.mid_block_stop) advance_prefix();
  }

  // Moves prefix_end past the positions decided now; ends the generation when the final tokens before
  // it hold an EOS or a stop sequence (the answer ends there whatever the later steps decide).
  void advance_prefix() {
    const int from = prefix_end, end = P + G;
    while (prefix_end < end && decided[static_cast<size_t>(prefix_end)]) ++prefix_end;
    if (prefix_end != from) ended = ends_before(from, prefix_end);
  }

  // LLaDA 1A inside [lo, hi): S steps of the per-block schedule. A window step decides at most its
  // active positions; the rest of its count carries to the next step.
  void llada_block(int lo, int hi, int S, uint64_t g0) {
    undecided(lo, std::min(hi, stop));
    const std::vector<int> sched = llada_schedule(static_cast<int>(pos.size()), S);
    size_t owed = 0;
    for (int i = 0; i < S; ++i) {
      const size_t k = static_cast<size_t>(sched[static_cast<size_t>(i)]) + owed;
      if (k == 0) continue;
      if (!prepare(lo, hi)) return;
      predict(params(g0 + static_cast<uint64_t>(i)));
      const size_t kk = std::min(k, pos.size());
      owed = k - kk;
      rank(kk);
      commit(kk);
      if (ended) return;
    }
    finish_block(lo, hi);
  }

  // Window: positions of [lo, hi) still undecided after the block's schedule (its last counts went
  // past the active set) are decided a whole active set per step.
  void finish_block(int lo, int hi) {
    while (win && !ended && prepare(lo, hi)) {
      predict(params(g_extra++));
      idx.resize(pos.size());
      for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<int>(j);
      commit(pos.size());
    }
  }

  // Dream 1B inside [lo, hi): S steps of the linspace schedule.
  void dream_block(int lo, int hi, int S, uint64_t g0) {
    const std::vector<float> ts = dream_timesteps(S, o.eps);
    for (int i = 0; i < S; ++i) {
      const float t = ts[static_cast<size_t>(i)], s = ts[static_cast<size_t>(i) + 1];
      const bool last = i == S - 1;
      const SampleParams sp = params(g0 + static_cast<uint64_t>(i));
      const uint64_t host_seed = rng_mix(sp.seed ^ kHostSalt);
      undecided(lo, std::min(hi, stop));
      if (pos.empty()) continue;
      if (o.alg == "origin") {
        const float pt = dream_transfer_prob(t, s, last);
        if (!prepare(lo, hi)) break;
        size_t m = 0;
        for (int32_t p : pos)
          if (rng_uniform(host_seed, static_cast<uint64_t>(p), 0) < pt) pos[m++] = p;
        pos.resize(m);
        if (m == 0) continue;
        predict(sp);
        idx.resize(m);
        for (size_t j = 0; j < m; ++j) idx[j] = static_cast<int>(j);
        commit(m);
        if (ended) return;
        continue;
      }
      const auto k = static_cast<size_t>(dream_transfer_count(static_cast<int>(pos.size()), t, s, last));
      if (k == 0) continue;
      if (!prepare(lo, hi)) break;
      predict(sp);
      const size_t kk = std::min(k, pos.size());
      if (o.alg_temp > 0.0f) {
        sample_positions(kk, host_seed);
      } else {
        rank(kk);
      }
      commit(kk);
      if (ended) return;
    }
    finish_block(lo, hi);
  }

  // 1C inside [lo, hi): until decided, accept conf >= threshold and always the most confident.
  void threshold_block(int lo, int hi, uint64_t& g) {
    for (size_t step = 0;; ++step) {
      if (!prepare(lo, hi)) return;
      predict(params(g++));
      rank(pos.size());
      size_t k = 1;
      auto accept = [&](float c) { return strict_threshold ? c > o.threshold : c >= o.threshold; };
      while (k < idx.size() && accept(conf[static_cast<size_t>(idx[k])])) ++k;
      if (step < min_sched.size())
        k = std::max(k, std::min(idx.size(), static_cast<size_t>(min_sched[step])));
      commit(k);
      if (ended) return;
    }
  }

  void begin_block(int lo, int hi) {
    blk_lo = lo;
    blk_hi = hi;
    blk_fresh = true;
    if (des) den.des_rows(std::max(lo, P), hi);
  }

  bool is_eos(int32_t t) const { return std::find(o.eos_ids.begin(), o.eos_ids.end(), t) != o.eos_ids.end(); }
  // Whether the answer ends within the decided tokens [P, to): an EOS in [from, to) (stop_at_eos; the
  // tokens before `from` were checked already) or a stop sequence in them (stop_when, asked only when
  // they hold no EOS; sets `stopped`). Without mid_block_stop it is asked after every block but the
  // last with every position before the block's end decided (from = P): true skips the later blocks.
  bool ends_before(int from, int to) {
    const int32_t* c = canvas.data();
    if (o.stop_at_eos && std::any_of(c + from, c + to, [&](int32_t t) { return is_eos(t); })) return true;
    if (o.stop_when && o.stop_when(std::span<const int32_t>(c + P, c + to))) stopped = true;
    return stopped;
  }
  bool stopped = false;  // stop_when ended the generation: the later blocks are undecided
};

void init_sampling(Loop& L, bool llada) {
  const GenerateOptions& o = L.o;
  L.base.conf = conf_kind(o.alg);
  L.base.temperature = o.temperature;
  L.base.gumbel = llada;
  L.base.top_k = o.top_k;
  L.base.top_p = o.top_p;
  L.base.suppress_token = o.logits_eos_inf ? o.eos_ids.front() : -1;
  L.base.logprobs = o.logprobs && o.cfg_scale <= 0.0f;  // cfg: the host computes them
  if (o.logprobs)  // the generated positions (block-causal: with the padding after them)
    L.gen_lp.assign(L.canvas.size() - static_cast<size_t>(L.P) - o.suffix.size(), TokenLogprob{});
}

// The generated part of the canvas, trimmed at the first EOS when asked.
GenerateResult finish(Loop& L) {
  const GenerateOptions& o = L.o;
  GenerateResult res = std::move(L.res);
  // Window early stop: the positions after the stopping EOS were never generated; they read as it.
  if (L.win && L.stop < static_cast<int>(L.canvas.size())) {
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

// Block-causal models (LLaDA2MoeModelLM.generate): the blocks are the model's attention blocks, on the
// grid of absolute positions [b * BL, (b + 1) * BL). The canvas is padded with masks to a whole number
// of blocks; the first block may hold the end of the prompt (only its masked positions are decided);
// padding positions past prompt + gen_length are decided like the others and dropped. Each block runs
// `steps` steps (steps per block, as in the reference) and every forward sees only canvas[0, block end).
GenerateResult generate_block_causal(Loop& L, bool llada) {
  const GenerateOptions& o = L.o;
  const int BL = o.block_length;
  const auto total = static_cast<int>(canvas_length(L.P, o, true));
  L.canvas.resize(static_cast<size_t>(total), L.mask);
  L.stop = total;
  L.prefix_end = L.P;
  L.decided.assign(L.canvas.size(), 0);
  std::fill(L.decided.begin(), L.decided.begin() + L.P, 1);
  init_sampling(L, llada);
  if (o.threshold > 0.0f) {
    L.strict_threshold = true;
    L.min_sched = llada_schedule(BL, o.steps);
  }
  uint64_t g = 0;
  for (int b = L.P / BL; b < total / BL; ++b) {
    const int lo = std::max(b * BL, L.P), hi = (b + 1) * BL;
    L.window = hi;
    L.begin_block(b * BL, hi);
    if (o.threshold > 0.0f) {
      L.threshold_block(lo, hi, g);
    } else {
      if (llada)
        L.llada_block(lo, hi, o.steps, g);
      else
        L.dream_block(lo, hi, o.steps, g);
      g += static_cast<uint64_t>(o.steps);
    }
    if (L.ended || (!o.mid_block_stop && hi < total && L.ends_before(L.P, hi))) break;
  }
  return finish(L);
}

}  // namespace

void validate_generate_options(const GenerateOptions& o, int64_t vocab_size, bool block_causal) {
  const std::string& a = o.alg;
  TESSERA_CHECK(is_llada(a) || is_dream(a),
                "unknown algorithm '" + a +
                    "'; use one of low_confidence, random, origin, maskgit_plus, topk_margin, entropy");
  TESSERA_CHECK(o.gen_length > 0, "gen-length must be > 0 (got " + std::to_string(o.gen_length) + ")");
  TESSERA_CHECK(o.steps > 0, "steps must be > 0 (got " + std::to_string(o.steps) + ")");
  TESSERA_CHECK(o.block_length > 0, "block-length must be > 0 (got " + std::to_string(o.block_length) + ")");
  TESSERA_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.0f,
                "temperature must be >= 0 (got " + num(o.temperature) + ")");
  TESSERA_CHECK(std::isfinite(o.threshold) && o.threshold >= 0.0f && o.threshold <= 1.0f,
                "threshold must be in [0, 1] (got " + num(o.threshold) + "); 0 turns threshold decoding off");
  TESSERA_CHECK(
      !(o.threshold > 0.0f && (a == "random" || a == "origin" || a == "entropy")),
      "threshold decoding needs a probability-like confidence; use alg low_confidence, maskgit_plus "
      "or topk_margin (got " +
          a + ")");
  TESSERA_CHECK(std::isfinite(o.cfg_scale) && o.cfg_scale >= 0.0f,
                "cfg-scale must be >= 0 (got " + num(o.cfg_scale) + ")");
  TESSERA_CHECK(!(o.cfg_scale > 0.0f && !is_llada(a)),
                "cfg-scale applies only to the LLaDA algorithms low_confidence and random (got " + a + ")");
  TESSERA_CHECK(o.top_k >= 0, "top-k must be >= 0 (got " + std::to_string(o.top_k) + "); 0 turns it off");
  TESSERA_CHECK(std::isfinite(o.top_p) && o.top_p > 0.0f && o.top_p <= 1.0f,
                "top-p must be in (0, 1] (got " + num(o.top_p) + "); 1 turns it off");
  TESSERA_CHECK(
      !(is_llada(a) && (o.top_k > 0 || o.top_p < 1.0f)),
      "top-k / top-p apply only to the Dream algorithms origin, maskgit_plus, topk_margin, entropy (got " +
          a + ")");
  TESSERA_CHECK(std::isfinite(o.alg_temp) && o.alg_temp >= 0.0f,
                "alg-temp must be >= 0 (got " + num(o.alg_temp) + ")");
  TESSERA_CHECK(!(o.alg_temp > 0.0f && (is_llada(a) || a == "origin")),
                "alg-temp applies only to maskgit_plus, topk_margin and entropy (got " + a + ")");
  TESSERA_CHECK(!(o.alg_temp > 0.0f && o.threshold > 0.0f),
                "alg-temp cannot be combined with threshold decoding; set one of them to 0");
  TESSERA_CHECK(std::isfinite(o.eps) && o.eps > 0.0f && o.eps < 1.0f,
                "eps must be in (0, 1) (got " + num(o.eps) + ")");
  for (int32_t e : o.eos_ids)
    TESSERA_CHECK(
        e >= 0 && e < vocab_size,
        "eos id " + std::to_string(e) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  TESSERA_CHECK(o.cache == "none" || o.cache == "prefix" || o.cache == "dual",
                "unknown KV cache '" + o.cache + "'; use none, prefix or dual");
  TESSERA_CHECK(!(o.cache != "none" && o.cfg_scale > 0.0f),
                "the KV cache cannot be combined with classifier-free guidance; use cache none or cfg 0");
  if (o.sparse) {
    TESSERA_CHECK(o.sparse_block > 0,
                  "sparse-block must be > 0 (got " + std::to_string(o.sparse_block) + ")");
    TESSERA_CHECK(std::isfinite(o.sparse_rho) && o.sparse_rho >= 0.0f && o.sparse_rho <= 1.0f,
                  "sparse-rho must be in [0, 1] (got " + num(o.sparse_rho) + ")");
    TESSERA_CHECK(std::isfinite(o.sparse_skip) && o.sparse_skip >= 0.0f && o.sparse_skip < 1.0f,
                  "sparse-skip must be in [0, 1) (got " + num(o.sparse_skip) + ")");
    TESSERA_CHECK(o.cache == "none",
                  "sparse attention cannot be combined with a KV cache; use cache none or sparse off");
    TESSERA_CHECK(
        o.cfg_scale <= 0.0f,
        "sparse attention cannot be combined with classifier-free guidance; use cfg 0 or sparse off");
    TESSERA_CHECK(!block_causal,
                  "sparse attention needs a bidirectional model; this block-causal model grows its canvas "
                  "block by block");
  }
  TESSERA_CHECK(o.des == "off" || o.des == "seq" || o.des == "vote",
                "unknown expert sharing '" + o.des + "'; use off, seq or vote");
  if (o.des != "off") {
    TESSERA_CHECK(o.des_k >= 1, "des-k must be >= 1 (got " + std::to_string(o.des_k) + ")");
    TESSERA_CHECK(std::isfinite(o.des_beta) && o.des_beta > 0.0f && o.des_beta <= 1.0f,
                  "des-beta must be in (0, 1] (got " + num(o.des_beta) + ")");
    TESSERA_CHECK(o.des_scope == "block" || o.des_scope == "all",
                  "unknown des-scope '" + o.des_scope + "'; use block or all");
  }
  if (o.window) {
    TESSERA_CHECK(o.window_ex >= 0, "window-ex must be >= 0 (got " + std::to_string(o.window_ex) +
                                        "); 0 picks 64 for the LLaDA algorithms, 128 for the Dream ones");
    TESSERA_CHECK(o.window_in >= 1, "window-in must be >= 1 (got " + std::to_string(o.window_in) + ")");
    TESSERA_CHECK(window_external(o) >= o.window_in, "window-in (" + std::to_string(o.window_in) +
                                                         ") must not exceed window-ex (" +
                                                         std::to_string(window_external(o)) +
                                                         "): the active set lies inside the external window");
    TESSERA_CHECK(o.window_refresh >= 0, "window-refresh must be >= 0 (got " +
                                             std::to_string(o.window_refresh) +
                                             "); 0 recomputes the window at every step (no cache)");
    TESSERA_CHECK(
        o.cache == "none",
        "Window-Diffusion keeps its own phase cache (window-refresh); use cache none with the window");
    TESSERA_CHECK(!o.sparse,
                  "Window-Diffusion cannot be combined with sparse attention; turn one of them off");
    TESSERA_CHECK(
        o.cfg_scale <= 0.0f,
        "Window-Diffusion cannot be combined with classifier-free guidance; use cfg 0 or window off");
    TESSERA_CHECK(
        !block_causal,
        "Window-Diffusion needs a bidirectional model; this block-causal model decodes block by block");
  }
  TESSERA_CHECK(!(o.window_early_stop && !o.window), "window-early-stop needs the window; turn window on");
  TESSERA_CHECK(!(o.window_early_stop && o.eos_ids.empty()),
                "window-early-stop needs an eos id to stop at; pass at least one eos id");
  TESSERA_CHECK(!(o.logits_eos_inf && o.eos_ids.empty()),
                "logits-eos-inf needs an eos id to suppress; pass at least one eos id");
  for (const std::string& s : o.stop) TESSERA_CHECK(!s.empty(), "a stop sequence must not be empty");
  if (!o.suffix.empty()) {
    for (size_t i = 0; i < o.suffix.size(); ++i)
      TESSERA_CHECK(o.suffix[i] >= 0 && o.suffix[i] < vocab_size,
                    "suffix token " + std::to_string(o.suffix[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    TESSERA_CHECK(!block_causal,
                  "a suffix needs a bidirectional model; this block-causal model cannot see text after the "
                  "block it decodes");
    TESSERA_CHECK(!o.window, "Window-Diffusion cannot be combined with a suffix (infilling); turn one off");
    TESSERA_CHECK(!o.sparse, "sparse attention cannot be combined with a suffix (infilling); turn one off");
  }
  if (block_causal) return;  // blocks on the model's block grid: any block length, steps per block
  const bool split = o.threshold <= 0.0f && (is_llada(a) || o.block_length < o.gen_length);
  (void)block_layout(o.gen_length, o.block_length, o.steps, split);
}

int window_external(const GenerateOptions& o) {
  return o.window_ex > 0 ? o.window_ex : is_dream(o.alg) ? 128 : 64;
}

bool holds_kv_cache(const GenerateOptions& o) {
  return o.cache != "none" || (o.window && o.window_refresh > 0);
}

DesConfig des_config(const GenerateOptions& o) {
  DesConfig c;
  c.mode = o.des == "seq" ? DesMode::Seq : o.des == "vote" ? DesMode::Vote : DesMode::Off;
  c.k = o.des_k;
  c.beta = o.des_beta;
  c.all_rows = o.des_scope == "all";
  return c;
}

std::string implied_des(const std::optional<std::string>& des, bool k_given, bool beta_given,
                        const std::string& otherwise) {
  if (des) return *des;
  TESSERA_CHECK(!(k_given && beta_given),
                "des-k (DES-Seq) and des-beta (DES-Vote) choose different methods; give des seq or des vote");
  return k_given ? "seq" : beta_given ? "vote" : otherwise;
}

int64_t canvas_length(int64_t prompt_len, const GenerateOptions& o, bool block_causal) {
  const int64_t n = prompt_len + o.gen_length + static_cast<int64_t>(o.suffix.size());
  if (!block_causal) return n;
  const int64_t bl = o.block_length;
  return (n + bl - 1) / bl * bl;
}

GenerateResult generate(Denoiser& den, std::span<const int32_t> prompt, const GenerateOptions& o,
                        const std::function<void(const StepEvent&)>& on_step) {
  const int64_t V = den.vocab_size();
  const bool aligned = den.attention_block() > 0;
  validate_generate_options(o, V, aligned);
  for (size_t i = 0; i < prompt.size(); ++i)
    TESSERA_CHECK(prompt[i] >= 0 && prompt[i] < V,
                  "prompt token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                      " is outside the vocabulary [0, " + std::to_string(V) + ")");
  const bool llada = is_llada(o.alg);
  Loop L(den, o, on_step);
  L.V = V;
  L.mask = den.mask_token();
  L.P = static_cast<int>(prompt.size());
  L.G = o.gen_length;
  L.canvas.assign(prompt.begin(), prompt.end());
  L.cache = o.cache == "prefix" ? 1 : o.cache == "dual" ? 2 : 0;
  // Whatever the request turned on (KV cache, DES, SparseD) is turned off when it ends, however it ends.
  struct RequestGuard {
    Denoiser& d;
    bool kv = false, des = false, sparse = false;
    ~RequestGuard() {
      if (kv) d.kv_cache_end();
      if (des) d.des_end();
      if (sparse) d.sparse_end();
    }
  } guard{den};
  if (L.cache > 0) {
    TESSERA_CHECK(den.supports_kv_cache(), "this denoiser has no KV cache; use cache none");
    den.kv_cache_reset(canvas_length(L.P, o, aligned));
    guard.kv = true;
  }
  if (o.des != "off" || o.moe_stats) {
    TESSERA_CHECK(den.supports_expert_sharing(),
                  o.des != "off" ? "expert sharing needs a mixture-of-experts model; use des off"
                                 : "unique-expert counts need a mixture-of-experts model");
    den.des_begin(des_config(o));
    guard.des = L.des = true;
  }
  if (aligned) {
    den.set_attention_block(o.block_length);
    return generate_block_causal(L, llada);
  }
  const bool split = o.threshold <= 0.0f && (llada || o.block_length < o.gen_length);
  BlockLayout lay = block_layout(o.gen_length, o.block_length, o.steps, split);
  if (!split && o.threshold <= 0.0f) lay.steps_per_block = o.steps;  // Dream over the whole generation

  L.canvas.resize(prompt.size() + static_cast<size_t>(o.gen_length), L.mask);
  for (size_t i = 0; i < o.suffix.size(); ++i)
    TESSERA_CHECK(o.suffix[i] != L.mask, "suffix token " + std::to_string(i) +
                                             " is the mask token: the suffix is given text, not a gap");
  L.canvas.insert(L.canvas.end(), o.suffix.begin(), o.suffix.end());
  L.decided.assign(L.canvas.size(), 0);
  std::fill(L.decided.begin(), L.decided.begin() + L.P, 1);
  std::fill(L.decided.begin() + L.P + L.G, L.decided.end(), 1);  // the suffix
  L.stop = static_cast<int>(L.canvas.size());
  L.prefix_end = L.P;
  init_sampling(L, llada);
  if (o.window) {
    L.win = true;
    L.early_stop = o.window_early_stop;
    L.w_ex = window_external(o);
    L.w_in = o.window_in;
    L.w_refresh = o.window_refresh;
    L.g_extra = o.threshold > 0.0f ? 0 : static_cast<uint64_t>(lay.num_blocks) * lay.steps_per_block;
    if (L.w_refresh > 0) {
      TESSERA_CHECK(den.supports_kv_cache(), "this denoiser has no KV cache; use window-refresh 0");
      den.kv_cache_reset(static_cast<int64_t>(L.canvas.size()));
      guard.kv = true;
    }
  }
  if (o.sparse) {
    TESSERA_CHECK(den.supports_sparse_attention(), "this denoiser has no sparse attention; turn sparse off");
    den.sparse_begin(static_cast<int64_t>(L.canvas.size()), SparseConfig{o.sparse_block, o.sparse_rho, L.P});
    guard.sparse = true;
    L.sparse_select_at = static_cast<int64_t>(std::floor(static_cast<double>(o.steps) * o.sparse_skip));
  }

  uint64_t g = 0;  // global step counter (RNG)
  for (int b = 0; b < lay.num_blocks; ++b) {
    const int lo = L.P + b * lay.block_length, hi = lo + lay.block_length;
    L.begin_block(lo, hi);
    if (o.threshold > 0.0f) {
      L.threshold_block(lo, hi, g);
    } else {
      const auto g0 = static_cast<uint64_t>(b) * static_cast<uint64_t>(lay.steps_per_block);
      if (llada)
        L.llada_block(lo, hi, lay.steps_per_block, g0);
      else
        L.dream_block(lo, hi, lay.steps_per_block, g0);
    }
    // Every position before hi is decided: an EOS (or a stop sequence) there ends the answer, later
    // blocks are skipped (mid_block_stop: as soon as the decided prefix held it).
    if (L.ended || (!o.mid_block_stop && b + 1 < lay.num_blocks && L.ends_before(L.P, hi))) break;
  }

  return finish(L);
}

}  // namespace tessera
