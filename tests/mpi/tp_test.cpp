// Tensor parallelism over MPI (run by ctest as `mpirun -np N mpi_tests`): on every rank, an Engine
// holding the rank's share of a tiny checkpoint (heads and dense FFN split, the partial outputs summed
// by MPI all-reduces) against a whole single-process Engine of the same checkpoint in the same process:
// the same logits within f32 rounding, and generation deciding the same tokens at the same steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "decode/generate.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/vocab_parallel.h"
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
    // Under tensor parallelism the LM head holds this rank's rows of the vocabulary (logits whole below come
    // through GatherVocab; samplers combine the ranks' summaries).
    const VocabShare vs = e.split->model().options().vocab_split;
    if (layout.tp) {
      const int n = world()->size(), r = world()->rank();
      EXPECT_EQ(vs.lo, vocab_share(c.vocab, n, r).lo) << at;
      EXPECT_EQ(vs.n, vocab_share(c.vocab, n, r).n) << at;
      EXPECT_EQ(e.split->model().weights().lm_head.rows(), vs.n) << at;
    } else {
      EXPECT_EQ(vs.n, 0) << at;
    }
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
  // Sampled (the LM head split by vocabulary: Gumbel-max and Dream's filtered draw over the ranks' slices),
  // with the tokens' log-probabilities.
  o = base;
  o.temperature = 0.7f;
  o.seed = 11;
  o.logprobs = true;
  cases.push_back({"gumbel 0.7, logprobs", o});
  if (!tri) {
    o = base;
    o.alg = Unmask::Entropy;
    o.temperature = 0.5f;
    o.top_p = 0.9f;
    o.top_k = 30;
    o.seed = 5;
    cases.push_back({"entropy, top_p, top_k", o});
  }
  for (const auto& [what, opt] : cases) {
    const GenerateResult want = generate(*e.whole, prompt, opt), got = generate(*e.split, prompt, opt);
    EXPECT_EQ(got.tokens, want.tokens) << f.name << ", " << what;
    EXPECT_EQ(got.order, want.order) << f.name << ", " << what;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << f.name << ", " << what;
    for (size_t i = 0; i < want.logprobs.size(); ++i) {
      const TokenLogprob &a = got.logprobs[i], &b = want.logprobs[i];
      EXPECT_NEAR(a.logprob, b.logprob, 1e-4) << f.name << ", " << what << ", token " << i;
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t j = 0; j < b.top.size(); ++j) {
        EXPECT_EQ(a.top[j].first, b.top[j].first) << f.name << ", " << what << ", token " << i;
        EXPECT_NEAR(a.top[j].second, b.top[j].second, 1e-4) << f.name << ", " << what << ", token " << i;
      }
    }
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

// Rows of logits every rank builds alike: peaked, flat, tied, with a column of -inf and an all -inf row.
std::vector<float> test_logits(int64_t R, int64_t V) {
  std::vector<float> L(static_cast<size_t>(R * V));
  uint64_t s = 12345;
  const auto uni = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xffffff) / 16777216.0f;
  };
  for (int64_t r = 0; r < R; ++r) {
    float* row = L.data() + r * V;
    const float spread = r % 4 == 0 ? 0.05f : r % 4 == 1 ? 1.0f : r % 4 == 2 ? 4.0f : 12.0f;
    for (int64_t v = 0; v < V; ++v) row[v] = spread * (uni() - 0.5f);
    if (r % 5 == 1) row[(r * 37) % V] += 9.0f;  // a peak
    if (r % 7 == 3) {                           // a tie for the max across the slices
      row[3] = 30.0f;
      row[V - 2] = 30.0f;
    }
    if (r % 9 == 4) {  // one token 9 above a flat tail: the top-p / top-k cuts fall below max - 8
      for (int64_t v = 0; v < V; ++v) row[v] = 0.5f * (uni() - 0.5f);
      row[(r * 13) % V] = 9.0f;
    }
    if (r % 6 == 5) row[(r * 11) % V] = -std::numeric_limits<float>::infinity();
    if (r == R - 1)
      for (int64_t v = 0; v < V; ++v) row[v] = -std::numeric_limits<float>::infinity();
  }
  return L;
}

// The LM head split by vocabulary: each rank holds its columns of the same logits, and the combined
// summaries give what the CPU sampler gives on the whole rows: the same tokens, the confidences and
// log-probabilities within f64-summation rounding, the same top ids.
void expect_split_equals_whole(int64_t V) {
  SCOPED_TRACE("vocabulary " + std::to_string(V));
  auto w = world();
  const int64_t R = 43;
  const VocabShare share = vocab_share(V, w->size(), w->rank());
  std::vector<float> whole = test_logits(R, V), mine(static_cast<size_t>(R * share.n));
  for (int64_t r = 0; r < R; ++r)
    std::copy_n(whole.begin() + r * V + share.lo, share.n, mine.begin() + r * share.n);
  std::vector<int32_t> keys(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) keys[static_cast<size_t>(r)] = static_cast<int32_t>(100 + 3 * r);
  const Tensor all_t(whole.data(), DType::F32, {R, V}), mine_t(mine.data(), DType::F32, {R, share.n}),
      keys_t(keys.data(), DType::I32, {R});
  struct Case {
    const char* what;
    SampleParams p;
  };
  std::vector<Case> cases;
  const auto add = [&](const char* what, auto set) {
    SampleParams p;
    p.seed = 7;
    set(p);
    cases.push_back({what, p});
  };
  add("greedy, prob", [](SampleParams&) {});
  add("greedy, margin", [](SampleParams& p) { p.conf = ConfKind::Margin; });
  add("greedy, entropy", [](SampleParams& p) { p.conf = ConfKind::NegEntropy; });
  add("random confidence", [](SampleParams& p) { p.conf = ConfKind::Random; });
  add("gumbel 0.7", [](SampleParams& p) {
    p.gumbel = true;
    p.temperature = 0.7f;
  });
  add("gumbel 1.3, suppressed", [](SampleParams& p) {
    p.gumbel = true;
    p.temperature = 1.3f;
    p.suppress_token = 3;
  });
  add("dream 0.5", [](SampleParams& p) { p.temperature = 0.5f; });
  add("dream 1, top_p 0.9, entropy", [](SampleParams& p) {
    p.temperature = 1.0f;
    p.top_p = 0.9f;
    p.conf = ConfKind::NegEntropy;
  });
  add("dream greedy, top_p 0.95, margin", [](SampleParams& p) {
    p.top_p = 0.95f;
    p.conf = ConfKind::Margin;
  });
  add("dream 0.8, top_k 20", [](SampleParams& p) {
    p.temperature = 0.8f;
    p.top_k = 20;
  });
  add("dream 1.1, top_p 0.7, top_k 50", [](SampleParams& p) {
    p.temperature = 1.1f;
    p.top_p = 0.7f;
    p.top_k = 50;
  });
  add("dream 0.9, top_k 1, suppressed", [V](SampleParams& p) {
    p.temperature = 0.9f;
    p.top_k = 1;
    p.suppress_token = V - 2;
  });
  for (const Case& c : cases) {
    std::vector<int32_t> want_t(static_cast<size_t>(R)), got_t(want_t.size());
    std::vector<float> want_c(want_t.size()), got_c(want_t.size());
    Tensor wt(want_t.data(), DType::I32, {R}), gt(got_t.data(), DType::I32, {R}),
        wc(want_c.data(), DType::F32, {R}), gc(got_c.data(), DType::F32, {R});
    cpu_sample_rows(all_t, keys_t, c.p, wt, wc);
    split_sample_rows(mine_t, keys_t, c.p, share, *w, gt, gc);
    EXPECT_EQ(got_t, want_t) << c.what;
    for (int64_t r = 0; r < R; ++r)
      EXPECT_NEAR(got_c[static_cast<size_t>(r)], want_c[static_cast<size_t>(r)],
                  1e-5 * std::max(1.0f, std::fabs(want_c[static_cast<size_t>(r)])))
          << c.what << ", row " << r;
  }
  // Log-probabilities: of a target (one out of range), and the top 20 with the chosen token's.
  std::vector<int32_t> target(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) target[static_cast<size_t>(r)] = static_cast<int32_t>((r * 97) % V);
  target[5] = static_cast<int32_t>(V);
  const Tensor target_t(target.data(), DType::I32, {R});
  std::vector<float> want_lp(static_cast<size_t>(R)), got_lp(want_lp.size());
  Tensor wl(want_lp.data(), DType::F32, {R}), gl(got_lp.data(), DType::F32, {R});
  cpu_token_logprob(all_t, target_t, wl);
  split_token_logprob(mine_t, target_t, share, *w, gl);
  const int64_t K = 20;
  std::vector<float> wch(static_cast<size_t>(R)), gch(wch.size()), wv(static_cast<size_t>(R * K)),
      gv(wv.size());
  std::vector<int32_t> wi(wv.size()), gi(wv.size());
  Tensor wch_t(wch.data(), DType::F32, {R}), gch_t(gch.data(), DType::F32, {R}),
      wi_t(wi.data(), DType::I32, {R, K}), gi_t(gi.data(), DType::I32, {R, K}),
      wv_t(wv.data(), DType::F32, {R, K}), gv_t(gv.data(), DType::F32, {R, K});
  cpu_top_logprobs(all_t, target_t, wch_t, wi_t, wv_t);
  split_top_logprobs(mine_t, target_t, share, *w, gch_t, gi_t, gv_t);
  EXPECT_EQ(gi, wi);
  const auto near = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << what << " " << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i]))) << what << " " << i;
      }
    }
  };
  near(got_lp, want_lp, "token_logprob");
  near(gch, wch, "top_logprobs' chosen");
  near(gv, wv, "top_logprobs");
  // Logits asked for whole come back whole.
  std::vector<float> back(whole.size(), 0.0f);
  Tensor back_t(back.data(), DType::F32, {R, V});
  gather_vocab(mine_t, share, *w, back_t);
  EXPECT_EQ(std::memcmp(back.data(), whole.data(), whole.size() * sizeof(float)), 0);
}

TEST(VocabParallel, SplitSamplingEqualsTheWholeRow) {
  expect_split_equals_whole(1001);  // not divisible by 2, 3 or 4
  expect_split_equals_whole(30);    // shares smaller than the 20 top log-probabilities
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
