// tessera eval: the fidelity harness (src/eval/fidelity.h) on a model's held-out text.
//   tessera eval -m DIR [--heldout FILE] [--compare "steps=16"] [--compare "threshold=0.9"] [--json F]
// Every --compare SPEC is a comma-separated list of key=value engine options (steps, block-length,
// threshold, alg, temperature, cache, sparse, sparse-block, sparse-rho, sparse-skip, des, des-k, des-beta,
// des-scope, window, window-ex, window-in, window-refresh, window-early-stop, mid-block-stop, suffix,
// logprobs, edit-mode, edit-threshold, max-post-steps, edit-penalty, precision, dequantize, device, k-ffn,
// k-logits, memory-budget) measured against the exact path.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/compare.h"
#include "core/error.h"
#include "eval/fidelity.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct EvalArgs {
  std::string model, heldout, json_path, device = "cpu", precision = "auto", alg = "low_confidence";
  int64_t seqs = 32, seq_len = 128, prompts = 8, prompt_len = 32, gen_length = 32, suffix_len = 0;
  int steps = 0, block_length = 0, n_seeds = 2;
  uint64_t seed = 0;
  std::vector<double> ratios = {0.15, 0.5, 0.9};
  std::vector<std::string> compare;
  bool no_generation = false;
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

int run_eval(const EvalArgs& a) {
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
  EngineOptions eng;
  eng.device = a.device;
  eng.precision = parse_precision(a.precision);
  auto exact = Engine::load(dir, eng);
  const Tokenizer tok = load_model_tokenizer(dir);
  const auto seqs = eval::load_heldout(heldout, tok, a.seq_len, a.seqs);
  const int32_t uni = eval::unigram_token(seqs);
  json out = {
      {"model", dir},   {"heldout", heldout.string()}, {"sequences", seqs.size()}, {"seq_len", a.seq_len},
      {"seed", a.seed}, {"unigram_token", uni}};

  std::printf("infilling: %zu held-out sequences of %lld tokens (%s), one forward per batch\n", seqs.size(),
              static_cast<long long>(a.seq_len), heldout.filename().string().c_str());
  std::printf("%8s %8s %10s %8s %12s\n", "mask", "masked", "accuracy", "NLL", "unigram acc");
  json inf = json::array();
  for (double r : a.ratios) {
    TESSERA_CHECK(r > 0.0 && r <= 1.0, "--ratios: each mask ratio must be in (0, 1]");
    const auto t0 = std::chrono::steady_clock::now();
    const eval::InfillResult x = eval::infill(*exact, seqs, r, a.seed, uni);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%8.2f %8lld %10.4f %8.4f %12.4f\n", r, static_cast<long long>(x.masked), x.accuracy, x.nll,
                x.unigram_accuracy);
    inf.push_back({{"mask_ratio", r},
                   {"masked", x.masked},
                   {"accuracy", x.accuracy},
                   {"nll", x.nll},
                   {"unigram_accuracy", x.unigram_accuracy},
                   {"seconds", sec}});
  }
  out["infilling"] = inf;

  int failures = 0;
  if (!a.no_generation) {
    GenerateOptions base;
    base.gen_length = static_cast<int>(a.gen_length);
    base.steps = a.steps > 0 ? a.steps : base.gen_length;
    base.block_length = a.block_length > 0 ? a.block_length : base.gen_length;
    base.alg = parse_unmask(a.alg);
    base.stop_at_eos = false;  // compare the whole generated span position by position
    if (exact->config().eos_id >= 0) base.eos_ids = {exact->config().eos_id};  // window-early-stop
    validate_generate_options(base, exact->vocab_size());
    const auto cases = eval::generation_cases(seqs, a.prompts, a.prompt_len, a.gen_length, a.suffix_len);
    std::vector<uint64_t> seeds;
    for (int s = 0; s < a.n_seeds; ++s) seeds.push_back(a.seed + static_cast<uint64_t>(s));
    std::printf(
        "\ngeneration: %zu prompts of %lld tokens x %zu seeds, %d tokens each%s; exact path: %s, %d steps, "
        "block %d, %s\n",
        cases.size(), static_cast<long long>(a.prompt_len), seeds.size(), base.gen_length,
        a.suffix_len > 0 ? (", infilling before " + std::to_string(a.suffix_len) + " suffix tokens").c_str()
                         : "",
        std::string(name(base.alg)).c_str(), base.steps, base.block_length, a.precision.c_str());
    const bool moe = exact->supports_expert_sharing();
    std::printf("%-28s %10s %10s %10s %10s %8s %8s%s\n", "option", "agreement", "NLL(exact)", "ref match",
                "tokens/s", "steps", "forwards", moe ? "  experts (block)" : "");
    json gens = json::array();
    auto print_row = [moe](const std::string& label, const eval::GenSide& s) {
      std::printf("%-28s %10.4f %10.4f %10.4f %10.1f %8lld %8lld", label.c_str(), s.agreement, s.nll,
                  s.reference_match, s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0.0,
                  static_cast<long long>(s.steps), static_cast<long long>(s.forwards));
      if (moe) std::printf("  %7.2f (%5.2f)", s.experts, s.experts_block);
      std::printf("\n");
    };
    const eval::Generations ex = eval::generate_all(*exact, base, cases, seeds);
    const eval::GenSide ex_side = eval::score(*exact, ex, ex, cases, seeds.size(), a.gen_length);
    print_row("exact", ex_side);
    out["exact"] = side_json(ex_side);
    for (const std::string& spec : a.compare) {
      try {
        Candidate c = parse_spec(spec, base, eng);
        TESSERA_CHECK(c.gen.gen_length == base.gen_length, "a comparison must generate the same length");
        validate_generate_options(c.gen, exact->vocab_size());
        std::unique_ptr<Engine> own;
        if (c.own_engine) own = Engine::load(dir, c.eng);
        const eval::Generations g = eval::generate_all(own ? *own : *exact, c.gen, cases, seeds, c.suffix);
        const eval::GenSide side = eval::score(*exact, g, ex, cases, seeds.size(), a.gen_length);
        print_row(c.label, side);
        json j = side_json(side);
        j["option"] = spec;
        gens.push_back(j);
      } catch (const Error& e) {
        std::fprintf(stderr, "tessera eval: comparison '%s' cannot run: %s\n", spec.c_str(), e.what());
        gens.push_back({{"option", spec}, {"error", e.what()}});
        ++failures;
      }
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
  if (!a.json_path.empty()) {
    std::ofstream f(a.json_path);
    if (!f) fail("cannot write " + a.json_path);
    f << out.dump(1) << "\n";
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace

void add_eval(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("eval",
                                 "Measure quality on held-out text: infilling, and generation fidelity "
                                 "of engine options against the exact path");
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
  sub->add_option("--gen-length", a->gen_length, "generated tokens")->check(CLI::PositiveNumber);
  sub->add_option("--steps", a->steps, "exact path: denoising steps (default: gen-length)");
  sub->add_option("--block-length", a->block_length, "exact path: block length (default: gen-length)");
  sub->add_option("--alg", a->alg, "exact path: unmasking policy")
      ->check(
          CLI::IsMember({"low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"}));
  sub->add_option("--seeds", a->n_seeds, "seeds per prompt")->check(CLI::PositiveNumber);
  sub->add_option("--seed", a->seed, "first seed (masks and generation)");
  sub->add_option("--device", a->device, "exact path device")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", a->precision, "exact path precision")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  sub->add_option("--compare", a->compare,
                  "engine options to compare with the exact path, e.g. \"steps=16\" or "
                  "\"threshold=0.9,block-length=8\" (repeatable)");
  sub->add_flag("--no-generation", a->no_generation, "infilling only");
  sub->add_option("--json", a->json_path, "write the results as JSON");
  reg.handlers.emplace_back(sub, [a] { return run_eval(*a); });
}

}  // namespace tessera::cli
