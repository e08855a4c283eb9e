// The model families, one registry line each (models/registry.cpp). A family is one file,
// models/<family>.cpp, that defines its FamilyInfo: how its files read (config.json fields, GGUF
// conventions: io/family_files.h), its named geometries, and its weight loader. load_config, the GGUF
// readers, named_geometry and Model::load find the family here; nothing else names it.
#pragma once
#include <span>

#include "io/config.h"
#include "io/family_files.h"
#include "models/model.h"

namespace tessera {

// A real geometry by name (config only, no weights): `make` fills a config, then named_geometry sets its
// family and, unless `make` set it, head_dim = hidden / heads.
struct GeometryPreset {
  const char* name;
  void (*make)(ModelConfig& c);
};

struct FamilyInfo {
  FamilyFiles files;                           // name, config.json, GGUF
  std::span<const GeometryPreset> geometries;  // named_geometry's names of the family
  // Binds the weights of a loaded checkpoint by their names and sets the family's options; the graph is
  // the shared one (build_dense_graph) with the options of its config (graph_options).
  void (*bind)(Model& m) = nullptr;
  // A family whose blocks are not the shared graph's (DiffusionGemma): its weight layout (Model::synthetic,
  // planning without a checkpoint) and its graph builder; nullptr: layout_weights' and build_dense_graph.
  DenseWeights (*layout)(const ModelConfig& c, DType act, const WeightMaker& make) = nullptr;
  graph::GraphTemplate (*graph)(const ModelConfig& c, const DenseWeights& w, const GraphOptions& o,
                                OutputMode mode) = nullptr;
};

// Every family, indexed by Family.
std::span<const FamilyInfo* const> families();
// The family of f; throws Error for a value outside the registry.
const FamilyInfo& family_info(Family f);

// The families' definitions, one in each family's file.
extern const FamilyInfo kLladaFamily;           // models/llada.cpp
extern const FamilyInfo kDreamFamily;           // models/dream.cpp
extern const FamilyInfo kLladaMoeFamily;        // models/llada_moe.cpp
extern const FamilyInfo kLlada2Family;          // models/llada2.cpp
extern const FamilyInfo kNemotronFamily;        // models/nemotron.cpp
extern const FamilyInfo kDiffusionGemmaFamily;  // models/diffusion_gemma.cpp

}  // namespace tessera
