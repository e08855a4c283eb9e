// Ending a generation at an EOS or a stop sequence inside a block (GenerateOptions::mid_block_stop) on
// the bundled tessera-tiny: the answer is the one the whole generation gives, and it takes exactly the
// steps that decide the tokens it needs. The reference is the generation run to the end (no EOS trim,
// no stop): the tokens an answer needs are found in its text, and the step is the last of the steps
// that decided them (from its order).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "decode/generate.h"
#include "engine/engine.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

// The step (index into order) that decided the last of the generated positions [0, n).
int step_deciding_first(const GenerateResult& r, int P, size_t n) {
  int last = -1;
  for (size_t s = 0; s < r.order.size(); ++s)
    for (int32_t p : r.order[s])
      if (p >= P && static_cast<size_t>(p - P) < n) last = static_cast<int>(s);
  return last;
}

TEST(Stop, MidBlockStopGivesTheWholeRunsAnswerInTheStepsItNeeds) {
  const auto dir = test::source_dir() / "models" / "tessera-tiny";
  auto e = Engine::load(dir);
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  const int32_t eos = static_cast<int32_t>(e->config().eos_id);
  struct Case {
    const char* name;
    std::function<void(GenerateOptions&)> set;
  };
  const std::vector<Case> cases = {
      {"llada blocks of 32", [](GenerateOptions&) {}},
      {"llada one block", [](GenerateOptions& o) { o.block_length = o.gen_length; }},
      {"llada gumbel", [](GenerateOptions& o) { o.temperature = 1.0f; }},
      {"dream entropy", [](GenerateOptions& o) { o.alg = Unmask::Entropy, o.block_length = o.gen_length; }},
      {"threshold", [](GenerateOptions& o) { o.threshold = 0.9f; }},
      {"dual cache", [](GenerateOptions& o) { o.cache = KvCache::Dual; }},
      {"window", [](GenerateOptions& o) { o.window = true; }},
  };
  int eos_cases = 0, stop_cases = 0, saved = 0;
  for (const Case& c : cases) {
    for (const char* text : {"The", "Once upon a time", "She said", "It was"}) {
      SCOPED_TRACE(std::string(c.name) + ", prompt '" + text + "'");
      const std::vector<int32_t> prompt = tok.encode(text);
      const int P = static_cast<int>(prompt.size());
      GenerateOptions o;
      o.gen_length = 64;
      o.steps = 32;
      o.block_length = 32;
      o.seed = 3;
      o.eos_ids = {eos};
      c.set(o);
      GenerateOptions whole = o;
      whole.stop_at_eos = false;
      const GenerateResult ref = generate(*e, prompt, whole);
      ASSERT_EQ(ref.tokens.size(), 64u);

      // An EOS: the answer is the tokens before the first one.
      const auto first_eos = std::find(ref.tokens.begin(), ref.tokens.end(), eos) - ref.tokens.begin();
      if (first_eos < 64) {
        ++eos_cases;
        const GenerateResult r = generate(*e, prompt, o);
        EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + first_eos));
        EXPECT_EQ(r.steps_run, step_deciding_first(ref, P, static_cast<size_t>(first_eos) + 1) + 1);
        EXPECT_TRUE(std::equal(r.order.begin(), r.order.end(), ref.order.begin()));
        GenerateOptions blockwise = o;
        blockwise.mid_block_stop = false;
        const GenerateResult b = generate(*e, prompt, blockwise);
        EXPECT_EQ(b.tokens, r.tokens);
        EXPECT_LE(r.steps_run, b.steps_run);
        saved += b.steps_run - r.steps_run;
        continue;
      }

      // A stop sequence: the answer is the text before it, and the tokens it needs are the fewest
      // whose text holds it.
      const std::string full = tok.decode(ref.tokens, true);
      const std::string word = test::word_after(full, full.size() / 3);
      if (word.empty()) continue;
      ++stop_cases;
      size_t need = 1;
      while (tok.decode(std::span<const int32_t>(ref.tokens.data(), need), true).find(word) ==
             std::string::npos)
        ++need;
      GenerateOptions s = o;
      s.stop_when = [&](std::span<const int32_t> t) {
        return tok.decode(t, true).find(word) != std::string::npos;
      };
      const GenerateResult r = generate(*e, prompt, s);
      EXPECT_EQ(r.steps_run, step_deciding_first(ref, P, need) + 1) << word;
      const std::string got = tok.decode(r.tokens, true);
      EXPECT_EQ(got.substr(0, got.find(word)), full.substr(0, full.find(word))) << word;
      s.mid_block_stop = false;
      const GenerateResult b = generate(*e, prompt, s);
      EXPECT_LE(r.steps_run, b.steps_run);
      saved += b.steps_run - r.steps_run;
    }
  }
  // The prompts reach both ends, and ending inside the block saves steps somewhere.
  EXPECT_GT(eos_cases, 0);
  EXPECT_GT(stop_cases, 0);
  EXPECT_GT(saved, 0);
  std::printf("EOS cases %d, stop-sequence cases %d, steps saved over ending at block ends: %d\n", eos_cases,
              stop_cases, saved);
}

}  // namespace
}  // namespace tessera
