#include "fuzz/targets.h"

#include <unistd.h>
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <typeinfo>
#include <vector>

#include "apps/tessera/cli_session.h"
#include "apps/tessera/serve_request.h"
#include "core/error.h"
#include "io/jinja/jinja.h"
#include "io/llama2c.h"
#include "io/tokenizer.h"

#ifndef TESSERA_SOURCE_DIR
#error "TESSERA_SOURCE_DIR must name the repository (the fuzz targets read models/tessera-tiny)"
#endif
#ifndef TESSERA_SHARED_DIR
#error "TESSERA_SHARED_DIR must name ../shared"
#endif

namespace tessera::fuzz {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFileTag = "#tessera-fuzz-file ";
const char* const kHfFiles[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                "generation_config.json"};

int64_t g_variants_run = 0;

// One scratch directory per process, emptied before each input.
const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tessera-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

fs::path fresh_dir(const char* name) {
  const fs::path d = scratch() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Finding("fuzz harness: cannot write " + p.string());
}

std::string_view as_text(std::span<const uint8_t> d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// Runs `body`: "" when it returns, the message of a tessera::Error, Finding for any other exception.
template <typename F>
std::string guarded(const char* target, F&& body) {
  try {
    body();
    return "";
  } catch (const Error& e) {
    return std::string(e.what()).empty() ? "(empty error message)" : e.what();
  } catch (const Finding&) {
    throw;
  } catch (const std::exception& e) {
    throw Finding(std::string(target) + ": an exception that is not tessera::Error (" + typeid(e).name() +
                  "): " + e.what());
  } catch (...) {
    throw Finding(std::string(target) + ": an exception of unknown type");
  }
}

void check_output(const char* target, const cli::Session& s, const cli::Session::Output& out,
                  int gen_length) {
  if (static_cast<int>(out.result.tokens.size()) > gen_length)
    throw Finding(std::string(target) + ": more than gen_length tokens came back");
  for (const int32_t t : out.result.tokens) {
    if (t < 0 || t >= s.config().vocab)
      throw Finding(std::string(target) + ": a token outside the vocabulary came back");
  }
}

// Loads the model at `path` as `tessera generate` does and generates 4 tokens, raw and (when the model
// has a chat template) with it; then 8 tokens with each approximation the model takes (KV cache,
// SparseD, Window-Diffusion, DES on MoE models), where the options validate for it.
void load_and_generate(const fs::path& path) {
  cli::SessionArgs a;
  a.model = path.string();
  a.gen_length = 4;
  a.steps = 4;
  a.no_progress = true;
  cli::Session s(a);
  std::vector<int32_t> raw;
  for (const bool chat : {false, true}) {
    if (chat && !s.has_chat_template()) continue;
    const auto ids = s.prompt_ids({{"user", "Hello there"}}, chat);
    check_output("model", s, s.run(ids, nullptr), 4);
    if (!chat) raw = ids;
  }
  const bool block_causal = s.engine().attention_block() > 0;
  std::vector<GenerateOptions> variants;
  GenerateOptions o = s.options();
  o.gen_length = 8;
  o.steps = 8;
  o.block_length = block_causal ? o.block_length : 4;
  o.cache = KvCache::Dual;
  variants.push_back(o);
  o.cache = KvCache::None;
  o.sparse = true;
  o.sparse_block = 2;
  o.sparse_skip = 0.25f;
  variants.push_back(o);
  o.sparse = false;
  o.window = true;
  o.window_ex = 4;
  o.window_in = 2;
  o.window_refresh = 2;
  o.block_length = o.gen_length;
  variants.push_back(o);
  o.window = false;
  if (s.engine().supports_expert_sharing()) {
    o.des = DesMode::Vote;
    o.des_beta = 0.5f;
    variants.push_back(o);
  }
  for (const GenerateOptions& v : variants) {
    try {
      validate_generate_options(v, s.config().vocab, block_causal);
      if (v.des != DesMode::Off) s.engine().check_des(des_config(v));
      if (s.canvas_length(static_cast<int64_t>(raw.size()), v) > s.config().max_positions) continue;
    } catch (const Error& e) {
      if (std::getenv("TESSERA_FUZZ_VERBOSE")) std::fprintf(stderr, "variant skipped: %s\n", e.what());
      continue;  // not an option set this model takes
    }
    try {
      check_output("model", s, s.run(raw, v, {}), v.gen_length);
    } catch (const Error& e) {  // refused when it starts (e.g. sparse attention on a causal model)
      if (std::getenv("TESSERA_FUZZ_VERBOSE")) std::fprintf(stderr, "variant refused: %s\n", e.what());
      continue;
    }
    ++g_variants_run;
  }
}

std::optional<std::string> nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::nullopt;  // not valid UTF-8
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

void check_round_trip(const Tokenizer& t, const char* name, std::string_view text) {
  const std::optional<std::string> want = nfc(text);
  for (const bool special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, special);
    const std::string back = t.decode(ids);
    std::string cat;
    for (const int32_t id : ids) cat += t.token_text(id);
    if (cat != back)
      throw Finding(std::string("tokenize: ") + name + ": token texts do not concatenate to decode()");
    // Added tokens are matched before the normalizer, so the pieces between them are normalized
    // apart; NFC of the whole is the same either way.
    if (want && nfc(back) != want) {
      throw Finding(std::string("tokenize: ") + name + ": decode(encode(text)) is not the text (NFC), " +
                    (special ? "special tokens parsed" : "special tokens as text"));
    }
  }
}

}  // namespace

std::string model(std::span<const uint8_t> data) {
  const std::string_view bytes = as_text(data);
  fs::path path;
  if (bytes.substr(0, 4) == "GGUF") {
    path = fresh_dir("gguf") / "model.gguf";
    write_file(path, bytes);
  } else {
    path = fresh_dir("hf");
    size_t at = bytes.find(kFileTag);
    while (at != std::string_view::npos) {
      const size_t name_at = at + kFileTag.size();
      const size_t eol = bytes.find('\n', name_at);
      if (eol == std::string_view::npos) break;
      const std::string_view name = bytes.substr(name_at, eol - name_at);
      const size_t next = bytes.find(kFileTag, eol + 1);
      const std::string_view body =
          bytes.substr(eol + 1, next == std::string_view::npos ? std::string_view::npos : next - eol - 1);
      for (const char* known : kHfFiles) {
        if (name == known) write_file(path / known, body);
      }
      at = next;
    }
  }
  return guarded("model", [&] { load_and_generate(path); });
}

int64_t model_variants_run() {
  return g_variants_run;
}

std::string tokenize(std::span<const uint8_t> data) {
  static const Tokenizer tiny =
      Tokenizer::from_file(fs::path(TESSERA_SOURCE_DIR) / "models/tessera-tiny/tokenizer.json");
  static const std::optional<Tokenizer> qwen2 = [] {
    const fs::path p = fs::path(TESSERA_SHARED_DIR) / "tokenizers/qwen2/tokenizer.json";
    return fs::exists(p) ? std::optional(Tokenizer::from_file(p)) : std::nullopt;
  }();
  const std::string_view text = as_text(data);
  return guarded("tokenize", [&] {
    check_round_trip(tiny, "tessera-tiny", text);
    if (qwen2) check_round_trip(*qwen2, "qwen2", text);
  });
}

std::string llama2c(std::span<const uint8_t> data) {
  const fs::path tok = fs::path(TESSERA_SHARED_DIR) / "models/stories260K/tok512.bin";
  if (!fs::exists(tok)) return "";
  const fs::path dir = fresh_dir("llama2c");
  write_file(dir / "model.bin", as_text(data));
  return guarded("llama2c", [&] {
    convert_llama2c(dir / "model.bin", tok, dir / "out");
    load_and_generate(dir / "out");
  });
}

std::string request(std::span<const uint8_t> data) {
  if (data.empty()) return "";
  static std::unique_ptr<cli::Session> sessions[2];
  const bool chat = (data[0] & 1) != 0;
  const int which = (data[0] >> 1) & 1;
  if (!sessions[which]) {
    cli::SessionArgs a;
    a.model =
        (fs::path(TESSERA_SOURCE_DIR) / "models" / (which ? "tessera-tiny-moe" : "tessera-tiny")).string();
    a.no_progress = true;
    sessions[which] = std::make_unique<cli::Session>(a);
  }
  cli::Session& s = *sessions[which];
  const int route = (data[0] >> 2) & 3;  // 0, 1: a completion or chat body; 2: /tokenize; 3: /detokenize
  std::optional<cli::ParsedRequest> r;
  const std::string refused = guarded("request", [&] {
    try {
      if (route == 2) {
        const cli::TokenizeRequest t = cli::parse_tokenize(as_text(data.subspan(1)), s);
        for (const int32_t id : t.tokens)
          if (id < 0 || id >= s.config().vocab) throw Finding("tokenize: id " + std::to_string(id));
        return;
      }
      if (route == 3) {
        (void)cli::parse_detokenize(as_text(data.subspan(1)), s);
        return;
      }
      r = cli::parse_request(as_text(data.subspan(1)), chat, s, "tessera-tiny");
    } catch (const cli::BadRequest& b) {
      if (b.status != 400 && b.status != 404) throw Finding("request: status " + std::to_string(b.status));
      const nlohmann::json e = nlohmann::json::parse(cli::error_body(b));  // must be valid JSON
      if (!e["error"]["message"].is_string() || b.message.empty()) throw Finding("request: no message");
      throw Error(b.message);
    }
  });
  if (!refused.empty() || !r) return refused;
  const GenerateOptions& o = r->options;
  if (o.gen_length > 16 || o.steps > 16) return "";
  return guarded("request",
                 [&] { check_output("request", s, s.run(r->prompts.front(), o, {}), o.gen_length); });
}

std::string jinja(std::span<const uint8_t> data) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call00001", "content": "21 C"},
      {"role": "user", "content": "And Rome?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})");
  jinja::Limits limits;
  limits.max_steps = 200000;
  limits.max_output = 1u << 20;
  return guarded("jinja", [&] {
    const jinja::Template t(as_text(data), "fuzzed template");
    const std::string out = t.render(context, limits);
    if (out.size() > limits.max_output) throw Finding("jinja: output beyond max_output");
  });
}

std::string run(std::string_view name, std::span<const uint8_t> data) {
  if (name == "jinja") return jinja(data);
  if (name == "model") return model(data);
  if (name == "tokenize") return tokenize(data);
  if (name == "llama2c") return llama2c(data);
  if (name == "request") return request(data);
  throw Finding("no fuzz target named '" + std::string(name) + "'");
}

}  // namespace tessera::fuzz
