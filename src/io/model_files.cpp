#include "io/model_files.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"

namespace tessera {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// DIR/tokenizer_config.json, or an empty object when it does not exist.
json tokenizer_config(const fs::path& dir) {
  const fs::path p = dir / "tokenizer_config.json";
  std::ifstream f(p);
  if (!f) return json::object();
  try {
    json j = json::parse(f);
    return j.is_object() ? j : json::object();
  } catch (const std::exception& e) {
    fail(p.string() + ": not valid JSON: " + e.what());
  }
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
