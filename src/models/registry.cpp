// The family registry: every family tessera loads, in the order of Family (io/config.h).
#include "models/registry.h"

#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera {
namespace {

// One line per family: its FamilyInfo, defined in models/<family>.cpp.
constexpr const FamilyInfo* kFamilies[] = {
    &kLladaFamily, &kDreamFamily, &kLladaMoeFamily, &kLlada2Family, &kNemotronFamily, &kDiffusionGemmaFamily,
};

}  // namespace

std::span<const FamilyInfo* const> families() {
  return kFamilies;
}

const FamilyInfo& family_info(Family f) {
  const auto i = static_cast<size_t>(f);
  TESSERA_CHECK(i < std::size(kFamilies), "no model family " + std::to_string(i));
  return *kFamilies[i];
}

std::span<const FamilyFiles* const> family_files() {
  static const std::vector<const FamilyFiles*> files = [] {
    std::vector<const FamilyFiles*> v;
    for (const FamilyInfo* f : kFamilies) v.push_back(&f->files);
    return v;
  }();
  return files;
}

std::vector<std::string> geometry_names() {
  std::vector<std::string> v;
  for (const FamilyInfo* f : kFamilies)
    for (const GeometryPreset& g : f->geometries) v.emplace_back(g.name);
  return v;
}

ModelConfig named_geometry(const std::string& name) {
  ModelConfig c;
  std::string known;
  for (size_t i = 0; i < std::size(kFamilies); ++i) {
    for (const GeometryPreset& g : kFamilies[i]->geometries) {
      if (name == g.name) {
        c.family = static_cast<Family>(i);
        g.make(c);
        if (c.head_dim == 0) c.head_dim = c.hidden / c.n_heads;  // explicit where the geometry sets it
        return c;
      }
      known += (known.empty() ? "" : ", ") + std::string(g.name);
    }
  }
  fail("unknown geometry '" + name + "' (known: " + known + ")");
}

graph::GraphTemplate build_model_graph(const ModelConfig& c, const DenseWeights& w, const GraphOptions& o,
                                       OutputMode mode) {
  const FamilyInfo& f = family_info(c.family);
  return f.graph != nullptr ? f.graph(c, w, o, mode) : build_dense_graph(w, o, mode);
}

}  // namespace tessera
