#include "io/model_files.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

std::vector<NamedChatTemplate> model_chat_templates(const fs::path& model) {
  std::vector<NamedChatTemplate> out;
  if (is_gguf_file(model)) {
    const auto g = GgufFile::open(model);
    if (std::string t = g->get_string("tokenizer.chat_template", ""); !t.empty())
      out.push_back({"default", t});
    if (std::string t = g->get_string("tokenizer.chat_template.tool_use", ""); !t.empty())
      out.push_back({"tool_use", t});
    return out;
  }
  // transformers' order: chat_template.jinja wins over tokenizer_config.json's chat_template.
  if (const fs::path f = model / "chat_template.jinja"; fs::exists(f)) {
    std::ifstream in(f, std::ios::binary);
    if (!in) fail(f.string() + ": cannot be read (" + std::strerror(errno) + ")");
    std::ostringstream text;
    text << in.rdbuf();
    out.push_back({"default", text.str()});
    return out;
  }
  const json tc = tokenizer_config(model);
  if (!tc.contains("chat_template")) return out;
  const auto& ct = tc["chat_template"];
  if (ct.is_string()) {
    out.push_back({"default", ct.get<std::string>()});
  } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]
    for (const auto& e : ct)
      if (e.is_object() && e.contains("template") && e["template"].is_string())
        out.push_back({e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "default",
                       e["template"].get<std::string>()});
  } else if (!ct.is_null()) {
    fail((model / "tokenizer_config.json").string() +
         ": chat_template must be a string or a list of {\"name\", \"template\"}");
  }
  return out;
}

std::string model_chat_template(const fs::path& model) {
  std::string tmpl;
  for (const auto& t : model_chat_templates(model)) tmpl += t.text;
  return tmpl;
}

std::string model_special_token(const fs::path& model, const char* key) {
  if (is_gguf_file(model)) return "";
  const json tc = tokenizer_config(model);
  if (!tc.contains(key)) return "";
  const json& v = tc[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

}  // namespace tessera
