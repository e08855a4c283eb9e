// tessera eval --task: exact-match accuracy on a model's generated tasks (src/eval/tasks.h), for the exact
// path and every --compare option, with intervals, forwards per token and speed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::cli {

struct TaskEvalArgs {
  std::string model, tasks_file, json_out, svg, device = "cpu", precision = "auto", alg = "low_confidence";
  std::vector<std::string> tasks;  // names, or {"all"}
  int64_t per_task = 0;            // 0: every example of each task
  std::optional<int> gen_length;   // default: the model's generation_config.json, else 64
  int steps = 0, block_length = 0;
  uint64_t seed = 0;
  std::vector<std::string> compare;
  bool json = false;
};

int run_task_eval(const TaskEvalArgs& a);

}  // namespace tessera::cli
