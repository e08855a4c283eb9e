// The KV cache pool on its own (no model): the CPU backend's memory, two State tensors of 8 and 4 bytes
// per row, and a fake memory budget. Slots go to the first gap of the pool's rows, growth keeps the live
// rows' content, reset works in place or moves the slot, written rows are checked, and a growth the
// budget cannot hold is refused before anything changes.
#include "engine/kv_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr size_t kRow0 = 8, kRow1 = 4, kRowBytes = kRow0 + kRow1;

// A memory budget of `budget` bytes (0: none) holding `weights` and `others` (idle unless others_in_use;
// release_idle frees idle ones and an idle pool).
class FakeBudget final : public KvPool::Budget {
 public:
  size_t budget = 0, weights = 0, others = 0;
  bool others_in_use = true;
  KvPool* pool = nullptr;
  int releases = 0, resizes = 0;

  bool limited() const override { return budget > 0; }
  size_t others_held(bool in_use_only) const override { return in_use_only && !others_in_use ? 0 : others; }
  bool held_fits(size_t o, size_t bytes) const override {
    return budget == 0 || weights + o + bytes < budget;
  }
  void check_held(size_t o, size_t bytes, const std::string& what) const override {
    if (!held_fits(o, bytes)) fail("no room beside " + std::to_string(o) + " held bytes for " + what);
  }
  bool release_idle() override {
    ++releases;
    bool freed = pool->release_if_idle();
    if (!others_in_use && others > 0) {
      others = 0;
      freed = true;
    }
    return freed;
  }
  void pool_resized() override { ++resizes; }
};

struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  FakeBudget budget;
  int layouts = 0;  // times the layout was asked for
  KvPool pool{*backend, budget, 64, [this] {
                ++layouts;
                return std::vector<size_t>{kRow0, kRow1};
              }};
  Fixture() { budget.pool = &pool; }

  // Row r of `slot` in State tensor t (0 or 1) of the pool.
  uint8_t* row(int slot, int t, int64_t r) {
    const size_t before = t == 0 ? 0 : kRow0, width = t == 0 ? kRow0 : kRow1;
    return static_cast<uint8_t*>(pool.data()) + before * static_cast<size_t>(pool.rows()) +
           static_cast<size_t>(pool.base(slot) + r) * width;
  }
};

TEST(KvPool, PlacesSlotsInTheFirstGapAndGrowsByHalfWithoutABudget) {
  Fixture f;
  EXPECT_EQ(f.pool.row_bytes(), 0u);
  const int a = f.pool.open(4, 0);
  EXPECT_EQ(a, 1);  // slot 0 is the Engine's own
  EXPECT_EQ(f.pool.row_bytes(), kRowBytes);
  EXPECT_EQ(f.pool.base(a), 0);
  EXPECT_EQ(f.pool.rows(), 4);  // nothing live: exactly what the slot needs
  const int b = f.pool.open(4, 0), c = f.pool.open(4, 0);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(c, 3);
  EXPECT_EQ(f.pool.base(b), 4);
  EXPECT_EQ(f.pool.base(c), 8);
  EXPECT_EQ(f.pool.rows(), 12);  // live rows: 4 -> max(8, 6) -> max(12, 12)
  EXPECT_EQ(f.pool.bytes(), 12 * kRowBytes);

  f.pool.close(b);
  EXPECT_EQ(f.pool.slots_open(), 2);
  const int d = f.pool.open(3, 0);
  EXPECT_EQ(d, 2);               // the lowest closed slot
  EXPECT_EQ(f.pool.base(d), 4);  // the gap [4, 8)
  EXPECT_EQ(f.pool.rows(), 12);  // no growth
  const int e = f.pool.open(2, 0);
  EXPECT_EQ(e, 4);
  EXPECT_EQ(f.pool.base(e), 12);  // [7, 8) is too small
  EXPECT_EQ(f.pool.rows(), 18);   // max(14, 12 + 6)
  f.pool.reset(0, 5, 0);          // slot 0 opens on reset
  EXPECT_EQ(f.pool.base(0), 14);
  EXPECT_EQ(f.pool.slots_open(), 5);
  EXPECT_EQ(f.layouts, 1);
  f.pool.close(99);  // not a slot: ignored
  f.pool.close(-1);
  EXPECT_EQ(f.pool.slots_open(), 5);
}

TEST(KvPool, GrowthKeepsTheLiveRows) {
  Fixture f;
  const int a = f.pool.open(3, 0);
  for (int t = 0; t < 2; ++t)
    for (int64_t r = 0; r < 3; ++r)
      std::memset(f.row(a, t, r), static_cast<int>(10 * t + r + 1), t == 0 ? kRow0 : kRow1);
  const void* before = f.pool.data();
  const int resizes = f.budget.resizes;
  const int b = f.pool.open(10, 0);  // no gap: the pool grows and slot a's rows move with it
  EXPECT_NE(f.pool.data(), before);
  EXPECT_EQ(f.pool.rows(), 13);
  EXPECT_EQ(f.budget.resizes, resizes + 1);
  EXPECT_EQ(f.pool.base(a), 0);
  EXPECT_EQ(f.pool.base(b), 3);
  for (int t = 0; t < 2; ++t) {
    for (int64_t r = 0; r < 3; ++r) {
      const std::vector<uint8_t> want(t == 0 ? kRow0 : kRow1, static_cast<uint8_t>(10 * t + r + 1));
      EXPECT_EQ(std::memcmp(f.row(a, t, r), want.data(), want.size()), 0) << "tensor " << t << " row " << r;
    }
  }
}

TEST(KvPool, ResetsInPlaceOrMovesTheSlot) {
  Fixture f;
  const int a = f.pool.open(4, 0), b = f.pool.open(4, 0);
  const std::vector<int32_t> written = {0, 1, 2, 3};
  f.pool.mark_written(a, written);
  f.pool.check_written(a, 4, {});  // every row written
  f.pool.reset(a, 3, 0);           // fits its region: in place, every row unwritten
  EXPECT_EQ(f.pool.base(a), 0);
  test::expect_error([&] { f.pool.check_written(a, 3, {}); },
                     "canvas row 0 was never computed in this request");
  f.pool.reset(a, 6, 0);  // larger than its region: moved past slot b
  EXPECT_EQ(f.pool.base(a), 8);
  EXPECT_EQ(f.pool.base(b), 4);
  EXPECT_EQ(f.pool.slots_open(), 2);
  test::expect_error([&] { f.pool.reset(-1, 4, 0); }, "KV cache: no slot -1");
}

TEST(KvPool, ChecksWrittenRows) {
  Fixture f;
  const int s = f.pool.open(5, 0);
  f.pool.begin_step(s, 5, 0);
  const std::vector<int32_t> all = {0, 1, 2, 3, 4}, first = {0, 1}, rest = {2, 3, 4};
  f.pool.check_written(s, 5, all);  // computing every row needs nothing cached
  test::expect_error([&] { f.pool.check_written(s, 5, first); },
                     "KV cache: canvas row 2 was never computed in this request; compute it (or the whole "
                     "canvas) before reusing the cache");
  f.pool.mark_written(s, rest);
  f.pool.check_written(s, 5, first);
  f.pool.check_written(s, 4, first);  // a shorter canvas reads only its rows
  f.pool.begin_step(s, 5, 32);        // another attention block: the rows saw another mask
  test::expect_error([&] { f.pool.check_written(s, 5, first); }, "canvas row 2 was never computed");
  test::expect_error([&] { f.pool.begin_step(s, 6, 32); },
                     "KV cache: no cache for a canvas of 6 positions (call kv_cache_reset with the request's "
                     "canvas size first)");
  f.pool.close(s);
  test::expect_error([&] { f.pool.begin_step(s, 5, 32); }, "KV cache: no cache for a canvas of 5 positions");
  test::expect_error([&] { f.pool.begin_step(7, 1, 0); }, "KV cache: no cache for a canvas of 1 positions");
  test::expect_error([&] { f.pool.open(65, 0); },
                     "KV cache: a canvas of 65 positions does not fit the model's 64 positions");
  test::expect_error([&] { f.pool.open(0, 0); }, "KV cache: a canvas of 0 positions");
}

TEST(KvPool, RefusesGrowthBeyondTheBudget) {
  Fixture f;
  f.budget.budget = 100;
  EXPECT_TRUE(f.pool.fits(1000));   // no pool yet: open() answers
  const int a = f.pool.open(8, 0);  // 96 bytes < 100
  EXPECT_EQ(f.pool.bytes(), 96u);
  EXPECT_TRUE(f.pool.fits(0));
  EXPECT_FALSE(f.pool.fits(1));  // the old 96 bytes are held while the rows move into 108
  test::expect_error(
      [&] { f.pool.open(1, 0); },
      "no room beside 96 held bytes for a KV cache of 1 positions (12.0 B, K and V of every layer "
      "in the compute dtype), while the pool grows (the caches held are copied into the grown "
      "pool)");
  EXPECT_EQ(f.pool.slots_open(), 1);
  EXPECT_EQ(f.pool.rows(), 8);  // nothing changed
  EXPECT_EQ(f.budget.resizes, 1);
  EXPECT_FALSE(f.pool.release_if_idle());  // a slot is open

  f.pool.close(a);
  EXPECT_TRUE(f.pool.fits(8));   // the rows are there
  EXPECT_FALSE(f.pool.fits(9));  // 108 bytes alone exceed the budget
  EXPECT_TRUE(f.pool.release_if_idle());
  EXPECT_EQ(f.pool.bytes(), 0u);
  EXPECT_EQ(f.pool.rows(), 0);
  EXPECT_EQ(f.pool.data(), nullptr);

  // Idle bytes held elsewhere are freed when the growth would not fit beside them.
  f.budget.others = 20;
  f.budget.others_in_use = false;
  EXPECT_TRUE(f.pool.fits(7));  // (idle bytes do not count: they would be freed)
  const int releases = f.budget.releases;
  const int b = f.pool.open(7, 0);  // 84 bytes: 20 + 84 >= 100, then 0 + 84 < 100
  EXPECT_EQ(f.budget.releases, releases + 1);
  EXPECT_EQ(f.budget.others, 0u);
  EXPECT_EQ(f.pool.bytes(), 84u);
  f.pool.close(b);

  // Bytes a request holds are not freed: the growth is refused, naming them.
  f.budget.others = 20;
  f.budget.others_in_use = true;
  EXPECT_TRUE(f.pool.release_if_idle());
  EXPECT_FALSE(f.pool.fits(7));  // 20 + 84 >= 100
  test::expect_error(
      [&] { f.pool.open(7, 0); },
      "no room beside 20 held bytes for a KV cache of 7 positions (84.0 B, K and V of every layer "
      "in the compute dtype)");
  EXPECT_EQ(f.pool.slots_open(), 0);
  EXPECT_EQ(f.budget.others, 20u);
}

}  // namespace
}  // namespace tessera
