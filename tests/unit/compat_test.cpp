// The table of which features combine (decode/compat.h): validation refuses exactly its refused pairs
// with their reasons, and docs/ARCHITECTURE.md carries the matrix printed from it.
#include "decode/compat.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "decode/generate.h"
#include "test_util.h"

namespace tessera {
namespace {

// A constraint that allows every token (only its presence matters to validation).
class AnyText final : public TokenConstraint {
  struct S final : State {
    std::unique_ptr<State> clone() const override { return std::make_unique<S>(); }
    bool allows(int32_t, int64_t) const override { return true; }
    void take(int32_t) override {}
    bool complete() const override { return true; }
    int64_t min_tokens() const override { return 0; }
  };

 public:
  std::unique_ptr<State> start() const override { return std::make_unique<S>(); }
};

// Options that use feature f (block_causal set for the block-causal model).
void use(GenerateOptions& o, Feature f, bool& block_causal) {
  switch (f) {
    case Feature::KvCache:
      o.cache = KvCache::Dual;
      break;
    case Feature::SparseD:
      o.sparse = true;
      break;
    case Feature::Window:
      o.window = true;
      break;
    case Feature::Cfg:
      o.cfg_scale = 1.0f;
      break;
    case Feature::Infilling:
      o.suffix = {5, 6};
      break;
    case Feature::Des:
      o.des = DesMode::Vote;
      break;
    case Feature::BlockCausal:
      block_causal = true;
      break;
    case Feature::Threshold:
      o.threshold = 0.5f;
      break;
    case Feature::Logprobs:
      o.logprobs = true;
      break;
    case Feature::Editing:
      o.edit = true;
      o.threshold = 0.5f;
      break;
    case Feature::Batching:
      break;
    case Feature::Structured:
      o.constraint = std::make_shared<AnyText>();
      break;
    case Feature::TriMode:  // ar: the mode every feature that combines with tri-mode combines with
      if (o.mode == DecodeMode::Uniform)
        o.causal_context = true;  // (both at once: causal-context diffusion's flag beside mode uniform)
      else
        o.mode = DecodeMode::Ar;
      break;
    case Feature::Uniform:
      if (o.mode == DecodeMode::Ar) o.causal_context = true;
      o.mode = DecodeMode::Uniform;
      break;
  }
}

TEST(Compat, ValidationRefusesExactlyTheRefusedPairs) {
  int refused = 0;
  for (int i = 0; i < kFeatures; ++i) {
    for (int j = 0; j < kFeatures; ++j) {
      if (i == j) continue;
      const auto a = static_cast<Feature>(i), b = static_cast<Feature>(j);
      const Compat c = compat(a, b);
      EXPECT_EQ(c.how, compat(b, a).how) << feature_name(a) << " + " << feature_name(b);
      if (a == Feature::Batching || b == Feature::Batching) continue;  // the server's, not the options'
      GenerateOptions o;
      o.gen_length = o.steps = o.block_length = 16;
      o.eos_ids = {1};
      bool block_causal = false;
      use(o, a, block_causal);
      use(o, b, block_causal);
      SCOPED_TRACE(std::string(feature_name(a)) + " + " + std::string(feature_name(b)));
      ASSERT_TRUE(uses(o, a, block_causal) && uses(o, b, block_causal));
      if (c.how == Combination::Refused) {
        ++refused;
        test::expect_error([&] { validate_generate_options(o, 100, block_causal); }, std::string(c.reason));
      } else {
        EXPECT_NO_THROW(validate_generate_options(o, 100, block_causal));
      }
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(Compat, ArchitectureDocCarriesTheGeneratedMatrix) {
  std::ifstream f(test::source_dir() / "docs/ARCHITECTURE.md");
  ASSERT_TRUE(f) << "docs/ARCHITECTURE.md is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str(), table = compat_markdown();
  EXPECT_NE(doc.find(table), std::string::npos)
      << "docs/ARCHITECTURE.md's feature matrix differs from the code's table; paste the output of "
         "`tessera features` there:\n"
      << table;
}

}  // namespace
}  // namespace tessera
