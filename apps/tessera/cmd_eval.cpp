// tessera eval: the fidelity harness (src/eval/fidelity.h) on a model's held-out text.
//   tessera eval -m DIR [--heldout FILE] [--compare "steps=16"] [--compare "threshold=0.9"] [--json]
//                [--json-out F] [--svg F]
// Every --compare SPEC is a comma-separated list of key=value engine options (steps, block-length,
// threshold, alg, temperature, cache, sparse, sparse-block, sparse-rho, sparse-skip, des, des-k, des-beta,
// des-scope, window, window-ex, window-in, window-refresh, window-early-stop, mid-block-stop, suffix,
// logprobs, edit-mode, edit-threshold, max-post-steps, edit-penalty, t-min, t-max, entropy-bound, stability,
// confidence, precision, dequantize, device, k-ffn, k-logits, memory-budget) measured against the exact path;
// every spec is checked before anything is measured. A uniform-noise model (DiffusionGemma) has no
// infilling table: its exact path is its own sampler and NLL(exact) its encoder's causal NLL. On a
// terminal a progress line shows on stderr; each table row is printed (and flushed) as soon as it is
// measured.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/compare.h"
#include "apps/tessera/eval_task.h"
#include "apps/tessera/svg.h"
#include "core/error.h"
#include "eval/fidelity.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct EvalArgs {
  std::string model, heldout, json_out, svg, device = "cpu", precision = "auto", alg = "low_confidence";
  int64_t seqs = 32, seq_len = 128, prompts = 8, prompt_len = 32, gen_length = 32, suffix_len = 0;
  int steps = 0, block_length = 0, n_seeds = 2;
  uint64_t seed = 0;
  std::vector<double> ratios = {0.15, 0.5, 0.9};
  std::vector<std::string> compare;
  bool no_generation = false;
  bool json = false;  // --json: the JSON on stdout instead of the tables
};

json side_json(const eval::GenSide& s) {
  json j = {{"agreement", s.agreement}, {"nll", s.nll},       {"reference_match", s.reference_match},
            {"seconds", s.seconds},     {"tokens", s.tokens}, {"steps", s.steps},
            {"forwards", s.forwards}};
  if (s.experts > 0) {
    j["experts_per_moe_layer"] = s.experts;
    j["block_experts_per_moe_layer"] = s.experts_block;
  }
  return j;
}

constexpr const char* kInfillLegend[] = {
    "mask: share of each sequence masked; masked: positions scored; accuracy: the model's most likely token "
    "is the held-out one;",
    "NLL: mean -log p(held-out token); unigram acc: accuracy of always guessing the most frequent token"};
constexpr const char* kGenLegend[] = {
    "agreement: share of generated tokens equal to the exact path's, position by position (1 = identical)",
    "NLL(exact): mean negative log-likelihood of the generated tokens under the exact model "
    "(pseudo-likelihood; lower = likelier text)",
    "ref match: share of generated tokens equal to the held-out continuation (the task metric)",
    "tokens/s: generated tokens per second of wall time; steps, forwards: summed over prompts and seeds"};

// eval::generate_all one case at a time, with the progress line.
eval::Generations generate_cases(Engine& e, const GenerateOptions& o, const std::vector<eval::GenCase>& cases,
                                 const std::vector<uint64_t>& seeds, bool suffix, Progress& progress,
                                 const std::string& label) {
  eval::Generations all;
  for (size_t i = 0; i < cases.size(); ++i) {
    progress.show(label + ": prompt " + std::to_string(i + 1) + "/" + std::to_string(cases.size()));
    eval::Generations g = eval::generate_all(e, o, {cases[i]}, seeds, suffix);
    all.seconds += g.seconds;
    all.steps += g.steps;
    all.forwards += g.forwards;
    all.moe += g.moe;
    for (auto& t : g.tokens) all.tokens.push_back(std::move(t));
  }
  progress.show(label + ": scoring under the exact model");
  return all;
}

double tokens_per_second(const eval::GenSide& s) {
  return s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0.0;
}

int run_eval(const EvalArgs& a) {
  for (double r : a.ratios) TESSERA_CHECK(r > 0.0 && r <= 1.0, "--ratios: each mask ratio must be in (0, 1]");
  for (const std::string& spec : a.compare) parse_spec(spec, GenerateOptions{}, EngineOptions{});
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
  // Default held-out text: MODEL/heldout.jsonl, else heldout.jsonl beside the model directory (the
  // bundled models share models/heldout.jsonl, the test split of their training corpus).
  fs::path heldout = a.heldout;
  if (heldout.empty()) {
    heldout = fs::path(dir) / "heldout.jsonl";
    fs::path m = fs::absolute(dir).lexically_normal();
    if (!m.has_filename()) m = m.parent_path();  // a trailing '/'
    if (!fs::exists(heldout)) heldout = m.parent_path() / "heldout.jsonl";
  }
  if (!fs::exists(heldout)) {
    fail("no held-out text: " +
         (a.heldout.empty() ? dir + "/heldout.jsonl (nor one beside it)" : heldout.string()) +
         " does not exist (pass --heldout FILE: .jsonl with a \"text\" field per line, or plain text with "
         "documents separated by blank lines)");
  }
  Progress progress("eval");
  progress.show("loading " + dir);
  EngineOptions eng;
  eng.device = a.device;
  eng.precision = parse_precision(a.precision);
  auto exact = Engine::load(dir, eng);
  // A uniform-noise model (DiffusionGemma) has no mask token: no infilling; its generations are scored by its
  // encoder's causal NLL, and the comparisons are its sampler's settings (t-min, entropy-bound, ...).
  const bool uniform = exact->config().is_uniform();
  const Tokenizer tok = load_model_tokenizer(dir);
  const auto seqs = eval::load_heldout(heldout, tok, a.seq_len, a.seqs);
  const int32_t uni = eval::unigram_token(seqs);
  // The exact path's options and every comparison, checked before anything is measured.
  GenerateOptions base = exact_path(exact->config(), static_cast<int>(a.gen_length), a.steps, a.block_length,
                                    parse_unmask(a.alg));
  base.stop_at_eos = false;  // compare the whole generated span position by position
  std::vector<Candidate> candidates;
  if (!a.no_generation) {
    validate_generate_options(base, exact->vocab_size());
    candidates = check_specs(a.compare, base, eng, exact->vocab_size(), exact->attention_block() > 0);
  }
  json out = {
      {"model", dir},   {"heldout", heldout.string()}, {"sequences", seqs.size()}, {"seq_len", a.seq_len},
      {"seed", a.seed}, {"unigram_token", uni}};

  if (!a.json && uniform) {
    std::printf(
        "infilling: none (a uniform-noise model has no mask token; NLL(exact) below is its encoder's "
        "causal NLL)\n");
  } else if (!a.json) {
    std::printf("infilling: %zu held-out sequences of %lld tokens (%s), one forward per batch\n", seqs.size(),
                static_cast<long long>(a.seq_len), heldout.filename().string().c_str());
    std::printf("%8s %8s %10s %8s %12s\n", "mask", "masked", "accuracy", "NLL", "unigram acc");
    std::fflush(stdout);
  }
  json inf = json::array();
  std::vector<eval::InfillResult> infills;
  for (size_t i = 0; i < (uniform ? 0 : a.ratios.size()); ++i) {
    const double r = a.ratios[i];
    progress.show("infilling: mask ratio " + svg::fixed(r, 2) + " (" + std::to_string(i + 1) + "/" +
                  std::to_string(a.ratios.size()) + ")");
    const auto t0 = std::chrono::steady_clock::now();
    const eval::InfillResult x = eval::infill(*exact, seqs, r, a.seed, uni);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.clear();
    if (!a.json) {
      std::printf("%8.2f %8lld %10.4f %8.4f %12.4f\n", r, static_cast<long long>(x.masked), x.accuracy, x.nll,
                  x.unigram_accuracy);
      std::fflush(stdout);
    }
    infills.push_back(x);
    inf.push_back({{"mask_ratio", r},
                   {"masked", x.masked},
                   {"accuracy", x.accuracy},
                   {"nll", x.nll},
                   {"unigram_accuracy", x.unigram_accuracy},
                   {"seconds", sec}});
  }
  if (!a.json && !uniform) {
    for (const char* l : kInfillLegend) std::printf("  %s\n", l);
    std::fflush(stdout);
  }
  out["infilling"] = inf;

  int failures = 0;
  std::vector<std::string> labels;
  std::vector<eval::GenSide> sides;
  std::string setup;
  if (!a.no_generation) {
    const auto cases = eval::generation_cases(seqs, a.prompts, a.prompt_len, a.gen_length, a.suffix_len);
    std::vector<uint64_t> seeds;
    for (int s = 0; s < a.n_seeds; ++s) seeds.push_back(a.seed + static_cast<uint64_t>(s));
    char buf[512];
    const UniformSampling& u = base.uniform;
    const std::string path =
        uniform ? "the model's sampler (t " + svg::fixed(u.t_max, 2) + " to " + svg::fixed(u.t_min, 2) +
                      ", entropy bound " + svg::fixed(u.entropy_bound, 3) + ", stability " +
                      std::to_string(u.stability) + ", confidence " + svg::fixed(u.confidence, 4) + ")"
                : std::string(name(base.alg));
    std::snprintf(
        buf, sizeof buf,
        "%zu prompts of %lld tokens x %zu seeds, %d tokens each%s; exact path: %s, %d steps, %s %d, %s",
        cases.size(), static_cast<long long>(a.prompt_len), seeds.size(), base.gen_length,
        a.suffix_len > 0 ? (", infilling before " + std::to_string(a.suffix_len) + " suffix tokens").c_str()
                         : "",
        path.c_str(), base.steps, uniform ? "canvas" : "block", base.block_length, a.precision.c_str());
    setup = buf;
    const bool moe = exact->supports_expert_sharing();
    if (!a.json) {
      std::printf("\ngeneration: %s\n", setup.c_str());
      std::printf("%-28s %10s %10s %10s %10s %8s %8s%s\n", "option", "agreement", "NLL(exact)", "ref match",
                  "tokens/s", "steps", "forwards", moe ? "  experts (block)" : "");
      std::fflush(stdout);
    }
    json gens = json::array();
    auto print_row = [&](const std::string& label, const eval::GenSide& s) {
      progress.clear();
      labels.push_back(label);
      sides.push_back(s);
      if (a.json) return;
      std::printf("%-28s %10.4f %10.4f %10.4f %10.1f %8lld %8lld", label.c_str(), s.agreement, s.nll,
                  s.reference_match, tokens_per_second(s), static_cast<long long>(s.steps),
                  static_cast<long long>(s.forwards));
      if (moe) std::printf("  %7.2f (%5.2f)", s.experts, s.experts_block);
      std::printf("\n");
      std::fflush(stdout);  // each row as soon as it is measured, also into a pipe
    };
    const size_t n_rows = candidates.size() + 1;
    const auto row_name = [&](const std::string& label, size_t i) {
      return label + " (" + std::to_string(i) + "/" + std::to_string(n_rows) + ")";
    };
    const eval::Generations ex =
        generate_cases(*exact, base, cases, seeds, true, progress, row_name("exact", 1));
    const eval::GenSide ex_side = eval::score(*exact, ex, ex, cases, seeds.size(), a.gen_length);
    print_row("exact", ex_side);
    out["exact"] = side_json(ex_side);
    failures = run_comparisons(
        candidates, *exact, [&](const EngineOptions& o) { return Engine::load(dir, o); }, progress, "eval",
        [&](size_t i) { return row_name(candidates[i].label, i + 2); },
        [&](size_t i, Engine& e) {
          const Candidate& c = candidates[i];
          const eval::Generations g =
              generate_cases(e, c.gen, cases, seeds, c.suffix, progress, row_name(c.label, i + 2));
          const eval::GenSide side = eval::score(*exact, g, ex, cases, seeds.size(), a.gen_length);
          print_row(c.label, side);
          json j = side_json(side);
          j["option"] = c.label;
          gens.push_back(j);
        },
        [&](size_t i, const Error& e) {
          gens.push_back({{"option", candidates[i].label}, {"error", e.what()}});
        });
    if (!a.json) {
      for (const char* l : kGenLegend) std::printf("  %s\n", l);
      std::fflush(stdout);
    }
    out["generation"] = {{"prompts", cases.size()},
                         {"seeds", seeds},
                         {"prompt_len", a.prompt_len},
                         {"gen_length", a.gen_length},
                         {"suffix_len", a.suffix_len},
                         {"exact_path",
                          {{"steps", base.steps},
                           {"block_length", base.block_length},
                           {"alg", name(base.alg)},
                           {"device", a.device},
                           {"precision", a.precision}}},
                         {"comparisons", gens}};
  }
  progress.clear();
  if (a.json) std::printf("%s\n", out.dump(1).c_str());
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f || !(f << out.dump(1) << "\n")) fail("--json-out: cannot write " + a.json_out);
  }
  if (!a.svg.empty()) {
    std::string chart;
    std::string infill_note = "infilling accuracy:";
    for (const auto& x : infills)
      infill_note += " " + svg::fixed(x.accuracy, 3) + " at mask " + svg::fixed(x.mask_ratio, 2) + ",";
    infill_note.back() = ' ';
    infill_note += "(unigram baseline " +
                   (infills.empty() ? std::string("-") : svg::fixed(infills[0].unigram_accuracy, 3)) + ")";
    if (!a.no_generation) {
      svg::Metric agree{"agreement", {}, 3, true}, ref{"ref match", {}, 3, true},
          nll{"NLL(exact)", {}, 3, false}, tps{"tokens/s", {}, 1, true};
      for (const auto& s : sides) {
        agree.values.push_back(s.agreement);
        ref.values.push_back(s.reference_match);
        nll.values.push_back(s.nll);
        tps.values.push_back(tokens_per_second(s));
      }
      std::vector<std::string> notes(std::begin(kGenLegend), std::end(kGenLegend));
      notes.push_back(infill_note);
      chart = svg::bar_chart("tessera eval: " + dir + " against its exact path", setup, labels,
                             {agree, ref, nll, tps}, notes);
    } else {
      svg::Metric acc{"accuracy", {}, 3, true}, nll{"NLL", {}, 3, false}, uni_acc{"unigram acc", {}, 3, true};
      std::vector<std::string> rows;
      for (const auto& x : infills) {
        rows.push_back("mask " + svg::fixed(x.mask_ratio, 2));
        acc.values.push_back(x.accuracy);
        nll.values.push_back(x.nll);
        uni_acc.values.push_back(x.unigram_accuracy);
      }
      chart = svg::bar_chart(
          "tessera eval: " + dir + ", infilling held-out text",
          std::to_string(seqs.size()) + " sequences of " + std::to_string(a.seq_len) + " tokens", rows,
          {acc, nll, uni_acc}, std::vector<std::string>(std::begin(kInfillLegend), std::end(kInfillLegend)));
    }
    svg::save(a.svg, "--svg", chart);
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace

void add_eval(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("eval",
                                 "Measure quality on held-out text (infilling, and generation fidelity "
                                 "of engine options against the exact path) or task accuracy (--task)");
  sub->option_defaults()->always_capture_default();
  auto a = std::make_shared<EvalArgs>();
  sub->add_option("-m,--model", a->model, "model directory (default: the bundled default model)");
  sub->add_option(
      "--heldout", a->heldout,
      "held-out documents: .jsonl with a \"text\" field per line, or plain text with blank-line-separated "
      "documents (default: MODEL/heldout.jsonl, else heldout.jsonl beside MODEL)");
  sub->add_option("--seqs", a->seqs, "held-out sequences")->check(CLI::PositiveNumber);
  sub->add_option("--seq-len", a->seq_len, "tokens per sequence")->check(CLI::PositiveNumber);
  sub->add_option("--ratios", a->ratios, "infilling mask ratios")->delimiter(',');
  sub->add_option("--prompts", a->prompts, "generation prompts")->check(CLI::PositiveNumber);
  sub->add_option("--prompt-len", a->prompt_len, "prompt tokens")->check(CLI::PositiveNumber);
  sub->add_option("--suffix-len", a->suffix_len,
                  "infilling: the held-out tokens after each reference continuation are its suffix "
                  "(compare suffix=off: the same generation without it)")
      ->check(CLI::NonNegativeNumber);
  auto* gen_length = sub->add_option("--gen-length", a->gen_length,
                                     "generated tokens (--task: default the model's generation_config.json)")
                         ->check(CLI::PositiveNumber);
  sub->add_option("--steps", a->steps, "exact path: denoising steps (0: gen-length)");
  sub->add_option("--block-length", a->block_length,
                  "exact path: block length (0: gen-length; a tri-mode model: its trained block)");
  sub->add_option("--alg", a->alg, "exact path: unmasking policy")
      ->check(
          CLI::IsMember({"low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"}));
  sub->add_option("--seeds", a->n_seeds, "seeds per prompt")->check(CLI::PositiveNumber);
  sub->add_option("--seed", a->seed, "first seed (masks and generation)");
  auto threads = std::make_shared<int>(0);
  sub->add_option("-t,--threads", *threads, "CPU threads (default: OMP_NUM_THREADS, else every core)")
      ->check(in_range(1, 4096));
  sub->add_option("--device", a->device, "exact path device")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", a->precision, "exact path precision")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  sub->add_option("--compare", a->compare,
                  "engine options to compare with the exact path, e.g. \"steps=16\" or "
                  "\"threshold=0.9,block-length=8\" (repeatable; all checked before anything runs)")
      ->option_text("SPEC");
  sub->add_flag("--no-generation", a->no_generation, "infilling only");
  auto task = std::make_shared<TaskEvalArgs>();
  auto* task_opt =
      sub->add_option("--task", task->tasks,
                      "score task accuracy instead of held-out text: task names from the task file, or all "
                      "(exact match of each answer; the exact path and every --compare)")
          ->delimiter(',')
          ->option_text("NAMES");
  sub->add_option(
         "--tasks-file", task->tasks_file,
         "--task: held-out tasks, .jsonl with task, prompt, answer per line (default: MODEL/tasks.jsonl)")
      ->check(CLI::ExistingFile);
  sub->add_option("--per-task", task->per_task, "--task: at most N examples of each task (0: all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--json", a->json, "print the results as JSON on stdout instead of the tables");
  sub->add_option("--json-out", a->json_out, "also write the JSON to FILE")->check(svg::writable_file());
  sub->add_option(
         "--svg", a->svg,
         "draw the generation table as bar charts (agreement, ref match, NLL, tokens/s per option) to FILE")
      ->check(svg::writable_file());
  std::string footer = "Infilling columns:\n";
  for (const char* l : kInfillLegend) footer += std::string("  ") + l + "\n";
  footer += "Generation columns:\n";
  for (const char* l : kGenLegend) footer += std::string("  ") + l + "\n";
  footer += "\n--compare keys: " + known_keys() +
            "\n\nExamples:\n"
            "  tessera eval --compare steps=16 --compare k-logits=4 --json-out eval.json --svg eval.svg\n"
            "  tessera eval -m models/tessera-tiny-moe --no-generation --ratios 0.15,0.5\n"
            "  tessera eval -m models/tessera-task --task all --compare threshold=0.9 --compare cache=dual";
  sub->footer(footer);
  reg.handlers.emplace_back(sub, [a, threads, task, task_opt, gen_length] {
    if (*threads > 0) omp_set_num_threads(*threads);
    if (task_opt->count() == 0) {
      if (!task->tasks_file.empty() || task->per_task > 0) fail("--tasks-file and --per-task need --task");
      return run_eval(*a);
    }
    if (a->no_generation || !a->heldout.empty() || a->suffix_len > 0)
      fail("--task scores generated answers: it takes no --no-generation, --heldout or --suffix-len");
    TaskEvalArgs t = *task;
    t.model = a->model;
    t.json_out = a->json_out;
    t.svg = a->svg;
    t.device = a->device;
    t.precision = a->precision;
    t.alg = a->alg;
    if (gen_length->count() > 0) t.gen_length = static_cast<int>(a->gen_length);
    t.steps = a->steps;
    t.block_length = a->block_length;
    t.seed = a->seed;
    t.compare = a->compare;
    t.json = a->json;
    return run_task_eval(t);
  });
}

}  // namespace tessera::cli
