#include "models/model.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/gguf_model.h"
#include "models/registry.h"

namespace tessera {

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, Backend& backend, Precision precision,
                                   bool dequantize, const ShardPlan& shard) {
  std::unique_ptr<Model> m(new Model());
  if (is_gguf_file(dir)) {
    // One parse. Quantized tensors stay quantized on the CPU (GEMMs dequantize panels of them) and, for
    // the types of cuda_keeps_quantized, on CUDA (GEMMs dequantize tiles; bind_quantized converts the
    // others); with `dequantize` they are converted at load to bf16 (f32 for --precision f32).
    const auto g = GgufFile::open(dir);
    m->cfg_ = gguf_config(*g);
    m->ckpt_ =
        gguf_checkpoint(g, m->cfg_, precision == Precision::F32 ? DType::F32 : DType::BF16,
                        !dequantize && (backend.device() == Device::CPU || backend.device() == Device::CUDA));
  } else {
    m->cfg_ = load_config(dir);
    m->ckpt_ = Checkpoint::open(dir);
    if (m->cfg_.draft_adapter.rank > 0) {  // its tensors join the checkpoint's (PEFT names: no clash)
      auto adapter = std::make_shared<Checkpoint>(Checkpoint::open(dir / m->cfg_.draft_adapter.dir));
      for (const auto& [name, t] : adapter->tensors()) m->ckpt_.add(t);
      m->ckpt_.keep(adapter);
    }
  }
  m->backend_ = &backend;
  const ModelConfig& c = m->cfg_;
  DType act = DType::BF16;
  if (precision == Precision::F32) {
    act = DType::F32;
  } else if (precision == Precision::Auto) {
    size_t f32 = 0, other = 0;
    for (const auto& [name, t] : m->ckpt_.tensors()) {
      if (t.quant >= 0)
        other += static_cast<size_t>(t.numel()) * 2;  // counted as the bf16 it computes as
      else
        (t.dtype == DType::F32 ? f32 : other) += t.bytes;
    }
    act = auto_compute_dtype(f32, other);
  }
  // A layer count beyond the checkpoint's layers fails here, before per-layer tables are sized by it
  // (a corrupt config of 10^9 layers would otherwise allocate for them).
  int64_t last_layer = -1, l = 0;
  std::string rest;
  for (const auto& [name, t] : m->ckpt_.tensors()) {
    for (const char* stem :
         {"model.layers.", "model.transformer.blocks.", "encoder.layers.", "model.decoder.layers."}) {
      if (split_layer(name, stem, l, rest)) last_layer = std::max(last_layer, l);
    }
  }
  if (c.n_layers - 1 > last_layer) {
    fail(dir.string() + ": the configuration (block_count, num_hidden_layers or n_layers) gives " +
         std::to_string(c.n_layers) + " layers but the checkpoint " +
         (last_layer < 0 ? std::string("has no layer tensors")
                         : "has tensors of layers 0.." + std::to_string(last_layer) + " only"));
  }
  m->opts_ = graph_options(c, act, &backend);
  const auto i = static_cast<size_t>(c.family);  // the family's weight loader (models/registry.h)
  if (i >= families().size() || families()[i]->bind == nullptr)
    fail(std::string("no weight loader for the ") + family_name(c.family) + " family");
  m->begin_shard(shard);  // a layout the model cannot take fails here, before any weight is read
  families()[i]->bind(*m);
  if (shard.world() > 1) m->finish_shard();
  m->weight_bytes_ += m->quant_tile_bytes_;  // the GPU backend's tile of quantized GEMM weights
  if (m->quant_tile_bytes_ > 0) backend.reserve_quant_tile(m->quant_tile_bytes_);
  m->peak_weight_bytes_ = std::max(m->peak_weight_bytes_, m->weight_bytes_);
  return m;
}

Model::~Model() {
  for (void* p : owned_) backend_->free_weights(p);
}

Tensor Model::bind(const std::string& name, std::vector<int64_t> shape, bool gemm_weight) {
  TESSERA_CHECK(!shape.empty(), "bind: empty shape for " + name);
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return bind_rows(name, shape[0], cols, 0, shape[0], gemm_weight, shape);
}

Tensor Model::bind_rows(const std::string& name, int64_t total_rows, int64_t cols, int64_t row0, int64_t rows,
                        bool gemm_weight) {
  return bind_rows(name, total_rows, cols, row0, rows, gemm_weight, {total_rows, cols});
}

Tensor Model::bind_scaled(const std::string& name, std::vector<int64_t> shape, float scale) {
  TESSERA_CHECK(shape.size() == 2, "bind_scaled: a 2-D weight expected for " + name);
  return bind_rows(name, shape[0], shape[1], 0, shape[0], true, shape, scale);
}

Tensor Model::bind_rows(const std::string& name, int64_t total_rows, int64_t cols, int64_t row0, int64_t rows,
                        bool gemm_weight, const std::vector<int64_t>& file_shape, float scale) {
  TESSERA_CHECK(
      row0 >= 0 && rows > 0 && row0 + rows <= total_rows,
      "bind: rows [" + std::to_string(row0) + ", " + std::to_string(row0 + rows) + ") outside " + name);
  const StTensor& st = ckpt_.get(name, file_shape);
  TESSERA_CHECK(st.quant < 0 || scale == 1.0f, "bind: a scaled quantized weight (" + name + ")");
  if (st.quant >= 0) return bind_quantized(st, cols, row0, rows, gemm_weight, file_shape);
  const size_t numel = static_cast<size_t>(rows * cols);
  const size_t src_off = static_cast<size_t>(row0 * cols) * dtype_size(st.dtype);
  const void* src = static_cast<const char*>(st.data) + src_off;
  // GEMM weights take the compute dtype; norm weights and embeddings keep theirs (read by
  // converting kernels), except f16, which only GEMMs of f16 would read.
  DType want = gemm_weight ? opts_.act : st.dtype;
  if (want == DType::F16) want = DType::F32;
  Tensor t;
  t.dtype = want;
  t.device = backend_->device();
  t.ndim = static_cast<int>(file_shape.size());
  for (size_t i = 0; i < file_shape.size(); ++i) t.shape[i] = file_shape[i];
  t.shape[0] = rows;
  const size_t bytes = numel * dtype_size(want);
  weight_bytes_ += bytes;
  if (want == st.dtype && backend_->device() == Device::CPU && scale == 1.0f) {
    t.data = const_cast<void*>(src);  // zero copy from the mmap
    return t;
  }
  void* dst = backend_->alloc_weights(bytes);
  owned_.push_back(dst);
  if (want == st.dtype && scale == 1.0f) {
    backend_->copy_to_device(dst, src, bytes);
  } else {
    std::vector<float> f(numel);
    convert_to_f32(src, st.dtype, f.data(), f.size());
    if (scale != 1.0f)
      for (float& v : f) v *= scale;
    std::vector<char> conv(bytes);
    convert_from_f32(f.data(), conv.data(), want, f.size());
    backend_->copy_to_device(dst, conv.data(), bytes);
  }
  t.data = dst;
  return t;
}

Tensor Model::bind_quantized(const StTensor& st, int64_t cols, int64_t row0, int64_t rows, bool gemm_weight,
                             const std::vector<int64_t>& file_shape) {
  const auto type = static_cast<GgmlType>(st.quant);
  const size_t row_bytes = ggml_bytes(type, cols);
  const void* src = static_cast<const char*>(st.data) + static_cast<size_t>(row0) * row_bytes;
  Tensor t;
  t.device = backend_->device();
  t.ndim = static_cast<int>(file_shape.size());
  for (size_t i = 0; i < file_shape.size(); ++i) t.shape[i] = file_shape[i];
  t.shape[0] = rows;
  // GEMM weights and embedding tables (2-D) stay in their blocks on the CPU: zero copy from the mmap.
  if (backend_->device() == Device::CPU && (gemm_weight || file_shape.size() == 2)) {
    t.dtype = gemm_weight ? opts_.act : DType::F32;
    t.quant = st.quant;
    t.data = const_cast<void*>(src);
    weight_bytes_ += static_cast<size_t>(rows) * row_bytes;
    return t;
  }
  // On CUDA the types it computes quantized stay in their blocks too (copied to the device; GEMMs
  // dequantize tiles of rows into one tile buffer, counted once in weight_bytes()), except the MoE
  // experts, which moe_ffn reads converted.
  if (backend_->device() == Device::CUDA && cuda_keeps_quantized(st.quant) && !binding_experts_ &&
      (gemm_weight || file_shape.size() == 2)) {
    t.dtype = gemm_weight ? opts_.act : DType::F32;
    t.quant = st.quant;
    const size_t bytes = static_cast<size_t>(rows) * row_bytes;
    t.data = backend_->alloc_weights(bytes);
    owned_.push_back(t.data);
    backend_->copy_to_device(t.data, src, bytes);
    weight_bytes_ += bytes;
    if (gemm_weight) quant_tile_bytes_ = std::max(quant_tile_bytes_, quant_tile_bytes(rows, cols, t.dtype));
    return t;
  }
  // Otherwise converted to the compute dtype (GEMM weights; on CUDA every tensor, as before it kept any
  // quantized) or f32, then copied to the backend.
  t.dtype = gemm_weight || backend_->device() == Device::CUDA ? opts_.act : DType::F32;
  const size_t out_row = static_cast<size_t>(cols) * dtype_size(t.dtype);
  std::vector<char> conv(static_cast<size_t>(rows) * out_row);
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r)  // a type ggml_dequantize_row converts (checked at load): no throw
    ggml_dequantize_row(type, static_cast<const char*>(src) + static_cast<size_t>(r) * row_bytes, cols,
                        t.dtype, conv.data() + static_cast<size_t>(r) * out_row);
  t.data = backend_->alloc_weights(conv.size());
  owned_.push_back(t.data);
  backend_->copy_to_device(t.data, conv.data(), conv.size());
  weight_bytes_ += conv.size();
  return t;
}

Tensor Model::bind_bias(const std::string& name, int64_t n) {
  return bind_bias_slice(name, n, 0, n);
}

float Model::scalar(const std::string& name) {
  const StTensor& st = ckpt_.get(name, {1});
  TESSERA_CHECK(st.quant < 0, "bind: a quantized scalar (" + name + ")");
  float v = 0.0f;
  convert_to_f32(st.data, st.dtype, &v, 1);
  return v;
}

bool Model::has_tensor(const std::string& name) const {
  return ckpt_.tensors().count(name) > 0;
}

Tensor Model::bind_bias_slice(const std::string& name, int64_t total, int64_t at, int64_t n) {
  TESSERA_CHECK(at >= 0 && n > 0 && at + n <= total, "bind: bias slice outside " + name);
  const StTensor& st = ckpt_.get(name, {total});
  std::vector<float> f(static_cast<size_t>(n));
  if (st.quant >= 0) {  // a quantized bias (no converter writes one): the whole row, then the slice
    std::vector<float> all(static_cast<size_t>(total));
    ggml_dequantize(static_cast<GgmlType>(st.quant), st.data, all.data(), total);
    std::copy_n(all.begin() + at, n, f.begin());
  } else {
    convert_to_f32(static_cast<const char*>(st.data) + static_cast<size_t>(at) * dtype_size(st.dtype),
                   st.dtype, f.data(), f.size());
  }
  void* dst = backend_->alloc_weights(f.size() * 4);
  owned_.push_back(dst);
  backend_->copy_to_device(dst, f.data(), f.size() * 4);
  weight_bytes_ += f.size() * 4;
  return Tensor(dst, DType::F32, {n}, backend_->device());
}

MoeExperts Model::bind_experts(const std::function<std::string(int64_t, const char*)>& name,
                               int64_t n_experts, int64_t inter) {
  const int64_t d = cfg_.hidden;
  std::vector<Tensor> t;
  t.reserve(static_cast<size_t>(3 * n_experts));
  // A sharded load binds only this rank's experts (the others' entries stay null: never read here).
  const auto [lo, hi] = shard_.experts(n_experts);
  binding_experts_ = true;  // CUDA's moe_ffn reads plain experts: quantized ones are converted at load
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
    const bool down = proj[0] == 'd';
    for (int64_t e = 0; e < n_experts; ++e)
      t.push_back(e < lo || e >= hi
                      ? Tensor()
                      : bind(name(e, proj), down ? std::vector{d, inter} : std::vector{inter, d}, true));
  }
  binding_experts_ = false;
  MoeExperts ex{expert_table(t), static_cast<int>(n_experts), d, inter, opts_.act};
  for (size_t p = 0; p < 3; ++p) {  // one storage type per projection (GGUF stacks one tensor of each)
    const size_t first = p * static_cast<size_t>(n_experts);
    ex.quant[p] = t[first + static_cast<size_t>(lo)].quant;
    for (int64_t e = lo + 1; e < hi; ++e) {
      TESSERA_CHECK(t[first + static_cast<size_t>(e)].quant == ex.quant[p],
                    "bind: the experts of " +
                        name(e, p == 0   ? "gate_proj"
                                : p == 1 ? "up_proj"
                                         : "down_proj") +
                        " mix storage types");
    }
  }
  return ex;
}

const void* const* Model::expert_table(const std::vector<Tensor>& gate_up_down) {
  std::vector<const void*> host(gate_up_down.size());
  for (size_t i = 0; i < host.size(); ++i) host[i] = gate_up_down[i].data;
  const size_t bytes = host.size() * sizeof(void*);
  void* dst = backend_->alloc_weights(bytes);
  owned_.push_back(dst);
  backend_->copy_to_device(dst, host.data(), bytes);
  return static_cast<const void* const*>(dst);
}

void Model::set_mask_block(int64_t block) {
  TESSERA_CHECK(opts_.mask == MaskKind::BlockCausal,
                std::string("the ") + family_name(cfg_.family) + " model has no block-causal attention mask");
  TESSERA_CHECK(block > 0 && block <= cfg_.max_positions, "attention block " + std::to_string(block) +
                                                              " must be in [1, " +
                                                              std::to_string(cfg_.max_positions) + "]");
  if (block == cfg_.mask_block) return;
  cfg_.mask_block = block;
  opts_.mask_block = static_cast<int>(block);
  for (auto& g : graphs_) g.reset();
}

const graph::GraphTemplate& Model::graph(OutputMode mode, bool kv_cache, bool causal, bool draft) {
  TESSERA_CHECK(!draft || cfg_.draft_adapter.rank > 0, "this model has no draft adapter");
  auto& slot = graphs_[static_cast<int>(mode) +
                       kOutputModes * ((kv_cache ? 1 : 0) + (causal ? 2 : 0) + (draft ? 4 : 0))];
  if (!slot) {
    GraphOptions o = opts_;
    o.kv_cache = kv_cache;
    o.draft_adapter = draft;
    if (causal) {
      o.mask = MaskKind::Causal;
      o.mask_block = 0;
    }
    slot = std::make_unique<graph::GraphTemplate>(build_model_graph(cfg_, w_, o, mode));
  }
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
    const uint64_t base = rng_mix(seed + static_cast<uint64_t>(at));
    // Counter-based (splitmix64 of base + i): values independent of the threads (a 8B model fills in
    // seconds on a many-core host).
#pragma omp parallel for schedule(static) if (m > 65536)
    for (int64_t i = 0; i < m; ++i) {
      const uint64_t s = rng_mix(base + static_cast<uint64_t>(i));
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

Tensor Model::random_quant_weight(int64_t rows, int64_t cols, DType dt, int16_t quant, float scale,
                                  uint64_t seed) {
  const auto type = static_cast<GgmlType>(quant);
  const GgmlTypeInfo* info = ggml_type_info(type);
  const size_t row_bytes = ggml_bytes(type, cols);
  // Offsets of the f16 scales in a block and the scale giving values of standard deviation `scale`:
  // q8_0 q * d (q uniform in [-128, 128): sd 74); q4_0 (q - 8) * d (sd 4.6); the k-quants
  // (d * sc) * q - dmin * m with 6-bit sc, m (mean 31) and q of 4 / 5 bits (sd 4.6 / 9.2); q6_K
  // (d * sc) * (q - 32) with int8 sc (mean |sc| 64) and q of 6 bits (sd 18.5).
  std::vector<size_t> at{0};
  float unit = 74.0f;
  switch (type) {
    case GgmlType::Q8_0:
      break;
    case GgmlType::Q4_0:
      unit = 4.6f;
      break;
    case GgmlType::Q4_K:
      at = {0, 2};
      unit = 31.0f * 4.6f;
      break;
    case GgmlType::Q5_K:
      at = {0, 2};
      unit = 31.0f * 9.2f;
      break;
    case GgmlType::Q6_K:
      at = {208};
      unit = 64.0f * 18.5f;
      break;
    default:
      fail(std::string("synthetic weights: no random blocks of type ") + (info ? info->name : "?") +
           " (q8_0, q4_0, q4_K, q5_K, q6_K)");
  }
  const uint16_t d = f32_to_f16(scale / unit);
  const size_t bytes = static_cast<size_t>(rows) * row_bytes;
  void* dst = backend_->alloc_weights(bytes);
  owned_.push_back(dst);
  weight_bytes_ += bytes;
  const int64_t slice = std::max<int64_t>(1, int64_t{64 << 20} / static_cast<int64_t>(row_bytes));
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(rows, slice)) * row_bytes);
  for (int64_t r0 = 0; r0 < rows; r0 += slice) {
    const int64_t n = std::min(slice, rows - r0);
    const size_t nb = static_cast<size_t>(n) * row_bytes;
    const uint64_t base = rng_mix(seed + static_cast<uint64_t>(r0));
#pragma omp parallel for schedule(static) if (nb > 524288)
    for (int64_t w = 0; w < static_cast<int64_t>((nb + 7) / 8); ++w) {
      const uint64_t s = rng_mix(base + static_cast<uint64_t>(w));
      const auto i = static_cast<size_t>(w) * 8;
      std::memcpy(buf.data() + i, &s, std::min<size_t>(8, nb - i));
    }
    for (size_t b = 0; b < nb; b += info->block_bytes) {
      for (size_t o : at) {
        buf[b + o] = static_cast<uint8_t>(d & 0xff);
        buf[b + o + 1] = static_cast<uint8_t>(d >> 8);
      }
    }
    backend_->copy_to_device(static_cast<char*>(dst) + static_cast<size_t>(r0) * row_bytes, buf.data(), nb);
  }
  backend_->synchronize();  // the host slice is reused
  if (backend_->device() == Device::CUDA)
    quant_tile_bytes_ = std::max(quant_tile_bytes_, quant_tile_bytes(rows, cols, dt));
  Tensor t(dst, dt, {rows, cols}, backend_->device());
  t.quant = quant;
  return t;
}

std::unique_ptr<Model> Model::synthetic(const ModelConfig& c, Backend& backend, DType act, uint64_t seed,
                                        int16_t quant) {
  std::unique_ptr<Model> m(new Model());
  m->cfg_ = c;
  m->backend_ = &backend;
  m->opts_ = graph_options(c, act, &backend);
  Model* mp = m.get();
  WeightMaker make;
  make.tensor = [mp, &seed](const std::vector<int64_t>& shape, DType dt, float sd) {
    return mp->random_weight(shape, dt, sd, seed++);
  };
  make.table = [mp](const std::vector<Tensor>& t) { return mp->expert_table(t); };
  if (quant >= 0) {
    TESSERA_CHECK(backend.device() == Device::CPU || cuda_keeps_quantized(quant),
                  "synthetic weights: the CUDA backend keeps q8_0, q4_0, q4_K, q5_K and q6_K quantized");
    make.expert = make.tensor;
    make.tensor = [mp, &seed, act, quant](const std::vector<int64_t>& shape, DType dt, float sd) {
      const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(quant));
      if (shape.size() == 2 && dt == act && info != nullptr && shape[1] % info->block == 0)
        return mp->random_quant_weight(shape[0], shape[1], dt, quant, sd, seed++);
      return mp->random_weight(shape, dt, sd, seed++);
    };
  }
  m->w_ = layout_weights(c, act, make);
  m->weight_bytes_ += m->quant_tile_bytes_;
  m->peak_weight_bytes_ = m->weight_bytes_;
  if (m->quant_tile_bytes_ > 0) backend.reserve_quant_tile(m->quant_tile_bytes_);
  return m;
}

}  // namespace tessera
