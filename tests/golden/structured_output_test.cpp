// Structured output (issue #32): on the bundled trained models, every answer generated under a JSON Schema
// (or "any JSON object") validates, checked by Python's jsonschema (tests/reference/validate_json.py, the
// oracle) and by the grammar itself, for a set of schemas, prompts, temperatures and both models, with the
// KV cache and with the whole-canvas forward. A budget too small for the schema's shortest document is
// refused before any work.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_grammar.h"
#include "runtime/session.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using ojson = nlohmann::ordered_json;

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "calm"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}},
        "required": ["mood", "tags"], "additionalProperties": false})",
    R"({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 4})",
    R"({"anyOf": [{"type": "object", "properties": {"ok": {"const": true}}, "required": ["ok"],
        "additionalProperties": false}, {"type": "null"}]})",
    R"({"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"], "additionalProperties": false}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"},
        "label": {"type": ["string", "null"]}}, "required": ["from", "to"]})",
};

TEST(StructuredOutput, EveryAnswerValidatesOnTheBundledModels) {
  if (!test::python_has("jsonschema"))
    GTEST_SKIP() << "Python's jsonschema is missing (Debian: python3-jsonschema)";
  ojson cases = ojson::array();
  size_t generated = 0;
  for (const char* model : {"tessera-tiny", "tessera-tiny-moe"}) {
    LoadOptions lo;
    lo.model = (test::source_dir() / "models" / model).string();
    Session s(lo);
    for (int schema = -1; schema < static_cast<int>(std::size(kSchemas)); ++schema) {
      const ojson parsed = schema < 0 ? ojson(nullptr) : ojson::parse(kSchemas[schema]);
      const auto grammar = schema < 0 ? JsonGrammar::any_object() : JsonGrammar::from_schema(parsed);
      for (const char* prompt : {"Once upon a time", "{\"name\":"}) {
        for (const float temperature : {0.0f, 0.8f}) {
          GenerateOptions o = s.defaults(48, 16, 48);
          o.temperature = temperature;
          o.seed = generated;
          o.cache = generated % 3 == 2 ? KvCache::Dual : KvCache::None;
          o.constraint = s.json_output(grammar);
          const auto ids = s.prompt_ids({{"user", prompt}}, false, o);
          const Session::Output out = s.run(ids, o, nullptr);
          SCOPED_TRACE(std::string(model) + " schema " + std::to_string(schema) + " '" + prompt +
                       "': " + out.text);
          EXPECT_TRUE(json_grammar_accepts(*grammar, out.text));
          cases.push_back({{"schema", parsed}, {"text", out.text}});
          ++generated;
        }
      }
    }
  }
  const auto dir = test::temp_dir("structured_output");
  std::ofstream(dir / "cases.json") << cases.dump();
  std::string log;
  ASSERT_EQ(test::run_command(test::python() + " -B " +
                                  (test::source_dir() / "tests/reference/validate_json.py").string() + " < " +
                                  (dir / "cases.json").string() + " > " + (dir / "verdicts.json").string(),
                              &log),
            0)
      << log;
  const ojson verdicts = ojson::parse(test::read_text(dir / "verdicts.json"));
  ASSERT_EQ(verdicts.size(), cases.size());
  size_t valid = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(verdicts[i]["ok"].get<bool>()) << cases[i].dump() << ": " << verdicts[i]["error"];
    valid += verdicts[i]["ok"].get<bool>() ? 1 : 0;
  }
  EXPECT_EQ(valid, generated);
  EXPECT_EQ(generated, 2u * 6 * 2 * 2);
}

// A block-causal model (a tiny LLaDA2 in the real layout, random weights): the answer ends inside a block,
// whose padding after it is decided freely and dropped; with and without the KV cache.
TEST(StructuredOutput, BlockCausalAnswersValidateToo) {
  TESSERA_TINY_OR_SKIP(dir, "llada2", "--seed 7");
  LoadOptions lo;
  lo.model = dir.string();
  Session s(lo);
  const auto grammar = JsonGrammar::from_schema(ojson::parse(kSchemas[1]));
  for (const KvCache cache : {KvCache::None, KvCache::Prefix}) {
    GenerateOptions o = s.defaults(40);
    o.cache = cache;
    o.constraint = s.json_output(grammar);
    const auto ids = s.prompt_ids({{"user", "Once upon a time"}}, false, o);
    const Session::Output out = s.run(ids, o, nullptr);
    EXPECT_TRUE(json_grammar_accepts(*grammar, out.text)) << out.text;
  }
}

TEST(StructuredOutput, ABudgetBelowTheShortestDocumentIsRefused) {
  LoadOptions lo;
  lo.model = (test::source_dir() / "models" / "tessera-tiny").string();
  Session s(lo);
  // The shortest document: {"name":"","age":0} (19 bytes, a token each at worst).
  GenerateOptions o = s.defaults(16, 16, 16);
  o.constraint = s.json_output(JsonGrammar::from_schema(ojson::parse(kSchemas[0])));
  const auto ids = s.prompt_ids({{"user", "Once"}}, false, o);
  test::expect_error([&] { s.run(ids, o, nullptr); },
                     "cannot hold the shortest text of the requested format");
}

}  // namespace
}  // namespace tessera
