// Pseudo-NLL of generated answers under the model itself, for tools/decoding_sweep.py (which builds this
// file against the build's libtessera_lib.a, as tools/train/bpe.py builds tok_check.cpp).
//   decoding_sweep_nll MODEL_DIR GROUPS < answers.jsonl > scores.jsonl
// Each input line: {"prompt": TEXT, "answer": [ids], "eos": bool}, or {"prompt": TEXT, "answer_text": TEXT,
// "max_tokens": n} (a text to score: its first n tokens, encoded after the prompt's; EOS after it when it
// has fewer). The canvas is the
// prompt as generate encodes it (BOS first where the model adds one), the answer, and the EOS token when the
// answer ended at one. The answer's positions are scored in GROUPS interleaved groups (position i in group i
// % GROUPS), each group masked at once while the rest of the canvas stays: the pseudo-likelihood that
// `tessera eval` reports as NLL(exact) (eval::pseudo_nll), here with every canvas of a batch packed into one
// forward. GROUPS >= the answer's length masks one token at a time. Each output line: {"prompt_tokens": n,
// "tokens": n, "nll": sum of -log p over the answer's tokens}, and "ids" (the answer's tokens) for a text.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "io/model_files.h"

using tessera::SeqInput;
using Seq = std::vector<int32_t>;

namespace {

struct Masked {  // one forward's canvas: its masked positions and their true tokens
  Seq canvas, pos, target;
  size_t answer;  // index of the answer it scores
};

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR GROUPS < answers.jsonl\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int groups = std::stoi(argv[2]);
  TESSERA_CHECK(groups >= 1, "GROUPS must be >= 1");
  auto engine = tessera::Engine::load(dir);
  const tessera::Tokenizer tok = tessera::load_model_tokenizer(dir);
  const int32_t bos = engine->config().bos_id, eos = engine->config().eos_id, mask = engine->mask_token();
  const bool add_bos = tessera::model_adds_bos(dir) && bos >= 0;

  std::vector<Masked> work;
  std::vector<size_t> prompt_len, answer_len;
  std::vector<Seq> answers;  // the tokens of the texts given as text
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    Seq full;
    if (add_bos) full.push_back(bos);
    const Seq p = tok.encode(j.at("prompt").get<std::string>(), false);
    full.insert(full.end(), p.begin(), p.end());
    Seq a;
    bool ends = j.value("eos", false);
    if (j.contains("answer_text")) {  // the prompt and the text encoded together, as one document
      const std::string text = j.at("answer_text").get<std::string>();
      const Seq both = tok.encode(j.at("prompt").get<std::string>() + text, false);
      if (both.size() >= p.size() && std::equal(p.begin(), p.end(), both.begin()))
        a.assign(both.begin() + static_cast<std::ptrdiff_t>(p.size()), both.end());
      else  // a token across the boundary: the text on its own
        a = tok.encode(text, false);
      const auto max_tokens = j.at("max_tokens").get<size_t>();
      ends = a.size() < max_tokens;  // the document ends inside the span: EOS after it, as in training
      a.resize(std::min(a.size(), max_tokens));
      answers.push_back(a);
    } else {
      a = j.at("answer").get<Seq>();
      answers.emplace_back();
    }
    const size_t from = full.size(), idx = prompt_len.size();
    prompt_len.push_back(from);
    answer_len.push_back(a.size());
    full.insert(full.end(), a.begin(), a.end());
    if (ends && eos >= 0) full.push_back(eos);
    for (int g = 0; g < groups && static_cast<size_t>(g) < a.size(); ++g) {
      Masked m{full, {}, {}, idx};
      for (size_t i = from + static_cast<size_t>(g); i < from + a.size(); i += static_cast<size_t>(groups)) {
        m.pos.push_back(static_cast<int32_t>(i));
        m.target.push_back(full[i]);
        m.canvas[i] = mask;
      }
      work.push_back(std::move(m));
    }
  }
  std::vector<double> nll(prompt_len.size(), 0.0);
  constexpr size_t kBatchTokens = 4096;  // canvas tokens packed into one forward
  for (size_t a = 0; a < work.size();) {
    std::vector<SeqInput> batch;
    size_t tokens = 0, n = 0, b = a;
    while (b < work.size() && (batch.empty() || tokens + work[b].canvas.size() <= kBatchTokens)) {
      batch.push_back({work[b].canvas, work[b].pos, work[b].target});
      tokens += work[b].canvas.size();
      n += work[b].pos.size();
      ++b;
    }
    std::vector<float> lp(n);
    engine->forward_logprob(batch, lp);
    size_t k = 0;
    for (size_t s = a; s < b; ++s)
      for (size_t i = 0; i < work[s].pos.size(); ++i) nll[work[s].answer] -= lp[k++];
    a = b;
  }
  for (size_t i = 0; i < nll.size(); ++i) {
    nlohmann::json o{{"prompt_tokens", prompt_len[i]}, {"tokens", answer_len[i]}, {"nll", nll[i]}};
    if (!answers[i].empty()) o["ids"] = answers[i];
    std::cout << o.dump() << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "decoding_sweep_nll: error: %s\n", e.what());
  return 1;
}
