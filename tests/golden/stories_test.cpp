// Golden end-to-end test on a real trained model: llama2.c's stories260K converted with
// convert-llama2c must print exactly the golden greedy text of ../shared/models/stories260K.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/engine.h"
#include "io/llama2c.h"
#include "io/tokenizer.h"
#include "stories_util.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(Stories260K, GreedyDiffusionDecodingPrintsTheGoldenText) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  EXPECT_EQ(test::stories_greedy_text(EngineOptions{}), test::stories_golden_text());
}

TEST(Stories260K, MatchesTheNumpyReference) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  std::string out;
  if (test::run_command(test::python() + " -c 'import numpy'", &out) != 0) GTEST_SKIP() << "no python3 numpy";
  const double err = test::stories_reference_error(EngineOptions{});
  EXPECT_GE(err, 0.0);
  EXPECT_LE(err, 5e-6);  // f32 weights and compute; observed 5.6e-7
  std::printf("stories260K: relative error %.2e against the numpy reference\n", err);
}

// A causal model's rows see only the keys before them: SparseD's head-specific patterns over the whole
// canvas do not apply, and it is refused before any forward.
TEST(Stories260K, SparseAttentionIsRefusedOnACausalModel) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  auto e = Engine::load(test::stories_converted());
  test::expect_error(
      [&] {
        e->sparse_begin(40, SparseConfig{8, 0.5f, 10});
      },
      "sparse attention needs a bidirectional or block-causal model");
}

}  // namespace
}  // namespace tessera
