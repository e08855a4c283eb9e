// The LM head split by vocabulary over the tensor-parallel ranks (Megatron's vocab-parallel head): each
// rank computes the logits of its rows [lo, lo + n) of the vocabulary (models/tensor_parallel.cpp), and
// the ops that read logits combine per-row summaries over the ranks instead of the logits themselves.
// Every rank gets the single-device result (backend.h's sample_rows, token_logprob, top_logprobs; the CPU
// sampler's semantics, up to the order of f64 sums):
//   - max, argmax (ties to the lower id: the ranks' slices ascend), runner-up and the normaliser, summed
//     after rescaling to the global max: greedy tokens, Prob and Margin confidence;
//   - the Gumbel-max draw: each rank's winner under the counter RNG keyed by the global id;
//   - Dream's inverse-CDF draw: the ranks' masses in vocabulary order locate the rank whose slice holds
//     the target, which finds the token (a second round sends it, with the entropy's partial sums);
//   - Dream's top_p / top_k cuts: the largest logit whose kept mass exceeds top_p (or count reaches k),
//     found by bisection over the f32 values, each round summing one number per row over the ranks;
//   - log-probabilities: max and normaliser, the target's logit from its owner, the ranks' top-K merged.
// Bytes per row and round are a few dozen (the top log-probabilities: 8 per candidate), never V.
#pragma once
#include "backend/backend.h"
#include "dist/communicator.h"
#include "models/model.h"

namespace tessera {

// sample_rows over a split vocabulary: logits [R, s.n] are this rank's columns; row_keys, token and conf
// as sample_rows (tokens are global ids). Every rank calls it with the same rows and parameters.
void split_sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p,
                       const VocabShare& s, dist::Communicator& comm, Tensor& token, Tensor& conf);
// token_logprob over a split vocabulary (target: global ids).
void split_token_logprob(const Tensor& logits, const Tensor& target, const VocabShare& s,
                         dist::Communicator& comm, Tensor& logprob);
// top_logprobs over a split vocabulary (token and ids: global ids).
void split_top_logprobs(const Tensor& logits, const Tensor& token, const VocabShare& s,
                        dist::Communicator& comm, Tensor& chosen, Tensor& ids, Tensor& lp);
// full [R, s.vocab] = the ranks' columns side by side (the logits a caller asked for whole).
void gather_vocab(const Tensor& local, const VocabShare& s, dist::Communicator& comm, Tensor& full);

}  // namespace tessera
