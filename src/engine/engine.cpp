#include "engine/engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "memory/chunk_optimizer.h"

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
  if (opt.device == "cpu") {
    e->backend_ = make_cpu_backend();
    e->ws_ = make_cpu_workspace(opt.reserve_bytes);
  } else if (opt.device == "cuda") {
    std::string why;
    e->backend_ = make_cuda_backend(&why);
    if (!e->backend_) fail("--device cuda: " + why);
    e->ws_ = make_cuda_workspace(opt.reserve_bytes);
  } else {
    fail("unknown device '" + opt.device + "' (use cpu or cuda)");
  }
  return e;
}

std::unique_ptr<Engine> Engine::synthetic(const ModelConfig& c, const EngineOptions& opt, DType act) {
  auto e = make(opt);
  e->model_ = Model::synthetic(c, *e->backend_, act);
  e->check_weights_fit();
  return e;
}

std::unique_ptr<Engine> Engine::load(const std::filesystem::path& dir, const EngineOptions& opt) {
  auto e = make(opt);
  e->model_ = Model::load(dir, *e->backend_, opt.precision, opt.dequantize);
  if (e->model_->config().mask_id < 0) {
    fail(dir.string() + "/config.json: no mask_token_id; a diffusion model needs its mask token");
  }
  e->check_weights_fit();
  return e;
}

Engine::~Engine() {
  if (kv_buf_ != nullptr) backend_->free_weights(kv_buf_);
  if (sparse_buf_ != nullptr) backend_->free_weights(sparse_buf_);
  if (des_buf_ != nullptr) backend_->free_weights(des_buf_);
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
      if (pos < 0 || pos >= n) fail("forward: position " + std::to_string(pos) + " is outside the canvas");
      rows_.push_back(base + logit_row(pos));
      keys_.push_back(pos);
      if (mode == OutputMode::LogProb) targets_.push_back(s.targets[j]);
    }
    cu_q_.push_back(static_cast<int32_t>(tokens_.size()));
    seq_rows_.push_back(static_cast<int64_t>(rows_.size()));
  }
  k_pos_.assign(q_pos_.begin(), q_pos_.end());
  cu_k_.assign(cu_q_.begin(), cu_q_.end());
  des_step_rows(q_pos_);
  graph::StepShape shape;
  shape.n_query = static_cast<int64_t>(tokens_.size());
  shape.n_kv = shape.n_query;
  shape.n_logits = static_cast<int64_t>(rows_.size());
  shape.n_seqs = static_cast<int64_t>(seqs.size());
  return execute_step(mode, false, shape, sp);
}

const graph::Program& Engine::execute_step(OutputMode mode, bool kv_cache, const graph::StepShape& shape,
                                           const SampleParams* sp) {
  const graph::GraphTemplate& g = model_->graph(mode, kv_cache);
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
  if (opt_.profile_ops) ctx.op_seconds = op_seconds_.data();
  if (kv_cache) {  // State tensors: their slices of the pool, kv_pool_rows_ rows each
    state_ptrs_.assign(g.tensors().size(), nullptr);
    const size_t row = for_each_state(g, [&](size_t i, size_t before, size_t) {
      state_ptrs_[i] = static_cast<char*>(kv_buf_) + before * static_cast<size_t>(kv_pool_rows_);
    });
    TESSERA_CHECK(row * static_cast<size_t>(kv_pool_rows_) <= kv_bytes_,
                  "engine: internal error, the KV cache layout exceeds its buffer");
    ctx.state = &state_ptrs_;
    ctx.state_rows = kv_pool_rows_;
  }
  const bool sparse = sparse_on_ && sparse_phase_ != SparsePhase::Dense;
  if (sparse) {
    TESSERA_CHECK(
        !kv_cache && shape.n_seqs == 1 && shape.n_query == sparse_canvas_ && shape.n_kv == sparse_canvas_,
        "sparse attention: the patterns are for one uncached canvas of " + std::to_string(sparse_canvas_) +
            " positions; this forward has " + std::to_string(shape.n_seqs) + " sequence(s) of " +
            std::to_string(shape.n_query) + " query and " + std::to_string(shape.n_kv) + " key rows");
    sparse_exec_.select = sparse_phase_ == SparsePhase::Select;
    ctx.sparse = &sparse_exec_;
  }
  if (des_on_) {
    TESSERA_CHECK(shape.n_seqs == 1, "expert sharing: one sequence per forward (this forward has " +
                                         std::to_string(shape.n_seqs) + ")");
    std::fill(des_host_.begin(), des_host_.end(), 0.0f);
    backend_->copy_to_device(des_buf_, des_host_.data(), des_bytes_);
    ctx.des = &des_exec_;
  }
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
  execute(g, prog, ctx);
  if (sparse && sparse_exec_.select) sparse_ready_ = true;
  if (des_on_) {  // unique experts of this forward, per MoE layer
    backend_->synchronize();
    backend_->copy_to_host(des_host_.data(), des_buf_, des_bytes_);
    const ModelConfig& cfg = model_->config();
    const auto E = static_cast<size_t>(cfg.moe.n_experts);
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      if (!cfg.is_moe_layer(l)) continue;
      const float* st = des_host_.data() + static_cast<size_t>(l) * des_exec_.layer_floats;
      for (size_t e = 0; e < E; ++e) {
        des_stats_.unique += st[2 * E + e] > 0.0f ? 1 : 0;
        des_stats_.unique_voting += st[3 * E + e] > 0.0f ? 1 : 0;
        des_stats_.coreset += st[4 * E + e] > 0.0f ? 1 : 0;
      }
      ++des_stats_.layer_forwards;
    }
    ++des_stats_.forwards;
  }
  return prog;
}

const graph::Program& Engine::program_for(OutputMode mode, graph::StepShape shape, bool kv_cache) {
  size_t floor = 0;
  const graph::Program* p = try_program(mode, shape, kv_cache, floor);
  if (p == nullptr) fail_budget(mode, shape, floor);
  return *p;
}

const graph::Program* Engine::try_program(OutputMode mode, graph::StepShape shape, bool kv_cache,
                                          size_t& floor) {
  const PlanKey key{static_cast<int>(mode) + (kv_cache ? kOutputModes : 0), shape.n_query, shape.n_kv,
                    shape.n_logits, shape.n_seqs};
  auto it = plans_.find(key);
  last_.plan_cached = it != plans_.end();
  if (it == plans_.end()) {
    const graph::GraphTemplate& g = model_->graph(mode, kv_cache);
    CachedPlan c;
    shape.k_ffn = opt_.k_ffn;
    shape.k_logits = opt_.k_logits;
    if (opt_.memory_budget > 0) {  // lazy chunking: the smallest chunk counts whose plan fits
      memory::ChunkChoice choice = memory::choose_chunks(g, shape, activation_budget(), opt_.fit);
      if (!choice.fits && release_idle())  // what an ended request left held is freed first
        choice = memory::choose_chunks(g, shape, activation_budget(), opt_.fit);
      if (!choice.fits) {
        floor = choice.floor;
        return nullptr;
      }
      shape.k_ffn = choice.k_ffn;
      shape.k_logits = choice.k_logits;
      c.search_ms = choice.search_ms;
      c.search_plans = choice.plans;
    }
    c.prog = graph::instantiate(g, shape);
    memory::plan(g, c.prog, opt_.fit);
    if (plans_.size() >= 256) plans_.clear();
    it = plans_.emplace(key, std::move(c)).first;
  }
  const CachedPlan& c = it->second;
  last_.shape = c.prog.shape;
  last_.planned_peak = c.prog.peak;
  last_.lower_bound = c.prog.lower_bound;
  last_.plan_ms = c.prog.plan_ms;
  last_.search_ms = c.search_ms;
  last_.search_plans = c.search_plans;
  max_peak_ = std::max(max_peak_, c.prog.peak);
  return &c.prog;
}

bool Engine::packed_step_fits(OutputMode mode, std::span<const SeqInput> seqs) {
  if (opt_.memory_budget == 0) return true;
  graph::StepShape s;
  for (const SeqInput& q : seqs) {
    s.n_query += static_cast<int64_t>(q.tokens.size());
    s.n_logits += static_cast<int64_t>(q.positions.size());
  }
  s.n_kv = s.n_query;
  s.n_seqs = static_cast<int64_t>(seqs.size());
  size_t floor = 0;
  return try_program(mode, s, false, floor) != nullptr;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss = std::stoul(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) m.peak = std::stoul(line.substr(6)) * 1024;
  }
  return m;
}

void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

size_t Engine::workspace_resident() const {
  if (backend_->device() != Device::CPU || ws_->committed() == 0) return ws_->committed();
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v(ws_->committed() / page);
  if (mincore(ws_->base(), ws_->committed(), v.data()) != 0) return ws_->committed();
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n * page;
}

size_t Engine::activation_budget() const {
  const size_t w = (model_ ? model_->weight_bytes() : 0) + kv_bytes_ + sparse_bytes_;
  return opt_.memory_budget > w ? opt_.memory_budget - w : 0;
}

void Engine::check_weights_fit() const {
  if (opt_.memory_budget == 0 || model_->weight_bytes() < opt_.memory_budget) return;
  fail("memory budget " + memory::format_bytes(static_cast<double>(opt_.memory_budget)) +
       " is not larger than the weights alone (" +
       memory::format_bytes(static_cast<double>(model_->weight_bytes())) +
       "): no context fits; the budget counts the weights plus the planned activations");
}

void Engine::check_memory(int64_t n_tokens, int64_t n_logits, OutputMode mode, bool kv_cache) {
  graph::StepShape s;
  s.n_query = s.n_kv = n_tokens;
  s.n_logits = std::min(n_logits, n_tokens);
  program_for(mode, s, kv_cache);
}

void Engine::fail_budget(OutputMode mode, const graph::StepShape& shape, size_t floor) {
  const double ratio =
      shape.n_query > 0 ? static_cast<double>(shape.n_logits) / static_cast<double>(shape.n_query) : 0;
  // A KV cache and SparseD patterns held for the request grow with the context too.
  const size_t per_token = kv_bytes_ > 0 ? kv_row_bytes_ : 0;
  const int64_t sparse_block = sparse_on_ ? sparse_exec_.p.block : 0;
  const size_t budget =
      activation_budget() + (per_token > 0 ? kv_bytes_ : 0) + (sparse_on_ ? sparse_bytes_ : 0);
  const ModelConfig& cfg = model_->config();
  const int64_t l_max = memory::largest_context(model_->graph(mode), ratio, budget, [&](int64_t L) {
    return static_cast<size_t>(L) * per_token +
           (sparse_block > 0 ? static_cast<size_t>(cfg.sparse_pattern_bytes(L, sparse_block)) : 0);
  });
  char r[32];
  std::snprintf(r, sizeof r, "%.3g", ratio);
  const auto gib = [](size_t b) { return memory::format_bytes(static_cast<double>(b)); };
  fail("memory budget " + gib(opt_.memory_budget) + " (" + std::to_string(opt_.memory_budget) +
       " bytes) is too small for a step of " + std::to_string(shape.n_query) + " tokens with " +
       std::to_string(shape.n_logits) + " logit rows: the weights take " + gib(model_->weight_bytes()) +
       " and the activations need at least " + gib(floor) +
       " (the non-chunkable floor: FFN and logits chunked to one row), " +
       gib(model_->weight_bytes() + floor) + " (" + std::to_string(model_->weight_bytes() + floor) +
       " bytes) in all. The largest context that fits this budget is " + std::to_string(l_max) +
       " tokens (at the same mask ratio " + r + "); raise the budget or shorten the request.");
}

const Engine::GraphIo& Engine::io(OutputMode mode, bool kv_cache) {
  const auto m = static_cast<size_t>(mode), slot = m + (kv_cache ? kOutputModes : 0);
  if (!io_ready_[slot]) {
    const graph::GraphTemplate& g = model_->graph(mode, kv_cache);
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

bool Engine::held_fits(size_t others, size_t bytes) const {
  return opt_.memory_budget == 0 || model_->weight_bytes() + others + bytes < opt_.memory_budget;
}

void Engine::check_held(size_t others, size_t bytes, const std::string& what) const {
  if (held_fits(others, bytes)) return;
  fail(
      "memory budget " + memory::format_bytes(static_cast<double>(opt_.memory_budget)) +
      " cannot hold the weights (" + memory::format_bytes(static_cast<double>(model_->weight_bytes())) + ")" +
      (others > 0
           ? " and what the requests already hold (" + memory::format_bytes(static_cast<double>(others)) + ")"
           : std::string()) +
      " plus " + what);
}

bool Engine::release_idle() {
  bool freed = false;
  if (kv_buf_ != nullptr && kv_slots_open() == 0) {
    backend_->free_weights(kv_buf_);
    kv_buf_ = nullptr;
    kv_bytes_ = 0;
    kv_pool_rows_ = 0;
    freed = true;
  }
  if (sparse_buf_ != nullptr && !sparse_on_) {
    backend_->free_weights(sparse_buf_);
    sparse_buf_ = nullptr;
    sparse_bytes_ = 0;
    sparse_canvas_ = 0;
    sparse_ready_ = false;
    freed = true;
  }
  if (freed) plans_.clear();
  return freed;
}

void Engine::grow_held(void*& buf, size_t& held, size_t bytes, const std::string& what) {
  // What is held besides this buffer (`held` is kv_bytes_ or sparse_bytes_: release_idle may zero it).
  if (!held_fits(kv_bytes_ + sparse_bytes_ - held, bytes)) release_idle();
  check_held(kv_bytes_ + sparse_bytes_ - held, bytes, what);
  if (buf != nullptr) backend_->free_weights(buf);
  buf = nullptr;
  held = 0;
  buf = backend_->alloc_weights(bytes);
  held = bytes;
  if (opt_.memory_budget > 0) plans_.clear();  // the activation budget shrank
}

int64_t Engine::kv_base(int64_t capacity) const {
  std::vector<std::pair<int64_t, int64_t>> used;  // [base, end) of the open regions, by base
  for (const KvSlot& k : kv_slots_)
    if (k.open) used.emplace_back(k.base, k.base + k.capacity);
  std::sort(used.begin(), used.end());
  int64_t at = 0;
  for (const auto& [lo, hi] : used) {
    if (lo - at >= capacity) return at;
    at = std::max(at, hi);
  }
  return at;
}

void Engine::kv_grow(int64_t rows, const std::string& what) {
  bool live = false;  // rows of open slots that must move into the new pool
  for (const KvSlot& k : kv_slots_) live = live || k.open;
  if (!live) {  // nothing to keep: the old pool goes first
    grow_held(kv_buf_, kv_bytes_, kv_row_bytes_ * static_cast<size_t>(rows), what);
    kv_pool_rows_ = rows;
    return;
  }
  const size_t bytes = kv_row_bytes_ * static_cast<size_t>(rows);
  if (!held_fits(kv_bytes_ + sparse_bytes_, bytes)) release_idle();  // (idle patterns only: rows are live)
  check_held(kv_bytes_ + sparse_bytes_, bytes,
             what + ", while the pool grows (the caches held are copied into the grown pool)");
  void* grown = backend_->alloc_weights(bytes);
  // Each State tensor's slice keeps its first kv_pool_rows_ rows.
  const auto old_rows = static_cast<size_t>(kv_pool_rows_);
  for_each_state(model_->graph(OutputMode::Sample, true), [&](size_t, size_t before, size_t row) {
    backend_->copy_on_device(static_cast<char*>(grown) + before * static_cast<size_t>(rows),
                             static_cast<char*>(kv_buf_) + before * old_rows, row * old_rows);
  });
  backend_->synchronize();
  backend_->free_weights(kv_buf_);
  kv_buf_ = grown;
  kv_bytes_ = bytes;
  kv_pool_rows_ = rows;
  if (opt_.memory_budget > 0) plans_.clear();  // the activation budget shrank
}

void Engine::kv_place(int slot, int64_t capacity) {
  const ModelConfig& cfg = model_->config();
  TESSERA_CHECK(capacity > 0 && capacity <= cfg.max_positions,
                "KV cache: a canvas of " + std::to_string(capacity) + " positions does not fit the model's " +
                    std::to_string(cfg.max_positions) + " positions");
  if (kv_row_bytes_ == 0)  // one canvas row of every State tensor
    kv_row_bytes_ = for_each_state(model_->graph(OutputMode::Sample, true), [](size_t, size_t, size_t) {});
  if (kv_slots_.size() <= static_cast<size_t>(slot)) kv_slots_.resize(static_cast<size_t>(slot) + 1);
  kv_slots_[static_cast<size_t>(slot)].open = false;
  const int64_t base = kv_base(capacity);
  if (base + capacity > kv_pool_rows_) {
    // Without a budget a pool that moves live rows grows by half at least, so that growth stays rare.
    int64_t rows = base + capacity;
    if (opt_.memory_budget == 0 && kv_slots_open() > 0)
      rows = std::max(rows, kv_pool_rows_ + kv_pool_rows_ / 2);
    const size_t bytes = kv_row_bytes_ * static_cast<size_t>(capacity);
    kv_grow(rows, "a KV cache of " + std::to_string(capacity) + " positions (" +
                      memory::format_bytes(static_cast<double>(bytes)) +
                      ", K and V of every layer in the compute dtype)");
  }
  KvSlot& k = kv_slots_[static_cast<size_t>(slot)];
  k.open = true;
  k.base = base;
  k.capacity = capacity;
  k.block = attention_block();
  k.written.assign(static_cast<size_t>(capacity), 0);
}

int Engine::kv_open(int64_t capacity) {
  size_t slot = 1;  // slot 0 is the engine's own
  while (slot < kv_slots_.size() && kv_slots_[slot].open) ++slot;
  kv_place(static_cast<int>(slot), capacity);
  return static_cast<int>(slot);
}

bool Engine::kv_fits(int64_t capacity) const {
  if (opt_.memory_budget == 0 || kv_row_bytes_ == 0) return true;  // (no pool yet: kv_open checks it)
  const int64_t need = kv_base(capacity) + capacity;
  if (need <= kv_pool_rows_) return true;
  // As kv_grow: with live rows the old pool is held while they are copied into the grown one.
  // Idle patterns would be freed first (release_idle).
  return held_fits((sparse_on_ ? sparse_bytes_ : 0) + (kv_slots_open() > 0 ? kv_bytes_ : 0),
                   kv_row_bytes_ * static_cast<size_t>(need));
}

void Engine::kv_close(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= kv_slots_.size()) return;
  KvSlot& k = kv_slots_[static_cast<size_t>(slot)];
  k.open = false;
  k.written = {};
}

int Engine::kv_slots_open() const {
  int n = 0;
  for (const KvSlot& k : kv_slots_) n += k.open ? 1 : 0;
  return n;
}

void Engine::kv_reset(int slot, int64_t capacity) {
  TESSERA_CHECK(slot >= 0, "KV cache: no slot " + std::to_string(slot));
  if (static_cast<size_t>(slot) < kv_slots_.size() && kv_slots_[static_cast<size_t>(slot)].open &&
      capacity > 0 && kv_slots_[static_cast<size_t>(slot)].capacity >= capacity) {
    KvSlot& k = kv_slots_[static_cast<size_t>(slot)];
    k.block = attention_block();
    std::fill(k.written.begin(), k.written.end(), uint8_t{0});
    return;
  }
  kv_close(slot);
  kv_place(slot, capacity);
}

void Engine::kv_cache_reset(int64_t capacity) {
  kv_reset(0, capacity);
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

bool Engine::packed_cached_fits(OutputMode mode, std::span<const CachedSeq> seqs) {
  if (opt_.memory_budget == 0) return true;
  graph::StepShape s;
  for (const CachedSeq& q : seqs) {
    cached_rows(q, seq_q_);
    s.n_query += static_cast<int64_t>(seq_q_.size());
    s.n_kv += static_cast<int64_t>(q.canvas.size());
    s.n_logits += static_cast<int64_t>(q.positions.size());
  }
  s.n_seqs = static_cast<int64_t>(seqs.size());
  size_t floor = 0;
  return try_program(mode, s, true, floor) != nullptr;
}

void Engine::cached_rows(const CachedSeq& s, std::vector<int32_t>& out) {
  const auto n = static_cast<int64_t>(s.canvas.size());
  TESSERA_CHECK(s.slot >= 0 && static_cast<size_t>(s.slot) < kv_slots_.size() &&
                    kv_slots_[static_cast<size_t>(s.slot)].open &&
                    n <= kv_slots_[static_cast<size_t>(s.slot)].capacity,
                "KV cache: no cache for a canvas of " + std::to_string(n) +
                    " positions (call kv_cache_reset with the request's canvas size first)");
  KvSlot& k = kv_slots_[static_cast<size_t>(s.slot)];
  if (k.block != attention_block()) {  // its rows saw another attention mask
    std::fill(k.written.begin(), k.written.end(), uint8_t{0});
    k.block = attention_block();
  }
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
    if (pos < 0 || pos >= n) fail("forward: position " + std::to_string(pos) + " is outside the canvas");
    const int32_t row = logit_row(pos);
    if (!std::binary_search(s.rows.begin(), s.rows.end(), row)) out.push_back(row);
  }
  if (out.size() > s.rows.size()) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  TESSERA_CHECK(!out.empty(), "KV cache: a step must compute at least one row");
  size_t next = 0;  // index of the next computed row
  for (int64_t r = 0; r < n; ++r) {
    if (next < out.size() && out[next] == r) {
      ++next;
    } else if (k.written[static_cast<size_t>(r)] == 0) {
      fail("KV cache: canvas row " + std::to_string(r) +
           " was never computed in this request; compute it (or the whole canvas) before reusing the cache");
    }
  }
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
    const int64_t base = kv_slots_[static_cast<size_t>(s.slot)].base;
    const auto q0 = static_cast<int32_t>(q_pos_.size());
    for (const int32_t r : seq_q_) {
      tokens_.push_back(s.canvas[static_cast<size_t>(r)]);
      q_pos_.push_back(r);
      cache_rows_.push_back(static_cast<int32_t>(base + r));
    }
    const auto n = static_cast<int32_t>(s.canvas.size());
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
  des_step_rows(q_pos_);
  const graph::Program& p = execute_step(mode, true, shape, sp);
  for (size_t s = 0; s < seqs.size(); ++s) {
    KvSlot& k = kv_slots_[static_cast<size_t>(seqs[s].slot)];
    for (auto i = static_cast<size_t>(cu_q_[s]); i < static_cast<size_t>(cu_q_[s + 1]); ++i)
      k.written[static_cast<size_t>(q_pos_[i])] = 1;
  }
  return p;
}

void Engine::sparse_begin(int64_t canvas_len, const SparseConfig& c) {
  const ModelConfig& cfg = model_->config();
  TESSERA_CHECK(
      attention_block() == 0 && model_->options().mask == MaskKind::None,
      "sparse attention needs a bidirectional model (block-causal models grow their canvas block by "
      "block, so one pattern cannot serve the request)");
  TESSERA_CHECK(c.block > 0, "sparse block must be > 0 (got " + std::to_string(c.block) + ")");
  TESSERA_CHECK(std::isfinite(c.rho) && c.rho >= 0.0f && c.rho <= 1.0f,
                "sparse rho must be in [0, 1] (got " + std::to_string(c.rho) + ")");
  TESSERA_CHECK(canvas_len > 0 && canvas_len <= cfg.max_positions,
                "sparse attention: a canvas of " + std::to_string(canvas_len) +
                    " positions does not fit the model's " + std::to_string(cfg.max_positions) +
                    " positions");
  TESSERA_CHECK(c.prompt_len >= 0 && c.prompt_len <= canvas_len,
                "sparse attention: the prompt length must lie in [0, canvas length]");
  const auto bytes = static_cast<size_t>(cfg.sparse_pattern_bytes(canvas_len, c.block));
  if (bytes > sparse_bytes_) {
    grow_held(sparse_buf_, sparse_bytes_, bytes,
              "the sparse attention patterns of a " + std::to_string(canvas_len) + "-position canvas (" +
                  memory::format_bytes(static_cast<double>(bytes)) + " at sparse block " +
                  std::to_string(c.block) + "; a larger block needs fewer)");
  }
  sparse_canvas_ = canvas_len;
  sparse_exec_ = SparseExec{};
  sparse_exec_.patterns = static_cast<uint8_t*>(sparse_buf_);
  sparse_exec_.layer_bytes = bytes / static_cast<size_t>(cfg.n_layers);
  sparse_exec_.p.block = c.block;
  sparse_exec_.p.rho = c.rho;
  sparse_exec_.p.n_prompt_keys = c.prompt_len;
  sparse_on_ = true;
  sparse_ready_ = false;
  sparse_phase_ = SparsePhase::Dense;
}

void Engine::sparse_phase(SparsePhase p) {
  TESSERA_CHECK(sparse_on_, "sparse attention: sparse_begin must start the request first");
  TESSERA_CHECK(p != SparsePhase::Sparse || sparse_ready_,
                "sparse attention: no pattern yet; a Select forward must build it first");
  sparse_phase_ = p;
}

std::vector<uint8_t> Engine::sparse_patterns() const {
  std::vector<uint8_t> v(
      sparse_ready_ ? sparse_exec_.layer_bytes * static_cast<size_t>(model_->config().n_layers) : 0);
  if (!v.empty()) {
    backend_->synchronize();
    backend_->copy_to_host(v.data(), sparse_buf_, v.size());
  }
  return v;
}

bool Engine::supports_expert_sharing() const {
  return model_->config().moe.n_experts > 0;
}

void Engine::check_des(const DesConfig& c) const {
  const ModelConfig& cfg = model_->config();
  TESSERA_CHECK(supports_expert_sharing(), "expert sharing needs a mixture-of-experts model; this " +
                                               cfg.model_type + " model has no experts");
  const int K = static_cast<int>(cfg.moe.top_k);
  TESSERA_CHECK(c.mode != DesMode::Seq || (c.k >= 1 && c.k <= K),
                "des-k must be in [1, " + std::to_string(K) + "] (the model routes each token to " +
                    std::to_string(K) + " experts; got " + std::to_string(c.k) + ")");
  TESSERA_CHECK(c.mode != DesMode::Vote || (std::isfinite(c.beta) && c.beta > 0.0f && c.beta <= 1.0f),
                "des-beta must be in (0, 1] (got " + std::to_string(c.beta) + ")");
}

void Engine::des_begin(const DesConfig& c) {
  check_des(c);
  const ModelConfig& cfg = model_->config();
  const int E = static_cast<int>(cfg.moe.n_experts);
  const size_t layer = static_cast<size_t>(5 * E);
  const size_t bytes = layer * static_cast<size_t>(cfg.n_layers) * sizeof(float);
  if (bytes > des_bytes_) {
    if (des_buf_ != nullptr) backend_->free_weights(des_buf_);
    des_buf_ = nullptr;
    des_bytes_ = 0;
    des_buf_ = backend_->alloc_weights(bytes);
    des_bytes_ = bytes;
  }
  des_host_.assign(des_bytes_ / sizeof(float), 0.0f);
  des_exec_ = DesExec{};
  des_exec_.share.mode = c.mode;
  des_exec_.share.k = c.mode == DesMode::Seq ? c.k : 1;
  des_exec_.share.m_core = std::clamp(static_cast<int>(std::floor(static_cast<double>(c.beta) * E)), 1, E);
  des_exec_.all_rows = c.all_rows;
  des_exec_.state = static_cast<float*>(des_buf_);
  des_exec_.layer_floats = layer;
  des_stats_ = MoeStats{};
  des_lo_ = des_hi_ = 0;
  des_on_ = true;
}

void Engine::des_rows(int64_t lo, int64_t hi) {
  TESSERA_CHECK(0 <= lo && lo <= hi,
                "expert sharing: the decoded rows must be a range [lo, hi) with 0 <= lo <= hi");
  des_lo_ = lo;
  des_hi_ = hi;
}

void Engine::des_step_rows(std::span<const int32_t> q_pos) {
  if (!des_on_) return;  // (q_pos is ascending whenever DES is on: one sequence per forward)
  des_exec_.vote_lo = std::lower_bound(q_pos.begin(), q_pos.end(), des_lo_) - q_pos.begin();
  des_exec_.vote_hi = std::lower_bound(q_pos.begin(), q_pos.end(), des_hi_) - q_pos.begin();
}

int Engine::attention_block() const {
  return model_->options().mask == MaskKind::BlockCausal ? model_->options().mask_block : 0;
}

void Engine::set_attention_block(int block) {
  if (block == attention_block()) return;
  model_->set_mask_block(block);
  plans_.clear();  // programs were instantiated from the previous graphs
  for (bool& r : io_ready_) r = false;
  // (a KV cache slot's rows computed under the old mask are dropped at its next step: cached_rows)
}

std::string format_op_seconds(const std::array<double, graph::kOpKinds>& seconds, double per) {
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
    std::snprintf(buf, sizeof buf, "%s%s %.3f s (%.0f%%)", out.empty() ? "" : ", ",
                  graph::op_name(static_cast<graph::OpKind>(k)), sec / per, 100.0 * sec / total);
    out += buf;
  }
  return out;
}

}  // namespace tessera
