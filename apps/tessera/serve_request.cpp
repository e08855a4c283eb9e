#include "apps/tessera/serve_request.h"

#include <algorithm>
#include <cfloat>
#include <optional>
#include <set>

#include "core/error.h"

namespace tessera::cli {
using json = nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& msg, int status = 400,
                      const std::string& type = "invalid_request_error") {
  throw BadRequest{status, type, msg};
}

bool given(const json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// Typed fields of the request body: a wrong JSON type or a value out of range is a 400 naming the field.
int64_t int_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
    bad(std::string("'") + key + "' must be an integer");
  return v.get<int64_t>();
}
double num_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_number()) bad(std::string("'") + key + "' must be a number");
  return v.get<double>();
}
float float_field(const json& body, const char* key) {
  const double v = num_field(body, key);
  if (!(v >= -FLT_MAX && v <= FLT_MAX)) bad(std::string("'") + key + "' is out of range");
  return static_cast<float>(v);
}
std::string str_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_string()) bad(std::string("'") + key + "' must be a string");
  return v.get<std::string>();
}
bool bool_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_boolean()) bad(std::string("'") + key + "' must be true or false");
  return v.get<bool>();
}

// The fields of a request body: those both routes take (OpenAI's and tessera's generation options),
// then each route's own. A field of the other route is refused by name, as is one neither knows.
const std::set<std::string, std::less<>> kShared = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stream",
    "stream_options", "n", "stop", "user", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
    // tessera's options
    "steps", "block_length", "alg", "threshold", "cache", "mode", "spec_sampling", "draft_threshold",
    "sparse", "sparse_block", "sparse_rho", "sparse_skip", "des", "des_k", "des_beta", "des_scope", "window",
    "window_ex", "window_in", "window_refresh", "window_early_stop", "cfg", "edit_mode", "edit_threshold",
    "max_post_steps", "edit_penalty", "canvas"};
const std::set<std::string, std::less<>> kCompletionOnly = {"prompt", "suffix", "echo", "best_of"};
const std::set<std::string, std::less<>> kChatOnly = {
    "messages", "top_logprobs", "response_format", "tools",      "tool_choice",         "parallel_tool_calls",
    "store",    "metadata",     "service_tier",    "modalities", "chat_template_kwargs"};

void route_fields(const json& body, bool chat) {
  const auto& own = chat ? kChatOnly : kCompletionOnly;
  const auto& other = chat ? kCompletionOnly : kChatOnly;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (kShared.count(k) != 0 || own.count(k) != 0) continue;
    if (other.count(k) != 0)
      bad("'" + k + "' is a " + (chat ? "completions" : "chat completions") +
          " field; this route takes none");
    bad("unknown field '" + k + "'");
  }
}

// OpenAI's fields that this server takes only with the values that change nothing here (nothing stored,
// one service tier): any other value is a 400, never a
// silently different answer. best_of is checked with n (parse_request).
void noop_fields(const json& body) {
  if (given(body, "logit_bias")) {
    const json& v = body["logit_bias"];
    if (!v.is_object()) bad("'logit_bias' must be an object");
    if (!v.empty()) bad("'logit_bias' is not supported (only {})");
  }
  if (given(body, "store") && bool_field(body, "store"))
    bad("'store': true is not supported (this server keeps no completions)");
  if (given(body, "metadata") && !body["metadata"].is_object()) bad("'metadata' must be an object");
  if (given(body, "service_tier")) {
    const std::string t = str_field(body, "service_tier");
    if (t != "auto" && t != "default" && t != "flex" && t != "scale" && t != "priority")
      bad("'service_tier' must be auto, default, flex, scale or priority (this server has one tier)");
  }
  if (given(body, "modalities")) {
    const json& v = body["modalities"];
    if (!v.is_array() || v.empty()) bad("'modalities' must be a non-empty array");
    for (const json& m : v)
      if (m != "text") bad("'modalities' other than \"text\" are not supported");
  }
  if (given(body, "user")) (void)str_field(body, "user");
}

// 400 for a field of the object `body` that is not one of `known` (named `prefix` + its key).
void only_fields(const json& body, std::initializer_list<const char*> known, const std::string& prefix = "") {
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      bad("unknown field '" + prefix + it.key() + "'");
  }
}

// Generation options of a request: the session's defaults, then the request's fields.
GenerateOptions options(const json& body, bool chat, const Session& session, const std::string& model_id,
                        int max_tokens) {
  route_fields(body, chat);
  noop_fields(body);
  if (given(body, "model")) {
    check_model(str_field(body, "model"), model_id);
  }
  if (given(body, "echo") && body["echo"] != false) bad("'echo' is not supported");
  for (const char* k : {"presence_penalty", "frequency_penalty"}) {
    if (given(body, k) && num_field(body, k) != 0.0)
      bad(std::string("'") + k + "' is not supported (only 0)");
  }
  const bool block_causal = session.block_causal();
  GenerateOptions o = session.options();
  const int64_t ctx = session.config().max_positions;
  const char* len_key = given(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (given(body, len_key)) {
    const int64_t n = int_field(body, len_key),
                  most = max_tokens > 0 ? std::min<int64_t>(ctx, max_tokens) : ctx;
    if (n <= 0 || n > most)
      bad(std::string("'") + len_key + "' must be in [1, " + std::to_string(most) + "]" +
          (most < ctx ? " (--max-tokens)" : "") + ", got " + std::to_string(n));
    // What follows the length is fitted to it as `tessera generate -n` fits it (Session::fit_layout): the
    // server's block, or the largest that divides the length, and its steps per token; a block or steps
    // the request gives are kept (and checked below).
    auto given_int = [&](const char* k) -> std::optional<int> {
      if (!given(body, k) || !body[k].is_number_integer()) return std::nullopt;
      const int64_t v = body[k].get<int64_t>();
      return v > 0 && v <= ctx ? std::optional<int>(static_cast<int>(v)) : std::nullopt;
    };
    session.fit_layout(o, static_cast<int>(n), given_int("block_length"), given_int("steps"));
  }
  // A choice (an enum) from its name; an unknown name is a 400 that names it and the choices.
  auto choice = [&](auto parse, const char* k) {
    const std::string v = str_field(body, k);
    try {
      return parse(v);
    } catch (const Error& e) {
      bad(e.what());
    }
  };
  auto small_int = [&](const char* k) {
    const int64_t v = int_field(body, k);
    if (v < 0 || v > ctx) bad(std::string("'") + k + "' must be in [0, " + std::to_string(ctx) + "]");
    return static_cast<int>(v);
  };
  if (given(body, "stop")) {  // a string or an array of up to 4 (OpenAI's limit), none empty
    const json& v = body["stop"];
    const char* what = "'stop' must be a non-empty string or an array of 1 to 4 non-empty strings";
    o.stop.clear();
    if (v.is_string()) {
      o.stop.push_back(v.get<std::string>());
    } else if (v.is_array() && !v.empty() && v.size() <= 4) {
      for (const json& e : v) {
        if (!e.is_string()) bad(what);
        o.stop.push_back(e.get<std::string>());
      }
    } else {
      bad(what);
    }
    for (const std::string& t : o.stop)
      if (t.empty()) bad(what);
  }
  if (given(body, "temperature")) o.temperature = float_field(body, "temperature");
  if (given(body, "top_p")) o.top_p = float_field(body, "top_p");
  if (given(body, "top_k")) o.top_k = small_int("top_k");
  if (given(body, "seed")) {
    const int64_t seed = int_field(body, "seed");
    if (seed < 0) bad("'seed' must be >= 0");
    o.seed = static_cast<uint64_t>(seed);
  }
  if (given(body, "steps")) o.steps = small_int("steps");
  if (given(body, "block_length")) o.block_length = small_int("block_length");
  if (given(body, "alg")) o.alg = choice(parse_unmask, "alg");
  if (given(body, "threshold")) o.threshold = float_field(body, "threshold");
  if (given(body, "cache")) o.cache = choice(parse_kv_cache, "cache");
  if (given(body, "mode")) o.mode = choice(parse_decode_mode, "mode");
  if (given(body, "spec_sampling")) o.spec_sampling = choice(parse_spec_sampling, "spec_sampling");
  if (given(body, "draft_threshold")) o.draft_threshold = float_field(body, "draft_threshold");
  if (given(body, "sparse")) o.sparse = bool_field(body, "sparse");
  if (given(body, "sparse_block")) {
    o.sparse_block = small_int("sparse_block");
    o.sparse = true;
  }
  for (auto [k, dst] :
       {std::pair<const char*, float*>{"sparse_rho", &o.sparse_rho}, {"sparse_skip", &o.sparse_skip}}) {
    if (!given(body, k)) continue;
    *dst = float_field(body, k);
    o.sparse = true;
  }
  if (given(body, "des_k")) o.des_k = small_int("des_k");
  if (given(body, "des_beta")) o.des_beta = float_field(body, "des_beta");
  if (given(body, "des_scope")) o.des_scope = choice(parse_des_scope, "des_scope");
  if (given(body, "window")) o.window = bool_field(body, "window");
  if (given(body, "window_early_stop")) o.window_early_stop = bool_field(body, "window_early_stop");
  if (o.window_early_stop) o.window = true;
  for (auto [k, dst] : {std::pair<const char*, int*>{"window_ex", &o.window_ex},
                        {"window_in", &o.window_in},
                        {"window_refresh", &o.window_refresh}}) {
    if (!given(body, k)) continue;
    *dst = small_int(k);
    o.window = true;
  }
  if (given(body, "cfg")) o.cfg_scale = float_field(body, "cfg");
  if (given(body, "suffix")) {  // infilling: the text after the completion
    const std::string t = str_field(body, "suffix");
    try {
      o.suffix = session.suffix_ids(t, "'suffix'");
    } catch (const Error& e) {
      bad(e.what());
    }
  }
  try {
    EditFlags ef;
    if (given(body, "edit_mode")) ef.mode = choice(parse_edit_mode, "edit_mode");
    if (given(body, "threshold")) ef.threshold = o.threshold;
    if (given(body, "edit_threshold")) ef.edit_threshold = float_field(body, "edit_threshold");
    if (given(body, "edit_penalty")) ef.penalty = float_field(body, "edit_penalty");
    if (given(body, "max_post_steps")) ef.max_post = small_int("max_post_steps");
    apply_edit_flags(ef, o);
    o.des = implied_des(given(body, "des") ? std::optional(parse_des(str_field(body, "des"))) : std::nullopt,
                        given(body, "des_k"), given(body, "des_beta"), o.des);
    // The model's default unmasking gives way to low_confidence where the request needs a probability-
    // like confidence (threshold, cfg, editing), as in `tessera generate`.
    if (!given(body, "alg") && o.alg == session.default_alg()) fit_default_alg(o);
    validate_generate_options(o, session.config().vocab, block_causal);
    // What only the model can tell (an MoE model, k <= top_k) fails here, before a stream starts.
    if (o.des != DesMode::Off) session.engine().check_des(des_config(o));
  } catch (const Error& e) {
    bad(e.what());
  }
  return o;
}

// A completions request's prompts: a string, an array of token ids, or an array of strings or of arrays
// of token ids (each prompt as given: no BOS is added to token ids).
std::vector<std::vector<int32_t>> completion_prompts(const json& body, const Session& session,
                                                     const GenerateOptions& o) {
  if (!body.contains("prompt")) bad("'prompt' is required");
  const json& p = body["prompt"];
  const char* what =
      "'prompt' must be a string, an array of token ids, or an array of strings or of token-id arrays";
  auto ids_of = [&](const json& a) {
    if (a.empty()) bad("a token-id prompt must not be empty");
    std::vector<int32_t> ids;
    for (const json& t : a) {
      if (!t.is_number_integer()) bad(what);
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v > INT32_MAX) bad("token id " + std::to_string(v) + " of the prompt is out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    try {
      session.check_prompt(ids, o, false);
    } catch (const Error& e) {
      bad(e.what());
    }
    return ids;
  };
  auto text_of = [&](const json& s) {
    try {
      return session.prompt_ids({{"user", s.get<std::string>()}}, false, o);
    } catch (const Error& e) {
      bad(e.what());
    }
  };
  if (p.is_string()) return {text_of(p)};
  if (!p.is_array() || p.empty()) bad(what);
  if (p[0].is_number_integer()) return {ids_of(p)};
  std::vector<std::vector<int32_t>> out;
  for (const json& e : p) {
    if (e.is_string())
      out.push_back(text_of(e));
    else if (e.is_array())
      out.push_back(ids_of(e));
    else
      bad(what);
  }
  return out;
}

}  // namespace

void check_model(const std::string& asked, const std::string& model_id) {
  if (asked != model_id && asked != "tessera") {
    bad("model '" + asked + "' is not served here; this server serves '" + model_id + "'", 404,
        "not_found_error");
  }
}

std::string error_body(const BadRequest& b) {
  // A message may quote what the client sent (a field's name, a value, the path): an error never grows
  // with the input, whatever the message quotes.
  std::string message = b.message;
  if (message.size() > kMaxErrorMessage) {
    size_t cut = kMaxErrorMessage;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80)
      --cut;  // a character's start
    message = message.substr(0, cut) + "... (" + std::to_string(b.message.size()) + " bytes in all)";
  }
  const json j = {{"error", {{"message", message}, {"type", b.type}, {"param", nullptr}, {"code", nullptr}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// The deepest nesting of arrays and objects in JSON text (strings skipped), counted before parsing: the
// parser builds every level (16 MiB of '[' took 16 s and 1.25 GB), and no request needs more than a few.
int nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// The body as a JSON object, or a 400.
json object_body(std::string_view body_text) {
  if (nesting(body_text) > kMaxNesting)
    bad("the body nests arrays and objects deeper than " + std::to_string(kMaxNesting) + " levels");
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {  // the library's own text quotes the input and names itself
    bad("the body is not valid JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception&) {  // out_of_range: a number too large for a double
    bad("the body is not valid JSON: a number is out of range");
  }
  if (!body.is_object()) bad("the request body must be a JSON object");
  return body;
}

}  // namespace

TokenizeRequest parse_tokenize(std::string_view body_text, const Session& session) {
  const json body = object_body(body_text);
  only_fields(body, {"content", "add_special", "with_pieces"});
  if (!given(body, "content")) bad("'content' is required");
  const std::string text = str_field(body, "content");
  try {
    check_utf8(text, "'content'");
  } catch (const Error& e) {
    bad(e.what());
  }
  TokenizeRequest r;
  const bool bos = given(body, "add_special") && bool_field(body, "add_special") && session.adds_bos();
  r.tokens = encode_raw(session.tokenizer(), text, bos ? session.config().bos_id : -1);
  r.with_pieces = given(body, "with_pieces") && bool_field(body, "with_pieces");
  return r;
}

std::string parse_detokenize(std::string_view body_text, const Session& session) {
  const json body = object_body(body_text);
  only_fields(body, {"tokens"});
  if (!given(body, "tokens") || !body["tokens"].is_array()) bad("'tokens' must be an array of token ids");
  const int64_t vocab = session.config().vocab;
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer()) bad("'tokens' must be an array of token ids");
    const bool in = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(vocab)
                                           : t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab;
    if (!in)
      bad("token id " + t.dump() + " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  try {
    return session.tokenizer().decode(ids, false);
  } catch (const Error& e) {  // an id of the model's vocabulary that its tokenizer has no text for
    bad(e.what());
  }
}

ParsedRequest parse_request(std::string_view body_text, bool chat, const Session& session,
                            const std::string& model_id, const RequestLimits& limits) {
  ParsedRequest r;
  const json body = object_body(body_text);
  r.options = options(body, chat, session, model_id, limits.max_tokens);
  if (limits.max_tokens > 0 && r.options.gen_length > limits.max_tokens)
    bad("the model's default generation length " + std::to_string(r.options.gen_length) +
        " exceeds this server's --max-tokens " + std::to_string(limits.max_tokens) + "; set 'max_tokens'");
  if (given(body, "n")) {
    const int64_t n = int_field(body, "n");
    if (n < 1 || n > kMaxChoices) bad("'n' must be in [1, " + std::to_string(kMaxChoices) + "]");
    r.n = static_cast<int>(n);
  }
  if (given(body, "best_of") && int_field(body, "best_of") != r.n)  // OpenAI: best_of >= n
    bad("'best_of' is supported only equal to 'n' (" + std::to_string(r.n) +
        "): this server does not rank extra choices");
  // Counted from the JSON before any prompt is tokenized.
  size_t prompts = 1;
  if (!chat && body.contains("prompt") && body["prompt"].is_array() && !body["prompt"].empty() &&
      !body["prompt"][0].is_number())
    prompts = body["prompt"].size();
  if (prompts * static_cast<size_t>(r.n) > static_cast<size_t>(limits.max_sequences)) {
    bad("a request may ask for at most " + std::to_string(limits.max_sequences) +
        " choices in all (prompts x n), got " + std::to_string(prompts) + " x " + std::to_string(r.n));
  }
  if (chat) {
    ChatPrompt c = chat_prompt(nlohmann::ordered_json::parse(body_text), session, r.options);
    r.prompts = {std::move(c.ids)};
    r.reply = std::move(c.reply);
    r.prompt_text = std::move(c.text);
    r.options.constraint = std::move(c.constraint);
  } else {
    r.prompts = completion_prompts(body, session, r.options);
  }
  // OpenAI's logprobs: an integer in completions, a flag plus top_logprobs in chat completions.
  const std::string top_max = std::to_string(kTopLogprobs);
  if (chat) {
    const bool lp = given(body, "logprobs") && bool_field(body, "logprobs");
    if (given(body, "top_logprobs")) {
      const int64_t k = int_field(body, "top_logprobs");
      if (k < 0 || k > kTopLogprobs) bad("'top_logprobs' must be in [0, " + top_max + "]");
      if (!lp) bad("'top_logprobs' needs 'logprobs': true");
      r.logprobs = static_cast<int>(k);
    } else if (lp) {
      r.logprobs = 0;
    }
  } else if (given(body, "logprobs")) {
    const int64_t k = int_field(body, "logprobs");
    if (k < 0 || k > kTopLogprobs) bad("'logprobs' must be an integer in [0, " + top_max + "]");
    r.logprobs = static_cast<int>(k);
  }
  r.options.logprobs = r.logprobs >= 0;
  if (given(body, "stream")) r.stream = bool_field(body, "stream");
  if (given(body, "canvas")) r.canvas = bool_field(body, "canvas");
  if (r.canvas && !r.stream) bad("'canvas' streams the steps as events; set 'stream': true");
  if (given(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad("'stream_options' must be an object");
    only_fields(so, {"include_usage"}, "stream_options.");
    if (given(so, "include_usage")) r.include_usage = bool_field(so, "include_usage");
  }
  return r;
}

}  // namespace tessera::cli
