#include "engine/prefix_cache.h"

#include <algorithm>

namespace tessera {

PrefixCache::~PrefixCache() {
  for (auto& [block, root] : roots_) {
    std::vector<Node*> stack{&root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (n->data != nullptr) backend_.free_weights(n->data);
      for (auto& c : n->children) stack.push_back(c.get());
    }
  }
}

PrefixCache::Node* PrefixCache::child(Node& n, std::span<const int32_t> block_tokens,
                                      size_t block_bytes) const {
  for (auto& c : n.children)
    if (c->bytes == block_bytes &&
        std::equal(c->tokens.begin(), c->tokens.end(), block_tokens.begin(), block_tokens.end()))
      return c.get();
  return nullptr;
}

std::vector<const void*> PrefixCache::match(std::span<const int32_t> tokens, int block, int64_t blocks,
                                            size_t block_bytes) {
  ++lookups_;
  std::vector<const void*> out;
  const auto it = roots_.find(block);
  if (it == roots_.end() || block <= 0) return out;
  const uint64_t now = ++clock_;
  Node* n = &it->second;
  for (int64_t b = 0; b < blocks && static_cast<size_t>((b + 1) * block) <= tokens.size(); ++b) {
    n = child(*n, tokens.subspan(static_cast<size_t>(b * block), static_cast<size_t>(block)), block_bytes);
    if (n == nullptr) break;
    n->used = now;
    out.push_back(n->data);
  }
  hit_blocks_ += static_cast<int64_t>(out.size());
  return out;
}

int64_t PrefixCache::insert(std::span<const int32_t> tokens, int block, int64_t from, int64_t to,
                            size_t block_bytes, const std::function<void(int64_t, void*)>& fill,
                            const std::function<bool(size_t)>& fits) {
  if (block <= 0 || block_bytes == 0 || block_bytes > cap_) return 0;
  const uint64_t now = ++clock_;
  Node* n = &roots_[block];
  std::vector<Node*> path{n};
  for (int64_t b = 0; b < from; ++b) {  // the stored part of the path
    n = child(*n, tokens.subspan(static_cast<size_t>(b * block), static_cast<size_t>(block)), block_bytes);
    if (n == nullptr) return 0;  // evicted meanwhile: a later request stores it again
    n->used = now;
    path.push_back(n);
  }
  int64_t stored = 0;
  for (int64_t b = from; b < to && static_cast<size_t>((b + 1) * block) <= tokens.size(); ++b) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(b * block), static_cast<size_t>(block));
    if (Node* have = child(*n, block_tokens, block_bytes)) {  // another request stored it first
      have->used = now;
      n = have;
      path.push_back(n);
      continue;
    }
    // Room: within the cap and the budget, evicting other leaves first.
    while (bytes_.load() + block_bytes > cap_ || !fits(block_bytes)) {
      Node* victim = lru_leaf(path);
      if (victim == nullptr) return stored;
      erase(victim);
    }
    auto node = std::make_unique<Node>();
    node->tokens.assign(block_tokens.begin(), block_tokens.end());
    node->data = backend_.alloc_weights(block_bytes);
    node->bytes = block_bytes;
    node->used = now;
    node->parent = n;
    fill(b, node->data);
    bytes_ += block_bytes;
    ++stored_blocks_;
    ++nodes_;
    ++stored;
    n->children.push_back(std::move(node));
    n = n->children.back().get();
    path.push_back(n);
  }
  return stored;
}

PrefixCache::Node* PrefixCache::lru_leaf(const std::vector<Node*>& keep) {
  Node* best = nullptr;
  for (auto& [block, root] : roots_) {
    std::vector<Node*> stack{&root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (auto& c : n->children) stack.push_back(c.get());
      if (n == &root || !n->children.empty() || std::find(keep.begin(), keep.end(), n) != keep.end())
        continue;
      if (best == nullptr || n->used < best->used) best = n;
    }
  }
  return best;
}

void PrefixCache::erase(Node* leaf) {
  backend_.free_weights(leaf->data);
  bytes_ -= leaf->bytes;
  ++evicted_blocks_;
  --nodes_;
  auto& siblings = leaf->parent->children;
  siblings.erase(
      std::find_if(siblings.begin(), siblings.end(), [&](const auto& c) { return c.get() == leaf; }));
}

bool PrefixCache::evict_to(size_t target) {
  bool freed = false;
  while (bytes_.load() > target) {
    Node* victim = lru_leaf({});
    if (victim == nullptr) break;
    erase(victim);
    freed = true;
  }
  return freed;
}

}  // namespace tessera
