// Tensor parallelism over MPI (run by ctest as `mpirun -np N mpi_tests`): on every rank, an Engine
// holding the rank's share of a tiny checkpoint (heads and dense FFN split, the partial outputs summed
// by MPI all-reduces) against a whole single-process Engine of the same checkpoint in the same process:
// the same logits within f32 rounding, and generation deciding the same tokens at the same steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "decode/generate.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "io/config.h"
#include "models/model.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

std::shared_ptr<dist::Communicator> world() {
  std::string why;
  auto w = dist::mpi_world(60.0, &why);
  if (!w) ADD_FAILURE() << why;
  return w;
}

struct Family {
  const char* label;
  const char* name;
  const char* args;
};
// Every family's tiny checkpoint, with 4 heads (Nemotron, LLaDA2 and Dream: 2 key / value heads) and an
// FFN of 160: they split over 2 ranks, some over 4; LLaDA with 6 heads splits over 3. LLaDA-MoE with a
// dense first layer and a shared expert (8 experts: expert parallelism over 2 and 4); Nemotron with its
// draft adapter.
const Family kFamilies[] = {
    {"llada", "llada", ""},   {"llada_6_heads", "llada", "--heads 6 --hidden 96 --intermediate 192"},
    {"dream", "dream", ""},   {"llada_moe", "llada_moe", "--first-dense 1 --shared-inter 32"},
    {"llada2", "llada2", ""}, {"nemotron", "nemotron", "--nemotron-lora 4"}};

struct Engines {
  std::unique_ptr<Engine> whole, split;
};

// The layouts a test runs: tensor parallelism, and on MoE models expert parallelism alone and with it.
struct Layout {
  bool tp, ep;
  std::string name() const { return tp && ep ? "tp+ep" : tp ? "tp" : "ep"; }
};
std::vector<Layout> layouts(const ModelConfig& c) {
  std::vector<Layout> v{{true, false}};
  if (c.moe.n_experts > 0) v.insert(v.end(), {{false, true}, {true, true}});
  return v;
}

// The whole model and this rank's share under `layout`, both f32; null split when the model cannot take
// the world's ranks in that layout (the check's own error is tested below).
Engines load_both(const std::filesystem::path& dir, Layout layout) {
  Engines r;
  r.whole = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  EngineOptions o{.precision = Precision::F32};
  o.comm = world();
  const int n = o.comm->size();
  o.tp = layout.tp ? n : 1;
  o.ep = layout.ep ? n : 1;
  try {
    check_tensor_parallel(r.whole->config(), o.tp, o.ep);
  } catch (const Error&) {
    return r;
  }
  r.split = Engine::load(dir, o);
  return r;
}

double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, scale = 1e-6;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < got.size(); ++i)
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]) / scale);
  return err;
}

class TensorParallel : public ::testing::TestWithParam<Family> {};

TEST_P(TensorParallel, LogitsEqualOneProcess) {
  const Family f = GetParam();
  TESSERA_TINY_OR_SKIP(dir, f.name, f.args);
  const ModelConfig c = load_config(dir);
  int ran = 0;
  for (const Layout layout : layouts(c)) {
    Engines e = load_both(dir, layout);
    if (!e.split) continue;
    ++ran;
    const std::string at = std::string(f.name) + " (" + layout.name() + ")";
    EXPECT_LT(e.split->model().weight_bytes(), e.whole->model().weight_bytes()) << at;
    const int64_t V = e.whole->config().vocab;
    for (int64_t n : {1, 33, 130}) {
      const auto canvas = test::random_canvas(n, V, 7 + static_cast<uint64_t>(n), e.whole->mask_token(), 0.4);
      const auto rows = test::all_positions(n);
      std::vector<float> want(static_cast<size_t>(n * V)), got(want.size());
      const SeqInput s{canvas, rows};
      e.whole->forward_logits({&s, 1}, want);
      e.split->forward_logits({&s, 1}, got);
      EXPECT_LE(max_rel_error(got, want), 2e-5) << at << ", canvas of " << n;
    }
    // A KV-cache step: the cache holds this rank's heads only.
    if (!c.tri_mode) {
      const test::CachedStep a = test::run_cached_step(*e.whole, dir),
                             b = test::run_cached_step(*e.split, dir);
      EXPECT_LE(max_rel_error(b.got, a.got), 2e-5) << at << ", cached step";
    }
  }
  if (ran == 0) GTEST_SKIP() << f.name << " does not split over " << world()->size() << " ranks";
}

TEST_P(TensorParallel, GenerationDecidesTheSameTokensAtTheSameSteps) {
  const Family f = GetParam();
  TESSERA_TINY_OR_SKIP(dir, f.name, f.args);
  // Tensor parallelism, and on MoE models tensor and expert parallelism together.
  const ModelConfig c = load_config(dir);
  Engines e = load_both(dir, {true, c.moe.n_experts > 0});
  if (!e.split) GTEST_SKIP() << f.name << " does not split over " << world()->size() << " ranks";
  const auto prompt = test::ordinary_tokens(11, e.whole->config().vocab, 3);
  const bool block_causal = e.whole->attention_block() > 0;
  std::vector<std::pair<std::string, GenerateOptions>> cases;
  GenerateOptions base;
  base.gen_length = 32;
  base.steps = 32;
  base.block_length = block_causal ? static_cast<int>(e.whole->attention_block()) : 16;
  base.stop_at_eos = false;
  cases.push_back({"exact", base});
  GenerateOptions o = base;
  const bool tri = e.whole->config().tri_mode;
  if (tri) {  // causal passes and drafts (with the draft adapter): ar and spec
    o.mode = DecodeMode::Ar;
    cases.push_back({"ar", o});
    o.mode = DecodeMode::Spec;
    cases.push_back({"spec", o});
  } else {
    o.cache = KvCache::Dual;
    o.threshold = 0.05f;
    cases.push_back({"dual cache, threshold", o});
  }
  if (!block_causal && !tri) {
    o = base;
    o.sparse = true;
    o.sparse_block = 8;
    cases.push_back({"sparse", o});
    o = base;
    o.window = true;
    o.window_in = 8;
    o.window_refresh = 4;
    cases.push_back({"window", o});
  }
  if (e.whole->config().moe.n_experts > 0) {
    o = base;
    o.des = DesMode::Seq;
    cases.push_back({"des", o});
  }
  for (const auto& [what, opt] : cases) {
    const GenerateResult want = generate(*e.whole, prompt, opt), got = generate(*e.split, prompt, opt);
    EXPECT_EQ(got.tokens, want.tokens) << f.name << ", " << what;
    EXPECT_EQ(got.order, want.order) << f.name << ", " << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallel, ::testing::ValuesIn(kFamilies),
                         [](const auto& p) { return std::string(p.param.label); });

void expect_refused(const std::filesystem::path& dir, int tp, int ep, const std::string& want) {
  EngineOptions o{.precision = Precision::F32};
  o.comm = world();
  o.tp = tp;
  o.ep = ep;
  try {
    (void)Engine::load(dir, o);
    ADD_FAILURE() << "expected --tp " << tp << " --ep " << ep << " to be refused";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find(want), std::string::npos) << err.what();
  }
}

TEST(TensorParallelLayout, LayoutsTheModelCannotTakeAreRefusedAtLoad) {
  TESSERA_TINY_OR_SKIP(dense, "llada", "--heads 4");
  TESSERA_TINY_OR_SKIP(moe, "llada_moe", "--experts 8");
  const int n = world()->size();
  if (4 % n != 0)
    expect_refused(dense, n, 1, "--tp " + std::to_string(n) + ": the model's attention heads (4)");
  if (8 % n != 0) expect_refused(moe, 1, n, "--ep " + std::to_string(n) + ": the model's experts (8)");
  expect_refused(dense, 1, n, "--ep " + std::to_string(n) + ": this model has no experts");
  expect_refused(dense, 1, 1, "--tp 1 --ep 1 needs 1 rank; the communicator has " + std::to_string(n));
}

TEST(Communicator, CollectivesGiveEveryRankTheSameValues) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  std::vector<float> v{static_cast<float>(r + 1), 0.5f * static_cast<float>(r)};
  w->all_reduce_sum(v.data(), v.size());
  EXPECT_EQ(v[0], static_cast<float>(n * (n + 1) / 2));
  EXPECT_EQ(v[1], 0.25f * static_cast<float>(n * (n - 1)));
  std::vector<int32_t> all(static_cast<size_t>(n));
  const int32_t mine = 10 * r;
  w->all_gather(&mine, all.data(), sizeof(mine));
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], 10 * i);
  std::vector<int32_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) send[static_cast<size_t>(i)] = 100 * r + i;  // block i goes to rank i
  w->all_to_all(send.data(), recv.data(), sizeof(int32_t));
  for (int i = 0; i < n; ++i) EXPECT_EQ(recv[static_cast<size_t>(i)], 100 * i + r);
  int64_t token = r == 0 ? 424242 : -1;
  w->broadcast(&token, sizeof(token), 0);
  EXPECT_EQ(token, 424242);
  w->barrier();
  EXPECT_GE(w->stats().calls, 5u);
}

}  // namespace
}  // namespace tessera

// Every rank runs every test; a rank's failures make its exit code non-zero, and mpirun's with it.
// Only rank 0 prints gtest's report; the others print failures only.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  auto w = tessera::dist::mpi_world(60.0, &why);
  if (!w) {
    std::fprintf(stderr, "mpi_tests: %s\n", why.c_str());
    return 1;
  }
  if (w->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  int failed = rc != 0 ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(w->size()));
  w->all_gather(&failed, all.data(), sizeof(int));
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] != 0 && w->rank() == 0) std::fprintf(stderr, "mpi_tests: rank %zu failed\n", i);
  return rc;
}
