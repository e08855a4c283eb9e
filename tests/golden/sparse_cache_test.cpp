// SparseD (algorithms.md 2) combined with the Fast-dLLM prefix and dual KV caches (algorithms.md 1D)
// against the numpy reference tests/reference/ref_sparse_cache.py (tiny checkpoints, f32, temperature 0):
// one cached sparse step (the pattern built by a cached Select refresh over canvas A, canvas B computing
// a row range that does not start on a tile boundary) gives the reference's logits and differs from the
// dense cached step; whole LLaDA low_confidence and Dream entropy generations with both caches decide the
// reference's tokens at the reference's steps; the combination's reference generation differs from the
// cache alone and from SparseD alone (reference.py generate), so ignoring either feature would fail; and
// the reference reduces to reference.py's loops when either feature is off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::join_ids;
using test::random_canvas;

std::string ref_script() {
  return test::python() + " " + (test::source_dir() / "tests/reference/ref_sparse_cache.py").string();
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
}

std::vector<float> read_floats(const std::filesystem::path& p) {
  const std::vector<uint8_t> b = read_file(p);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// (a) Canvas A (75 tokens: a 20-token prompt, 70% masks after it) fills the cache in a Select refresh
// (every row, exact attention, builds the patterns: tiles of 8, rho 0.3); canvas B (A with some masks of
// [lo, hi) and some outside decided) computes rows [30, 61) in a Sparse step: query rows at positions 30,
// 31 read pattern row 3, ..., 56..60 row 7; every key of the canvas is a candidate, the rows outside
// [30, 61) from A's cache. Logits of every third position from 31 (Dream: rows p - 1 inside the range).
TEST(SparseCache, CachedSparseStepMatchesTheNumpyReference) {
  for (const char* fam : {"llada", "dream", "llada_moe"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    const ModelConfig& c = e->config();
    const int64_t V = e->vocab_size(), n = 75, prompt = 20, lo = 30, hi = 61;
    const SparseConfig sc{8, 0.3f, prompt};
    const int64_t nb = (n + sc.block - 1) / sc.block;
    auto a = random_canvas(n, V, 41, e->mask_token(), 0.7);
    for (int64_t i = 0; i < prompt; ++i)
      a[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % (V - 8));
    auto b = a;
    const auto fill = random_canvas(n, V - 8, 43, e->mask_token(), 0.0);
    for (int64_t i = lo; i < hi; i += 2) b[static_cast<size_t>(i)] = fill[static_cast<size_t>(i)];
    for (int64_t i = hi + 1; i < n; i += 4)
      b[static_cast<size_t>(i)] = fill[static_cast<size_t>(i)];  // stale
    std::vector<int32_t> positions;
    for (int64_t p = lo + 1; p < hi; p += 3) positions.push_back(static_cast<int32_t>(p));
    const size_t out_size = positions.size() * static_cast<size_t>(V);
    std::vector<float> scratch(static_cast<size_t>(V)), got(out_size), dense(out_size);

    e->kv_cache_reset(n);
    e->sparse_begin(n, sc);
    e->sparse_phase(SparsePhase::Select);
    e->logits_cached(a, 0, n, std::vector<int32_t>{0}, scratch);  // refresh: every row, builds the patterns
    const std::vector<uint8_t> pats = e->sparse_patterns();
    ASSERT_EQ(pats.size(), static_cast<size_t>(c.n_layers * c.n_heads * nb * nb)) << fam;
    e->sparse_phase(SparsePhase::Sparse);
    e->logits_cached(b, lo, hi, positions, got);
    EXPECT_EQ(e->last_step().shape.n_query, hi - lo) << fam;
    EXPECT_EQ(e->last_step().shape.n_kv, n) << fam;
    e->sparse_end();
    // The same cached step with exact attention.
    e->kv_cache_reset(n);
    e->logits_cached(a, 0, n, std::vector<int32_t>{0}, scratch);
    e->logits_cached(b, lo, hi, positions, dense);

    // The reference: its own selection from A's forward (patterns written out to compare).
    const auto tmp = test::temp_dir(std::string("sparse_cache_") + fam);
    const auto out = tmp / "logits.bin", ref_pats = tmp / "patterns.bin", ref_clear = tmp / "clear.bin",
               eng = tmp / "engine.bin";
    const std::string base = ref_script() + " logits --model " + dir.string() + " --cache-tokens " +
                             join_ids(a) + " --tokens " + join_ids(b) + " --compute " + std::to_string(lo) +
                             "," + std::to_string(hi) + " --rows " + join_ids(positions) +
                             " --sparse-block 8 --sparse-rho 0.3 --prompt-len 20 --out " + out.string();
    std::string log;
    ASSERT_EQ(test::run_command(
                  base + " --patterns-out " + ref_pats.string() + " --clear-out " + ref_clear.string(), &log),
              0)
        << log;
    const auto want_pats = read_file(ref_pats);
    const auto clear = read_file(ref_clear);
    ASSERT_EQ(want_pats.size(), pats.size()) << fam;
    ASSERT_EQ(clear.size(), pats.size() / static_cast<size_t>(nb)) << fam;
    size_t compared = 0, differ = 0;
    for (size_t r = 0; r < clear.size(); ++r) {
      const auto at = static_cast<std::ptrdiff_t>(r * static_cast<size_t>(nb));
      const bool same = std::equal(pats.begin() + at, pats.begin() + at + nb, want_pats.begin() + at);
      differ += same ? 0 : 1;
      if (!clear[r]) continue;
      ++compared;
      EXPECT_TRUE(same) << fam << ": pattern row " << r << " (layer, head, query block) differs";
    }
    EXPECT_GE(compared * 10, clear.size() * 9) << fam << ": too many near ties";
    std::vector<float> want = read_floats(out);
    if (differ > 0) {  // a near tie chose another tile: compare the step with the engine's patterns
      write_file(eng, pats);
      ASSERT_EQ(test::run_command(base + " --patterns " + eng.string(), &log), 0) << log;
      want = read_floats(out);
    }
    ASSERT_EQ(want.size(), got.size()) << fam;
    const double err = test::rel_error(got.data(), want.data(), got.size());
    const double vs_dense = test::rel_error(got.data(), dense.data(), got.size());
    EXPECT_LE(err, 5e-6) << fam;
    EXPECT_GT(vs_dense, 1e-3) << fam << ": the cached sparse step should differ from the dense cached step";
    std::printf(
        "%s: cached sparse step vs numpy %.2e, vs dense cached step %.2e; %zu of %zu pattern rows "
        "clear, %zu differ\n",
        fam, err, vs_dense, compared, clear.size(), differ);
  }
}

const std::vector<std::vector<int32_t>>& prompts() {
  static const std::vector<std::vector<int32_t>> p = {
      {5, 17, 230}, {100, 101, 102, 7, 9, 44, 250}, {42, 43, 44, 45, 46}};
  return p;
}

// The generated span and the positions decided at each step.
struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> order;
  bool operator==(const Run&) const = default;
};

Run span(const std::vector<int32_t>& canvas, const std::vector<std::vector<int32_t>>& order, size_t P,
         size_t G) {
  if (canvas.size() != P + G) {
    ADD_FAILURE() << "the reference canvas has " << canvas.size() << " tokens, not " << P + G;
    return {};
  }
  return {{canvas.begin() + static_cast<std::ptrdiff_t>(P), canvas.end()}, order};
}

// ref_sparse_cache.py generate with the options of `o` (cache and SparseD); *select_forward: the forward
// that built the patterns.
Run reference_sparse_cache(const std::filesystem::path& dir, const std::vector<int32_t>& prompt,
                           const GenerateOptions& o, int* select_forward) {
  const std::string cmd = ref_script() + " generate --model " + dir.string() + " --prompt " +
                          join_ids(prompt) + " --gen-length " + std::to_string(o.gen_length) + " --steps " +
                          std::to_string(o.steps) + " --block-length " + std::to_string(o.block_length) +
                          " --alg " + std::string(name(o.alg)) + " --cache " + std::string(name(o.cache)) +
                          " --sparse-block " + std::to_string(o.sparse_block) + " --sparse-rho " +
                          std::to_string(o.sparse_rho) + " --sparse-skip " + std::to_string(o.sparse_skip);
  const nlohmann::json j = test::run_reference(cmd);
  if (j.is_null()) return {};
  std::vector<std::vector<int32_t>> order;
  for (const auto& s : j["order"]) order.push_back(s.get<std::vector<int32_t>>());
  *select_forward = j["select_forward"].get<int>();
  return span(j["tokens"].get<std::vector<int32_t>>(), order, prompt.size(),
              static_cast<size_t>(o.gen_length));
}

// One sparse configuration: tiles, rho, skip, and the forward the selection must happen at (the first
// refresh at or after floor(steps * skip)).
struct SparseCase {
  int block;
  float rho, skip;
  int select_forward;
};

// (b) For each sparse case, each cache and each prompt: tessera's generation (f32, greedy, no EOS stop)
// decides exactly the tokens and positions, step by step, of ref_sparse_cache.py; and for some (case,
// cache, prompt) the combination's reference generation differs from the prefix / dual cache alone and
// from SparseD alone (both by reference.py generate).
void check_generations(const std::string& family, const GenerateOptions& base,
                       const std::vector<SparseCase>& cases) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  int runs = 0, differs_from_cache = 0, differs_from_sparse = 0;
  for (const SparseCase& sc : cases) {
    GenerateOptions sparse_only = base;
    sparse_only.sparse = true;
    sparse_only.sparse_block = sc.block;
    sparse_only.sparse_rho = sc.rho;
    sparse_only.sparse_skip = sc.skip;
    for (const KvCache cache : {KvCache::Prefix, KvCache::Dual}) {
      GenerateOptions o = sparse_only, cache_only = base;
      o.cache = cache_only.cache = cache;
      for (const auto& prompt : prompts()) {
        const std::string at = family + " " + std::string(name(cache)) + " cache, sparse block " +
                               std::to_string(sc.block) + " rho " + std::to_string(sc.rho) + " skip " +
                               std::to_string(sc.skip) + ", prompt " + join_ids(prompt);
        int select = -2;
        const Run want = reference_sparse_cache(dir, prompt, o, &select);
        EXPECT_EQ(select, sc.select_forward) << at;
        const GenerateResult r = generate(*e, prompt, o);
        EXPECT_EQ(r.order, want.order) << at;
        EXPECT_EQ(r.tokens, want.tokens) << at;
        const size_t P = prompt.size(), G = static_cast<size_t>(o.gen_length);
        const auto c = test::reference_generate(dir, prompt, cache_only);
        const auto s = test::reference_generate(dir, prompt, sparse_only);
        ++runs;
        differs_from_cache += want != span(c.canvas, c.order, P, G) ? 1 : 0;
        differs_from_sparse += want != span(s.canvas, s.order, P, G) ? 1 : 0;
      }
    }
  }
  std::printf(
      "%s: %d generations match; the reference's combination differs from the cache alone in %d, "
      "from SparseD alone in %d\n",
      family.c_str(), runs, differs_from_cache, differs_from_sparse);
  EXPECT_GT(differs_from_cache, 0) << family << ": SparseD never changed the cached reference generation";
  EXPECT_GT(differs_from_sparse, 0) << family << ": the cache never changed the sparse reference generation";
}

// LLaDA: 32 tokens in 4 blocks of 8, 4 steps each. skip 0.25: floor(16 * 0.25) = 4 exact forwards, the
// selection at forward 4 (block 1's refresh); skip 0.35: floor(5.6) = 5 falls inside block 1, so the
// selection waits for block 2's refresh (forward 8).
TEST(SparseCache, LladaGenerationsMatchTheNumpyReference) {
  GenerateOptions o;
  o.gen_length = 32;
  o.block_length = 8;
  o.steps = 16;
  o.alg = Unmask::LowConfidence;
  o.stop_at_eos = false;
  check_generations("llada", o, {{4, 0.3f, 0.25f, 4}, {8, 0.5f, 0.35f, 8}});
}

// Dream entropy: 32 tokens in 2 blocks of 16, 8 steps each; floor(16 * 0.25) = 4 is inside block 0, so
// the selection happens at block 1's refresh (forward 8).
TEST(SparseCache, DreamEntropyGenerationsMatchTheNumpyReference) {
  GenerateOptions o;
  o.gen_length = 32;
  o.block_length = 16;
  o.steps = 16;
  o.alg = Unmask::Entropy;
  o.stop_at_eos = false;
  check_generations("dream", o, {{4, 0.3f, 0.25f, 8}, {8, 0.5f, 0.25f, 8}});
}

// The reference itself: without a cache it is reference.py's SparseD loop, without sparsity (and with
// rho 1, every tile kept) reference.py's prefix / dual cache loop, token for token and step for step;
// with a cache the selection lands on a block's refresh (ref_sparse_cache.py selfcheck).
TEST(SparseCache, ReferenceReducesToEachFeatureAlone) {
  for (const auto& [fam, alg] : {std::pair{"llada", "low_confidence"}, std::pair{"dream", "entropy"}}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 11");
    std::string out;
    EXPECT_EQ(test::run_command(ref_script() + " selfcheck --model " + dir.string() + " --alg " + alg, &out),
              0)
        << out;
    EXPECT_NE(out.find("7 passed, 0 failed"), std::string::npos) << fam << ": " << out;
  }
}

}  // namespace
}  // namespace tessera
