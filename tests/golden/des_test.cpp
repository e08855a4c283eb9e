// Dynamic Expert Sharing on tiny MoE checkpoints in the real layouts (LLaDA-MoE softmax router, LLaDA2
// sigmoid router with bias and groups): a DES forward equals the numpy reference's des_route forward
// (reference.py logits --des), and its unique-expert counts equal the reference's; sharing that keeps
// every token's experts is exact; a chunked FFN votes before it routes; misuse fails clearly.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::all_positions;
using test::expect_error;
using test::random_canvas;

struct DesCase {
  const char* family;
  const char* args;
  DesConfig des;
  const char* ref;  // reference.py --des arguments
};

TEST(DES, ForwardAndCountsMatchTheNumpyReference) {
  const int64_t n = 75, lo = 40, hi = 56;  // the block decoded in parallel
  const DesCase cases[] = {
      {"llada_moe",
       "--seed 4 --experts 16 --top-k 4",
       {DesMode::Vote, 2, 0.4f, false},
       "vote --des-beta 0.4"},
      {"llada_moe",
       "--seed 4 --experts 16 --top-k 4",
       {DesMode::Seq, 1, 0.4f, true},
       "seq --des-k 1 --des-scope all"},
      {"llada_moe", "--seed 4 --experts 16 --top-k 4", {DesMode::Off, 2, 0.4f, false}, "off"},
      {"llada2", "--seed 7", {DesMode::Vote, 2, 0.25f, true}, "vote --des-beta 0.25 --des-scope all"},
      {"llada2", "--seed 7", {DesMode::Seq, 2, 0.4f, false}, "seq --des-k 2"},
  };
  for (const DesCase& c : cases) {
    TESSERA_TINY_OR_SKIP(dir, c.family, c.args);
    auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const ModelConfig& cfg = e->config();
    const int64_t V = e->vocab_size();
    const auto canvas = random_canvas(n, V, 17, e->mask_token(), 0.5);
    const auto pos = all_positions(n);
    std::vector<float> exact(static_cast<size_t>(n * V)), got(exact.size());
    e->logits(canvas, pos, exact);
    e->des_begin(c.des);
    e->des_rows(lo, hi);
    e->logits(canvas, pos, got);
    const MoeStats st = e->moe_stats();
    e->des_end();

    const auto tmp = test::temp_dir(std::string("des_") + c.family);
    const auto stats_file = tmp / "stats.json";
    const std::string block =
        cfg.family == Family::LLaDA2 ? " --block " + std::to_string(e->attention_block()) : "";
    const auto want =
        test::reference_logits(dir, canvas, pos, V, nullptr,
                               std::string("--des ") + c.ref + " --des-rows " + std::to_string(lo) + "," +
                                   std::to_string(hi) + " --des-stats " + stats_file.string() + block);
    ASSERT_EQ(want.size(), got.size());
    const double err = test::rel_error(got.data(), want.data(), want.size());
    const double vs_exact = test::rel_error(got.data(), exact.data(), exact.size());
    EXPECT_LE(err, 5e-6) << c.family << " " << c.ref;  // f32; observed up to 8.2e-7
    if (c.des.mode == DesMode::Off) {
      EXPECT_EQ(got, exact) << c.family << ": counting alone changes nothing";
    } else {
      EXPECT_GT(vs_exact, 1e-4) << c.family << " " << c.ref << ": sharing should change the forward";
    }
    std::ifstream f(stats_file);
    const auto layers = nlohmann::json::parse(f);
    double unique = 0, voting = 0, core = 0;
    for (const auto& l : layers) {
      unique += l[0].get<double>();
      voting += l[1].get<double>();
      core += l[2].get<double>();
    }
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < cfg.n_layers; ++l) moe_layers += cfg.is_moe_layer(l) ? 1 : 0;
    ASSERT_EQ(static_cast<int64_t>(layers.size()), moe_layers);
    EXPECT_EQ(st.forwards, 1);
    EXPECT_EQ(st.layer_forwards, moe_layers);
    EXPECT_EQ(st.unique, unique) << c.family << " " << c.ref;
    EXPECT_EQ(st.unique_voting, voting) << c.family << " " << c.ref;
    EXPECT_EQ(st.coreset, core) << c.family << " " << c.ref;
    if (c.des.all_rows) {
      EXPECT_EQ(st.unique, st.coreset) << "every row routes inside the coreset";
    }
    if (c.des.mode == DesMode::Vote) {
      const double m = std::floor(c.des.beta * static_cast<double>(cfg.moe.n_experts));
      EXPECT_LE(st.mean(st.coreset), std::max<double>(m, static_cast<double>(cfg.moe.top_k)));
    }
    std::printf(
        "%s DES %s: vs numpy %.2e, vs exact %.2e; experts per layer %.2f (block %.2f, coreset %.2f) of "
        "%lld\n",
        c.family, c.ref, err, vs_exact, st.mean(st.unique), st.mean(st.unique_voting), st.mean(st.coreset),
        static_cast<long long>(cfg.moe.n_experts));
  }
}

// 32 tokens in two blocks of 16, 16 steps, never stopping early.
GenerateOptions two_blocks() {
  GenerateOptions o;
  o.gen_length = 32;
  o.block_length = 16;
  o.steps = 16;
  o.stop_at_eos = false;
  return o;
}

// Seq with k = top_k (the union of every token's own experts) and Vote with beta = 1 keep each voting
// token's own top-k inside the coreset, so without group limits (LLaDA-MoE) generation is unchanged.
TEST(DES, SharingThatKeepsEveryTokensExpertsIsExact) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 4 --experts 16 --top-k 4");
  auto e = Engine::load(dir);
  const auto prompt = random_canvas(19, e->vocab_size() - 8, 5, 0, 0.0);
  GenerateOptions o = two_blocks();
  o.moe_stats = true;
  const GenerateResult exact = generate(*e, prompt, o);
  const MoeStats base = e->moe_stats();
  EXPECT_EQ(base.forwards, exact.steps_run);
  o.des = DesMode::Seq;
  o.des_k = 4;
  const GenerateResult seq = generate(*e, prompt, o);
  EXPECT_EQ(seq.tokens, exact.tokens);
  EXPECT_EQ(seq.order, exact.order);
  EXPECT_EQ(e->moe_stats().unique, base.unique);
  o.des = DesMode::Vote;
  o.des_beta = 1.0f;
  o.des_scope = DesScope::All;  // the other rows take their top-k inside the union: not exact, but it runs
  const GenerateResult vote_all = generate(*e, prompt, o);
  EXPECT_EQ(vote_all.tokens.size(), exact.tokens.size());
  o.des_scope = DesScope::Block;
  const GenerateResult vote = generate(*e, prompt, o);
  EXPECT_EQ(vote.tokens, exact.tokens);
  // A small coreset changes the routing: fewer experts per layer for the block's tokens.
  o.des_beta = 0.25f;
  generate(*e, prompt, o);
  const MoeStats small = e->moe_stats();
  EXPECT_LT(small.mean(small.unique_voting), base.mean(base.unique_voting));
  EXPECT_LE(small.mean(small.coreset), 4.0);
}

// With the FFN chunked (K_ffn = 3: the block's rows span two chunks) every chunk routes with the coreset
// of all the voting rows, as the unchunked forward does.
TEST(DES, ChunkedFfnVotesBeforeItRoutes) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 4 --experts 16 --top-k 4");
  const int64_t n = 75;
  EngineOptions one{.precision = Precision::F32};
  EngineOptions three = one;
  three.k_ffn = 3;  // chunks of 25 rows: [0, 25), [25, 50), [50, 75)
  auto a = Engine::load(dir, one), b = Engine::load(dir, three);
  const auto canvas = random_canvas(n, a->vocab_size(), 23, a->mask_token(), 0.5);
  const auto pos = all_positions(n);
  std::vector<float> la(static_cast<size_t>(n * a->vocab_size())), lb(la.size()), exact(la.size());
  b->logits(canvas, pos, exact);
  for (Engine* e : {a.get(), b.get()}) {
    e->des_begin(DesConfig{DesMode::Vote, 2, 0.25f, true});
    e->des_rows(40, 60);
    e->logits(canvas, pos, e == a.get() ? la : lb);
  }
  EXPECT_EQ(b->last_step().shape.k_ffn, 3);
  EXPECT_LE(test::rel_error(lb.data(), la.data(), la.size()), 1e-5);
  EXPECT_GT(test::rel_error(lb.data(), exact.data(), la.size()), 1e-4);
  EXPECT_EQ(a->moe_stats().coreset, b->moe_stats().coreset);
  EXPECT_EQ(a->moe_stats().unique, b->moe_stats().unique);
}

// With the dual KV cache a forward computes only the block: its rows are the voting rows.
TEST(DES, KvCacheStepsVoteWithTheBlocksRows) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 4 --experts 16 --top-k 4");
  auto e = Engine::load(dir);
  const auto prompt = random_canvas(19, e->vocab_size() - 8, 5, 0, 0.0);
  GenerateOptions o = two_blocks();
  o.cache = KvCache::Dual;
  o.des = DesMode::Vote;
  o.des_beta = 0.25f;
  const GenerateResult r = generate(*e, prompt, o);
  const MoeStats s = e->moe_stats();
  EXPECT_EQ(s.forwards, r.steps_run);
  // Every forward but the first of each block (2 blocks) computes exactly the block: unique = voting.
  EXPECT_GT(s.unique, s.unique_voting);  // the block-opening forwards route the other rows normally
  o.des_scope = DesScope::All;
  generate(*e, prompt, o);
  const MoeStats all = e->moe_stats();
  EXPECT_EQ(all.unique, all.coreset);
}

// Window-Diffusion: every forward (refresh, row-list step, or plain forward without a cache) votes with
// the step's candidates (the active set inside the block). Seq with k = top_k keeps every token's own
// experts, so the windowed generation is unchanged; a small coreset cuts the voting rows' experts.
// (Which rows vote is traced in the unit test Generate.WindowPhasesComputeTheExpectedRows.)
TEST(DES, WindowStepsVoteWithTheActiveSet) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 4 --experts 16 --top-k 4");
  auto e = Engine::load(dir);
  const auto prompt = random_canvas(19, e->vocab_size() - 8, 5, 0, 0.0);
  for (const int refresh : {4, 0}) {
    GenerateOptions o = two_blocks();
    o.window = true;
    o.window_ex = 16;
    o.window_in = 4;
    o.window_refresh = refresh;
    o.moe_stats = true;
    const GenerateResult plain = generate(*e, prompt, o);
    const MoeStats base = e->moe_stats();
    EXPECT_EQ(base.forwards, plain.steps_run) << refresh;
    o.des = DesMode::Seq;
    o.des_k = 4;
    const GenerateResult seq = generate(*e, prompt, o);
    EXPECT_EQ(seq.tokens, plain.tokens) << refresh;
    EXPECT_EQ(seq.order, plain.order) << refresh;
    EXPECT_EQ(e->moe_stats().unique, base.unique) << refresh;
    o.des = DesMode::Vote;
    o.des_beta = 0.25f;
    const GenerateResult vote = generate(*e, prompt, o);
    const MoeStats small = e->moe_stats();
    EXPECT_EQ(small.forwards, vote.steps_run) << refresh;
    EXPECT_LT(small.mean(small.unique_voting), base.mean(base.unique_voting)) << refresh;
    EXPECT_LE(small.mean(small.coreset), 4.0) << refresh;
    o.des_scope = DesScope::All;
    generate(*e, prompt, o);
    const MoeStats all = e->moe_stats();
    EXPECT_EQ(all.unique, all.coreset) << refresh;
  }
}

TEST(DES, MisuseFailsClearly) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 4 --experts 16 --top-k 4");
  auto e = Engine::load(dir);
  expect_error([&] { e->des_begin(DesConfig{DesMode::Seq, 5, 0.4f, false}); }, "des-k must be in [1, 4]");
  expect_error([&] { e->des_begin(DesConfig{DesMode::Vote, 2, 0.0f, false}); }, "des-beta must be in (0, 1]");
  expect_error([&] { e->des_rows(5, 4); }, "the decoded rows must be a range");
  e->des_begin(DesConfig{DesMode::Vote, 2, 0.5f, false});
  const auto canvas = random_canvas(20, e->vocab_size(), 3, e->mask_token(), 0.5);
  const std::vector<int32_t> pos = {10, 11};
  std::vector<float> out(4 * static_cast<size_t>(e->vocab_size()));
  const SeqInput two[2] = {{canvas, pos}, {canvas, pos}};
  expect_error([&] { e->forward_logits(two, out); }, "expert sharing: one sequence per forward");
  e->des_end();
  e->forward_logits(two, out);  // normal routing again
  GenerateOptions o;
  o.des = DesMode::Vote;
  expect_error([&] { (void)parse_des_scope("rows"); }, "unknown des-scope 'rows'");
  expect_error([&] { (void)parse_des("maybe"); }, "unknown expert sharing 'maybe'");
  TESSERA_TINY_OR_SKIP(dense_dir, "llada", "--seed 4");
  auto d = Engine::load(dense_dir);
  expect_error([&] { d->des_begin(DesConfig{}); }, "expert sharing needs a mixture-of-experts model");
  o.des = DesMode::Vote;
  o.des_scope = DesScope::Block;
  o.gen_length = o.steps = o.block_length = 8;
  expect_error(
      [&] {
        generate(*d, std::vector<int32_t>{1, 2}, o);
      },
      "expert sharing needs a mixture-of-experts model; use des off");
}

TEST(DES, CliReportsTheExperts) {
  TESSERA_TINY_OR_SKIP(dir, "llada_moe", "--seed 4 --experts 16 --top-k 4");
  const std::string bin = TESSERA_BINARY;
  std::string out;
  const std::string base =
      bin + " generate -m " + dir.string() + " -p hi --gen-length 24 --block-length 8 --raw ";
  ASSERT_EQ(test::run_command(base + "--json 2>/dev/null", &out), 0) << out;
  const auto exact = nlohmann::json::parse(out);
  EXPECT_EQ(exact["des"], "off");
  EXPECT_EQ(exact["moe"]["n_experts"], 16);
  EXPECT_EQ(exact["moe"]["coreset"], 16.0);
  ASSERT_EQ(test::run_command(base + "--json --des-k 4 2>/dev/null", &out), 0) << out;
  const auto seq = nlohmann::json::parse(out);
  EXPECT_EQ(seq["des"], "seq");
  EXPECT_EQ(seq["tokens"], exact["tokens"]);
  ASSERT_EQ(test::run_command(base + "--json --des-beta 0.25 --des-scope all 2>/dev/null", &out), 0) << out;
  const auto vote = nlohmann::json::parse(out);
  EXPECT_EQ(vote["des"], "vote");
  EXPECT_LE(vote["moe"]["unique_experts"].get<double>(), 4.0);
  test::expect_command_error(base + "--des-k 2 --des-beta 0.3 2>&1", "choose different methods");
  test::expect_command_error(base + "--des seq --des-k 9 2>&1", "des-k must be in [1, 4]");
}

}  // namespace
}  // namespace tessera
