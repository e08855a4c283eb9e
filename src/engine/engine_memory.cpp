// Engine: step planning (the planned program of each step shape, cached) and the memory budget shared
// by the plans, the weights and the buffers held across steps (the KV cache pool, the SparseD patterns).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "engine/engine.h"
#include "memory/chunk_optimizer.h"

namespace tessera {

const graph::Program& Engine::program_for(OutputMode mode, graph::StepShape shape, bool kv_cache) {
  size_t floor = 0;
  const graph::Program* p = try_program(mode, shape, kv_cache, floor);
  if (p == nullptr) fail_budget(mode, shape, floor);
  return *p;
}

const graph::Program* Engine::try_program(OutputMode mode, graph::StepShape shape, bool kv_cache,
                                          size_t& floor) {
  const PlanKey key{static_cast<int>(mode) + kOutputModes * variant(kv_cache), shape.n_query, shape.n_kv,
                    shape.n_logits, shape.n_seqs};
  auto it = plans_.find(key);
  last_.plan_cached = it != plans_.end();
  if (it == plans_.end()) {
    const graph::GraphTemplate& g = model_->graph(mode, kv_cache, causal_, draft_);
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
    c.prog.serial = ++program_serial_;
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

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss = std::stoul(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) m.peak = std::stoul(line.substr(6)) * 1024;
    if (line.rfind("RssAnon:", 0) == 0) m.anon = std::stoul(line.substr(8)) * 1024;
  }
  return m;
}

size_t mapped_code_resident(const std::string& model_path) {
  // The checkpoint's files as the kernel names them: resolved, since a hub cache's files are links.
  namespace fs = std::filesystem;
  std::set<std::string> model_files;
  std::error_code ec;
  const auto add = [&](const fs::path& p) {
    const fs::path c = fs::canonical(p, ec);
    if (!ec) model_files.insert(c.string());
  };
  if (fs::is_directory(model_path, ec)) {
    for (const auto& e : fs::directory_iterator(model_path, ec)) add(e.path());
  } else {
    add(model_path);
  }
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool counted = false;
  size_t bytes = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    if (std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < line.find(' ')) {
      // A mapping's header: "start-end perms offset dev inode [path]"; a file's path starts with '/'.
      const size_t slash = line.find(" /");
      counted = slash != std::string::npos && !model_files.contains(line.substr(slash + 1));
    } else if (counted && line.rfind("Rss:", 0) == 0) {
      bytes += std::stoul(line.substr(4)) * 1024;
    }
  }
  return bytes;
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
  const size_t w = (model_ ? model_->weight_bytes() : 0) + opt_.runtime_bytes + kv_->bytes() +
                   sparse_.bytes() + prefix_bytes();
  return opt_.memory_budget > w ? opt_.memory_budget - w : 0;
}

void Engine::add_runtime_bytes(size_t bytes) {
  opt_.runtime_bytes += bytes;
  plans_.clear();  // the activation budget changed
}

void Engine::set_memory_budget(size_t bytes) {
  opt_.memory_budget = bytes;
  plans_.clear();
  check_weights_fit();
}

// At load only the weights are checked: a budget the runtime's share leaves no room in is refused by the
// first request's plan, which names the weights, the runtime and the floor.
void Engine::check_weights_fit() const {
  if (opt_.memory_budget == 0 || model_->weight_bytes() < opt_.memory_budget) return;
  tessera::fail_budget("memory budget " + memory::format_bytes(static_cast<double>(opt_.memory_budget)) +
                       " is not larger than the weights alone (" +
                       memory::format_bytes(static_cast<double>(model_->weight_bytes())) +
                       "): no context fits; the budget counts the weights, the runtime and the planned "
                       "activations");
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
  const size_t per_token = kv_->bytes() > 0 ? kv_->row_bytes() : 0;
  const int64_t sparse_block = sparse_.on() ? sparse_.block() : 0;
  const size_t budget =
      activation_budget() + (per_token > 0 ? kv_->bytes() : 0) + (sparse_.on() ? sparse_.bytes() : 0);
  const ModelConfig& cfg = model_->config();
  const int64_t l_max = memory::largest_context(model_->graph(mode), ratio, budget, [&](int64_t L) {
    return static_cast<size_t>(L) * per_token +
           (sparse_block > 0 ? static_cast<size_t>(cfg.sparse_pattern_bytes(L, sparse_block)) : 0);
  });
  char r[32];
  std::snprintf(r, sizeof r, "%.3g", ratio);
  const auto gib = [](size_t b) { return memory::format_bytes(static_cast<double>(b)); };
  tessera::fail_budget(
      "memory budget " + gib(opt_.memory_budget) + " (" + std::to_string(opt_.memory_budget) +
      " bytes) is too small for a step of " + std::to_string(shape.n_query) + " tokens with " +
      std::to_string(shape.n_logits) + " logit rows: the weights take " + gib(model_->weight_bytes()) +
      ", the runtime " + gib(opt_.runtime_bytes) + " and the activations need at least " + gib(floor) +
      " (the non-chunkable floor: FFN and logits chunked to one row), " +
      gib(model_->weight_bytes() + opt_.runtime_bytes + floor) + " (" +
      std::to_string(model_->weight_bytes() + opt_.runtime_bytes + floor) +
      " bytes) in all. The largest context that fits this budget is " + std::to_string(l_max) +
      " tokens (at the same mask ratio " + r + "); raise the budget or shorten the request.");
}

bool Engine::held_fits(size_t others, size_t bytes) const {
  return opt_.memory_budget == 0 ||
         model_->weight_bytes() + opt_.runtime_bytes + others + bytes < opt_.memory_budget;
}

void Engine::check_held(size_t others, size_t bytes, const std::string& what) const {
  if (held_fits(others, bytes)) return;
  tessera::fail_budget(
      "memory budget " + memory::format_bytes(static_cast<double>(opt_.memory_budget)) +
      " cannot hold the weights (" + memory::format_bytes(static_cast<double>(model_->weight_bytes())) + ")" +
      (others > 0
           ? " and what the requests already hold (" + memory::format_bytes(static_cast<double>(others)) + ")"
           : std::string()) +
      " plus " + what);
}

size_t Engine::others_held(bool in_use_only) const {
  // The prefix cache is never in use between steps: release_idle empties it.
  return (in_use_only && !sparse_.on() ? 0 : sparse_.bytes()) + (in_use_only ? 0 : prefix_bytes());
}

bool Engine::release_idle() {
  bool freed = prefix_ != nullptr && prefix_->evict_to(0);
  freed = kv_->release_if_idle() || freed;
  freed = sparse_.release_if_idle(*backend_) || freed;
  if (freed) plans_.clear();
  return freed;
}

void Engine::pool_resized() {
  if (opt_.memory_budget > 0) plans_.clear();  // the activation budget changed
}

void Engine::grow_held(HeldBuffer& buf, size_t bytes, const std::string& what) {
  // What is held besides this buffer (release_idle may free it).
  if (!held_fits(kv_->bytes() + sparse_.bytes() + prefix_bytes() - buf.bytes, bytes)) release_idle();
  check_held(kv_->bytes() + sparse_.bytes() + prefix_bytes() - buf.bytes, bytes, what);
  buf.free(*backend_);
  buf.data = backend_->alloc_weights(bytes);
  buf.bytes = bytes;
  if (opt_.memory_budget > 0) plans_.clear();  // the activation budget shrank
}

}  // namespace tessera
