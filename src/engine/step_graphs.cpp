#include "engine/step_graphs.h"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tessera {
namespace {

void put(std::vector<uint64_t>& k, const SampleParams& s) {
  k.push_back(static_cast<uint64_t>(s.conf) | static_cast<uint64_t>(s.gumbel) << 8 |
              static_cast<uint64_t>(s.logprobs) << 9);
  k.push_back(std::bit_cast<uint32_t>(s.temperature) | static_cast<uint64_t>(std::bit_cast<uint32_t>(s.top_p))
                                                           << 32);
  k.push_back(static_cast<uint64_t>(static_cast<uint32_t>(s.top_k)) |
              static_cast<uint64_t>(static_cast<uint32_t>(s.suppress_token)) << 32);
  // The seed reaches the kernels only through noise (temperature > 0, random confidence); greedy steps
  // of every seed share a recording (a request's steps each get their own seed).
  k.push_back(s.temperature > 0.0f || s.conf == ConfKind::Random ? s.seed : 0);
}

}  // namespace

StepGraphs::StepGraphs(bool on) : on_(on) {
  const char* env = std::getenv("TESSERA_STEP_GRAPHS");
  if (env != nullptr && std::string(env) == "0") on_ = false;
}

void StepGraphs::run(const graph::GraphTemplate& g, const graph::Program& p, uint64_t program_serial,
                     const ExecContext& c, const void* kv_pool, int64_t kv_rows) {
  Backend& b = *c.backend;
  if (!on_ || !b.can_capture() || c.sparse != nullptr || c.des != nullptr || !c.dump_dir.empty() ||
      c.op_seconds != nullptr) {
    execute(g, p, c);
    return;
  }
  if (b.recording_epoch() != epoch_) {  // the backend released what earlier recordings use
    clear(b);
    epoch_ = b.recording_epoch();
  }
  std::vector<uint64_t> key{program_serial, reinterpret_cast<uintptr_t>(c.base),
                            reinterpret_cast<uintptr_t>(kv_pool), static_cast<uint64_t>(kv_rows)};
  if (c.sample != nullptr) put(key, *c.sample);
  for (const SampleParams& s : c.sample_seqs) put(key, s);
  for (int64_t r : c.sample_rows) key.push_back(static_cast<uint64_t>(r));
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {  // first run: plans and buffers are made eagerly
    execute(g, p, c);
    if (graphs_.size() >= kMaxGraphs) clear(b);
    graphs_.emplace(std::move(key), kSeen);
    return;
  }
  if (it->second == kNever) {
    execute(g, p, c);
    return;
  }
  if (it->second == kSeen) {  // second run: record, then replay
    b.capture_begin();
    int64_t h = -1;
    try {
      execute(g, p, c);
      h = b.capture_end();
    } catch (const std::exception&) {  // an op that cannot be recorded
      h = b.capture_end();
      if (h >= 0) b.release_graph(h);
      h = -1;
    }
    if (h < 0) {  // nothing ran: this step runs op by op, and so does its key from now on
      it->second = kNever;
      if (++failures_ == kMaxFailures) {
        std::fprintf(stderr, "note: steps could not be recorded as CUDA graphs; they run op by op\n");
        on_ = false;
        clear(b);
      }
      execute(g, p, c);
      return;
    }
    it->second = h;
    ++captures_;
  }
  b.replay(it->second);
  last_nodes_ = b.graph_nodes(it->second);
  ++replays_;
}

void StepGraphs::clear(Backend& b) {
  for (auto& [k, h] : graphs_)
    if (h >= 0) b.release_graph(h);
  graphs_.clear();
}

}  // namespace tessera
