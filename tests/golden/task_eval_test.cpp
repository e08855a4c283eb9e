// Task accuracy (src/eval/tasks.h, `tessera eval --task`) and the bundled task model (models/tessera-task):
// answer extraction, the intervals against hand-computed values, task files checked line by line, the
// scorer against an independent reading of each generation, the CLI's table and JSON, PyTorch's
// generations recorded beside the model (samples.jsonl) reproduced, and the exact path's accuracy on a
// held-out slice kept at the level the model card reports (the engine's regression guard).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/tasks.h"
#include "io/model_files.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

fs::path task_model() {
  return test::source_dir() / "models" / "tessera-task";
}

// Its MoE twin (LLaDA-MoE layout, upcycled from it: tools/train/upcycle_moe.py).
fs::path task_moe_model() {
  return test::source_dir() / "models" / "tessera-task-moe";
}

#define TASK_MODEL_OR_SKIP()                                                                    \
  if (!fs::exists(task_model() / "tasks.jsonl")) GTEST_SKIP() << task_model() << " is missing"; \
  static_assert(true)

void write(const fs::path& p, const std::string& s) {
  std::ofstream(p) << s;
}

// The text of `tessera generate --json`'s output (its JSON is the last line; warnings may come before).
std::string generated_text(const std::string& out) {
  const size_t at = out.rfind("\n{");
  return nlohmann::json::parse(out.substr(at == std::string::npos ? 0 : at + 1))
      .at("text")
      .get<std::string>();
}

TEST(TaskEval, AnswersAreTheTextAfterTheLastMarker) {
  EXPECT_EQ(eval::extract_answer("3+4=7 Answer: 1137"), "1137");
  EXPECT_EQ(eval::extract_answer("Answer: 1 Answer:  17 17 27 \nmore"), "17 17 27");
  EXPECT_EQ(eval::extract_answer("a=5, b=8. Answer:\t14\r"), "14");
  EXPECT_EQ(eval::extract_answer("Answer:"), "");
  EXPECT_EQ(eval::extract_answer("the answer is 14"), std::nullopt);  // the marker is case-sensitive
  EXPECT_EQ(eval::extract_answer(""), std::nullopt);
}

TEST(TaskEval, WilsonAndPairedIntervalsAreTheHandComputedValues) {
  // 8 of 10, z 1.96: centre (0.8 + 0.19208) / 1.38416, half 1.96 / 1.38416 * sqrt(0.016 + 0.009604)
  const eval::Interval w = eval::wilson(8, 10);
  EXPECT_NEAR(w.lo, 0.490162, 1e-5);
  EXPECT_NEAR(w.hi, 0.943318, 1e-5);
  const eval::Interval none = eval::wilson(0, 20), all = eval::wilson(20, 20);
  EXPECT_DOUBLE_EQ(none.lo, 0.0);
  EXPECT_NEAR(none.hi, 0.161125, 1e-5);  // 3.8416 / 23.8416
  EXPECT_NEAR(all.lo, 1 - 0.161125, 1e-5);
  EXPECT_DOUBLE_EQ(all.hi, 1.0);
  // differences {0, +1, -1, 0, +1}: mean 0.2, sample variance (3 - 5 * 0.04) / 4 = 0.7
  const eval::PairedDiff d = eval::paired_difference({1, 1, 0, 0, 1}, {1, 0, 1, 0, 0});
  EXPECT_DOUBLE_EQ(d.mean, 0.2);
  EXPECT_NEAR(d.ci.lo, 0.2 - 1.96 * std::sqrt(0.7 / 5), 1e-12);
  EXPECT_NEAR(d.ci.hi, 0.2 + 1.96 * std::sqrt(0.7 / 5), 1e-12);
  EXPECT_EQ(d.gained, 2);
  EXPECT_EQ(d.lost, 1);
  const eval::PairedDiff same = eval::paired_difference({1, 0, 1}, {1, 0, 1});
  EXPECT_EQ(same.mean, 0.0);
  EXPECT_EQ(same.ci.lo, 0.0);
  EXPECT_EQ(same.ci.hi, 0.0);
  EXPECT_THROW(eval::paired_difference({1}, {1, 0}), Error);
}

TEST(TaskEval, TaskFilesAreCheckedLineByLine) {
  const fs::path d = test::temp_dir("task_files");
  const fs::path f = d / "t.jsonl";
  write(f,
        "{\"task\": \"a\", \"prompt\": \"p1\", \"answer\": \"1\"}\n\n"
        "{\"task\": \"b\", \"prompt\": \"p2\", \"answer\": \"2\", \"target\": \"x\"}\n"
        "{\"task\": \"a\", \"prompt\": \"p3\", \"answer\": \"3\"}\n"
        "{\"task\": \"a\", \"prompt\": \"p4\", \"answer\": \"4\"}\n");
  const auto all = eval::load_tasks(f, {"all"});
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(eval::task_names(all), (std::vector<std::string>{"a", "b"}));
  const auto two = eval::load_tasks(f, {}, 2);  // at most two of each, file order
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(two[0].prompt, "p1");
  EXPECT_EQ(two[1].prompt, "p2");
  EXPECT_EQ(two[2].prompt, "p3");
  const auto b = eval::load_tasks(f, {"b"});
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].answer, "2");
  EXPECT_EQ(eval::task_hits(all, {1, 0, 1, 1}, "a"), std::make_pair(int64_t{3}, int64_t{3}));
  EXPECT_EQ(eval::task_hits(all, {1, 0, 1, 1}), std::make_pair(int64_t{3}, int64_t{4}));
  const auto expect_error = [&](const std::string& text, const std::vector<std::string>& sel,
                                const std::string& want) {
    write(d / "bad.jsonl", text);
    try {
      eval::load_tasks(d / "bad.jsonl", sel);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error("{\"task\": \"a\", \"prompt\": \"p\", \"answer\": \"1\"}\n{oops\n", {},
               "bad.jsonl line 2: not a JSON");
  expect_error("{\"task\": \"a\", \"prompt\": \"p\", \"answer\": 1}\n", {}, "line 1: needs string fields");
  expect_error("{\"task\": \"a\", \"prompt\": \"\", \"answer\": \"1\"}\n", {},
               "line 1: empty task name or prompt");
  expect_error("\n\n", {}, "holds no examples");
  expect_error("{\"task\": \"a\", \"prompt\": \"p\", \"answer\": \"1\"}\n", {"c"}, "no task 'c'");
  EXPECT_THROW(eval::load_tasks(d / "none.jsonl", {}), Error);
}

// The scorer's verdict on each example equals an independent reading of the same generation: tessera
// generate's text cut at the last "Answer:" by hand, compared with the file's answer.
TEST(TaskEval, ScoresAreTheGenerationsAnswers) {
  TASK_MODEL_OR_SKIP();
  auto e = Engine::load(task_model(), EngineOptions{});
  const Tokenizer tok = load_model_tokenizer(task_model());
  std::vector<eval::TaskExample> ex = eval::load_tasks(task_model() / "tasks.jsonl", {"add", "trace"}, 3);
  ASSERT_EQ(ex.size(), 6u);
  ex[1].answer += "0";  // a wrong reference for one example: it must score 0 whatever the model says
  GenerateOptions g;
  g.gen_length = 48;
  g.steps = 48;
  g.block_length = 48;
  g.eos_ids = {e->config().eos_id};
  const eval::TaskRun run = eval::run_tasks(*e, g, tok, model_adds_bos(task_model()), ex);
  ASSERT_EQ(run.correct.size(), ex.size());
  EXPECT_EQ(run.correct[1], 0);
  EXPECT_GT(run.forwards, 0);
  EXPECT_LE(run.forwards,
            6 * 48);  // a token a step; a generation may end once its EOS and all before it are decided
  for (size_t i = 0; i < ex.size(); ++i) {
    std::string out;
    ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " + task_model().string() +
                                    " --raw --gen-length 48 --steps 48 --block-length 48 --json -p " +
                                    test::shell_quote(ex[i].prompt),
                                &out),
              0)
        << out;
    const std::string text = generated_text(out);
    const size_t at = text.rfind("Answer:");
    ASSERT_NE(at, std::string::npos) << text;
    std::string ans = text.substr(at + 7);
    ans = ans.substr(0, ans.find('\n'));
    ans.erase(0, ans.find_first_not_of(' '));
    ans.erase(ans.find_last_not_of(' ') + 1);
    EXPECT_EQ(run.answers[i], ans) << ex[i].prompt;
    EXPECT_EQ(run.correct[i] != 0, ans == ex[i].answer) << ex[i].prompt;
  }
}

// tessera generate reproduces PyTorch's greedy low-confidence generations of held-out task prompts on the
// exported weights (tools/train/evaluate_task.py writes them to samples.jsonl beside the model).
void expect_samples_equal_pytorch(const fs::path& model) {
  std::ifstream f(model / "samples.jsonl");
  ASSERT_TRUE(f) << model / "samples.jsonl"
                 << " is missing";
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    std::string out;
    ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " + model.string() +
                                    " --raw --precision f32 --gen-length 48 --steps 48 --block-length 48 "
                                    "--alg low_confidence --temperature 0 --json -p " +
                                    test::shell_quote(j.at("prompt").get<std::string>()),
                                &out),
              0)
        << out;
    EXPECT_EQ(generated_text(out), j.at("pytorch").get<std::string>()) << j.at("prompt");
    ++n;
  }
  EXPECT_GE(n, 5);
}

// The regression guard: the exact path's accuracy on the first 8 held-out examples of each task stays at
// least what the model card's run measured on the same slice (the figure is in the card; a drop of more
// than one answer fails).
void expect_guard_holds(const fs::path& model) {
  std::ifstream card(model / "guard.json");
  ASSERT_TRUE(card) << model / "guard.json"
                    << " is missing";
  const auto guard = nlohmann::json::parse(card);
  const int per_task = guard.at("per_task").get<int>();
  const fs::path res = test::temp_dir("task_guard") / "r.json";
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " eval -m " + model.string() +
                                  " --task all --per-task " + std::to_string(per_task) + " --json-out " +
                                  res.string(),
                              &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(std::ifstream(res));
  ASSERT_EQ(j["results"].size(), 1u);
  const auto& r = j["results"][0];
  EXPECT_EQ(r["n"].get<int64_t>(), 5 * per_task);
  EXPECT_GE(r["correct"].get<int64_t>(), guard.at("correct").get<int64_t>() - 1) << out;
  // exact-match answers by chance are next to impossible: a tenth right is a model that solves tasks
  EXPECT_GT(r["correct"].get<int64_t>(), r["n"].get<int64_t>() / 10) << out;
}

TEST(BundledModels, TesseraTaskSamplesEqualPyTorch) {
  TASK_MODEL_OR_SKIP();
  expect_samples_equal_pytorch(task_model());
}

TEST(BundledModels, TesseraTaskExactAccuracyHolds) {
  TASK_MODEL_OR_SKIP();
  expect_guard_holds(task_model());
}

// The MoE twin, whose DES rows the task table reports: the same two checks.
TEST(BundledModels, TesseraTaskMoeSamplesEqualPyTorch) {
  TASK_MODEL_OR_SKIP();
  expect_samples_equal_pytorch(task_moe_model());
}

TEST(BundledModels, TesseraTaskMoeExactAccuracyHolds) {
  TASK_MODEL_OR_SKIP();
  expect_guard_holds(task_moe_model());
}

TEST(TaskEval, CliRowsJsonAndErrors) {
  TASK_MODEL_OR_SKIP();
  const fs::path d = test::temp_dir("task_cli");
  const std::string base = std::string(TESSERA_BINARY) + " eval -m " + task_model().string();
  std::string out;
  ASSERT_EQ(test::run_command(base +
                                  " --task sort,trace --per-task 3 --compare threshold=0.5 --compare "
                                  "k-logits=2 --json-out " +
                                  (d / "t.json").string(),
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("vs exact [95% CI]"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(std::ifstream(d / "t.json"));
  EXPECT_EQ(j["examples"].get<int64_t>(), 6);
  EXPECT_EQ(j["task_names"], nlohmann::json::parse(R"(["sort", "trace"])"));
  ASSERT_EQ(j["results"].size(), 3u);
  const auto& exact = j["results"][0];
  EXPECT_FALSE(exact.contains("vs_exact"));
  EXPECT_DOUBLE_EQ(exact["forwards_per_token"].get<double>(),
                   static_cast<double>(exact["forwards"].get<int64_t>()) / exact["tokens"].get<double>());
  // chunked logits are exact: the same answers, a difference of 0 with a zero-width interval
  const auto& chunked = j["results"][2];
  EXPECT_EQ(chunked["correct"], exact["correct"]);
  EXPECT_DOUBLE_EQ(chunked["vs_exact"]["difference"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(chunked["vs_exact"]["ci95"][1].get<double>(), 0.0);
  // threshold 0.5 decodes several positions a forward
  EXPECT_LT(j["results"][1]["forwards"].get<int64_t>(), exact["forwards"].get<int64_t>());
  test::expect_command_error(base + " --task nope", "--task: no task 'nope'");
  test::expect_command_error(base + " --task all --no-generation", "--task scores generated answers");
  test::expect_command_error(base + " --per-task 2", "--tasks-file and --per-task need --task");
  test::expect_command_error(std::string(TESSERA_BINARY) + " eval -m " +
                                 (test::source_dir() / "models" / "tessera-tiny").string() + " --task all",
                             "tasks.jsonl does not exist");
}

}  // namespace
}  // namespace tessera
