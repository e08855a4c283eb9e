#include "apps/tessera/cli_session.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/live_view.h"
#include "core/error.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {

void add_session_options(CLI::App* sub, SessionArgs& a) {
  sub->add_option("-m,--model", a.model,
                  "model directory or GGUF file (default: the bundled default model, models/tessera-tiny)");
  sub->add_option("-n,--gen-length", a.gen_length,
                  "tokens to generate (default: the model's generation_config.json, else 128)");
  sub->add_option("--steps", a.steps,
                  "denoising steps (default: as many per token as the model's generation_config.json has, "
                  "else one per token; at most gen-length)");
  sub->add_option("--block-length", a.block_length,
                  "semi-autoregressive block length (default: the model's, fitted to divide gen-length)");
  sub->add_option("--temperature,--temp", a.temperature,
                  "sampling temperature (0 = greedy; default: the model's generation_config.json, else 0)")
      ->check(in_range(0.0, 100.0));
  sub->add_option("--alg", a.alg, "unmasking policy")
      ->check(
          CLI::IsMember({"low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"}));
  sub->add_option("--threshold", a.threshold,
                  "confidence-threshold parallel decoding (0 = off; default 0.95 for block-causal LLaDA2)")
      ->check(in_range(0.0, 1.0));
  sub->add_option("--cfg", a.cfg, "classifier-free guidance scale (LLaDA)")->check(in_range(0.0, 100.0));
  sub->add_option("--top-k", a.top_k, "top-k filter (0 = off)")->check(in_range(0, 1e9));
  sub->add_option("--top-p", a.top_p, "nucleus filter (1 = off)")->check(in_range(0.0, 1.0));
  sub->add_option("--alg-temp", a.alg_temp, "Dream: sample positions with this temperature")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", a.seed, "random seed");
  sub->add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", a.precision, "auto, bf16 or f32")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  sub->add_option("-t,--threads", a.threads, "CPU threads (default: OMP_NUM_THREADS, else every core)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--tp", a.tp,
                  "tensor parallelism over this many processes, one per rank, started by the launcher: "
                  "mpirun -np N tessera ... --tp N (heads and the dense FFN split; rank 0 prints)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--ep", a.ep,
                  "expert parallelism (MoE models) over this many processes, the same ranks as --tp (each of "
                  "--tp and --ep is 1 or the number of ranks): each rank computes its share of the experts")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--dist-timeout", a.dist_timeout,
                  "with --tp: seconds a collective may wait for the other ranks before the job ends with an "
                  "error (a rank died or hangs)")
      ->check(in_range(0.001, 1e6));
  sub->add_option(
      "--json-schema", a.json_schema,
      "structured output: the answer is JSON valid under this JSON Schema (inline JSON or a file; "
      "'object': any JSON object), written left to right under it");
  sub->add_option("--chat-template-file", a.chat_template_file,
                  "a Jinja chat template to use instead of the model's own (or the built-in one)")
      ->check(CLI::ExistingFile);
  sub->add_flag("--dequantize", a.dequantize,
                "GGUF: convert quantized tensors to bf16 at load (twice to four times the memory) instead of "
                "keeping them quantized (CPU; CUDA: q8_0, q4_0, q4_K, q5_K, q6_K)");
  sub->add_option("--memory-budget", a.memory_budget,
                  "total memory for the weights plus the planned activations, e.g. 24GiB, 512MiB, 1.5GB or "
                  "bytes (runtime overhead not included): each step chunks the FFN / logits only as much as "
                  "it must; a request that cannot fit fails before it starts")
      ->check(size_validator());
  sub->add_option("--mode", a.mode,
                  "how the canvas is written: diffusion (unmasking; on a tri-mode model such as "
                  "Nemotron-Labs-Diffusion, block diffusion seeded and committed by causal passes), ar (one "
                  "token per causal forward) or spec (linear self-speculation: a bidirectional draft of "
                  "--block-length, verified by one causal pass; at temperature 0 the same text as ar); ar "
                  "and spec need a tri-mode model")
      ->check(CLI::IsMember({"diffusion", "ar", "spec", "uniform"}));
  sub->add_flag(
      "--think", a.think,
      "chat: turn the chat template's thinking switch on (enable_thinking: Gemma 4 / DiffusionGemma, "
      "Qwen3-style templates); a template without one refuses it");
  sub->add_option("--t-min", a.t_min,
                  "uniform-noise models (DiffusionGemma): the temperature of a canvas's last step (default: "
                  "generation_config.json's t_min, 0.4); the first step's is --t-max")
      ->check(CLI::PositiveNumber);
  sub->add_option("--t-max", a.t_max, "uniform-noise models: the temperature of a canvas's first step (0.8)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--entropy-bound", a.entropy_bound,
                  "uniform-noise models: a step keeps the samples of the lowest-entropy positions while the "
                  "entropies before them sum to at most this (0.1); the others are re-noised")
      ->check(CLI::NonNegativeNumber);
  sub->add_option(
         "--stability", a.stability,
         "uniform-noise models: a canvas may stop once its argmax repeats over this many steps (1; 0: "
         "no stability test)")
      ->check(CLI::Range(0, 64));
  sub->add_option("--confidence", a.confidence,
                  "uniform-noise models: ... and its mean entropy is below this (0.005; 0: every canvas runs "
                  "--steps steps)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option(
         "--spec-sampling", a.spec_sampling,
         "--mode spec at temperature > 0: match (the reference's: the verify pass's samples are kept "
         "while the drafts equal them) or rejection (speculative sampling: a draft d kept with "
         "probability min(1, p(d) / q(d)), else a sample of the residual; more drafts kept); both "
         "keep the model's autoregressive distribution")
      ->check(CLI::IsMember({"match", "rejection"}));
  sub->add_option(
         "--draft-threshold", a.draft_threshold,
         "--mode spec: 0 (default) drafts the block in one pass; X > 0 runs draft passes deciding the "
         "most confident position and every other with confidence >= X")
      ->check(in_range(0.0, 1.0));
  sub->add_flag("--no-draft-adapter", a.no_draft_adapter,
                "--mode spec: draft without the checkpoint's draft adapter (the LoRA on o_proj in "
                "linear_spec_lora/, which drafts use by default when the model has one)");
  sub->add_option(
         "--cache", a.cache,
         "KV cache (Fast-dLLM): none (exact), prefix (reuse K/V before the block), dual (also after it); "
         "approximate for bidirectional models, exact for block-causal LLaDA2")
      ->check(CLI::IsMember({"none", "prefix", "dual"}));
  sub->add_flag(
      "--sparse", a.sparse,
      "SparseD sparse attention: exact for the first --sparse-skip of the steps, then head-specific "
      "block-sparse attention with patterns built once (approximate; bidirectional models)");
  sub->add_option("--sparse-block", a.sparse_block,
                  "SparseD tile side in positions (default 32; implies --sparse)")
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--sparse-rho", a.sparse_rho,
         "SparseD kept fraction of prompt and of generation key blocks (default 0.5; implies --sparse)")
      ->check(in_range(0.0, 1.0));
  sub->add_option("--sparse-skip", a.sparse_skip,
                  "SparseD fraction of the steps with exact attention (default 0.2; implies --sparse)")
      ->check(in_range(0.0, 0.999));
  sub->add_option("--des", a.des,
                  "Dynamic Expert Sharing (MoE models): off, seq (union of each block token's first --des-k "
                  "experts) or vote (the --des-beta share of the experts with the most router votes); "
                  "approximate")
      ->check(CLI::IsMember({"off", "seq", "vote"}));
  sub->add_option("--des-k", a.des_k, "DES-Seq experts per token in the union (default 2; implies --des seq)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--des-beta", a.des_beta,
                  "DES-Vote coreset size as a share of the experts: floor(B x experts), at least the model's "
                  "top_k (default 0.4; implies --des vote)")
      ->check(in_range(0.0, 1.0));
  sub->add_option("--des-scope", a.des_scope,
                  "DES: block (only the block's tokens share the coreset; default) or all (every row)")
      ->check(CLI::IsMember({"block", "all"}));
  sub->add_flag("--window", a.window,
                "Window-Diffusion: each step decides among the first --window-in undecided positions, masks "
                "past the external window are pruned, and phases of --window-refresh forwards reuse cached "
                "K/V (approximate; bidirectional models)");
  sub->add_option("--window-ex", a.window_ex,
                  "Window-Diffusion external window in undecided positions (default 64 for the LLaDA "
                  "algorithms, 128 for the Dream ones; implies --window)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--window-in", a.window_in,
                  "Window-Diffusion active set in undecided positions (default 16; implies --window)")
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--window-refresh", a.window_refresh,
         "Window-Diffusion forwards per phase (default 32; 0 = no cache, prune only; implies --window)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--window-early-stop", a.window_early_stop,
                "Window-Diffusion: after an EOS is decided, never compute the positions after it (implies "
                "--window)");
  sub->add_option("--edit-mode", a.edit_mode,
                  "token editing (LLaDA2.1's draft and edit; any model): quality (threshold 0.7, rewrite a "
                  "decided token of the block when its candidate has p > 0.5), speed (threshold 0.5, rewrite "
                  "whenever the candidate differs) or off (default)")
      ->check(CLI::IsMember({"off", "quality", "speed"}));
  sub->add_option("--edit-threshold", a.edit_threshold,
                  "token editing: rewrite a decided token of the current block when the model's candidate "
                  "differs with a probability above this (0 = whenever it differs); turns editing on")
      ->check(in_range(0.0, 1.0));
  sub->add_option("--max-post-steps", a.max_post_steps,
                  "token editing: at most this many forwards after the block has no mask (default 16)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--edit-penalty", a.edit_penalty,
                  "token editing: SGLang's 2-gram penalty, subtracted from the logit of the token before "
                  "each position (0 = off; 3 often curbs repetition)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--stop", a.stop,
                  "stop sequence: the answer ends before it, and the blocks after the one it appears in "
                  "are not generated (repeat for several)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  auto* chat = sub->add_flag("--chat", a.chat, "apply the model's chat template");
  sub->add_flag("--raw", a.raw, "use the prompt as it is")->excludes(chat);
  sub->add_option("--logprobs", a.logprobs,
                  "report each generated token's log-probability at the step that decided it, with the N "
                  "most likely tokens there (0 to 20; in --json, else a table after the text)")
      ->check(in_range(0, static_cast<double>(kTopLogprobs)));
  sub->add_flag("--json", a.json, "print one JSON result object");
  sub->add_flag("--no-progress", a.no_progress, "no live view even on a terminal");
}

CLI::Validator size_validator() {
  return CLI::Validator(
      [](std::string& v) {
        try {
          memory::parse_size(v);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      "SIZE");
}

void Session::print_notes() const {
  for (const std::string& n : notes_) std::fprintf(stderr, "note: %s\n", n.c_str());
}

namespace {

LoadOptions load_options(const SessionArgs& a) {
  LoadOptions lo;
  lo.model = a.model;
  lo.device = a.device;
  lo.memory_budget = a.memory_budget.empty() ? 0 : memory::parse_size(a.memory_budget);
  const bool no_prefix = a.prefix_cache.empty() || a.prefix_cache == "0" || a.prefix_cache == "off";
  lo.prefix_cache = no_prefix ? 0 : memory::parse_size(a.prefix_cache);
  lo.precision = a.precision == "bf16"  ? Precision::BF16
                 : a.precision == "f32" ? Precision::F32
                                        : Precision::Auto;
  lo.dequantize = a.dequantize;
  lo.threads = a.threads;
  lo.tp = a.tp;
  lo.ep = a.ep;
  lo.dist_timeout = a.dist_timeout;
  lo.chat_template_file = a.chat_template_file;
  return lo;
}

// --json-schema: "object", inline JSON (starting with '{'), or a file holding the schema.
std::shared_ptr<const JsonGrammar> json_schema_grammar(const std::string& arg) {
  if (arg == "object") return JsonGrammar::any_object();
  std::string text = arg;
  if (arg.find_first_not_of(" \t\n") == std::string::npos || arg[arg.find_first_not_of(" \t\n")] != '{') {
    std::ifstream f(arg, std::ios::binary);
    if (!f) fail("--json-schema: " + arg + " is neither 'object', inline JSON nor a readable file");
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(text, nullptr, false);
  if (schema.is_discarded() || !schema.is_object())
    fail("--json-schema: " + arg + " is not a JSON Schema object");
  return JsonGrammar::from_schema(schema);
}

}  // namespace

Session::Session(const SessionArgs& a) : tessera::Session(load_options(a)) {
  if (a.think && a.raw)
    fail("--think turns the chat template's thinking on; it does not apply to --raw prompts");
  if (a.think) set_thinking(true);
  GenerateOptions g = defaults(a.gen_length, a.block_length, a.steps, &notes_);
  if (a.threshold) g.threshold = *a.threshold;
  if (a.alg) g.alg = parse_unmask(*a.alg);
  g.temperature = a.temperature.value_or(g.temperature);
  g.cfg_scale = a.cfg;
  g.top_k = a.top_k.value_or(g.top_k);
  g.top_p = a.top_p.value_or(g.top_p);
  g.alg_temp = a.alg_temp;
  g.seed = a.seed;
  g.cache = parse_kv_cache(a.cache);
  if (a.mode) g.mode = parse_decode_mode(*a.mode);
  g.draft_adapter = !a.no_draft_adapter;
  g.spec_sampling = parse_spec_sampling(a.spec_sampling);
  g.draft_threshold = a.draft_threshold;
  g.uniform.t_min = a.t_min.value_or(g.uniform.t_min);
  g.uniform.t_max = a.t_max.value_or(g.uniform.t_max);
  g.uniform.entropy_bound = a.entropy_bound.value_or(g.uniform.entropy_bound);
  g.uniform.stability = a.stability.value_or(g.uniform.stability);
  g.uniform.confidence = a.confidence.value_or(g.uniform.confidence);
  g.sparse = a.sparse || a.sparse_block || a.sparse_rho || a.sparse_skip;
  g.sparse_block = a.sparse_block.value_or(g.sparse_block);
  g.sparse_rho = a.sparse_rho.value_or(g.sparse_rho);
  g.sparse_skip = a.sparse_skip.value_or(g.sparse_skip);
  g.des = implied_des(a.des ? std::optional(parse_des(*a.des)) : std::nullopt, a.des_k.has_value(),
                      a.des_beta.has_value(), g.des);
  g.des_k = a.des_k.value_or(g.des_k);
  g.des_beta = a.des_beta.value_or(g.des_beta);
  g.des_scope = parse_des_scope(a.des_scope);
  g.window = a.window || a.window_ex || a.window_in || a.window_refresh || a.window_early_stop;
  g.window_ex = a.window_ex.value_or(g.window_ex);
  g.window_in = a.window_in.value_or(g.window_in);
  g.window_refresh = a.window_refresh.value_or(g.window_refresh);
  g.window_early_stop = a.window_early_stop;
  apply_edit_flags(EditFlags{a.edit_mode ? std::optional(parse_edit_mode(*a.edit_mode)) : std::nullopt,
                             a.threshold, a.edit_threshold, a.edit_penalty, a.max_post_steps},
                   g);
  g.stop = a.stop;
  if (a.suffix) g.suffix = suffix_ids(*a.suffix, "the suffix");
  g.logprobs = a.logprobs.has_value();
  set_logprobs_top(a.logprobs.value_or(0));
  if (!a.json_schema.empty()) g.constraint = json_output(json_schema_grammar(a.json_schema));
  if (!a.alg)
    if (auto note = fit_default_alg(g)) notes_.push_back(*note);
  set_options(g);
}

Session::Output Session::run(const std::vector<int32_t>& prompt, FILE* tty,
                             const std::function<void()>& after_step) {
  std::optional<LiveView> view;
  if (tty != nullptr)
    view.emplace(tty, tokenizer(), options(), prompt.size(), engine().mask_token(), block_causal());
  try {
    Output o = run(prompt, options(), [&](const StepEvent& ev) {
      if (view) view->draw(ev);
      if (after_step) after_step();
    });
    if (view) view->clear();
    return o;
  } catch (...) {
    if (view) view->clear();
    throw;
  }
}

}  // namespace tessera::cli
