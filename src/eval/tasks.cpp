#include "eval/tasks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/request_budget.h"

namespace tessera::eval {

namespace {

bool selects_all(const std::vector<std::string>& select) {
  return select.empty() || (select.size() == 1 && select[0] == "all");
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::vector<TaskExample> load_tasks(const std::filesystem::path& file, const std::vector<std::string>& select,
                                    int64_t per_task) {
  std::ifstream f(file);
  if (!f) fail("cannot read the task file " + file.string());
  std::vector<TaskExample> all;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + " line " + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      fail(where + ": not a JSON object");
    }
    TaskExample e;
    for (auto [key, dst] : {std::pair{"task", &e.task}, {"prompt", &e.prompt}, {"answer", &e.answer}}) {
      if (!j.is_object() || !j.contains(key) || !j[key].is_string())
        fail(where + ": needs string fields \"task\", \"prompt\" and \"answer\"");
      *dst = j[key].get<std::string>();
    }
    if (e.task.empty() || e.prompt.empty()) fail(where + ": empty task name or prompt");
    all.push_back(std::move(e));
  }
  if (all.empty()) fail("the task file " + file.string() + " holds no examples");
  const std::vector<std::string> names = task_names(all);
  if (!selects_all(select)) {
    for (const std::string& s : select) {
      if (std::find(names.begin(), names.end(), s) == names.end())
        fail("--task: no task '" + s + "' in " + file.string() + " (it has: " + joined(names) + ", or all)");
    }
  }
  std::vector<TaskExample> out;
  std::vector<int64_t> taken(names.size(), 0);
  for (TaskExample& e : all) {
    if (!selects_all(select) && std::find(select.begin(), select.end(), e.task) == select.end()) continue;
    const auto k = static_cast<size_t>(std::find(names.begin(), names.end(), e.task) - names.begin());
    if (per_task > 0 && taken[k] >= per_task) continue;
    ++taken[k];
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::string> task_names(const std::vector<TaskExample>& ex) {
  std::vector<std::string> names;
  for (const TaskExample& e : ex)
    if (std::find(names.begin(), names.end(), e.task) == names.end()) names.push_back(e.task);
  return names;
}

std::optional<std::string> extract_answer(std::string_view text) {
  constexpr std::string_view kMark = "Answer:";
  const size_t at = text.rfind(kMark);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(at + kMark.size());
  rest = rest.substr(0, rest.find('\n'));
  const size_t b = rest.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return std::string();
  const size_t e = rest.find_last_not_of(" \t\r");
  return std::string(rest.substr(b, e - b + 1));
}

Interval wilson(int64_t hits, int64_t n, double z) {
  if (n <= 0) return {};
  const double nn = static_cast<double>(n), p = static_cast<double>(hits) / nn, z2 = z * z;
  const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z / (1 + z2 / nn) * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

PairedDiff paired_difference(const std::vector<uint8_t>& candidate, const std::vector<uint8_t>& exact) {
  TESSERA_CHECK(candidate.size() == exact.size(), "eval: paired runs of different lengths");
  PairedDiff d;
  const size_t n = exact.size();
  if (n == 0) return d;
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const int v = static_cast<int>(candidate[i] != 0) - static_cast<int>(exact[i] != 0);
    d.gained += v > 0 ? 1 : 0;
    d.lost += v < 0 ? 1 : 0;
    sum += v;
    sq += v * v;
  }
  const double nn = static_cast<double>(n);
  d.mean = sum / nn;
  const double var = n > 1 ? (sq - nn * d.mean * d.mean) / (nn - 1) : 0.0;
  const double half = 1.96 * std::sqrt(std::max(0.0, var) / nn);
  d.ci = {d.mean - half, d.mean + half};
  return d;
}

TaskRun run_tasks(Engine& e, const GenerateOptions& opt, const Tokenizer& tok, bool add_bos,
                  const std::vector<TaskExample>& ex, const std::function<void(size_t)>& on_example) {
  TaskRun run;
  const int64_t ctx = e.config().max_positions;
  const int32_t bos = e.config().bos_id;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < ex.size(); ++i) {
    if (on_example) on_example(i);
    std::vector<int32_t> prompt;
    if (add_bos && bos >= 0) prompt.push_back(bos);
    const std::vector<int32_t> body = tok.encode(ex[i].prompt);
    prompt.insert(prompt.end(), body.begin(), body.end());
    if (static_cast<int64_t>(prompt.size()) + opt.gen_length > ctx) {
      fail("task example " + std::to_string(i + 1) + " (" + ex[i].task + "): its prompt of " +
           std::to_string(prompt.size()) + " tokens and " + std::to_string(opt.gen_length) +
           " generated tokens exceed the model's context of " + std::to_string(ctx));
    }
    RequestScope request(e, plan_checked(prompt, opt, e.vocab_size(), e.attention_block() > 0));
    check_request_budget(e, request.plan());
    const GenerateResult r = generate(request, prompt, opt);
    run.steps += r.steps_run;
    run.forwards += r.forwards;
    std::vector<int32_t> toks = r.tokens;
    const auto eos = std::find_if(toks.begin(), toks.end(), [&](int32_t t) {
      return std::find(opt.eos_ids.begin(), opt.eos_ids.end(), t) != opt.eos_ids.end();
    });
    run.tokens += static_cast<int64_t>(eos - toks.begin()) + (eos != toks.end() ? 1 : 0);
    toks.erase(eos, toks.end());
    const std::optional<std::string> got = extract_answer(tok.decode(toks, true));
    run.correct.push_back(got && *got == ex[i].answer ? 1 : 0);
    run.answers.push_back(got.value_or(""));
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return run;
}

std::pair<int64_t, int64_t> task_hits(const std::vector<TaskExample>& ex, const std::vector<uint8_t>& correct,
                                      const std::string& task) {
  int64_t hits = 0, n = 0;
  for (size_t i = 0; i < ex.size() && i < correct.size(); ++i) {
    if (!task.empty() && ex[i].task != task) continue;
    hits += correct[i];
    ++n;
  }
  return {hits, n};
}

}  // namespace tessera::eval
