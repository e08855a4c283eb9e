// Shape-only model graphs: plan memory for a configuration without any weights.
#include "core/error.h"
#include "models/model.h"

namespace tessera {

GraphOptions graph_options(const ModelConfig& c, DType act) {
  GraphOptions o;
  o.act = act;
  o.hidden = c.hidden;
  o.n_heads = c.n_heads;
  o.n_kv_heads = c.n_kv_heads;
  o.head_dim = c.head_dim;
  o.intermediate = c.intermediate;
  o.vocab = c.vocab;
  o.eps = c.rms_eps;
  o.rope_theta = c.rope_theta;
  o.neox = !c.rope_interleaved;
  o.mask = c.causal ? MaskKind::Causal : MaskKind::None;
  return o;
}

DenseWeights shape_only_weights(const ModelConfig& c, DType act) {
  auto t = [](DType dt, std::initializer_list<int64_t> s) { return Tensor(nullptr, dt, s); };
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  DenseWeights w;
  w.embed = t(act, {c.vocab, d});
  w.final_norm = t(act, {d});
  w.lm_head = t(act, {c.vocab, d});
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (auto& L : w.layers) {
    L.attn_norm = t(act, {d});
    L.wq = t(act, {q, d});
    L.wk = t(act, {kv, d});
    L.wv = t(act, {kv, d});
    L.wo = t(act, {d, q});
    L.ffn_norm = t(act, {d});
    L.w_gate = t(act, {c.intermediate, d});
    L.w_up = t(act, {c.intermediate, d});
    L.w_down = t(act, {d, c.intermediate});
  }
  return w;
}

}  // namespace tessera

namespace tessera {

ModelConfig named_geometry(const std::string& name) {
  ModelConfig c;
  if (name == "llada-8b" || name == "llada-mid") {
    c.family = Family::LLaDA;
    c.model_type = "llada";
    c.hidden = 4096;
    c.n_layers = 32;
    c.n_heads = c.n_kv_heads = 32;
    c.intermediate = 12288;
    c.vocab = 126464;
    c.max_positions = 1 << 20;
    c.rope_theta = 500000.0f;
    c.rms_eps = 1e-5f;
    c.mask_id = 126336;
    c.eos_id = 126081;
    if (name == "llada-mid") {  // the LLaDA block at 1/4 width and 4 layers, real vocabulary
      c.hidden = 1024;
      c.n_layers = 4;
      c.n_heads = c.n_kv_heads = 8;
      c.intermediate = 3072;
    }
  } else if (name == "dream-7b") {
    c.family = Family::Dream;
    c.model_type = "Dream";
    c.hidden = 3584;
    c.n_layers = 28;
    c.n_heads = 28;
    c.n_kv_heads = 4;
    c.intermediate = 18944;
    c.vocab = 152064;
    c.max_positions = 1 << 20;
    c.rope_theta = 1e6f;
    c.rms_eps = 1e-6f;
    c.qkv_bias = true;
    c.logit_shift = true;
    c.mask_id = 151666;
    c.eos_id = 151643;
  } else {
    fail("unknown geometry '" + name + "' (known: llada-8b, llada-mid, dream-7b)");
  }
  c.head_dim = c.hidden / c.n_heads;
  return c;
}

}  // namespace tessera
