// Shape-only model graphs: plan memory for a configuration without any weights; the weight layout
// shared with Model::synthetic; real geometries by name.
#include <cmath>

#include "core/error.h"
#include "models/model.h"

namespace tessera {

GraphOptions graph_options(const ModelConfig& c, DType act, Device device) {
  GraphOptions o;
  o.act = act;
  o.hidden = c.hidden;
  o.n_heads = c.n_heads;
  o.n_kv_heads = c.n_kv_heads;
  o.head_dim = c.head_dim;
  o.rotary_dim = c.rotary();
  o.intermediate = c.intermediate;
  o.vocab = c.vocab;
  o.eps = c.rms_eps;
  o.rope_theta = c.rope_theta;
  o.neox = !c.rope_interleaved;
  o.mask = c.causal ? MaskKind::Causal : c.mask_block > 0 ? MaskKind::BlockCausal : MaskKind::None;
  o.mask_block = static_cast<int>(c.mask_block);
  const MoeConfig& m = c.moe;
  o.route.score = m.score == RouterScore::Sigmoid ? MoeScore::Sigmoid : MoeScore::Softmax;
  o.route.top_k = static_cast<int>(std::max<int64_t>(m.top_k, 1));
  o.route.norm_topk = m.norm_topk;
  o.route.scale = m.routed_scale;
  o.route.n_group = static_cast<int>(m.n_group);
  o.route.topk_group = static_cast<int>(m.topk_group);
  o.stage_kv_bf16 = device == Device::CUDA && act == DType::BF16;
  return o;
}

DenseWeights layout_weights(const ModelConfig& c, DType act, const WeightMaker& make) {
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  auto sd = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  auto swiglu = [&](LayerWeights& L, int64_t f) {
    L.w_gate = make.tensor({f, d}, act, sd(d));
    L.w_up = make.tensor({f, d}, act, sd(d));
    L.w_down = make.tensor({d, f}, act, sd(f));
  };
  DenseWeights w;
  w.embed = make.tensor({c.vocab, d}, act, 1.0f);
  w.lm_head = make.tensor({c.vocab, d}, act, sd(d));
  w.final_norm = make.tensor({d}, act, 0.1f);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = make.tensor({d}, act, 0.1f);
    L.wq = make.tensor({q, d}, act, sd(d));
    L.wk = make.tensor({kv, d}, act, sd(d));
    L.wv = make.tensor({kv, d}, act, sd(d));
    if (c.qkv_bias) {
      L.bq = make.tensor({q}, DType::F32, 0.1f);
      L.bk = make.tensor({kv}, DType::F32, 0.1f);
      L.bv = make.tensor({kv}, DType::F32, 0.1f);
    }
    L.wo = make.tensor({d, q}, act, sd(q));
    if (c.qk_norm) {
      L.q_norm = make.tensor({c.head_dim}, act, 0.1f);
      L.k_norm = make.tensor({c.head_dim}, act, 0.1f);
    }
    L.ffn_norm = make.tensor({d}, act, 0.1f);
    if (!c.is_moe_layer(l)) {
      swiglu(L, c.intermediate);
      continue;
    }
    const MoeConfig& m = c.moe;
    L.router = make.tensor({m.n_experts, d}, act, sd(d));
    if (m.expert_bias) L.expert_bias = make.tensor({m.n_experts}, DType::F32, 0.01f);
    std::vector<Tensor> experts;
    for (int p = 0; p < 3; ++p) {
      for (int64_t e = 0; e < m.n_experts; ++e) {
        experts.push_back(p < 2 ? make.tensor({m.expert_inter, d}, act, sd(d))
                                : make.tensor({d, m.expert_inter}, act, sd(m.expert_inter)));
      }
    }
    L.experts = MoeExperts{make.table(experts), static_cast<int>(m.n_experts), d, m.expert_inter, act};
    if (m.shared_inter > 0) swiglu(L, m.shared_inter);
  }
  return w;
}

DenseWeights shape_only_weights(const ModelConfig& c, DType act) {
  WeightMaker make;
  make.tensor = [](const std::vector<int64_t>& shape, DType dt, float) {
    Tensor t(nullptr, dt, {});
    for (int64_t s : shape) t.shape[static_cast<size_t>(t.ndim++)] = s;
    return t;
  };
  make.table = [](const std::vector<Tensor>&) -> const void* const* { return nullptr; };
  return layout_weights(c, act, make);
}

}  // namespace tessera

namespace tessera {
namespace {

// LLaDA-MoE-7B-A1B (specs/models.md; rope_theta, eps and context [verify] against its config.json).
void llada_moe_7b(ModelConfig& c) {
  c.family = Family::LLaDAMoE;
  c.model_type = "lladamoe";
  c.hidden = 2048;
  c.n_layers = 16;
  c.n_heads = c.n_kv_heads = 16;
  c.vocab = 157184;
  c.max_positions = 8192;
  c.rope_theta = 50000.0f;
  c.rms_eps = 1e-5f;
  c.qk_norm = true;
  c.moe.n_experts = 64;
  c.moe.top_k = 8;
  c.moe.expert_inter = 1024;
  c.moe.moe_layer.assign(16, 1);
  c.mask_id = 156895;
  c.eos_id = 156892;
}

// LLaDA2.0-mini (specs/models.md; the dimensions agree with its config.json as quoted in public loader
// tests, see io/config.cpp read_llada2): layer 0 dense, then 256 routed experts (sigmoid + expert bias,
// 8 groups / top-4, renormalised, x2.5) plus one shared expert, partial rotary 0.5, block-causal
// attention with blocks of 32 (the generation's default block length).
void llada2_mini(ModelConfig& c) {
  c.family = Family::LLaDA2;
  c.model_type = "llada2_moe";
  c.hidden = 2048;
  c.n_layers = 20;
  c.n_heads = 16;
  c.n_kv_heads = 4;
  c.intermediate = 5120;
  c.vocab = 157184;
  c.max_positions = 32768;
  c.rope_theta = 600000.0f;
  c.rms_eps = 1e-6f;
  c.qk_norm = true;
  c.rotary_dim = 64;
  c.mask_block = 32;
  MoeConfig& m = c.moe;
  m.n_experts = 256;
  m.top_k = 8;
  m.expert_inter = 512;
  m.n_shared = 1;
  m.shared_inter = 512;
  m.score = RouterScore::Sigmoid;
  m.expert_bias = true;
  m.norm_topk = true;
  m.routed_scale = 2.5f;
  m.n_group = 8;
  m.topk_group = 4;
  m.moe_layer.assign(20, 1);
  m.moe_layer[0] = 0;  // first_k_dense_replace 1
  c.mask_id = 156895;
  c.eos_id = 156892;
}

}  // namespace

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
  } else if (name == "llada-moe-7b" || name == "llada-moe-mid") {
    llada_moe_7b(c);
  } else if (name == "llada2-mini" || name == "llada2-mid") {
    llada2_mini(c);
  } else {
    fail("unknown geometry '" + name +
         "' (known: llada-8b, llada-mid, dream-7b, llada-moe-7b, llada-moe-mid, llada2-mini, llada2-mid)");
  }
  if (name == "llada-moe-mid" || name == "llada2-mid") {  // the real layers, 4 of them (LLaDA2: 1 dense)
    c.n_layers = 4;
    c.moe.moe_layer.resize(4);
  }
  c.head_dim = c.hidden / c.n_heads;
  return c;
}

}  // namespace tessera
