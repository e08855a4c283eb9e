#include "models/model.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace tessera {

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, Backend& backend, Precision precision) {
  std::unique_ptr<Model> m(new Model());
  m->cfg_ = load_config(dir);
  m->ckpt_ = Checkpoint::open(dir);
  m->backend_ = &backend;
  const ModelConfig& c = m->cfg_;
  DType act = DType::BF16;
  if (precision == Precision::F32) {
    act = DType::F32;
  } else if (precision == Precision::Auto) {
    // The dtype most weights are stored in decides.
    size_t f32 = 0, other = 0;
    for (const auto& [name, t] : m->ckpt_.tensors()) (t.dtype == DType::F32 ? f32 : other) += t.bytes;
    act = f32 > other ? DType::F32 : DType::BF16;
  }
  m->opts_ = graph_options(c, act);
  switch (c.family) {
    case Family::LLaDA:
      bind_llada(*m);
      break;
    case Family::Dream:
      bind_dream(*m);
      break;
  }
  return m;
}

Model::~Model() {
  for (void* p : owned_) backend_->free_weights(p);
}

Tensor Model::bind(const std::string& name, std::vector<int64_t> shape, bool gemm_weight) {
  const StTensor& st = ckpt_.get(name, shape);
  // GEMM weights take the compute dtype; norm weights and embeddings keep theirs (read by
  // converting kernels), except f16, which only GEMMs of f16 would read.
  DType want = gemm_weight ? opts_.act : st.dtype;
  if (want == DType::F16) want = DType::F32;
  Tensor t;
  t.dtype = want;
  t.device = backend_->device();
  t.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  const size_t bytes = static_cast<size_t>(st.numel()) * dtype_size(want);
  weight_bytes_ += bytes;
  if (want == st.dtype && backend_->device() == Device::CPU) {
    t.data = const_cast<void*>(st.data);  // zero copy from the mmap
    return t;
  }
  void* dst = backend_->alloc_weights(bytes);
  owned_.push_back(dst);
  if (want == st.dtype) {
    backend_->copy_to_device(dst, st.data, bytes);
  } else {
    std::vector<float> f(static_cast<size_t>(st.numel()));
    convert_to_f32(st.data, st.dtype, f.data(), f.size());
    std::vector<char> conv(bytes);
    convert_from_f32(f.data(), conv.data(), want, f.size());
    backend_->copy_to_device(dst, conv.data(), bytes);
  }
  t.data = dst;
  return t;
}

Tensor Model::bind_bias(const std::string& name, int64_t n) {
  const StTensor& st = ckpt_.get(name, {n});
  std::vector<float> f(static_cast<size_t>(n));
  convert_to_f32(st.data, st.dtype, f.data(), f.size());
  void* dst = backend_->alloc_weights(f.size() * 4);
  owned_.push_back(dst);
  backend_->copy_to_device(dst, f.data(), f.size() * 4);
  weight_bytes_ += f.size() * 4;
  return Tensor(dst, DType::F32, {n}, backend_->device());
}

const graph::GraphTemplate& Model::graph(OutputMode mode) {
  auto& slot = graphs_[static_cast<int>(mode)];
  if (!slot) slot = std::make_unique<graph::GraphTemplate>(build_dense_graph(w_, opts_, mode));
  return *slot;
}

}  // namespace tessera

namespace tessera {

Tensor Model::random_weight(std::vector<int64_t> shape, DType dt, float scale, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
  void* dst = backend_->alloc_weights(bytes);
  owned_.push_back(dst);
  weight_bytes_ += bytes;
  // Fill in slices of at most 16M values so huge tensors need little host memory.
  const int64_t slice = int64_t{1} << 24;
  std::vector<float> f(static_cast<size_t>(std::min(n, slice)));
  std::vector<char> conv(f.size() * dtype_size(dt));
  for (int64_t at = 0; at < n; at += slice) {
    const int64_t m = std::min(slice, n - at);
    uint64_t s = rng_mix(seed + static_cast<uint64_t>(at));
    for (int64_t i = 0; i < m; ++i) {
      s = rng_mix(s);
      // Uniform in [-scale*sqrt(3), scale*sqrt(3)): standard deviation `scale`.
      f[static_cast<size_t>(i)] =
          (static_cast<float>(s >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale * 1.7320508f;
    }
    convert_from_f32(f.data(), conv.data(), dt, static_cast<size_t>(m));
    backend_->copy_to_device(static_cast<char*>(dst) + static_cast<size_t>(at) * dtype_size(dt), conv.data(),
                             static_cast<size_t>(m) * dtype_size(dt));
  }
  Tensor t;
  t.data = dst;
  t.dtype = dt;
  t.device = backend_->device();
  t.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

std::unique_ptr<Model> Model::synthetic(const ModelConfig& c, Backend& backend, DType act, uint64_t seed) {
  std::unique_ptr<Model> m(new Model());
  m->cfg_ = c;
  m->backend_ = &backend;
  m->opts_ = graph_options(c, act);
  const int64_t d = c.hidden, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, f = c.intermediate;
  const float sd = 1.0f / std::sqrt(static_cast<float>(d)), sf = 1.0f / std::sqrt(static_cast<float>(f));
  DenseWeights& w = m->w_;
  w.embed = m->random_weight({c.vocab, d}, act, 1.0f, seed);
  w.lm_head = m->random_weight({c.vocab, d}, act, sd, seed + 1);
  w.final_norm = m->random_weight({d}, act, 0.1f, seed + 2);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  uint64_t s = seed + 3;
  for (LayerWeights& L : w.layers) {
    L.attn_norm = m->random_weight({d}, act, 0.1f, s++);
    L.wq = m->random_weight({q, d}, act, sd, s++);
    L.wk = m->random_weight({kv, d}, act, sd, s++);
    L.wv = m->random_weight({kv, d}, act, sd, s++);
    if (c.qkv_bias) {
      L.bq = m->random_weight({q}, DType::F32, 0.1f, s++);
      L.bk = m->random_weight({kv}, DType::F32, 0.1f, s++);
      L.bv = m->random_weight({kv}, DType::F32, 0.1f, s++);
    }
    L.wo = m->random_weight({d, q}, act, sd, s++);
    L.ffn_norm = m->random_weight({d}, act, 0.1f, s++);
    L.w_gate = m->random_weight({f, d}, act, sd, s++);
    L.w_up = m->random_weight({f, d}, act, sd, s++);
    L.w_down = m->random_weight({d, f}, act, sf, s++);
  }
  return m;
}

}  // namespace tessera
