// GGUF models against llama.cpp itself: tests/data/gguf holds tiny LLaDA (GQA, f32), Dream (f16),
// LLaDA-MoE (bf16) and LLaDA (q4_K) checkpoints converted as llama.cpp's converter does, with the
// logits llama.cpp v0.5.0 computed for them and its tokenization of texts with tessera-tiny's
// vocabulary (made by tools/gguf/make_fixtures.sh). tessera's GGUF logits must match llama.cpp's and
// those of the Hugging Face checkpoint the fixture came from; the CLI generates from a GGUF as from
// its checkpoint. With scripts/fetch_llamacpp.sh run (.llamacpp/), the trained tessera-tiny is also
// converted and compared with the live llama.cpp.
#include "io/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/model_files.h"
#include "io/tokenizer.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixtures() {
  return test::source_dir() / "tests/data/gguf";
}

const json& manifest() {
  static const json m = [] {
    std::ifstream f(fixtures() / "manifest.json");
    return json::parse(f);
  }();
  return m;
}

std::vector<float> read_f32(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

std::vector<float> engine_logits(const fs::path& model, const std::vector<int32_t>& tokens, Precision p) {
  EngineOptions o;
  o.precision = p;
  auto e = Engine::load(model, o);
  std::vector<float> out(tokens.size() * static_cast<size_t>(e->vocab_size()));
  e->logits(tokens, test::all_positions(static_cast<int64_t>(tokens.size())), out);
  return out;
}

// Relative error bound of tessera (f32 compute from the file's weights) vs llama.cpp, whose CPU matmul
// also rounds the activations to the weight type's vec-dot type (f16, bf16, q8_K).
double llama_tolerance(const std::string& outtype) {
  return outtype == "f32" ? 1e-5 : outtype == "f16" ? 2e-3 : outtype == "bf16" ? 1e-2 : 5e-2;
}

TEST(GgufModels, LogitsMatchLlamaCpp) {
  for (const json& m : manifest()["models"]) {
    const std::string file = m["file"];
    const auto tokens = m["tokens"].get<std::vector<int32_t>>();
    const int64_t V = m["n_vocab"];
    const auto got = engine_logits(fixtures() / file, tokens, Precision::F32);
    const auto llama = read_f32(fixtures() / m["llamacpp_logits"].get<std::string>());
    ASSERT_EQ(got.size(), llama.size()) << file;
    // llama.cpp's rows are the LM head of each hidden row; a shifted model (Dream) predicts position i
    // from row i - 1 (row 0 from itself).
    const size_t skip = m["shift_logits"].get<bool>() ? static_cast<size_t>(V) : 0;
    const double err = test::rel_error(got.data() + skip, llama.data(), llama.size() - skip);
    size_t argmax_same = 0;
    for (size_t r = skip / static_cast<size_t>(V); r < tokens.size(); ++r) {
      const float* g = got.data() + r * static_cast<size_t>(V);
      const float* l = llama.data() + (r - skip / static_cast<size_t>(V)) * static_cast<size_t>(V);
      argmax_same += std::max_element(g, g + V) - g == std::max_element(l, l + V) - l ? 1 : 0;
    }
    std::printf("%-24s vs llama.cpp: relative error %.2e, argmax %zu of %zu rows\n", file.c_str(), err,
                argmax_same, tokens.size() - skip / static_cast<size_t>(V));
    EXPECT_LE(err, llama_tolerance(m["outtype"])) << file;
    EXPECT_GE(argmax_same * 10, (tokens.size() - skip / static_cast<size_t>(V)) * 9) << file;
  }
}

// The GGUF and the Hugging Face checkpoint it was converted from give the same logits (exactly up to
// summation order for f32: LLaDA's permuted q / k rows with interleaved RoPE are the same attention),
// and both match the numpy reference.
TEST(GgufModels, LogitsMatchTheirCheckpoint) {
  for (const json& m : manifest()["models"]) {
    const std::string file = m["file"], outtype = m["outtype"];
    std::string args = m["checkpoint_args"];
    const std::string family = m["family"];
    args = args.substr(args.find(family) + family.size() + 1);  // without "--family F"
    TESSERA_TINY_OR_SKIP(dir, family, args);
    const auto tokens = m["tokens"].get<std::vector<int32_t>>();
    const auto gguf = engine_logits(fixtures() / file, tokens, Precision::F32);
    const auto hf = engine_logits(dir, tokens, Precision::F32);
    const double err = test::rel_error(gguf.data(), hf.data(), hf.size());
    std::printf("%-24s vs its checkpoint: relative error %.2e\n", file.c_str(), err);
    // The file's weights are the checkpoint's rounded to the out type.
    const double tol = outtype == "f32" ? 1e-5 : outtype == "f16" ? 2e-3 : outtype == "bf16" ? 1e-2 : 0.25;
    EXPECT_LE(err, tol) << file;
    if (outtype == "f32") {
      const auto ref = test::reference_logits(
          dir, tokens, test::all_positions(static_cast<int64_t>(tokens.size())), m["n_vocab"].get<int64_t>());
      EXPECT_LE(test::rel_error(gguf.data(), ref.data(), ref.size()), 1e-5) << file;
    }
  }
}

TEST(GgufModels, VocabularyTokenizesAsLlamaCpp) {
  const json& t = manifest()["tokenizer"];
  const Tokenizer gguf = load_model_tokenizer(fixtures() / t["file"].get<std::string>());
  const Tokenizer hf = Tokenizer::from_file(test::source_dir() / "models/tessera-tiny/tokenizer.json");
  for (const json& c : t["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(gguf.encode(text), want) << text;
    EXPECT_EQ(hf.encode(text), want) << text;
    EXPECT_EQ(gguf.decode(want), text);
  }
}

// `tessera generate -m FILE.gguf` decides what it decides from the checkpoint directory (greedy, f32).
TEST(GgufModels, CliGeneratesAsFromTheCheckpoint) {
  const json& m = manifest()["models"][0];
  ASSERT_EQ(m["outtype"], "f32");
  TESSERA_TINY_OR_SKIP(dir, "llada", "--kv-heads 2 --dtype f32 --seed 11");
  const std::string flags =
      " -p 'a b c' --gen-length 16 --steps 16 --block-length 8 --precision f32 --raw --json";
  auto run = [&](const fs::path& model) {
    std::string out;
    EXPECT_EQ(
        test::run_command(
            std::string(TESSERA_BINARY) + " generate -m " + model.string() + flags + " 2>/dev/null", &out),
        0)
        << out;
    return json::parse(out);
  };
  const json a = run(fixtures() / m["file"].get<std::string>()), b = run(dir);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["text"], b["text"]);
  std::string out;
  ASSERT_EQ(
      test::run_command(
          std::string(TESSERA_BINARY) + " inspect " + (fixtures() / "llada-w256-q4_k.gguf").string(), &out),
      0)
      << out;
  EXPECT_NE(out.find("tensor types f32 x 3, q4_K x 9"), std::string::npos) << out;
  EXPECT_NE(out.find("weights      339.4 KiB"), std::string::npos) << out;  // kept quantized on the CPU
  EXPECT_NE(out.find("1.2 MiB as bf16 with --dequantize"), std::string::npos) << out;
  // plan counts the weights as the CPU keeps them (its budget arithmetic uses that figure)
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " plan -m " +
                                  (fixtures() / "llada-w256-q4_k.gguf").string() + " --context 512",
                              &out),
            0)
      << out;
  EXPECT_NE(out.find("weights 339.4 KiB (the GGUF's tensors"), std::string::npos) << out;
  // ... and as CUDA loads them with --device cuda (q4_K kept, plus the tile of the largest GEMM weight,
  // the 300 x 256 LM head in bf16: 150 KiB)
  ASSERT_EQ(
      test::run_command(std::string(TESSERA_BINARY) + " plan -m " +
                            (fixtures() / "llada-w256-q4_k.gguf").string() + " --context 512 --device cuda",
                        &out),
      0)
      << out;
  EXPECT_NE(out.find("weights 489.4 KiB (the GGUF's tensors, q8_0 / q4_0 / q4_K / q5_K / q6_K kept quantized "
                     "with a 150.0 KiB tile"),
            std::string::npos)
      << out;
  // Bad files: a clear error, non-zero exit.
  const fs::path bad = test::temp_dir("gguf_cli") / "cut.gguf";
  {
    // The whole directory, but not the end of the tensor data.
    std::ifstream in(fixtures() / m["file"].get<std::string>(), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.resize(bytes.size() - 4096);
    std::ofstream(bad, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  test::expect_command_error(std::string(TESSERA_BINARY) + " generate -m " + bad.string() + " -p hi",
                             "runs past the end of the file");
  test::expect_command_error(
      std::string(TESSERA_BINARY) + " generate -m " + (fixtures() / "manifest.json").string() + " -p hi",
      "is neither a model directory nor a GGUF file");
}

// On the CPU quantized tensors stay in their blocks (GEMM weights, the LM head, the embedding table and
// MoE experts) and compute what the dequantized model computes, in a fraction of its memory.
TEST(GgufModels, QuantizedWeightsStayQuantizedOnTheCpu) {
  const fs::path moe_q = test::temp_dir("gguf_quant") / "llada-moe-q8_0.gguf";
  test::requantize_gguf(fixtures() / "llada-moe-bf16.gguf", moe_q);
  for (const json& m : manifest()["models"]) {
    const std::string file = m["file"];
    if (file != "llada-w256-q4_k.gguf" && file != "llada-moe-bf16.gguf") continue;
    const fs::path path = file == "llada-w256-q4_k.gguf" ? fixtures() / file : moe_q;
    const auto tokens = m["tokens"].get<std::vector<int32_t>>();
    const auto pos = test::all_positions(static_cast<int64_t>(tokens.size()));
    for (Precision p : {Precision::Auto, Precision::F32}) {
      std::vector<float> logits[2];
      size_t bytes[2];
      for (int dq = 0; dq < 2; ++dq) {
        EngineOptions o;
        o.precision = p;
        o.dequantize = dq == 1;
        auto e = Engine::load(path, o);
        const DenseWeights& w = e->model().weights();
        EXPECT_EQ(w.lm_head.quantized(), dq == 0) << file;
        EXPECT_EQ(w.embed.quantized(), dq == 0) << file;
        logits[dq].resize(tokens.size() * static_cast<size_t>(e->vocab_size()));
        e->logits(tokens, pos, logits[dq]);
        bytes[dq] = e->model().weight_bytes();
      }
      const double err = test::rel_error(logits[0].data(), logits[1].data(), logits[1].size());
      std::printf(
          "%-24s %s: kept quantized vs converted at load: relative error %.1e, weights %zu vs %zu bytes\n",
          path.filename().c_str(), p == Precision::F32 ? "f32" : "bf16", err, bytes[0], bytes[1]);
      // f32: the same weights, the same GEMMs. bf16: converting at load also rounds the embedding table
      // to bf16, while the kept table's rows are dequantized to f32 (as llama.cpp's get_rows does).
      EXPECT_LE(err, p == Precision::F32 ? 1e-6 : 1e-2) << file;
      EXPECT_LT(bytes[0] * (p == Precision::F32 ? 4 : 2), bytes[1] * 3 / 2) << file;
    }
    if (path == moe_q) {  // the requantized MoE stays close to the bf16 model it came from
      const auto q = engine_logits(moe_q, tokens, Precision::F32),
                 b = engine_logits(fixtures() / file, tokens, Precision::F32);
      EXPECT_LE(test::rel_error(q.data(), b.data(), b.size()), 0.05);
    }
  }
  // --dequantize on the command line: the same text.
  const std::string flags =
      " -p 'a b c' --gen-length 16 --steps 16 --block-length 8 --raw --json 2>/dev/null";
  std::string a, b;
  const std::string cmd = std::string(TESSERA_BINARY) + " generate -m " + moe_q.string() + flags;
  ASSERT_EQ(test::run_command(cmd, &a), 0) << a;
  ASSERT_EQ(test::run_command(cmd + " --dequantize", &b), 0) << b;
  EXPECT_EQ(json::parse(a)["tokens"], json::parse(b)["tokens"]);
}

// Live llama.cpp (scripts/fetch_llamacpp.sh): the trained tessera-tiny converted to q8_0 gives llama.cpp's
// logits, and its bf16 GGUF writes the text its checkpoint writes.
TEST(GgufModels, TrainedModelMatchesLiveLlamaCpp) {
  const fs::path lc = test::source_dir() / ".llamacpp";
  if (!fs::exists(lc / "bin/llamacpp-oracle") || !fs::exists(lc / "gguf-py"))
    GTEST_SKIP() << ".llamacpp/ is absent (run scripts/fetch_llamacpp.sh); the fixtures above still ran";
  const fs::path tmp = test::temp_dir("gguf_live");
  const std::string conv = test::python() + " " + (test::source_dir() / "tools/gguf/hf_to_gguf.py").string() +
                           " " + (test::source_dir() / "models/tessera-tiny").string() + " ";
  std::string out;
  for (const char* t : {"q8_0", "bf16"})
    ASSERT_EQ(test::run_command(conv + (tmp / (std::string(t) + ".gguf")).string() + " --quiet --outtype " +
                                    t + " --gguf-py " + (lc / "gguf-py").string(),
                                &out),
              0)
        << out;
  const std::vector<int32_t> tokens = test::random_canvas(40, 4000, 3, 4090, 0.5);
  ASSERT_EQ(
      test::run_command((lc / "bin/llamacpp-oracle").string() + " logits " + (tmp / "q8_0.gguf").string() +
                            " " + test::join_ids(tokens) + " " + (tmp / "llama.f32").string(),
                        &out),
      0)
      << out;
  const auto llama = read_f32(tmp / "llama.f32");
  const auto got = engine_logits(tmp / "q8_0.gguf", tokens, Precision::F32);
  ASSERT_EQ(got.size(), llama.size());
  const double err = test::rel_error(got.data(), llama.data(), llama.size());
  std::printf("tessera-tiny q8_0 vs llama.cpp: relative error %.2e\n", err);
  EXPECT_LE(err, 2e-2);  // llama.cpp rounds the activations to q8_0 for its q8_0 dot products
  const std::string flags =
      " -p 'Once upon a time' --gen-length 64 --steps 64 --block-length 32 --alg low_confidence "
      "--temperature 0 "
      "--json 2>/dev/null";  // greedy: the GGUF carries no generation_config.json
  std::string a, b;
  ASSERT_EQ(test::run_command(
                std::string(TESSERA_BINARY) + " generate -m " + (tmp / "bf16.gguf").string() + flags, &a),
            0);
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " +
                                  (test::source_dir() / "models/tessera-tiny").string() + flags,
                              &b),
            0);
  EXPECT_EQ(json::parse(a)["text"], json::parse(b)["text"]);
}

}  // namespace
}  // namespace tessera
