// Request state outside the plan that the Engine keeps for SparseD and Dynamic Expert Sharing: the
// attention patterns of a sparse request and the per-layer expert states of a DES request, each in a
// backend buffer kept across requests, and what each hands the executor for one forward.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "decode/denoiser.h"
#include "engine/executor.h"
#include "graph/graph.h"
#include "io/config.h"

namespace tessera {

// A backend buffer held across steps, outside the plan (with a memory budget it is counted against it).
struct HeldBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  void free(Backend& backend);
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

// SparseD (--sparse): one pattern byte per (layer, head, query block, key block) of the canvas of one
// request. The buffer is kept across requests and grown (by the Engine, under its memory budget) when a
// request needs more; ready() once a Select forward of this request has written the patterns. A Select
// forward computes every row of its view, a prefix canvas[0, n) of the request's canvas (the whole canvas,
// or Window-Diffusion's window); the pattern then has that view's blocks, and a Sparse forward over a
// view no longer than it reads the pattern rows of its positions (or of its rows, when it computes
// exactly the selected view). On a block-causal model every forward selects or reads the pattern rows of
// the positions it computes, at the whole canvas's strides.
class SparseState {
 public:
  // Checks a request's parameters on a model of config `cfg` (causal: its attention has a causal mask)
  // and returns the pattern bytes it needs.
  static size_t check(const ModelConfig& cfg, bool causal, int64_t canvas_len, const SparseConfig& c);
  // What the patterns of a request are, for the budget error when they do not fit.
  static std::string describe(int64_t canvas_len, const SparseConfig& c, size_t bytes);

  HeldBuffer& buffer() { return buf_; }
  size_t bytes() const { return buf_.bytes; }
  bool on() const { return on_; }
  int64_t block() const { return exec_.p.block; }
  // Starts a request over the buffer (at least `bytes` bytes: check()), in the Dense phase. attn_block > 0:
  // a block-causal model (LLaDA2), whose forwards select and read the pattern rows of the positions they
  // compute, over the whole canvas's strides (its blocks select at different forwards).
  void begin(int64_t canvas_len, const SparseConfig& c, size_t bytes, int64_t n_layers, int attn_block);
  void set_phase(SparsePhase p);
  void end() { on_ = false; }
  // What a forward of `shape` runs with: nullptr in the Dense phase or outside a request; throws Error
  // unless the forward is one sequence over a prefix of the request's canvas (a Select forward: all of
  // that prefix's rows; a Sparse one: a prefix no longer than the selected one).
  const SparseExec* step(const graph::StepShape& shape, bool kv_cache);
  // After that forward: a Select forward has written the patterns.
  void step_done();
  // The patterns of the last Select forward on the host, [layer][head][query block][key block] (empty
  // before one).
  std::vector<uint8_t> patterns(Backend& backend, int64_t n_layers) const;
  // Frees the buffer outside a request; returns whether it did.
  bool release_if_idle(Backend& backend);

 private:
  HeldBuffer buf_;
  int64_t canvas_ = 0;
  int64_t selected_ = 0, selecting_ = 0;  // the view (key rows) of the last Select forward, of this one
  bool on_ = false, ready_ = false;
  SparsePhase phase_ = SparsePhase::Dense;
  SparseExec exec_;
};

// DES (--des): the per-layer states (5 * n_experts floats each; small, so not counted against a memory
// budget), the canvas positions [lo, hi) decoded in parallel, and the counts read back after every
// forward (MoeStats).
class DesState {
 public:
  // Throws Error unless a model of config `cfg` (an MoE model) accepts `c` (k and beta in range).
  static void check(const ModelConfig& cfg, const DesConfig& c);

  bool on() const { return on_; }
  const MoeStats& stats() const { return stats_; }
  void begin(Backend& backend, const ModelConfig& cfg, const DesConfig& c);
  void set_rows(int64_t lo, int64_t hi);
  void end() { on_ = false; }
  // Sets the voting rows of a step whose rows are the (ascending) canvas positions q_pos.
  void step_rows(std::span<const int32_t> q_pos);
  // What a forward of `shape` runs with (nullptr when DES is off): the states zeroed; throws Error
  // unless the forward has one sequence.
  const DesExec* step(Backend& backend, const graph::StepShape& shape);
  // After that forward: its unique experts per MoE layer, added to stats().
  void step_done(Backend& backend, const ModelConfig& cfg);
  void free(Backend& backend) { buf_.free(backend); }

 private:
  HeldBuffer buf_;
  bool on_ = false;
  int64_t lo_ = 0, hi_ = 0;
  DesExec exec_;
  MoeStats stats_;
  std::vector<float> host_;
};

}  // namespace tessera
