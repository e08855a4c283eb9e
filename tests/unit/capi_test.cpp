// The C API (include/tessera/tessera.h) on the bundled tessera-tiny: its answers against the engine
// underneath (a Session run with the same options), its statuses and messages, the step events,
// cancellation, batches, log-probabilities, editing and the memory plan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "runtime/session.h"
#include "tessera/tessera.h"
#include "tiny_models.h"

namespace {

std::string tiny_path() {
  return (std::filesystem::path(TESSERA_SOURCE_DIR) / "models" / "tessera-tiny").string();
}

// One model for the whole test binary (opening it is the slow part).
tessera_model* tiny() {
  static tessera_model* m = [] {
    tessera_model* out = nullptr;
    const tessera_status s = tessera_model_open(tiny_path().c_str(), nullptr, &out);
    EXPECT_EQ(s, TESSERA_OK) << tessera_last_error();
    return out;
  }();
  return m;
}

std::vector<int32_t> raw_prompt(tessera_model* m, const char* text) {
  const tessera_chat_message msg{"user", text};
  std::vector<int32_t> ids(256);
  size_t n = 0;
  EXPECT_EQ(tessera_prompt_tokens(m, &msg, 1, 0, ids.data(), ids.size(), &n), TESSERA_OK)
      << tessera_last_error();
  ids.resize(n);
  return ids;
}

tessera_generate_options options(tessera_model* m, int gen_length, int steps) {
  tessera_generate_options o;
  EXPECT_EQ(tessera_generate_options_init(m, &o), TESSERA_OK);
  o.gen_length = gen_length;
  o.steps = steps;
  return o;
}

std::vector<int32_t> tokens_of(const tessera_result* r) {
  const int32_t* ids = nullptr;
  const size_t n = tessera_result_tokens(r, &ids);
  return {ids, ids + n};
}

// The same request through the engine underneath, as the CLI runs it.
std::vector<int32_t> session_tokens(const std::vector<int32_t>& prompt, int gen_length, int steps,
                                    tessera::GenerateResult* full = nullptr) {
  static tessera::Session s([] {
    tessera::LoadOptions lo;
    lo.model = tiny_path();
    return lo;
  }());
  tessera::GenerateOptions g = s.defaults(gen_length, std::nullopt, steps);
  const auto out = s.run(prompt, g, {});
  if (full != nullptr) *full = out.result;
  return out.result.tokens;
}

TEST(CApi, VersionAndStatusNames) {
  EXPECT_STREQ(tessera_version(), TESSERA_VERSION_STRING);
  EXPECT_STREQ(tessera_status_name(TESSERA_ERROR_MEMORY_BUDGET), "memory budget exceeded");
}

TEST(CApi, ParseSizeTakesTheCliSyntax) {
  uint64_t b = 0;
  ASSERT_EQ(tessera_parse_size("1.5GB", &b), TESSERA_OK);
  EXPECT_EQ(b, 1500000000u);
  ASSERT_EQ(tessera_parse_size("2GiB", &b), TESSERA_OK);
  EXPECT_EQ(b, uint64_t{2} << 30);
  EXPECT_EQ(tessera_parse_size("lots", &b), TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("lots"), std::string::npos) << tessera_last_error();
}

TEST(CApi, OpenRefusesBadModelsAndParamsWithAMessage) {
  tessera_model* m = reinterpret_cast<tessera_model*>(0x1);
  EXPECT_EQ(tessera_model_open("/nonexistent/model", nullptr, &m), TESSERA_ERROR_MODEL);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(tessera_last_error()).find("/nonexistent/model"), std::string::npos)
      << tessera_last_error();
  tessera_model_params p;
  tessera_model_params_init(&p);
  p.device = "tpu";
  EXPECT_EQ(tessera_model_open(tiny_path().c_str(), &p, &m), TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("device"), std::string::npos);
  tessera_model_params_init(&p);
  p.struct_size = sizeof p + 8;  // a newer header than this library
  EXPECT_EQ(tessera_model_open(tiny_path().c_str(), &p, &m), TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(tessera_model_open(tiny_path().c_str(), nullptr, nullptr), TESSERA_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, LastErrorIsPerThread) {
  tessera_model* m = nullptr;
  ASSERT_EQ(tessera_model_open("/nonexistent/a", nullptr, &m), TESSERA_ERROR_MODEL);
  std::string other;
  std::thread t([&] {
    tessera_model* n = nullptr;
    tessera_model_open("/nonexistent/b", nullptr, &n);
    other = tessera_last_error();
  });
  t.join();
  EXPECT_NE(std::string(tessera_last_error()).find("/nonexistent/a"), std::string::npos);
  EXPECT_NE(other.find("/nonexistent/b"), std::string::npos);
}

TEST(CApi, InfoTokenizeDetokenize) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  tessera_model_info i{};
  i.struct_size = sizeof i;
  ASSERT_EQ(tessera_model_info_get(m, &i), TESSERA_OK);
  EXPECT_EQ(i.vocab_size, 4096);
  EXPECT_EQ(i.mask_token, 4090);
  EXPECT_EQ(i.eos_token, 4088);
  EXPECT_STREQ(i.family, "llada");
  EXPECT_GT(i.weight_bytes, 0u);

  size_t n = 0;
  EXPECT_EQ(tessera_tokenize(m, "Once upon a time", nullptr, 0, &n), TESSERA_ERROR_BUFFER_TOO_SMALL);
  ASSERT_GT(n, 0u);
  std::vector<int32_t> ids(n);
  ASSERT_EQ(tessera_tokenize(m, "Once upon a time", ids.data(), ids.size(), &n), TESSERA_OK);
  char text[64];
  size_t len = 0;
  ASSERT_EQ(tessera_detokenize(m, ids.data(), ids.size(), 1, text, sizeof text, &len), TESSERA_OK);
  EXPECT_STREQ(text, "Once upon a time");
  EXPECT_EQ(len, std::strlen("Once upon a time"));
  // Too small by the NUL: nothing written, the size needed given.
  char small[16] = "untouched";
  EXPECT_EQ(tessera_detokenize(m, ids.data(), ids.size(), 1, small, 16, &len),
            TESSERA_ERROR_BUFFER_TOO_SMALL);
  EXPECT_STREQ(small, "untouched");
  EXPECT_EQ(len, 16u);
  const int32_t bad = 99999;
  EXPECT_EQ(tessera_detokenize(m, &bad, 1, 0, text, sizeof text, &len), TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("99999"), std::string::npos);
  EXPECT_EQ(tessera_tokenize(m, "\xff\xfe", ids.data(), ids.size(), &n), TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("UTF-8"), std::string::npos);
}

TEST(CApi, GenerateIsTheEnginesAnswer) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const auto prompt = raw_prompt(m, "Once upon a time");
  const auto o = options(m, 32, 16);
  tessera_result* r = nullptr;
  ASSERT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r), TESSERA_OK)
      << tessera_last_error();
  tessera::GenerateResult ref;
  EXPECT_EQ(tokens_of(r), session_tokens(prompt, 32, 16, &ref));
  tessera_result_stats st{};
  st.struct_size = sizeof st;
  tessera_result_stats_get(r, &st);
  EXPECT_EQ(st.steps, ref.steps_run);
  EXPECT_EQ(st.prompt_tokens, prompt.size());
  EXPECT_GT(st.seconds, 0);
  // The text is the tokens' text; an answer shorter than gen_length ended at an EOS.
  char text[1024];
  size_t len = 0;
  const auto ids = tokens_of(r);
  ASSERT_EQ(tessera_detokenize(m, ids.data(), ids.size(), 1, text, sizeof text, &len), TESSERA_OK);
  EXPECT_STREQ(tessera_result_text(r), text);
  EXPECT_EQ(tessera_result_finish_reason(r), ids.size() < 32 ? TESSERA_FINISH_STOP : TESSERA_FINISH_LENGTH);
  tessera_result_free(r);
}

struct Recorder {
  std::vector<tessera_step_event> events;
  std::vector<std::vector<int32_t>> canvases;
  int cancel_at = -1;
};

int32_t record(const tessera_step_event* ev, void* user) {
  auto* rec = static_cast<Recorder*>(user);
  rec->events.push_back(*ev);
  rec->canvases.emplace_back(ev->canvas, ev->canvas + ev->canvas_len);
  return ev->step == rec->cancel_at ? 1 : 0;
}

TEST(CApi, StepEventsShowTheCanvasDenoising) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const auto prompt = raw_prompt(m, "The little dog");
  auto o = options(m, 32, 16);
  o.stop_at_eos = 0;  // every step runs: the last canvas holds the whole answer
  Recorder rec;
  tessera_result* r = nullptr;
  ASSERT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, record, &rec, &r), TESSERA_OK);
  tessera_result_stats st{};
  st.struct_size = sizeof st;
  tessera_result_stats_get(r, &st);
  ASSERT_EQ(static_cast<int>(rec.events.size()), st.steps);
  EXPECT_GT(st.first_step_seconds, 0);
  int32_t masked_before = 32;
  for (size_t k = 0; k < rec.events.size(); ++k) {
    const auto& ev = rec.events[k];
    EXPECT_EQ(ev.step, static_cast<int32_t>(k));
    EXPECT_EQ(ev.prompt_len, prompt.size());
    EXPECT_EQ(ev.mask_token, 4090);
    const auto& c = rec.canvases[k];
    ASSERT_EQ(c.size(), prompt.size() + 32);
    int32_t masked = 0;
    for (size_t p = prompt.size(); p < c.size(); ++p) masked += c[p] == 4090;
    // Each step decides its positions (32 tokens in 16 steps: 2 each), and committed is final.
    EXPECT_EQ(masked, masked_before - static_cast<int32_t>(ev.n_decided));
    masked_before = masked;
    for (int32_t p = static_cast<int32_t>(prompt.size()); p < ev.committed; ++p) EXPECT_NE(c[p], 4090);
  }
  EXPECT_EQ(masked_before, 0);
  const std::vector<int32_t> last(rec.canvases.back().begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                  rec.canvases.back().end());
  EXPECT_EQ(last, tokens_of(r));
  tessera_result_free(r);
}

TEST(CApi, CallbackCancelsAndTheModelStaysUsable) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const auto prompt = raw_prompt(m, "Once upon a time");
  const auto o = options(m, 32, 16);
  Recorder rec;
  rec.cancel_at = 2;
  tessera_result* r = reinterpret_cast<tessera_result*>(0x1);
  EXPECT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, record, &rec, &r), TESSERA_ERROR_CANCELLED);
  EXPECT_EQ(r, nullptr);
  EXPECT_EQ(rec.events.size(), 3u);  // steps 0, 1, 2: the third answered stop
  ASSERT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r), TESSERA_OK);
  EXPECT_EQ(tokens_of(r), session_tokens(prompt, 32, 16));
  tessera_result_free(r);
}

TEST(CApi, BatchGivesEachPromptItsAnswerAlone) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const std::vector<std::vector<int32_t>> prompts = {raw_prompt(m, "Once upon a time"),
                                                     raw_prompt(m, "The cat"),
                                                     raw_prompt(m, "Lily and Ben went to the park")};
  std::vector<const int32_t*> ptrs;
  std::vector<size_t> lens;
  for (const auto& p : prompts) {
    ptrs.push_back(p.data());
    lens.push_back(p.size());
  }
  const auto o = options(m, 32, 16);
  Recorder rec;
  std::vector<tessera_result*> out(3, nullptr);
  ASSERT_EQ(tessera_generate_batch(m, ptrs.data(), lens.data(), 3, &o, record, &rec, out.data()), TESSERA_OK)
      << tessera_last_error();
  size_t events[3] = {0, 0, 0};
  for (const auto& ev : rec.events) ++events[ev.sequence];
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_NE(out[i], nullptr);
    EXPECT_EQ(tokens_of(out[i]), session_tokens(prompts[i], 32, 16)) << "prompt " << i;
    tessera_result_stats st{};
    st.struct_size = sizeof st;
    tessera_result_stats_get(out[i], &st);
    EXPECT_EQ(static_cast<int>(events[i]), st.steps) << "prompt " << i;
    tessera_result_free(out[i]);
  }
  // A bad prompt fails the batch before any work, naming it; every result stays NULL.
  const int32_t bad[] = {1, 99999};
  ptrs[1] = bad;
  lens[1] = 2;
  EXPECT_EQ(tessera_generate_batch(m, ptrs.data(), lens.data(), 3, &o, nullptr, nullptr, out.data()),
            TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("99999"), std::string::npos);
  for (auto* r : out) EXPECT_EQ(r, nullptr);
}

TEST(CApi, CallsFromSeveralThreadsOnOneModelGiveTheirAnswersAlone) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const std::vector<std::vector<int32_t>> prompts = {raw_prompt(m, "Once upon a time"),
                                                     raw_prompt(m, "The cat"), raw_prompt(m, "Lily and Ben"),
                                                     raw_prompt(m, "One day")};
  const auto o = options(m, 32, 16);
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<tessera_status> status(prompts.size(), TESSERA_ERROR_INTERNAL);
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] {
      tessera_result* r = nullptr;
      status[i] = tessera_generate(m, prompts[i].data(), prompts[i].size(), &o, nullptr, nullptr, &r);
      got[i] = tokens_of(r);
      tessera_result_free(r);
      // Read-only calls while the others generate.
      size_t n = 0;
      int32_t ids[64];
      tessera_tokenize(m, "Once upon a time", ids, 64, &n);
      tessera_generate_options d;
      tessera_generate_options_init(m, &d);
    });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(status[i], TESSERA_OK) << i;
    EXPECT_EQ(got[i], session_tokens(prompts[i], 32, 16)) << "prompt " << i;
  }
}

TEST(CApi, LogprobsAreThoseOfTheDecidingStep) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const auto prompt = raw_prompt(m, "Once upon a time");
  auto o = options(m, 16, 16);
  o.logprobs = 3;
  o.temperature = 0.0f;  // greedy (the bundled model's default samples at 0.8)
  tessera_result* r = nullptr;
  ASSERT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r), TESSERA_OK);
  const auto ids = tokens_of(r);
  ASSERT_FALSE(ids.empty());
  for (size_t i = 0; i < ids.size(); ++i) {
    float lp = 0;
    int32_t step = -1;
    const tessera_top_logprob* top = nullptr;
    ASSERT_EQ(tessera_result_logprob(r, i, &lp, &step, &top), 3u);
    EXPECT_LE(lp, 0.0f);
    EXPECT_GE(step, 0);
    // Greedy: the chosen token is the most likely one at its step.
    EXPECT_EQ(top[0].token, ids[i]);
    EXPECT_FLOAT_EQ(top[0].logprob, lp);
    EXPECT_GE(top[0].logprob, top[1].logprob);
  }
  float lp = 0;
  EXPECT_EQ(tessera_result_logprob(r, ids.size(), &lp, nullptr, nullptr), 0u);
  EXPECT_TRUE(std::isnan(lp));
  tessera_result_free(r);
}

TEST(CApi, BadOptionsAreRefusedWithTheEnginesMessage) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const auto prompt = raw_prompt(m, "Once");
  tessera_result* r = nullptr;
  auto o = options(m, 32, 16);
  o.alg = 9;
  EXPECT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r),
            TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("alg"), std::string::npos);
  o = options(m, 32, 16);
  o.block_length = 5;  // 32 is not a multiple of it
  EXPECT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r),
            TESSERA_ERROR_INVALID_ARGUMENT);
  o = options(m, 4096, 128);  // beyond the context (128 blocks of 32, a step each)
  EXPECT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r),
            TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("context"), std::string::npos) << tessera_last_error();
  EXPECT_EQ(tessera_generate_options_edit_preset(&o, "fast"), TESSERA_ERROR_INVALID_ARGUMENT);
  o = options(m, 32, 16);
  ASSERT_EQ(tessera_generate_options_edit_preset(&o, "quality"), TESSERA_OK);
  EXPECT_EQ(o.edit, 1);
  EXPECT_FLOAT_EQ(o.threshold, 0.7f);
  EXPECT_FLOAT_EQ(o.edit_threshold, 0.5f);
  EXPECT_EQ(r, nullptr);
}

TEST(CApi, PlanGivesTheLargestStepAndRefusesAnImpossibleBudget) {
  tessera_model* m = tiny();
  ASSERT_NE(m, nullptr);
  const auto o = options(m, 64, 64);
  tessera_memory_plan p{};
  p.struct_size = sizeof p;
  ASSERT_EQ(tessera_plan(m, 10, &o, &p), TESSERA_OK) << tessera_last_error();
  EXPECT_EQ(p.canvas, 74);
  EXPECT_EQ(p.logit_rows, 32);  // the model's block of 32 (generation_config.json)
  EXPECT_EQ(p.kv_cache_rows, 0);
  EXPECT_GT(p.activation_bytes, 0u);
  EXPECT_LE(p.lower_bound_bytes, p.activation_bytes);
  EXPECT_EQ(p.k_ffn, 1);
  EXPECT_EQ(p.shares_forwards, 1);

  tessera_model_params params;
  tessera_model_params_init(&params);
  tessera_model_info i{};
  i.struct_size = sizeof i;
  ASSERT_EQ(tessera_model_info_get(m, &i), TESSERA_OK);
  params.memory_budget = i.weight_bytes + 1024;  // no room for a step
  tessera_model* small = nullptr;
  ASSERT_EQ(tessera_model_open(tiny_path().c_str(), &params, &small), TESSERA_OK) << tessera_last_error();
  EXPECT_EQ(tessera_plan(small, 10, &o, &p), TESSERA_ERROR_MEMORY_BUDGET);
  EXPECT_NE(std::string(tessera_last_error()).find("memory budget"), std::string::npos);
  const auto prompt = raw_prompt(small, "Once");
  tessera_result* r = nullptr;
  EXPECT_EQ(tessera_generate(small, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r),
            TESSERA_ERROR_MEMORY_BUDGET);
  tessera_model_close(small);
}

// A uniform-noise model (DiffusionGemma): the defaults are its mode and generation_config.json's sampler, the
// sampler's fields reach the engine (the Session's tokens with the same values), and a bad one is refused.
TEST(CApi, UniformModelsTakeTheirSamplerFields) {
  TESSERA_TINY_OR_SKIP(dir, "diffusion_gemma", "--dtype f32 --seed 2");
  tessera_model* m = nullptr;
  ASSERT_EQ(tessera_model_open(dir.c_str(), nullptr, &m), TESSERA_OK) << tessera_last_error();
  tessera_generate_options o;
  ASSERT_EQ(tessera_generate_options_init(m, &o), TESSERA_OK);
  EXPECT_EQ(o.mode, TESSERA_MODE_UNIFORM);
  EXPECT_DOUBLE_EQ(o.t_min, 0.4);  // the tiny checkpoint's generation_config.json
  EXPECT_DOUBLE_EQ(o.entropy_bound, 0.1);
  EXPECT_DOUBLE_EQ(o.confidence, 0.005);
  o.gen_length = 16;
  o.seed = 4;
  o.t_min = 0.2;
  o.t_max = 0.5;
  o.entropy_bound = 0.3;
  o.stability = 2;
  const std::vector<int32_t> prompt = {5, 9, 3, 10};
  tessera_result* r = nullptr;
  ASSERT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r), TESSERA_OK)
      << tessera_last_error();
  tessera::LoadOptions lo;
  lo.model = dir.string();
  tessera::Session s(lo);
  tessera::GenerateOptions g = s.defaults(16, std::nullopt, std::nullopt);
  g.seed = 4;
  g.uniform.t_min = 0.2;
  g.uniform.t_max = 0.5;
  g.uniform.entropy_bound = 0.3;
  g.uniform.stability = 2;
  EXPECT_EQ(tokens_of(r), s.run(prompt, g, {}).result.tokens);
  tessera_result_free(r);
  o.stability = 99;
  EXPECT_EQ(tessera_generate(m, prompt.data(), prompt.size(), &o, nullptr, nullptr, &r),
            TESSERA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tessera_last_error()).find("stability must be in [0, 64]"), std::string::npos)
      << tessera_last_error();
  tessera_model_close(m);
}

}  // namespace
