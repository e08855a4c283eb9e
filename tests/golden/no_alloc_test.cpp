// After warm-up, a forward step makes no heap allocation. malloc and friends are interposed in
// this test binary (glibc exports __libc_* entry points) and counted while a step runs.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>

#include "engine/engine.h"
#include "tiny_models.h"

#if !defined(__SANITIZE_ADDRESS__)
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
inline void note() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace
extern "C" {
void* malloc(size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  note();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  note();
  return __libc_realloc(p, n);
}
int posix_memalign(void** p, size_t al, size_t n) {
  note();
  *p = __libc_memalign(al, n);
  return *p == nullptr ? 12 : 0;
}
void* aligned_alloc(size_t al, size_t n) {
  note();
  return __libc_memalign(al, n);
}
void* memalign(size_t al, size_t n) {
  note();
  return __libc_memalign(al, n);
}
}

namespace tessera {
namespace {

TEST(NoAllocation, ForwardStepAfterWarmupAllocatesNothing) {
  for (const char* fam : {"llada", "dream"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 8");
    for (Precision prec : {Precision::BF16, Precision::F32}) {
      EngineOptions o;
      o.precision = prec;
      o.k_ffn = 2;
      o.k_logits = 2;
      auto e = Engine::load(dir, o);
      std::vector<int32_t> canvas(200, e->mask_token());
      for (size_t i = 0; i < 50; ++i) canvas[i] = static_cast<int32_t>(i % 100);
      std::vector<int32_t> pos;
      for (int32_t i = 50; i < 200; ++i) pos.push_back(i);
      std::vector<int32_t> tok(pos.size());
      std::vector<float> conf(pos.size());
      SampleParams sp;
      e->predict(canvas, pos, sp, tok, conf);  // warm-up: plans, primitives, staging capacity
      e->predict(canvas, pos, sp, tok, conf);
      g_allocs = 0;
      g_counting = true;
      for (int step = 0; step < 3; ++step) {
        canvas[static_cast<size_t>(50 + step)] = tok[static_cast<size_t>(step)];  // the canvas changes
        sp.seed = static_cast<uint64_t>(step);
        e->predict(canvas, pos, sp, tok, conf);
      }
      g_counting = false;
      EXPECT_EQ(g_allocs.load(), 0) << fam << (prec == Precision::BF16 ? " bf16" : " f32");
    }
  }
}

}  // namespace
}  // namespace tessera
#endif
