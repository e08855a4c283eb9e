#pragma once
#include "backend/backend.h"
#include "core/tensor.h"

namespace tessera {
void cpu_sample_rows(const Tensor& logits, const Tensor& row_keys, const SampleParams& p, Tensor& token,
                     Tensor& conf);
void cpu_token_logprob(const Tensor& logits, const Tensor& target, Tensor& logprob);
void cpu_top_logprobs(const Tensor& logits, const Tensor& token, Tensor& chosen, Tensor& ids, Tensor& lp);
}  // namespace tessera
