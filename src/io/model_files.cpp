#include "io/model_files.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"

namespace tessera {
namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json_or_empty(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return json::object();
  try {
    return json::parse(f);
  } catch (const std::exception& e) {
    fail(p.string() + ": not valid JSON: " + e.what());
  }
}

namespace {

// DIR/tokenizer_config.json as an object (empty when absent or not an object).
json tokenizer_config(const fs::path& dir) {
  json j = read_json_or_empty(dir / "tokenizer_config.json");
  return j.is_object() ? j : json::object();
}

}  // namespace

void check_model_path(const fs::path& model) {
  if (fs::is_directory(model)) return;
  if (!fs::exists(model))
    fail("model " + model.string() + " does not exist (a model directory or a .gguf file)");
  if (!is_gguf_file(model)) fail(model.string() + " is neither a model directory nor a GGUF file");
}

Tokenizer load_model_tokenizer(const fs::path& model) {
  if (is_gguf_file(model)) return Tokenizer::from_gguf(*GgufFile::open(model));
  const fs::path tj = model / "tokenizer.json";
  if (!fs::exists(tj)) fail(model.string() + ": tokenizer.json is missing");
  return Tokenizer::from_file(tj);
}

bool model_adds_bos(const fs::path& model) {
  if (is_gguf_file(model)) return GgufFile::open(model)->get_bool("tokenizer.ggml.add_bos_token", false);
  const json tc = tokenizer_config(model);
  return tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean() && tc["add_bos_token"].get<bool>();
}

std::string model_chat_template(const fs::path& model) {
  if (is_gguf_file(model)) return GgufFile::open(model)->get_string("tokenizer.chat_template", "");
  const json tc = tokenizer_config(model);
  std::string tmpl;
  if (tc.contains("chat_template")) {
    const auto& ct = tc["chat_template"];
    if (ct.is_string()) {
      tmpl = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]
      for (const auto& e : ct)
        if (e.is_object() && e.contains("template") && e["template"].is_string())
          tmpl += e["template"].get<std::string>();
    }
  }
  return tmpl;
}

}  // namespace tessera
