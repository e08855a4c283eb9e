// The tessera CLI end to end: the golden stories260K command, and every bad input gets a clear
// one-line error and a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/llama2c.h"
#include "io/tokenizer.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

std::string tessera_bin() {
  return TESSERA_BINARY;
}

// " -m DIR" of the bundled tessera-tiny, named explicitly (not the CLI's default model).
std::string tiny_model() {
  return " -m " + (test::source_dir() / "models" / "tessera-tiny").string();
}

std::filesystem::path stories_dir() {
  static std::filesystem::path dir;
  if (dir.empty()) {
    dir = test::temp_dir("cli_stories");
    const auto src = test::shared_dir() / "models/stories260K";
    std::string out;
    EXPECT_EQ(test::run_command(tessera_bin() + " convert-llama2c " + (src / "stories260K.bin").string() +
                                    " " + (src / "tok512.bin").string() + " " + dir.string(),
                                &out),
              0)
        << out;
  }
  return dir;
}

TEST(Cli, GoldenStoriesCommandPrintsTheGoldenText) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  const auto dir = stories_dir();
  const auto out_file = dir / "stdout.txt";
  std::string log;
  ASSERT_EQ(
      test::run_command("(" + tessera_bin() + " generate -m " + dir.string() +
                            " -p \"\" --gen-length 256 --block-length 1 --steps 256 --temperature 0 2>" +
                            (dir / "stderr.txt").string() + " >" + out_file.string() + ")",
                        &log),
      0)
      << log;
  std::ifstream f(out_file);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::ifstream r(test::shared_dir() / "models/stories260K/README.md");
  std::string readme((std::istreambuf_iterator<char>(r)), std::istreambuf_iterator<char>());
  const size_t a = readme.find("```\n", readme.find("Golden output")) + 4;
  const std::string golden = readme.substr(a, readme.find("```", a) - a);
  EXPECT_EQ(text, golden);
  std::ifstream e(dir / "stderr.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("256 steps"), std::string::npos) << err;  // the stats line goes to stderr
}

struct BadCase {
  std::string name, args, expect;
};

void expect_error(const std::string& args, const std::string& expect) {
  std::string out;
  const int rc = test::run_command(tessera_bin() + " " + args, &out);
  EXPECT_NE(rc, 0) << args;
  EXPECT_NE(out.find(expect), std::string::npos) << args << "\n" << out;
  EXPECT_LE(std::count(out.begin(), out.end(), '\n'), 1) << "one line expected: " << out;
}

TEST(Cli, BadInputsGiveClearErrors) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 1");
  const std::string m = " -m " + dir.string();
  expect_error("generate -m /nonexistent/model -p hi", "does not exist");
  expect_error("generate" + m + " -p hi --gen-length 100 --block-length 30", "not divisible by block-length");
  expect_error("generate" + m + " -p hi --gen-length 64 --block-length 32 --steps 33", "steps");
  expect_error("generate" + m + " -p \"$(printf 'a\\377b')\"", "not valid UTF-8");
  expect_error("generate" + m + " -p hi --gen-length 5000", "exceeds the model's context");

  // Broken checkpoints: copies of the tiny model with one thing wrong each.
  auto broken = [&](const std::string& name) {
    const auto d = test::temp_dir("broken_" + name);
    for (const auto& e : std::filesystem::directory_iterator(dir))
      std::filesystem::copy(e.path(), d / e.path().filename());
    return d;
  };
  {  // truncated shard
    const auto d = broken("trunc");
    const auto shard = d / "model-00002-of-00002.safetensors";
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
    expect_error("generate -m " + d.string() + " -p hi", "truncated");
  }
  {  // header that lies about sizes: shrink a tensor's shape in the header
    const auto d = broken("lies");
    const auto shard = d / "model-00001-of-00002.safetensors";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string h(n, ' ');
    f.read(h.data(), static_cast<std::streamsize>(n));
    const size_t at = h.find("\"shape\"");
    ASSERT_NE(at, std::string::npos);
    const size_t digit = h.find_first_of("0123456789", at);
    h[digit] = h[digit] == '1' ? '2' : '1';  // a different first dimension
    f.seekp(8);
    f.write(h.data(), static_cast<std::streamsize>(n));
    f.close();
    expect_error("generate -m " + d.string() + " -p hi", "data_offsets");
  }
  {  // unknown dtype
    const auto d = broken("dtype");
    const auto shard = d / "model-00001-of-00002.safetensors";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string h(n, ' ');
    f.read(h.data(), static_cast<std::streamsize>(n));
    const size_t at = h.find("\"BF16\"");
    ASSERT_NE(at, std::string::npos);
    h.replace(at, 6, "\"I8X6\"");
    f.seekp(8);
    f.write(h.data(), static_cast<std::streamsize>(n));
    f.close();
    expect_error("generate -m " + d.string() + " -p hi", "dtype I8X6");
  }
  {  // missing tensors: drop a shard (the second layer's tensors) from the directory and the index
    const auto d = broken("missing");
    std::filesystem::remove(d / "model.safetensors.index.json");
    std::filesystem::remove(d / "model-00002-of-00002.safetensors");
    expect_error("generate -m " + d.string() + " -p hi",
                 "gives 2 layers but the checkpoint has tensors of layers 0..0");
  }
  {  // wrong shape: config says a larger hidden size
    const auto d = broken("shape");
    std::ifstream in(d / "config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t at = cfg.find("\"mlp_hidden_size\"");
    ASSERT_NE(at, std::string::npos);
    const size_t v = cfg.find_first_of("0123456789", at);
    cfg.insert(v, "1");
    std::ofstream(d / "config.json") << cfg;
    expect_error("generate -m " + d.string() + " -p hi", "but the model's config implies");
  }
  {  // unknown model type
    const auto d = broken("type");
    std::ifstream in(d / "config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    cfg.replace(cfg.find("\"llada\""), 7, "\"gpt99\"");
    std::ofstream(d / "config.json") << cfg;
    expect_error("generate -m " + d.string() + " -p hi", "model_type 'gpt99' is not supported");
  }
}

// A random tiny model writes arbitrary byte tokens, so its text is usually not valid UTF-8: --json
// still prints one valid JSON object (invalid bytes as U+FFFD) with the exact token ids.
TEST(Cli, JsonOutputOfInvalidUtf8TextIsValidJson) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 1");
  std::string out;
  ASSERT_EQ(test::run_command(tessera_bin() + " generate -m " + dir.string() +
                                  " -p hi --gen-length 16 --steps 16 --json 2>/dev/null",
                              &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["tokens"].size(), 16u);
  EXPECT_NE(j["text"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos)
      << "this model's text was valid UTF-8: the test did not test the replacement";
}

// --stop (repeatable): the text ends before the earliest stop sequence, the tokens are the unstopped
// run's up to there, and the steps after the one that completes it are not run (tests/golden/stop_test).
TEST(Cli, StopSequencesCutTheTextAndSkipLaterBlocks) {
  const std::string base =
      tessera_bin() + " generate" + tiny_model() +
      " -p \"Once upon a time\" --gen-length 64 --steps 64 --block-length 16 --alg low_confidence "
      "--temperature 0 --json --no-progress";
  std::string out;
  ASSERT_EQ(test::run_command(base + " 2>/dev/null", &out), 0) << out;
  const auto full = nlohmann::json::parse(out);
  const std::string text = full["text"];
  ASSERT_EQ(full["steps"], 64);
  EXPECT_EQ(full["stopped"], false);
  EXPECT_EQ(full["device_bytes_in_use"], -1);  // no GPU memory on the CPU
  EXPECT_GT(full["peak_rss_bytes"].get<size_t>(), full["activation_peak_bytes"].get<size_t>());
  // The first step apart from the median of the 63 others: both inside the whole generation's time.
  const double first = full["first_step_seconds"], steady = full["steady_step_seconds"];
  EXPECT_GT(first, 0.0);
  EXPECT_GT(steady, 0.0);
  EXPECT_LT(first + 63 * steady * 0.5, full["seconds"].get<double>()) << out;
  // The first word of 3 or more letters after the first sixth of the text.
  const std::string word = test::word_after(text, text.size() / 6);
  ASSERT_FALSE(word.empty()) << text;
  ASSERT_EQ(test::run_command(base + " --stop zqzqzq --stop " + word + " 2>/dev/null", &out), 0) << out;
  const auto cut = nlohmann::json::parse(out);
  EXPECT_EQ(cut["text"], text.substr(0, text.find(word))) << word;
  EXPECT_EQ(cut["stopped"], true);
  const auto toks = cut["tokens"].get<std::vector<int32_t>>();
  const auto all = full["tokens"].get<std::vector<int32_t>>();
  ASSERT_LE(toks.size(), all.size());
  EXPECT_TRUE(std::equal(toks.begin(), toks.end(), all.begin()));
  // The word comes early: the last block at least is skipped (blocks of 16 steps).
  EXPECT_LE(cut["steps"].get<int>(), 48);
  // --logprobs changes nothing in the generation; greedy tokens are their step's most likely; the
  // values are trimmed with the tokens at a stop sequence.
  ASSERT_EQ(test::run_command(base + " --logprobs 2 2>/dev/null", &out), 0) << out;
  const auto lp = nlohmann::json::parse(out);
  EXPECT_EQ(lp["tokens"], full["tokens"]);
  ASSERT_EQ(lp["logprobs"].size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& t = lp["logprobs"][i];
    EXPECT_EQ(t["token"], all[i]);
    ASSERT_EQ(t["top"].size(), 2u);
    EXPECT_EQ(t["top"][0]["token"], all[i]);
    EXPECT_EQ(t["top"][0]["logprob"], t["logprob"]);
    EXPECT_LE(t["top"][1]["logprob"].get<double>(), t["logprob"].get<double>());
    EXPECT_LT(t["logprob"].get<double>(), 0.0);
  }
  ASSERT_EQ(test::run_command(base + " --stop " + word + " --logprobs 0 2>/dev/null", &out), 0) << out;
  const auto lp_cut = nlohmann::json::parse(out);
  EXPECT_EQ(lp_cut["tokens"], cut["tokens"]);
  EXPECT_EQ(lp_cut["logprobs"].size(), toks.size());
  EXPECT_TRUE(lp_cut["logprobs"][0]["top"].empty());
  test::expect_command_error(base + " --logprobs 21 2>&1", "--logprobs");
  test::expect_command_error(base + " --stop \"\" 2>&1", "a stop sequence must not be empty");
}

// tessera generate --suffix: infilling on raw text (an empty suffix is none); --chat and the options that
// cannot see a suffix are refused with one line. (Serve.CompletionsInfillBeforeTheSuffix compares the text.)
TEST(Cli, SuffixInfillsRawText) {
  const std::string base = tessera_bin() + " generate" + tiny_model() +
                           " -p \"Once upon a time\" --gen-length 16 --json --no-progress";
  std::string plain, empty, with;
  ASSERT_EQ(test::run_command(base + " 2>/dev/null", &plain), 0) << plain;
  ASSERT_EQ(test::run_command(base + " --suffix \"\" 2>/dev/null", &empty), 0) << empty;
  ASSERT_EQ(test::run_command(base + " --suffix \" The end.\" 2>/dev/null", &with), 0) << with;
  EXPECT_EQ(nlohmann::json::parse(empty)["tokens"], nlohmann::json::parse(plain)["tokens"]);
  EXPECT_NE(nlohmann::json::parse(with)["tokens"], nlohmann::json::parse(plain)["tokens"]);
  EXPECT_EQ(nlohmann::json::parse(with)["tokens"].size(), 16u);
  expect_error("generate" + tiny_model() + " -p a --suffix b --chat",
               "--suffix infills raw text between the prompt and the suffix");
  expect_error("generate" + tiny_model() + " -p a --suffix b --window-early-stop",
               "window-early-stop cannot be combined with a suffix");
  expect_error("generate" + tiny_model() + " -p a --suffix \"b<|mdm_mask|>\"",
               "the suffix holds the mask token");
}

// --chat-template-file: a Jinja template of the user's instead of the model's. One that writes BOS and the
// message (as the bundled model's raw prompts start with BOS) gives the raw prompt's tokens; one that does
// not parse is refused naming its file and line.
TEST(Cli, ChatTemplateFileReplacesTheModels) {
  const auto dir = test::temp_dir("cli_chat_template");
  std::ofstream(dir / "t.jinja") << "{% for m in messages %}{{ bos_token }}{{ m.content }}{% endfor %}";
  std::ofstream(dir / "bad.jinja") << "{% for m in messages %}\n{{ m.content }";
  const std::string base = tessera_bin() + " generate" + tiny_model() +
                           " -p \"Once upon a time\" --gen-length 16 --json --no-progress";
  std::string raw, templated;
  ASSERT_EQ(test::run_command(base + " --raw 2>/dev/null", &raw), 0) << raw;
  ASSERT_EQ(
      test::run_command(base + " --chat --chat-template-file " + (dir / "t.jinja").string() + " 2>/dev/null",
                        &templated),
      0)
      << templated;
  EXPECT_EQ(nlohmann::json::parse(templated)["prompt_tokens"], nlohmann::json::parse(raw)["prompt_tokens"]);
  EXPECT_EQ(nlohmann::json::parse(templated)["tokens"], nlohmann::json::parse(raw)["tokens"]);
  expect_error(
      "generate" + tiny_model() + " -p a --chat --chat-template-file " + (dir / "bad.jinja").string(),
      (dir / "bad.jinja").string() + ":2:");
}

// --json-schema: the answer parses and fits the schema (inline, or from a file); a keyword it cannot enforce
// and a window beside it are one-line errors.
TEST(Cli, JsonSchemaOutputParses) {
  const auto dir = test::temp_dir("cli_json_schema");
  const std::string schema =
      R"({"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string","maxLength":5}},)"
      R"("required":["n","s"],"additionalProperties":false})";
  std::ofstream(dir / "schema.json") << schema;
  std::string out;
  ASSERT_EQ(
      test::run_command(tessera_bin() + " generate" + tiny_model() +
                            " -p \"Once upon a time\" --gen-length 64 --temperature 0.7 --json --no-progress "
                            "--json-schema " +
                            (dir / "schema.json").string() + " 2>/dev/null",
                        &out),
      0)
      << out;
  const nlohmann::json doc = nlohmann::json::parse(nlohmann::json::parse(out)["text"].get<std::string>());
  EXPECT_TRUE(doc["n"].is_number_integer() && doc["s"].is_string() && doc.size() == 2) << doc.dump();
  EXPECT_LE(doc["s"].get<std::string>().size(), 5u * 4);
  expect_error("generate" + tiny_model() + " -p a --json-schema '{\"type\":\"string\",\"format\":\"date\"}'",
               "'format' at the root is not supported");
  expect_error("generate" + tiny_model() + " -p a --json-schema object --window", "structured output writes");
  expect_error("generate" + tiny_model() + " -p a --json-schema /nonexistent.json", "--json-schema");
}

// tessera bench: every row generates the same length on the same prompt; on block-causal LLaDA2 in f32
// the KV caches are exact (agreement 1) and compute fewer rows; a bad comparison fails before any work.
TEST(Cli, BenchComparesOptionsSideBySide) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  const auto json_path = test::temp_dir("cli_bench") / "bench.json";
  const std::string base = tessera_bin() + " bench -m " + dir.string() +
                           " --precision f32 --prompt-len 20 --gen-length 24 --block-length 8 --json-out " +
                           json_path.string();
  std::string out;
  ASSERT_EQ(test::run_command(base + " --compare cache=prefix --compare cache=dual 2>&1", &out), 0) << out;
  std::ifstream f(json_path);
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["rows"].size(), 3u) << j.dump();
  EXPECT_EQ(j["rows"][0]["option"], "baseline");
  for (size_t i = 1; i < 3; ++i) {
    const auto& r = j["rows"][i];
    EXPECT_EQ(r["agreement"].get<double>(), 1.0) << r.dump();
    EXPECT_EQ(r["steps"], j["rows"][0]["steps"]) << r.dump();
    EXPECT_LT(r["query_rows"].get<double>(), j["rows"][0]["query_rows"].get<double>()) << r.dump();
    EXPECT_GT(r["kv_cache_bytes"].get<double>(), 0.0) << r.dump();
  }
  EXPECT_NE(out.find("cache=dual"), std::string::npos) << out;
  test::expect_command_error(base + " --compare cache=lru 2>&1",
                             "--compare 'cache=lru': unknown KV cache 'lru'");
  expect_error("bench -m " + dir.string() + " --geometry llada-mid",
               "give -m DIR or --geometry NAME, not both");
}

// tessera bench --profile counts the FLOPs of the GEMMs, the masked rows' LM head and attention, by
// hand here: every step of a cache-less generation is one forward over the whole canvas of L rows, whose
// LM head reads the rows still masked (G, then G - G/S, ... with G/S decided per step).
TEST(Cli, BenchProfileCountsEveryGemmsFlops) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 7");
  const ModelConfig c = load_config(dir);
  const int64_t P = 20, G = 24, S = 4, L = P + G;
  std::string out;
  ASSERT_EQ(
      test::run_command(tessera_bin() + " bench -m " + dir.string() + " --prompt-len 20 --gen-length 24 " +
                            "--block-length 24 --steps 4 --profile --json 2>/dev/null",
                        &out),
      0)
      << out;
  const auto j = nlohmann::json::parse(out);
  const auto& r = j["rows"][0];
  const double H = static_cast<double>(c.hidden), hd = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(c.n_heads) * hd, kv = static_cast<double>(c.n_kv_heads) * hd;
  const double per_row = H * (q + 2 * kv) + q * H + 3 * H * static_cast<double>(c.intermediate);
  EXPECT_EQ(r["op_flops"]["gemm"].get<double>(), 2.0 * S * L * per_row * static_cast<double>(c.n_layers));
  double masked = 0;
  for (int64_t s = 0; s < S; ++s) masked += static_cast<double>(G - s * (G / S));
  EXPECT_EQ(r["op_flops"]["gather_gemm"].get<double>(), 2.0 * masked * H * static_cast<double>(c.vocab));
  EXPECT_EQ(r["op_flops"]["attention"].get<double>(),
            4.0 * S * L * L * hd * static_cast<double>(c.n_heads * c.n_layers));
  EXPECT_GT(j["gemm_rate_flops_per_second"].get<double>(), 0.0);
  EXPECT_GT(r["counted_flops_per_second"].get<double>(), 0.0);
  // The first repetition's steps make at most their LM head's tile each.
  ASSERT_EQ(r["gemm_primitives_made"].size(), 1u);
  EXPECT_LE(r["gemm_primitives_made"][0][1].get<int64_t>(), S - 1);
  EXPECT_TRUE(r["expert_parallel_traffic"].empty());  // a dense model

  // An MoE model: its routed experts' FLOPs, and expert parallelism's exchanges per forward: the
  // all-reduce's 2 (N - 1) x rows x hidden f32 over every MoE layer; the sparse combine's at most that.
  TESSERA_TINY_OR_SKIP(moe, "llada_moe", "--seed 7");
  const ModelConfig m = load_config(moe);
  ASSERT_EQ(
      test::run_command(tessera_bin() + " bench -m " + moe.string() + " --prompt-len 20 --gen-length 24 " +
                            "--block-length 24 --steps 4 --profile --json 2>/dev/null",
                        &out),
      0)
      << out;
  const auto jm = nlohmann::json::parse(out)["rows"][0];
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < m.n_layers; ++l) moe_layers += m.is_moe_layer(l) ? 1 : 0;
  ASSERT_GT(moe_layers, 0);
  EXPECT_EQ(jm["op_flops"]["moe_ffn"].get<double>(), 6.0 * S * L * static_cast<double>(m.moe.top_k) *
                                                         static_cast<double>(m.hidden * m.moe.expert_inter) *
                                                         static_cast<double>(moe_layers));
  const auto& tr = jm["expert_parallel_traffic"];
  ASSERT_GE(tr.size(), 1u) << jm.dump();
  for (const auto& x : tr) {
    const double n = x["ranks"].get<double>();
    const double all_reduce = 2 * (n - 1) * static_cast<double>(L * moe_layers * m.hidden) * 4;
    EXPECT_EQ(x["all_reduce_bytes_per_forward"].get<double>(), all_reduce) << x.dump();
    EXPECT_LE(x["sparse_combine_bytes_per_forward"].get<double>(), all_reduce) << x.dump();
    EXPECT_GE(x["sparse_combine_bytes_per_forward"].get<double>(), all_reduce / 2) << x.dump();
    EXPECT_GE(x["busiest_rank_over_mean"].get<double>(), 1.0) << x.dump();
  }
}

// tessera bench --eos / --stop: the answers end as tessera generate's do (the same tokens), and ending
// only at block ends (mid-block-stop=off) gives the same answer in at least as many steps.
TEST(Cli, BenchEndsTheAnswersAtEosAndStopSequences) {
  const auto json_path = test::temp_dir("cli_bench_stop") / "bench.json";
  const std::string opts = tiny_model() +
                           " -p \"Once upon a time\" --gen-length 64 --block-length 32 --steps 64 "
                           "--alg low_confidence --temperature 0.8 --seed 1";
  std::string out;
  ASSERT_EQ(test::run_command(
                tessera_bin() + " generate --raw --no-progress --json --stop , " + opts + " 2>&1", &out),
            0)
      << out;
  const auto gen = nlohmann::json::parse(out);
  ASSERT_EQ(
      test::run_command(tessera_bin() + " bench --eos --stop , --compare mid-block-stop=off --json-out " +
                            json_path.string() + opts + " 2>&1",
                        &out),
      0)
      << out;
  std::ifstream f(json_path);
  const auto rows = nlohmann::json::parse(f)["rows"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["tokens"], gen["tokens"].size());
  EXPECT_LT(rows[0]["tokens"].get<int>(), 64) << "the answer did not end: the test did not test the cut";
  EXPECT_EQ(rows[1]["tokens"], rows[0]["tokens"]);
  EXPECT_EQ(rows[1]["agreement"].get<double>(), 1.0);
  EXPECT_EQ(rows[0]["steps"], gen["steps"]);
  EXPECT_LE(rows[0]["steps"].get<int>(), rows[1]["steps"].get<int>());
  expect_error("bench" + tiny_model() + " --stop , --batch 2", "--batch measures whole generations");
  expect_error("bench --geometry llada-mid --stop ,", "--stop needs a model with a tokenizer");
}

// tessera chat on piped input: one JSON line per answered turn (stdout), command replies on stderr.
struct ChatRun {
  std::vector<nlohmann::json> turns;
  std::string log;  // stderr
  int rc = -1;
};
ChatRun run_chat(const std::string& input, const std::string& flags) {
  const auto dir = test::temp_dir("cli_chat");
  std::ofstream(dir / "in.txt") << input;
  ChatRun r;
  std::string out;
  r.rc = test::run_command("(" + tessera_bin() + " chat" + tiny_model() + " --json --no-progress " + flags +
                               " < " + (dir / "in.txt").string() + " 2>" + (dir / "err.txt").string() + ")",
                           &out);
  std::ifstream err(dir / "err.txt");
  r.log.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  size_t at = 0;
  while (at < out.size()) {
    const size_t end = std::min(out.find('\n', at), out.size());
    const auto j = nlohmann::json::parse(out.substr(at, end - at), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    r.turns.push_back(j);
    at = end + 1;
  }
  return r;
}

// The commands: /help and an unknown one answer on stderr and send nothing; /undo forgets the last
// exchange (the same turn again gets the same prompt and answer); /clear starts over (the first turn's
// prompt and answer again); /system puts a message before the turns; an empty line is skipped; /quit
// ends before later lines.
TEST(Cli, ChatCommandsShapeTheConversation) {
  const ChatRun r = run_chat(
      "Once upon a time\n/help\n/bogus\nhello there\n/undo\n\nhello there\n/clear\nOnce upon a time\n"
      "/system You are a storyteller.\nThe dog\n//slash\n/quit\nnever sent\n",
      "--gen-length 16");
  ASSERT_EQ(r.rc, 0) << r.log;
  ASSERT_EQ(r.turns.size(), 6u) << r.log;
  const auto prompt = [&](size_t i) { return r.turns[i]["prompt_tokens"].get<int>(); };

  EXPECT_EQ(prompt(2), prompt(1));  // after /undo: the same conversation
  EXPECT_EQ(r.turns[2]["text"], r.turns[1]["text"]);
  EXPECT_EQ(prompt(3), prompt(0));  // after /clear: the first turn again
  EXPECT_EQ(r.turns[3]["text"], r.turns[0]["text"]);
  EXPECT_NE(r.turns[1]["text"], r.turns[0]["text"]) << "the test cannot tell the turns apart";
  const Tokenizer tok =
      Tokenizer::from_file(test::source_dir() / "models" / "tessera-tiny" / "tokenizer.json");
  // The second turn's prompt holds the first exchange (prompt and answer) before "hello there".
  EXPECT_GT(prompt(1), prompt(0) + static_cast<int>(tok.encode("hello there").size()));
  // The system message and the previous exchange come before "The dog"; "//slash" sends "/slash".
  EXPECT_GT(prompt(4), prompt(3) + static_cast<int>(tok.encode("You are a storyteller.").size()));
  EXPECT_GE(prompt(5), prompt(4) + static_cast<int>(tok.encode("/slash").size()));
  for (const char* want : {"/clear", "/undo", "/system TEXT", "unknown command /bogus",
                           "(last exchange forgotten)", "(conversation cleared)", "(system message set)"}) {
    EXPECT_NE(r.log.find(want), std::string::npos) << want << "\n" << r.log;
  }
}

// An answer with no text says so on stderr (every printable ASCII character a stop sequence: the
// answer ends before its first one, so only white space is left) and the chat goes on.
TEST(Cli, ChatSaysWhenAnAnswerIsEmpty) {
  std::string stops;
  for (char c = '!'; c <= '~'; ++c) stops += c == '\'' ? " --stop \"'\"" : std::string(" --stop '") + c + "'";
  const auto dir = test::temp_dir("cli_chat_empty");
  std::ofstream(dir / "in.txt") << "Once upon a time\nThe dog\n";
  std::string out;
  const int rc = test::run_command(tessera_bin() + " chat" + tiny_model() + " --gen-length 16 --no-progress" +
                                       stops + " < " + (dir / "in.txt").string() + " 2>&1",
                                   &out);
  ASSERT_EQ(rc, 0) << out;
  size_t n = 0;
  for (size_t at = out.find("(empty answer)"); at != std::string::npos;
       at = out.find("(empty answer)", at + 1))
    ++n;
  EXPECT_EQ(n, 2u) << out;
}

// A conversation that outgrows the context drops its oldest exchanges and goes on; a turn too long
// alone is refused with the reason and leaves the conversation as it was (the next turn's prompt
// holds it whole).
TEST(Cli, ChatDropsTheOldestTurnsToFitTheContext) {
  std::string line, huge;
  for (int i = 0; i < 28; ++i) line += "the cat sat on the mat and ";
  for (int i = 0; i < 3; ++i) huge += line;
  const ChatRun r =
      run_chat(line + "\n" + line + "\n" + line + "\n" + huge + "\nThe end\n", "--gen-length 16");
  ASSERT_EQ(r.rc, 0) << r.log;
  ASSERT_EQ(r.turns.size(), 4u) << r.log;
  const int ctx = 512;  // tessera-tiny's max_sequence_length
  for (const auto& t : r.turns) EXPECT_LE(t["prompt_tokens"].get<int>() + 16, ctx) << t.dump();
  // Turn 3 would need three long messages: the first exchange was dropped, so its prompt is turn 2's
  // with the second reply in place of the first (each at most --gen-length 16 tokens; their lengths
  // depend on the kernels' rounding).
  EXPECT_LE(std::abs(r.turns[2]["prompt_tokens"].get<int>() - r.turns[1]["prompt_tokens"].get<int>()), 16)
      << r.turns[1].dump() << "\n"
      << r.turns[2].dump();
  EXPECT_NE(r.log.find("(the 2 oldest messages were dropped to fit the model's context of 512 tokens)"),
            std::string::npos)
      << r.log;
  EXPECT_NE(r.log.find("exceeds the model's context of 512 tokens (the message was not kept"),
            std::string::npos)
      << r.log;
  EXPECT_EQ(r.log.find("4 oldest"), std::string::npos) << "the refused turn dropped nothing\n" << r.log;
  // "The end" comes after the whole conversation that turn 3 left (its prompt, its answer).
  EXPECT_GT(r.turns[3]["prompt_tokens"].get<int>(), r.turns[2]["prompt_tokens"].get<int>());
}

}  // namespace
}  // namespace tessera
