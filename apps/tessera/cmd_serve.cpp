// tessera serve: an OpenAI-compatible HTTP server over one Session (HTTP layer: http_server.h; the
// completions: serve_completion.cpp).
//   GET  / (the web page: a chat that shows the canvas denoising; its files under /web/NAME; both open
//        without a key; web_assets.h; --web-dir DIR, --no-web),
//        /health (open without a key; with the batching and admission counts), /v1/models, /v1/models/ID,
//        /metrics (Prometheus text format: requests by result, in flight, waiting, refused, tokens,
//        seconds, packed forwards, connections, memory), /slots (the requests waiting and running)
//   POST /tokenize {"content": text, "add_special": bool, "with_pieces": bool}, /detokenize {"tokens":
//   [ids]},
//        /apply-template (a chat request: {"prompt": the text its chat template makes})
//   POST /v1/completions       {"prompt": "...", "max_tokens": N, "temperature": T, "stream": bool, ...}
//                              (prompt: a string, token ids, or an array of either: several prompts, whose
//                              choices are numbered prompt by prompt)
//   POST /v1/chat/completions  {"messages": [{"role": "user", "content": "..."}], ...} (content: a string or
//                              an array of text parts; the developer role is a system message; tools,
//                              tool_choice, parallel_tool_calls, tool calls and tool results, and
//                              chat_template_kwargs reach the model's chat template; the reply is read
//                              into content, reasoning_content and tool_calls: serve_chat.cpp)
// Concurrent requests are batched (engine/batcher.h): each runs its unmasking loop on its handler's thread
// and shares packed forwards with the others on the one engine thread, up to --batch sequences per
// forward; a request's result is the same as alone. At most --parallel sequences (prompts x n) generate at
// once and --max-queue requests wait (first come, first served); more get 503 with Retry-After. A request
// with a KV cache holds its own slot of the engine's cache pool and is batched too; requests with SparseD
// or DES hold other engine state across forwards and run one at a time, as every request does with
// --batch 1. Besides OpenAI's fields a request may set tessera's generation options: steps, block_length,
// alg, threshold, cache, cfg, top_k, sparse*, des*, window, window_ex, window_in, window_refresh,
// window_early_stop, edit_mode, edit_threshold, max_post_steps, edit_penalty; "canvas": true (with
// "stream") adds a "tessera.canvas" event per step (canvas_event.h). `stop` (a string or up to 4) ends the
// text before the first stop sequence. `n` (up to 16) choices run at once, choice i with seed + i.
// `logprobs` (completions: N; chat: true, with top_logprobs N; N up to 20) gives each token's
// log-probability in the forward of the step that decided it and the N most likely tokens there. A field
// the server does not know, a value it cannot honour, a prompt that does not fit the context or a bad value
// gets a 400 with an OpenAI-style error object, never a silently different generation.
// Keys (--api-key, --api-key-file): every route but /health needs "Authorization: Bearer KEY" (compared
// in constant time); TLS with --ssl-cert-file and --ssl-key-file; --host unix:PATH listens on a Unix
// socket. SIGTERM / SIGINT drain: no new connections, requests that arrive on open ones get 503, those
// accepted finish within --drain-timeout (then they end with 503), and the server exits; a second signal
// exits at once. --cors ORIGIN: CORS headers for browser pages of that origin (none by default).
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/serve_app.h"
#include "apps/tessera/web_assets.h"
#include "core/error.h"
#include "core/utf8.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// SIGTERM / SIGINT: the handler (any thread may run it) writes a byte to this pipe; the server's watcher
// thread reads it and drains the server.
int g_stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int) {
  const char c = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &c, 1);
}

std::string sha256(const std::string& s) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d);
  return std::string(reinterpret_cast<const char*>(d), sizeof d);
}

// A token's text for /tokenize: a string when it is valid UTF-8, else its bytes (part of a character), as
// llama.cpp's server gives it.
json piece_json(const std::string& t) {
  for (size_t i = 0; i < t.size();) {
    const size_t n = utf8_char_length(t, i);
    if (n == 0) {
      json v = json::array();
      for (const char ch : t) v.push_back(static_cast<unsigned char>(ch));
      return v;
    }
    i += n;
  }
  return t;
}

// A request's text for the log: printable ASCII kept, anything else as \xNN, at most 200 bytes.
std::string loggable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    if (out.size() >= 200) return out + "...";
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += ch;
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return out;
}

const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 503:
      return "server_busy";
    case 500:
      return "server_error";
    default:
      return "invalid_request_error";
  }
}

// The model's name in the API: --model-id, else the model directory's name.
std::string model_id_of(const ServeArgs& a, const Session& s) {
  if (!a.model_id.empty()) return a.model_id;
  fs::path p = fs::absolute(s.model_dir()).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

bool over_ranks(const Session& s) {
  const auto& comm = s.engine().options().comm;
  return comm && comm->size() > 1;
}

// Sequences per packed forward. Over ranks under a memory budget, one: each rank's admissions would
// follow its own timing (Batcher).
int batch_of(const ServeArgs& a, const Session& s) {
  if (a.batch <= 1 || !over_ranks(s) || s.engine().options().memory_budget <= 0) return a.batch;
  if (!s.follower())
    std::fprintf(stderr,
                 "tessera serve: note: requests run one at a time (--batch 1): batching over ranks does not "
                 "take --memory-budget yet\n");
  return 1;
}

}  // namespace

ServeApp::SlotScope::SlotScope(ServeApp& app, std::shared_ptr<Slot> s) : app_(app), slot_(std::move(s)) {
  std::lock_guard<std::mutex> l(app_.slots_m_);
  app_.slots_[slot_->id] = slot_;
}

ServeApp::SlotScope::~SlotScope() {
  std::lock_guard<std::mutex> l(app_.slots_m_);
  const auto it = app_.slots_.find(slot_->id);
  if (it != app_.slots_.end() && it->second == slot_) app_.slots_.erase(it);
}

ServeApp::ServeApp(const ServeArgs& a)
    : args_(a),
      session_(a.session),
      admission_(a.parallel > 0 ? a.parallel : 4 * a.batch, a.max_queue),
      model_id_(model_id_of(a, session_)),
      created_(static_cast<int64_t>(std::time(nullptr))),
      batcher_(session_.engine(), batch_of(a, session_),
               std::chrono::microseconds(static_cast<int64_t>(a.batch_wait_ms * 1000.0)),
               over_ranks(session_),
               [this](uint64_t key, const std::string& words) { start_follower(key, words); }) {
  std::vector<std::string> keys = a.api_keys;
  if (!a.api_key_file.empty()) {
    std::ifstream f(a.api_key_file);
    if (!f) fail("cannot read --api-key-file " + a.api_key_file);
    for (std::string line; std::getline(f, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
    if (keys.empty()) fail("--api-key-file " + a.api_key_file + " holds no key");
  }
  for (const std::string& k : keys) {
    if (k.empty()) fail("an API key must not be empty");
    key_digests_.push_back(sha256(k));
  }
  if (args_.limits.max_tokens > 0 && session_.options().gen_length > args_.limits.max_tokens)
    fail("--max-tokens " + std::to_string(args_.limits.max_tokens) +
         " is below the model's default generation length " + std::to_string(session_.options().gen_length) +
         " (set --gen-length too)");
}

int ServeApp::run() {
  if (args_.access_log == "-") {
    log_ = stderr;
  } else if (args_.access_log != "off") {
    log_ = std::fopen(args_.access_log.c_str(), "a");
    if (log_ == nullptr) fail("cannot open --access-log " + args_.access_log + ": " + std::strerror(errno));
  }
  http::Limits lim;
  lim.max_body = memory::parse_size(args_.max_body);
  lim.header_seconds = args_.header_timeout;
  lim.idle_seconds = args_.idle_timeout;
  // Handler threads: the requests generating or waiting, and a few for /tokenize and /detokenize.
  lim.max_handlers = admission_.parallel() + admission_.max_queue() + 16;
  http::Server svr(lim);
  add_routes(svr);
  const std::string where = svr.listen({args_.host, args_.port, args_.ssl_cert, args_.ssl_key});
  http_ = &svr;
  std::fprintf(stderr, "tessera serve: %s (%s) on %s\n", model_id_.c_str(), session_.model_dir().c_str(),
               where.c_str());
  std::fflush(stderr);
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) fail("cannot create the stop pipe");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::thread watcher([this, &svr] {
    char c = 0;
    if (::read(g_stop_pipe[0], &c, 1) != 1 || c == 0) return;  // 0: the server ended by itself
    std::fprintf(stderr,
                 "tessera serve: stopping: new connections are refused, accepted requests get up to %g s "
                 "to finish\n",
                 args_.drain_timeout);
    std::fflush(stderr);
    svr.drain(args_.drain_timeout, [this] {
      stopping_ = true;
      admission_.close();
    });
    if (::read(g_stop_pipe[0], &c, 1) != 1 || c == 0) return;
    std::fprintf(stderr, "tessera serve: stopped at once (second signal)\n");
    std::_Exit(130);
  });
  svr.run();
  const char done = 0;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &done, 1);
  watcher.join();
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  http_ = nullptr;
  std::fprintf(
      stderr, "tessera serve: %lld requests answered, %lld refused or failed\ntessera serve: stopped\n",
      static_cast<long long>(ok_.load()), static_cast<long long>(failed_.load() + admission_.refused()));
  if (log_ != nullptr && log_ != stderr) std::fclose(log_);
  return 0;
}

void ServeApp::add_routes(http::Server& svr) {
  using Run = http::Server::Run;
  svr.error_format([](int status, const std::string& m) {
    return error_body({status, error_type(status), m});
  });
  svr.before([this](const http::Request& req, http::Response& res) { return before(req, res); });
  if (!args_.cors.empty()) {
    const bool any = std::find(args_.cors.begin(), args_.cors.end(), "*") != args_.cors.end();
    svr.decorate([this, any](const http::Request& req, http::Response& res) {
      if (!cors_allowed(req)) return;
      res.headers.push_back({"Access-Control-Allow-Origin", any ? "*" : *req.header("Origin")});
      if (!any) res.headers.push_back({"Vary", "Origin"});
    });
  }
  if (log_ != nullptr) svr.access_log([this](const http::Access& a) { log_access(a); });
  if (!args_.no_web) add_web_routes(svr, args_.web_dir);
  svr.route(
      "GET", "/health", [this](http::Exchange& ex) { ex.reply(json_response(health_json())); }, Run::Inline);
  svr.route(
      "GET", "/slots", [this](http::Exchange& ex) { ex.reply(json_response(slots_json())); }, Run::Inline);
  svr.route(
      "GET", "/metrics",
      [this](http::Exchange& ex) {
        http::Response res;
        res.set(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
        ex.reply(std::move(res));
      },
      Run::Inline);
  svr.route(
      "GET", "/v1/models",
      [this](http::Exchange& ex) {
        ex.reply(json_response({{"object", "list"}, {"data", json::array({model_json()})}}));
      },
      Run::Inline);
  svr.route(
      "GET", "/v1/models/*",
      [this](http::Exchange& ex) {
        try {
          check_model(ex.request().path.substr(std::string("/v1/models/").size()), model_id_);
        } catch (const BadRequest& b) {
          return ex.reply(error_response(b));
        }
        ex.reply(json_response(model_json()));
      },
      Run::Inline);
  // Token counting for clients, as llama.cpp's server offers it (text <-> ids of this model).
  svr.route(
      "POST", "/tokenize",
      [this](http::Exchange& ex) {
        try {
          const TokenizeRequest t = parse_tokenize(ex.request().body, session_);
          json ids = json::array();
          for (const int32_t id : t.tokens) {
            if (t.with_pieces)
              ids.push_back({{"id", id}, {"piece", piece_json(session_.tokenizer().token_text(id))}});
            else
              ids.push_back(id);
          }
          ex.reply(json_response({{"tokens", ids}}));
        } catch (const BadRequest& b) {
          ex.reply(error_response(b));
        }
      },
      Run::Thread);
  svr.route(
      "POST", "/detokenize",
      [this](http::Exchange& ex) {
        try {
          ex.reply(json_response({{"content", parse_detokenize(ex.request().body, session_)}}));
        } catch (const BadRequest& b) {
          ex.reply(error_response(b));
        }
      },
      Run::Thread);
  // The prompt a chat request makes (the model's chat template with its messages, tools and switches),
  // as llama.cpp's server shows it.
  svr.route(
      "POST", "/apply-template",
      [this](http::Exchange& ex) {
        try {
          const ParsedRequest r = parse_request(ex.request().body, true, session_, model_id_, args_.limits);
          ex.reply(json_response({{"prompt", r.prompt_text}}));
        } catch (const BadRequest& b) {
          ex.reply(error_response(b));
        }
      },
      Run::Thread);
  svr.route(
      "POST", "/v1/completions", [this](http::Exchange& ex) { completion(ex, false); }, Run::Thread);
  svr.route(
      "POST", "/v1/chat/completions", [this](http::Exchange& ex) { completion(ex, true); }, Run::Thread);
}

// Before routing: a CORS preflight of a --cors origin is answered; with keys, every route but /health
// and the web page's files needs one.
bool ServeApp::before(const http::Request& req, http::Response& res) const {
  if (req.method == "OPTIONS" && !args_.cors.empty() && cors_allowed(req)) {
    res.status = 204;
    res.content_type.clear();
    const std::string* asked = req.header("Access-Control-Request-Headers");
    res.headers.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
    res.headers.push_back(
        {"Access-Control-Allow-Headers", asked != nullptr ? *asked : "Content-Type, Authorization"});
    res.headers.push_back({"Access-Control-Max-Age", "600"});
    return true;
  }
  if (key_digests_.empty() || req.path == "/health" || (!args_.no_web && is_web_path(req.path)) ||
      authorized(req))
    return false;
  const bool sent = req.header("Authorization") != nullptr;
  res = error_response(
      {401, "authentication_error",
       sent ? "incorrect API key" : "this server needs an API key: send Authorization: Bearer KEY"});
  res.headers.push_back({"WWW-Authenticate", "Bearer"});
  return true;
}

// "Authorization: Bearer KEY" with a key of the server: digests compared in constant time (neither the
// key's length nor its bytes show in the time taken).
bool ServeApp::authorized(const http::Request& req) const {
  const std::string* h = req.header("Authorization");
  if (h == nullptr || h->size() < 7 || (h->compare(0, 7, "Bearer ") != 0 && h->compare(0, 7, "bearer ") != 0))
    return false;
  const std::string d = sha256(h->substr(7));
  bool ok = false;
  for (const std::string& k : key_digests_) ok |= CRYPTO_memcmp(d.data(), k.data(), d.size()) == 0;
  return ok;
}

// Whether the request comes from a browser page of a --cors origin.
bool ServeApp::cors_allowed(const http::Request& req) const {
  const std::string* origin = req.header("Origin");
  if (origin == nullptr) return false;
  for (const std::string& o : args_.cors)
    if (o == "*" || o == *origin) return true;
  return false;
}

// One line per request: time, id, client, request line, status, tokens, seconds to the first bytes of
// the answer (a stream's first event) and to its end, bytes sent.
void ServeApp::log_access(const http::Access& a) {
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string tokens;
  if (a.prompt_tokens >= 0)
    tokens =
        " prompt=" + std::to_string(a.prompt_tokens) + " completion=" + std::to_string(a.completion_tokens);
  std::lock_guard<std::mutex> l(log_m_);
  std::fprintf(log_, "%s %s %s \"%s %s HTTP/1.%d\" %d%s first=%.3f total=%.3f bytes=%llu\n", when,
               loggable(a.id).c_str(), a.remote.c_str(), loggable(a.method).c_str(),
               loggable(a.target).c_str(), a.version % 10, a.status, tokens.c_str(), a.first_seconds,
               a.total_seconds, static_cast<unsigned long long>(a.bytes));
  std::fflush(log_);
}

json ServeApp::model_json() const {
  return {{"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "tessera"}};
}

json ServeApp::health_json() const {
  const BatchStats b = batcher_.stats();
  return {{"status", stopping_ ? "stopping" : "ok"},
          {"batch",
           {{"max", batcher_.max_batch()},
            {"forwards", b.forwards},
            {"sequences", b.sequences},
            {"largest", b.largest}}},
          {"requests_abandoned", abandoned_.load()},  // ended early: their client went away
          {"admission",
           {{"parallel", admission_.parallel()},
            {"running", admission_.running()},
            {"waiting", admission_.waiting()},
            {"refused", admission_.refused()}}}};
}

// The generation requests the server holds: waiting for admission or running, with their steps so far.
json ServeApp::slots_json() const {
  json list = json::array();
  std::lock_guard<std::mutex> l(slots_m_);
  for (const auto& [id, s] : slots_) {
    list.push_back({{"id", id},
                    {"route", s->route},
                    {"state", s->running ? "running" : "waiting"},
                    {"sequences", s->sequences.load()},
                    {"steps", s->steps.load()},
                    {"seconds", std::chrono::duration<double>(Clock::now() - s->start).count()}});
  }
  return {{"parallel", admission_.parallel()},
          {"max_queue", admission_.max_queue()},
          {"running", admission_.running()},
          {"waiting", admission_.waiting()},
          {"requests", list}};
}

// /metrics in Prometheus' text format (0.0.4).
std::string ServeApp::metrics_text() {
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help,
                          const std::vector<std::pair<std::string, double>>& samples) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& [labels, v] : samples) {
      char num[64];
      std::snprintf(num, sizeof num, "%.15g", v);
      out += name + labels + " " + num + "\n";
    }
  };
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const BatchStats b = batcher_.stats();
  metric("tessera_requests_total", "counter",
         "Completion and chat completion requests by result (error: refused or failed; abandoned: the client "
         "went away; timeout: --timeout)",
         {{"{result=\"ok\"}", d(ok_)},
          {"{result=\"error\"}", d(failed_)},
          {"{result=\"abandoned\"}", d(abandoned_)},
          {"{result=\"timeout\"}", d(timed_out_)}});
  metric("tessera_requests_in_flight", "gauge", "Generation requests being answered", {{"", d(in_flight_)}});
  metric("tessera_requests_waiting", "gauge", "Generation requests waiting for admission (--max-queue)",
         {{"", d(admission_.waiting())}});
  metric("tessera_sequences_running", "gauge", "Sequences admitted to generate (--parallel)",
         {{"", d(admission_.running())}});
  metric("tessera_sequences_parallel", "gauge", "Sequences that may generate at once (--parallel)",
         {{"", d(admission_.parallel())}});
  metric("tessera_requests_refused_total", "counter", "Requests refused with 503: the queue was full",
         {{"", d(admission_.refused())}});
  if (http_ != nullptr) {
    const http::Server::Counts c = http_->counts();
    metric("tessera_http_connections", "gauge", "Open HTTP connections", {{"", d(c.connections)}});
    metric("tessera_http_handlers", "gauge", "Requests being handled on threads", {{"", d(c.handlers)}});
  }
  metric("tessera_prompt_tokens_total", "counter", "Prompt (and suffix) tokens of the answered requests",
         {{"", d(prompt_tokens_)}});
  metric("tessera_completion_tokens_total", "counter", "Tokens generated for the answered requests",
         {{"", d(completion_tokens_)}});
  metric("tessera_request_seconds_total", "counter", "Generation seconds of the answered requests",
         {{"", d(micros_) / 1e6}});
  metric("tessera_forwards_total", "counter", "Forward passes run by the engine (packed batches count once)",
         {{"", d(b.forwards)}});
  metric("tessera_forward_sequences_total", "counter", "Sequences in those forwards", {{"", d(b.sequences)}});
  const PrefixCache::Stats pc = session_.engine().prefix_stats();
  metric("tessera_prefix_cache_bytes", "gauge",
         "Bytes of prompt blocks' K / V kept for later requests (--prefix-cache)",
         {{"", d(static_cast<int64_t>(session_.engine().prefix_bytes()))}});
  metric("tessera_prefix_cache_blocks_total", "counter",
         "Prompt blocks of the prefix cache by event (hit: restored into a request; stored; evicted)",
         {{"{event=\"hit\"}", d(pc.hit_blocks)},
          {"{event=\"stored\"}", d(pc.stored_blocks)},
          {"{event=\"evicted\"}", d(pc.evicted_blocks)}});
  metric("tessera_peak_rss_bytes", "gauge", "Peak resident memory of the process",
         {{"", d(static_cast<int64_t>(peak_rss_bytes()))}});
  const int64_t device = device_bytes_in_use(session_.engine());
  if (device >= 0)
    metric("tessera_device_bytes_in_use", "gauge", "GPU memory in use (total minus free)", {{"", d(device)}});
  return out;
}

http::Response ServeApp::json_response(const json& j, int status) {
  http::Response r;
  r.status = status;
  r.set(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  return r;
}

http::Response ServeApp::error_response(const BadRequest& b) {
  http::Response r;
  r.status = b.status;
  r.set(error_body(b), "application/json");
  if (b.status == 503) r.headers.push_back({"Retry-After", "1"});
  return r;
}

void add_serve(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (completions, chat completions, SSE streaming)");
  auto a = std::make_shared<ServeArgs>();
  add_session_options(sub, a->session);
  sub->add_option(
      "--host", a->host,
      "address to listen on (default 127.0.0.1; 0.0.0.0: every interface; unix:PATH: a Unix socket)");
  sub->add_option("--port", a->port, "port (0: any free port, printed at start)")->check(in_range(0, 65535));
  sub->add_option("--model-id", a->model_id, "the model's name in the API (default: the directory's name)");
  sub->add_option("--batch", a->batch,
                  "most concurrent requests packed into one forward (default 8; 1: one request at a time)")
      ->check(in_range(1, 256));
  sub->add_option("--parallel", a->parallel,
                  "most sequences (prompts x n of the requests) generating at once; more wait (default: four "
                  "times --batch)")
      ->check(in_range(1, 4096));
  sub->add_option("--max-queue", a->max_queue,
                  "most requests waiting for --parallel; more get 503 with Retry-After (default 32)")
      ->check(in_range(0, 4096));
  sub->add_option("--batch-wait", a->batch_wait_ms,
                  "milliseconds a request's forward waits for the other requests' calls to join it (default "
                  "2; 0: never waits for a request whose host code is slow)")
      ->check(in_range(0.0, 1000.0));
  sub->add_option("--timeout", a->timeout,
                  "seconds a generation request may take, its wait for admission included; then it ends "
                  "with 504 (streamed: an error event) (default 0: no limit)")
      ->check(in_range(0.0, 86400.0));
  sub->add_option("--drain-timeout", a->drain_timeout,
                  "seconds the accepted requests get to finish after SIGTERM; then they end with 503 "
                  "(default 30)")
      ->check(in_range(0.0, 86400.0));
  sub->add_option("--header-timeout", a->header_timeout,
                  "seconds a client has to send a request's header once it began (default 10)")
      ->check(in_range(0.1, 3600.0));
  sub->add_option("--idle-timeout", a->idle_timeout,
                  "seconds an idle keep-alive connection stays open (default 30)")
      ->check(in_range(0.1, 86400.0));
  a->session.prefix_cache = "1G";
  sub->add_option(
         "--prefix-cache", a->session.prefix_cache,
         "block-causal models (LLaDA2): most bytes of prompt blocks' K / V kept for later requests "
         "that begin with the same blocks (exact; within --memory-budget; 0 or off: none; default 1G)")
      ->check(
          [](const std::string& v) { return v == "0" || v == "off" ? std::string() : size_validator()(v); });
  sub->add_option("--max-body", a->max_body, "largest request body (default 16M)")->check(size_validator());
  sub->add_option("--max-sequences", a->limits.max_sequences,
                  "most choices one request may ask for, prompts x n (default 64)")
      ->check(in_range(1, 4096));
  sub->add_option("--max-tokens", a->limits.max_tokens,
                  "longest generation a request may ask for (default 0: the model's context)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--api-key", a->api_keys,
                  "a key clients must send as 'Authorization: Bearer KEY' (repeat for several; /health stays "
                  "open; prefer --api-key-file: a command line is visible to other users)");
  sub->add_option("--api-key-file", a->api_key_file, "a file of keys, one per line ('#' starts a comment)");
  sub->add_option("--ssl-cert-file", a->ssl_cert, "TLS: the server's certificate chain (PEM)");
  sub->add_option("--ssl-key-file", a->ssl_key, "TLS: its private key (PEM)");
  sub->add_option("--access-log", a->access_log,
                  "where the one line per request goes: a file, '-' (stderr, the default) or 'off'");
  sub->add_option(
         "--cors", a->cors,
         "let browser pages of this origin (scheme://host[:port]) call the API (CORS; repeat for several, "
         "'*' for any; default: none)")
      ->check([](const std::string& o) -> std::string {
        if (o == "*") return "";
        const size_t at = o.find("://");
        const std::string scheme = at == std::string::npos ? "" : o.substr(0, at);
        if ((scheme != "http" && scheme != "https") || o.size() == at + 3 ||
            o.find('/', at + 3) != std::string::npos)
          return "an origin is scheme://host[:port] with scheme http or https and no path (or '*'), got '" +
                 o + "'";
        return "";
      });
  auto* web_dir = sub->add_option("--web-dir", a->web_dir,
                                  "serve the web page at / from this directory's files instead of the ones "
                                  "compiled in (for working on apps/tessera/web)")
                      ->check(CLI::ExistingDirectory);
  sub->add_flag("--no-web", a->no_web, "no web page at / (the API only)")->excludes(web_dir);
  sub->footer(
      "Examples:\n  tessera serve --port 8080                  # then open http://127.0.0.1:8080/\n"
      "  tessera serve -m /models/LLaDA-8B-Instruct --host 0.0.0.0 --api-key-file keys.txt --batch 8");
  reg.handlers.emplace_back(sub, [a] {
    ServeApp s(*a);
    return s.rank() == 0 ? s.run() : s.follow();
  });
}

}  // namespace tessera::cli
