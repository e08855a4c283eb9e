// The KV cache pool: one backend buffer holding every State tensor of the KV-cache graph (the K and V
// caches of every layer) at rows() rows each, and the slots that share its rows. A slot is a region
// [base, base + capacity) of the rows, one request's canvas; it remembers which of its rows were
// written for its request, and under which attention block. Opening a slot takes the first gap of the
// rows large enough, else grows the pool and moves the live rows over; every growth is first put to
// the memory budget the pool is counted against (Budget, the Engine's).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tessera {

class KvPool {
 public:
  // The memory budget the pool is counted against, with what else is held across steps (the Engine:
  // --memory-budget, the weights and the SparseD patterns).
  class Budget {
   public:
    // Whether a memory budget is set (without one every growth fits).
    virtual bool limited() const = 0;
    // The bytes held across steps besides the pool: all of them, or only those a request holds now
    // (what release_idle() would not free).
    virtual size_t others_held(bool in_use_only) const = 0;
    // Whether the weights, `others` and `bytes` fit the budget; check_held throws the budget error naming
    // `what` unless they do.
    virtual bool held_fits(size_t others, size_t bytes) const = 0;
    virtual void check_held(size_t others, size_t bytes, const std::string& what) const = 0;
    // Frees what no request holds (the pool itself, through KvPool::release_if_idle, when no slot is
    // open); returns whether anything was freed.
    virtual bool release_idle() = 0;
    // The pool's buffer was replaced (its bytes, and the activation budget with them, changed).
    virtual void pool_resized() = 0;

   protected:
    ~Budget() = default;
  };

  // The row bytes of each State tensor in declaration order: tensor i's slice of the buffer starts at
  // (the row bytes of the tensors before it) * rows(). Asked once, when the first slot is placed.
  using Layout = std::function<std::vector<size_t>()>;

  // max_positions: the largest capacity a slot may have (the model's context).
  KvPool(Backend& backend, Budget& budget, int64_t max_positions, Layout layout);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // A new slot (never 0, the Engine's own) of `capacity` rows, every row unwritten, computed under
  // attention block `block`. Throws Error when the pool would have to grow beyond the budget.
  int open(int64_t capacity, int block);
  // Starts a new request on `slot`: every row unwritten, in place when the slot is open and holds
  // `capacity` rows, else placed anew (as open; the slot is opened if it was not).
  void reset(int slot, int64_t capacity, int block);
  // Frees the slot's region (a slot that is not open is ignored).
  void close(int slot);
  int slots_open() const;
  bool is_open(int slot) const;
  // Whether open(capacity) would fit the budget (always without one, or before the first slot).
  bool fits(int64_t capacity) const;
  // Frees the buffer when no slot is open; returns whether it did.
  bool release_if_idle();

  // A step of `slot` over a canvas of n rows under attention block `block`: throws Error unless the slot
  // is open and holds n rows; rows written under another block are forgotten (they saw another mask).
  void begin_step(int slot, int64_t n, int block);
  // Throws Error unless every row of [0, n) that is not in `computed` (ascending) was written.
  void check_written(int slot, int64_t n, std::span<const int32_t> computed) const;
  void mark_written(int slot, std::span<const int32_t> rows);
  // The first pool row of an open slot.
  int64_t base(int slot) const;
  // The attention block an open slot's rows were written under.
  int block(int slot) const;
  // Whether rows [lo, hi) of an open slot were written under `block`.
  bool written(int slot, int64_t lo, int64_t hi, int block) const;
  // Rows [row, row + n) of a slot, every State tensor's, packed tensor after tensor (row_bytes() * n
  // bytes on the backend), to `dst`; copy_in writes them from `src` and marks them written under
  // `block` (the slot's block becomes `block`). The prefix cache's transfers (prefix_cache.h).
  void copy_out(int slot, int64_t row, int64_t n, void* dst) const;
  void copy_in(int slot, int64_t row, int64_t n, const void* src, int block);

  void* data() const { return buf_; }
  size_t bytes() const { return bytes_; }
  // Bytes of one row of every State tensor (0 until the first slot is placed).
  size_t row_bytes() const { return row_bytes_; }
  int64_t rows() const { return rows_; }

 private:
  struct Slot {
    bool open = false;
    int64_t base = 0, capacity = 0;
    int block = 0;
    std::vector<uint8_t> written;
  };
  // The first base of `capacity` free rows among the open slots' regions (the end of the last region
  // when no gap is large enough, possibly past rows()).
  int64_t first_fit(int64_t capacity) const;
  void place(int slot, int64_t capacity, int block);
  // Grows the buffer to `rows` rows, keeping the open slots' rows.
  void grow(int64_t rows, const std::string& what);

  Backend& backend_;
  Budget& budget_;
  int64_t max_positions_ = 0;
  Layout layout_;
  std::vector<size_t> state_rows_;  // the row bytes of each State tensor (layout_())
  void* buf_ = nullptr;
  size_t bytes_ = 0, row_bytes_ = 0;
  int64_t rows_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace tessera
