// Token editing's step loop (decode/edit.cpp) on a fake denoiser whose predictions are a table of the
// block's state: the worked example of specs/llada21-editing.md section 8 (quality mode, then the
// S-mode remark), the post-step cap, the committed / provisional boundary of the step events, and the
// options' checks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "fake_denoiser.h"

namespace tessera {
namespace {

// Example tokens: The 1, cat 2, sat 3, "." 4, dog 5, ran 0; the block is canvas positions 3..6 (after
// the prompt kPrompt), M the mask.
constexpr int32_t The = 1, cat = 2, sat = 3, dot = 4, dog = 5, ran = 0, M = kMask;
using Block = std::array<int32_t, 4>;
using Row = std::pair<int32_t, double>;  // the argmax and its probability

// Logits that give the token probability p (one logit a, kV - 2 zeros; the mask is suppressed).
std::vector<float> row_for(Row r) {
  std::vector<float> v(kV, 0.0f);
  v[static_cast<size_t>(r.first)] =
      static_cast<float>(std::log(double(kV - 2) * r.second / (1.0 - r.second)));
  return v;
}

// The predictions of spec section 8 per block state (and one more state for the S-mode run).
RowFn example() {
  static const std::map<Block, std::array<Row, 4>> table = {
      {{M, M, M, M}, {{{The, .90}, {cat, .60}, {sat, .75}, {dot, .30}}}},
      {{The, M, sat, M}, {{{The, .95}, {dog, .65}, {ran, .80}, {dot, .50}}}},
      {{The, dog, ran, M}, {{{The, .97}, {dog, .90}, {ran, .92}, {dot, .97}}}},
      {{The, dog, ran, dot}, {{{The, .98}, {cat, .40}, {ran, .95}, {dot, .99}}}},
      {{The, cat, ran, dot}, {{{The, .98}, {cat, .90}, {ran, .95}, {dot, .99}}}},
  };
  return [](std::span<const int32_t> c, int p) {
    const Block b = {c[3], c[4], c[5], c[6]};
    const auto it = table.find(b);
    EXPECT_NE(it, table.end()) << "a state the example does not reach";
    if (it == table.end()) return std::vector<float>(kV, 0.0f);
    return row_for(it->second[static_cast<size_t>(p - 3)]);
  };
}

GenerateOptions editing(float threshold, float edit_threshold, int max_post = 16) {
  GenerateOptions o;
  o.gen_length = o.block_length = 4;
  o.steps = 4;
  o.stop_at_eos = false;
  o.edit = true;
  o.threshold = threshold;
  o.edit_threshold = edit_threshold;
  o.max_post_steps = max_post;
  return o;
}

TEST(EditLoop, TheSpecsWorkedExample) {
  FakeDenoiser d(example());
  d.edits = true;
  std::vector<int> committed;
  std::vector<std::vector<TokenEdit>> edits;
  const GenerateResult r = generate(d, kPrompt, editing(0.7f, 0.5f), [&](const StepEvent& ev) {
    committed.push_back(ev.committed);
    edits.emplace_back(ev.edits.begin(), ev.edits.end());
  });
  // Step 1 fills The and sat (> 0.7); step 2 fills dog (none > 0.7: the most confident mask) and edits
  // sat -> ran (0.80 > 0.5); step 3 fills "."; step 4 has no mask and edits nothing (cat 0.40): the
  // block ends after 4 forwards, 3 of them changing the canvas.
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{The, dog, ran, dot}));
  EXPECT_EQ(r.order, (std::vector<std::vector<int32_t>>{{3, 5}, {4, 5}, {6}}));
  EXPECT_EQ(r.edits, (std::vector<TokenEdit>{{1, 5, sat, ran}}));
  EXPECT_EQ(r.forwards, 4);
  EXPECT_EQ(d.calls.size(), 4u);
  for (const auto& c : d.calls) EXPECT_EQ(c, (std::vector<int32_t>{3, 4, 5, 6}));  // the whole block
  // The block may change until it ends: nothing is committed in its steps; the events carry the edits.
  EXPECT_EQ(committed, (std::vector<int>{3, 3, 3}));
  EXPECT_EQ(edits[1], (std::vector<TokenEdit>{{1, 5, sat, ran}}));
  EXPECT_TRUE(edits[0].empty() && edits[2].empty());

  // S mode (editing whenever the candidate differs, p > 0): step 4 rewrites dog -> cat, step 5 edits
  // nothing and ends the block.
  FakeDenoiser s(example());
  s.edits = true;
  const GenerateResult rs = generate(s, kPrompt, editing(0.7f, 0.0f));
  EXPECT_EQ(rs.tokens, (std::vector<int32_t>{The, cat, ran, dot}));
  EXPECT_EQ(rs.edits, (std::vector<TokenEdit>{{1, 5, sat, ran}, {3, 4, dog, cat}}));
  EXPECT_EQ(rs.forwards, 5);
}

TEST(EditLoop, PostStepsAreCapped) {
  // Once the block has no mask, position 3 flips between The and cat at every step, confidently.
  RowFn flip = [](std::span<const int32_t> c, int p) {
    const bool full = std::none_of(c.begin() + 3, c.begin() + 7, [](int32_t t) { return t == M; });
    if (p == 3 && full) return row_for({c[3] == The ? cat : The, 0.99});
    return row_for({p == 3 ? The : dot, 0.99});
  };
  for (int cap : {0, 1, 3}) {
    FakeDenoiser d(flip);
    d.edits = true;
    const GenerateResult r = generate(d, kPrompt, editing(0.5f, 0.5f, cap));
    // One forward fills the 4 masks; then `cap` post forwards, each an edit; then the cap ends it.
    EXPECT_EQ(r.forwards, 1 + cap) << "cap " << cap;
    EXPECT_EQ(r.edits.size(), static_cast<size_t>(cap)) << "cap " << cap;
  }
}

TEST(EditLoop, OptionsAreChecked) {
  GenerateOptions o = editing(0.0f, 0.5f);
  expect_error(o, "token editing needs a mask threshold > 0");
  o = editing(0.5f, 1.5f);
  expect_error(o, "edit-threshold must be in [0, 1] (got 1.5)");
  o = editing(0.5f, 0.5f, -1);
  expect_error(o, "max-post-steps must be >= 0 (got -1)");
  o = editing(0.5f, 0.5f);
  o.alg = Unmask::Entropy;
  expect_error(o, "threshold decoding needs a probability-like confidence");
  o = editing(0.5f, 0.5f);
  o.alg = Unmask::TopkMargin;
  expect_error(o, "token editing ranks by the candidate's probability");
  o = editing(0.5f, 0.5f);
  o.window = true;
  expect_error(o, "token editing revisits the block's decided tokens");
  GenerateOptions p;
  p.edit_penalty = 1.0f;
  expect_error(p, "edit-penalty applies to token editing");
  EXPECT_EQ(parse_edit_mode("quality"), EditMode::Quality);
  test::expect_error([] { (void)parse_edit_mode("fast"); },
                     "unknown edit mode 'fast'; use off, quality or speed");
}

}  // namespace
}  // namespace tessera
