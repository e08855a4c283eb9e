// Compares tessera's tokenizer with tools/train/bpe.py on the lines of tokens/tokenizer_check.json.
//   tok_check TOKENIZER.json CHECK.json     (built and run by `bpe.py check --tessera-build DIR`)
// Prints the first mismatches and "N passed, N failed"; exits non-zero on any mismatch.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s tokenizer.json tokenizer_check.json\n", argv[0]);
    return 2;
  }
  const auto tok = tessera::Tokenizer::from_file(argv[1]);
  std::ifstream f(argv[2]);
  const auto j = nlohmann::json::parse(f);
  int pass = 0, failed = 0;
  for (const auto& c : j.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok.encode(text, false);
    const bool same = got == want && tok.decode(got) == tok.decode(want);
    if (same) {
      ++pass;
      continue;
    }
    if (++failed <= 5) {
      std::printf("MISMATCH on %s\n  python:", nlohmann::json(text).dump().c_str());
      for (auto i : want) std::printf(" %d", i);
      std::printf("\n  tessera:");
      for (auto i : got) std::printf(" %d", i);
      std::printf("\n");
    }
  }
  std::printf("tokenizer check (vocab %zu): %d passed, %d failed\n", tok.vocab_size(), pass, failed);
  return failed == 0 ? 0 : 1;
}
