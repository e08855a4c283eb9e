// The fidelity harness (src/eval, `tessera eval`) and the bundled trained models (models/).
// Infilling metrics against an independent computation from full logits; generation scores against
// hand-computed values; the CLI's table, JSON and exit status on the bundled tessera-tiny; and the
// bundled models' temperature-0 samples against the PyTorch samples recorded in their MODEL_CARDs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "eval/fidelity.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string tessera_bin() {
  return TESSERA_BINARY;
}
fs::path bundled(const std::string& name) {
  return test::source_dir() / "models" / name;
}

// -log softmax(row)[target] in double.
double nll_of(const float* row, int64_t vocab, int32_t target) {
  double mx = row[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double s = 0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(static_cast<double>(row[j]) - mx);
  return -(static_cast<double>(row[target]) - mx - std::log(s));
}

std::vector<eval::Seq> random_seqs(int n, int len, int32_t vocab, int32_t mask, uint64_t seed) {
  std::vector<eval::Seq> out(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    for (int i = 0; i < len; ++i) {
      auto t = static_cast<int32_t>(rng_mix(seed + static_cast<uint64_t>(s * 1000 + i)) %
                                    static_cast<uint64_t>(vocab));
      if (t == mask) t = (t + 1) % vocab;
      out[static_cast<size_t>(s)].push_back(t);
    }
  }
  return out;
}

TEST(Eval, InfillingMatchesFullLogitsPerSequence) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "");
  auto e = Engine::load(dir, EngineOptions{});
  const auto V = static_cast<int32_t>(e->vocab_size());
  const auto seqs = random_seqs(5, 24, V, e->mask_token(), 7);
  const int32_t uni = eval::unigram_token(seqs);
  // Packed batches of two or three sequences per forward.
  const eval::InfillResult r = eval::infill(*e, seqs, 0.5, 3, uni, 60);
  // The reference: one sequence at a time, full logits of the masked rows, argmax and log-softmax here.
  int64_t masked = 0, correct = 0, uni_hits = 0;
  double nll = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    eval::Seq canvas = seqs[s];
    std::vector<int32_t> pos;
    for (size_t i = 0; i < canvas.size(); ++i) {
      if (rng_uniform(3, s, i) < 0.5) pos.push_back(static_cast<int32_t>(i));
    }
    ASSERT_FALSE(pos.empty());
    for (int32_t p : pos) canvas[static_cast<size_t>(p)] = e->mask_token();
    std::vector<float> lg(pos.size() * static_cast<size_t>(V));
    e->logits(canvas, pos, lg);
    for (size_t k = 0; k < pos.size(); ++k) {
      const float* row = lg.data() + k * static_cast<size_t>(V);
      const int32_t target = seqs[s][static_cast<size_t>(pos[k])];
      correct += static_cast<int32_t>(std::max_element(row, row + V) - row) == target ? 1 : 0;
      uni_hits += target == uni ? 1 : 0;
      nll += nll_of(row, V, target);
      ++masked;
    }
  }
  EXPECT_EQ(r.masked, masked);
  EXPECT_DOUBLE_EQ(r.accuracy, static_cast<double>(correct) / static_cast<double>(masked));
  EXPECT_DOUBLE_EQ(r.unigram_accuracy, static_cast<double>(uni_hits) / static_cast<double>(masked));
  EXPECT_NEAR(r.nll, nll / static_cast<double>(masked), 1e-4 * std::max(1.0, r.nll));
}

TEST(Eval, PseudoNllMasksInterleavedGroups) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "");
  auto e = Engine::load(dir, EngineOptions{});
  const auto V = static_cast<int32_t>(e->vocab_size());
  const eval::Seq seq = random_seqs(1, 20, V, e->mask_token(), 11)[0];
  const int64_t from = 6;
  const int groups = 3;
  double total = 0;
  for (int g = 0; g < groups; ++g) {
    eval::Seq canvas = seq;
    std::vector<int32_t> pos;
    for (int64_t i = from + g; i < static_cast<int64_t>(seq.size()); i += groups) {
      pos.push_back(static_cast<int32_t>(i));
      canvas[static_cast<size_t>(i)] = e->mask_token();
    }
    std::vector<float> lg(pos.size() * static_cast<size_t>(V));
    e->logits(canvas, pos, lg);
    for (size_t k = 0; k < pos.size(); ++k) {
      total += nll_of(lg.data() + k * static_cast<size_t>(V), V, seq[static_cast<size_t>(pos[k])]);
    }
  }
  const double want = total / static_cast<double>(seq.size() - from);
  EXPECT_NEAR(eval::pseudo_nll(*e, seq, from, groups), want, 1e-4 * want);
}

TEST(Eval, GenerationScoresAreTheHandComputedRates) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "");
  auto e = Engine::load(dir, EngineOptions{});
  const std::vector<eval::GenCase> cases = {{{1, 2, 3}, {1, 0, 3, 0}}, {{4, 5, 6}, {5, 6, 0, 0}}};
  eval::Generations exact, cand;
  exact.tokens = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  cand.tokens = {{1, 2, 9, 4}, {5, 6, 7}};  // one token differs; the second stopped one short
  cand.seconds = 2.0;
  cand.steps = 5;
  const eval::GenSide s = eval::score(*e, cand, exact, cases, 1, 4, 2);
  EXPECT_DOUBLE_EQ(s.agreement, 6.0 / 8.0);        // 3 of 4, then 3 of 4 with the missing one
  EXPECT_DOUBLE_EQ(s.reference_match, 3.0 / 8.0);  // 1 (pos 0) + 2 (pos 0, 1)
  EXPECT_EQ(s.tokens, 7);
  EXPECT_EQ(s.steps, 5);
  EXPECT_DOUBLE_EQ(s.seconds, 2.0);
  const double n0 = eval::pseudo_nll(*e, {1, 2, 3, 1, 2, 9, 4}, 3, 2);
  const double n1 = eval::pseudo_nll(*e, {4, 5, 6, 5, 6, 7}, 3, 2);
  EXPECT_NEAR(s.nll, (4 * n0 + 3 * n1) / 7, 1e-9);
  const eval::GenSide self = eval::score(*e, exact, exact, cases, 1, 4, 2);
  EXPECT_DOUBLE_EQ(self.agreement, 1.0);
  eval::Generations wrong = cand;
  wrong.tokens.pop_back();
  EXPECT_THROW(eval::score(*e, wrong, exact, cases, 1, 4, 2), Error);
}

TEST(Eval, HeldoutWindowsAreTokenizedDocuments) {
  const fs::path tj = bundled("tessera-tiny") / "tokenizer.json";
  if (!fs::exists(tj)) GTEST_SKIP() << tj << " is missing";
  const Tokenizer tok = Tokenizer::from_file(tj);
  const fs::path d = test::temp_dir("eval_heldout");
  const std::string
      a = "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
          "must be in want of a wife.",
      b = "In the beginning God created the heaven and the earth. And the earth was without form.";
  std::ofstream(d / "h.jsonl") << nlohmann::json{{"text", a}}.dump() << "\n\n"
                               << nlohmann::json{{"src", "x"}, {"text", b}}.dump() << "\n";
  std::ofstream(d / "h.txt") << a << "\n\n" << b << "\n";
  const auto ia = tok.encode(a, false), ib = tok.encode(b, false);
  const int64_t L = 8;
  std::vector<eval::Seq> want;
  for (const auto* ids : {&ia, &ib}) {
    for (size_t at = 0; at + L <= ids->size(); at += L)
      want.emplace_back(ids->begin() + at, ids->begin() + at + L);
  }
  EXPECT_EQ(eval::load_heldout(d / "h.jsonl", tok, L, 1000), want);
  EXPECT_EQ(eval::load_heldout(d / "h.txt", tok, L, 1000), want);
  EXPECT_EQ(eval::load_heldout(d / "h.txt", tok, L, 3).size(), 3u);
  std::ofstream(d / "bad.jsonl") << "{\"text\": 3}\n";
  EXPECT_THROW(eval::load_heldout(d / "bad.jsonl", tok, L, 10), Error);
  EXPECT_THROW(eval::load_heldout(d / "h.txt", tok, 100000, 10), Error);  // no document that long
  EXPECT_THROW(eval::load_heldout(d / "missing.jsonl", tok, L, 10), Error);
}

TEST(Eval, CliTableJsonAndExitStatusOnTheBundledModel) {
  const fs::path m = bundled("tessera-tiny");
  if (!fs::exists(m / "model.safetensors")) GTEST_SKIP() << m << " is missing";
  const fs::path d = test::temp_dir("eval_cli");
  const std::string base = tessera_bin() + " eval -m " + m.string() +
                           " --seqs 8 --seq-len 128 --prompts 2 --seeds 1 --prompt-len 16 --gen-length 16";
  std::string out;
  // A comparison that cannot run (a memory budget below the step's floor): the others still run, the
  // table is printed, the exit status is 1. A spec that does not parse fails before any work.
  const auto weights = static_cast<size_t>(fs::file_size(m / "model.safetensors"));
  const std::string too_small = "memory-budget=" + std::to_string(weights + 65536);
  EXPECT_EQ(test::run_command(base + " --compare k-logits=3 --compare steps=8 --compare " + too_small +
                                  " --json-out " + (d / "e.json").string(),
                              &out),
            1)
      << out;
  EXPECT_NE(out.find("comparison '" + too_small + "' cannot run:"), std::string::npos) << out;
  std::string bad;
  EXPECT_EQ(test::run_command(base + " --compare k-logits=3 --compare nonsense=1", &bad), 1) << bad;
  EXPECT_NE(bad.find("--compare 'nonsense=1': unknown option 'nonsense'"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("infilling"), std::string::npos) << "nothing runs before the specs are checked: " << bad;
  EXPECT_NE(out.find("unigram acc"), std::string::npos) << out;
  std::ifstream f(d / "e.json");
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["infilling"].size(), 3u);
  const auto& lo = j["infilling"][0];
  EXPECT_DOUBLE_EQ(lo["mask_ratio"].get<double>(), 0.15);
  // Learned structure: held-out infilling far above always guessing the most frequent token.
  EXPECT_GT(lo["accuracy"].get<double>(), 0.35);
  EXPECT_GT(lo["accuracy"].get<double>(), 4 * lo["unigram_accuracy"].get<double>());
  EXPECT_LT(j["infilling"][2]["accuracy"].get<double>(),
            lo["accuracy"].get<double>());  // more masked: harder
  EXPECT_DOUBLE_EQ(j["exact"]["agreement"].get<double>(), 1.0);
  const auto& cmp = j["generation"]["comparisons"];
  ASSERT_EQ(cmp.size(), 3u);
  EXPECT_EQ(cmp[0]["option"], "k-logits=3");
  EXPECT_DOUBLE_EQ(cmp[0]["agreement"].get<double>(), 1.0);  // chunked logits are exact
  EXPECT_DOUBLE_EQ(cmp[0]["nll"].get<double>(), j["exact"]["nll"].get<double>());
  EXPECT_EQ(cmp[1]["steps"].get<int64_t>(), 2 * 8);  // 2 prompts x 8 steps
  EXPECT_TRUE(cmp[2].contains("error"));
  // Every comparison valid: exit 0 (a memory budget 200 kB above the weights chunks the step's logits: still
  // exact); a budget below the step's floor cannot run; a held-out file that does not exist: a clear error.
  ASSERT_EQ(test::run_command(base + " --ratios 0.5 --compare k-ffn=2 --compare memory-budget=" +
                                  std::to_string(weights + 200000) + " --json-out " + (d / "b.json").string(),
                              &out),
            0)
      << out;
  const auto jb = nlohmann::json::parse(std::ifstream(d / "b.json"));
  EXPECT_DOUBLE_EQ(jb["generation"]["comparisons"][1]["agreement"].get<double>(), 1.0);
  EXPECT_EQ(test::run_command(
                base + " --ratios 0.5 --compare memory-budget=" + std::to_string(weights + 65536), &out),
            1);
  EXPECT_NE(out.find("is too small for a step of 32 tokens"), std::string::npos) << out;
  test::expect_command_error(base + " --heldout " + (d / "none.jsonl").string(), "none.jsonl does not exist");
}

// The bundled models: tessera's temperature-0 samples equal the PyTorch samples recorded in the model
// card (LLaDA low-confidence remasking, gen length 64, 64 steps, block 32, fp32 compute).
void expect_card_samples(const std::string& name) {
  const fs::path m = bundled(name);
  std::ifstream card(m / "MODEL_CARD.md");
  if (!card) GTEST_SKIP() << m << "/MODEL_CARD.md is missing";
  std::string line;
  int n = 0;
  while (std::getline(card, line)) {
    const std::string tag = "- PyTorch: **";
    if (line.rfind(tag, 0) != 0) continue;
    const size_t end = line.find("**", tag.size());
    ASSERT_NE(end, std::string::npos) << line;
    const std::string prompt = line.substr(tag.size(), end - tag.size());
    // tessera's text leaves special tokens out; the card's PyTorch decode writes them
    const std::string want = std::regex_replace(line.substr(end + 2), std::regex("<\\|[a-z_0-9]+\\|>"), "");
    std::string out;
    ASSERT_EQ(test::run_command(tessera_bin() + " generate -m " + m.string() + " -p '" + prompt +
                                    "' --gen-length 64 --steps 64 --block-length 32 --alg low_confidence "
                                    "--temperature 0 --raw --precision f32 --json 2>/dev/null",
                                &out),
              0)
        << out;
    std::string text =
        nlohmann::json::parse(out.substr(out.rfind("\n{") == std::string::npos ? 0 : out.rfind("\n{")))
            .at("text")
            .get<std::string>();
    std::replace(text.begin(), text.end(), '\n', ' ');
    EXPECT_EQ(text, want) << name << ", prompt '" << prompt << "'";
    ++n;
  }
  EXPECT_GE(n, 5) << "the card should hold the samples";
}

TEST(BundledModels, TesseraTinySamplesEqualPyTorch) {
  expect_card_samples("tessera-tiny");
}

TEST(BundledModels, TesseraTinyMoeSamplesEqualPyTorch) {
  expect_card_samples("tessera-tiny-moe");
}

}  // namespace
}  // namespace tessera
