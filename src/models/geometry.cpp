// Shape-only model graphs: plan memory for a configuration without any weights; the weight layout
// shared with Model::synthetic. (Real geometries by name: each family's file, models/registry.cpp.)
#include <cmath>

#include "core/error.h"
#include "models/model.h"
#include "models/registry.h"

namespace tessera {

RopeParams rope_params(const ModelConfig& c) {
  RopeParams p;
  p.rotary_dim = static_cast<int>(c.rotary());
  p.theta = c.rope_theta;
  p.neox = !c.rope_interleaved;
  const ModelConfig::RopeScaling& y = c.rope_scaling;
  if (y.factor > 0.0f) {
    // find_correction_dim: the pair index whose wavelength turns `rot` times over the original context.
    const double dim = p.rotary_dim, base = c.rope_theta, orig = static_cast<double>(y.original_max);
    auto correction = [&](double rot) {
      return dim * std::log(orig / (rot * 2.0 * M_PI)) / (2.0 * std::log(base));
    };
    double lo = correction(y.beta_fast), hi = correction(y.beta_slow);
    if (y.truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    p.yarn_factor = y.factor;
    p.ramp_lo = static_cast<float>(std::max(lo, 0.0));
    p.ramp_hi = static_cast<float>(std::min(hi, dim - 1.0));
    p.attn_factor = y.attn_factor;
  }
  if (y.llama4_beta > 0.0f) {
    p.pos_beta = y.llama4_beta;
    p.pos_orig = static_cast<int>(y.original_max);
  }
  return p;
}

namespace {
GraphOptions options_for(const ModelConfig& c, DType act, bool stage_kv, Device dev) {
  GraphOptions o;
  o.act = act;
  o.hidden = c.hidden;
  o.n_heads = c.n_heads;
  o.n_kv_heads = c.n_kv_heads;
  o.head_dim = c.head_dim;
  o.rope = rope_params(c);
  o.intermediate = c.intermediate;
  o.vocab = c.vocab;
  o.eps = c.rms_eps;
  o.mask = c.causal ? MaskKind::Causal : c.mask_block > 0 ? MaskKind::BlockCausal : MaskKind::None;
  o.mask_block = static_cast<int>(c.mask_block);
  const MoeConfig& m = c.moe;
  o.route.score = m.score == RouterScore::Sigmoid ? MoeScore::Sigmoid : MoeScore::Softmax;
  o.route.top_k = static_cast<int>(std::max<int64_t>(m.top_k, 1));
  o.route.norm_topk = m.norm_topk;
  o.route.scale = m.routed_scale;
  o.route.n_group = static_cast<int>(m.n_group);
  o.route.topk_group = static_cast<int>(m.topk_group);
  o.stage_kv_bf16 = stage_kv;
  o.attn_q_scratch = stage_kv && dev == Device::CUDA;
  return o;
}
}  // namespace

GraphOptions graph_options(const ModelConfig& c, DType act, const Backend* backend) {
  if (backend == nullptr) return options_for(c, act, false, Device::CPU);
  return options_for(c, act, backend->stages_attention_kv(act), backend->device());
}

GraphOptions graph_options(const ModelConfig& c, DType act, Device dev) {
  return options_for(c, act, default_stages_attention_kv(dev, act), dev);
}

DenseWeights layout_weights(const ModelConfig& c, DType act, const WeightMaker& make) {
  if (const FamilyInfo& f = family_info(c.family); f.layout != nullptr) return f.layout(c, act, make);
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
    const auto& expert = make.expert ? make.expert : make.tensor;
    for (int p = 0; p < 3; ++p) {
      for (int64_t e = 0; e < m.n_experts; ++e) {
        experts.push_back(p < 2 ? expert({m.expert_inter, d}, act, sd(d))
                                : expert({d, m.expert_inter}, act, sd(m.expert_inter)));
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
