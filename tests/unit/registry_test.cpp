// The family registry: the Family enumerators index it, every family is complete, and the names the
// families answer to (model_type values, GGUF architectures, geometries) belong to one family each.
#include "models/registry.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "test_util.h"

namespace tessera {
namespace {

TEST(Registry, EnumeratorsIndexTheirFamilies) {
  ASSERT_EQ(families().size(), 6u);  // the four enumerators, then Nemotron-Labs-Diffusion and DiffusionGemma
  EXPECT_STREQ(family_name(Family::LLaDA), "llada");
  EXPECT_STREQ(family_name(Family::Dream), "dream");
  EXPECT_STREQ(family_name(Family::LLaDAMoE), "llada-moe");
  EXPECT_STREQ(family_name(Family::LLaDA2), "llada2");
  EXPECT_STREQ(family_name(static_cast<Family>(4)), "nemotron-diffusion");
  EXPECT_STREQ(family_name(static_cast<Family>(5)), "diffusion-gemma");
  EXPECT_STREQ(family_name(static_cast<Family>(99)), "?");
  EXPECT_EQ(&family_info(Family::Dream), &kDreamFamily);
  test::expect_error([] { family_info(static_cast<Family>(99)); }, "no model family 99");
  ASSERT_EQ(family_files().size(), families().size());
  for (size_t i = 0; i < families().size(); ++i) EXPECT_EQ(family_files()[i], &families()[i]->files);
}

TEST(Registry, EveryFamilyIsComplete) {
  for (const FamilyInfo* f : families()) {
    SCOPED_TRACE(f->files.name);
    EXPECT_NE(f->bind, nullptr);
    EXPECT_FALSE(f->geometries.empty());
    const ConfigFormat& c = f->files.config;
    ASSERT_NE(c.model_types, nullptr);
    EXPECT_NE(c.claims, nullptr);
    EXPECT_NE(c.read, nullptr);
    const GgufFormat& g = f->files.gguf;
    if (g.arch == nullptr) continue;  // no GGUF form (LLaDA2)
    EXPECT_NE(g.embed, nullptr);
    EXPECT_NE(g.final_norm, nullptr);
    EXPECT_NE(g.lm_head, nullptr);
    EXPECT_NE(g.layer_prefix, nullptr);
    EXPECT_FALSE(g.layer_names.empty());
  }
}

// Every model_type tessera reads is claimed by exactly one family, and "llada" by LLaDA-MoE only when
// the config has the MoE field names without d_model.
TEST(Registry, ModelTypesHaveOneFamilyEach) {
  const std::map<std::string, Family> want = {{"llada", Family::LLaDA},
                                              {"Dream", Family::Dream},
                                              {"dream", Family::Dream},
                                              {"lladamoe", Family::LLaDAMoE},
                                              {"llada_moe", Family::LLaDAMoE},
                                              {"llada2_moe", Family::LLaDA2},
                                              {"nemotron_labs_diffusion", static_cast<Family>(4)},
                                              {"diffusion_gemma", static_cast<Family>(5)}};
  const nlohmann::json plain = nlohmann::json::object(), moe = {{"num_experts", 4}},
                       both = {{"num_experts", 4}, {"d_model", 8}};
  auto claimants = [](const std::string& type, const nlohmann::json& j) {
    const ConfigReader r{j, "config.json"};
    std::vector<size_t> who;
    for (size_t i = 0; i < families().size(); ++i)
      if (families()[i]->files.config.claims(type, r)) who.push_back(i);
    return who;
  };
  for (const auto& [type, family] : want) {
    EXPECT_EQ(claimants(type, plain), std::vector<size_t>{static_cast<size_t>(family)}) << type;
    EXPECT_EQ(claimants(type, both), std::vector<size_t>{static_cast<size_t>(family)}) << type;
  }
  EXPECT_EQ(claimants("llada", moe), std::vector<size_t>{static_cast<size_t>(Family::LLaDAMoE)});
  EXPECT_TRUE(claimants("llama", plain).empty());
}

TEST(Registry, GgufArchitecturesAndGeometriesAreUnique) {
  std::set<std::string> archs, geometries;
  for (size_t i = 0; i < families().size(); ++i) {
    const FamilyInfo& f = *families()[i];
    if (f.files.gguf.arch != nullptr) {
      EXPECT_TRUE(archs.insert(f.files.gguf.arch).second) << f.files.gguf.arch;
    }
    for (const GeometryPreset& g : f.geometries) {
      EXPECT_TRUE(geometries.insert(g.name).second) << g.name;
      const ModelConfig c = named_geometry(g.name);
      EXPECT_EQ(c.family, static_cast<Family>(i)) << g.name;
      EXPECT_GT(c.head_dim, 0) << g.name;
    }
  }
  EXPECT_EQ(archs, (std::set<std::string>{"llada", "dream", "llada-moe", "nemotron-diffusion"}));
  // geometry_names (the CLI's choices) lists each named geometry once.
  const std::vector<std::string> names = geometry_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), geometries);
  EXPECT_EQ(names.size(), geometries.size());
  test::expect_error(
      [] { named_geometry("gpt-2"); },
      "unknown geometry 'gpt-2' (known: llada-8b, llada-mid, dream-7b, llada-moe-7b, "
      "llada-moe-mid, llada2-mini, llada2-mid, llada2-flash, nemotron-diffusion-3b, nemotron-diffusion-8b, "
      "nemotron-diffusion-14b, diffusiongemma-26b-a4b, diffusiongemma-mid)");
}

}  // namespace
}  // namespace tessera
