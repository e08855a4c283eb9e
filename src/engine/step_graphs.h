// Step graphs: a forward whose program, memory and host-side arguments were seen before replays as one
// recorded sequence (CUDA graphs) instead of hundreds of kernel launches. The first run of a key runs
// its ops as usual (cuBLASLt and cuDNN plans, the quantized tile and the workspace are made then); the
// second records them and replays the recording; every later run only replays it. The key holds
// everything a recorded op took from the host: the program (its serial: a new plan is a new key), the
// workspace base, the KV cache pool, the sampling parameters and the rows each request samples (the seed
// only where it draws noise: every step of a request has its own, so sampled steps do not repeat). Steps
// with SparseD, DES, per-op timing or dumps run their ops eagerly. A capture that fails (an op that
// cannot be recorded: nothing ran) runs the step eagerly and keeps its key eager; after kMaxFailures
// such keys step graphs turn off for the engine, with a note. When the backend releases memory or code
// a recording may use (Backend::recording_epoch: an evicted cuDNN graph, a grown workspace or tile),
// every recording is dropped.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"
#include "graph/graph.h"

namespace tessera {

class StepGraphs {
 public:
  // on: EngineOptions::step_graphs (TESSERA_STEP_GRAPHS=0 turns them off: A/B runs).
  explicit StepGraphs(bool on);
  // Runs the step's ops: eagerly, recorded then replayed, or replayed. `program_serial` identifies the
  // program instance (Engine assigns a new one to every plan it makes).
  void run(const graph::GraphTemplate& g, const graph::Program& p, uint64_t program_serial,
           const ExecContext& c, const void* kv_pool, int64_t kv_rows);
  // Drops every recording (the engine's weights or workspace went away).
  void clear(Backend& b);
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }
  int64_t last_nodes() const { return last_nodes_; }  // kernels and copies of the last replayed step

  static constexpr size_t kMaxGraphs = 256;
  static constexpr int kMaxFailures = 8;

 private:
  static constexpr int64_t kSeen = -2, kNever = -3;  // seen once, not recorded yet; not recordable
  bool on_;
  std::map<std::vector<uint64_t>, int64_t> graphs_;  // key -> handle, kSeen or kNever
  int64_t replays_ = 0, captures_ = 0, last_nodes_ = 0;
  int failures_ = 0;
  uint64_t epoch_ = 0;  // Backend::recording_epoch() of the recordings held
};

}  // namespace tessera
