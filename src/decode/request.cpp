#include "decode/request.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

int64_t canvas_length(int64_t prompt_len, const GenerateOptions& o, bool block_causal) {
  const int64_t n = prompt_len + o.gen_length + static_cast<int64_t>(o.suffix.size());
  if (o.mode == DecodeMode::Uniform)  // whole canvases
    return prompt_len + (o.gen_length + o.block_length - 1) / o.block_length * o.block_length;
  if (!block_causal) return n;
  const int64_t bl = o.block_length;
  return (n + bl - 1) / bl * bl;
}

DesConfig des_config(const GenerateOptions& o) {
  DesConfig c;
  c.mode = o.des;
  c.k = o.des_k;
  c.beta = o.des_beta;
  c.all_rows = o.des_scope == DesScope::All;
  return c;
}

RequestPlan plan_request(const GenerateOptions& o, int64_t prompt_len, bool block_causal) {
  RequestPlan p;
  p.prompt_len = prompt_len;
  p.canvas = canvas_length(prompt_len, o, block_causal);
  p.attention_block = block_causal ? o.block_length : 0;
  p.logit_rows =
      block_causal || o.mode == DecodeMode::Uniform ? o.block_length : std::min(o.block_length, o.gen_length);
  p.uniform = o.mode == DecodeMode::Uniform;
  p.host_logits =
      o.cfg_scale > 0.0f || o.edit_penalty > 0.0f || o.constraint != nullptr ||
      (o.mode == DecodeMode::Spec && o.spec_sampling == SpecSampling::Rejection && o.temperature > 0.0f);
  p.logprobs = o.logprobs;
  // The KV cache (prefix / dual), the window's phase cache or the causal cache holds every canvas row.
  p.causal = o.causal();
  if (o.cache != KvCache::None || (o.window && o.window_refresh > 0) || p.causal) {
    p.kv_capacity = p.canvas;
    p.kv_streams = o.cfg_scale > 0.0f ? 2 : 1;
  }
  if (o.sparse) {
    p.sparse = true;
    p.sparse_config = SparseConfig{o.sparse_block, o.sparse_rho, prompt_len};
  }
  if (o.des != DesMode::Off || o.moe_stats) {
    p.des = true;
    p.des_config = des_config(o);
  }
  return p;
}

RequestScope::RequestScope(Denoiser& d, const RequestPlan& p) : d_(d), p_(p) {
  try {
    if (p.kv_capacity > 0) {
      TESSERA_CHECK(d.supports_kv_cache(),
                    "this denoiser has no KV cache; use cache none and window-refresh 0");
      d.kv_cache_reset(p.kv_capacity);
      kv_ = true;
      if (p.kv_streams > 1) {
        TESSERA_CHECK(d.supports_kv_streams(),
                      "this denoiser has no second KV cache for cfg's unconditional canvas; use cache none");
        d.kv_stream_reset(1, p.kv_capacity);
      }
    }
    if (p.des) {
      TESSERA_CHECK(d.supports_expert_sharing(),
                    p.des_config.mode != DesMode::Off
                        ? "expert sharing needs a mixture-of-experts model; use des off"
                        : "unique-expert counts need a mixture-of-experts model");
      d.des_begin(p.des_config);
      des_ = true;
    }
    if (p.attention_block > 0) d.set_attention_block(p.attention_block);
    if (p.uniform)
      TESSERA_CHECK(d.supports_uniform_canvas(),
                    "mode uniform needs a uniform-noise model (DiffusionGemma); this model decodes by masked "
                    "diffusion");
    if (p.causal && !p.uniform)
      TESSERA_CHECK(d.supports_causal(),
                    "mode ar, mode spec and causal-context diffusion need a tri-mode model "
                    "(Nemotron-Labs-Diffusion); this model decodes by diffusion only (mode diffusion)");
    if (p.sparse) {
      TESSERA_CHECK(d.supports_sparse_attention(), "this denoiser has no sparse attention; turn sparse off");
      d.sparse_begin(p.canvas, p.sparse_config);
      sparse_ = true;
    }
  } catch (...) {
    close();
    throw;
  }
}

RequestScope::~RequestScope() {
  close();
}

void RequestScope::close() noexcept {
  try {
    if (kv_) d_.kv_cache_end();
    if (p_.causal) {  // back to the model's own forwards, whatever step the request ended in
      d_.set_causal(false);
      if (d_.supports_draft_adapter()) d_.set_draft_adapter(false);
    }
    if (des_) d_.des_end();
    if (sparse_) d_.sparse_end();
  } catch (...) {  // (the ends free or flag state; none throws)
  }
  kv_ = des_ = sparse_ = false;
}

}  // namespace tessera
