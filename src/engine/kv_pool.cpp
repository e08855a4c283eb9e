#include "engine/kv_pool.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "memory/chunk_optimizer.h"

namespace tessera {

KvPool::KvPool(Backend& backend, Budget& budget, int64_t max_positions, Layout layout)
    : backend_(backend), budget_(budget), max_positions_(max_positions), layout_(std::move(layout)) {}

KvPool::~KvPool() {
  if (buf_ != nullptr) backend_.free_weights(buf_);
}

int64_t KvPool::first_fit(int64_t capacity) const {
  std::vector<std::pair<int64_t, int64_t>> used;  // [base, end) of the open regions, by base
  for (const Slot& k : slots_)
    if (k.open) used.emplace_back(k.base, k.base + k.capacity);
  std::sort(used.begin(), used.end());
  int64_t at = 0;
  for (const auto& [lo, hi] : used) {
    if (lo - at >= capacity) return at;
    at = std::max(at, hi);
  }
  return at;
}

void KvPool::grow(int64_t rows, const std::string& what) {
  bool live = false;  // rows of open slots that must move into the new buffer
  for (const Slot& k : slots_) live = live || k.open;
  const size_t bytes = row_bytes_ * static_cast<size_t>(rows);
  if (!live) {  // nothing to keep: the old buffer goes first
    if (!budget_.held_fits(budget_.others_held(false), bytes)) budget_.release_idle();
    budget_.check_held(budget_.others_held(false), bytes, what);
    if (buf_ != nullptr) backend_.free_weights(buf_);
    buf_ = nullptr;
    bytes_ = 0;
    rows_ = 0;
    buf_ = backend_.alloc_weights(bytes);
    bytes_ = bytes;
    rows_ = rows;
    budget_.pool_resized();
    return;
  }
  // The old buffer is held while its rows are copied (idle patterns are freed first: rows are live).
  if (!budget_.held_fits(bytes_ + budget_.others_held(false), bytes)) budget_.release_idle();
  budget_.check_held(bytes_ + budget_.others_held(false), bytes,
                     what + ", while the pool grows (the caches held are copied into the grown pool)");
  void* grown = backend_.alloc_weights(bytes);
  // Each State tensor's slice keeps its first rows_ rows.
  const auto old_rows = static_cast<size_t>(rows_);
  size_t before = 0;
  for (const size_t row : state_rows_) {
    backend_.copy_on_device(static_cast<char*>(grown) + before * static_cast<size_t>(rows),
                            static_cast<char*>(buf_) + before * old_rows, row * old_rows);
    before += row;
  }
  backend_.synchronize();
  backend_.free_weights(buf_);
  buf_ = grown;
  bytes_ = bytes;
  rows_ = rows;
  budget_.pool_resized();
}

void KvPool::place(int slot, int64_t capacity, int block) {
  TESSERA_CHECK(capacity > 0 && capacity <= max_positions_,
                "KV cache: a canvas of " + std::to_string(capacity) + " positions does not fit the model's " +
                    std::to_string(max_positions_) + " positions");
  if (row_bytes_ == 0) {  // one canvas row of every State tensor
    state_rows_ = layout_();
    for (const size_t row : state_rows_) row_bytes_ += row;
  }
  if (slots_.size() <= static_cast<size_t>(slot)) slots_.resize(static_cast<size_t>(slot) + 1);
  slots_[static_cast<size_t>(slot)].open = false;
  const int64_t base = first_fit(capacity);
  if (base + capacity > rows_) {
    // Without a budget a pool that moves live rows grows by half at least, so that growth stays rare.
    int64_t rows = base + capacity;
    if (!budget_.limited() && slots_open() > 0) rows = std::max(rows, rows_ + rows_ / 2);
    const size_t bytes = row_bytes_ * static_cast<size_t>(capacity);
    grow(rows, "a KV cache of " + std::to_string(capacity) + " positions (" +
                   memory::format_bytes(static_cast<double>(bytes)) +
                   ", K and V of every layer in the compute dtype)");
  }
  Slot& k = slots_[static_cast<size_t>(slot)];
  k.open = true;
  k.base = base;
  k.capacity = capacity;
  k.block = block;
  k.written.assign(static_cast<size_t>(capacity), 0);
}

int KvPool::open(int64_t capacity, int block) {
  size_t slot = 1;  // slot 0 is the engine's own
  while (slot < slots_.size() && slots_[slot].open) ++slot;
  place(static_cast<int>(slot), capacity, block);
  return static_cast<int>(slot);
}

void KvPool::reset(int slot, int64_t capacity, int block) {
  TESSERA_CHECK(slot >= 0, "KV cache: no slot " + std::to_string(slot));
  if (static_cast<size_t>(slot) < slots_.size() && slots_[static_cast<size_t>(slot)].open && capacity > 0 &&
      slots_[static_cast<size_t>(slot)].capacity >= capacity) {
    Slot& k = slots_[static_cast<size_t>(slot)];
    k.block = block;
    std::fill(k.written.begin(), k.written.end(), uint8_t{0});
    return;
  }
  close(slot);
  place(slot, capacity, block);
}

void KvPool::close(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) return;
  Slot& k = slots_[static_cast<size_t>(slot)];
  k.open = false;
  k.written = {};
}

int KvPool::slots_open() const {
  int n = 0;
  for (const Slot& k : slots_) n += k.open ? 1 : 0;
  return n;
}

bool KvPool::is_open(int slot) const {
  return slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[static_cast<size_t>(slot)].open;
}

bool KvPool::fits(int64_t capacity) const {
  if (!budget_.limited() || row_bytes_ == 0) return true;  // (no pool yet: open checks it)
  const int64_t need = first_fit(capacity) + capacity;
  if (need <= rows_) return true;
  // As grow: with live rows the old buffer is held while they are copied into the grown one. Idle
  // patterns would be freed first (release_idle).
  return budget_.held_fits(budget_.others_held(true) + (slots_open() > 0 ? bytes_ : 0),
                           row_bytes_ * static_cast<size_t>(need));
}

bool KvPool::release_if_idle() {
  if (buf_ == nullptr || slots_open() > 0) return false;
  backend_.free_weights(buf_);
  buf_ = nullptr;
  bytes_ = 0;
  rows_ = 0;
  return true;
}

void KvPool::begin_step(int slot, int64_t n, int block) {
  TESSERA_CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size() &&
                    slots_[static_cast<size_t>(slot)].open && n <= slots_[static_cast<size_t>(slot)].capacity,
                "KV cache: no cache for a canvas of " + std::to_string(n) +
                    " positions (call kv_cache_reset with the request's canvas size first)");
  Slot& k = slots_[static_cast<size_t>(slot)];
  if (k.block != block) {  // its rows saw another attention mask
    std::fill(k.written.begin(), k.written.end(), uint8_t{0});
    k.block = block;
  }
}

void KvPool::check_written(int slot, int64_t n, std::span<const int32_t> computed) const {
  const Slot& k = slots_[static_cast<size_t>(slot)];
  size_t next = 0;  // index of the next computed row
  for (int64_t r = 0; r < n; ++r) {
    if (next < computed.size() && computed[next] == r) {
      ++next;
    } else if (k.written[static_cast<size_t>(r)] == 0) {
      fail("KV cache: canvas row " + std::to_string(r) +
           " was never computed in this request; compute it (or the whole canvas) before reusing the cache");
    }
  }
}

void KvPool::mark_written(int slot, std::span<const int32_t> rows) {
  Slot& k = slots_[static_cast<size_t>(slot)];
  for (const int32_t r : rows) k.written[static_cast<size_t>(r)] = 1;
}

int64_t KvPool::base(int slot) const {
  return slots_[static_cast<size_t>(slot)].base;
}

int KvPool::block(int slot) const {
  return slots_[static_cast<size_t>(slot)].block;
}

bool KvPool::written(int slot, int64_t lo, int64_t hi, int block) const {
  if (!is_open(slot)) return false;
  const Slot& k = slots_[static_cast<size_t>(slot)];
  if (k.block != block || lo < 0 || hi > k.capacity) return false;
  for (int64_t r = lo; r < hi; ++r)
    if (k.written[static_cast<size_t>(r)] == 0) return false;
  return true;
}

void KvPool::copy_out(int slot, int64_t row, int64_t n, void* dst) const {
  TESSERA_CHECK(is_open(slot) && row >= 0 && row + n <= slots_[static_cast<size_t>(slot)].capacity,
                "KV cache: rows out of the slot");
  const auto first = static_cast<size_t>(base(slot) + row), rows = static_cast<size_t>(rows_);
  size_t before = 0, at = 0;
  for (const size_t rb : state_rows_) {
    backend_.copy_on_device(static_cast<char*>(dst) + at,
                            static_cast<const char*>(buf_) + before * rows + first * rb,
                            rb * static_cast<size_t>(n));
    at += rb * static_cast<size_t>(n);
    before += rb;
  }
}

void KvPool::copy_in(int slot, int64_t row, int64_t n, const void* src, int block) {
  TESSERA_CHECK(is_open(slot) && row >= 0 && row + n <= slots_[static_cast<size_t>(slot)].capacity,
                "KV cache: rows out of the slot");
  Slot& k = slots_[static_cast<size_t>(slot)];
  if (k.block != block) {
    std::fill(k.written.begin(), k.written.end(), uint8_t{0});
    k.block = block;
  }
  const auto first = static_cast<size_t>(k.base + row), rows = static_cast<size_t>(rows_);
  size_t before = 0, at = 0;
  for (const size_t rb : state_rows_) {
    backend_.copy_on_device(static_cast<char*>(buf_) + before * rows + first * rb,
                            static_cast<const char*>(src) + at, rb * static_cast<size_t>(n));
    at += rb * static_cast<size_t>(n);
    before += rb;
  }
  std::fill_n(k.written.begin() + row, n, uint8_t{1});
}

}  // namespace tessera
