// The real trained model stories260K (../shared/models/stories260K), converted once per test
// process, and its golden greedy text: shared by the CPU golden tests and the CUDA tests.
#pragma once
#include <filesystem>
#include <string>

#include "engine/engine.h"

namespace tessera::test {

std::string stories_golden_text();
std::filesystem::path stories_converted();
// Greedy diffusion decoding of 256 tokens after BOS, one position per step, on an engine made with
// `opt`; returns the decoded text (trailing newlines removed).
std::string stories_greedy_text(const EngineOptions& opt);
// Relative error of the engine's logits on a fixed canvas against the numpy reference (-1 if the
// reference could not run; a test failure is recorded then).
double stories_reference_error(const EngineOptions& opt);

}  // namespace tessera::test
