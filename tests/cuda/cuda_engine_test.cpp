// The engine on the GPU: the golden tests of the CPU path (stories260K text, numpy reference logits
// of tiny LLaDA / Dream checkpoints) pass on CUDA; the VMM workspace commits and releases physical
// memory; a step makes no device allocation after warm-up.
#include "core/error.h"
#include "cuda_test_util.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "memory/workspace.h"
#include "stories_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::cuda_engine_options;
using test::CudaTest;

TEST_F(CudaTest, Stories260KPrintsTheGoldenText) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  EXPECT_EQ(test::stories_greedy_text(cuda_engine_options()), test::stories_golden_text());
}

TEST_F(CudaTest, Stories260KMatchesTheNumpyReference) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  const double err = test::stories_reference_error(cuda_engine_options());
  EXPECT_GE(err, 0.0);
  EXPECT_LE(err, 1e-4);
}

// Tiny checkpoints in the real layouts: CUDA logits against the numpy reference, on the canvases of
// the CPU test (tests/golden/reference_test.cpp).
void check_tiny(const std::string& family, const std::string& args, Precision prec, double tol) {
  test::check_logits_against_reference(family, args, cuda_engine_options(prec), tol);
}

TEST_F(CudaTest, TinyLladaMatchesTheNumpyReference) {
  check_tiny("llada", "--seed 3", Precision::F32, 1e-3);
  check_tiny("llada", "--seed 3", Precision::BF16, 3e-2);
  check_tiny("llada", "--seed 5 --hidden 256 --heads 4", Precision::BF16, 3e-2);  // head_dim 64: tensor cores
}

TEST_F(CudaTest, TinyDreamMatchesTheNumpyReference) {
  check_tiny("dream", "--seed 3", Precision::F32, 1e-3);
  check_tiny("dream", "--seed 3", Precision::BF16, 3e-2);
}

// LLaDA-MoE in f32 (bf16 routing can flip near-tied experts; the CPU golden test handles that case).
TEST_F(CudaTest, TinyLladaMoeMatchesTheNumpyReference) {
  check_tiny("llada_moe", "--seed 3", Precision::F32, 1e-3);
  check_tiny("llada_moe", "--seed 4 --first-dense 1 --shared-inter 48 --top-k 3", Precision::F32, 1e-3);
}

// Dynamic Expert Sharing on the GPU: a DES forward of tiny LLaDA-MoE / LLaDA2 equals the CPU engine's,
// and so do the unique-expert counts.
TEST_F(CudaTest, ExpertSharingMatchesTheCpuEngine) {
  for (const char* fam : {"llada_moe", "llada2"}) {
    TESSERA_TINY_OR_SKIP(dir, fam,
                         std::string(fam) == "llada2" ? "--seed 7" : "--seed 4 --experts 16 --top-k 4");
    auto g = Engine::load(dir, cuda_engine_options(Precision::F32));
    auto c = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const auto canvas = test::random_canvas(75, c->vocab_size(), 17, c->mask_token(), 0.5);
    const auto pos = test::all_positions(75);
    std::vector<float> lg(75 * static_cast<size_t>(c->vocab_size())), lc(lg.size());
    for (const DesConfig& d :
         {DesConfig{DesMode::Vote, 2, 0.25f, true}, DesConfig{DesMode::Seq, 1, 0.4f, false}}) {
      for (Engine* e : {g.get(), c.get()}) {
        e->des_begin(d);
        e->des_rows(40, 56);
        e->logits(canvas, pos, e == g.get() ? lg : lc);
        e->des_end();
      }
      EXPECT_LE(test::rel_error(lg.data(), lc.data(), lc.size()), 1e-3) << fam;
      EXPECT_EQ(g->moe_stats().unique, c->moe_stats().unique) << fam;
      EXPECT_EQ(g->moe_stats().coreset, c->moe_stats().coreset) << fam;
      EXPECT_EQ(g->moe_stats().unique_voting, c->moe_stats().unique_voting) << fam;
    }
  }
}

TEST_F(CudaTest, NoDeviceAllocationAfterWarmUp) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 5 --hidden 256 --heads 4");
  auto e = Engine::load(dir, cuda_engine_options(Precision::BF16));
  std::vector<int32_t> canvas(96, e->mask_token()), pos(64), tok(64);
  std::vector<float> conf(64);
  for (int32_t i = 0; i < 64; ++i) pos[static_cast<size_t>(i)] = i + 32;
  for (int i = 0; i < 32; ++i) canvas[static_cast<size_t>(i)] = i + 3;
  SampleParams sp;
  for (int w = 0; w < 2; ++w) e->predict(canvas, pos, sp, tok, conf);  // warm-up: plans, cuBLASLt
  const int64_t free0 = e->backend().device_free_bytes();
  const size_t committed0 = e->workspace().committed();
  ASSERT_GT(free0, 0);
  for (int i = 0; i < 20; ++i) {
    sp.temperature = i % 2 == 0 ? 0.0f : 0.5f;
    sp.seed = static_cast<uint64_t>(i);
    e->predict(canvas, pos, sp, tok, conf);
  }
  EXPECT_EQ(e->backend().device_free_bytes(), free0) << "device memory was allocated or freed during steps";
  EXPECT_EQ(e->workspace().committed(), committed0);
}

// Step graphs (engine/step_graphs.h) replay what the ops would compute: generations with them on decide
// the tokens, in the order, of the same engine with them off (bf16, so cuDNN's attention, the gather
// tiles and cuBLASLt are recorded too), greedy and sampled, with the dual cache (whose steps repeat
// their shapes from block to block) and without a cache (a new shape every step).
TEST_F(CudaTest, StepGraphsReplayTheSameTokens) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 5 --hidden 256 --heads 4");
  EngineOptions off_opt = cuda_engine_options(Precision::BF16);
  off_opt.step_graphs = false;
  auto off = Engine::load(dir, off_opt);
  auto on = Engine::load(dir, cuda_engine_options(Precision::BF16));
  const auto prompt = test::random_canvas(12, off->vocab_size() - 8, 5, 0, 0.0);
  GenerateOptions o;
  o.gen_length = 64;
  o.block_length = 16;
  o.steps = 64;
  o.stop_at_eos = false;
  for (const KvCache cache : {KvCache::Dual, KvCache::None}) {
    for (const float temperature : {0.0f, 0.7f}) {
      o.cache = cache;
      o.temperature = temperature;
      for (const uint64_t seed : {1u, 2u}) {
        o.seed = seed;
        const GenerateResult want = generate(*off, prompt, o);
        const GenerateResult got = generate(*on, prompt, o);
        EXPECT_EQ(got.tokens, want.tokens) << "cache " << static_cast<int>(cache) << " T " << temperature;
        EXPECT_EQ(got.order, want.order) << "cache " << static_cast<int>(cache) << " T " << temperature;
      }
    }
  }
  EXPECT_EQ(off->step_graphs().replays(), 0);
  EXPECT_GT(on->step_graphs().captures(), 0);
  EXPECT_GT(on->step_graphs().replays(), on->step_graphs().captures());
  EXPECT_GT(on->step_graphs().last_nodes(), 10);  // a whole forward: every layer's kernels
}

TEST_F(CudaTest, VmmWorkspaceCommitsAndReleasesPhysicalMemory) {
  auto ws = make_cuda_workspace(size_t{4} << 30);
  const size_t gran = ws->granularity();
  EXPECT_GE(gran, size_t{64} << 10);
  const int64_t free0 = gpu->device_free_bytes();
  ws->commit(size_t{256} << 20);
  EXPECT_EQ(ws->committed() % gran, 0u);
  EXPECT_GE(ws->committed(), size_t{256} << 20);
  const int64_t free1 = gpu->device_free_bytes();
  EXPECT_GE(free0 - free1, int64_t{250} << 20) << "commit did not take physical memory";
  // The committed range is usable device memory: write and read back its last bytes.
  std::vector<int32_t> v(1024);
  for (int i = 0; i < 1024; ++i) v[static_cast<size_t>(i)] = i * 3;
  char* last = static_cast<char*>(ws->base()) + ws->committed() - 4096;
  gpu->copy_to_device(last, v.data(), 4096);
  std::vector<int32_t> back(1024);
  gpu->copy_to_host(back.data(), last, 4096);
  EXPECT_EQ(back, v);
  ws->commit(size_t{16} << 20);  // below half: shrink
  EXPECT_LT(ws->committed(), size_t{64} << 20);
  EXPECT_GE(gpu->device_free_bytes() - free1, int64_t{200} << 20) << "shrink did not return memory";
  EXPECT_THROW(ws->commit(size_t{5} << 30), Error);  // beyond the reservation: a clear error
  ws->release();
  EXPECT_EQ(ws->committed(), 0u);
}

}  // namespace
}  // namespace tessera
