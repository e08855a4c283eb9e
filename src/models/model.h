// A loaded model: config, weights bound by tensor name in backend memory, and the family's graph
// template. The model never sees "diffusion": it maps (tokens, positions) to logits of chosen rows.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
  // Sample, and the log-probabilities of the predictions: "logprob" [n_logits] f32 of each chosen
  // token, "top_ids" [n_logits, kTopLogprobs] i32 and "top_logprobs" [n_logits, kTopLogprobs] f32 of
  // the most likely tokens (fewer columns when the vocabulary is smaller).
  SampleLogprobs,
};
constexpr int kOutputModes = 4;

// One transformer layer. Optional tensors are empty (ndim 0). A dense layer has the SwiGLU FFN
// w_gate/w_up/w_down; an MoE layer has the router and the routed experts, and w_gate/w_up/w_down
// only when it has a shared expert (run on every row, added to the routed output).
struct LayerWeights {
  Tensor attn_norm, wq, wk, wv, bq, bk, bv, wo;
  Tensor q_norm, k_norm;  // qk-norm: [head_dim] RMSNorm weights applied to every q / k head
  // The draft adapter on o_proj (ModelConfig::draft_adapter): x += (att lora_a^T) lora_b^T in draft
  // forwards; lora_a [rank, q width], lora_b [hidden, rank] with the adapter's scale folded in.
  Tensor lora_a, lora_b;
  Tensor ffn_norm, w_gate, w_up, w_down;
  Tensor router;       // [n_experts, hidden], act dtype
  Tensor expert_bias;  // [n_experts] f32 selection bias
  MoeExperts experts;  // table of the routed experts (n_experts == 0: dense layer)
  // Gemma 4 layers (DiffusionGemma, ModelConfig::Uniform; models/diffusion_gemma.cpp): attn_norm and
  // ffn_norm are the attention's and the dense MLP's input norms; these the rest of its sandwich norms
  // (o_proj's output, the experts' input, the dense MLP's and the experts' outputs, their sum), the
  // router's input norm (router.scale), the per-expert scales (f32) and the encoder's and decoder's
  // layer scalars.
  Tensor post_attn_norm, moe_norm, post_dense_norm, post_moe_norm, post_ffn_norm, router_norm, expert_scale;
  float scalar_enc = 1.0f, scalar_dec = 1.0f;
  bool is_moe() const { return experts.n_experts > 0; }
};

struct DenseWeights {
  Tensor embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
  // Self-conditioning (DiffusionGemma): its pre-norm and GeGLU MLP.
  Tensor sc_norm, sc_gate, sc_up, sc_down;
};

// Everything the shared graph builder needs besides the weights.
struct GraphOptions {
  DType act = DType::BF16;  // compute dtype of GEMM inputs
  int64_t hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  RopeParams rope;  // the rotary embedding of k (q's adds the Llama-4 scale, if any); FFN sizes come from the
                    // weights
  float eps = 1e-5f;
  MaskKind mask = MaskKind::None;
  int mask_block = 0;
  MoeRouteParams route;  // MoE layers (expert_bias: the layer's expert_bias weight)
  // Plan a bf16 K/V staging buffer for the attention op (AttnParams::kv_scratch): set where the backend's
  // attention reads K and V staged in bf16 (Backend::stages_attention_kv: CUDA's tensor-core and cuDNN
  // kernels, the CPU's bf16 kernel).
  bool stage_kv_bf16 = false;
  // With it, let attention overwrite q (AttnParams::q_scratch): CUDA's cuDNN path writes O there first.
  bool attn_q_scratch = false;
  // KV cache graph: every layer writes its post-RoPE K and V rows into the State tensors
  // blk.N.k_cache / blk.N.v_cache (n_kv rows, in the compute dtype: bf16 or f32) at the rows'
  // positions, and attention reads the whole cache (bf16: through f32 transients k_all / v_all). A
  // step computes only its n_query rows; the other rows' K / V come from the cache.
  bool kv_cache = false;
  // Draft graph: o_proj adds each layer's draft adapter (LayerWeights::lora_a / lora_b).
  bool draft_adapter = false;
  // Tensor and expert parallelism (models/tensor_parallel.cpp) over the same ranks; tp_rank is this
  // process's rank. tp_size > 1: this rank's share of the heads and of the dense FFN (n_heads, n_kv_heads
  // and the weights are the rank's); ep_size > 1: its share of every MoE layer's experts. The graph sums
  // the partial outputs of o_proj and of each split FFN over the ranks (OpKind::AllReduce; rank 0's
  // partial sum is added to the residual, the others' written over it).
  int tp_rank = 0, tp_size = 1, ep_size = 1;
  // The LM head split by vocabulary (tp_size > 1 on the CPU): this rank's rows of it; the ops that read
  // logits combine the ranks' per-row summaries (engine/vocab_parallel.h). n == 0: the head is whole.
  VocabShare vocab_split;
};

// Throws a one-line error when config c cannot be split over `size` tensor-parallel ranks (heads, key /
// value heads or the dense FFN not divisible) or, with ep > 1, its experts over ep ranks (a dense model,
// more ranks than experts, or experts not divisible).
void check_tensor_parallel(const ModelConfig& c, int size, int ep = 1);
// The geometry one rank computes under tensor parallelism over tp ranks: its heads, key / value heads and
// dense FFN (and, with expert parallelism, its share of the shared expert); head_dim, hidden, vocab and
// the routed experts as they are. kv_cache_bytes_per_token is the rank's share of the cache.
ModelConfig tensor_parallel_rank_config(const ModelConfig& c, int tp, int ep = 1);
// The parameters one rank holds under --tp tp --ep ep (its experts only; the router whole; with split_vocab,
// the CPU's layout, its share of an untied LM head).
int64_t parallel_rank_params(const ModelConfig& c, int tp, int ep, bool split_vocab = false);
// The parameters a rank holds above its share while it loads (Model::load with a shard plan): the largest
// layer's part outside the share, bound whole before its share is taken. The other ranks' experts are never
// bound and the CPU's LM head is split before the first layer, so neither counts (0 under --ep alone).
int64_t parallel_load_extra_params(const ModelConfig& c, int tp, int ep);

// Precision::Auto's compute dtype: the dtype most weight bytes are stored in (as loaded: GGUF's
// quantized tensors count as the bf16 they become).
inline DType auto_compute_dtype(size_t f32_bytes, size_t other_bytes) {
  return f32_bytes > other_bytes ? DType::F32 : DType::BF16;
}

// One rank's share of the weights under tensor parallelism over tp ranks and expert parallelism over ep
// ranks (the same ranks: tp and ep are each 1 or the world; models/tensor_parallel.cpp).
struct ShardPlan {
  int rank = 0, tp = 1, ep = 1;
  int world() const { return std::max(tp, ep); }
  // The experts [first, second) of n that this rank computes: all of them without expert parallelism
  // (check_tensor_parallel has checked that ep divides n).
  std::pair<int64_t, int64_t> experts(int64_t n) const {
    if (ep <= 1) return {0, n};
    return {rank * (n / ep), (rank + 1) * (n / ep)};
  }
};

class Model {
 public:
  // Loads config.json and the safetensors weights of DIR into `backend` memory.
  // A .gguf file loads too; its quantized tensors stay quantized on the CPU backend, and those of the
  // cuda_keeps_quantized types on CUDA (MoE experts excepted), unless `dequantize` (then, and for the
  // others, they become bf16, or f32 with Precision::F32).
  // With a shard plan over several ranks, each layer keeps the rank's share as soon as it is bound (the
  // other ranks' experts are never bound), so loading peaks at the share plus one whole layer.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, Backend& backend,
                                     Precision precision = Precision::Auto, bool dequantize = false,
                                     const ShardPlan& shard = {});
  // Random weights of the given geometry (benchmarks): no files, weights in `act` dtype. quant >= 0 (a
  // ggml type the backend keeps quantized: q8_0 ... q6_K): the 2-D weights (GEMM weights, the embedding
  // table and LM head; not the routed experts, which stay in `act` as Model::load leaves them on CUDA)
  // are random blocks of that type instead, computing as `act`.
  static std::unique_ptr<Model> synthetic(const ModelConfig& c, Backend& backend, DType act,
                                          uint64_t seed = 1, int16_t quant = -1);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const GraphOptions& options() const { return opts_; }
  DType act_dtype() const { return opts_.act; }
  size_t weight_bytes() const { return weight_bytes_; }
  // The most weight bytes this model held at once while loading (counted between layers: a sharded load
  // holds its share of the head and of the layers before, plus one whole layer).
  size_t peak_weight_bytes() const { return peak_weight_bytes_; }
  // The family's graph template for an output mode (built once, cached); kv_cache: the variant that
  // reads and writes the KV cache (GraphOptions::kv_cache); causal: with causal attention instead of
  // the model's own mask (tri-mode models' autoregressive forwards); draft: with the draft adapter
  // (GraphOptions::draft_adapter; a model that has one).
  const graph::GraphTemplate& graph(OutputMode mode, bool kv_cache = false, bool causal = false,
                                    bool draft = false);

  // Used by the family files while binding weights.
  Tensor bind(const std::string& name, std::vector<int64_t> shape, bool gemm_weight);
  // bind() of a GEMM weight multiplied by `scale` (a copy in the compute dtype; a LoRA's alpha / r).
  Tensor bind_scaled(const std::string& name, std::vector<int64_t> shape, float scale);
  // Rows [row0, row0 + rows) of the 2-D tensor `name` of shape {total_rows, cols} (a fused weight such
  // as LLaDA2's query_key_value): a zero-copy view into the mapped file where bind() would be zero
  // copy, else only those rows are converted / copied.
  Tensor bind_rows(const std::string& name, int64_t total_rows, int64_t cols, int64_t row0, int64_t rows,
                   bool gemm_weight);
  Tensor bind_bias(const std::string& name, int64_t n);
  // The f32 bias slice [at, at + n) of the 1-D tensor `name` of `total` values.
  Tensor bind_bias_slice(const std::string& name, int64_t total, int64_t at, int64_t n);
  // The value of a one-element tensor (a layer scalar), on the host.
  float scalar(const std::string& name);
  bool has_tensor(const std::string& name) const;
  // Binds the n_experts x {gate_proj, up_proj, down_proj} weights named name(e, proj) (zero copy
  // where possible) and builds their table in backend memory.
  MoeExperts bind_experts(const std::function<std::string(int64_t, const char*)>& name, int64_t n_experts,
                          int64_t inter);
  // The pointer table (backend memory) of the experts gate[E], up[E], down[E] given in that order.
  const void* const* expert_table(const std::vector<Tensor>& gate_up_down);
  Tensor random_weight(std::vector<int64_t> shape, DType dt, float scale, uint64_t seed);
  // Random blocks of ggml type `quant` for a [rows, cols] weight computing as `dt`: quants uniform, the
  // block scales set so that the values' standard deviation is about `scale` (benchmarks).
  Tensor random_quant_weight(int64_t rows, int64_t cols, DType dt, int16_t quant, float scale, uint64_t seed);
  DenseWeights& weights() { return w_; }
  GraphOptions& mutable_options() { return opts_; }
  // Block-causal models: a new attention block size (the graphs are rebuilt on next use).
  void set_mask_block(int64_t block);
  // Used by the family files: layer l's weights are all bound (a sharded load keeps the rank's share of
  // them now; a family that never says so is sharded when its binding ends).
  void layer_bound(int64_t l);
  // Keeps this rank's share of the weights of a model loaded whole (synthetic weights); the graphs are
  // rebuilt with the local heads, the local experts and the all-reduces.
  void shard_parallel(const ShardPlan& plan);

 private:
  Model() = default;
  Tensor bind_rows(const std::string& name, int64_t total_rows, int64_t cols, int64_t row0, int64_t rows,
                   bool gemm_weight, const std::vector<int64_t>& file_shape, float scale = 1.0f);
  Tensor bind_quantized(const StTensor& st, int64_t cols, int64_t row0, int64_t rows, bool gemm_weight,
                        const std::vector<int64_t>& file_shape);
  // Sharding (models/tensor_parallel.cpp).
  void check_shard(const ShardPlan& plan) const;
  void begin_shard(const ShardPlan& plan);
  void shard_layer(LayerWeights& L);
  void finish_shard();
  void shard_head();
  Tensor shard_rows(const Tensor& t, int64_t row0, int64_t n);
  Tensor shard_columns(const Tensor& t, int64_t col0, int64_t cols, const char* what);
  ModelConfig cfg_;
  GraphOptions opts_;
  DenseWeights w_;
  Checkpoint ckpt_;
  Backend* backend_ = nullptr;
  std::vector<void*> owned_;  // backend allocations to free
  size_t weight_bytes_ = 0;
  size_t peak_weight_bytes_ = 0;
  size_t quant_tile_bytes_ = 0;      // CUDA: the largest tile of its quantized GEMM weights (counted)
  bool binding_experts_ = false;     // inside bind_experts (CUDA converts quantized experts at load)
  ShardPlan shard_;                  // this rank's share (world 1: the whole model)
  std::vector<char> layer_sharded_;  // per layer: its share taken
  bool head_sharded_ = false;        // the CPU's LM head split by vocabulary
  // [mode + kOutputModes * (kv_cache + 2 * causal + 4 * draft)]
  std::unique_ptr<graph::GraphTemplate> graphs_[8 * kOutputModes];
};

// The shared dense-transformer graph (attention + SwiGLU FFN blocks, final norm, mask-only logits).
graph::GraphTemplate build_dense_graph(const DenseWeights& w, const GraphOptions& o, OutputMode mode);
// One layer's KV cache in a graph (GraphOptions::kv_cache): the step's rows `keys` / `values` (their K and
// V) are scattered into the State tensors k_cache / v_cache at cache_rows, and the step's keys gathered
// from them at kv_rows into f32 transients k_all / v_all, which keys / values then name (attention reads
// them like uncached keys).
void add_kv_cache(graph::GraphTemplate& g, const GraphOptions& o, int layer, int64_t kv_width, int cache_rows,
                  int kv_rows, int& keys, int& values);
// The graph of config c's family: its own builder where it has one (FamilyInfo::graph), else
// build_dense_graph.
graph::GraphTemplate build_model_graph(const ModelConfig& c, const DenseWeights& w, const GraphOptions& o,
                                       OutputMode mode);

}  // namespace tessera

namespace tessera {
// How layout_weights() gets each tensor: shape-only views (planning) or random weights (benchmarks).
struct WeightMaker {
  // A tensor of `shape` and dtype; `sd` is the standard deviation random weights get.
  std::function<Tensor(const std::vector<int64_t>& shape, DType dt, float sd)> tensor;
  // The expert table of gate[E], up[E], down[E] (nullptr for shape-only weights).
  std::function<const void* const*(const std::vector<Tensor>& gate_up_down)> table;
  // The routed experts' tensors, when they are made otherwise than by `tensor` (empty: by `tensor`).
  std::function<Tensor(const std::vector<int64_t>& shape, DType dt, float sd)> expert;
};
// Every weight the graph of config c needs, made in a fixed order by `make`.
DenseWeights layout_weights(const ModelConfig& c, DType act, const WeightMaker& make);
// Shape-only weights (no data) for planning without loading a checkpoint.
DenseWeights shape_only_weights(const ModelConfig& c, DType act);
// The graph options of config c computing in act for `backend` (where its attention stages K / V in bf16,
// the graph plans that buffer); without a backend, none.
GraphOptions graph_options(const ModelConfig& c, DType act, const Backend* backend = nullptr);
// The same for dev's default backend (default_stages_attention_kv), for plans made without a backend.
GraphOptions graph_options(const ModelConfig& c, DType act, Device dev);
// The rotary embedding of config c: rotary dims, theta, pairs and YaRN (the Llama-4 query scale is in
// pos_beta / pos_orig; the graph applies it to q only).
RopeParams rope_params(const ModelConfig& c);
// Real geometries by name (llada-8b, dream-7b, llada-mid: 4 layers, d=1024, llada-moe-7b,
// llada2-mini; llada-moe-mid / llada2-mid: their real layers, 4 of them): config only. Each family's
// are in its file (models/registry.h).
ModelConfig named_geometry(const std::string& name);
// Every name named_geometry knows, in registry order.
std::vector<std::string> geometry_names();
}  // namespace tessera
