// The fidelity harness: how much of the exact model's quality an engine option keeps.
//
// Infilling (one forward per batch of sequences): held-out sequences with a fixed random subset of
// positions masked at ratio r (position i of sequence s is masked when rng_uniform(seed, s, i) < r; at
// least one position per sequence); accuracy = argmax == the held-out token; NLL = mean of
// -log p(held-out token) over the masked positions. The unigram baseline predicts, everywhere, the
// most frequent token of the held-out set.
//
// Generation: prompts are the first prompt_len tokens of held-out sequences, the reference the next
// gen_length tokens (with suffix_len > 0 the tokens after those are a suffix: the generation infills). The
// exact path (the reference engine and options, usually full recompute in f32 or the model's dtype, no
// approximation) and a candidate (other options and/or another engine) generate from the same prompts and
// seeds; metrics per side: token agreement with the exact output, NLL of the generated text under the exact
// model (pseudo-likelihood: the generated positions are scored in `nll_groups` interleaved groups, each group
// masked at once while the others stay), and the task metric: token match with the held-out reference
// continuation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"
#include "io/tokenizer.h"

namespace tessera::eval {

using Seq = std::vector<int32_t>;

// Held-out text -> token sequences of exactly seq_len tokens, at most max_seqs. Documents: one JSON
// object per line with a "text" field (.jsonl), else plain text with documents separated by blank lines;
// each document is tokenized and cut into whole windows.
std::vector<Seq> load_heldout(const std::filesystem::path& text_file, const Tokenizer& tok, int64_t seq_len,
                              int64_t max_seqs);

// The most frequent token of the sequences (ties: lowest id).
int32_t unigram_token(const std::vector<Seq>& seqs);

struct InfillResult {
  double mask_ratio = 0;
  int64_t masked = 0;
  double accuracy = 0, nll = 0, unigram_accuracy = 0;
};
InfillResult infill(Engine& e, const std::vector<Seq>& seqs, double mask_ratio, uint64_t seed,
                    int32_t unigram, int64_t batch_tokens = 4096);

struct GenCase {
  Seq prompt, reference, suffix;  // suffix: the suffix_len held-out tokens after the reference (infilling)
};
std::vector<GenCase> generation_cases(const std::vector<Seq>& seqs, int64_t n, int64_t prompt_len,
                                      int64_t gen_length, int64_t suffix_len = 0);

struct GenSide {
  double agreement = 0;        // fraction of generated positions equal to the exact path's token
  double nll = 0;              // mean pseudo-NLL of the generated tokens under the exact model
  double reference_match = 0;  // fraction equal to the held-out continuation
  double seconds = 0;
  int64_t tokens = 0, steps = 0, forwards = 0;  // forwards: token editing runs some that change nothing
  double experts = 0, experts_block = 0;  // MoE models: mean unique experts per (MoE layer, forward), of
                                          // all rows and of the block's rows
};
// The generated tokens of every (case, seed) pair, case-major, with the time and steps they took.
struct Generations {
  std::vector<Seq> tokens;
  double seconds = 0;
  int64_t steps = 0, forwards = 0;
  MoeStats moe;  // summed over the generations (MoE models; generate_all counts them)
};
// use_suffix: every case's suffix follows its generation (infilling); false: continuation only.
Generations generate_all(Engine& e, const GenerateOptions& opt, const std::vector<GenCase>& cases,
                         const std::vector<uint64_t>& seeds, bool use_suffix = true);

// Scores `out` against the exact path's generations (agreement), the exact model (pseudo-NLL, between the
// prompt and the case's suffix when it has one, whether or not `out` saw it; a uniform-noise model: the
// causal NLL of its encoder, causal_nll) and the held-out
// continuations. Positions are compared over gen_length: a shorter output (stopped at EOS) counts its
// missing positions as disagreements.
GenSide score(Engine& exact, const Generations& out, const Generations& exact_out,
              const std::vector<GenCase>& cases, size_t n_seeds, int64_t gen_length, int nll_groups = 4);

// Pseudo-NLL (mean over positions [from, to), to < 0: the end) of `seq` under engine `e`; the positions
// after `to` stay as context.
double pseudo_nll(Engine& e, const Seq& seq, int64_t from, int groups, int64_t to = -1);

// A uniform-noise model's (DiffusionGemma's) NLL: mean -log p(seq[i] | seq[0..i)) over i in [from, to)
// (from >= 1) from one causal pass of its encoder (trained with an AR loss beside the denoising one).
double causal_nll(Engine& e, const Seq& seq, int64_t from, int64_t to);

}  // namespace tessera::eval
