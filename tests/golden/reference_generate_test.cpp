// Whole generations of the bidirectional families against the numpy reference loop (reference.py
// generate, written from algorithms.md): the Fast-dLLM prefix and dual KV caches over several blocks
// (algorithms.md 1D), infilling (a suffix after the generated span) and SparseD (algorithms.md 2) decide
// exactly the tokens, step by step, that the reference decides (tiny checkpoints, f32, temperature 0).
// Each feature changes the reference's generation for at least one prompt, so an engine that ignored it
// (or ran the other cache) would fail.
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

const std::vector<std::vector<int32_t>>& prompts() {
  static const std::vector<std::vector<int32_t>> p = {
      {5, 17, 230}, {100, 101, 102, 7, 9, 44, 250}, {42, 43, 44, 45, 46}};
  return p;
}

// 24 tokens in 3 blocks of 8, 4 steps per block, greedy; no EOS stop.
GenerateOptions options(const std::string& alg) {
  GenerateOptions o;
  o.gen_length = 24;
  o.block_length = 8;
  o.steps = 12;
  o.alg = parse_unmask(alg);
  o.stop_at_eos = false;
  return o;
}

using Run = test::ReferenceRun;
std::vector<Run> reference_runs(const std::filesystem::path& dir, const GenerateOptions& o) {
  return test::reference_runs(dir, prompts(), o);
}

// tessera's generate() decides, for every prompt, exactly what reference.py generate decides with the
// options `o` (what: the case's name); returns the reference's runs.
std::vector<Run> expect_reference_generation(const std::filesystem::path& dir, const GenerateOptions& o,
                                             const std::string& what) {
  return test::expect_matches_reference(dir, prompts(), o, what);
}

// Prefix and dual cache over 3 blocks: each matches the reference, each changes the reference's
// generation for some prompt (the cached rows are stale), and the two caches differ from each other.
void check_caches(const std::string& family, const std::string& alg) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions prefix = options(alg), dual = options(alg);
  prefix.cache = KvCache::Prefix;
  dual.cache = KvCache::Dual;
  const auto p = expect_reference_generation(dir, prefix, family + " prefix cache");
  const auto d = expect_reference_generation(dir, dual, family + " dual cache");
  const auto exact = reference_runs(dir, options(alg));
  EXPECT_NE(p, exact) << family << ": the prefix cache never changed the reference's generation";
  EXPECT_NE(d, exact) << family << ": the dual cache never changed the reference's generation";
  EXPECT_NE(p, d) << family << ": the prefix and dual caches generate the same here";
}

TEST(ReferenceGenerate, LladaPrefixAndDualCache) {
  check_caches("llada", "low_confidence");
}
TEST(ReferenceGenerate, DreamEntropyPrefixAndDualCache) {
  check_caches("dream", "entropy");
}

// Infilling: the suffix is in every forward, never decided; it changes the generation. With the dual
// cache the suffix rows are cached too.
void check_infill(const std::string& family, const std::string& alg) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions o = options(alg);
  o.suffix = {11, 12, 13, 14, 15, 16};
  const auto infill = expect_reference_generation(dir, o, family + " infill");
  EXPECT_NE(infill, reference_runs(dir, options(alg)))
      << family << ": the suffix never changed the reference's generation";
  o.cache = KvCache::Dual;
  EXPECT_NE(expect_reference_generation(dir, o, family + " infill, dual cache"), infill)
      << family << ": the dual cache never changed the reference's infilling";
}

TEST(ReferenceGenerate, LladaInfill) {
  check_infill("llada", "low_confidence");
}
TEST(ReferenceGenerate, DreamInfill) {
  check_infill("dream", "entropy");
}

// SparseD: floor(12 * 0.2) = 2 exact forwards, the third builds the patterns (tiles of 4, rho 0.3),
// the other 9 attend only to their tiles, across the blocks.
void check_sparse(const std::string& family, const std::string& alg) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  GenerateOptions o = options(alg);
  o.sparse = true;
  o.sparse_block = 4;
  o.sparse_rho = 0.3f;
  o.sparse_skip = 0.2f;
  EXPECT_NE(expect_reference_generation(dir, o, family + " sparse"), reference_runs(dir, options(alg)))
      << family << ": sparse attention never changed the reference's generation";
}

TEST(ReferenceGenerate, LladaSparseD) {
  check_sparse("llada", "low_confidence");
}
TEST(ReferenceGenerate, DreamEntropySparseD) {
  check_sparse("dream", "entropy");
}

}  // namespace
}  // namespace tessera
