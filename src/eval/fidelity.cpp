#include "eval/fidelity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/request_budget.h"

namespace tessera::eval {

std::vector<Seq> load_heldout(const std::filesystem::path& text_file, const Tokenizer& tok, int64_t seq_len,
                              int64_t max_seqs) {
  std::ifstream f(text_file);
  if (!f) fail("cannot read the held-out text " + text_file.string());
  TESSERA_CHECK(seq_len > 0 && max_seqs > 0, "eval: sequence length and count must be positive");
  std::vector<Seq> out;
  std::string line, doc;
  auto flush = [&] {
    if (doc.empty()) return;
    const Seq ids = tok.encode(doc, false);
    for (size_t at = 0; at + static_cast<size_t>(seq_len) <= ids.size(); at += static_cast<size_t>(seq_len)) {
      if (static_cast<int64_t>(out.size()) >= max_seqs) break;
      out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(at),
                       ids.begin() + static_cast<std::ptrdiff_t>(at) + seq_len);
    }
    doc.clear();
  };
  const bool jsonl = text_file.extension() == ".jsonl";
  while (std::getline(f, line) && static_cast<int64_t>(out.size()) < max_seqs) {
    if (jsonl) {  // one JSON object per line with its document in "text"
      if (line.empty()) continue;
      try {
        doc = nlohmann::json::parse(line).at("text").get<std::string>();
      } catch (const std::exception& e) {
        fail(text_file.string() + ": a line is not a JSON object with a \"text\" string (" + e.what() + ")");
      }
      flush();
      continue;
    }
    if (line.empty()) {
      flush();
      continue;
    }
    doc += doc.empty() ? line : "\n" + line;
  }
  flush();
  if (out.empty()) {
    fail(text_file.string() + " holds no document of at least " + std::to_string(seq_len) +
         " tokens (lower --seq-len)");
  }
  return out;
}

int32_t unigram_token(const std::vector<Seq>& seqs) {
  std::map<int32_t, int64_t> n;
  for (const Seq& s : seqs)
    for (int32_t t : s) ++n[t];
  int32_t best = 0;
  int64_t best_n = -1;
  for (const auto& [t, c] : n) {
    if (c > best_n) {
      best = t;
      best_n = c;
    }
  }
  return best;
}

InfillResult infill(Engine& e, const std::vector<Seq>& seqs, double mask_ratio, uint64_t seed,
                    int32_t unigram, int64_t batch_tokens) {
  InfillResult r;
  r.mask_ratio = mask_ratio;
  const int32_t mask = e.mask_token();
  int64_t correct = 0, uni = 0;
  double nll = 0;
  // Pack sequences into batches of about batch_tokens canvas tokens (one forward each).
  std::vector<Seq> canvases, positions, targets;
  for (size_t s = 0; s < seqs.size(); ++s) {
    Seq c = seqs[s], pos, tg;
    for (size_t i = 0; i < c.size(); ++i) {
      if (rng_uniform(seed, s, i) < mask_ratio) pos.push_back(static_cast<int32_t>(i));
    }
    if (pos.empty()) pos.push_back(static_cast<int32_t>(rng_mix(seed ^ s) % c.size()));
    for (int32_t p : pos) {
      tg.push_back(c[static_cast<size_t>(p)]);
      c[static_cast<size_t>(p)] = mask;
    }
    canvases.push_back(std::move(c));
    positions.push_back(std::move(pos));
    targets.push_back(std::move(tg));
  }
  SampleParams sp;  // argmax, probability
  for (size_t a = 0; a < canvases.size();) {
    std::vector<SeqInput> batch;
    int64_t tokens = 0, n = 0;
    size_t b = a;
    while (b < canvases.size() &&
           (batch.empty() || tokens + static_cast<int64_t>(canvases[b].size()) <= batch_tokens)) {
      batch.push_back({canvases[b], positions[b], targets[b]});
      tokens += static_cast<int64_t>(canvases[b].size());
      n += static_cast<int64_t>(positions[b].size());
      ++b;
    }
    std::vector<int32_t> tok(static_cast<size_t>(n));
    std::vector<float> conf(static_cast<size_t>(n)), lp(static_cast<size_t>(n));
    e.forward_sample(batch, sp, tok, conf);
    e.forward_logprob(batch, lp);
    size_t k = 0;
    for (size_t s = a; s < b; ++s) {
      for (int32_t t : targets[s]) {
        correct += tok[k] == t ? 1 : 0;
        uni += unigram == t ? 1 : 0;
        nll -= lp[k];
        ++k;
      }
    }
    r.masked += n;
    a = b;
  }
  r.accuracy = static_cast<double>(correct) / static_cast<double>(r.masked);
  r.unigram_accuracy = static_cast<double>(uni) / static_cast<double>(r.masked);
  r.nll = nll / static_cast<double>(r.masked);
  return r;
}

std::vector<GenCase> generation_cases(const std::vector<Seq>& seqs, int64_t n, int64_t prompt_len,
                                      int64_t gen_length, int64_t suffix_len) {
  std::vector<GenCase> out;
  for (const Seq& s : seqs) {
    if (static_cast<int64_t>(out.size()) >= n) break;
    if (static_cast<int64_t>(s.size()) < prompt_len + gen_length + suffix_len) continue;
    const auto at = [&](int64_t i) { return s.begin() + i; };
    out.push_back({Seq(s.begin(), at(prompt_len)), Seq(at(prompt_len), at(prompt_len + gen_length)),
                   Seq(at(prompt_len + gen_length), at(prompt_len + gen_length + suffix_len))});
  }
  if (out.empty()) fail("eval: no held-out sequence is long enough for the prompt plus the generation");
  return out;
}

double pseudo_nll(Engine& e, const Seq& seq, int64_t from, int groups, int64_t to) {
  const int64_t end =
      to < 0 ? static_cast<int64_t>(seq.size()) : std::min(to, static_cast<int64_t>(seq.size()));
  const int64_t n = end - from;
  if (n <= 0) return 0.0;
  double total = 0;
  for (int g = 0; g < groups; ++g) {
    Seq canvas = seq, pos, tg;
    for (int64_t i = from + g; i < end; i += groups) {
      pos.push_back(static_cast<int32_t>(i));
      tg.push_back(seq[static_cast<size_t>(i)]);
      canvas[static_cast<size_t>(i)] = e.mask_token();
    }
    if (pos.empty()) continue;
    std::vector<float> lp(pos.size());
    const SeqInput in{canvas, pos, tg};
    e.forward_logprob(std::span<const SeqInput>(&in, 1), lp);
    for (float v : lp) total -= v;
  }
  return total / static_cast<double>(n);
}

double causal_nll(Engine& e, const Seq& seq, int64_t from, int64_t to) {
  TESSERA_CHECK(from >= 1 && to <= static_cast<int64_t>(seq.size()),
                "causal_nll: positions outside the text");
  if (to <= from) return 0.0;
  Seq pos, tg;  // a causal forward's position i is predicted by row i - 1 (Engine::logit_row)
  for (int64_t i = from; i < to; ++i) {
    pos.push_back(static_cast<int32_t>(i));
    tg.push_back(seq[static_cast<size_t>(i)]);
  }
  const Seq prefix(seq.begin(), seq.begin() + to);
  std::vector<float> lp(pos.size());
  const SeqInput in{prefix, pos, tg};
  e.set_causal(true);
  try {
    e.forward_logprob(std::span<const SeqInput>(&in, 1), lp);
  } catch (...) {
    e.set_causal(false);
    throw;
  }
  e.set_causal(false);
  double total = 0;
  for (float v : lp) total -= v;
  return total / static_cast<double>(lp.size());
}

Generations generate_all(Engine& e, const GenerateOptions& opt, const std::vector<GenCase>& cases,
                         const std::vector<uint64_t>& seeds, bool use_suffix) {
  TESSERA_CHECK(!seeds.empty() && !cases.empty(), "eval: no generation cases or seeds");
  Generations o;
  const auto t0 = std::chrono::steady_clock::now();
  for (const GenCase& c : cases) {
    for (uint64_t seed : seeds) {
      GenerateOptions g = opt;
      g.seed = seed;
      if (use_suffix) g.suffix = c.suffix;
      g.moe_stats = e.supports_expert_sharing();
      // One request: planned, its state held open, its budget checked, as the CLI and the server do.
      const bool block_causal = e.attention_block() > 0;
      RequestScope request(e, plan_checked(c.prompt, g, e.vocab_size(), block_causal));
      check_request_budget(e, request.plan());
      GenerateResult r = generate(request, c.prompt, g);
      o.steps += r.steps_run;
      o.forwards += r.forwards;
      if (g.moe_stats) o.moe += e.moe_stats();
      o.tokens.push_back(std::move(r.tokens));
    }
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

GenSide score(Engine& exact, const Generations& out, const Generations& exact_out,
              const std::vector<GenCase>& cases, size_t n_seeds, int64_t gen_length, int nll_groups) {
  TESSERA_CHECK(out.tokens.size() == exact_out.tokens.size() && out.tokens.size() == cases.size() * n_seeds,
                "eval: generations do not match the cases");
  GenSide s;
  s.seconds = out.seconds;
  s.steps = out.steps;
  s.forwards = out.forwards;
  s.experts = out.moe.mean(out.moe.unique);
  s.experts_block = out.moe.mean(out.moe.unique_voting);
  int64_t agree = 0, match = 0, total = 0, nll_n = 0;
  double nll = 0;
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    const GenCase& c = cases[i / n_seeds];
    const Seq& t = out.tokens[i];
    const Seq& r = exact_out.tokens[i];
    for (int64_t p = 0; p < gen_length; ++p) {
      const auto q = static_cast<size_t>(p);
      const bool have = q < t.size();
      agree += have && q < r.size() && t[q] == r[q] ? 1 : 0;
      match += have && q < c.reference.size() && t[q] == c.reference[q] ? 1 : 0;
      ++total;
    }
    s.tokens += static_cast<int64_t>(t.size());
    if (!t.empty()) {
      Seq full = c.prompt;  // the generation between the prompt and the case's suffix (if any)
      full.insert(full.end(), t.begin(), t.end());
      full.insert(full.end(), c.suffix.begin(), c.suffix.end());
      const auto from = static_cast<int64_t>(c.prompt.size());
      const int64_t to = from + static_cast<int64_t>(t.size());
      nll += (exact.config().is_uniform() ? causal_nll(exact, full, from, to)
                                          : pseudo_nll(exact, full, from, nll_groups, to)) *
             static_cast<double>(t.size());
      nll_n += static_cast<int64_t>(t.size());
    }
  }
  s.agreement = static_cast<double>(agree) / static_cast<double>(total);
  s.reference_match = static_cast<double>(match) / static_cast<double>(total);
  s.nll = nll_n > 0 ? nll / static_cast<double>(nll_n) : 0.0;
  return s;
}

}  // namespace tessera::eval
