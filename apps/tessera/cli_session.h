// The CLI's session: a Session (runtime/session.h) opened from the flags that generate, chat, serve,
// eval and bench share, with the live canvas view of a terminal.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace tessera::cli {

struct SessionArgs {
  std::string model;
  std::string device = "cpu";
  std::string precision = "auto";
  bool dequantize = false;         // GGUF: quantized tensors converted to bf16 at load
  int threads = 0;                 // 0: OMP_NUM_THREADS, else every core
  int tp = 1;                      // tensor-parallel ranks (one process each, started by mpirun)
  int ep = 1;                      // expert-parallel ranks (the same processes)
  double dist_timeout = 120.0;     // seconds a collective may take before the job is ended
  std::string chat_template_file;  // a Jinja chat template used instead of the model's
  std::string json_schema;         // structured output: a JSON Schema (inline JSON, or a file), or "object"
  std::optional<int> gen_length, steps, block_length;
  std::optional<std::string> alg;
  std::string memory_budget;            // "24GiB"; empty = none
  std::string prefix_cache;             // serve: the cross-request prefix cache's size; empty = off
  std::string cache = "none";           // KV cache: none | prefix | dual
  std::optional<std::string> mode;      // tri-mode models: diffusion | ar | spec
  bool no_draft_adapter = false;        // spec: drafts without the checkpoint's draft LoRA
  std::string spec_sampling = "match";  // spec at temperature > 0: match | rejection
  float draft_threshold = 0.0f;         // spec's drafts
  // Uniform-noise models (mode uniform): the entropy-bound sampler; defaults from generation_config.json.
  std::optional<double> t_min, t_max, entropy_bound, confidence;
  std::optional<int> stability;
  bool sparse = false;  // SparseD; the three below turn it on too
  std::optional<int> sparse_block;
  std::optional<float> sparse_rho, sparse_skip;
  std::optional<std::string> des;  // DES: off | seq | vote; --des-k implies seq, --des-beta vote
  std::optional<int> des_k;
  std::optional<float> des_beta;
  std::string des_scope = "block";
  bool window = false, window_early_stop = false;  // Window-Diffusion; the three below turn it on too
  std::optional<int> window_ex, window_in, window_refresh;
  std::optional<float> threshold;           // default: generation_config.json, else 0.95 (LLaDA2) or 0 (off)
  std::optional<float> temperature, top_p;  // default: generation_config.json, else 0 (greedy) and 1
  std::optional<int> top_k;                 // default: generation_config.json, else 0 (off)
  float cfg = 0.0f, alg_temp = 0.0f;
  uint64_t seed = 0;
  bool chat = false, raw = false, json = false, no_progress = false;
  bool think = false;                 // the chat template's thinking switch (enable_thinking) on
  std::vector<std::string> stop;      // stop sequences
  std::optional<int> logprobs;        // report each token's log-probability and this many alternatives
  std::optional<std::string> suffix;  // generate --suffix: infill between the prompt and this text
  // Token editing (GenerateOptions::edit): a preset and the values that override it.
  std::optional<std::string> edit_mode;
  std::optional<float> edit_threshold, edit_penalty;
  std::optional<int> max_post_steps;
};

void add_session_options(CLI::App* sub, SessionArgs& a);
// CLI check of a memory size ("24GiB", "512MiB", "1.5GB", bytes): the parse error, if any.
CLI::Validator size_validator();

class Session : public tessera::Session {
 public:
  // Loads the model of the flags and sets the options they give over the model's defaults.
  explicit Session(const SessionArgs& a);
  // What the session chose that the user did not set (Session::fit_layout, fit_default_alg): "note: ..."
  // lines on stderr, printed when the first request has passed its checks (an error stays one line), or
  // "notes" in a --json result.
  void print_notes() const;
  const std::vector<std::string>& notes() const { return notes_; }
  using tessera::Session::run;
  // Generates with the session's options and a live view on `tty` (nullptr: none). `after_step`, when
  // given, runs after every step and may throw to end the generation (chat's Ctrl-C); the view is
  // erased however the generation ends.
  Output run(const std::vector<int32_t>& prompt, FILE* tty, const std::function<void()>& after_step = {});

 private:
  std::vector<std::string> notes_;
};

}  // namespace tessera::cli
