// Streams that say what is final (issue #28): tessera serve with "canvas": true sends a named
// "tessera.canvas" event per step beside OpenAI's chunks (committed text, provisional tokens, edits),
// and delta.content carries committed text only, so that with token editing streamed text is never
// retracted: every prefix the client has seen stays a prefix of the final answer, the concatenated
// deltas equal the answer sent without streaming, and the committed text of each event extends the
// previous one. Also the editing fields' errors, and generate --json --canvas.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

const std::string kModel = (test::source_dir() / "models" / "tessera-tiny").string();

struct Stream {
  std::vector<json> canvas;  // the tessera.canvas events, in order
  std::vector<json> chunks;  // OpenAI's chunks
  std::string text;          // the concatenated delta text
};

Stream read_stream(const std::string& body) {
  Stream s;
  std::stringstream ss(body);
  std::string line, event;
  while (std::getline(ss, line)) {
    if (line.rfind("event: ", 0) == 0) {
      event = line.substr(7);
    } else if (line.rfind("data: ", 0) == 0) {
      const std::string data = line.substr(6);
      if (data == "[DONE]") continue;
      const json j = json::parse(data);
      if (event == "tessera.canvas") {
        s.canvas.push_back(j);
      } else {
        EXPECT_TRUE(event.empty()) << "an unknown event " << event;
        s.chunks.push_back(j);
        for (const auto& c : j["choices"]) s.text += c["text"].get<std::string>();
      }
    } else if (line.empty()) {
      event.clear();
    }
  }
  return s;
}

TEST(ServeEdit, CanvasEventsAndCommittedDeltas) {
  const auto tmp = test::temp_dir("serve-edit");
  test::ServerProcess server("-m " + kModel, tmp);
  ASSERT_GT(server.port(), 0);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(120, 0);
  const json base = {{"prompt", "Once upon a time"},
                     {"max_tokens", 32},
                     {"temperature", 0},
                     {"block_length", 8},
                     {"edit_mode", "speed"}};
  auto plain = c.Post("/v1/completions", base.dump(), "application/json");
  ASSERT_TRUE(plain && plain->status == 200) << (plain ? plain->body : "no response");
  const std::string answer = json::parse(plain->body)["choices"][0]["text"].get<std::string>();
  json streamed = base;
  streamed["stream"] = true;
  streamed["canvas"] = true;
  auto res = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
  const Stream s = read_stream(res->body);
  EXPECT_EQ(s.text, answer);
  ASSERT_FALSE(s.canvas.empty());
  size_t edits = 0;
  std::string committed;
  for (const json& ev : s.canvas) {
    const std::string now = ev["committed"].get<std::string>();
    EXPECT_EQ(now.compare(0, committed.size(), committed), 0) << "committed text was retracted";
    EXPECT_EQ(answer.compare(0, now.size(), now), 0) << "committed text is not a prefix of the answer";
    committed = now;
    edits += ev["edits"].size();
    EXPECT_EQ(ev["index"], 0);
    for (const json& e : ev["edits"]) EXPECT_NE(e["old"], e["new"]);
  }
  EXPECT_GT(edits, 0u) << "speed mode on the tiny model made no edit: the test exercises nothing";
  // Deltas only carry committed text: what was sent after each chunk stays a prefix of the answer.
  std::string sent;
  for (const json& ch : s.chunks) {
    for (const auto& choice : ch["choices"]) sent += choice["text"].get<std::string>();
    EXPECT_EQ(answer.compare(0, sent.size(), sent), 0);
  }
  // The editing fields' errors name the field.
  for (const auto& [body, want] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", "x"}, {"canvas", true}}, "'canvas' streams the steps as events; set 'stream': true"},
           {{{"prompt", "x"}, {"edit_mode", "fast"}}, "unknown edit mode 'fast'"},
           {{{"prompt", "x"}, {"edit_mode", "off"}, {"edit_threshold", 0.5}},
            "edit-mode off turns token editing off"},
           {{{"prompt", "x"}, {"edit_threshold", 0.5}}, "token editing needs a mask threshold > 0"},
           {{{"prompt", "x"}, {"edit_threshold", 2}, {"threshold", 0.5}}, "edit-threshold must be in [0, 1]"},
           {{{"prompt", "x"}, {"max_post_steps", 3}}, "max-post-steps applies to token editing"},
           {{{"prompt", "x"}, {"edit_mode", "speed"}, {"window", true}}, "token editing revisits"}}) {
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body.dump();
    EXPECT_NE(r->body.find(want), std::string::npos) << body.dump() << ": " << r->body;
  }
}

// generate --json --canvas: one {"canvas": ...} line per step, then the result with its edits.
TEST(ServeEdit, GenerateJsonCanvasLines) {
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " + kModel +
                                  " -p 'Once upon a time' --gen-length 16 --block-length 8 --edit-mode speed "
                                  "--json --canvas 2>/dev/null",
                              &out),
            0)
      << out;
  std::stringstream ss(out);
  std::string line;
  std::vector<json> lines;
  while (std::getline(ss, line)) lines.push_back(json::parse(line));
  ASSERT_GE(lines.size(), 2u);
  const json& result = lines.back();
  EXPECT_EQ(static_cast<int>(lines.size()) - 1, result["steps"].get<int>());
  size_t edits = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["canvas"]["step"], i);
    edits += lines[i]["canvas"]["edits"].size();
  }
  EXPECT_EQ(edits, result["edit"]["edits"].size());
  EXPECT_GE(result["forwards"].get<int>(), result["steps"].get<int>());
  EXPECT_EQ(result["edit"]["threshold"], 0.5);
  EXPECT_EQ(result["edit"]["edit_threshold"], 0.0);
  test::expect_command_error(std::string(TESSERA_BINARY) + " generate -m " + kModel + " -p hi --canvas 2>&1",
                             "--canvas streams JSON step events; give --json too");
}

}  // namespace
}  // namespace tessera
