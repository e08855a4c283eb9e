// After warm-up, a forward step makes no heap allocation. malloc and friends are interposed in
// this test binary (glibc exports __libc_* entry points) and counted while a step runs.
#include <gtest/gtest.h>

// operator delete below frees what the interposed operator new got from __libc_malloc.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
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
std::atomic<long> g_allocs{0};      // allocations from tessera's own code
std::atomic<long> g_lib_allocs{0};  // inside the runtimes: oneDNN's per-execute argument map, libgomp teams
std::atomic<long> g_lib_bytes{0};
void* g_callers[64];
bool from_dnnl(void* caller) {
  Dl_info info{};
  return dladdr(caller, &info) != 0 && info.dli_fname != nullptr &&
         (std::strstr(info.dli_fname, "libdnnl") != nullptr ||
          std::strstr(info.dli_fname, "libgomp") != nullptr);
}
#define note_n(bytes)                                                            \
  do {                                                                           \
    if (g_counting.load(std::memory_order_relaxed)) {                            \
      void* caller = __builtin_extract_return_addr(__builtin_return_address(0)); \
      if (from_dnnl(caller)) {                                                   \
        g_lib_allocs.fetch_add(1);                                               \
        g_lib_bytes.fetch_add(static_cast<long>(bytes));                         \
      } else {                                                                   \
        const long k = g_allocs.fetch_add(1, std::memory_order_relaxed);         \
        if (k < 64) g_callers[k] = caller;                                       \
      }                                                                          \
    }                                                                            \
  } while (0)
}  // namespace
extern "C" {
void* malloc(size_t n) {
  note_n(n);
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  note_n(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  note_n(n);
  return __libc_realloc(p, n);
}
int posix_memalign(void** p, size_t al, size_t n) {
  note_n(n);
  *p = __libc_memalign(al, n);
  return *p == nullptr ? 12 : 0;
}
void* aligned_alloc(size_t al, size_t n) {
  note_n(n);
  return __libc_memalign(al, n);
}
void* memalign(size_t al, size_t n) {
  note_n(n);
  return __libc_memalign(al, n);
}
}

void* operator new(size_t n) {
  note_n(n);
  void* p = __libc_malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  free(p);
}
void operator delete[](void* p) noexcept {
  free(p);
}
void operator delete(void* p, size_t) noexcept {
  free(p);
}
void operator delete[](void* p, size_t) noexcept {
  free(p);
}

namespace tessera {
namespace {

TEST(NoAllocation, ForwardStepAfterWarmupAllocatesNothing) {
  // The tiny checkpoints of three families, and two GGUF files whose weights stay quantized (a q4_K
  // LLaDA; the LLaDA-MoE fixture re-quantized to q8_0 / q4_0 experts): the dequantized panels reuse one
  // buffer sized at warm-up.
  const std::filesystem::path gguf = test::source_dir() / "tests/data/gguf";
  const std::filesystem::path moe_q = test::temp_dir("no_alloc_gguf") / "llada-moe-q8_0.gguf";
  test::requantize_gguf(gguf / "llada-moe-bf16.gguf", moe_q);
  for (const char* fam : {"llada", "dream", "llada_moe", "gguf-q4_k", "gguf-moe-q8_0"}) {
    std::filesystem::path dir;
    if (std::string(fam) == "gguf-q4_k") {
      dir = gguf / "llada-w256-q4_k.gguf";
    } else if (std::string(fam) == "gguf-moe-q8_0") {
      dir = moe_q;
    } else {
      TESSERA_TINY_OR_SKIP(tiny, fam, "--seed 8");
      dir = tiny;
    }
    for (Precision prec : {Precision::BF16, Precision::F32}) {
      EngineOptions o;
      o.precision = prec;
      o.k_ffn = 2;
      o.k_logits = 2;
      auto e = Engine::load(dir, o);
      const char* what = prec == Precision::BF16 ? "bf16" : "f32";
      // Three steps on a canvas of `len` (its first quarter prompt) after two of warm-up; the bytes the
      // runtimes allocated.
      auto three_steps = [&](size_t len) {
        std::vector<int32_t> canvas(len, e->mask_token());
        for (size_t i = 0; i < len / 4; ++i) canvas[i] = static_cast<int32_t>(i % 100);
        std::vector<int32_t> pos;
        for (auto i = static_cast<int32_t>(len / 4); i < static_cast<int32_t>(len); ++i) pos.push_back(i);
        std::vector<int32_t> tok(pos.size());
        std::vector<float> conf(pos.size());
        SampleParams sp;
        e->predict(canvas, pos, sp, tok, conf);  // warm-up: plans, primitives, staging capacity
        e->predict(canvas, pos, sp, tok, conf);
        g_allocs = 0;
        g_lib_allocs = 0;
        g_lib_bytes = 0;
        g_counting = true;
        for (int step = 0; step < 3; ++step) {
          canvas[len / 4 + static_cast<size_t>(step)] = tok[static_cast<size_t>(step)];  // the canvas changes
          sp.seed = static_cast<uint64_t>(step);
          e->predict(canvas, pos, sp, tok, conf);
        }
        g_counting = false;
        for (long i = 0; i < std::min(g_allocs.load(), 8L); ++i) {
          Dl_info info{};
          dladdr(g_callers[i], &info);
          std::printf(
              "allocation from %s %s +%ld\n", info.dli_fname ? info.dli_fname : "?",
              info.dli_sname ? info.dli_sname : "?",
              static_cast<long>(static_cast<char*>(g_callers[i]) - static_cast<char*>(info.dli_fbase)));
        }
        std::printf(
            "%s %s, canvas %zu: %ld allocations in tessera, %ld inside oneDNN/libgomp (%ld bytes) over 3 "
            "steps\n",
            fam, what, len, g_allocs.load(), g_lib_allocs.load(), g_lib_bytes.load());
        EXPECT_EQ(g_allocs.load(), 0) << fam << " " << what << ", canvas " << len;
        return g_lib_bytes.load();
      };
      // oneDNN 2.6 builds a small argument map inside every primitive execution (larger where one thread
      // picks other kernels) and libgomp may allocate a team descriptor: the only heap traffic of a step,
      // small and independent of the sequence length. Every tensor lives in the planned workspace;
      // tessera itself allocates nothing.
      const long short_canvas = three_steps(200), long_canvas = three_steps(400);
      EXPECT_LT(short_canvas, 3 * 128 * 1024) << fam << " " << what;
      EXPECT_LE(long_canvas, short_canvas + short_canvas / 8)
          << fam << " " << what << ": grows with the canvas";
    }
  }
}

// The GEMM primitives (oneDNN matmuls) of a generation: its first forward makes them for its shapes;
// a later step makes at most one, its LM head's last gather tile, whose row count is that step's masked
// rows (exact shapes are faster than padded ones here: docs/PERF.md, issue #34); and a second request of
// the same shapes, as in a server, makes none.
TEST(NoAllocation, ASecondGenerationMakesNoGemmPrimitive) {
  TESSERA_TINY_OR_SKIP(tiny, "llada", "--seed 8");
  auto e = Engine::load(tiny, EngineOptions{});
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 10; ++i) prompt.push_back(i + 3);
  GenerateOptions o;
  o.gen_length = 64;
  o.block_length = 64;
  o.steps = 16;
  std::vector<int64_t> made;  // primitives made by the end of each step
  Backend& b = e->backend();
  const int64_t before = b.gemm_primitives_created();
  const GenerateResult first =
      generate(*e, prompt, o, [&](const StepEvent&) { made.push_back(b.gemm_primitives_created()); });
  ASSERT_EQ(made.size(), 16u);
  EXPECT_GT(made[0], before);  // the first forward's shapes
  for (size_t s = 1; s < made.size(); ++s) EXPECT_LE(made[s] - made[s - 1], 1) << "step " << s;
  const int64_t after_first = b.gemm_primitives_created();
  const GenerateResult second = generate(*e, prompt, o);
  EXPECT_EQ(b.gemm_primitives_created(), after_first);
  EXPECT_EQ(second.tokens, first.tokens);
}

}  // namespace
}  // namespace tessera
#endif
