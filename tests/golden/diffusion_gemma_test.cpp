// DiffusionGemma end to end on the tiny checkpoint in the real layout (tools/make_tiny_checkpoint.py
// --family diffusion_gemma: sliding and global layers with their own head sizes and key / value heads,
// K as V and proportional RoPE on the global ones, the dense MLP beside the experts, different encoder and
// decoder layer scalars, self-conditioning) against the numpy reference (tests/reference/
// ref_diffusion_gemma.py, written from shared/specs/diffusion-gemma.md): the encoder's causal logits, the
// decoder's over a cache longer than the sliding window (with and without self-conditioning), and the
// entropy-bound sampler's loop: the same canvas after every forward, the same tokens, the same stops.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "eval/fidelity.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

constexpr const char* kArgs = "--dtype f32 --seed 2";
using nlohmann::json;

std::string ref_script() {
  return test::python() + " " + (test::source_dir() / "tests/reference/ref_diffusion_gemma.py").string();
}

// ref_diffusion_gemma.py logits with `args` ([rows, V] f32).
std::vector<float> ref_logits(const std::filesystem::path& dir, const std::string& args, size_t n) {
  return test::diffusion_gemma_reference_logits(dir, args, n);
}

json ref_generate(const std::filesystem::path& dir, const std::string& args) {
  const std::string cmd = ref_script() + " generate --model " + dir.string() + " " + args;
  std::string log;
  if (test::run_command(cmd + " 2>/dev/null", &log) != 0) {
    ADD_FAILURE() << cmd << "\n" << log;
    return {};
  }
  return json::parse(log);
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return test::rel_error(got.data(), want.data(), std::min(got.size(), want.size()));
}

std::vector<int32_t> ids(std::initializer_list<int32_t> v) {
  return v;
}

// Encodes the prompt causally into a fresh cache of `capacity` rows.
void encode_prompt(Engine& e, const std::vector<int32_t>& prompt, int64_t capacity) {
  e.kv_cache_reset(capacity);
  e.set_causal(true);
  e.predict_cached(prompt, 0, static_cast<int64_t>(prompt.size()), {}, SampleParams{}, {}, {});
  e.set_causal(false);
}

TEST(DiffusionGemma, ConfigReadsTheTextModel) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  const ModelConfig c = load_config(dir);
  EXPECT_STREQ(family_name(c.family), "diffusion-gemma");
  ASSERT_TRUE(c.is_uniform());
  EXPECT_EQ(c.uniform.canvas, 8);
  EXPECT_EQ(c.uniform.window, 8);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.uniform.global_head_dim, 32);
  EXPECT_EQ(c.uniform.global_kv_heads, 1);
  EXPECT_EQ(c.uniform.global_rotary, 8);  // int(0.25 * 32 / 2) = 4 pairs
  EXPECT_EQ(c.uniform.global_layer, (std::vector<uint8_t>{0, 0, 1, 0, 0, 1}));
  EXPECT_FLOAT_EQ(c.uniform.softcap, 30.0f);
  EXPECT_EQ(c.mask_id, -1);
  EXPECT_EQ(c.uniform.eos_ids, (std::vector<int32_t>{292, 295, 299}));
  EXPECT_EQ(c.uniform.steps, 12);
  EXPECT_DOUBLE_EQ(c.uniform.t_min, 0.4);
  EXPECT_DOUBLE_EQ(c.uniform.entropy_bound, 0.1);
  EXPECT_DOUBLE_EQ(c.uniform.confidence, 0.005);
  // Every text parameter counted once (the vision tower and the encoder's scalars are not the model's).
  const auto [n, experts] = test::checkpoint_params(dir);
  int64_t vision = 0;
  (void)experts;
  const Checkpoint ck = Checkpoint::open(dir);
  for (const auto& [name, t] : ck.tensors())
    if (name.rfind("model.encoder.", 0) == 0) vision += t.numel();
  EXPECT_EQ(c.param_count(), n - vision);
}

TEST(DiffusionGemma, RealGeometryCountsItsParameters) {
  const ModelConfig c = named_geometry("diffusiongemma-26b-a4b");
  // The model card: 25.2B parameters, 3.8B active.
  EXPECT_NEAR(static_cast<double>(c.param_count()) / 1e9, 25.2, 0.35);
  EXPECT_NEAR(static_cast<double>(c.active_param_count()) / 1e9, 3.8, 0.2);
  // K / V per token: 25 sliding layers of 8 x 256 and 5 global of 2 x 512, K and V, bf16.
  EXPECT_EQ(c.kv_cache_bytes_per_token(2), 2 * 2 * (25 * 8 * 256 + 5 * 2 * 512));
}

TEST(DiffusionGemma, EncoderLogitsMatchReference) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size(), n = 21;  // past the window of 8
  const auto tokens = test::random_canvas(n, V, 11, 0, 0.0);
  e->kv_cache_reset(n);
  e->set_causal(true);
  std::vector<int32_t> pos, rows;
  for (int32_t p = 1; p < n; ++p) pos.push_back(p), rows.push_back(p - 1);
  std::vector<float> got(pos.size() * static_cast<size_t>(V));
  e->logits_cached(tokens, 0, n, pos, got);  // position p from row p - 1: the encoder's own rows
  const auto want = ref_logits(
      dir, "--mode enc --tokens " + test::join_ids(tokens) + " --rows " + test::join_ids(rows), got.size());
  EXPECT_LT(rel_err(got, want), 1e-3);
  e->kv_cache_end();
  e->set_causal(false);
  // eval's NLL(exact) of a uniform-noise model: the encoder's causal NLL of tokens [5, n), row i - 1
  // predicting token i, from the reference's logits.
  double nll = 0.0;
  for (int64_t i = 5; i < n; ++i) {
    const float* l = want.data() + (i - 1) * V;
    double mx = -1e300, z = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(l[v] - mx);
    nll -= l[tokens[static_cast<size_t>(i)]] - mx - std::log(z);
  }
  EXPECT_NEAR(eval::causal_nll(*e, tokens, 5, n), nll / static_cast<double>(n - 5), 1e-4);
}

TEST(DiffusionGemma, DecoderLogitsMatchReferenceOverTheCache) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size(), C = 8;
  for (const int64_t P : {3, 13}) {  // within and past the sliding window of 8
    const auto prompt = test::random_canvas(P, V, 5 + static_cast<uint64_t>(P), 0, 0.0);
    const auto c1 = test::random_canvas(C, V, 91, 0, 0.0), c2 = test::random_canvas(C, V, 92, 0, 0.0);
    encode_prompt(*e, prompt, P + C);
    std::vector<int32_t> view = prompt;
    view.insert(view.end(), c1.begin(), c1.end());
    std::vector<float> got(static_cast<size_t>(C * V));
    e->logits_canvas(view, P, P + C, {}, got);
    const std::string base = "--mode dec --prompt " + test::join_ids(prompt);
    const auto w1 = ref_logits(dir, base + " --canvas " + test::join_ids(c1), got.size());
    EXPECT_LT(rel_err(got, w1), 1e-3) << P;
    // Self-conditioning: the step of c1 at T = 0.7 gives the soft embeddings the step of c2 reads.
    SampleParams sp;
    sp.temperature = 0.7f;
    CanvasPrediction pred;
    e->denoise_canvas(view, P, P + C, {}, sp, pred);
    // The soft embeddings: softmax(logits / T) E sqrt(hidden) of the reference's logits, on the host.
    const Checkpoint ck = Checkpoint::open(dir);
    const auto* E = static_cast<const float*>(ck.tensors().at("model.decoder.embed_tokens.weight").data);
    const int64_t H = e->soft_width();
    std::vector<float> soft(static_cast<size_t>(C * H));
    for (int64_t r = 0; r < C; ++r) {
      std::vector<double> p(static_cast<size_t>(V));
      double mx = -1e300, z = 0.0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, w1[static_cast<size_t>(r * V + v)] / 0.7);
      for (int64_t v = 0; v < V; ++v)
        z += (p[static_cast<size_t>(v)] = std::exp(w1[static_cast<size_t>(r * V + v)] / 0.7 - mx));
      for (int64_t h = 0; h < H; ++h) {
        double a = 0.0;
        for (int64_t v = 0; v < V; ++v) a += p[static_cast<size_t>(v)] / z * E[v * H + h];
        soft[static_cast<size_t>(r * H + h)] = static_cast<float>(a * std::sqrt(static_cast<double>(H)));
      }
    }
    EXPECT_LT(rel_err(pred.soft, soft), 1e-4) << P;
    std::copy(c2.begin(), c2.end(), view.begin() + P);
    e->logits_canvas(view, P, P + C, pred.soft, got);
    const auto want = ref_logits(dir,
                                 base + " --canvas " + test::join_ids(c2) + " --prev-canvas " +
                                     test::join_ids(c1) + " --prev-temperature 0.7",
                                 got.size());
    EXPECT_LT(rel_err(got, want), 1e-3) << P;
    e->kv_cache_end();
  }
}

// The model's own sampler (generation_config.json) for gen_length tokens with `seed`.
GenerateOptions uniform_options(const ModelConfig& c, int gen_length, uint64_t seed) {
  GenerateOptions o;
  o.mode = DecodeMode::Uniform;
  o.gen_length = gen_length;
  o.block_length = static_cast<int>(c.uniform.canvas);
  o.steps = c.uniform.steps;
  o.uniform = UniformSampling{c.uniform.t_min,     c.uniform.t_max,      c.uniform.entropy_bound,
                              c.uniform.stability, c.uniform.confidence, c.pad_id};
  o.eos_ids = c.uniform.eos_ids;
  o.seed = seed;
  return o;
}

// The loop: every forward's canvas, the stops and the tokens equal the reference's (its trace).
void expect_loop_matches(const std::filesystem::path& dir, const std::vector<int32_t>& prompt, int gen_length,
                         uint64_t seed, const std::string& extra_ref,
                         const std::function<void(GenerateOptions&)>& set) {
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  GenerateOptions o = uniform_options(e->config(), gen_length, seed);
  if (set) set(o);
  std::vector<std::vector<int32_t>> canvases;
  const GenerateResult r = generate(*e, prompt, o, [&](const StepEvent& ev) {
    canvases.emplace_back(ev.canvas.begin() + static_cast<std::ptrdiff_t>(prompt.size()), ev.canvas.end());
  });
  const json ref =
      ref_generate(dir, "--prompt " + test::join_ids(prompt) + " --gen-length " + std::to_string(gen_length) +
                            " --seed " + std::to_string(seed) + " " + extra_ref);
  ASSERT_TRUE(ref.contains("tokens"));
  EXPECT_EQ(r.tokens, ref["tokens"].get<std::vector<int32_t>>());
  EXPECT_EQ(r.forwards, ref["forwards"].get<int64_t>());
  const auto& trace = ref["trace"];
  ASSERT_EQ(canvases.size(), trace.size());
  // After forward t the current canvas is the one entering forward t + 1 (within a canvas), or its
  // committed argmax at its last step.
  const int C = o.block_length;
  int canvas_no = 0, k = 0;  // the current canvas and its steps so far
  for (size_t t = 0; t < trace.size(); ++t) {
    const auto& got_all = canvases[t];
    const size_t from = static_cast<size_t>(canvas_no * C);
    const size_t n = std::min(got_all.size(), from + static_cast<size_t>(C)) - from;
    const std::vector<int32_t> got(got_all.begin() + static_cast<std::ptrdiff_t>(from),
                                   got_all.begin() + static_cast<std::ptrdiff_t>(from + n));
    auto first_n = [&](const json& v) {
      const auto all = v.get<std::vector<int32_t>>();
      return std::vector<int32_t>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
    };
    if (trace[t]["stop"].get<bool>() || ++k == o.steps) {  // the canvas commits its argmax
      EXPECT_EQ(got, first_n(trace[t]["argmax"])) << "forward " << t;
      ++canvas_no;
      k = 0;
    } else {
      ASSERT_LT(t + 1, trace.size());
      EXPECT_EQ(got, first_n(trace[t + 1]["canvas_in"])) << "forward " << t;
    }
  }
}

TEST(DiffusionGemma, LoopMatchesReferenceForwardByForward) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  expect_loop_matches(dir, ids({5, 9, 3, 10, 11, 12, 13, 14, 15, 16, 17}), 16, 3, "", nullptr);
  expect_loop_matches(dir, ids({7, 8}), 12, 9, "", nullptr);  // a last canvas cut to the length asked
}

// An EOS in a committed canvas ends the generation there (the answer ends before it; no later canvas).
TEST(DiffusionGemma, LoopEndsAtEosAsReference) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  const auto prompt = ids({5, 9, 3, 10});
  std::vector<int32_t> free_run;
  expect_loop_matches(dir, prompt, 16, 8, "--eos 0", [&](GenerateOptions& o) { o.eos_ids = {0}; });
  {
    auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
    GenerateOptions o = uniform_options(e->config(), 16, 8);
    o.eos_ids = {0};
    free_run = generate(*e, prompt, o).tokens;
  }
  ASSERT_EQ(free_run.size(), 16u);
  const int32_t eos = free_run[2];  // a token of the first canvas
  expect_loop_matches(dir, prompt, 16, 8, "--eos " + std::to_string(eos),
                      [&](GenerateOptions& o) { o.eos_ids = {eos}; });
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  GenerateOptions o = uniform_options(e->config(), 16, 8);
  o.eos_ids = {eos};
  const GenerateResult r = generate(*e, prompt, o);
  const auto first = std::find(free_run.begin(), free_run.end(), eos) - free_run.begin();
  EXPECT_EQ(r.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first));
  EXPECT_LE(r.forwards, 12);  // the second canvas never ran
}

TEST(DiffusionGemma, LoopStopsEarlyAsReference) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  // Stability 0 and a large confidence: one forward per canvas.
  expect_loop_matches(dir, ids({5, 9, 3}), 24, 4, "--stability 0 --confidence 100", [](GenerateOptions& o) {
    o.uniform.stability = 0;
    o.uniform.confidence = 100;
  });
  // Stability 1: a canvas ends once its argmax repeats.
  expect_loop_matches(dir, ids({5, 9, 3}), 16, 6, "--confidence 100",
                      [](GenerateOptions& o) { o.uniform.confidence = 100; });
}

// The CLI: generate under a memory budget writes the same text (the session measures its runtime with one
// canvas step); a chat prompt renders the built-in Gemma 4 template; what cannot combine is one line.
TEST(DiffusionGemma, CliGeneratesUnderABudgetAndRefusesWhatDoesNotCombine) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  const std::string gen = std::string(TESSERA_BINARY) + " generate -m " + dir.string() +
                          " -p hello --raw --gen-length 16 --seed 5 --json";
  std::string plain, budget, out;
  ASSERT_EQ(test::run_command(gen + " 2>/dev/null", &plain), 0) << plain;
  ASSERT_EQ(test::run_command(gen + " --memory-budget 40MiB 2>/dev/null", &budget), 0) << budget;
  EXPECT_EQ(json::parse(plain)["tokens"], json::parse(budget)["tokens"]);
  for (const auto& [flags, want] :
       std::vector<std::pair<std::string, std::string>>{{"--cache dual", "use cache none"},
                                                        {"--threshold 0.5", "set threshold 0"},
                                                        {"--t-min 0.9", "t-min and t-max must satisfy"},
                                                        {"--think", "does not apply to --raw"}}) {
    EXPECT_NE(test::run_command(gen + " " + flags + " 2>&1", &out), 0) << flags;
    EXPECT_NE(out.find(want), std::string::npos) << flags << ": " << out;
  }
  // --think with a chat prompt: the built-in template has the switch.
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " + dir.string() +
                                  " -p hello --chat --think --gen-length 8 --json 2>/dev/null",
                              &out),
            0)
      << out;
}

// eval on a uniform-noise model: no infilling table; the exact path is the model's own sampler, the
// comparisons its settings, NLL(exact) the encoder's causal NLL (checked in EncoderLogitsMatchReference).
TEST(DiffusionGemma, EvalComparesTheSamplersSettings) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", kArgs);
  const auto held = test::temp_dir("dg_eval") / "heldout.txt";
  {
    std::ofstream f(held);
    for (int d = 0; d < 4; ++d)
      f << "document " << d << ": the quick brown fox jumps over the lazy dog, then rests in the sun.\n\n";
  }
  const std::string cmd =
      std::string(TESSERA_BINARY) + " eval -m " + dir.string() + " --heldout " + held.string() +
      " --seqs 4 --seq-len 40 --prompts 2 --prompt-len 8 --gen-length 12 --seeds 1 --json "
      "--compare entropy-bound=0.5 --compare steps=1 --compare t-min=0.2,t-max=0.3";
  std::string out;
  ASSERT_EQ(test::run_command(cmd + " 2>/dev/null", &out), 0) << out;
  const json j = json::parse(out);
  EXPECT_TRUE(j["infilling"].empty());
  const auto& ex = j["exact"];
  EXPECT_DOUBLE_EQ(ex["agreement"].get<double>(), 1.0);
  EXPECT_GT(ex["nll"].get<double>(), 0.0);
  EXPECT_GT(ex["tokens"].get<int64_t>(), 0);  // 2 x 12 unless an EOS ends one
  EXPECT_LE(ex["tokens"].get<int64_t>(), 24);
  const auto& cmp = j["generation"]["comparisons"];
  ASSERT_EQ(cmp.size(), 3u);
  for (const auto& c : cmp) {
    EXPECT_FALSE(c.contains("error")) << c.dump();
    EXPECT_LE(c["agreement"].get<double>(), 1.0);
  }
  // steps=1: one forward per canvas (at most two canvases of 8 for 12 tokens, per prompt).
  EXPECT_GE(cmp[1]["forwards"].get<int64_t>(), 2);
  EXPECT_LE(cmp[1]["forwards"].get<int64_t>(), 2 * 2);
  EXPECT_LE(cmp[1]["forwards"].get<int64_t>(), ex["forwards"].get<int64_t>());
  EXPECT_NE(test::run_command(cmd + " --compare stability=x 2>&1", &out), 0);
  EXPECT_NE(out.find("not a number for stability"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
