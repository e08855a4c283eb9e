// At temperature 0 the order in which positions are unmasked equals the numpy reference sampler's
// (tests/reference/reference.py generate) for tiny random LLaDA and Dream models and several prompts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

void check_order(const std::string& family, const std::string& alg, int gen, int steps, int block) {
  TESSERA_TINY_OR_SKIP(dir, family, "--seed 11");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{5, 17, 230}, std::vector<int32_t>{1},
                                             std::vector<int32_t>{100, 101, 102, 7, 9, 44, 250}}) {
    GenerateOptions o;
    o.gen_length = gen;
    o.steps = steps;
    o.block_length = block;
    o.alg = parse_unmask(alg);
    o.stop_at_eos = false;
    const GenerateResult r = generate(*e, prompt, o);
    std::string out;
    const std::string cmd = test::python() + " " +
                            (test::source_dir() / "tests/reference/reference.py").string() +
                            " generate --model " + dir.string() + " --prompt " + test::join_ids(prompt) +
                            " --gen-length " + std::to_string(gen) + " --steps " + std::to_string(steps) +
                            " --block-length " + std::to_string(block) + " --alg " + alg + " 2>/dev/null";
    ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
    const auto j = nlohmann::json::parse(out);
    const auto ref_order = j["order"].get<std::vector<std::vector<int32_t>>>();
    std::vector<std::vector<int32_t>> got;
    for (const auto& s : r.order) {
      if (!s.empty()) got.push_back(s);
    }
    std::vector<std::vector<int32_t>> want;
    for (const auto& s : ref_order) {
      if (!s.empty()) want.push_back(s);
    }
    EXPECT_EQ(got, want) << family << " " << alg << " prompt " << test::join_ids(prompt);
    const auto tokens = j["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ref_gen(tokens.begin() + static_cast<long>(prompt.size()), tokens.end());
    EXPECT_EQ(r.tokens, ref_gen) << family << " " << alg;
  }
}

TEST(SamplerOrder, LladaLowConfidenceBlocks) {
  check_order("llada", "low_confidence", 16, 8, 8);
}
TEST(SamplerOrder, LladaLowConfidenceOneBlock) {
  check_order("llada", "low_confidence", 12, 6, 12);
}
TEST(SamplerOrder, DreamEntropy) {
  check_order("dream", "entropy", 16, 8, 16);
}
TEST(SamplerOrder, DreamMaskgitPlus) {
  check_order("dream", "maskgit_plus", 12, 5, 12);
}
TEST(SamplerOrder, DreamTopkMargin) {
  check_order("dream", "topk_margin", 12, 12, 12);
}

}  // namespace
}  // namespace tessera
