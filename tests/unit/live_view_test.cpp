// The live canvas view's frames (apps/tessera/live_view.h) on the bundled model's tokenizer: never
// taller than the terminal less one row, special tokens as placeholders, control characters and newlines
// inside tokens counted, the status line's step / block / ETA. tests/terminal runs it on a real terminal.
#include "apps/tessera/live_view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

namespace tessera {
namespace {

constexpr int32_t kMask = 4090, kEos = 4088, kReserved = 4091;  // tessera-tiny's ids

Tokenizer tiny_tokenizer() {
  return Tokenizer::from_file(test::source_dir() / "models" / "tessera-tiny" / "tokenizer.json");
}

// The frame's rows without their escape sequences.
std::vector<std::string> rows_of(const std::string& frame) {
  const std::string plain = std::regex_replace(frame, std::regex("\x1b\\[[0-9;]*[A-Za-z]"), "");
  std::vector<std::string> rows;
  size_t at = 0;
  while (at < plain.size()) {
    const size_t end = plain.find('\n', at);
    rows.push_back(plain.substr(at, end - at));
    at = end + 1;
  }
  return rows;
}

size_t cells(const std::string& row) {  // every glyph in these tests is one cell wide
  size_t n = 0;
  for (const char c : row) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

struct Canvas {
  std::vector<int32_t> ids;
  StepEvent event(int step, int committed) const {
    StepEvent ev{};
    ev.step = step;
    ev.canvas = ids;
    ev.committed = committed;
    return ev;
  }
};

GenerateOptions options(int gen, int block, int steps) {
  GenerateOptions o;
  o.gen_length = gen;
  o.block_length = block;
  o.steps = steps;
  o.eos_ids = {kEos};
  return o;
}

TEST(LiveView, FramesFitTheTerminalWhateverTheCanvas) {
  const Tokenizer t = tiny_tokenizer();
  const std::vector<int32_t> prompt = t.encode("Once upon a time");
  // Text with newlines, a carriage return, a bell and a tab inside it, special tokens, then masks.
  const std::vector<int32_t> text = t.encode("The dog\nran\r away\x07 and\tback.\n\nThe end");
  for (const int gen : {8, 64, 448}) {
    Canvas c{prompt};
    std::vector<int32_t> gen_ids = text;
    gen_ids.push_back(kEos);
    gen_ids.push_back(kReserved);
    gen_ids.resize(static_cast<size_t>(gen), kMask);
    c.ids.insert(c.ids.end(), gen_ids.begin(), gen_ids.end());
    const int block = gen >= 64 ? 32 : gen;
    cli::LiveView view(stderr, t, options(gen, block, gen), prompt.size(), kMask, false);
    for (const int cols : {10, 37, 60, 80}) {
      for (const int rows : {2, 3, 4, 8, 24}) {
        const auto f = view.frame(c.event(2, static_cast<int>(prompt.size())), cols, rows, 0.5);
        const std::vector<std::string> shown = rows_of(f.text);
        SCOPED_TRACE("gen " + std::to_string(gen) + ", " + std::to_string(cols) + "x" + std::to_string(rows));
        EXPECT_EQ(f.rows, static_cast<int>(shown.size()));
        EXPECT_LE(f.rows, rows - 1);
        for (const std::string& r : shown) EXPECT_LE(cells(r), static_cast<size_t>(cols)) << r;
        for (const char bad : {'\r', '\x07', '\t'}) EXPECT_EQ(f.text.find(bad), std::string::npos);
        EXPECT_EQ(f.text.find("<|"), std::string::npos) << "a special token's raw text";
      }
    }
  }
}

TEST(LiveView, SpecialTokensArePlaceholdersAndNewlinesRows) {
  const Tokenizer t = tiny_tokenizer();
  const std::vector<int32_t> prompt = t.encode("Once upon a time");
  Canvas c{prompt};
  for (const int32_t id : t.encode("one\ntwo")) c.ids.push_back(id);
  c.ids.push_back(kEos);
  c.ids.push_back(kReserved);
  c.ids.push_back(kMask);
  const int gen = static_cast<int>(c.ids.size() - prompt.size());
  cli::LiveView view(stderr, t, options(gen, gen, gen), prompt.size(), kMask, false);
  const auto f = view.frame(c.event(0, static_cast<int>(c.ids.size())), 60, 24, 1.0);
  const std::vector<std::string> shown = rows_of(f.text);
  ASSERT_EQ(shown.size(), 3u) << f.text;
  EXPECT_EQ(shown[0], "one");
  EXPECT_EQ(shown[1], "two\xc2\xb7\xe2\x9f\xa8reserved_0\xe2\x9f\xa9\xe2\x96\x91");  // two·⟨reserved_0⟩░
  EXPECT_NE(f.text.find("\x1b[2m\xc2\xb7"), std::string::npos) << "EOS is dim";
}

TEST(LiveView, TallCanvasShowsTheRowsBeingDecided) {
  const Tokenizer t = tiny_tokenizer();
  const std::vector<int32_t> prompt = t.encode("Once upon a time");
  Canvas c{prompt};
  const int gen = 256;
  for (int i = 0; i < 200; ++i) c.ids.push_back(t.encode(" word")[0]);  // many rows of 50 decided
  c.ids.resize(prompt.size() + gen, kMask);
  cli::LiveView view(stderr, t, options(gen, 64, 128), prompt.size(), kMask, false);
  const auto f = view.frame(c.event(99, static_cast<int>(prompt.size()) + 200), 50, 8, 2.0);
  const std::vector<std::string> shown = rows_of(f.text);
  ASSERT_EQ(f.rows, 7);
  // The marker, then 5 of the canvas's rows: decided text above the first mask's row.
  EXPECT_TRUE(std::regex_match(shown[0], std::regex("… \\d+ lines above( · \\d+ below)?"))) << shown[0];
  const bool mask_shown = std::any_of(shown.begin() + 1, shown.end() - 1, [](const std::string& r) {
    return r.find("\xe2\x96\x91") != std::string::npos;
  });
  EXPECT_TRUE(mask_shown) << f.text;
  EXPECT_FALSE(shown[1].empty());
  EXPECT_EQ(shown[1].find("\xe2\x96\x91"), std::string::npos) << "the decided text before the first mask";
  // Step 100 of 128; the first mask (position 200) is in block 4 of 4; 200 tokens in 2 s.
  EXPECT_EQ(shown.back(), "step 100/128 · block 4/4 · 100 tok/s · ETA 0.6 s");
}

TEST(LiveView, ThresholdDecodingEstimatesFromTheMasksLeft) {
  const Tokenizer t = tiny_tokenizer();
  const std::vector<int32_t> prompt = t.encode("Once upon a time");
  Canvas c{prompt};
  const int gen = 64;
  for (int i = 0; i < 16; ++i) c.ids.push_back(t.encode(" word")[0]);
  c.ids.resize(prompt.size() + gen, kMask);
  GenerateOptions o = options(gen, 32, gen);
  o.threshold = 0.9f;
  cli::LiveView view(stderr, t, o, prompt.size(), kMask, false);
  // 16 tokens in 4 steps (4 per step), 48 masks left: about 12 more steps of 0.25 s.
  const auto f = view.frame(c.event(3, static_cast<int>(prompt.size()) + 16), 80, 24, 1.0);
  EXPECT_EQ(rows_of(f.text).back(), "step 4 · block 1/2 · 16.0 tok/s · ETA ~3.0 s");
}

TEST(LiveView, NoRoomNoFrame) {
  const Tokenizer t = tiny_tokenizer();
  Canvas c{{1, 2, kMask}};
  cli::LiveView view(stderr, t, options(1, 1, 1), 2, kMask, false);
  EXPECT_EQ(view.frame(c.event(0, 2), 80, 1, 0.1).rows, 0);
  const auto f = view.frame(c.event(0, 2), 80, 2, 0.1);  // the status line alone
  ASSERT_EQ(f.rows, 1);
  EXPECT_EQ(rows_of(f.text)[0].rfind("step 1/1", 0), 0u) << f.text;
}

}  // namespace
}  // namespace tessera
