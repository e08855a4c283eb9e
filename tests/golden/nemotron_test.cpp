// Nemotron-Labs-Diffusion end to end on the tiny checkpoint in the real layout (tools/make_tiny_checkpoint.py
// --family nemotron: explicit head_dim with q_proj's width unlike hidden, YaRN with its cos / sin factor,
// the Llama-4 query scale from position 64, the untied diffusion_head) against the numpy reference
// (tests/reference/ref_nemotron.py, written from shared/specs/nemotron-labs-diffusion.md): logits in the
// bidirectional, causal and draft-over-cache forwards; the three decoding modes (ar, causal-context
// diffusion, spec) decide the same tokens at the same forwards; self-speculation's greedy output equals
// autoregressive output for many prompts and block lengths; batched requests equal alone; and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include "core/error.h"
#include "decode/constraint.h"
#include "decode/generate.h"
#include "engine/batcher.h"
#include "engine/engine.h"
#include "eval/fidelity.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/model_files.h"
#include "io/tokenizer.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

constexpr const char* kArgs = "--seed 5";
using nlohmann::json;

// ref_nemotron.py logits: [rows, V] f32 of `tokens` with rows < bidir_from causal, the others seeing
// every key (bidir_from = tokens.size(): causal; 0: bidirectional).
std::vector<float> ref_logits(const std::filesystem::path& dir, const std::vector<int32_t>& tokens,
                              const std::vector<int32_t>& rows, int64_t bidir_from, int64_t V,
                              const std::string& extra = "") {
  const auto out = dir / ("nref_" + std::to_string(::getpid()) + ".bin");
  const std::string cmd = test::python() + " " +
                          (test::source_dir() / "tests/reference/ref_nemotron.py").string() +
                          " logits --model " + dir.string() + " --tokens " + test::join_ids(tokens) +
                          " --rows " + test::join_ids(rows) + " --bidir-from " + std::to_string(bidir_from) +
                          " --out " + out.string() + " " + extra;
  std::string log;
  if (test::run_command(cmd, &log) != 0) {
    ADD_FAILURE() << cmd << "\n" << log;
    return {};
  }
  std::vector<float> v(rows.size() * static_cast<size_t>(V));
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), v.size() * 4);
  std::filesystem::remove(out);
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return test::rel_error(got.data(), want.data(), std::min(got.size(), want.size()));
}

std::vector<int32_t> range(int32_t lo, int32_t hi) {
  std::vector<int32_t> v;
  for (int32_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

TEST(Nemotron, ConfigReadsMinistral3) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  const ModelConfig c = load_config(dir);
  EXPECT_STREQ(family_name(c.family), "nemotron-diffusion");
  EXPECT_TRUE(c.tri_mode);
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_NE(c.n_heads * c.head_dim, c.hidden);  // q_proj's width is not hidden
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 16.0f);
  EXPECT_EQ(c.rope_scaling.original_max, 64);
  EXPECT_FLOAT_EQ(c.rope_scaling.llama4_beta, 0.1f);
  // No mscale keys: HF's attention_factor 0.1 ln(16) + 1.
  EXPECT_NEAR(c.rope_scaling.attn_factor, 0.1 * std::log(16.0) + 1.0, 1e-6);
  EXPECT_EQ(c.diffusion_block, 32);
  EXPECT_GE(c.mask_id, 0);
  EXPECT_GE(c.eos_id, 0);
  const auto [n, experts] = test::checkpoint_params(dir);
  EXPECT_EQ(c.param_count(), n);
  EXPECT_EQ(experts, 0);
}

// The real geometries plan with an explicit head_dim (3B: hidden 3072, q width 4096).
TEST(Nemotron, GeometriesKeepTheExplicitHeadDim) {
  const ModelConfig c = named_geometry("nemotron-diffusion-3b");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_heads * c.head_dim, 4096);
  EXPECT_EQ(c.hidden, 3072);
  EXPECT_TRUE(c.tri_mode);
  const RopeParams r = rope_params(c);
  EXPECT_FLOAT_EQ(r.yarn_factor, 16.0f);
  EXPECT_FLOAT_EQ(r.attn_factor, 1.0f);  // the released configs' mscale = mscale_all_dim
  EXPECT_EQ(r.pos_orig, 16384);
  EXPECT_LT(r.ramp_lo, r.ramp_hi);
}

TEST(Nemotron, LogitsMatchReferenceInEveryAttentionMode) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size();
  const int64_t n = 130;  // past original_max 64: the Llama-4 query scale is 1 + 0.1 ln 2 there
  const auto canvas = test::random_canvas(n, V, 17, e->mask_token(), 0.3);
  // Bidirectional: the model's own attention, logits of position p from row p.
  std::vector<float> got(static_cast<size_t>(n * V));
  e->logits(canvas, test::all_positions(n), got);
  EXPECT_LT(rel_err(got, ref_logits(dir, canvas, range(0, static_cast<int32_t>(n)), 0, V)), 1e-3);
  // Causal: position p from row p - 1 (the next-token prediction).
  e->set_causal(true);
  got.assign(static_cast<size_t>((n - 1) * V), 0.0f);
  e->logits(canvas, range(1, static_cast<int32_t>(n)), got);
  EXPECT_LT(rel_err(got, ref_logits(dir, canvas, range(0, static_cast<int32_t>(n - 1)), n, V)), 1e-3);
  // A draft over the cache: causal rows [0, c) written by a causal step, then the block [c, b) computed
  // bidirectionally against them.
  const int32_t c = 70, b = 102;
  e->kv_cache_reset(n);
  std::vector<float> seed(static_cast<size_t>(V));
  const std::vector<int32_t> seed_pos{c};
  e->logits_cached(std::span(canvas).first(c + 1), 0, c, seed_pos, seed);
  EXPECT_LT(
      rel_err(seed, ref_logits(dir, std::vector<int32_t>(canvas.begin(), canvas.begin() + c), {c - 1}, c, V)),
      1e-3);
  e->set_causal(false);
  got.assign(static_cast<size_t>((b - c) * V), 0.0f);
  e->logits_cached(std::span(canvas).first(b), c, b, range(c, b), got);
  EXPECT_LT(rel_err(got, ref_logits(dir, std::vector<int32_t>(canvas.begin(), canvas.begin() + b),
                                    range(c, b), c, V)),
            1e-3);
  e->kv_cache_end();
}

// The reference's generation: {"tokens", "trace": [{"kind", "rows", "decided": [[pos, tok], ...]}],
// "forwards"}.
json ref_generate(const std::filesystem::path& dir, const std::vector<int32_t>& prompt,
                  const GenerateOptions& o) {
  const std::string extra = o.draft_adapter ? "" : " --no-lora";
  const auto out = dir / ("ngen_" + std::to_string(::getpid()) + ".json");
  std::string cmd = test::python() + " " + (test::source_dir() / "tests/reference/ref_nemotron.py").string() +
                    " generate --model " + dir.string() + " --prompt " + test::join_ids(prompt) +
                    " --gen-length " + std::to_string(o.gen_length) + " --mode " + std::string(name(o.mode)) +
                    " --block-length " + std::to_string(o.block_length) + " --threshold " +
                    std::to_string(o.mode == DecodeMode::Spec ? o.draft_threshold : o.threshold) + " --out " +
                    out.string() + extra;
  std::string log;
  if (test::run_command(cmd, &log) != 0) {
    ADD_FAILURE() << cmd << "\n" << log;
    return {};
  }
  std::ifstream f(out);
  json j = json::parse(f);
  std::filesystem::remove(out);
  return j;
}

// The positions each forward of a reference trace decided (those that decided any).
std::vector<std::vector<int32_t>> ref_order(const json& ref) {
  std::vector<std::vector<int32_t>> order;
  for (const json& t : ref["trace"]) {
    std::vector<int32_t> d;
    for (const json& pt : t["decided"]) d.push_back(pt[0].get<int32_t>());
    if (!d.empty()) order.push_back(d);
  }
  return order;
}

GenerateOptions mode_options(DecodeMode m, int gen, int block, float threshold) {
  GenerateOptions o;
  o.mode = m;
  o.causal_context = true;
  o.gen_length = gen;
  o.block_length = block;
  o.steps = block;
  (m == DecodeMode::Spec ? o.draft_threshold : o.threshold) = threshold;
  o.stop_at_eos = false;
  return o;
}

// Every mode decides the reference's tokens at the reference's forwards (f32).
TEST(Nemotron, GenerationMatchesReferenceInEveryMode) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size();
  struct Case {
    DecodeMode mode;
    int block;
    float threshold;
  };
  const Case cases[] = {{DecodeMode::Ar, 8, 0.0f},
                        {DecodeMode::Diffusion, 8, 0.2f},
                        {DecodeMode::Diffusion, 16, 0.05f},
                        {DecodeMode::Spec, 8, 0.0f},
                        {DecodeMode::Spec, 5, 0.3f}};
  for (const int plen : {5, 9}) {
    const auto prompt = test::ordinary_tokens(plen, V, 40 + static_cast<uint64_t>(plen));
    for (const Case& k : cases) {
      const GenerateOptions o = mode_options(k.mode, 48, k.block, k.threshold);
      SCOPED_TRACE(std::string(name(k.mode)) + " block " + std::to_string(k.block) + " threshold " +
                   std::to_string(k.threshold) + " prompt " + std::to_string(plen));
      const GenerateResult r = generate(*e, prompt, o);
      const json ref = ref_generate(dir, prompt, o);
      ASSERT_TRUE(ref.is_object());
      EXPECT_EQ(r.tokens, ref["tokens"].get<std::vector<int32_t>>());
      EXPECT_EQ(r.order, ref_order(ref));
      EXPECT_EQ(r.forwards, ref["forwards"].get<int64_t>());
    }
  }
}

// Lossless self-speculation: at temperature 0 spec writes exactly ar's text, for many prompts, block
// lengths and draft thresholds, with and without the stop at EOS (bf16, as the model runs).
TEST(Nemotron, SpeculationEqualsAutoregressiveGreedy) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  auto e = Engine::load(dir);
  const int64_t V = e->vocab_size();
  int64_t ar_forwards = 0, spec_forwards = 0;
  for (uint64_t s = 0; s < 4; ++s) {
    const auto prompt = test::ordinary_tokens(3 + static_cast<int64_t>(s) * 5, V, 100 + s);
    for (const bool eos : {false, true}) {
      GenerateOptions ar = mode_options(DecodeMode::Ar, 32, 8, 0.0f);
      ar.stop_at_eos = eos;
      ar.eos_ids = {e->config().eos_id};
      const GenerateResult want = generate(*e, prompt, ar);
      ar_forwards += want.forwards;
      for (const int block : {2, 5, 32}) {
        for (const float thr : {0.0f, 0.5f}) {
          GenerateOptions sp = ar;
          sp.mode = DecodeMode::Spec;
          sp.block_length = block;
          sp.draft_threshold = thr;
          const GenerateResult got = generate(*e, prompt, sp);
          EXPECT_EQ(got.tokens, want.tokens) << "prompt " << s << " block " << block << " threshold " << thr;
          spec_forwards += got.forwards;
        }
      }
    }
  }
  EXPECT_GT(ar_forwards, 0);
  EXPECT_GT(spec_forwards, 0);
}

// The draft adapter (linear_spec_lora/, PEFT's LoRA on o_proj; make_tiny_checkpoint.py --nemotron-lora):
// drafts over the causal cache add it and match the reference's; causal forwards never do; spec's drafts
// use it (the reference's trace, and still ar's text), and --no-draft-adapter drafts without it.
TEST(Nemotron, DraftAdapterOnlyInSpeculationsDrafts) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", "--seed 5 --nemotron-lora 4");
  const ModelConfig c = load_config(dir);
  EXPECT_EQ(c.draft_adapter.rank, 4);
  EXPECT_FLOAT_EQ(c.draft_adapter.scale, 2.0f);  // lora_alpha 8 / r 4
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  ASSERT_TRUE(e->supports_draft_adapter());
  const int64_t V = e->vocab_size(), n = 90;
  const auto canvas = test::random_canvas(n, V, 23, e->mask_token(), 0.3);
  const int32_t lo = 50, hi = 80;
  const auto prefix = std::vector<int32_t>(canvas.begin(), canvas.begin() + hi);
  e->kv_cache_reset(n);
  e->set_causal(true);
  std::vector<float> seed(static_cast<size_t>(V));
  e->logits_cached(std::span(canvas).first(lo + 1), 0, lo, std::vector<int32_t>{lo}, seed);
  e->set_causal(false);
  std::vector<float> plain(static_cast<size_t>((hi - lo) * V)), adapted(plain.size());
  e->logits_cached(std::span(canvas).first(hi), lo, hi, range(lo, hi), plain);
  e->set_draft_adapter(true);
  e->logits_cached(std::span(canvas).first(hi), lo, hi, range(lo, hi), adapted);
  e->set_draft_adapter(false);
  e->kv_cache_end();
  EXPECT_LT(rel_err(plain, ref_logits(dir, prefix, range(lo, hi), lo, V)), 1e-3);
  EXPECT_LT(rel_err(adapted, ref_logits(dir, prefix, range(lo, hi), lo, V, "--lora")), 1e-3);
  EXPECT_GT(rel_err(adapted, plain), 1e-2);  // the adapter changes the drafts
  // Generation: spec's drafts use it by default (the reference's trace), and text stays ar's.
  const auto prompt = test::ordinary_tokens(7, V, 61);
  const GenerateResult ar = generate(*e, prompt, mode_options(DecodeMode::Ar, 40, 8, 0.0f));
  for (const bool adapter : {true, false}) {
    GenerateOptions o = mode_options(DecodeMode::Spec, 40, 8, 0.0f);
    o.draft_adapter = adapter;
    const GenerateResult r = generate(*e, prompt, o);
    const json ref = ref_generate(dir, prompt, o);
    ASSERT_TRUE(ref.is_object());
    EXPECT_EQ(r.tokens, ref["tokens"].get<std::vector<int32_t>>()) << "adapter " << adapter;
    EXPECT_EQ(r.forwards, ref["forwards"].get<int64_t>()) << "adapter " << adapter;
    EXPECT_EQ(r.order, ref_order(ref)) << "adapter " << adapter;
    EXPECT_EQ(r.tokens, ar.tokens) << "adapter " << adapter;
  }
  // A model without one refuses it.
  TESSERA_TINY_OR_SKIP(plain_dir, "nemotron", kArgs);
  auto p = Engine::load(plain_dir);
  EXPECT_FALSE(p->supports_draft_adapter());
  test::expect_error([&] { p->set_draft_adapter(true); }, "no draft adapter");
}

// X^2 of `counts` (n samples) against the distribution `want`, bins with expected counts >= 5 apart and
// the rest merged, as the Wilson-Hilferty z of its chi-square distribution (z < 4.5: p > 3e-6).
double chi_square_z(const std::vector<int>& counts, const std::vector<double>& want, int n) {
  double x2 = 0, rest_o = 0, rest_e = 0;
  int bins = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = want[i] * n;
    if (e >= 5) {
      x2 += (counts[i] - e) * (counts[i] - e) / e;
      ++bins;
    } else {
      rest_o += counts[i];
      rest_e += e;
    }
  }
  if (rest_e > 0) {
    x2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
    ++bins;
  }
  const double k = bins - 1, h = 2.0 / (9.0 * k);
  return (std::cbrt(x2 / k) - (1.0 - h)) / std::sqrt(h);
}

// At temperature > 0 both of spec's rules keep the autoregressive distribution: the token after the
// seed (the drafted position) follows sum_x0 p(x0) p(x1 | x0), computed exactly from causal logits, as
// ar's samples do; a wrong expectation (another temperature) is rejected by the same test.
TEST(Nemotron, SpeculativeSamplingKeepsTheAutoregressiveDistribution) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size();
  const auto prompt = test::ordinary_tokens(5, V, 77);
  const auto P = static_cast<int32_t>(prompt.size());
  auto exact = [&](float T) {  // the distribution of the token at P + 1
    auto soft = [&](std::vector<float> l) {
      const float m = *std::max_element(l.begin(), l.end());
      double z = 0;
      std::vector<double> p(l.size());
      for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / T);
      for (double& x : p) x /= z;
      return p;
    };
    e->set_causal(true);
    std::vector<int32_t> c = prompt;
    c.push_back(e->mask_token());
    std::vector<float> l(static_cast<size_t>(V));
    e->logits(c, std::vector<int32_t>{P}, l);
    const std::vector<double> p0 = soft(l);
    std::vector<double> m(static_cast<size_t>(V), 0.0);
    c.push_back(e->mask_token());
    for (int64_t x0 = 0; x0 < V; ++x0) {
      if (p0[static_cast<size_t>(x0)] < 1e-7) continue;
      c[static_cast<size_t>(P)] = static_cast<int32_t>(x0);
      e->logits(c, std::vector<int32_t>{P + 1}, l);
      const std::vector<double> p1 = soft(l);
      for (int64_t x = 0; x < V; ++x)
        m[static_cast<size_t>(x)] += p0[static_cast<size_t>(x0)] * p1[static_cast<size_t>(x)];
    }
    e->set_causal(false);
    return m;
  };
  const float T = 0.7f;
  const std::vector<double> want = exact(T), other = exact(2.5f);
  const int n = 2500;
  for (const auto& [mode, rule] :
       {std::pair{DecodeMode::Ar, SpecSampling::Match}, std::pair{DecodeMode::Spec, SpecSampling::Match},
        std::pair{DecodeMode::Spec, SpecSampling::Rejection}}) {
    std::vector<int> counts(static_cast<size_t>(V), 0);
    for (int s = 0; s < n; ++s) {
      GenerateOptions o = mode_options(mode, 2, 3, 0.0f);
      o.temperature = T;
      o.spec_sampling = rule;
      o.seed = static_cast<uint64_t>(s);
      const GenerateResult r = generate(*e, prompt, o);
      ASSERT_EQ(r.tokens.size(), 2u);
      ++counts[static_cast<size_t>(r.tokens[1])];
    }
    const std::string what = std::string(name(mode)) + " " + std::string(name(rule));
    std::printf("%s: chi-square z %.2f against the exact distribution, %.2f against T = 2.5\n", what.c_str(),
                chi_square_z(counts, want, n), chi_square_z(counts, other, n));
    EXPECT_LT(chi_square_z(counts, want, n), 4.5) << what;
    EXPECT_GT(chi_square_z(counts, other, n), 8.0) << what << ": the test cannot tell another distribution";
  }
}

// Concurrent tri-mode requests through the batcher (causal and bidirectional forwards of different
// requests grouped apart) decide what each decides alone.
TEST(Nemotron, BatchedRequestsEqualAlone) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerateOptions> opts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(test::ordinary_tokens(4 + i, V, 300 + static_cast<uint64_t>(i)));
    const DecodeMode m = i % 3 == 0 ? DecodeMode::Ar : i % 3 == 1 ? DecodeMode::Spec : DecodeMode::Diffusion;
    opts.push_back(mode_options(m, 32, 8, 0.2f));
  }
  std::vector<GenerateResult> alone;
  for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(generate(*e, prompts[i], opts[i]));
  Batcher b(*e, 8, std::chrono::milliseconds(5));
  std::vector<GenerateResult> got(prompts.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] { got[i] = b.generate(prompts[i], opts[i]); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].order, alone[i].order) << "request " << i;
  }
  EXPECT_GT(b.stats().forwards, 0);
}

// The GGUF form (tools/gguf/hf_to_gguf.py, architecture "nemotron-diffusion"; needs llama.cpp's gguf-py from
// scripts/fetch_llamacpp.sh): the same configuration (YaRN, the query scale, tri-mode, the block), the
// checkpoint's logits in both attention modes, and the same tokens in every mode.
TEST(Nemotron, GgufFormIsTheCheckpoint) {
  const std::filesystem::path gguf_py = test::source_dir() / ".llamacpp/gguf-py";
  if (!std::filesystem::exists(gguf_py))
    GTEST_SKIP() << ".llamacpp/gguf-py is absent (run scripts/fetch_llamacpp.sh): no converter to test";
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  const std::filesystem::path file = test::temp_dir("nemotron_gguf") / "tiny.gguf";
  std::string log;
  ASSERT_EQ(test::run_command(
                test::python() + " " + (test::source_dir() / "tools/gguf/hf_to_gguf.py").string() + " " +
                    dir.string() + " " + file.string() + " --quiet --gguf-py " + gguf_py.string(),
                &log),
            0)
      << log;
  const ModelConfig want = load_config(dir), got = load_config(file);
  EXPECT_STREQ(family_name(got.family), "nemotron-diffusion");
  EXPECT_TRUE(got.tri_mode);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.diffusion_block, want.diffusion_block);
  EXPECT_FLOAT_EQ(got.rope_scaling.factor, want.rope_scaling.factor);
  EXPECT_FLOAT_EQ(got.rope_scaling.attn_factor, want.rope_scaling.attn_factor);
  EXPECT_FLOAT_EQ(got.rope_scaling.llama4_beta, want.rope_scaling.llama4_beta);
  EXPECT_EQ(got.rope_scaling.original_max, want.rope_scaling.original_max);
  EXPECT_EQ(got.mask_id, want.mask_id);
  EXPECT_EQ(got.eos_id, want.eos_id);
  auto a = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  auto b = Engine::load(file, EngineOptions{.precision = Precision::F32});
  const int64_t V = a->vocab_size(), n = 100;  // past original_max 64: the query scale too
  const auto canvas = test::random_canvas(n, V, 23, a->mask_token(), 0.3);
  for (const bool causal : {false, true}) {
    a->set_causal(causal);
    b->set_causal(causal);
    const auto rows = range(causal ? 1 : 0, static_cast<int32_t>(n));
    std::vector<float> la(rows.size() * static_cast<size_t>(V)), lb(la.size());
    a->logits(canvas, rows, la);
    b->logits(canvas, rows, lb);
    EXPECT_LT(rel_err(lb, la), 1e-6) << (causal ? "causal" : "bidirectional");
  }
  a->set_causal(false);
  b->set_causal(false);
  const auto prompt = test::ordinary_tokens(7, V, 61);
  for (const DecodeMode m : {DecodeMode::Ar, DecodeMode::Diffusion, DecodeMode::Spec}) {
    const GenerateOptions o = mode_options(m, 32, 8, m == DecodeMode::Spec ? 0.0f : 0.2f);
    const GenerateResult ra = generate(*a, prompt, o), rb = generate(*b, prompt, o);
    EXPECT_EQ(rb.tokens, ra.tokens) << name(m);
    EXPECT_EQ(rb.forwards, ra.forwards) << name(m);
  }
  // Metadata the family cannot run is refused by key.
  const auto edited = [&](const std::string& key, const GgufValue& v) {
    const auto g = GgufFile::open(file);
    std::vector<std::pair<std::string, GgufValue>> kv(g->metadata().begin(), g->metadata().end());
    for (auto& [k, x] : kv)
      if (k == key) x = v;
    std::vector<GgufWriteTensor> t;
    for (const GgufTensor& x : g->tensors()) t.push_back({x.name, x.ne, x.type, {x.data, x.data + x.bytes}});
    const std::filesystem::path out = file.parent_path() / "edited.gguf";
    write_gguf(out, kv, t);
    return out;
  };
  GgufValue longrope{.type = GgufValue::String};
  longrope.s = "longrope";
  test::expect_error([&] { load_config(edited("nemotron-diffusion.rope.scaling.type", longrope)); },
                     "RoPE scaling 'longrope' (nemotron-diffusion.rope.scaling.type) is not supported");
  GgufValue shift{.type = GgufValue::Bool};
  shift.i = 1;
  test::expect_error([&] { load_config(edited("diffusion.shift_logits", shift)); }, "does not shift");
}

// The bundled trained tri-mode model (models/tessera-tiny-tri, tools/train: joint AR + block-diffusion
// objective): on held-out prompts greedy spec writes ar's tokens, in fewer forwards: its drafts are accepted
// (more than two tokens per draft + verify cycle on average; docs/PERF.md has the figures).
TEST(Nemotron, TrainedModelSpeculatesLosslesslyInFewerForwards) {
  const std::filesystem::path dir = test::source_dir() / "models/tessera-tiny-tri";
  auto e = Engine::load(dir);
  const Tokenizer tok = load_model_tokenizer(dir);
  const auto seqs = eval::load_heldout(test::source_dir() / "models/heldout.jsonl", tok, 24, 8);
  ASSERT_EQ(seqs.size(), 8u);
  int64_t tokens = 0, ar_forwards = 0, spec_forwards = 0;
  for (const auto& prompt : seqs) {
    const GenerateOptions ar = mode_options(DecodeMode::Ar, 48, 32, 0.0f);
    const GenerateResult want = generate(*e, prompt, ar);
    GenerateOptions sp = ar;
    sp.mode = DecodeMode::Spec;
    const GenerateResult got = generate(*e, prompt, sp);
    EXPECT_EQ(got.tokens, want.tokens);
    tokens += static_cast<int64_t>(want.tokens.size());
    ar_forwards += want.forwards;
    spec_forwards += got.forwards;
  }
  std::printf("tessera-tiny-tri, 8 held-out prompts x 48 tokens, block 32: forwards ar %lld, spec %lld\n",
              static_cast<long long>(ar_forwards), static_cast<long long>(spec_forwards));
  EXPECT_EQ(ar_forwards, tokens);
  EXPECT_LT(spec_forwards, ar_forwards);
}

// A format over token ids for the test below: the k-th token of the answer must be k mod 3 (mod 3); EOS
// only once at least `min` tokens are written, then only EOS.
class ModThree final : public TokenConstraint {
 public:
  ModThree(int32_t eos, int64_t min) : eos_(eos), min_(min) {}
  class S final : public State {
   public:
    S(int32_t eos, int64_t min) : eos_(eos), min_(min) {}
    std::unique_ptr<State> clone() const override { return std::make_unique<S>(*this); }
    bool allows(int32_t t, int64_t left) const override {
      if (ended_ || t == eos_) return t == eos_ && (ended_ || n_ >= min_);
      return t % 3 == n_ % 3 && left >= std::max<int64_t>(0, min_ - n_ - 1);
    }
    void take(int32_t t) override {
      if (t == eos_)
        ended_ = true;
      else
        ++n_;
    }
    bool complete() const override { return n_ >= min_; }
    int64_t min_tokens() const override { return std::max<int64_t>(0, min_ - n_); }

   private:
    int32_t eos_;
    int64_t min_, n_ = 0;
    bool ended_ = false;
  };
  std::unique_ptr<State> start() const override { return std::make_unique<S>(eos_, min_); }

 private:
  int32_t eos_;
  int64_t min_;
};

// Structured output in mode ar: every step samples among the tokens the format allows. At temperature 0
// that is the argmax of the causal logits over the allowed tokens, computed here from whole logit rows;
// at temperature > 0 every token obeys the format; diffusion and spec refuse a format.
TEST(Nemotron, AutoregressiveStructuredOutputKeepsTheFormat) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const int64_t V = e->vocab_size();
  const int32_t eos = e->config().eos_id;
  const auto fmt = std::make_shared<ModThree>(eos, 5);
  for (uint64_t s = 0; s < 3; ++s) {
    const auto prompt = test::ordinary_tokens(4 + static_cast<int64_t>(s), V, 700 + s);
    GenerateOptions o = mode_options(DecodeMode::Ar, 12, 8, 0.0f);
    o.constraint = fmt;
    o.eos_ids = {eos};
    o.stop_at_eos = true;
    const GenerateResult r = generate(*e, prompt, o);
    // The reference: greedy over the allowed tokens, one causal forward over the whole text per token.
    std::vector<int32_t> text(prompt.begin(), prompt.end());
    auto st = fmt->start();
    e->set_causal(true);
    std::vector<float> row(static_cast<size_t>(V));
    for (int k = 0; k < o.gen_length; ++k) {
      text.push_back(e->mask_token());
      e->logits(text, std::vector<int32_t>{static_cast<int32_t>(text.size() - 1)}, row);
      int32_t best = -1;
      for (int32_t t = 0; t < V; ++t)
        if (st->allows(t, o.gen_length - k - 1) &&
            (best < 0 || row[static_cast<size_t>(t)] > row[static_cast<size_t>(best)]))
          best = t;
      ASSERT_GE(best, 0);
      text.back() = best;
      st->take(best);
      if (best == eos) break;
    }
    e->set_causal(false);
    std::vector<int32_t> want(text.begin() + static_cast<int64_t>(prompt.size()), text.end());
    if (want.back() == eos) want.pop_back();  // the answer ends before its EOS
    EXPECT_EQ(r.tokens, want) << "prompt " << s;
    // Sampled: every token of the answer obeys the format.
    o.temperature = 1.0f;
    o.seed = s;
    const GenerateResult t = generate(*e, prompt, o);
    auto check = fmt->start();
    for (size_t i = 0; i < t.tokens.size() && !(i > 0 && t.tokens[i - 1] == eos); ++i) {
      EXPECT_TRUE(check->allows(t.tokens[i], static_cast<int64_t>(t.tokens.size() - i - 1))) << "token " << i;
      check->take(t.tokens[i]);
    }
    for (const DecodeMode m : {DecodeMode::Diffusion, DecodeMode::Spec}) {
      GenerateOptions bad = mode_options(m, 12, 8, 0.0f);
      bad.constraint = fmt;
      test::expect_error([&] { generate(*e, prompt, bad); },
                         "structured output on a tri-mode model needs mode ar");
    }
  }
}

// `tessera plan --mode`: the mode's forwards against the causal KV cache of the whole context (the cache
// hand-computed: K and V of 26 layers x 8 KV heads x 128, bf16, per token), planned and chunked to a budget;
// L_max is exact at its edge (that context fits, one more token does not); and the refusals.
TEST(Nemotron, PlanCoversEveryForwardOfAMode) {
  const std::string bin = std::string(TESSERA_BINARY) + " plan --geometry nemotron-diffusion-3b ";
  const auto plan = [&](const std::string& args) {
    std::string out;
    EXPECT_EQ(test::run_command(bin + args + " --json", &out), 0) << out;
    const json j = json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j;
  };
  const int64_t per_token = 2 * 26 * 8 * 128 * 2;
  const std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> want = {
      {"ar", {{8192, 1}, {1, 1}}},
      {"diffusion", {{8192, 1}, {32, 32}, {32, 1}}},
      {"spec", {{8192, 1}, {32, 32}, {32, 32}}}};
  for (const auto& [mode, forwards] : want) {
    const json j = plan("--context 8192 --mode " + mode);
    if (j.is_discarded()) continue;
    EXPECT_EQ(j["kv_cache_bytes"].get<int64_t>(), per_token * 8192) << mode;
    ASSERT_EQ(j["forwards"].size(), forwards.size()) << mode;
    for (size_t i = 0; i < forwards.size(); ++i) {
      const json& f = j["forwards"][i];
      EXPECT_EQ(f["rows"].get<int64_t>(), forwards[i].first) << mode << " " << f["forward"];
      EXPECT_EQ(f["logit_rows"].get<int64_t>(), forwards[i].second) << mode << " " << f["forward"];
      EXPECT_EQ(f["keys"].get<int64_t>(), 8192) << mode;
      EXPECT_GT(f["unchunked"]["peak_bytes"].get<int64_t>(), 0) << mode;
    }
    // The prefill over the whole context is the largest forward; a step reads every key.
    EXPECT_GT(j["forwards"][0]["unchunked"]["peak_bytes"].get<int64_t>(),
              j["forwards"][1]["unchunked"]["peak_bytes"].get<int64_t>());
  }
  const json b = plan("--context 32768 --mode spec --budget 12GiB");
  ASSERT_FALSE(b.is_discarded());
  EXPECT_TRUE(b["fits"].get<bool>());
  EXPECT_GT(b["forwards"][0]["k_ffn"].get<int64_t>(), 1);  // the prefill is chunked to fit
  const int64_t l_max = b["l_max"].get<int64_t>();
  EXPECT_GT(l_max, 32768);
  std::string out;
  EXPECT_EQ(test::run_command(bin + "--mode spec --budget 12GiB --context " + std::to_string(l_max), &out), 0)
      << out;
  EXPECT_EQ(
      test::run_command(bin + "--mode spec --budget 12GiB --context " + std::to_string(l_max + 1), &out), 3)
      << out;
  // One rank's share under --tp 2 (its 4 of 8 key / value heads: half the cache; the LM head's half of the
  // vocabulary: a smaller step) plans the same forwards.
  const json one = plan("--context 8192 --mode spec"), half = plan("--context 8192 --mode spec --tp 2");
  if (!one.is_discarded() && !half.is_discarded()) {
    EXPECT_EQ(half["kv_cache_bytes"].get<int64_t>(), per_token * 8192 / 2);
    ASSERT_EQ(half["forwards"].size(), one["forwards"].size());
    EXPECT_LT(half["forwards"][1]["unchunked"]["peak_bytes"].get<int64_t>(),
              one["forwards"][1]["unchunked"]["peak_bytes"].get<int64_t>());
    EXPECT_LT(half["weight_bytes"].get<int64_t>(), one["weight_bytes"].get<int64_t>() * 6 / 10);
  }
  test::expect_command_error(std::string(TESSERA_BINARY) + " plan --geometry llada-8b --context 64 --mode ar",
                             "has one mode");
  test::expect_command_error(bin + "--context 64 --mode ar --cache prefix",
                             "--cache and --sparse-block do not apply");
  test::expect_command_error(bin + "--context 64 --mode ar --svg /tmp/x.svg",
                             "does not draw --mode's forwards");
}

TEST(Nemotron, ErrorsAreClear) {
  TESSERA_TINY_OR_SKIP(dir, "nemotron", kArgs);
  TESSERA_TINY_OR_SKIP(llada, "llada", "--seed 1");
  auto e = Engine::load(dir);
  const auto prompt = test::ordinary_tokens(6, e->vocab_size(), 1);
  GenerateOptions o = mode_options(DecodeMode::Ar, 16, 8, 0.0f);
  GenerateOptions cached = o;
  cached.cache = KvCache::Prefix;
  test::expect_error([&] { generate(*e, prompt, cached); }, "tri-mode decoding keeps its own cache");
  test::expect_error([&] { generate(*e, std::vector<int32_t>{}, o); }, "at least one token");
  GenerateOptions rej = o;
  rej.spec_sampling = SpecSampling::Rejection;
  test::expect_error([&] { generate(*e, prompt, rej); }, "spec-sampling rejection applies to mode spec");
  rej.mode = DecodeMode::Spec;
  rej.draft_threshold = 0.5f;
  test::expect_error([&] { generate(*e, prompt, rej); }, "drafts in one pass");
  e->set_causal(true);
  std::vector<float> out(static_cast<size_t>(e->vocab_size()));
  test::expect_error([&] { e->logits(prompt, std::vector<int32_t>{0}, out); }, "predicts no position 0");
  e->set_causal(false);
  auto l = Engine::load(llada);
  test::expect_error([&] { generate(*l, prompt, o); }, "need a tri-mode model");
  test::expect_error([&] { l->set_causal(true); }, "has no causal mode");
  // A config the family cannot run is refused by name.
  test::expect_config_error(
      dir, "sliding_window", [](json& c) { c["sliding_window"] = 4096; },
      "field 'sliding_window' is not supported");
  test::expect_config_error(
      dir, "rope_type", [](json& c) { c["rope_parameters"]["rope_type"] = "longrope"; }, "is not supported");
}

}  // namespace
}  // namespace tessera
