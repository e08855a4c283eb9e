// Runs an instantiated, planned program on a backend: every tensor at base + its planned offset,
// chunk loops executed K times on consecutive row ranges.
#pragma once
#include <array>
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

// What expert parallelism would exchange for the routing of the forwards profiled (tessera bench
// --profile on MoE models), for kRanks[i] ranks holding equal contiguous slices of the experts. The rows
// are on every rank (after the attention's all-reduce); each rank owns rows r with r % N == rank, whose
// sum it completes. tessera's combine all-reduces every row: 2 (N - 1) rows x hidden f32 over all ranks,
// whatever the routing. A sparse combine would send a rank's partial sums only for the rows its experts
// touched, to their owners (sent_rows), then all-gather the owned rows: (N - 1) rows x hidden. So the
// rows' routing, which DES concentrates on a coreset, decides what the sparse combine saves.
struct MoeTraffic {
  static constexpr std::array<int, 3> kRanks{2, 4, 8};
  int64_t calls = 0;                   // router calls (MoE layers x FFN chunks)
  int64_t rows = 0;                    // the rows they routed
  int64_t hidden = 0;                  // the residual's width
  std::array<int64_t, 3> touched{};    // (row, rank) pairs with at least one of the row's experts on it
  std::array<int64_t, 3> sent_rows{};  // ... whose row another rank owns (the sparse combine's sends)
  // Load balance: the (row, slot) pairs of each call, and of each call's busiest rank (expert
  // parallelism waits for it): busiest * N / pairs is the slowest rank's work over the mean.
  int64_t pairs = 0;
  std::array<int64_t, 3> busiest{};
  // Counts one router call: ids [rows, k] of experts in [0, n_experts), its first row first_row.
  void add(std::span<const int32_t> ids, int64_t k, int64_t n_experts, int64_t first_row);
  double all_reduce_bytes(size_t i) const {
    return 2.0 * (kRanks[i] - 1) * static_cast<double>(rows * hidden) * 4;
  }
  double sparse_bytes(size_t i) const {
    return (static_cast<double>(sent_rows[i]) + static_cast<double>((kRanks[i] - 1) * rows)) *
           static_cast<double>(hidden) * 4;
  }
  // The share of (row, rank) pairs touched, and the busiest rank's pairs over the mean.
  double touched_share(size_t i) const {
    return static_cast<double>(touched[i]) / static_cast<double>(rows * kRanks[i]);
  }
  double busiest_over_mean(size_t i) const {
    return static_cast<double>(busiest[i] * kRanks[i]) / static_cast<double>(pairs);
  }
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
  MoeTraffic* moe_traffic = nullptr;   // with op_seconds: every router call's routing counted
  dist::Communicator* comm = nullptr;  // tensor parallelism: the ranks AllReduce sums over
};

// A view of tensor `id` for the given chunk of a loop (chunk < 0: the whole tensor).
Tensor tensor_view(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c, int id,
                   bool chunked, int loop, int64_t chunk);

void execute(const graph::GraphTemplate& g, const graph::Program& p, const ExecContext& c);

}  // namespace tessera
