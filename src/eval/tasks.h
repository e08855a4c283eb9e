// Task accuracy: generated prompts with exact answers (tools/train/tasks.py writes them; a model such as
// models/tessera-task ships its held-out set as MODEL/tasks.jsonl), scored by exact match.
//
// A task file holds one JSON object per line: {"task": NAME, "prompt": TEXT, "answer": TEXT} (other keys
// ignored). The prompt is encoded raw (BOS where the model adds one) and the generation decoded to its first
// EOS; the answer it gives is the text after its last "Answer:", to the first newline, without surrounding
// blanks; it is right when it equals the file's answer exactly. Accuracy carries a Wilson score interval, and
// an option's difference from the exact path, example by example on the same prompts, a paired interval.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decode/generate.h"
#include "engine/engine.h"
#include "io/tokenizer.h"

namespace tessera::eval {

struct TaskExample {
  std::string task, prompt, answer;
};

// The examples of the tasks named in `select` (empty or {"all"}: every task), file order kept, at most
// `per_task` of each (0: all). Throws Error for an unreadable file, a malformed line (its number) or a
// task name the file does not have (the names it has).
std::vector<TaskExample> load_tasks(const std::filesystem::path& file, const std::vector<std::string>& select,
                                    int64_t per_task = 0);
// The task names in order of first appearance.
std::vector<std::string> task_names(const std::vector<TaskExample>& ex);

// The answer of a generated text: after the last "Answer:", to the first newline, trimmed; none without it.
std::optional<std::string> extract_answer(std::string_view text);

struct Interval {
  double lo = 0, hi = 0;
};
// The 95% Wilson score interval of hits / n (z = 1.96); [0, 0] for n = 0.
Interval wilson(int64_t hits, int64_t n, double z = 1.96);

// Candidate minus exact, example by example (1 right, 0 wrong): the mean difference with a 95% normal
// interval of the paired differences, and how many examples each side alone got right.
struct PairedDiff {
  double mean = 0;
  Interval ci;
  int64_t gained = 0, lost = 0;
};
PairedDiff paired_difference(const std::vector<uint8_t>& candidate, const std::vector<uint8_t>& exact);

// One side's generations: per example whether it is right and the answer it gave, with the totals.
struct TaskRun {
  std::vector<uint8_t> correct;
  std::vector<std::string> answers;  // "" where the generation gave none
  double seconds = 0;
  int64_t tokens = 0, steps = 0, forwards = 0;  // tokens: generated up to the first EOS, EOS included
};
// Generates every prompt (one request each, planned and budget-checked as the CLI does) with `opt` and
// scores it; on_example(i) is called before example i (progress).
TaskRun run_tasks(Engine& e, const GenerateOptions& opt, const Tokenizer& tok, bool add_bos,
                  const std::vector<TaskExample>& ex, const std::function<void(size_t)>& on_example = {});

// Accuracy of the examples of `task` (empty: all) in a run: hits and count.
std::pair<int64_t, int64_t> task_hits(const std::vector<TaskExample>& ex, const std::vector<uint8_t>& correct,
                                      const std::string& task = "");

}  // namespace tessera::eval
