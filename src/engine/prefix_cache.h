// The cross-request prefix cache of a block-causal model's KV rows (LLaDA2; issue #31). Under block-causal
// attention the K / V rows of an attention block depend only on the tokens of that block and of the
// blocks before it, so requests whose canvases begin with the same whole blocks (a system prompt, a
// few-shot preamble, the earlier turns of a chat) can share those rows exactly. A radix tree over blocks
// of token ids, one tree per attention block size: each node is one block of token ids and its rows of
// every State tensor (packed as KvPool::copy_out writes them, on the backend), written by the request
// that first computed them. Bidirectional models are not served by it: there every row depends on the
// whole canvas, so no row is exact for another request.
// Its bytes are bounded by a cap and, through the Engine, by the memory budget: the least recently used
// leaves are evicted first; a node is never evicted while its children live (a prefix is whole).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace tessera {

class PrefixCache {
 public:
  PrefixCache(Backend& backend, size_t cap) : backend_(backend), cap_(cap) {}
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The data of the longest run of whole blocks of `tokens` (at most `blocks` of them) under attention
  // block `block`, root first; each is block_bytes long (the bytes the blocks were stored with; nodes of
  // another size, from another model layout, never match).
  std::vector<const void*> match(std::span<const int32_t> tokens, int block, int64_t blocks,
                                 size_t block_bytes);
  // Stores blocks [from, to) of `tokens` (blocks [0, from) must be stored: match them first) as long as
  // each fits the cap and `fits(block_bytes)` says the memory budget holds it; fill(b, dst) writes block b's
  // rows into dst. Evicts least recently used leaves (never the path being extended) to make room.
  // Returns the blocks stored.
  int64_t insert(std::span<const int32_t> tokens, int block, int64_t from, int64_t to, size_t block_bytes,
                 const std::function<void(int64_t, void*)>& fill, const std::function<bool(size_t)>& fits);
  // Frees least recently used leaves until at most `target` bytes are held; returns whether any was freed.
  bool evict_to(size_t target);
  // bytes() and stats() may be read from any thread (serve's /metrics) while the engine thread works.
  size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  size_t cap() const { return cap_; }

  struct Stats {
    int64_t lookups = 0, hit_blocks = 0, stored_blocks = 0, evicted_blocks = 0, nodes = 0;
  };
  Stats stats() const {
    return {lookups_.load(), hit_blocks_.load(), stored_blocks_.load(), evicted_blocks_.load(),
            nodes_.load()};
  }

 private:
  struct Node {
    std::vector<int32_t> tokens;  // one block
    void* data = nullptr;
    size_t bytes = 0;
    uint64_t used = 0;  // the last lookup or store that touched it
    Node* parent = nullptr;
    std::vector<std::unique_ptr<Node>> children;
  };
  Node* child(Node& n, std::span<const int32_t> block_tokens, size_t block_bytes) const;
  // The least recently used leaf outside `keep` (a path being extended), or nullptr.
  Node* lru_leaf(const std::vector<Node*>& keep);
  void erase(Node* leaf);

  Backend& backend_;
  size_t cap_;
  std::atomic<size_t> bytes_{0};
  uint64_t clock_ = 0;
  std::map<int, Node> roots_;  // per attention block size
  std::atomic<int64_t> lookups_{0}, hit_blocks_{0}, stored_blocks_{0}, evicted_blocks_{0}, nodes_{0};
};

}  // namespace tessera
