// tessera's Jinja interpreter against Python's jinja2 (the oracle, run as transformers runs chat
// templates: tests/reference/chat_oracle.py) on real chat templates (tests/data/chat_templates, sources
// in its SOURCES.md) and tessera's built-in ones, for a generated set of conversations: with and without
// a system turn, several turns, tools, tool calls and results, reasoning, add_generation_prompt and
// enable_thinking on and off. Every rendering must be byte-identical, and a conversation the template
// refuses (raise_exception, a type error) must be refused here too.
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/chat_template.h"
#include "io/jinja/jinja.h"
#include "test_util.h"

namespace tessera {
namespace {
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

// The oracle's renderings of every template in `dir` (skips when Python's jinja2 is missing).
ojson oracle_cases(const fs::path& dir) {
  const fs::path out = test::temp_dir("jinja_oracle") / "cases.json";
  std::string log;
  const std::string cmd = test::python() + " -B " +
                          (test::source_dir() / "tests/reference/chat_oracle.py").string() + " cases " +
                          dir.string() + " > " + out.string();
  const int rc = test::run_command(cmd, &log);
  if (rc != 0) return ojson{{"failed", cmd + "\n" + log}};
  std::ifstream f(out);
  return ojson::parse(f);
}

void compare(const fs::path& dir, size_t at_least) {
  const ojson cases = oracle_cases(dir);
  ASSERT_TRUE(cases.is_array()) << cases.dump();
  ASSERT_GE(cases.size(), at_least);
  std::map<std::string, std::unique_ptr<jinja::Template>> parsed;
  size_t rendered = 0, refused = 0;
  for (const ojson& c : cases) {
    const std::string name = c["template"];
    SCOPED_TRACE(name + ": " + c["case"].get<std::string>());
    auto& t = parsed[name];
    if (!t) {
      const std::string text = test::read_text(dir / name);
      ASSERT_NO_THROW(t = std::make_unique<jinja::Template>(text, name));
    }
    if (c.contains("expected")) {
      std::string got;
      try {
        got = t->render(c["context"]);
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
        continue;
      }
      EXPECT_EQ(got, c["expected"].get<std::string>());
      ++rendered;
    } else {
      EXPECT_THROW(t->render(c["context"]), Error) << c["error"].get<std::string>();
      ++refused;
    }
  }
  EXPECT_GT(rendered, refused);
}

TEST(JinjaOracle, RealChatTemplatesRenderAsJinja2Does) {
  if (!test::python_has("jinja2")) GTEST_SKIP() << "Python's jinja2 is missing (Debian: python3-jinja2)";
  compare(test::source_dir() / "tests/data/chat_templates", 20 * 50);
}

// tessera's own templates for models that ship none, under jinja2 too.
TEST(JinjaOracle, BuiltInTemplatesRenderAsJinja2Does) {
  if (!test::python_has("jinja2")) GTEST_SKIP() << "Python's jinja2 is missing (Debian: python3-jinja2)";
  const fs::path dir = test::temp_dir("jinja_builtin");
  for (ChatFamily f : {ChatFamily::LladaInstruct, ChatFamily::ChatML, ChatFamily::LladaMoE, ChatFamily::None})
    std::ofstream(dir / (std::string(chat_family_name(f)) + ".jinja")) << builtin_chat_template(f);
  compare(dir, 4 * 50);
}

}  // namespace
}  // namespace tessera
