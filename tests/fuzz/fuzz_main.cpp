// libFuzzer entry of one target (TESSERA_FUZZ_TARGET, see tests/fuzz/targets.h). A Finding aborts, so
// libFuzzer saves the input; TESSERA_FUZZ_VERBOSE=1 prints each refusal, to read the messages.
#include <cstdio>
#include <cstdlib>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  try {
    const std::string refused = tessera::fuzz::run(TESSERA_FUZZ_TARGET, {data, size});
    if (verbose && !refused.empty()) std::fprintf(stderr, "refused: %s\n", refused.c_str());
  } catch (const tessera::fuzz::Finding& f) {
    std::fprintf(stderr, "FINDING: %s\n", f.what());
    std::abort();
  }
  return 0;
}
