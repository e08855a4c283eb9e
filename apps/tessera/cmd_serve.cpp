// tessera serve: an OpenAI-compatible HTTP server (cpp-httplib) over one Session.
//   GET  /health, /v1/models
//   POST /v1/completions       {"prompt": "...", "max_tokens": N, "temperature": T, "stream": bool, ...}
//   POST /v1/chat/completions  {"messages": [{"role": "user", "content": "..."}], ...}
// Requests run one at a time (one engine; later requests wait). Besides OpenAI's fields a request may
// set tessera's generation options: steps, block_length, alg, threshold, cache, cfg, top_k, sparse*,
// des*, window, window_ex, window_in, window_refresh, window_early_stop. A field
// the server does not know, a value it cannot honour (n > 1, stop, logprobs, penalties), a prompt that
// does not fit the context or a bad value gets a 400 with an OpenAI-style error object, never a
// silently different generation. Streaming (SSE): a diffusion model decides positions out of order, so
// each event carries the text of the generation's decided prefix that was not sent yet (the positions
// up to the first undecided one); the events concatenate to the final text. Then a last event with the
// finish_reason, and "data: [DONE]". A model without a chat template gets the chat messages
// concatenated (as `tessera chat` does).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "apps/tessera/commands.h"
#include "apps/tessera/session.h"
#include "core/error.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct ServeArgs {
  SessionArgs session;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_id;  // default: the model directory's name
};

// A request the server refuses: HTTP status, OpenAI error type, message.
struct BadRequest {
  int status;
  std::string type, message;
};

[[noreturn]] void bad(const std::string& msg, int status = 400,
                      const std::string& type = "invalid_request_error") {
  throw BadRequest{status, type, msg};
}

json error_body(const BadRequest& b) {
  return {{"error", {{"message", b.message}, {"type", b.type}, {"param", nullptr}, {"code", nullptr}}}};
}

// The stopped-by-client signal of a stream: thrown from the step callback to end generate().
struct ClientGone {};

// Typed fields of the request body: a wrong JSON type is a 400 naming the field.
int64_t int_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_number_integer()) bad(std::string("'") + key + "' must be an integer");
  return v.get<int64_t>();
}
double num_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_number()) bad(std::string("'") + key + "' must be a number");
  return v.get<double>();
}
std::string str_field(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_string()) bad(std::string("'") + key + "' must be a string");
  return v.get<std::string>();
}
bool given(const json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// Every generation runs on this one thread, whichever connection thread asked for it: requests are
// served one at a time, and OpenMP keeps one team (a team per calling thread made steps 2x slower:
// 580 ms vs 290 ms for 64 tokens of tessera-tiny when httplib's workers took turns).
class EngineThread {
 public:
  EngineThread() : thread_([this] { loop(); }) {}
  ~EngineThread() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;
  // Runs `job` there and waits; its exception, if any, is rethrown here.
  void run(const std::function<void()>& job) {
    std::packaged_task<void()> task(job);
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> l(m_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_one();
    done.get();
  }

 private:
  void loop() {
    while (true) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

class Server {
 public:
  explicit Server(const ServeArgs& a) : args_(a), session_(a.session) {
    model_id_ = a.model_id;
    if (model_id_.empty()) {
      fs::path p = fs::absolute(session_.model_dir()).lexically_normal();
      if (!p.has_filename()) p = p.parent_path();
      model_id_ = p.filename().string();
    }
    block_causal_ = session_.engine().attention_block() > 0;
  }

  int run() {
    httplib::Server svr;
    // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server bind the same port and
    // silently take half of the requests; here the second one fails to start.
    svr.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    svr.set_payload_max_length(size_t{16} << 20);
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json j = {
          {"object", "list"},
          {"data",
           json::array(
               {{{"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "tessera"}}})}};
      res.set_content(j.dump(), "application/json");
    });
    svr.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
    svr.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error body
      const BadRequest b{res.status, res.status == 404 ? "not_found_error" : "invalid_request_error",
                         res.status == 404 ? "no route " + req.method + " " + req.path
                                           : "HTTP " + std::to_string(res.status)};
      res.set_content(error_body(b).dump(), "application/json");
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      res.status = 500;
      res.set_content(error_body({500, "server_error", msg}).dump(), "application/json");
    });
    const int port = args_.port == 0 ? svr.bind_to_any_port(args_.host)
                                     : (svr.bind_to_port(args_.host, args_.port) ? args_.port : -1);
    if (port < 0) {
      fail("cannot listen on " + args_.host + ":" + std::to_string(args_.port) +
           " (address in use, not a local address, or a privileged port)");
    }
    std::fprintf(stderr, "tessera serve: %s (%s) on http://%s:%d\n", model_id_.c_str(),
                 session_.model_dir().c_str(), args_.host.c_str(), port);
    std::fflush(stderr);
    if (!svr.listen_after_bind()) fail("the server stopped unexpectedly");
    return 0;
  }

 private:
  // Generation options of a request: the session's defaults, then the request's fields.
  GenerateOptions options(const json& body) const {
    static const std::set<std::string> known = {"model",
                                                "prompt",
                                                "messages",
                                                "max_tokens",
                                                "max_completion_tokens",
                                                "temperature",
                                                "top_p",
                                                "top_k",
                                                "seed",
                                                "stream",
                                                "stream_options",
                                                "n",
                                                "stop",
                                                "user",
                                                "logprobs",
                                                "top_logprobs",
                                                "echo",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "steps",
                                                "block_length",
                                                "alg",
                                                "threshold",
                                                "cache",
                                                "sparse",
                                                "sparse_block",
                                                "sparse_rho",
                                                "sparse_skip",
                                                "des",
                                                "des_k",
                                                "des_beta",
                                                "des_scope",
                                                "window",
                                                "window_ex",
                                                "window_in",
                                                "window_refresh",
                                                "window_early_stop",
                                                "cfg"};
    for (const auto& [k, v] : body.items()) {
      if (!known.count(k)) bad("unknown field '" + k + "'");
    }
    if (given(body, "model")) {
      const std::string m = str_field(body, "model");
      if (m != model_id_ && m != "tessera") {
        bad("model '" + m + "' is not served here; this server serves '" + model_id_ + "'", 404,
            "not_found_error");
      }
    }
    if (given(body, "n") && int_field(body, "n") != 1) bad("only n = 1 is supported");
    if (given(body, "stop")) bad("'stop' sequences are not supported");
    for (const char* k : {"logprobs", "echo"}) {
      if (given(body, k) && body[k] != false) bad(std::string("'") + k + "' is not supported");
    }
    if (given(body, "top_logprobs")) bad("'top_logprobs' is not supported");
    for (const char* k : {"presence_penalty", "frequency_penalty"}) {
      if (given(body, k) && num_field(body, k) != 0.0)
        bad(std::string("'") + k + "' is not supported (only 0)");
    }
    GenerateOptions o = session_.options();
    const int64_t ctx = session_.config().max_positions;
    const char* len_key = given(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (given(body, len_key)) {
      const int64_t n = int_field(body, len_key);
      if (n <= 0 || n > ctx)
        bad(std::string("'") + len_key + "' must be in [1, " + std::to_string(ctx) + "], got " +
            std::to_string(n));
      o.gen_length = static_cast<int>(n);
      // Re-derive what followed the length: blocks that no longer divide it, one token per step.
      if (!block_causal_) {
        if (o.block_length > o.gen_length || o.gen_length % o.block_length != 0)
          o.block_length = o.gen_length;
        o.steps = o.gen_length;
      }
    }
    auto small_int = [&](const char* k) {
      const int64_t v = int_field(body, k);
      if (v < 0 || v > ctx) bad(std::string("'") + k + "' must be in [0, " + std::to_string(ctx) + "]");
      return static_cast<int>(v);
    };
    if (given(body, "temperature")) o.temperature = static_cast<float>(num_field(body, "temperature"));
    if (given(body, "top_p")) o.top_p = static_cast<float>(num_field(body, "top_p"));
    if (given(body, "top_k")) o.top_k = small_int("top_k");
    if (given(body, "seed")) {
      const int64_t seed = int_field(body, "seed");
      if (seed < 0) bad("'seed' must be >= 0");
      o.seed = static_cast<uint64_t>(seed);
    }
    if (given(body, "steps")) o.steps = small_int("steps");
    if (given(body, "block_length")) o.block_length = small_int("block_length");
    if (given(body, "alg")) o.alg = str_field(body, "alg");
    if (given(body, "threshold")) o.threshold = static_cast<float>(num_field(body, "threshold"));
    if (given(body, "cache")) o.cache = str_field(body, "cache");
    auto flag = [&](const char* k) {
      if (!body[k].is_boolean()) bad(std::string("'") + k + "' must be true or false");
      return body[k].get<bool>();
    };
    if (given(body, "sparse")) o.sparse = flag("sparse");
    if (given(body, "sparse_block")) {
      o.sparse_block = small_int("sparse_block");
      o.sparse = true;
    }
    for (auto [k, dst] :
         {std::pair<const char*, float*>{"sparse_rho", &o.sparse_rho}, {"sparse_skip", &o.sparse_skip}}) {
      if (!given(body, k)) continue;
      *dst = static_cast<float>(num_field(body, k));
      o.sparse = true;
    }
    if (given(body, "des_k")) o.des_k = small_int("des_k");
    if (given(body, "des_beta")) o.des_beta = static_cast<float>(num_field(body, "des_beta"));
    if (given(body, "des_scope")) o.des_scope = str_field(body, "des_scope");
    if (given(body, "window")) o.window = flag("window");
    if (given(body, "window_early_stop")) o.window_early_stop = flag("window_early_stop");
    if (o.window_early_stop) o.window = true;
    for (auto [k, dst] : {std::pair<const char*, int*>{"window_ex", &o.window_ex},
                          {"window_in", &o.window_in},
                          {"window_refresh", &o.window_refresh}}) {
      if (!given(body, k)) continue;
      *dst = small_int(k);
      o.window = true;
    }
    if (given(body, "cfg")) o.cfg_scale = static_cast<float>(num_field(body, "cfg"));
    try {
      o.des = implied_des(given(body, "des") ? std::optional(str_field(body, "des")) : std::nullopt,
                          given(body, "des_k"), given(body, "des_beta"), o.des);
      validate_generate_options(o, session_.config().vocab, block_causal_);
      // What only the model can tell (an MoE model, k <= top_k) fails here, before a stream starts.
      if (o.des != "off") session_.engine().check_des(des_config(o));
    } catch (const Error& e) {
      bad(e.what());
    }
    return o;
  }

  std::vector<int32_t> prompt(const json& body, bool chat, const GenerateOptions& o) const {
    std::vector<ChatMessage> msgs;
    bool use_chat = chat && session_.has_chat_template();
    if (chat) {
      if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        bad("'messages' must be a non-empty array of {\"role\", \"content\"}");
      for (const auto& m : body["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
            !m["content"].is_string())
          bad("every message needs a string 'role' and a string 'content'");
        const auto role = m["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant")
          bad("message role must be system, user or assistant, got '" + role + "'");
        msgs.push_back({role, m["content"].get<std::string>()});
      }
    } else {
      if (!body.contains("prompt")) bad("'prompt' is required");
      msgs.push_back({"user", str_field(body, "prompt")});
      use_chat = false;
    }
    try {
      return session_.prompt_ids(msgs, use_chat, o);
    } catch (const Error& e) {
      bad(e.what());
    }
  }

  json envelope(bool chat, bool chunk) const {
    return {{"id", id_},
            {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", now_},
            {"model", model_id_}};
  }

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    json body;
    try {
      body = json::parse(req.body);
      if (!body.is_object()) bad("the request body must be a JSON object");
    } catch (const json::parse_error& e) {
      return reply_error(
          res, {400, "invalid_request_error", std::string("the body is not valid JSON: ") + e.what()});
    } catch (const BadRequest& b) {
      return reply_error(res, b);
    }
    GenerateOptions o;
    std::vector<int32_t> ids;
    bool stream = false;
    try {
      o = options(body);
      ids = prompt(body, chat, o);
      if (given(body, "stream")) {
        if (!body["stream"].is_boolean()) bad("'stream' must be a boolean");
        stream = body["stream"].get<bool>();
      }
    } catch (const BadRequest& b) {
      return reply_error(res, b);
    }
    if (!stream) {
      Session::Output out;
      json j;
      try {
        engine_.run([&] {
          begin_request();
          out = session_.run(ids, o, {});
          j = envelope(chat, false);
        });
      } catch (const Error& e) {
        return reply_error(res, {400, "invalid_request_error", e.what()});
      }
      const std::string reason = finish_reason(out, o);
      if (chat) {
        j["choices"] = json::array({{{"index", 0},
                                     {"message", {{"role", "assistant"}, {"content", out.text}}},
                                     {"finish_reason", reason}}});
      } else {
        j["choices"] = json::array(
            {{{"index", 0}, {"text", out.text}, {"logprobs", nullptr}, {"finish_reason", reason}}});
      }
      j["usage"] = usage(ids.size(), out.result.tokens.size());
      j["tessera"] = {{"steps", out.result.steps_run},
                      {"seconds", out.seconds},
                      {"cache", o.cache},
                      {"sparse", o.sparse},
                      {"des", o.des},
                      {"window", o.window}};
      res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      return;
    }
    const bool include_usage = body.contains("stream_options") && body["stream_options"].is_object() &&
                               body["stream_options"].value("include_usage", false);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, chat, o, ids, include_usage](size_t, httplib::DataSink& sink) {
          bool ok = true;
          engine_.run([&] { ok = stream_events(chat, o, ids, include_usage, sink); });
          return ok;
        });
  }

  // One streamed request, on the engine thread; false when the client went away.
  bool stream_events(bool chat, const GenerateOptions& o, const std::vector<int32_t>& ids, bool include_usage,
                     httplib::DataSink& sink) {
    begin_request();
    auto send = [&](const json& j) {
      const std::string ev = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      if (!sink.write(ev.data(), ev.size())) throw ClientGone{};
    };
    auto delta_event = [&](const std::string& text, const json& reason) {
      json j = envelope(chat, true);
      if (chat) {
        json d = json::object();
        if (!text.empty()) d["content"] = text;
        j["choices"] = json::array({{{"index", 0}, {"delta", d}, {"finish_reason", reason}}});
      } else {
        j["choices"] = json::array({{{"index", 0}, {"text", text}, {"finish_reason", reason}}});
      }
      return j;
    };
    try {
      if (chat) {
        json first = envelope(true, true);
        first["choices"] = json::array({{{"index", 0},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"finish_reason", nullptr}}});
        send(first);
      }
      std::string sent;
      const size_t P = ids.size();
      std::vector<int32_t> prefix;
      const int32_t mask = session_.engine().mask_token();
      const Session::Output out = session_.run(ids, o, [&](const StepEvent& ev) {
        prefix.clear();  // the generation's decided prefix, up to the first mask or EOS
        for (size_t i = P; i < ev.canvas.size() && ev.canvas[i] != mask; ++i) {
          if (std::find(o.eos_ids.begin(), o.eos_ids.end(), ev.canvas[i]) != o.eos_ids.end()) break;
          prefix.push_back(ev.canvas[i]);
        }
        const std::string text = complete_utf8(session_.tokenizer().decode(prefix, true));
        if (text.size() > sent.size() && text.compare(0, sent.size(), sent) == 0) {
          send(delta_event(text.substr(sent.size()), nullptr));
          sent = text;
        }
      });
      const std::string rest = out.text.size() > sent.size() && out.text.compare(0, sent.size(), sent) == 0
                                   ? out.text.substr(sent.size())
                                   : std::string();
      json last = delta_event(rest, finish_reason(out, o));
      if (include_usage) last["usage"] = usage(ids.size(), out.result.tokens.size());
      send(last);
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
    } catch (const ClientGone&) {
      return false;  // the client went away: generation stopped at that step
    } catch (const Error& e) {
      const std::string ev =
          "data: " + error_body({400, "invalid_request_error", e.what()}).dump() + "\n\ndata: [DONE]\n\n";
      sink.write(ev.data(), ev.size());
    }
    sink.done();
    return true;
  }

  // The text up to its last complete UTF-8 character (a byte-level model may stop inside one).
  static std::string complete_utf8(std::string s) {
    size_t i = s.size(), back = 0;
    while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
    if (i == 0) return s;
    const auto lead = static_cast<unsigned char>(s[i - 1]);
    const size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (need > back) s.resize(i - 1);
    return s;
  }

  std::string finish_reason(const Session::Output& out, const GenerateOptions& o) const {
    return static_cast<int>(out.result.tokens.size()) < o.gen_length ? "stop" : "length";
  }

  static json usage(size_t prompt_tokens, size_t completion_tokens) {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  }

  void begin_request() {
    now_ = static_cast<int64_t>(std::time(nullptr));
    id_ = "cmpl-tessera-" + std::to_string(++count_);
  }

  static void reply_error(httplib::Response& res, const BadRequest& b) {
    res.status = b.status;
    res.set_content(error_body(b).dump(), "application/json");
  }

  ServeArgs args_;
  Session session_;
  std::string model_id_;
  bool block_causal_ = false;
  int64_t created_ = static_cast<int64_t>(std::time(nullptr));
  int64_t now_ = 0;
  std::string id_;
  std::atomic<int64_t> count_{0};
  EngineThread engine_;  // last member: its thread stops first
};

}  // namespace

void add_serve(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (completions, chat completions, SSE streaming)");
  auto a = std::make_shared<ServeArgs>();
  add_session_options(sub, a->session);
  sub->add_option("--host", a->host, "address to listen on (default 127.0.0.1)");
  sub->add_option("--port", a->port, "port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--model-id", a->model_id, "the model's name in the API (default: the directory's name)");
  reg.handlers.emplace_back(sub, [a] {
    Server s(*a);
    return s.run();
  });
}

}  // namespace tessera::cli
