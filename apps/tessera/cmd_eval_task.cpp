// tessera eval --task: the exact path and every --compare option generate the model's held-out task
// prompts (MODEL/tasks.jsonl unless --tasks-file); each row gives exact-match accuracy per task and over all
// tasks with its 95% Wilson interval, the difference from the exact path on the same prompts with a paired
// 95% interval, forwards per generated token and tokens per second.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/compare.h"
#include "apps/tessera/eval_task.h"
#include "apps/tessera/svg.h"
#include "core/error.h"
#include "eval/tasks.h"
#include "io/model_files.h"
#include "runtime/session.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// generation_config.json's gen_length (the length the model was trained to answer in), else 64.
int model_gen_length(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "generation_config.json");
  if (!f) return 64;
  const json j = json::parse(f, nullptr, false);
  if (j.is_object() && j.contains("gen_length") && j["gen_length"].is_number_integer() &&
      j["gen_length"].get<int>() > 0)
    return j["gen_length"].get<int>();
  return 64;
}

struct Row {
  std::string label;
  eval::TaskRun run;
};

double per_token(double x, int64_t tokens) {
  return tokens > 0 ? x / static_cast<double>(tokens) : 0.0;
}

json row_json(const Row& r, const std::vector<eval::TaskExample>& ex, const std::vector<std::string>& names,
              const eval::TaskRun* exact) {
  json acc = json::object();
  for (const std::string& t : names) {
    const auto [h, n] = eval::task_hits(ex, r.run.correct, t);
    const eval::Interval ci = eval::wilson(h, n);
    acc[t] = {{"correct", h},
              {"n", n},
              {"accuracy", static_cast<double>(h) / static_cast<double>(n)},
              {"ci95", {ci.lo, ci.hi}}};
  }
  const auto [h, n] = eval::task_hits(ex, r.run.correct);
  const eval::Interval ci = eval::wilson(h, n);
  json j = {
      {"option", r.label},
      {"tasks", acc},
      {"accuracy", static_cast<double>(h) / static_cast<double>(n)},
      {"correct", h},
      {"n", n},
      {"ci95", {ci.lo, ci.hi}},
      {"seconds", r.run.seconds},
      {"tokens", r.run.tokens},
      {"steps", r.run.steps},
      {"forwards", r.run.forwards},
      {"forwards_per_token", per_token(static_cast<double>(r.run.forwards), r.run.tokens)},
      {"tokens_per_second", r.run.seconds > 0 ? static_cast<double>(r.run.tokens) / r.run.seconds : 0.0}};
  if (exact) {
    const eval::PairedDiff d = eval::paired_difference(r.run.correct, exact->correct);
    j["vs_exact"] = {
        {"difference", d.mean}, {"ci95", {d.ci.lo, d.ci.hi}}, {"gained", d.gained}, {"lost", d.lost}};
  }
  return j;
}

}  // namespace

int run_task_eval(const TaskEvalArgs& a) {
  for (const std::string& spec : a.compare) parse_spec(spec, GenerateOptions{}, EngineOptions{});
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
  const fs::path file = a.tasks_file.empty() ? fs::path(dir) / "tasks.jsonl" : fs::path(a.tasks_file);
  if (!fs::exists(file)) {
    fail("no task file: " + file.string() + " does not exist (" +
         (a.tasks_file.empty() ? "this model ships no held-out tasks; pass --tasks-file FILE, as "
                                 "tools/train/tasks.py heldout writes it"
                               : "check the path") +
         ")");
  }
  const std::vector<eval::TaskExample> ex = eval::load_tasks(file, a.tasks, a.per_task);
  const std::vector<std::string> names = eval::task_names(ex);
  Progress progress("eval");
  progress.show("loading " + dir);
  EngineOptions eng;
  eng.device = a.device;
  eng.precision = parse_precision(a.precision);
  auto exact = Engine::load(dir, eng);
  const Tokenizer tok = load_model_tokenizer(dir);
  const bool add_bos = model_adds_bos(dir);
  const int gen_length = a.gen_length.value_or(model_gen_length(dir));
  GenerateOptions base =
      exact_path(exact->config(), gen_length, a.steps, a.block_length, parse_unmask(a.alg));
  base.seed = a.seed;
  validate_generate_options(base, exact->vocab_size());
  const std::vector<Candidate> candidates =
      check_specs(a.compare, base, eng, exact->vocab_size(), exact->attention_block() > 0);

  int label_width = 8;  // the option column: as wide as the longest label
  for (const Candidate& c : candidates) label_width = std::max(label_width, static_cast<int>(c.label.size()));
  char setup[512];
  std::snprintf(setup, sizeof setup,
                "%zu examples of %zu tasks (%s); exact path: %s, %d tokens, %d steps, block %d, %s",
                ex.size(), names.size(), file.filename().string().c_str(),
                std::string(name(base.alg)).c_str(), base.gen_length, base.steps, base.block_length,
                a.precision.c_str());
  if (!a.json) {
    std::printf("tasks: %s\n", setup);
    std::printf("%-*s", label_width, "option");
    for (const std::string& t : names) std::printf(" %8.8s", t.c_str());
    std::printf(" %8s %15s %24s %9s %9s\n", "all", "95% CI", "vs exact [95% CI]", "fwd/tok", "tokens/s");
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  json out = {{"model", dir},
              {"tasks_file", file.string()},
              {"examples", ex.size()},
              {"task_names", names},
              {"exact_path",
               {{"gen_length", base.gen_length},
                {"steps", base.steps},
                {"block_length", base.block_length},
                {"alg", name(base.alg)},
                {"device", a.device},
                {"precision", a.precision},
                {"seed", a.seed}}}};
  json results = json::array();
  const size_t n_rows = candidates.size() + 1;
  auto run_row = [&](const std::string& label, size_t k, Engine& e, const GenerateOptions& g) {
    const std::string what = label + " (" + std::to_string(k) + "/" + std::to_string(n_rows) + ")";
    Row r{label, eval::run_tasks(e, g, tok, add_bos, ex, [&](size_t i) {
            progress.show(what + ": example " + std::to_string(i + 1) + "/" + std::to_string(ex.size()));
          })};
    progress.clear();
    const eval::TaskRun* ref = rows.empty() ? nullptr : &rows[0].run;
    const json j = row_json(r, ex, names, ref);
    results.push_back(j);
    if (!a.json) {
      std::printf("%-*s", label_width, label.c_str());
      for (const std::string& t : names) std::printf(" %8.4f", j["tasks"][t]["accuracy"].get<double>());
      std::printf(" %8.4f [%5.3f, %5.3f]", j["accuracy"].get<double>(), j["ci95"][0].get<double>(),
                  j["ci95"][1].get<double>());
      if (ref) {
        std::printf(" %+7.4f [%+6.3f, %+6.3f]", j["vs_exact"]["difference"].get<double>(),
                    j["vs_exact"]["ci95"][0].get<double>(), j["vs_exact"]["ci95"][1].get<double>());
      } else {
        std::printf(" %24s", "-");
      }
      std::printf(" %9.3f %9.1f\n", j["forwards_per_token"].get<double>(),
                  j["tokens_per_second"].get<double>());
      std::fflush(stdout);
    }
    rows.push_back(std::move(r));
  };
  run_row("exact", 1, *exact, base);
  const int failures = run_comparisons(
      candidates, *exact, [&](const EngineOptions& o) { return Engine::load(dir, o); }, progress, "eval",
      [&](size_t i) { return candidates[i].label; },
      [&](size_t i, Engine& e) { run_row(candidates[i].label, i + 2, e, candidates[i].gen); },
      [&](size_t i, const Error& e) {
        results.push_back({{"option", candidates[i].label}, {"error", e.what()}});
      });
  if (!a.json) {
    std::printf(
        "  accuracy: share of answers equal to the held-out answer (exact match after the last \"Answer:\"); "
        "95%% CI: Wilson score interval\n"
        "  vs exact: the option's accuracy minus the exact path's on the same prompts, with a paired 95%% "
        "interval\n"
        "  fwd/tok: forwards per generated token (up to EOS); tokens/s: those tokens per second of wall "
        "time\n");
  }
  out["results"] = results;
  if (a.json) std::printf("%s\n", out.dump(1).c_str());
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f || !(f << out.dump(1) << "\n")) fail("--json-out: cannot write " + a.json_out);
  }
  if (!a.svg.empty()) {
    svg::Metric acc{"accuracy", {}, 3, true}, fpt{"forwards/token", {}, 3, false},
        tps{"tokens/s", {}, 1, true};
    std::vector<std::string> labels;
    for (const json& j : results) {
      if (j.contains("error")) continue;
      labels.push_back(j["option"].get<std::string>());
      acc.values.push_back(j["accuracy"].get<double>());
      fpt.values.push_back(j["forwards_per_token"].get<double>());
      tps.values.push_back(j["tokens_per_second"].get<double>());
    }
    svg::save(a.svg, "--svg",
              svg::bar_chart("tessera eval: " + dir + ", task accuracy", setup, labels, {acc, fpt, tps},
                             {"accuracy: exact match of the answer after the last \"Answer:\""}));
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace tessera::cli
