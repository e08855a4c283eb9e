// The step loop of one generation, composed of parts (docs/ARCHITECTURE.md, "Adding a policy"):
//   transfer schedule  how many positions each step decides, block by block (transfer.cpp: LLaDA blocks,
//                      Dream timesteps, threshold; the bidirectional layout and the LLaDA2 block grid)
//   unmask policy      which candidates a step decides (unmask.cpp: confidence ranks, sampled positions,
//                      Dream's origin coin)
//   row policy         which candidates a step may decide and which canvas rows its forward computes
//                      (rows.cpp: full recompute, prefix / dual KV cache; window.cpp: Window-Diffusion;
//                      causal.cpp: a tri-mode model's causally written cache, and its ar / spec layouts)
//   attention policy   the SparseD phase of each forward (sparse.cpp)
//   expert policy      the rows DES shares experts over (experts.cpp)
//   guidance           cfg's two forwards combined on the host, editing's penalty, structured output's
//                      token mask (guidance.cpp)
//   constrained        structured output: left to right under a TokenConstraint (constrained.cpp)
//   canvas             prompt + masks + an infilling suffix (canvas.cpp), and the stop conditions
//                      (stop.cpp: EOS, stop sequences, the window's early stop)
// policies.cpp chooses the parts of a request from its options: adding a policy is a new file and one
// line there. Loop holds the state they share; each part keeps its own.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "decode/generate.h"
#include "decode/request.h"

namespace tessera::decode {

struct Loop;

// The canvas rows one forward computes, as a Denoiser call.
struct RowSpec {
  enum class Kind : uint8_t { Whole, Range, List };
  Kind kind = Kind::Whole;
  size_t view = 0;                // the forward sees canvas[0, view)
  int64_t lo = 0, hi = 0;         // Range: rows [lo, hi), the others' K / V from the cache
  std::span<const int32_t> rows;  // List: these rows, the others' K / V from the cache
};

class RowPolicy {
 public:
  virtual ~RowPolicy() = default;
  virtual void begin_block(Loop& L, int lo, int hi) { (void)L, (void)lo, (void)hi; }
  // The candidates of the next step into L.pos: by default the undecided positions of [lo, hi) before
  // L.stop. False when there is none.
  virtual bool candidates(Loop& L, int lo, int hi);
  // The rows of the forward about to run (called once per forward, after candidates).
  virtual RowSpec next_rows(Loop& L) = 0;
  // After a block's schedule: decides what the schedule left (the window caps counts at its active set).
  virtual void finish_block(Loop& L, int lo, int hi) { (void)L, (void)lo, (void)hi; }
};

class UnmaskPolicy {
 public:
  virtual ~UnmaskPolicy() = default;
  virtual ConfKind confidence() const = 0;
  virtual bool gumbel() const = 0;  // LLaDA's Gumbel-max sampling (else Dream's)
  // Dream's origin: a step keeps each candidate with the transfer probability (a coin per position)
  // before its forward and decides every kept one; the others rank or sample.
  virtual bool by_coin() const { return false; }
  // The k candidates a step decides, as indices into L.pos (into L.idx).
  virtual void choose(Loop& L, size_t k, uint64_t host_seed) const;
};

// SparseD's phase before each forward (sparse.cpp), knowing the rows it computes; none when off.
class AttentionPolicy {
 public:
  virtual ~AttentionPolicy() = default;
  virtual void begin_block(Loop& L, int lo, int hi) { (void)L, (void)lo, (void)hi; }
  virtual void before_forward(Loop& L, const RowSpec& rows) = 0;
};

// DES: the rows decoded in parallel (experts.cpp); none when off.
class ExpertPolicy {
 public:
  virtual ~ExpertPolicy() = default;
  virtual void begin_block(Loop& L, int lo, int hi) = 0;
  virtual void before_forward(Loop& L) = 0;
};

// cfg (guidance.cpp): the forward of L.pos from the conditional and unconditional logits.
class Guidance {
 public:
  virtual ~Guidance() = default;
  virtual void forward(Loop& L, const RowSpec& rows, const SampleParams& sp) = 0;
};

// Decides the steps of one block of positions [lo, hi) (transfer.cpp).
class TransferSchedule {
 public:
  virtual ~TransferSchedule() = default;
  // g: the RNG step counter of the block's first step (advanced by the schedules that count forwards).
  virtual void run_block(Loop& L, int lo, int hi, int steps, uint64_t& g) = 0;
  // Whether the block's steps are split from `steps` (LLaDA, Dream in blocks) or run until decided.
  virtual bool splits_steps() const { return true; }
};

struct Parts {
  std::unique_ptr<TransferSchedule> schedule;
  std::unique_ptr<UnmaskPolicy> unmask;
  std::unique_ptr<RowPolicy> rows;
  std::unique_ptr<AttentionPolicy> attention;  // null: dense
  std::unique_ptr<ExpertPolicy> experts;       // null: routing as trained
  std::unique_ptr<Guidance> guidance;          // null: one forward
};

struct Loop {
  Loop(Denoiser& d, const GenerateOptions& opt, const RequestPlan& p,
       const std::function<void(const StepEvent&)>& cb)
      : den(d), o(opt), plan(p), on_step(cb) {}
  Denoiser& den;
  const GenerateOptions& o;
  const RequestPlan& plan;
  const std::function<void(const StepEvent&)>& on_step;
  Parts parts;
  int64_t V = 0;
  int32_t mask = 0;
  int P = 0;  // prompt length
  int G = 0;  // generation length
  // Block-causal models: forwards see only canvas[0, seen) (later blocks cannot change earlier rows);
  // 0 = the whole canvas.
  int seen = 0;
  std::vector<int32_t> canvas;
  std::vector<char> decided;  // per canvas position
  int stop = 0;               // positions >= stop are dropped (the window's early stop)
  int block_lo = 0;           // the current block's first position (LLaDA2: on its block grid)
  // Positions >= editable_from may still change once decided (token editing's current block): neither
  // final nor committed.
  int editable_from = INT32_MAX;
  // The first generated position that is undecided or editable (StepEvent::committed): every token before
  // it is final. With mid_block_stop, once the tokens before it hold an EOS (stop_at_eos) or a stop
  // sequence (stop_when), no later step can change the answer and the generation ends at once (`ended`),
  // inside a block too.
  int committed = 0;
  bool ended = false;
  bool stopped = false;  // stop_when ended the generation: the later blocks are undecided
  int64_t forwards = 0;  // forwards run so far
  uint64_t g_extra = 0;  // RNG step counter of the steps that finish a block after its schedule (window)
  SampleParams base;
  // Structured output: the constraint's state after the answer's decided prefix (constrained.cpp);
  // guidance masks the leftmost candidate's logits with it.
  std::unique_ptr<TokenConstraint::State> grammar;
  GenerateResult res;
  // logprobs: those of the last forward's positions (pos), the denoiser's (valid until its next call)
  // or, with cfg, host_lp computed from the guided logits.
  const PredictLogprobs* lp = nullptr;
  PredictLogprobs host_lp;
  std::vector<TokenLogprob> gen_lp;  // logprobs: per generated position, set when it is decided
  // The current step: its candidates (pos), their predictions (tok, conf), the chosen indices (idx).
  std::vector<int32_t> pos, tok, chosen;
  std::vector<TokenEdit> step_edits;  // the rewrites of the current step
  std::vector<float> conf;
  std::vector<int> idx;

  SampleParams params(uint64_t g) const;
  size_t visible() const { return seen > 0 ? static_cast<size_t>(seen) : canvas.size(); }
  // Undecided positions in [lo, hi), ascending, into pos.
  void undecided(int lo, int hi);
  // The candidates of the next step (the row policy's); false when none is left.
  bool prepare(int lo, int hi) { return parts.rows->candidates(*this, lo, hi); }
  // One forward: (token, conf) for every position of pos; with logprobs, theirs.
  void predict(const SampleParams& sp);
  // Indices into pos ordered by confidence, highest first, ties to the lower position (NaN last): the
  // first k of them into idx.
  void rank(size_t k);
  // Decides pos[idx[0..k)] with their predicted tokens; records the step and emits the event.
  void commit(size_t k);
  // Token editing: decides the undecided pos[i] of `fill` and rewrites the decided pos[i] of `rewrite`
  // with their predicted tokens; records the step (if anything changed) and emits the event.
  void commit_edits(std::span<const int> fill, std::span<const int> rewrite);
  // Every candidate of pos, in order (a step that decides them all).
  void commit_all();
  // commit's parts: pos[i] takes tok[i] (rewrite: it was decided), then the step is recorded.
  void set_token(size_t i, bool rewrite);
  void end_step();

  // stop.cpp
  bool is_eos(int32_t t) const;
  // Whether the answer ends within the decided tokens [P, to): an EOS in [from, to) (stop_at_eos) or a
  // stop sequence in them (stop_when, asked only when they hold no EOS; sets `stopped`).
  bool ends_before(int from, int to);
  // Moves `committed` past the positions decided now (not into the editable block); with mid_block_stop,
  // ends the generation when the final tokens before it hold an EOS or a stop sequence.
  void advance_committed();
  // The window's early stop: an EOS decided at p drops every position after it.
  void decided_token(int32_t p, int32_t t);
};

// canvas.cpp: the canvas of a request (prompt, masks, suffix; block-causal padding) and its state.
void init_canvas(Loop& L, std::span<const int32_t> prompt);
// stop.cpp: the generated part of the canvas, trimmed at the first EOS when asked.
GenerateResult finish(Loop& L);
// policies.cpp: the parts of a request.
Parts choose_parts(const GenerateOptions& o, const RequestPlan& plan);
// transfer.cpp: the block layouts.
void run_bidirectional(Loop& L);
void run_block_causal(Loop& L);
// causal.cpp: the tri-mode layouts (GenerateOptions::mode ar and spec).
void run_autoregressive(Loop& L);
void run_speculative(Loop& L);
// uniform.cpp: a uniform-noise model's canvases (GenerateOptions::mode uniform).
void run_uniform(Loop& L);
// spec: the provisional drafts at [lo, hi) go back to masks; nothing is editable any more.
void return_drafts(Loop& L, int lo, int hi);
// spec_sampling.cpp: one cycle of spec with SpecSampling::Rejection (temperature > 0) from the seed at c
// over the block [c, e) (drafts with the draft adapter when `adapter`); returns the positions kept.
int speculative_sampling_cycle(Loop& L, int c, int e, bool adapter);

}  // namespace tessera::decode
