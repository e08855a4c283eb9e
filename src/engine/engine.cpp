// Engine: loading, and the forward of packed sequences (uncached or over the KV cache pool's slots):
// staging the step inputs, executing the planned program, reading the outputs back. Step planning and
// the memory budget are in engine_memory.cpp, the KV cache pool in kv_pool.cpp, the SparseD and DES
// request state in request_state.cpp.
#include "engine/engine.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "io/config.h"
#include "io/gguf.h"

namespace tessera {

namespace {

// Sets the engine's per-sequence sampling for one packed forward and clears it on every exit, thrown
// errors included.
class PerSequenceSampling {
 public:
  PerSequenceSampling(std::span<const SampleParams>& slot, std::span<const SampleParams> sps) : slot_(slot) {
    slot_ = sps;
  }
  PerSequenceSampling(const PerSequenceSampling&) = delete;
  PerSequenceSampling& operator=(const PerSequenceSampling&) = delete;
  ~PerSequenceSampling() { slot_ = {}; }

 private:
  std::span<const SampleParams>& slot_;
};

// The KV cache pool's layout: the State tensors of g, in declaration order, are consecutive slices of
// the pool's rows, so the slice of a tensor starts at (the row bytes of the tensors before it) * rows.
// Calls f(tensor id, row bytes before it, its row bytes) for each; returns the bytes of one pool row.
template <class F>
size_t for_each_state(const graph::GraphTemplate& g, F&& f) {
  size_t before = 0;
  for (size_t i = 0; i < g.tensors().size(); ++i) {
    const graph::TensorDecl& d = g.tensors()[i];
    if (d.kind != graph::TensorKind::State) continue;
    const size_t row = static_cast<size_t>(d.rows_mul * d.cols) * dtype_size(d.dtype);
    f(i, before, row);
    before += row;
  }
  return before;
}

}  // namespace

std::unique_ptr<Engine> Engine::make(const EngineOptions& opt) {
  std::unique_ptr<Engine> e(new Engine());
  e->opt_ = opt;
  e->step_graphs_ = StepGraphs(opt.step_graphs);
  if (opt.device == "cpu") {
    e->backend_ = make_cpu_backend({opt.cpu_attention, CpuMoe::Auto, opt.cpu_stage_kv});
    e->ws_ = make_cpu_workspace(opt.reserve_bytes);
  } else if (opt.device == "cuda") {
    std::string why;
    e->backend_ = make_cuda_backend(&why);
    if (!e->backend_) fail("--device cuda: " + why);
    e->ws_ = make_cuda_workspace(opt.reserve_bytes);
  } else {
    fail("unknown device '" + opt.device + "' (use cpu or cuda)");
  }
  if (opt.wrap_backend) e->backend_ = opt.wrap_backend(std::move(e->backend_));
  if (opt.comm && opt.comm->size() > 1) {
    TESSERA_CHECK(
        std::string(opt.comm->name()) != "nccl",
        "tensor parallelism: EngineOptions::comm is the host's communicator (MPI); the engine builds "
        "NCCL over it on CUDA");
    if (e->backend_->device() != Device::CPU) {
      // The forward's collectives on the GPUs, queued on the backend's stream; step graphs off (each
      // step's kernels run as issued, the collectives among them).
      std::string why;
      e->device_comm_ = dist::make_nccl_communicator(opt.comm, e->backend_->native_stream(), &why);
      if (!e->device_comm_) fail("tensor parallelism on " + opt.device + ": " + why);
      e->step_graphs_ = StepGraphs(false);
    }
  }
  return e;
}

ShardPlan Engine::shard_plan() const {
  const int world = opt_.comm ? opt_.comm->size() : 1, want = std::max(opt_.tp, opt_.ep);
  if (world == 1 && want == 1) return {};
  TESSERA_CHECK(want == world, "--tp " + std::to_string(opt_.tp) + " --ep " + std::to_string(opt_.ep) +
                                   " needs " + std::to_string(want) + (want == 1 ? " rank" : " ranks") +
                                   "; the communicator has " + std::to_string(world));
  return {opt_.comm->rank(), opt_.tp, opt_.ep};
}

std::unique_ptr<Engine> Engine::synthetic(const ModelConfig& c, const EngineOptions& opt, DType act,
                                          int16_t quant) {
  auto e = make(opt);
  e->model_ = Model::synthetic(c, *e->backend_, act, 1, quant);
  e->model_->shard_parallel(e->shard_plan());
  e->init();
  return e;
}

std::unique_ptr<Engine> Engine::load(const std::filesystem::path& dir, const EngineOptions& opt) {
  auto e = make(opt);
  // Each layer keeps this rank's share as it is bound: a rank never holds the whole model.
  e->model_ = Model::load(dir, *e->backend_, opt.precision, opt.dequantize, e->shard_plan());
  if (e->model_->config().mask_id < 0 && !e->model_->config().is_uniform()) {  // uniform noise: no mask
    fail(dir.string() + "/config.json: no mask_token_id; a diffusion model needs its mask token");
  }
  e->init();
  return e;
}

void Engine::init() {
  KvPool::Budget& budget = *this;
  kv_ = std::make_unique<KvPool>(*backend_, budget, model_->config().max_positions, [this] {
    std::vector<size_t> rows;
    for_each_state(model_->graph(OutputMode::Sample, true),
                   [&](size_t, size_t, size_t row) { rows.push_back(row); });
    return rows;
  });
  // The prefix cache serves block-causal models only (their whole blocks' rows are exact for any
  // request that begins with them).
  if (opt_.prefix_cache_bytes > 0 && attention_block() > 0)
    prefix_ = std::make_unique<PrefixCache>(*backend_, opt_.prefix_cache_bytes);
  check_weights_fit();
}

Engine::~Engine() {
  prefix_.reset();
  kv_.reset();
  if (backend_ != nullptr) {
    step_graphs_.clear(*backend_);
    sparse_.buffer().free(*backend_);
    des_.free(*backend_);
  }
}

void Engine::check_token(int32_t t) const {
  const int64_t v = model_->config().vocab;
  if (t < 0 || t >= v)
    fail("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(v));
}

const graph::Program& Engine::run(OutputMode mode, std::span<const SeqInput> seqs, const SampleParams* sp) {
  const ModelConfig& cfg = model_->config();
  tokens_.clear();
  q_pos_.clear();
  cu_q_.clear();
  rows_.clear();
  keys_.clear();
  targets_.clear();
  cu_q_.push_back(0);
  seq_rows_.assign(1, 0);
  for (const SeqInput& s : seqs) {
    const auto n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) fail("forward: an empty sequence");
    if (n > cfg.max_positions) {
      fail("the canvas of " + std::to_string(n) + " tokens exceeds the model's context of " +
           std::to_string(cfg.max_positions) + " positions");
    }
    if (mode == OutputMode::LogProb && s.targets.size() != s.positions.size()) {
      fail("forward: one target per position expected");
    }
    const auto base = static_cast<int32_t>(tokens_.size());
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = s.tokens[static_cast<size_t>(i)];
      check_token(t);
      tokens_.push_back(t);
      q_pos_.push_back(static_cast<int32_t>(i));
    }
    for (size_t j = 0; j < s.positions.size(); ++j) {
      const int32_t pos = s.positions[j];
      check_position(pos, n);
      rows_.push_back(base + logit_row(pos));
      keys_.push_back(pos);
      if (mode == OutputMode::LogProb) targets_.push_back(s.targets[j]);
    }
    cu_q_.push_back(static_cast<int32_t>(tokens_.size()));
    seq_rows_.push_back(static_cast<int64_t>(rows_.size()));
  }
  k_pos_.assign(q_pos_.begin(), q_pos_.end());
  cu_k_.assign(cu_q_.begin(), cu_q_.end());
  des_.step_rows(q_pos_);
  graph::StepShape shape;
  shape.n_query = static_cast<int64_t>(tokens_.size());
  shape.n_kv = shape.n_query;
  shape.n_logits = static_cast<int64_t>(rows_.size());
  shape.n_seqs = static_cast<int64_t>(seqs.size());
  return execute_step(mode, false, shape, sp);
}

const graph::Program& Engine::execute_step(OutputMode mode, bool kv_cache, const graph::StepShape& shape,
                                           const SampleParams* sp) {
  const graph::GraphTemplate& g = model_->graph(mode, kv_cache, causal_, draft_);
  const graph::Program& prog = program_for(mode, shape, kv_cache);
  ws_->commit(prog.peak);

  ExecContext ctx;
  ctx.backend = backend_.get();
  ctx.base = static_cast<char*>(ws_->base());
  ctx.sample = sp;
  if (!seq_sp_.empty()) {
    ctx.sample_seqs = seq_sp_;
    ctx.sample_rows = seq_rows_;
  }
  ctx.dump_dir = opt_.dump_dir;
  if (opt_.profile_ops) {
    ctx.op_seconds = op_seconds_.data();
    ctx.op_flops = op_flops_.data();
    if (config().moe.n_experts > 0) {
      moe_traffic_.hidden = config().hidden;
      ctx.moe_traffic = &moe_traffic_;
    }
  }
  ctx.comm = collectives();
  if (kv_cache) {  // State tensors: their slices of the pool, kv_->rows() rows each
    const auto pool_rows = static_cast<size_t>(kv_->rows());
    state_ptrs_.assign(g.tensors().size(), nullptr);
    const size_t row = for_each_state(g, [&](size_t i, size_t before, size_t) {
      state_ptrs_[i] = static_cast<char*>(kv_->data()) + before * pool_rows;
    });
    TESSERA_CHECK(row * pool_rows <= kv_->bytes(),
                  "engine: internal error, the KV cache layout exceeds its buffer");
    ctx.state = &state_ptrs_;
    ctx.state_rows = kv_->rows();
  }
  ctx.sparse = sparse_.step(shape, kv_cache);
  ctx.des = des_.step(*backend_, shape);
  auto stage = [&](int id, const std::vector<int32_t>& v) {
    if (id < 0 || v.empty()) return;
    backend_->copy_to_device(ctx.base + prog.tensors[static_cast<size_t>(id)].offset, v.data(), v.size() * 4);
  };
  const GraphIo& ids = io(mode, kv_cache);
  stage(ids.tokens, tokens_);
  stage(ids.q_pos, q_pos_);
  stage(ids.k_pos, k_pos_);
  stage(ids.cu_q, cu_q_);
  stage(ids.cu_k, cu_k_);
  stage(ids.rows, rows_);
  stage(ids.keys, keys_);
  stage(ids.target, targets_);
  if (kv_cache) {
    stage(ids.cache_rows, cache_rows_);
    stage(ids.kv_rows, kv_rows_);
  }
  if (ids.sc_in >= 0) {  // self-conditioning: the caller's soft embeddings, else none (zeros)
    const size_t n = static_cast<size_t>(shape.n_query * model_->config().hidden);
    if (sc_.size() != n) sc_.assign(n, 0.0f);
    backend_->copy_to_device(ctx.base + prog.tensors[static_cast<size_t>(ids.sc_in)].offset, sc_.data(),
                             n * 4);
    sc_.clear();
  }
  step_graphs_.run(g, prog, prog.serial, ctx, kv_cache ? kv_->data() : nullptr, kv_cache ? kv_->rows() : 0);
  sparse_.step_done();
  des_.step_done(*backend_, model_->config());  // unique experts of this forward, per MoE layer
  return prog;
}

const Engine::GraphIo& Engine::io(OutputMode mode, bool kv_cache) {
  const auto m = static_cast<size_t>(mode), slot = m + kOutputModes * static_cast<size_t>(variant(kv_cache));
  if (!io_ready_[slot]) {
    const graph::GraphTemplate& g = model_->graph(mode, kv_cache, causal_, draft_);
    GraphIo& r = io_[slot];
    r.tokens = g.find("tokens");
    r.q_pos = g.find("q_pos");
    r.k_pos = g.find("k_pos");
    r.cu_q = g.find("cu_q");
    r.cu_k = g.find("cu_k");
    r.rows = g.find("logit_rows");
    r.keys = g.find("row_keys");
    r.target = g.find("target");
    if (kv_cache) {
      r.cache_rows = g.find("cache_rows");
      r.kv_rows = g.find("kv_rows");
    }
    r.sc_in = g.find("sc_in");
    r.argmax = g.find("argmax");
    r.soft = g.find("soft");
    const char* outs[kOutputModes][2] = {
        {"token", "conf"}, {"logits", nullptr}, {"logprob", nullptr}, {"token", "conf"}};
    for (int i = 0; i < 2; ++i) r.out[i] = outs[m][i] != nullptr ? g.find(outs[m][i]) : -1;
    if (mode == OutputMode::SampleLogprobs) {
      r.lp = g.find("logprob");
      r.top_ids = g.find("top_ids");
      r.top_lp = g.find("top_logprobs");
    }
    io_ready_[slot] = true;
  }
  return io_[slot];
}

void Engine::read_output(const graph::Program& p, int id, void* dst, size_t bytes) {
  TESSERA_CHECK(id >= 0, "engine: the graph lacks this output");
  TESSERA_CHECK(p.tensors[static_cast<size_t>(id)].bytes == bytes, "engine: output size mismatch");
  if (bytes == 0) return;
  backend_->copy_to_host(dst, static_cast<char*>(ws_->base()) + p.tensors[static_cast<size_t>(id)].offset,
                         bytes);
}

namespace {
// The mode of a sampling forward: with the log-probabilities when any of its sequences asks for them.
OutputMode sample_mode(const SampleParams& sp, std::span<const SampleParams> seqs) {
  bool lp = sp.logprobs;
  for (const SampleParams& s : seqs) lp = lp || s.logprobs;
  return lp ? OutputMode::SampleLogprobs : OutputMode::Sample;
}
}  // namespace

void Engine::read_sample(const graph::Program& p, OutputMode mode, bool kv_cache, std::span<int32_t> tokens,
                         std::span<float> conf) {
  const GraphIo& ids = io(mode, kv_cache);
  read_output(p, ids.out[0], tokens.data(), tokens.size_bytes());
  read_output(p, ids.out[1], conf.data(), conf.size_bytes());
  if (mode != OutputMode::SampleLogprobs) return;
  const size_t n = tokens.size();
  logprobs_.top = std::min(kTopLogprobs, model_->config().vocab);
  logprobs_.chosen.resize(n);
  logprobs_.top_ids.resize(n * static_cast<size_t>(logprobs_.top));
  logprobs_.top_lp.resize(logprobs_.top_ids.size());
  read_output(p, ids.lp, logprobs_.chosen.data(), n * sizeof(float));
  read_output(p, ids.top_ids, logprobs_.top_ids.data(), logprobs_.top_ids.size() * sizeof(int32_t));
  read_output(p, ids.top_lp, logprobs_.top_lp.data(), logprobs_.top_lp.size() * sizeof(float));
}

void Engine::forward_sample(std::span<const SeqInput> seqs, const SampleParams& sp, std::span<int32_t> tokens,
                            std::span<float> conf) {
  const OutputMode mode = sample_mode(sp, seq_sp_);
  const graph::Program& p = run(mode, seqs, &sp);
  read_sample(p, mode, false, tokens, conf);
}

void Engine::forward_sample(std::span<const SeqInput> seqs, std::span<const SampleParams> sps,
                            std::span<int32_t> tokens, std::span<float> conf) {
  if (sps.size() != seqs.size()) fail("forward_sample: one SampleParams per sequence expected");
  const PerSequenceSampling scoped(seq_sp_, sps);
  forward_sample(seqs, sps.empty() ? SampleParams{} : sps[0], tokens, conf);
}

void Engine::forward_logits(std::span<const SeqInput> seqs, std::span<float> logits) {
  const graph::Program& p = run(OutputMode::Logits, seqs, nullptr);
  read_output(p, io(OutputMode::Logits).out[0], logits.data(), logits.size_bytes());
}

void Engine::forward_logprob(std::span<const SeqInput> seqs, std::span<float> logprob) {
  const graph::Program& p = run(OutputMode::LogProb, seqs, nullptr);
  read_output(p, io(OutputMode::LogProb).out[0], logprob.data(), logprob.size_bytes());
}

void Engine::predict(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                     const SampleParams& sp, std::span<int32_t> tokens, std::span<float> conf) {
  const SeqInput s{canvas, positions};
  forward_sample(std::span<const SeqInput>(&s, 1), sp, tokens, conf);
}

void Engine::logits(std::span<const int32_t> canvas, std::span<const int32_t> positions,
                    std::span<float> out) {
  const SeqInput s{canvas, positions};
  forward_logits(std::span<const SeqInput>(&s, 1), out);
}

int Engine::kv_open(int64_t capacity) {
  return kv_->open(capacity, attention_block());
}

void Engine::kv_reset(int slot, int64_t capacity) {
  kv_->reset(slot, capacity, attention_block());
  if (static_cast<size_t>(slot) < prefix_pending_.size()) prefix_pending_[static_cast<size_t>(slot)] = {};
}

void Engine::kv_cache_reset(int64_t capacity) {
  kv_reset(0, capacity);
}

void Engine::kv_cache_end() {
  kv_close(0);
  if (stream_slot_ >= 0) kv_close(stream_slot_);
  stream_slot_ = -1;
}

void Engine::kv_stream_reset(int stream, int64_t capacity) {
  TESSERA_CHECK(stream == 1,
                "KV cache: stream " + std::to_string(stream) + " is not a second stream (use 1)");
  if (stream_slot_ >= 0)
    kv_reset(stream_slot_, capacity);
  else
    stream_slot_ = kv_open(capacity);
}

void Engine::logits_rows(int stream, std::span<const int32_t> canvas, std::span<const int32_t> rows,
                         std::span<const int32_t> positions, std::span<float> out) {
  TESSERA_CHECK(
      stream == 0 || (stream == 1 && stream_slot_ >= 0),
      "KV cache: stream " + std::to_string(stream) + " is not open (kv_stream_reset opens stream 1)");
  const CachedSeq s{stream == 0 ? 0 : stream_slot_, canvas, rows, positions};
  forward_cached_logits(std::span<const CachedSeq>(&s, 1), out);
}

bool Engine::kv_fits(int64_t capacity) const {
  return kv_->fits(capacity);
}

void Engine::kv_close(int slot) {
  kv_->close(slot);
  if (slot >= 0 && static_cast<size_t>(slot) < prefix_pending_.size())
    prefix_pending_[static_cast<size_t>(slot)] = {};
}

int Engine::kv_slots_open() const {
  return kv_->slots_open();
}

void Engine::predict_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                            std::span<const int32_t> positions, const SampleParams& sp,
                            std::span<int32_t> tokens, std::span<float> conf) {
  cached_range(q_lo, q_hi, static_cast<int64_t>(canvas.size()), req_rows_);
  predict_rows(canvas, req_rows_, positions, sp, tokens, conf);
}

void Engine::predict_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                          std::span<const int32_t> positions, const SampleParams& sp,
                          std::span<int32_t> tokens, std::span<float> conf) {
  const CachedSeq s{0, canvas, rows, positions};
  const OutputMode mode = sample_mode(sp, {});
  const graph::Program& p = run_cached(mode, std::span<const CachedSeq>(&s, 1), &sp);
  read_sample(p, mode, true, tokens, conf);
}

void Engine::logits_cached(std::span<const int32_t> canvas, int64_t q_lo, int64_t q_hi,
                           std::span<const int32_t> positions, std::span<float> out) {
  cached_range(q_lo, q_hi, static_cast<int64_t>(canvas.size()), req_rows_);
  logits_rows(canvas, req_rows_, positions, out);
}

void Engine::logits_rows(std::span<const int32_t> canvas, std::span<const int32_t> rows,
                         std::span<const int32_t> positions, std::span<float> out) {
  const CachedSeq s{0, canvas, rows, positions};
  forward_cached_logits(std::span<const CachedSeq>(&s, 1), out);
}

void Engine::forward_cached(std::span<const CachedSeq> seqs, std::span<const SampleParams> sps,
                            std::span<int32_t> tokens, std::span<float> conf) {
  if (sps.size() != seqs.size() || seqs.empty())
    fail("forward_cached: one SampleParams per sequence, and at least one sequence, expected");
  const PerSequenceSampling scoped(seq_sp_, sps);
  const OutputMode mode = sample_mode(sps[0], sps);
  const graph::Program& p = run_cached(mode, seqs, &sps[0]);
  read_sample(p, mode, true, tokens, conf);
}

void Engine::forward_cached_logits(std::span<const CachedSeq> seqs, std::span<float> logits) {
  const graph::Program& p = run_cached(OutputMode::Logits, seqs, nullptr);
  read_output(p, io(OutputMode::Logits, true).out[0], logits.data(), logits.size_bytes());
}

void Engine::cached_rows(const CachedSeq& s, std::vector<int32_t>& out) {
  const auto n = static_cast<int64_t>(s.canvas.size());
  kv_->begin_step(s.slot, n, attention_block());
  // The computed rows: `rows` (ascending, distinct, inside the canvas) and the logit rows of `positions`.
  out.clear();
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const int32_t r = s.rows[i];
    if (r < 0 || r >= n || (i > 0 && r <= s.rows[i - 1])) {
      fail("KV cache: the computed rows must be ascending, distinct rows of the canvas of " +
           std::to_string(n) + " (row " + std::to_string(r) + " at index " + std::to_string(i) + ")");
    }
    out.push_back(r);
  }
  for (const int32_t pos : s.positions) {
    check_position(pos, n);
    const int32_t row = logit_row(pos);
    if (!std::binary_search(s.rows.begin(), s.rows.end(), row)) out.push_back(row);
  }
  if (out.size() > s.rows.size()) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  TESSERA_CHECK(!out.empty(), "KV cache: a step must compute at least one row");
  // A causal step's keys end at its last computed row (no computed row sees a later one).
  kv_->check_written(s.slot, causal_ ? out.back() + 1 : n, out);
}

void Engine::check_position(int32_t pos, int64_t n) const {
  if (pos < 0 || pos >= n) fail("forward: position " + std::to_string(pos) + " is outside the canvas");
  if (causal_ && pos == 0) fail("forward: a causal forward predicts no position 0 (nothing precedes it)");
}

void Engine::set_draft_adapter(bool on) {
  TESSERA_CHECK(!on || supports_draft_adapter(), "this model has no draft adapter (linear_spec_lora)");
  draft_ = on;
}

void Engine::denoise_canvas(std::span<const int32_t> canvas, int64_t lo, int64_t hi,
                            std::span<const float> sc, const SampleParams& sp, CanvasPrediction& out) {
  TESSERA_CHECK(supports_uniform_canvas(), "this model has no uniform-noise canvases");
  TESSERA_CHECK(!causal_, "denoise_canvas: a causal forward is selected (set_causal(false) first)");
  TESSERA_CHECK(sp.temperature > 0.0f, "denoise_canvas: the temperature must be positive");
  const int64_t n = hi - lo, H = soft_width();
  cached_range(lo, hi, static_cast<int64_t>(canvas.size()), req_rows_);
  set_soft_input(sc, n, "denoise_canvas");
  const CachedSeq s{0, canvas, req_rows_, req_rows_};
  const graph::Program& p = run_cached(OutputMode::Sample, std::span<const CachedSeq>(&s, 1), &sp);
  const GraphIo& ids = io(OutputMode::Sample, true);
  TESSERA_CHECK(ids.argmax >= 0 && ids.soft >= 0, "denoise_canvas: the model's graph has no canvas outputs");
  out.sampled.resize(static_cast<size_t>(n));
  out.argmax.resize(static_cast<size_t>(n));
  out.entropy.resize(static_cast<size_t>(n));
  out.soft.resize(static_cast<size_t>(n * H));
  read_output(p, ids.out[0], out.sampled.data(), out.sampled.size() * 4);
  read_output(p, ids.out[1], out.entropy.data(), out.entropy.size() * 4);
  read_output(p, ids.argmax, out.argmax.data(), out.argmax.size() * 4);
  read_output(p, ids.soft, out.soft.data(), out.soft.size() * 4);
}

void Engine::logits_canvas(std::span<const int32_t> canvas, int64_t lo, int64_t hi, std::span<const float> sc,
                           std::span<float> out) {
  TESSERA_CHECK(supports_uniform_canvas() && !causal_,
                "logits_canvas: a uniform-noise model's decoder expected");
  cached_range(lo, hi, static_cast<int64_t>(canvas.size()), req_rows_);
  set_soft_input(sc, hi - lo, "logits_canvas");
  logits_rows(canvas, req_rows_, req_rows_, out);
}

void Engine::set_soft_input(std::span<const float> sc, int64_t rows, const char* who) {
  TESSERA_CHECK(sc.empty() || static_cast<int64_t>(sc.size()) == rows * soft_width(),
                std::string(who) + ": the soft embeddings must be [rows, hidden]");
  sc_.assign(sc.begin(), sc.end());  // empty: execute_step stages zeros (no self-conditioning)
}

void Engine::set_causal(bool causal) {
  TESSERA_CHECK(!causal || supports_causal(),
                std::string("the ") + family_name(model_->config().family) +
                    " model has no causal mode (autoregressive decoding needs a tri-mode model such as "
                    "Nemotron-Labs-Diffusion)");
  causal_ = causal;
}

const graph::Program& Engine::run_cached(OutputMode mode, std::span<const CachedSeq> seqs,
                                         const SampleParams* sp) {
  TESSERA_CHECK(!seqs.empty(), "KV cache: a step needs at least one sequence");
  tokens_.clear();
  q_pos_.clear();
  k_pos_.clear();
  cache_rows_.clear();
  kv_rows_.clear();
  rows_.clear();
  keys_.clear();
  targets_.clear();
  cu_q_.assign(1, 0);
  cu_k_.assign(1, 0);
  seq_rows_.assign(1, 0);
  for (const CachedSeq& s : seqs) {
    for (const int32_t t : s.canvas) check_token(t);
    cached_rows(s, seq_q_);
    const int64_t base = kv_->base(s.slot);
    const auto q0 = static_cast<int32_t>(q_pos_.size());
    for (const int32_t r : seq_q_) {
      tokens_.push_back(s.canvas[static_cast<size_t>(r)]);
      q_pos_.push_back(r);
      cache_rows_.push_back(static_cast<int32_t>(base + r));
    }
    // Keys: the whole canvas; a causal step's end at its last computed row (cached_rows).
    const auto n = causal_ ? seq_q_.back() + 1 : static_cast<int32_t>(s.canvas.size());
    for (int32_t i = 0; i < n; ++i) {
      k_pos_.push_back(i);
      kv_rows_.push_back(static_cast<int32_t>(base + i));
    }
    for (const int32_t pos : s.positions) {
      const auto it = std::lower_bound(seq_q_.begin(), seq_q_.end(), logit_row(pos));
      rows_.push_back(q0 + static_cast<int32_t>(it - seq_q_.begin()));
      keys_.push_back(pos);
    }
    cu_q_.push_back(static_cast<int32_t>(q_pos_.size()));
    cu_k_.push_back(static_cast<int32_t>(k_pos_.size()));
    seq_rows_.push_back(static_cast<int64_t>(rows_.size()));
  }
  graph::StepShape shape;
  shape.n_query = static_cast<int64_t>(q_pos_.size());
  shape.n_kv = static_cast<int64_t>(k_pos_.size());
  shape.n_logits = static_cast<int64_t>(rows_.size());
  shape.n_seqs = static_cast<int64_t>(seqs.size());
  des_.step_rows(q_pos_);
  const graph::Program& p = execute_step(mode, true, shape, sp);
  for (size_t s = 0; s < seqs.size(); ++s) {
    kv_->mark_written(seqs[s].slot,
                      std::span<const int32_t>(q_pos_).subspan(static_cast<size_t>(cu_q_[s]),
                                                               static_cast<size_t>(cu_q_[s + 1] - cu_q_[s])));
    publish_prefix(seqs[s].slot);
  }
  return p;
}

void Engine::sparse_begin(int64_t canvas_len, const SparseConfig& c) {
  const ModelConfig& cfg = model_->config();
  const bool causal = model_->options().mask == MaskKind::Causal;
  const size_t bytes = SparseState::check(cfg, causal, canvas_len, c);
  // A cached step reads the pattern by position, which only the CPU kernel does (so does a block-causal
  // model's selection): refused before work.
  TESSERA_CHECK(attention_block() == 0 || backend_->device() == Device::CPU,
                "sparse attention on a block-causal model runs on the CPU backend only; turn sparse off on " +
                    backend_->name());
  TESSERA_CHECK(
      !kv_->is_open(0) || backend_->device() == Device::CPU,
      "sparse attention with a KV cache (or the window's phase cache) runs on the CPU backend only; use "
      "cache none and window-refresh 0 on " +
          backend_->name());
  if (bytes > sparse_.bytes())
    grow_held(sparse_.buffer(), bytes, SparseState::describe(canvas_len, c, bytes));
  sparse_.begin(canvas_len, c, bytes, cfg.n_layers, attention_block());
}

void Engine::sparse_phase(SparsePhase p) {
  sparse_.set_phase(p);
}

std::vector<uint8_t> Engine::sparse_patterns() const {
  return sparse_.patterns(*backend_, model_->config().n_layers);
}

bool Engine::supports_expert_sharing() const {
  return model_->config().moe.n_experts > 0;
}

void Engine::check_des(const DesConfig& c) const {
  DesState::check(model_->config(), c);
}

void Engine::des_begin(const DesConfig& c) {
  des_.begin(*backend_, model_->config(), c);
}

void Engine::des_rows(int64_t lo, int64_t hi) {
  des_.set_rows(lo, hi);
}

int Engine::attention_block() const {
  return model_->options().mask == MaskKind::BlockCausal ? model_->options().mask_block : 0;
}

void Engine::set_attention_block(int block) {
  if (block == attention_block()) return;
  model_->set_mask_block(block);
  plans_.clear();  // programs were instantiated from the previous graphs
  step_graphs_.clear(*backend_);
  for (bool& r : io_ready_) r = false;
  // (a KV cache slot's rows computed under the old mask are dropped at its next step: cached_rows)
}

std::string format_op_seconds(const std::array<double, graph::kOpKinds>& seconds, double per,
                              const std::array<double, graph::kOpKinds>* flops) {
  std::vector<int> kinds;
  double total = 0;
  for (int k = 0; k < graph::kOpKinds; ++k) {
    total += seconds[static_cast<size_t>(k)];
    if (seconds[static_cast<size_t>(k)] > 0) kinds.push_back(k);
  }
  std::stable_sort(kinds.begin(), kinds.end(), [&](int a, int b) {
    return seconds[static_cast<size_t>(a)] > seconds[static_cast<size_t>(b)];
  });
  std::string out;
  char buf[96];
  for (int k : kinds) {
    const double sec = seconds[static_cast<size_t>(k)];
    const double f = flops != nullptr ? (*flops)[static_cast<size_t>(k)] : 0.0;
    if (f > 0)
      std::snprintf(buf, sizeof buf, "%s%s %.3f s (%.0f%%, %.0f GFLOP/s)", out.empty() ? "" : ", ",
                    graph::op_name(static_cast<graph::OpKind>(k)), sec / per, 100.0 * sec / total,
                    f / sec / 1e9);
    else
      std::snprintf(buf, sizeof buf, "%s%s %.3f s (%.0f%%)", out.empty() ? "" : ", ",
                    graph::op_name(static_cast<graph::OpKind>(k)), sec / per, 100.0 * sec / total);
    out += buf;
  }
  return out;
}

}  // namespace tessera
