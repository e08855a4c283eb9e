// A loaded model: config, weights bound by tensor name in backend memory, and the family's graph
// template. The model never sees "diffusion": it maps (tokens, positions) to logits of chosen rows.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "graph/graph.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace tessera {

// Compute precision: activations entering GEMMs (and GEMM weights) are in this dtype. Auto = the
// checkpoint's weight dtype (bf16 stays bf16 in memory; f32 checkpoints compute in f32).
enum class Precision { Auto, BF16, F32 };

// What the graph returns for the logit rows.
enum class OutputMode {
  Sample,   // outputs "token" [n_logits] i32 and "conf" [n_logits] f32 (logits never leave the device)
  Logits,   // output "logits" [n_logits, vocab] f32
  LogProb,  // input "target" [n_logits]; output "logprob" [n_logits] f32
};

struct LayerWeights {
  Tensor attn_norm, wq, wk, wv, bq, bk, bv, wo;
  Tensor ffn_norm, w_gate, w_up, w_down;
};

struct DenseWeights {
  Tensor embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
};

// Everything the shared graph builder needs besides the weights.
struct GraphOptions {
  DType act = DType::BF16;  // compute dtype of GEMM inputs
  int64_t hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float eps = 1e-5f, rope_theta = 10000.0f;
  bool neox = true;
  MaskKind mask = MaskKind::None;
  int mask_block = 0;
};

class Model {
 public:
  // Loads config.json and the safetensors weights of DIR into `backend` memory.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, Backend& backend,
                                     Precision precision = Precision::Auto);
  // Random weights of the given geometry (benchmarks): no files, weights in `act` dtype.
  static std::unique_ptr<Model> synthetic(const ModelConfig& c, Backend& backend, DType act,
                                          uint64_t seed = 1);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const GraphOptions& options() const { return opts_; }
  DType act_dtype() const { return opts_.act; }
  size_t weight_bytes() const { return weight_bytes_; }
  // The family's graph template for an output mode (built once, cached).
  const graph::GraphTemplate& graph(OutputMode mode);

  // Used by the family files while binding weights.
  Tensor bind(const std::string& name, std::vector<int64_t> shape, bool gemm_weight);
  Tensor bind_bias(const std::string& name, int64_t n);
  Tensor random_weight(std::vector<int64_t> shape, DType dt, float scale, uint64_t seed);
  DenseWeights& weights() { return w_; }
  GraphOptions& mutable_options() { return opts_; }

 private:
  Model() = default;
  ModelConfig cfg_;
  GraphOptions opts_;
  DenseWeights w_;
  Checkpoint ckpt_;
  Backend* backend_ = nullptr;
  std::vector<void*> owned_;  // backend allocations to free
  size_t weight_bytes_ = 0;
  std::unique_ptr<graph::GraphTemplate> graphs_[3];
};

// The shared dense-transformer graph (attention + SwiGLU FFN blocks, final norm, mask-only logits).
graph::GraphTemplate build_dense_graph(const DenseWeights& w, const GraphOptions& o, OutputMode mode);

// Family files: bind weights by their checkpoint names and set the family's options.
void bind_llada(Model& m);
void bind_dream(Model& m);

}  // namespace tessera

namespace tessera {
// Shape-only weights (no data) for planning without loading a checkpoint.
DenseWeights shape_only_weights(const ModelConfig& c, DType act);
GraphOptions graph_options(const ModelConfig& c, DType act);
// Real geometries by name (llada-8b, dream-7b, llada-mid: 4 layers, d=1024): config only.
ModelConfig named_geometry(const std::string& name);
}  // namespace tessera
