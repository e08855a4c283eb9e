// SparseD on tiny checkpoints in the real layouts: the patterns a Select forward builds equal the numpy
// reference's isolated selection (reference.py patterns); a Sparse forward equals the numpy forward that
// attends only to those tiles (reference.py logits --sparse-patterns) and differs from the dense one;
// patterns that keep every tile generate exactly the dense tokens; misuse fails clearly.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
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

std::vector<uint8_t> read_bytes(const std::filesystem::path& p, size_t n) {
  std::vector<uint8_t> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n) << p;
  return v;
}

TEST(SparseD, PatternsAndSparseStepMatchTheNumpyReference) {
  for (const char* fam : {"llada", "dream", "llada_moe"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const ModelConfig& c = e->config();
    const int64_t V = e->vocab_size(), n = 75, prompt = 20;
    const SparseConfig sc{8, 0.3f, prompt};
    const int64_t nb = (n + sc.block - 1) / sc.block;
    auto a = random_canvas(n, V, 31, e->mask_token(), 0.7);
    for (int64_t i = 0; i < prompt; ++i)
      a[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % (V - 8));
    auto b = a;  // a later canvas: some masks decided
    for (int64_t i = prompt; i < n; i += 3) b[static_cast<size_t>(i)] = static_cast<int32_t>(i % (V - 8));
    const auto pos = all_positions(n);
    std::vector<float> dense_a(static_cast<size_t>(n * V)), sel(dense_a.size()), dense_b(dense_a.size()),
        sparse_b(dense_a.size());
    e->logits(a, pos, dense_a);
    e->logits(b, pos, dense_b);
    e->sparse_begin(n, sc);
    e->sparse_phase(SparsePhase::Select);
    e->logits(a, pos, sel);  // exact attention while the patterns are built
    EXPECT_EQ(sel, dense_a) << fam;
    const std::vector<uint8_t> pats = e->sparse_patterns();
    ASSERT_EQ(pats.size(), static_cast<size_t>(c.n_layers * c.n_heads * nb * nb)) << fam;
    EXPECT_EQ(e->sparse_bytes(), pats.size());
    EXPECT_EQ(static_cast<int64_t>(pats.size()), c.sparse_pattern_bytes(n, sc.block));

    // The numpy selection from the same forward.
    const auto tmp = test::temp_dir(std::string("sparse_") + fam);
    const auto ref_mask = tmp / "mask.bin", ref_clear = tmp / "clear.bin", eng = tmp / "engine.bin";
    const std::string ref =
        test::python() + " " + (test::source_dir() / "tests/reference/reference.py").string();
    std::string log;
    ASSERT_EQ(test::run_command(ref + " patterns --model " + dir.string() + " --tokens " + test::join_ids(a) +
                                    " --block 8 --rho 0.3 --prompt-len 20 --out " + ref_mask.string() +
                                    " --clear " + ref_clear.string(),
                                &log),
              0)
        << log;
    const auto want = read_bytes(ref_mask, pats.size());
    const auto clear = read_bytes(ref_clear, pats.size() / static_cast<size_t>(nb));
    size_t compared = 0;
    for (size_t r = 0; r < clear.size(); ++r) {
      if (!clear[r]) continue;
      ++compared;
      for (int64_t kb = 0; kb < nb; ++kb) {
        const size_t i = r * static_cast<size_t>(nb) + static_cast<size_t>(kb);
        ASSERT_EQ(pats[i], want[i]) << fam << ": pattern row " << r << " key block " << kb;
      }
    }
    EXPECT_GE(compared * 10, clear.size() * 9) << fam << ": too many near ties";
    int64_t kept = 0;
    for (uint8_t x : pats) kept += x;
    // prompt blocks [0, 2): floor(0.6) + 1 = 1 kept; generation blocks [2, 10): floor(2.4) + 1 = 3 kept.
    EXPECT_EQ(kept, c.n_layers * c.n_heads * nb * 4) << fam;

    // A Sparse forward over b vs numpy attending to the engine's tiles.
    e->sparse_phase(SparsePhase::Sparse);
    e->logits(b, pos, sparse_b);
    {
      std::ofstream f(eng, std::ios::binary);
      f.write(reinterpret_cast<const char*>(pats.data()), static_cast<std::streamsize>(pats.size()));
    }
    const auto want_b = test::reference_logits(dir, b, pos, V, nullptr,
                                               "--sparse-patterns " + eng.string() + " --sparse-block 8");
    ASSERT_EQ(want_b.size(), sparse_b.size());
    const double err = test::rel_error(sparse_b.data(), want_b.data(), want_b.size());
    const double vs_dense = test::rel_error(sparse_b.data(), dense_b.data(), dense_b.size());
    EXPECT_LE(err, 5e-6) << fam;  // f32; observed up to 6.0e-7
    EXPECT_GT(vs_dense, 1e-3) << fam << ": the sparse step should differ from the dense one";
    std::printf("%s: sparse step vs numpy %.2e, vs dense %.2e; %zu of %zu pattern rows compared\n", fam, err,
                vs_dense, compared, clear.size());
    e->sparse_end();
    std::vector<float> again(dense_b.size());
    e->logits(b, pos, again);
    EXPECT_EQ(again, dense_b) << fam << ": exact attention after sparse_end";
  }
}

// rho = 1 keeps every tile: the sparse generation is the dense one, token for token (bf16 too: the
// kernel computes the same sums when no tile is dropped).
TEST(SparseD, KeepingEveryTileGeneratesTheDenseTokens) {
  for (const char* fam : {"llada", "dream"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir);
    const auto prompt = random_canvas(19, e->vocab_size() - 8, 5, 0, 0.0);
    GenerateOptions o;
    o.gen_length = 32;
    o.block_length = 16;
    o.steps = 16;
    o.alg = std::string(fam) == "dream" ? Unmask::Entropy : Unmask::LowConfidence;
    o.stop_at_eos = false;
    const GenerateResult dense = generate(*e, prompt, o);
    o.sparse = true;
    o.sparse_rho = 1.0f;
    o.sparse_block = 4;
    const GenerateResult full = generate(*e, prompt, o);
    EXPECT_EQ(full.tokens, dense.tokens) << fam;
    EXPECT_EQ(full.order, dense.order) << fam;
    o.sparse_rho = 0.0f;  // one tile per key set: runs, same number of steps
    const GenerateResult thin = generate(*e, prompt, o);
    EXPECT_EQ(thin.steps_run, dense.steps_run) << fam;
    EXPECT_EQ(thin.tokens.size(), dense.tokens.size()) << fam;
  }
}

TEST(SparseD, MisuseFailsClearly) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir);
  const auto canvas = random_canvas(40, e->vocab_size(), 3, e->mask_token(), 0.5);
  const std::vector<int32_t> pos = {10, 11};
  std::vector<float> out(2 * static_cast<size_t>(e->vocab_size()));
  expect_error([&] { e->sparse_phase(SparsePhase::Select); }, "sparse_begin must start the request first");
  e->sparse_begin(40, SparseConfig{8, 0.5f, 10});
  expect_error([&] { e->sparse_phase(SparsePhase::Sparse); }, "no pattern yet");
  e->sparse_phase(SparsePhase::Select);
  const auto longer = random_canvas(48, e->vocab_size(), 3, e->mask_token(), 0.5);
  expect_error(
      [&] { e->logits(longer, pos, out); },
      "the patterns are for one canvas of 40 positions, selected from a forward over all rows of a prefix "
      "of it (the last over 0); this forward has 1 sequence(s) of 48");
  // A prefix of the canvas (Window-Diffusion's view) selects over its rows; a Sparse forward may not
  // read past the selected prefix.
  const std::vector<int32_t> prefix(canvas.begin(), canvas.begin() + 24);
  e->logits(prefix, pos, out);
  e->sparse_phase(SparsePhase::Sparse);
  e->logits(std::span<const int32_t>(prefix).first(20), pos, out);  // by position, over the 24 selected
  expect_error([&] { e->logits(canvas, pos, out); },
               "(the last over 24); this forward has 1 sequence(s) of 40");
  e->sparse_phase(SparsePhase::Select);
  // With a KV cache the selection needs a refresh of the whole canvas; later cached steps read the
  // pattern by position.
  e->kv_cache_reset(40);
  e->logits_cached(canvas, 0, 40, pos, out);
  expect_error([&] { e->logits_cached(canvas, 0, 20, pos, out); }, "selected from a forward over all rows");
  e->sparse_phase(SparsePhase::Sparse);
  e->logits_cached(canvas, 8, 24, pos, out);
  e->sparse_end();
  e->logits(longer, pos, out);  // exact attention again
  expect_error([&] { e->sparse_begin(40, SparseConfig{0, 0.5f, 10}); }, "sparse block must be > 0");
  expect_error([&] { e->sparse_begin(40, SparseConfig{8, 2.0f, 10}); }, "sparse rho must be in [0, 1]");
  expect_error([&] { e->sparse_begin(40, SparseConfig{8, 0.5f, 41}); }, "prompt length must lie in");
  expect_error([&] { e->sparse_begin(e->config().max_positions + 1, SparseConfig{}); },
               "does not fit the model's");
  EngineOptions o;
  o.memory_budget = e->model().weight_bytes() + 64;
  auto tight = Engine::load(dir, o);
  expect_error(
      [&] {
        tight->sparse_begin(400, SparseConfig{1, 0.5f, 10});
      },
      "plus the sparse attention patterns of a 400-position canvas");
  TESSERA_TINY_OR_SKIP(dir2, "llada2", "--seed 7");
  auto l2 = Engine::load(dir2);
  // A block-causal model takes patterns (read by position; tests/golden/llada2_combine_test.cpp).
  l2->set_attention_block(8);
  l2->sparse_begin(40, SparseConfig{4, 0.5f, 10});
  l2->sparse_end();
}

// tessera plan counts the patterns (quadratic in the context) in the budget and in L_max.
TEST(SparseD, PlanCountsThePatterns) {
  const std::string base = std::string(TESSERA_BINARY) +
                           " plan --geometry llada-8b --context 65536 --mask-ratio 0.5 --budget 40GiB --json";
  std::string out;
  ASSERT_EQ(test::run_command(base + " 2>&1", &out), 0) << out;
  const auto dense = nlohmann::json::parse(out);
  EXPECT_EQ(dense["sparse_pattern_bytes"], 0);
  int64_t prev = dense["l_max"].get<int64_t>();
  for (const int block : {128, 32}) {
    ASSERT_EQ(test::run_command(base + " --sparse-block " + std::to_string(block) + " 2>&1", &out), 0) << out;
    const auto j = nlohmann::json::parse(out);
    const int64_t nb = 65536 / block;
    EXPECT_EQ(j["sparse_pattern_bytes"].get<int64_t>(), 32 * 32 * nb * nb)
        << block;  // LLaDA-8B: 32 x 32 heads
    EXPECT_EQ(j["activation_budget_bytes"].get<int64_t>() + j["sparse_pattern_bytes"].get<int64_t>(),
              dense["activation_budget_bytes"].get<int64_t>());
    EXPECT_LT(j["l_max"].get<int64_t>(), prev) << block;
    prev = j["l_max"].get<int64_t>();
  }
}

TEST(SparseD, CliGeneratesSparse) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  const std::string bin = TESSERA_BINARY;
  std::string dense, out;
  const std::string base =
      bin + " generate -m " + dir.string() + " -p hi --gen-length 24 --block-length 8 --raw ";
  ASSERT_EQ(test::run_command(base + "--json 2>/dev/null", &dense), 0) << dense;
  const auto exact = nlohmann::json::parse(dense);
  EXPECT_EQ(exact["sparse"], false);
  ASSERT_EQ(test::run_command(base + "--json --sparse-rho 1 --sparse-block 4 2>/dev/null", &out), 0) << out;
  const auto full = nlohmann::json::parse(out);
  EXPECT_EQ(full["tokens"], exact["tokens"]);
  EXPECT_EQ(full["sparse"], true);
  EXPECT_GT(full["sparse_pattern_bytes"].get<int64_t>(), 0);
  // With the dual cache (the patterns read by position in the cached steps): every key block kept, the
  // answer is the cached one's.
  std::string dual, both;
  ASSERT_EQ(test::run_command(base + "--json --cache dual 2>/dev/null", &dual), 0) << dual;
  ASSERT_EQ(
      test::run_command(base + "--json --cache dual --sparse-rho 1 --sparse-block 4 2>/dev/null", &both), 0)
      << both;
  EXPECT_EQ(nlohmann::json::parse(both)["tokens"], nlohmann::json::parse(dual)["tokens"]);
  EXPECT_EQ(nlohmann::json::parse(both)["sparse"], true);
}

}  // namespace
}  // namespace tessera
