// The host cost of structured output per constrained step: the token mask of a JSON grammar over a whole
// vocabulary (every token's bytes fed into a copy of the state, as guidance.cpp asks the constraint for
// each token), at states taken along a document.
// usage: json_mask_bench TOKENIZER_JSON [SCHEMA_JSON]
// Prints the vocabulary size, the time of one mask (median over the states) and the allowed tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/json_grammar.h"
#include "io/tokenizer.h"
#include "runtime/json_constraint.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON [SCHEMA_JSON]\n", argv[0]);
    return 2;
  }
  try {
    using namespace tessera;
    const Tokenizer t = Tokenizer::from_file(argv[1]);
    const auto vocab = static_cast<int64_t>(t.vocab_size());
    const auto grammar = argc > 2 ? JsonGrammar::from_schema(nlohmann::ordered_json::parse(argv[2]))
                                  : JsonGrammar::any_object();
    const auto bytes = VocabBytes::of(t, vocab);
    const auto c = json_constraint(grammar, bytes, {0});
    // States along a document: each prefix of it, token by token.
    const std::string doc = R"({"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"]})";
    std::vector<std::unique_ptr<TokenConstraint::State>> states;
    auto s = c->start();
    states.push_back(s->clone());
    for (const int32_t id : t.encode(doc, false)) {
      if (!s->allows(id, 1 << 20)) break;
      s->take(id);
      states.push_back(s->clone());
    }
    std::vector<double> ms;
    int64_t allowed = 0;
    for (const auto& st : states) {
      const auto t0 = std::chrono::steady_clock::now();
      int64_t n = 0;
      for (int64_t id = 0; id < vocab; ++id) n += st->allows(static_cast<int32_t>(id), 1 << 20) ? 1 : 0;
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      allowed += n;
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "vocabulary %lld tokens, %zu states: one mask %.2f ms (median; %.2f .. %.2f), %.0f tokens allowed "
        "on average\n",
        static_cast<long long>(vocab), states.size(), ms[ms.size() / 2], ms.front(), ms.back(),
        static_cast<double>(allowed) / static_cast<double>(states.size()));
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "json_mask_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
