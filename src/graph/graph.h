// The graph registrar: a model family is written once as a GraphTemplate whose tensor sizes are
// symbolic (n_query, n_kv, n_logits, ...). instantiate() binds the symbols for one StepShape and
// returns a flat op list with byte sizes and lifetimes, ready for the memory planner.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace tessera::graph {

// Symbolic row counts. Every tensor is 2-D: rows = mul * value(sym), cols fixed.
enum class Sym : uint8_t {
  One,         // 1
  NQuery,      // positions computed this step
  NKv,         // positions attended to
  NLogits,     // positions that need logits
  NSeqsPlus1,  // packed sequences + 1 (boundary arrays)
  FfnRows,     // ceil(n_query / K_ffn): rows of one FFN chunk
  LogitRows,   // ceil(n_logits / K_logits): rows of one logits chunk
  kCount
};
const char* sym_name(Sym s);

// What one forward step computes; binds the symbols.
struct StepShape {
  int64_t n_query = 0, n_kv = 0, n_logits = 0, n_seqs = 1;
  int64_t k_ffn = 1, k_logits = 1;  // chunk counts (lazy chunking)
  bool operator==(const StepShape&) const = default;
  std::array<int64_t, static_cast<size_t>(Sym::kCount)> bind() const;
};

// State: memory that outlives a step (the KV cache): not planned; the engine gives each State tensor
// its own buffer (ExecContext::state), and rows = value(sym) is the part a step sees.
enum class TensorKind : uint8_t { Weight, Input, Transient, Output, State };

struct TensorDecl {
  std::string name;  // e.g. "attn_norm"; with layer >= 0 printed as "blk.3.attn_norm"
  int layer = -1;
  TensorKind kind = TensorKind::Transient;
  DType dtype = DType::F32;
  Sym rows = Sym::One;
  int64_t rows_mul = 1;
  int64_t cols = 1;
  Tensor weight;           // Weight tensors: the bound view (device memory; null data: shape only)
  int alias_of = -1;       // written straight into this tensor's memory (add_alias)
  size_t extra_bytes = 0;  // fixed bytes after the rows (scratch buffers, add_scratch)
  std::string full_name() const;
};

enum class OpKind : uint8_t {
  Embed,
  RmsNorm,
  Gemm,
  GatherGemm,
  Rope,
  Attention,
  Swiglu,
  SampleRows,
  TokenLogprob,
  MoeRoute,     // in: router logits [, expert bias]; out: ids, weights
  MoeFfn,       // in: x, ids, weights, x (accumulated) [, expert weight shapes]; out: scratch, x
  ScatterRows,  // in: src, row indices; out: dst (State) with dst[rows[i]] = src[i]
  Convert,      // in: src; out: dst of another dtype (elementwise)
  GatherRows,   // in: src (State), row indices; out: dst with dst[i] = src[rows[i]] (bf16 widened to f32)
  TopLogprobs,  // in: logits, tokens; out: the tokens' log-probabilities, and ids and log-probabilities
                // [rows, K] of the K most likely tokens
  AllReduce,    // in / out: an f32 tensor summed in place over the tensor-parallel ranks (ExecContext::comm)
  GatherVocab,  // in: this rank's logits [rows, share]; out: the whole rows [rows, vocab] (p.vocab_split)
  // Uniform-noise diffusion (DiffusionGemma's Gemma 4 blocks):
  Geglu,         // in: gate, up; out: gelu_tanh(gate) * up
  Scale,         // in / out: x *= p.scale (f32, in place)
  Softcap,       // in / out: x = p.scale * tanh(x / p.scale) (f32, in place)
  CanvasSample,  // in: logits, row keys; out: sampled token, argmax, entropy (ExecContext::sample's T, seed)
  SoftEmbed,     // in: logits, embedding table; out: probs scratch, soft rows (softmax(logits / T) E p.scale)
};
constexpr int kOpKinds = static_cast<int>(OpKind::SoftEmbed) + 1;
const char* op_name(OpKind k);

// A tensor operand. chunked: the op sees only the rows of the current chunk of the enclosing loop.
struct Ref {
  int id = -1;
  bool chunked = false;
};

struct OpParams {
  float eps = 0.0f;
  bool accumulate = false;  // Gemm: c += a w^T
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0.0f;
  RopeParams rope;  // Rope
  MaskKind mask = MaskKind::None;
  int block_size = 0;
  MoeRouteParams route;  // MoeRoute (expert_bias comes from the op's optional second input)
  MoeExperts experts;    // MoeFfn: the layer's expert table
  // RmsNorm: groups of `group` columns (0: the weight's length; needed without a weight, an RMSNorm
  // without scale) and, with accumulate, y += the normalised x.
  int64_t group = 0;
  int window = 0;  // Attention: AttnParams::window
  // SampleRows, TokenLogprob, TopLogprobs, GatherVocab over an LM head split by vocabulary (n > 0): the
  // logits are this rank's columns, combined over ExecContext::comm (engine/vocab_parallel.h).
  VocabShare vocab_split;
};

struct OpDecl {
  OpKind kind;
  std::string name;
  int layer = -1;
  std::vector<Ref> in;   // read
  std::vector<Ref> out;  // written (an operand may appear in both: in-place)
  OpParams p;
  int loop = -1;  // index into loops, -1 = not in a chunk loop
};

// A chunk loop: ops [begin, end) run `count` times (K_ffn or K_logits), each time on the next
// `chunk_rows` rows of the `total` rows; barriers stay alive for the whole loop.
struct LoopDecl {
  Sym count;       // which chunk count: uses StepShape::k_ffn for FfnRows loops, k_logits else
  Sym total;       // NQuery or NLogits
  Sym chunk_rows;  // FfnRows or LogitRows
  int begin = 0, end = 0;
  std::vector<int> barriers;
};

class GraphTemplate {
 public:
  int add_weight(std::string name, int layer, const Tensor& t);
  int add_input(std::string name, DType dt, Sym rows, int64_t cols = 1);
  int add_tensor(std::string name, int layer, DType dt, Sym rows, int64_t cols, int64_t mul = 1);
  int add_output(std::string name, DType dt, Sym rows, int64_t cols = 1);
  // Memory kept across steps (KV cache rows): rows = value(rows) visible to the step, not planned.
  int add_state(std::string name, int layer, DType dt, Sym rows, int64_t cols);
  // A byte buffer of bytes_per_row * rows + fixed_bytes (an op's workspace, e.g. moe_scratch).
  int add_scratch(std::string name, int layer, Sym rows, size_t bytes_per_row, size_t fixed_bytes);
  // `out` is written straight into `in`'s memory (same or smaller size); lifetimes merge.
  void add_alias(int out, int in);
  int add_op(OpKind k, std::string name, int layer, std::vector<Ref> in, std::vector<Ref> out,
             const OpParams& p = {});
  // Chunk loops: ops added between begin_loop and end_loop form the loop body.
  void begin_loop(Sym total, Sym chunk_rows);
  void add_barrier(int tensor);  // keep alive across the whole open loop
  void end_loop();

  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  const std::vector<OpDecl>& ops() const { return ops_; }
  const std::vector<LoopDecl>& loops() const { return loops_; }
  int find(const std::string& full_name) const;  // -1 if absent

 private:
  std::vector<TensorDecl> tensors_;
  std::vector<OpDecl> ops_;
  std::vector<LoopDecl> loops_;
  int open_loop_ = -1;
};

// One instantiated tensor: concrete size and lifetime over op indices [first, last].
struct InstTensor {
  int64_t rows = 0;
  size_t bytes = 0;
  int first = -1, last = -1;
  int alias_of = -1;
  size_t offset = 0;  // filled by the planner (Transient/Input/Output only)
};

struct Program {
  StepShape shape;
  std::array<int64_t, static_cast<size_t>(Sym::kCount)> sym{};
  std::vector<InstTensor> tensors;  // parallel to the template's tensors
  struct Loop {
    int begin, end;
    int64_t count, chunk_rows, total;
  };
  std::vector<Loop> loops;
  uint64_t serial = 0;     // set by the engine, unique per plan it makes (step graphs key on it)
  size_t peak = 0;         // arena size of the plan
  size_t lower_bound = 0;  // max over ops of the bytes live at that op
  double plan_ms = 0.0;
};

// Binds the symbols, computes sizes and lifetimes (barriers, chunked refs, aliases). Offsets and
// the peak are filled by memory::plan().
Program instantiate(const GraphTemplate& g, const StepShape& s);

}  // namespace tessera::graph
