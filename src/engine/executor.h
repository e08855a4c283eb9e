// Runs an instantiated, planned program on a backend: every tensor at base + its planned offset,
// chunk loops executed K times on consecutive row ranges.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "graph/graph.h"

namespace tessera {

// SparseD during one step: build every layer's pattern after its (dense) attention, or attend only
// to the pattern's tiles. Patterns of all layers lie in one device buffer, layer_bytes apart.
struct SparseExec {
  bool select = false;
  uint8_t* patterns = nullptr;
  size_t layer_bytes = 0;
  SparseSelectParams p;  // p.scale is taken from each attention op
  // A KV-cache step's pattern strides (the canvas's query and key blocks): its rows are read by
  // position (AttnParams::sparse_q_blocks); 0 for an uncached forward over the whole canvas.
  int64_t q_blocks = 0, k_blocks = 0;
};

// Dynamic Expert Sharing during one forward (MoeShare): the step rows decoded in parallel vote for each
// MoE layer's coreset; they (or, with all_rows, every row) route inside it. The states of all layers lie
// in one backend buffer, layer_floats apart, zeroed before the forward. When a layer's FFN loop runs in
// chunks, a first pass runs its ops up to the router for the chunks holding voting rows (votes only),
// then every chunk routes with the finished coreset.
struct DesExec {
  MoeShare share;  // mode, k, m_core (rows and passes are set per call)
  bool all_rows = false;
  int64_t vote_lo = 0, vote_hi = 0;
  float* state = nullptr;
  size_t layer_floats = 0;
};

struct ExecContext {
  Backend* backend = nullptr;
  char* base = nullptr;                  // workspace base (device pointer)
  const SampleParams* sample = nullptr;  // for SampleRows
  // Packed requests that sample with their own parameters: logit rows [sample_rows[s], sample_rows[s + 1])
  // sample with sample_seqs[s]. Empty: every row samples with `sample`.
  std::span<const SampleParams> sample_seqs;
  std::span<const int64_t> sample_rows;
  std::string dump_dir;  // non-empty: dump every op output (debug)
  // State tensors (KV cache): the device pointer of each, indexed by tensor id (others null).
  const std::vector<char*>* state = nullptr;
  int64_t state_rows = 0;              // the rows of every State tensor (the KV cache pool's rows)
  const SparseExec* sparse = nullptr;  // SparseD; null = dense attention
  const DesExec* des = nullptr;        // DES; null = every row routes on its own
  double* op_seconds = nullptr;        // [graph::kOpKinds]: each op synchronised and timed, by kind
  double* op_flops = nullptr;          // [graph::kOpKinds], with op_seconds: op_flops()'s count, by kind
  dist::Communicator* comm = nullptr;  // tensor parallelism: the ranks AllReduce sums over
};

// A view of tensor `id` for the given chunk of a loop (chunk < 0: the whole tensor).
Tensor tensor_view(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int id,
                   bool chunked, int loop, int64_t chunk);

void execute(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c);

}  // namespace tessera
