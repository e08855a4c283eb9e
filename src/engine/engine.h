// The Engine: loads a model, owns the backend and the workspace, and runs forward steps over
// packed sequences with a cached memory plan per step shape.
#pragma once
#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "decode/denoiser.h"
#include "engine/executor.h"
#include "engine/kv_pool.h"
#include "engine/prefix_cache.h"
#include "engine/request_state.h"
#include "engine/step_graphs.h"
#include "memory/planner.h"
#include "memory/workspace.h"
#include "models/model.h"

namespace tessera {

struct EngineOptions {
  std::string device = "cpu";  // cpu | cuda
  Precision precision = Precision::Auto;
  // GGUF: convert quantized tensors at load (the memory of bf16) instead of keeping them quantized
  // on the CPU (where every GEMM then dequantizes panels of its weight) and, for the
  // cuda_keeps_quantized types, on CUDA (tiles of rows).
  bool dequantize = false;
  size_t reserve_bytes = size_t{256} << 30;  // virtual range of the workspace
  memory::Fit fit = memory::Fit::First;
  int64_t k_ffn = 1, k_logits = 1;  // fixed chunk counts, used when memory_budget is 0
  // Total memory budget in bytes: the weights plus the planned activations (the workspace) must fit
  // in it; 0 = none. With a budget each step's K_ffn / K_logits are chosen by the lazy chunking
  // optimizer (no chunking unless the plan would exceed the budget), and a step that cannot fit
  // even fully chunked fails before it runs, naming the budget, the floor and the largest context.
  size_t memory_budget = 0;
  // The process's own memory besides the weights, the workspace and the caches (the runtime's libraries
  // and threads, the tokenizer: measured at start-up by the session): counted inside memory_budget, so a
  // process that keeps to its plan keeps to the budget.
  size_t runtime_bytes = 0;
  // The cross-request prefix cache of block-causal models (prefix_cache.h): at most this many bytes, and
  // within memory_budget; 0: off. Exact (it changes no output).
  size_t prefix_cache_bytes = 0;
  std::string dump_dir;      // debug: dump every named tensor of each step here
  bool profile_ops = false;  // time every op (synchronised) into Engine::op_seconds()
  // Replay repeated steps as recorded CUDA graphs (step_graphs.h; exact: the same kernels run).
  bool step_graphs = true;
  // The CPU backend's attention kernel (backend.h CpuAttention): Auto runs a bf16 model's attention on
  // bf16 operands where the CPU has AVX-512 BF16 (TESSERA_CPU_ATTN=f32 turns that off); F32 never.
  CpuAttention cpu_attention = CpuAttention::Auto;
  // The bf16 kernel's K / V staging (CpuBackendOptions::stage_kv; TESSERA_CPU_KV_STAGE=0 turns it off).
  bool cpu_stage_kv = true;
  // Tensor parallelism: the communicator of the ranks (dist/communicator.h; null or one rank: a single
  // process). The model keeps this rank's share of the heads and the dense FFN, and every forward sums the
  // partial outputs over the ranks; every rank runs the same requests in the same order. It is a host
  // communicator (MPI): the graph's collectives run on it on the CPU; on CUDA the engine builds NCCL over
  // it (Engine::collectives), and it carries the host's messages (the batcher's orders, agreed sizes).
  std::shared_ptr<dist::Communicator> comm;
  // The layout over comm's ranks: tp > 1 splits the heads and the dense FFNs, ep > 1 the MoE layers'
  // experts; each is 1 or the number of ranks (models/tensor_parallel.cpp).
  int tp = 1, ep = 1;
  // Wraps the device's backend (tests: a CPU backend that records and replays steps as CUDA does).
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
};

// This process's resident memory (VmRSS) and its high-water mark (VmHWM), from /proc/self/status;
// reset_peak_rss() restarts the high-water mark at the current RSS (clear_refs 5). Used to compare
// the RSS growth of a step with its plan.
struct ProcessMemory {
  size_t rss = 0, peak = 0;
  size_t anon = 0;  // RssAnon: the resident memory not backed by files (heap, stacks, JIT code)
};
ProcessMemory process_memory();
void reset_peak_rss();
// The resident pages of this process's file mappings outside model_path (a checkpoint's directory or its
// .gguf file): the binary's and the libraries' code, which a first forward touches. From /proc/self/smaps;
// the runtime's share that RssAnon misses, while the mapped weights are planned as weights.
size_t mapped_code_resident(const std::string& model_path);

// One sequence of a packed step: its canvas (absolute positions 0..n-1) and the positions whose
// prediction is wanted. targets (LogProb only) gives the token scored at each position.
struct SeqInput {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;
  std::span<const int32_t> targets = {};
};

struct StepStats {
  graph::StepShape shape;
  size_t planned_peak = 0;
  size_t lower_bound = 0;
  double plan_ms = 0.0;
  double search_ms = 0.0;  // lazy chunking search (0 without a memory budget)
  int search_plans = 0;    // plans the search evaluated
  bool plan_cached = false;
};

class Engine final : public Denoiser, private KvPool::Budget {
 public:
  static std::unique_ptr<Engine> load(const std::filesystem::path& dir, const EngineOptions& opt = {});
  // Random weights of a geometry (benchmarks; no files); quant >= 0: its 2-D weights as random blocks of
  // that ggml type (Model::synthetic).
  static std::unique_ptr<Engine> synthetic(const ModelConfig& c, const EngineOptions& opt = {},
                                           DType act = DType::BF16, int16_t quant = -1);
  ~Engine() override;

  const ModelConfig& config() const { return model_->config(); }
  const EngineOptions& options() const { return opt_; }
  // The communicator the forward's collectives run on: NCCL on the device's stream on CUDA, else
  // options().comm (null in one process).
  dist::Communicator* collectives() const { return device_comm_ ? device_comm_.get() : opt_.comm.get(); }
  Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  const Workspace& workspace() const { return *ws_; }
  const StepStats& last_step() const { return last_; }
  size_t max_planned_peak() const { return max_peak_; }
  // Bytes of the workspace physically resident now (CPU: mincore over the committed range; other
  // devices: the committed bytes).
  size_t workspace_resident() const;
  // The budget left for activations: memory_budget minus the weights and what is held across steps
  // (KV cache pool, SparseD patterns); 0 without a budget, or with nothing left.
  size_t activation_budget() const;
  // Adds to EngineOptions::runtime_bytes what was measured after load (the tokenizer); plans are redone.
  void add_runtime_bytes(size_t bytes);
  // Replaces EngineOptions::memory_budget (0: none); plans are redone. The session measures the runtime's
  // share with a first forward run without the budget, then sets it back.
  void set_memory_budget(size_t bytes);
  // Plans (and caches) the step of one sequence of n_tokens with n_logits selected rows; with a
  // memory budget, throws Error when it cannot fit. Run before a request's first step with its
  // largest step (the full canvas, the most logit rows) so an impossible budget fails before work.
  // kv_cache: the step of the KV-cache graph (a request with a cache refreshes its whole canvas).
  void check_memory(int64_t n_tokens, int64_t n_logits, OutputMode mode = OutputMode::Sample,
                    bool kv_cache = false);

  // Forward over packed sequences; outputs are host buffers in the order of the sequences'
  // positions: n = total positions (tokens/conf/logprob), n * vocab (logits).
  void forward_sample(std::span<const SeqInput> seqs, const SampleParams& sp, std::span<int32_t> tokens,
                      std::span<float> conf);
  // The same with the SampleParams of each sequence (packed requests): sps[s] samples sequence s's rows.
  void forward_sample(std::span<const SeqInput> seqs, std::span<const SampleParams> sps,
                      std::span<int32_t> tokens, std::span<float> conf);
  void forward_logits(std::span<const SeqInput> seqs, std::span<float> logits);
  // Whether the packed forward of `seqs` fits the memory budget (always without one); plans it if so.
  bool packed_step_fits(OutputMode mode, std::span<const SeqInput> seqs);
  void forward_logprob(std::span<const SeqInput> seqs, std::span<float> logprob);

  // Denoiser
  int64_t vocab_size() const override { return model_->config().vocab; }
  int32_t mask_token() const override { return model_->config().mask_id; }
  void predict(std::span<const int32_t> canvas, std::span<const int32_t> positions, const SampleParams& sp,
               std::span<int32_t> tokens, std::span<float> conf) override;
  // Of the last forward_sample / forward_cached (all its rows) or predict* call that asked for them.
  const PredictLogprobs& last_logprobs() const override { return logprobs_; }
  void logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
              std::span<float> out) override;
  bool supports_kv_cache() const override { return true; }
  void kv_cache_reset(int64_t capacity) override;
  void kv_cache_end() override;
  // Stream 1 (cfg's unconditional canvas under a KV cache) is a slot of the pool of its own, opened by
  // kv_stream_reset and closed with stream 0 by kv_cache_end.
  bool supports_kv_streams() const override { return true; }
  void kv_stream_reset(int stream, int64_t capacity) override;
  int64_t kv_prefix(std::span<const int32_t> canvas, int64_t rows) override;
  // kv_prefix for a slot of the pool (the batcher's requests), under attention block `block`.
  int64_t kv_prefix(int slot, std::span<const int32_t> canvas, int64_t rows, int block);
  // The prefix cache's counts and bytes (all 0 when it is off).
  PrefixCache::Stats prefix_stats() const;
  size_t prefix_bytes() const;
  void logits_rows(int stream, std::span<const int32_t> canvas, std::span<const int32_t> rows,
                   std::span<const int32_t> positions, std::span<float> out) override;
  void predict_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                      std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                      std::span<float> conf) override;
  void predict_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                    std::span<const int32_t> positions, const SampleParams& sp, std::span<int32_t> tokens,
                    std::span<float> conf) override;
  // Full logits [positions, vocab] of a KV-cache step (as predict_cached / predict_rows; tests and
  // host-side policies).
  void logits_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                     std::span<const int32_t> positions, std::span<float> out);
  void logits_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                   std::span<const int32_t> positions, std::span<float> out);
  // Bytes held by the KV cache pool (0 until a request uses it): every layer's K and V, in the compute
  // dtype, for every row of the pool. The pool outlives its requests (the next one reuses it); with a
  // memory budget it is freed when no slot is open and a plan or another held buffer would not fit
  // beside it. So are the SparseD patterns outside a sparse request.
  size_t kv_cache_bytes() const { return kv_->bytes(); }

  // KV caches of concurrent requests (the batcher): every open slot is a region of `capacity` rows of
  // the cache pool, one request's canvas. Slot 0 is the engine's own, used by the Denoiser interface
  // above (kv_cache_reset opens it). kv_open returns a new slot with every row unwritten, growing the
  // pool when no gap of it is large enough (the other slots' rows are moved, not lost); with a memory
  // budget it throws Error when the weights plus the grown pool (plus the old pool while it is copied)
  // exceed the budget; kv_fits says beforehand whether it would. kv_close frees the region.
  int kv_open(int64_t capacity);
  // Starts a new request on an open slot: every row unwritten, in place when the slot holds `capacity`
  // rows, else moved to a region that does (as kv_open). kv_cache_reset(c) is kv_reset(0, c).
  void kv_reset(int slot, int64_t capacity);
  bool kv_fits(int64_t capacity) const;
  void kv_close(int slot);
  int kv_slots_open() const;
  // One sequence of a packed KV-cache step: the canvas of the request holding `slot`, the canvas rows
  // computed (ascending, distinct; the logit rows of `positions` are added) and the positions whose
  // prediction is wanted. Every other row of the canvas must have been computed by an earlier step of
  // the slot. Outputs are in the order of the sequences' positions, as forward_sample.
  struct CachedSeq {
    int slot = 0;
    std::span<const int32_t> canvas, rows, positions;
  };
  void forward_cached(std::span<const CachedSeq> seqs, std::span<const SampleParams> sps,
                      std::span<int32_t> tokens, std::span<float> conf);
  void forward_cached_logits(std::span<const CachedSeq> seqs, std::span<float> logits);
  // Whether the packed KV-cache step of `seqs` fits the memory budget (always without one).
  bool packed_cached_fits(OutputMode mode, std::span<const CachedSeq> seqs);
  // SparseD (Denoiser): one pattern byte per (layer, head, query block, key block) of the canvas.
  bool supports_sparse_attention() const override { return true; }
  void sparse_begin(int64_t canvas_len, const SparseConfig& c) override;
  void sparse_phase(SparsePhase p) override;
  void sparse_end() override { sparse_.end(); }
  // Bytes held for the patterns (0 until a request uses them); the patterns of the last Select
  // forward copied to the host, [layer][head][query block][key block] (tests, inspection).
  size_t sparse_bytes() const { return sparse_.bytes(); }
  std::vector<uint8_t> sparse_patterns() const;
  // DES (Denoiser): MoE models only. The per-layer states (5 * n_experts f32 each) are read back after
  // every forward to count unique experts (moe_stats).
  bool supports_expert_sharing() const override;
  void des_begin(const DesConfig& c) override;
  // Throws Error unless des_begin(c) would accept c on this model (an MoE model, k and beta in range).
  void check_des(const DesConfig& c) const;
  void des_rows(int64_t lo, int64_t hi) override;
  void des_end() override { des_.end(); }
  const MoeStats& moe_stats() const { return des_.stats(); }
  // With EngineOptions::profile_ops: seconds spent per op kind since the last reset (else zeros).
  const std::array<double, graph::kOpKinds>& op_seconds() const { return op_seconds_; }
  // And the floating-point operations of the GEMM, gather-GEMM, routed-expert and attention ops timed
  // (executor.cpp op_flop_count: attention counted dense).
  const std::array<double, graph::kOpKinds>& op_flops() const { return op_flops_; }
  // And, on MoE models, what expert parallelism would exchange for the routing of those forwards.
  const MoeTraffic& moe_traffic() const { return moe_traffic_; }
  void reset_op_seconds() {
    op_seconds_.fill(0.0);
    op_flops_.fill(0.0);
    moe_traffic_ = MoeTraffic{};
  }
  // Steps recorded and replayed as CUDA graphs, and the kernels and copies of the last replayed one.
  const StepGraphs& step_graphs() const { return step_graphs_; }
  int attention_block() const override;
  // Block-causal models only (throws Error otherwise): rebuilds the graphs with the new block and
  // drops the cached plans when the block changes.
  void set_attention_block(int block) override;
  // Tri-mode models (ModelConfig::tri_mode): the causal graphs are a second set beside the model's own
  // (both cached, so switching costs nothing).
  bool supports_causal() const override { return model_->config().tri_mode || model_->config().is_uniform(); }
  void set_causal(bool causal) override;
  bool causal() const { return causal_; }
  bool supports_draft_adapter() const override { return model_->config().draft_adapter.rank > 0; }
  void set_draft_adapter(bool on) override;
  // Uniform-noise models (ModelConfig::Uniform): the decoder's canvas step over the engine's cache (slot 0).
  bool supports_uniform_canvas() const override { return model_->config().is_uniform(); }
  int64_t soft_width() const override { return model_->config().is_uniform() ? model_->config().hidden : 0; }
  void denoise_canvas(std::span<const int32_t> canvas, int64_t lo, int64_t hi, std::span<const float> sc,
                      const SampleParams& sp, CanvasPrediction& out) override;
  // The decoder's logits [hi - lo, vocab] of canvas rows [lo, hi) conditioned on `sc` (as denoise_canvas;
  // tests and host-side policies).
  void logits_canvas(std::span<const int32_t> canvas, int64_t lo, int64_t hi, std::span<const float> sc,
                     std::span<float> out);

 private:
  Engine() = default;
  static std::unique_ptr<Engine> make(const EngineOptions& opt);
  ShardPlan shard_plan() const;  // this rank's share of the model (EngineOptions::comm, tp, ep)
  // After the model is set: the KV cache pool, then the budget check of the weights.
  void init();

  // --- forward and packing (engine.cpp) ------------------------------------------------------------
  // Packs the sequences into the host staging arrays, then execute_step; returns the program.
  const graph::Program& run(OutputMode mode, std::span<const SeqInput> seqs, const SampleParams* sp);
  // A KV-cache step: stages each sequence's canvas rows `rows` (plus the logit rows of `positions`) as
  // queries and its whole canvas as keys, read from its slot of the pool; checks that every other row
  // is cached; runs execute_step.
  const graph::Program& run_cached(OutputMode mode, std::span<const CachedSeq> seqs, const SampleParams* sp);
  // The computed rows of one cached sequence (its rows and the logit rows of its positions) into
  // `out`, checked against the canvas and the slot's written rows.
  void cached_rows(const CachedSeq& s, std::vector<int32_t>& out);
  // Plans (cached), commits the workspace, copies the staged inputs and executes the graph of `mode`
  // (its KV cache variant when kv_cache).
  const graph::Program& execute_step(OutputMode mode, bool kv_cache, const graph::StepShape& shape,
                                     const SampleParams* sp);
  // The hidden row whose logits predict position pos (Dream's shift: pos - 1, row 0 for pos 0; a causal
  // forward: pos - 1, checked by check_position).
  int32_t logit_row(int32_t pos) const {
    return causal_ || model_->config().logit_shift ? std::max(pos - 1, 0) : pos;
  }
  // The next uniform-noise decoder step's self-conditioning input (sc_in): `sc` ([rows, hidden], or empty:
  // none), checked; `who` names the caller in the error.
  void set_soft_input(std::span<const float> sc, int64_t rows, const char* who);
  // Throws Error unless position pos of a canvas of n has a logit row (a causal forward predicts no
  // position 0: nothing precedes it).
  void check_position(int32_t pos, int64_t n) const;
  // The graph variant of the current forwards: mode + kOutputModes * variant(kv_cache) indexes the
  // plans and the graph inputs (kv_cache + 2 * causal + 4 * draft adapter).
  int variant(bool kv_cache) const { return (kv_cache ? 1 : 0) + (causal_ ? 2 : 0) + (draft_ ? 4 : 0); }
  // Throws Error for a token id outside the vocabulary.
  void check_token(int32_t t) const;
  void read_output(const graph::Program& p, int id, void* dst, size_t bytes);
  // Ids of the step inputs and outputs in each mode's graph, looked up once.
  struct GraphIo {
    int tokens = -1, q_pos = -1, k_pos = -1, cu_q = -1, cu_k = -1, rows = -1, keys = -1, target = -1;
    int cache_rows = -1, kv_rows = -1;
    int sc_in = -1, argmax = -1, soft = -1;  // uniform-noise decoders
    int out[2] = {-1, -1};
    int lp = -1, top_ids = -1, top_lp = -1;  // SampleLogprobs
  };
  const GraphIo& io(OutputMode mode, bool kv_cache = false);
  // A sampling forward's outputs: tokens and conf, and with logprobs (mode SampleLogprobs) logprobs_.
  void read_sample(const graph::Program& p, OutputMode mode, bool kv_cache, std::span<int32_t> tokens,
                   std::span<float> conf);

  // --- step planning and the memory budget (engine_memory.cpp) ---------------------------------------
  // The planned program of a step shape (cached per shape): with a memory budget the chunk counts
  // come from the lazy chunking optimizer, else from the options. Fills last_.
  const graph::Program& program_for(OutputMode mode, graph::StepShape shape, bool kv_cache = false);
  // program_for without the failure: nullptr (and the activation floor in `floor`) when even the
  // fully chunked plan exceeds the budget.
  const graph::Program* try_program(OutputMode mode, graph::StepShape shape, bool kv_cache, size_t& floor);
  [[noreturn]] void fail_budget(OutputMode mode, const graph::StepShape& shape, size_t floor);
  void check_weights_fit() const;
  // Grows a buffer held across steps (the SparseD patterns) to `bytes`, outside the plan: with a memory
  // budget the weights plus everything held must stay below it, else fails naming `what`. Drops the
  // cached plans (the activation budget shrank).
  void grow_held(HeldBuffer& buf, size_t bytes, const std::string& what);
  // KvPool::Budget: whether the weights, `others` and `bytes` fit the budget (check_held throws the
  // budget error unless they do); release_idle frees what no request holds (the KV cache pool when no
  // slot is open, the SparseD patterns outside a sparse request) and returns whether it freed anything
  // (the cached plans are then dropped: the activation budget grew).
  bool limited() const override { return opt_.memory_budget > 0; }
  size_t others_held(bool in_use_only) const override;
  bool held_fits(size_t others, size_t bytes) const override;
  void check_held(size_t others, size_t bytes, const std::string& what) const override;
  bool release_idle() override;
  void pool_resized() override;

  EngineOptions opt_;
  std::shared_ptr<dist::Communicator> device_comm_;  // CUDA over ranks: NCCL, built over opt_.comm
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Workspace> ws_;
  // The plan cache.
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t,
                             int64_t>;  // mode + kOutputModes * variant, n_query, n_kv, n_logits, n_seqs
  struct CachedPlan {
    graph::Program prog;
    double search_ms = 0.0;
    int search_plans = 0;
  };
  std::map<PlanKey, CachedPlan> plans_;
  uint64_t program_serial_ = 0;
  StepStats last_;
  size_t max_peak_ = 0;
  GraphIo io_[8 * kOutputModes];  // [mode + kOutputModes * variant]
  bool io_ready_[8 * kOutputModes] = {};
  bool causal_ = false;  // set_causal
  bool draft_ = false;   // set_draft_adapter
  PredictLogprobs logprobs_;
  // Host staging of the step inputs (capacity kept across steps: no allocation after warm-up).
  std::vector<int32_t> tokens_, q_pos_, k_pos_, cu_q_, cu_k_, rows_, keys_, targets_, cache_rows_, kv_rows_;
  std::vector<float> sc_;                 // a uniform-noise decoder's self-conditioning input (empty: zeros)
  std::vector<int64_t> seq_rows_;         // the first logit row of each sequence of the step, and the end
  std::span<const SampleParams> seq_sp_;  // per-sequence sampling of the current forward_sample, if any
  std::vector<int32_t> req_rows_;         // a KV-cache step's requested rows (cached_range)
  std::vector<int32_t> seq_q_;            // one cached sequence's computed rows (cached_rows)
  std::vector<char*> state_ptrs_;         // per tensor id of the cached graph
  // Request state held across steps: the KV cache pool (kv_pool.h), the SparseD patterns and the DES
  // layer states (request_state.h).
  std::unique_ptr<KvPool> kv_;
  // The prefix cache (null when off) and, per slot, the prefix rows a request will write for it.
  struct PendingPrefix {
    std::vector<int32_t> tokens;  // [0, to * block)
    int block = 0;
    int64_t from = 0, to = 0;  // in blocks
  };
  std::unique_ptr<PrefixCache> prefix_;
  std::vector<PendingPrefix> prefix_pending_;  // by slot; to == 0: none
  void publish_prefix(int slot);               // after a forward of the slot (engine_prefix.cpp)
  int stream_slot_ = -1;                       // the pool slot of KV stream 1 while a request holds one
  SparseState sparse_;
  DesState des_;
  std::array<double, graph::kOpKinds> op_seconds_{}, op_flops_{};
  MoeTraffic moe_traffic_;
  StepGraphs step_graphs_{true};
};

// "attention 1.23 s (41%), gemm ..." for the op kinds that took time, largest first; seconds divided
// by `per` (e.g. the repetitions that were summed). With flops (Engine::op_flops()), each kind that
// counts them also gives its rate: "gemm 0.68 s (74%, 404 GFLOP/s)".
std::string format_op_seconds(const std::array<double, graph::kOpKinds>& seconds, double per = 1.0,
                              const std::array<double, graph::kOpKinds>* flops = nullptr);

}  // namespace tessera
