// Replays the committed fuzz corpus (tests/fuzz/corpus/TARGET/*) through the fuzz targets: every
// seed-* input is accepted (the target reaches generation / the round trip), every regress-* input (an
// input the fuzzer once turned into a crash or an unclear error) is refused with a tessera::Error.
// Anything else, including a crash, fails here as it failed under the fuzzer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "fuzz/targets.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// What the refusal of some regress inputs must say (the rest must only be refused).
const std::map<std::string, std::string> kMessages = {
    {"model/regress-config-odd-head-dim.hf", "the head dimension 3 is odd"},
    {"model/regress-gguf-token-not-utf8.gguf", "tokenizer.ggml.tokens[11] is not valid UTF-8"},
    {"model/regress-gguf-missing-tensor.gguf",
     "tensor 'blk.0.attn_output.weight' (model.layers.0.self_attn.o_proj.weight) is missing"},
    {"model/regress-gguf-missing-expert.gguf", "tensor 'blk.0.ffn_down_exps.weight (expert 0)'"},
    {"model/regress-gguf-billion-layers.gguf",
     "gives 150994945 layers but the checkpoint has tensors of layers 0..0"},
    {"model/regress-generation-config-steps-string.hf",
     "generation_config.json: 'steps' must be a non-negative integer"},
    {"model/regress-tokenizer-float-vocab-id.hf", "is not an integer in [0, 2^30]"},
    {"model/regress-tokenizer-larger-than-model.hf", "the tokenizer does not belong to this model"},
    {"model/regress-gguf-control-bytes-in-key.gguf", "\\x"},
    {"model/regress-gguf-misaligned-tensor.gguf",
     "tensor 'token_embd.weight' of type bf16 starts at byte 6299 of the file, not a multiple of 2"},
    {"llama2c/regress-odd-head-size", "with an even head size"},
    {"request/regress-tools-without-template", "takes no tool calls ('messages[1].tool_calls'"},
    {"jinja/regress-unbounded-loop", "the template ran past 200000 steps"},
    {"jinja/regress-deep-nesting", "nests too deeply"},
    {"jinja/regress-endless-recursion", "macro calls nest deeper than"},
};

struct Counts {
  int seeds = 0, regressions = 0;
};

Counts replay(const std::string& target) {
  Counts n;
  const fs::path dir = fs::path(TESSERA_SOURCE_DIR) / "tests/fuzz/corpus" / target;
  std::set<fs::path> files;  // sorted: a stable order in the log
  for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path());
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    const std::vector<uint8_t> bytes = read_bytes(p);
    std::string refused;
    try {
      refused = tessera::fuzz::run(target, bytes);
    } catch (const tessera::fuzz::Finding& f) {
      ADD_FAILURE() << target << "/" << name << ": " << f.what();
      continue;
    }
    if (name.rfind("seed-", 0) == 0) {
      ++n.seeds;
      EXPECT_EQ(refused, "") << target << "/" << name << " is a valid input and was refused";
    } else if (name.rfind("regress-", 0) == 0) {
      ++n.regressions;
      EXPECT_NE(refused, "") << target << "/" << name << " was accepted";
      if (const auto it = kMessages.find(target + "/" + name); it != kMessages.end()) {
        EXPECT_NE(refused.find(it->second), std::string::npos) << target << "/" << name << ": " << refused;
      }
      std::printf("  %s/%s: %s\n", target.c_str(), name.c_str(), refused.c_str());
    } else {
      ADD_FAILURE() << target << "/" << name << ": corpus files are named seed-* or regress-*";
    }
  }
  return n;
}

}  // namespace

TEST(FuzzCorpus, ModelsLoadAndGenerateOrAreRefusedClearly) {
  const int64_t variants = tessera::fuzz::model_variants_run();
  const Counts n = replay("model");
  EXPECT_GE(n.seeds, 8);
  // Each seed also generates with the approximations it takes: cache, sparse and window on every
  // seed (LLaDA2's block-causal attention takes no window), DES on the two MoE ones.
  EXPECT_GE(tessera::fuzz::model_variants_run() - variants, 3 * n.seeds);
}

TEST(FuzzCorpus, TokenizerRoundTrips) {
  const Counts n = replay("tokenize");
  EXPECT_GE(n.seeds, 3);
}

TEST(FuzzCorpus, Llama2cCheckpointsConvertOrAreRefusedClearly) {
  TESSERA_SKIP_WITHOUT_SHARED("models/stories260K");
  const Counts n = replay("llama2c");
  EXPECT_GE(n.seeds, 1);
}

TEST(FuzzCorpus, ServerRequestsParseOrAreRefusedClearly) {
  const Counts n = replay("request");
  EXPECT_GE(n.seeds, 6);
}

TEST(FuzzCorpus, ChatTemplatesRenderOrAreRefusedClearly) {
  const Counts n = replay("jinja");
  EXPECT_GE(n.seeds, 5);
  EXPECT_GE(n.regressions, 3);
}

TEST(FuzzCorpus, AnUnknownTargetIsAFinding) {
  EXPECT_THROW(tessera::fuzz::run("nope", {}), tessera::fuzz::Finding);
}
