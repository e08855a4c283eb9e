// The BPE merge loop: symbols in a linked list, candidate pairs in a min-heap by merge rank
// (ties: leftmost first), stale candidates skipped - O(n log n) per word, also for the long
// single "words" of SentencePiece-style files that have no pre-tokenizer.
#include <queue>

#include "io/tokenizer_impl.h"

namespace tessera::tok {

namespace {
struct Sym {
  int32_t id;
  int32_t prev, next;
};
struct Cand {
  int32_t rank;
  int32_t left;
  int32_t left_id, right_id;
  bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};
uint64_t key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(std::string(word));
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Sym> syms;
  syms.reserve(word.size());
  auto push = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1});
    if (n > 0) syms[n - 1].next = n;
  };
  for (size_t i = 0; i < word.size();) {
    size_t start = i;
    uint32_t cp = next_codepoint(word, i);
    auto it = char_ids.find(cp);
    if (it != char_ids.end() && i - start > 0) {
      push(it->second);
      continue;
    }
    bool done = false;
    if (byte_fallback) {
      bool all = true;
      for (size_t k = start; k < i; ++k) all = all && byte_ids[static_cast<uint8_t>(word[k])] >= 0;
      if (all) {
        for (size_t k = start; k < i; ++k) push(byte_ids[static_cast<uint8_t>(word[k])]);
        done = true;
      }
    }
    if (!done && unk_id >= 0) {
      if (!(fuse_unk && !syms.empty() && syms.back().id == unk_id)) push(unk_id);
    }
    // without byte fallback or unk the character is dropped (as Hugging Face does)
  }
  if (syms.empty()) return;

  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto try_pair = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = syms[left].next;
    if (right < 0) return;
    auto it = merges.find(key(syms[left].id, syms[right].id));
    if (it != merges.end()) heap.push({it->second.rank, left, syms[left].id, syms[right].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) try_pair(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& l = syms[c.left];
    if (l.id != c.left_id || l.next < 0) continue;  // merged away or changed
    Sym& r = syms[l.next];
    if (r.id != c.right_id) continue;
    l.id = merges.find(key(c.left_id, c.right_id))->second.result;
    r.id = -1;  // dead
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    try_pair(l.prev);
    try_pair(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace tessera::tok
