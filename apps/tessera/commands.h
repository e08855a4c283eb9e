// Subcommand registration for the tessera CLI.
#pragma once
#include <CLI/CLI.hpp>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace tessera::cli {

struct Registry {
  std::vector<std::pair<CLI::App*, std::function<int()>>> handlers;
};

void add_generate(CLI::App& app, Registry& reg);
void add_chat(CLI::App& app, Registry& reg);
void add_inspect(CLI::App& app, Registry& reg);
void add_convert(CLI::App& app, Registry& reg);
void add_plan(CLI::App& app, Registry& reg);
void add_eval(CLI::App& app, Registry& reg);
void add_bench(CLI::App& app, Registry& reg);
void add_serve(CLI::App& app, Registry& reg);
void add_features(CLI::App& app, Registry& reg);
void add_completion(CLI::App& app, Registry& reg);

// The weights of a model directory or GGUF file as the CPU backend loads them (inspect, plan).
struct WeightSummary {
  size_t bytes = 0, tensors = 0;  // as loaded on the CPU (GGUF: quantized tensors kept quantized)
  DType act = DType::BF16;        // the compute dtype --precision auto picks
  size_t file_bytes = 0;          // GGUF: the tensor bytes in the file, and their types
  std::string file_types;
  size_t dequantized_bytes = 0;  // GGUF with quantized tensors: the bytes with them converted to `act`
  // GGUF: the bytes as the CUDA backend loads them (cuda_keeps_quantized types kept in their blocks, the
  // others and the routed experts converted to `act`), the tile of its quantized GEMMs included (cuda_tile).
  size_t cuda_bytes = 0, cuda_tile = 0;
};
// GGUF files are summarised from their directory (quantized tensors are not converted for this).
WeightSummary summarize_weights(const std::string& path);

}  // namespace tessera::cli
