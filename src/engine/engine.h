// The Engine: loads a model, owns the backend and the workspace, and runs forward steps over
// packed sequences with a cached memory plan per step shape.
#pragma once
#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "decode/denoiser.h"
#include "engine/executor.h"
#include "memory/planner.h"
#include "memory/workspace.h"
#include "models/model.h"

namespace tessera {

struct EngineOptions {
  std::string device = "cpu";  // cpu | cuda
  Precision precision = Precision::Auto;
  // GGUF: convert quantized tensors at load (the memory of bf16) instead of keeping them quantized
  // on the CPU (where every GEMM then dequantizes panels of its weight).
  bool dequantize = false;
  size_t reserve_bytes = size_t{256} << 30;  // virtual range of the workspace
  memory::Fit fit = memory::Fit::First;
  int64_t k_ffn = 1, k_logits = 1;  // fixed chunk counts, used when memory_budget is 0
  // Total memory budget in bytes: the weights plus the planned activations (the workspace) must fit
  // in it; 0 = none. With a budget each step's K_ffn / K_logits are chosen by the lazy chunking
  // optimizer (no chunking unless the plan would exceed the budget), and a step that cannot fit
  // even fully chunked fails before it runs, naming the budget, the floor and the largest context.
  size_t memory_budget = 0;
  std::string dump_dir;      // debug: dump every named tensor of each step here
  bool profile_ops = false;  // time every op (synchronised) into Engine::op_seconds()
};

// This process's resident memory (VmRSS) and its high-water mark (VmHWM), from /proc/self/status;
// reset_peak_rss() restarts the high-water mark at the current RSS (clear_refs 5). Used to compare
// the RSS growth of a step with its plan.
struct ProcessMemory {
  size_t rss = 0, peak = 0;
};
ProcessMemory process_memory();
void reset_peak_rss();

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

// DES counts since des_begin, summed over every (MoE layer, forward): the unique experts the routed
// rows used (the expert weights the forward read), those of the voting rows only, and the coreset size.
struct MoeStats {
  int64_t forwards = 0, layer_forwards = 0;
  double unique = 0, unique_voting = 0, coreset = 0;
  double mean(double sum) const {
    return layer_forwards > 0 ? sum / static_cast<double>(layer_forwards) : 0.0;
  }
  MoeStats& operator+=(const MoeStats& o) {
    forwards += o.forwards;
    layer_forwards += o.layer_forwards;
    unique += o.unique;
    unique_voting += o.unique_voting;
    coreset += o.coreset;
    return *this;
  }
};

class Engine final : public Denoiser {
 public:
  static std::unique_ptr<Engine> load(const std::filesystem::path& dir, const EngineOptions& opt = {});
  // Random weights of a geometry (benchmarks; no files).
  static std::unique_ptr<Engine> synthetic(const ModelConfig& c, const EngineOptions& opt = {},
                                           DType act = DType::BF16);
  ~Engine() override;

  const ModelConfig& config() const { return model_->config(); }
  const EngineOptions& options() const { return opt_; }
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
  void kv_cache_end() override { kv_close(0); }
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
  size_t kv_cache_bytes() const { return kv_bytes_; }

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
  void sparse_end() override { sparse_on_ = false; }
  // Bytes held for the patterns (0 until a request uses them); the patterns of the last Select
  // forward copied to the host, [layer][head][query block][key block] (tests, inspection).
  size_t sparse_bytes() const { return sparse_bytes_; }
  std::vector<uint8_t> sparse_patterns() const;
  // DES (Denoiser): MoE models only. The per-layer states (5 * n_experts f32 each) are read back after
  // every forward to count unique experts (moe_stats).
  bool supports_expert_sharing() const override;
  void des_begin(const DesConfig& c) override;
  // Throws Error unless des_begin(c) would accept c on this model (an MoE model, k and beta in range).
  void check_des(const DesConfig& c) const;
  void des_rows(int64_t lo, int64_t hi) override;
  void des_end() override { des_on_ = false; }
  const MoeStats& moe_stats() const { return des_stats_; }
  // With EngineOptions::profile_ops: seconds spent per op kind since the last reset (else zeros).
  const std::array<double, graph::kOpKinds>& op_seconds() const { return op_seconds_; }
  void reset_op_seconds() { op_seconds_.fill(0.0); }
  int attention_block() const override;
  // Block-causal models only (throws Error otherwise): rebuilds the graphs with the new block and
  // drops the cached plans when the block changes.
  void set_attention_block(int block) override;

 private:
  Engine() = default;
  static std::unique_ptr<Engine> make(const EngineOptions& opt);
  // Packs the sequences into the host staging arrays, then execute_step; returns the program.
  const graph::Program& run(OutputMode mode, std::span<const SeqInput> seqs, const SampleParams* sp);
  // Plans (cached), commits the workspace, copies the staged inputs and executes the graph of `mode`
  // (its KV cache variant when kv_cache).
  // A KV-cache step: stages each sequence's canvas rows `rows` (plus the logit rows of `positions`) as
  // queries and its whole canvas as keys, read from its slot of the pool; checks that every other row
  // is cached; runs execute_step.
  const graph::Program& run_cached(OutputMode mode, std::span<const CachedSeq> seqs, const SampleParams* sp);
  // The computed rows of one cached sequence (its rows and the logit rows of its positions) into
  // `out`, checked against the canvas and the slot's written rows.
  void cached_rows(const CachedSeq& s, std::vector<int32_t>& out);
  const graph::Program& execute_step(OutputMode mode, bool kv_cache, const graph::StepShape& shape,
                                     const SampleParams* sp);
  // The planned program of a step shape (cached per shape): with a memory budget the chunk counts
  // come from the lazy chunking optimizer, else from the options. Fills last_.
  const graph::Program& program_for(OutputMode mode, graph::StepShape shape, bool kv_cache = false);
  // program_for without the failure: nullptr (and the activation floor in `floor`) when even the
  // fully chunked plan exceeds the budget.
  const graph::Program* try_program(OutputMode mode, graph::StepShape shape, bool kv_cache, size_t& floor);
  // The hidden row whose logits predict position pos (Dream's shift: pos - 1, row 0 for pos 0).
  int32_t logit_row(int32_t pos) const { return model_->config().logit_shift ? std::max(pos - 1, 0) : pos; }
  // Throws Error for a token id outside the vocabulary.
  void check_token(int32_t t) const;
  [[noreturn]] void fail_budget(OutputMode mode, const graph::StepShape& shape, size_t floor);
  void check_weights_fit() const;
  // Grows a buffer held across steps (KV cache, SparseD patterns; `held` is its byte count) to `bytes`,
  // outside the plan: with a memory budget the weights plus everything held must stay below it, else
  // fails naming `what`. Drops the cached plans (the activation budget shrank).
  void grow_held(void*& buf, size_t& held, size_t bytes, const std::string& what);
  // Whether the weights, `others` and `bytes` fit the budget; check_held throws grow_held's budget
  // error unless they do.
  bool held_fits(size_t others, size_t bytes) const;
  // Frees what no request holds: the KV cache pool when no slot is open, the SparseD patterns outside
  // a sparse request. Returns whether it freed anything (the cached plans are then dropped: the
  // activation budget grew).
  bool release_idle();
  void check_held(size_t others, size_t bytes, const std::string& what) const;
  // The KV cache pool: the first base of `capacity` free rows among the open slots' regions (the end of
  // the last region when no gap is large enough, possibly past kv_rows_); growth to `rows` rows.
  int64_t kv_base(int64_t capacity) const;
  void kv_grow(int64_t rows, const std::string& what);
  void kv_place(int slot, int64_t capacity);
  void read_output(const graph::Program& p, int id, void* dst, size_t bytes);

  // Ids of the step inputs and outputs in each mode's graph, looked up once.
  struct GraphIo {
    int tokens = -1, q_pos = -1, k_pos = -1, cu_q = -1, cu_k = -1, rows = -1, keys = -1, target = -1;
    int cache_rows = -1, kv_rows = -1;
    int out[2] = {-1, -1};
    int lp = -1, top_ids = -1, top_lp = -1;  // SampleLogprobs
  };
  const GraphIo& io(OutputMode mode, bool kv_cache = false);
  GraphIo io_[2 * kOutputModes];  // [mode + kOutputModes * kv_cache]
  bool io_ready_[2 * kOutputModes] = {};
  // A sampling forward's outputs: tokens and conf, and with logprobs (mode SampleLogprobs) logprobs_.
  void read_sample(const graph::Program& p, OutputMode mode, bool kv_cache, std::span<int32_t> tokens,
                   std::span<float> conf);
  PredictLogprobs logprobs_;

  EngineOptions opt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Workspace> ws_;
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t,
                             int64_t>;  // mode + kOutputModes * kv_cache, n_query, n_kv, n_logits, n_seqs
  struct CachedPlan {
    graph::Program prog;
    double search_ms = 0.0;
    int search_plans = 0;
  };
  std::map<PlanKey, CachedPlan> plans_;
  StepStats last_;
  size_t max_peak_ = 0;
  // Host staging of the step inputs (capacity kept across steps: no allocation after warm-up).
  std::vector<int32_t> tokens_, q_pos_, k_pos_, cu_q_, cu_k_, rows_, keys_, targets_, cache_rows_, kv_rows_;
  std::vector<int64_t> seq_rows_;         // the first logit row of each sequence of the step, and the end
  std::span<const SampleParams> seq_sp_;  // per-sequence sampling of the current forward_sample, if any
  std::vector<int32_t> req_rows_;         // a KV-cache step's requested rows (cached_range)
  // KV cache pool: one backend buffer with every State tensor at kv_pool_rows_ rows (kv_row_bytes_ per
  // row of all of them); each open slot owns the rows [base, base + capacity), `written` marks the rows
  // whose K / V it holds for its request, `block` the attention block they were computed under.
  struct KvSlot {
    bool open = false;
    int64_t base = 0, capacity = 0;
    int block = 0;
    std::vector<uint8_t> written;
  };
  void* kv_buf_ = nullptr;
  size_t kv_bytes_ = 0, kv_row_bytes_ = 0;
  int64_t kv_pool_rows_ = 0;
  std::vector<KvSlot> kv_slots_;
  std::vector<int32_t> seq_q_;     // one cached sequence's computed rows (cached_rows)
  std::vector<char*> state_ptrs_;  // per tensor id of the cached graph
  // SparseD: the patterns of every layer for a canvas of sparse_canvas_ positions in one buffer of
  // sparse_bytes_ (kept across requests, grown when needed); sparse_ready_ once a Select forward of
  // this request has written them.
  void* sparse_buf_ = nullptr;
  size_t sparse_bytes_ = 0;
  int64_t sparse_canvas_ = 0;
  bool sparse_on_ = false, sparse_ready_ = false;
  SparsePhase sparse_phase_ = SparsePhase::Dense;
  SparseExec sparse_exec_;
  // DES: the layer states (not counted against the memory budget: 5 * n_experts floats per layer), the
  // canvas positions [des_lo_, des_hi_) decoded in parallel, the counts.
  void* des_buf_ = nullptr;
  size_t des_bytes_ = 0;
  bool des_on_ = false;
  int64_t des_lo_ = 0, des_hi_ = 0;
  DesExec des_exec_;
  MoeStats des_stats_;
  std::vector<float> des_host_;
  std::array<double, graph::kOpKinds> op_seconds_{};
  // Sets des_exec_'s voting rows for a step whose rows are the (ascending) canvas positions q_pos.
  void des_step_rows(std::span<const int32_t> q_pos);
};

// "attention 1.23 s (41%), gemm ..." for the op kinds that took time, largest first; seconds divided
// by `per` (e.g. the repetitions that were summed).
std::string format_op_seconds(const std::array<double, graph::kOpKinds>& seconds, double per = 1.0);

}  // namespace tessera
