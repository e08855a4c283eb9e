// Infilling (GenerateOptions::suffix) on the bundled tessera-tiny, a real trained masked-diffusion model:
// given the held-out text before and after a gap, it fills the gap closer to the held-out text than it
// continues the text without the part after the gap, and its fill fits between the two better (the exact
// model's pseudo-NLL of the span with the suffix as context). Greedy, so the figures are fixed.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "eval/fidelity.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(Infill, TheSuffixHelpsTheModelFillTheGap) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto e = Engine::load(dir);
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  const auto seqs = eval::load_heldout(test::source_dir() / "models" / "heldout.jsonl", tok, 72, 64);
  const auto cases = eval::generation_cases(seqs, 64, 32, 8, 32);
  ASSERT_EQ(cases.size(), 64u);
  GenerateOptions o;
  o.gen_length = o.steps = o.block_length = 8;
  o.stop_at_eos = false;
  const std::vector<uint64_t> seeds = {0};
  const eval::Generations with = eval::generate_all(*e, o, cases, seeds, true);
  const eval::Generations without = eval::generate_all(*e, o, cases, seeds, false);
  const eval::GenSide a = eval::score(*e, with, with, cases, 1, 8);
  const eval::GenSide b = eval::score(*e, without, with, cases, 1, 8);
  std::printf("held-out match: %.4f with the suffix, %.4f without; pseudo-NLL %.3f / %.3f\n",
              a.reference_match, b.reference_match, a.nll, b.nll);
  EXPECT_GT(a.reference_match, 1.5 * b.reference_match);
  EXPECT_LT(a.nll, b.nll);
  EXPECT_LT(b.agreement, 0.5);  // the suffix changes most of the fill
}

}  // namespace
}  // namespace tessera
