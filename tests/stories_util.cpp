#include "stories_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "io/llama2c.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace tessera::test {

std::string stories_golden_text() {
  std::ifstream f(shared_dir() / "models/stories260K/README.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  const size_t g = s.find("Golden output");
  const size_t a = s.find("```\n", g) + 4;
  const size_t b = s.find("```", a);
  std::string t = s.substr(a, b - a);
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t;
}

std::filesystem::path stories_converted() {
  static std::filesystem::path dir;
  if (dir.empty()) {
    dir = temp_dir("stories");
    const auto src = shared_dir() / "models/stories260K";
    convert_llama2c(src / "stories260K.bin", src / "tok512.bin", dir);
  }
  return dir;
}

std::string stories_greedy_text(const EngineOptions& opt) {
  const auto dir = stories_converted();
  auto e = Engine::load(dir, opt);
  EXPECT_TRUE(e->config().causal);
  // Canvas: BOS + 256 masks; one position per step, left to right (block length 1).
  std::vector<int32_t> canvas(257, e->mask_token());
  canvas[0] = e->config().bos_id;
  SampleParams sp;  // temperature 0: argmax
  int32_t tok = 0;
  float conf = 0;
  for (int32_t p = 1; p < 257; ++p) {
    const int32_t pos[1] = {p};
    e->predict(canvas, pos, sp, std::span<int32_t>(&tok, 1), std::span<float>(&conf, 1));
    canvas[static_cast<size_t>(p)] = tok;
  }
  const Tokenizer t = Tokenizer::from_file(dir / "tokenizer.json");
  const std::vector<int32_t> gen(canvas.begin() + 1, canvas.end());
  std::string text = t.decode(gen);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

double stories_reference_error(const EngineOptions& opt) {
  const auto dir = stories_converted();
  auto e = Engine::load(dir, opt);
  std::vector<int32_t> canvas = {1, 403, 407, 261, 378, 6, 66, 81, 300};
  std::vector<int32_t> pos;
  for (int32_t i = 0; i < static_cast<int32_t>(canvas.size()); ++i) pos.push_back(i);
  std::vector<float> got(pos.size() * 512);
  e->logits(canvas, pos, got);
  const std::string ref_path = (dir / ("ref_" + std::to_string(::getpid()) + ".bin")).string();
  std::string ids, rows, out;
  for (size_t i = 0; i < canvas.size(); ++i) {
    ids += (i ? "," : "") + std::to_string(canvas[i]);
    rows += (i ? "," : "") + std::to_string(pos[i]);
  }
  const std::string cmd = python() + " " + (source_dir() / "tests/reference/reference.py").string() +
                          " logits --model " + dir.string() + " --tokens " + ids + " --rows " + rows +
                          " --out " + ref_path;
  if (run_command(cmd, &out) != 0) {
    ADD_FAILURE() << cmd << "\n" << out;
    return -1.0;
  }
  std::vector<float> ref(got.size());
  std::ifstream(ref_path, std::ios::binary)
      .read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
  return rel_error(got.data(), ref.data(), got.size());
}

}  // namespace tessera::test
