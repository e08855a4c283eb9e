// Window-Diffusion on tiny checkpoints in the real layouts, against the numpy reference: a step over
// a row list that is not one range (the active set and the positions decided in the phase) equals
// reference.py's computation with the other rows' K / V from the cache; whole generations (phases,
// refreshes, pruning, capped counts, early stop) decide exactly what reference.py generate --window
// decides (f32, temperature 0).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using test::random_canvas;

// Canvas A fills the cache; B changes some rows; the step computes rows {3, 10, 11, 12, 30, 41} (31 too
// where there is no shift) and reads every other row from A's cache. f32: within 5e-6 (observed: up to
// 6.6e-7).
TEST(Window, RowListStepMatchesTheNumpyReference) {
  test::expect_row_list_steps_match_reference(EngineOptions{.precision = Precision::F32}, 5e-6);
}

TEST(Window, RowListMisuseFailsClearly) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const auto c = random_canvas(20, e->vocab_size(), 3, e->mask_token(), 0.5);
  std::vector<float> out(static_cast<size_t>(e->vocab_size()));
  e->kv_cache_reset(20);
  test::expect_error(
      [&] {
        e->logits_rows(c, std::vector<int32_t>{4, 5}, std::vector<int32_t>{4}, out);
      },
      "canvas row 0 was never computed in this request");
  e->logits_cached(c, 0, 20, std::vector<int32_t>{0}, out);
  test::expect_error(
      [&] {
        e->logits_rows(c, std::vector<int32_t>{5, 4}, std::vector<int32_t>{4}, out);
      },
      "the computed rows must be ascending, distinct rows of the canvas of 20 (row 4 at index 1)");
  test::expect_error(
      [&] {
        e->logits_rows(c, std::vector<int32_t>{4, 20}, std::vector<int32_t>{4}, out);
      },
      "(row 20 at index 1)");
  test::expect_error([&] { e->logits_rows(c, std::vector<int32_t>{}, std::vector<int32_t>{}, out); },
                     "a step must compute at least one row");
}

struct WindowCase {
  const char* family;
  const char* alg;
  int gen, steps, block, w_ex, w_in, refresh;
  bool early;
};

void check_window(const WindowCase& c) {
  TESSERA_TINY_OR_SKIP(dir, c.family, "--seed 11");
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{5, 17, 230}, std::vector<int32_t>{100, 101, 102, 7, 9, 44, 250}}) {
    GenerateOptions o;
    o.gen_length = c.gen;
    o.steps = c.steps;
    o.block_length = c.block;
    o.alg = parse_unmask(c.alg);
    o.stop_at_eos = false;
    o.window = true;
    o.window_ex = c.w_ex;
    o.window_in = c.w_in;
    o.window_refresh = c.refresh;
    std::string eos;
    if (c.early) {  // stop at the token the third step decides (the runs agree until then)
      const GenerateResult r = generate(*e, prompt, o);
      ASSERT_GE(r.order.size(), 3u);
      const int32_t tok = r.tokens[static_cast<size_t>(r.order[2].front()) - prompt.size()];
      o.eos_ids = {tok};
      o.window_early_stop = true;
      eos = " --early-eos " + std::to_string(tok);
    }
    const GenerateResult r = generate(*e, prompt, o);
    std::string out;
    const std::string cmd =
        test::python() + " " + (test::source_dir() / "tests/reference/reference.py").string() +
        " generate --model " + dir.string() + " --prompt " + test::join_ids(prompt) + " --gen-length " +
        std::to_string(c.gen) + " --steps " + std::to_string(c.steps) + " --block-length " +
        std::to_string(c.block) + " --alg " + c.alg + " --window " + std::to_string(c.w_ex) + "," +
        std::to_string(c.w_in) + "," + std::to_string(c.refresh) + eos + " 2>/dev/null";
    ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
    const auto j = nlohmann::json::parse(out);
    const std::string what = std::string(c.family) + " " + c.alg + " prompt " + test::join_ids(prompt);
    EXPECT_EQ(r.order, (j["order"].get<std::vector<std::vector<int32_t>>>())) << what;
    const auto tokens = j["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(r.tokens, std::vector<int32_t>(tokens.begin() + static_cast<long>(prompt.size()), tokens.end()))
        << what;
    if (c.early) {
      EXPECT_LT(r.order.size(), static_cast<size_t>(c.gen)) << what << ": the early stop never came";
    }
  }
}

TEST(Window, LladaPhasesMatchTheNumpyReference) {
  check_window({"llada", "low_confidence", 32, 16, 16, 10, 4, 3, false});
}
TEST(Window, LladaCapsAndNoCacheMatchTheNumpyReference) {
  check_window({"llada", "low_confidence", 24, 4, 24, 8, 3, 0, false});  // 6 per step, 3 active
}
TEST(Window, DreamEntropyMatchesTheNumpyReference) {
  check_window({"dream", "entropy", 32, 12, 32, 12, 5, 4, false});
}
TEST(Window, LladaMoeMatchesTheNumpyReference) {
  check_window({"llada_moe", "low_confidence", 24, 12, 12, 8, 4, 5, false});
}
TEST(Window, EarlyStopMatchesTheNumpyReference) {
  check_window({"llada", "low_confidence", 32, 32, 32, 12, 4, 4, true});
  check_window({"dream", "topk_margin", 24, 24, 24, 10, 4, 0, true});
}

// The CLI: the flags turn the window on and show in --json; what cannot combine fails clearly.
TEST(Window, CliFlagsAndErrors) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 4");
  const std::string base = std::string(TESSERA_BINARY) + " generate -m " + dir.string() +
                           " -p hi --raw --gen-length 32 --block-length 32 --steps 32 ";
  std::string out;
  ASSERT_EQ(test::run_command(base + "--json 2>/dev/null", &out), 0) << out;
  const auto exact = nlohmann::json::parse(out);
  EXPECT_FALSE(exact.contains("window"));
  ASSERT_EQ(
      test::run_command(base + "--json --window-ex 32 --window-in 32 --window-refresh 0 2>/dev/null", &out),
      0)
      << out;
  const auto whole = nlohmann::json::parse(out);
  EXPECT_EQ(whole["tokens"], exact["tokens"]);  // a window over everything, no cache: exact
  ASSERT_EQ(test::run_command(base + "--json --window 2>/dev/null", &out), 0) << out;
  const auto w = nlohmann::json::parse(out);
  EXPECT_EQ(w["window"]["external"], 64);
  EXPECT_EQ(w["window"]["internal"], 16);
  EXPECT_EQ(w["window"]["refresh"], 32);
  EXPECT_EQ(w["window"]["early_stop"], false);
  EXPECT_GT(w["kv_cache_bytes"].get<int64_t>(), 0);
  ASSERT_EQ(test::run_command(base + "--json --window-early-stop --alg entropy 2>/dev/null", &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["window"]["external"], 128);
  test::expect_command_error(base + "--window --cache dual 2>&1",
                             "Window-Diffusion keeps its own phase cache");
  test::expect_command_error(base + "--window-in 80 2>&1", "window-in (80) must not exceed window-ex (64)");
  // SparseD inside the window: a pattern is held and --json says so.
  ASSERT_EQ(test::run_command(base + "--json --window --sparse --sparse-block 8 2>/dev/null", &out), 0)
      << out;
  const auto ws = nlohmann::json::parse(out);
  EXPECT_EQ(ws["sparse"], true);
  EXPECT_GT(ws["sparse_pattern_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(ws["window"]["external"], 64);
}

}  // namespace
}  // namespace tessera
