// tessera serve: an OpenAI-compatible HTTP server (cpp-httplib) over one Session.
//   GET  /health (with the batching counts: packed forwards, the sequences in them), /v1/models,
//        /v1/models/ID,
//        /metrics (Prometheus text format: generation requests by result, in flight, tokens, seconds,
//        packed forwards, memory)
//   POST /tokenize {"content": text, "add_special": bool, "with_pieces": bool}, /detokenize {"tokens": [ids]}
//   POST /v1/completions       {"prompt": "...", "max_tokens": N, "temperature": T, "stream": bool, ...}
//                              (prompt: a string, token ids, or an array of either: several prompts, whose
//                              choices are numbered prompt by prompt)
//   POST /v1/chat/completions  {"messages": [{"role": "user", "content": "..."}], ...} (content: a string or
//                              an array of text parts; the developer role is a system message)
// Concurrent requests are batched (engine/batcher.h): each runs its unmasking loop on its connection's
// thread (a pool of --parallel + --max-queue + 8) and shares packed forwards with the others on the one
// engine thread, up to --batch sequences per forward; a request's result is the same as alone. A request with
// a KV cache holds its own slot of the engine's cache pool and is batched too; requests with SparseD or DES
// hold other engine state across forwards and run one at a time, as every request does with --batch 1.
// Besides OpenAI's fields a request may set tessera's generation options: steps, block_length, alg,
// threshold, cache, cfg, top_k, sparse*, des*, window, window_ex, window_in, window_refresh,
// window_early_stop, edit_mode, edit_threshold, max_post_steps, edit_penalty; "canvas": true (with
// "stream") adds a "tessera.canvas" event per step (canvas_event.h). `stop` (a string or up to 4) ends the
// text before the first stop sequence; the generation ends as soon as its decided tokens hold one. `n` (up to
// 16) choices run at once, choice i with seed + i (their forwards packed like concurrent requests).
// `logprobs` (completions: N; chat: true, with top_logprobs N; N up to 20) gives each token's log-probability
// in the forward of the step that decided it (raw logits) and the N most likely tokens there; streamed, each
// event carries those of the tokens whose text it completes. A field the server does not know or that belongs
// to the other route, a value it cannot honour (echo, penalties, a logit bias, tools, a JSON response format:
// OpenAI's fields are taken only with the values that change nothing here), a prompt that does not fit the
// context or a bad value gets a 400 with an OpenAI-style error object, never a silently different generation.
// Streaming (SSE): a diffusion model decides positions out of order, so each event carries the text of the
// generation's decided prefix that was not sent yet (the positions up to the first undecided one); the events
// concatenate to the final text. Then a last event with the finish_reason, and "data: [DONE]". With stop
// sequences, the text that could begin one is held back until it is ruled out. A model without a chat
// template gets the chat messages concatenated (as `tessera chat` does). A client that goes away ends its
// request at the next step: a stream notices when an event cannot be written, a plain request by watching its
// connection (ClientWatch); /health counts them. SIGTERM / SIGINT stop the server gracefully (the requests in
// flight finish); a second one exits at once. --cors ORIGIN: CORS headers for browser pages of that origin
// (none by default). Bodies: 16 MiB at most however sent (read_body), 32 levels of nesting (serve_request).
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/tessera/canvas_event.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/client_watch.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/serve_http.h"
#include "apps/tessera/serve_request.h"
#include "core/error.h"
#include "core/utf8.h"
#include "tessera/tessera.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct ServeArgs {
  SessionArgs session;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_id;           // default: the model directory's name
  int batch = 8;                  // sequences per packed forward (1: requests one at a time)
  double batch_wait_ms = 2.0;     // how long a waiting forward waits for the other requests' calls
  int parallel = 0;               // sequences generating at once (0: four times the batch)
  int max_queue = 32;             // requests waiting for them; beyond: 503
  std::vector<std::string> cors;  // origins whose browser pages may call the API ("*": any)
};

// A response's id and creation time.
struct Tag {
  std::string id;
  int64_t created = 0;
};

// The stopped-by-client signal: thrown from the step callback to end generate().
struct ClientGone {};

// SIGTERM / SIGINT: the handler (any thread may run it) writes a byte to this pipe; the server's watcher
// thread reads it and stops the server gracefully.
int g_stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int) {
  const char c = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &c, 1);
}

class Server {
 public:
  explicit Server(const ServeArgs& a)
      : args_(a),
        session_(a.session),
        admission_(a.parallel > 0 ? a.parallel : 4 * a.batch, a.max_queue),
        batcher_(session_.engine(), a.batch,
                 std::chrono::microseconds(static_cast<int64_t>(a.batch_wait_ms * 1000.0))) {
    model_id_ = a.model_id;
    if (model_id_.empty()) {
      fs::path p = fs::absolute(session_.model_dir()).lexically_normal();
      if (!p.has_filename()) p = p.parent_path();
      model_id_ = p.filename().string();
    }
  }

  int run() {
    httplib::Server svr;
    // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server bind the same port and
    // silently take half of the requests; here the second one fails to start.
    // The listening socket is kept (the last one httplib tried) to raise its backlog below.
    socket_t listen_sock = INVALID_SOCKET;
    svr.set_socket_options([&listen_sock](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listen_sock = sock;
    });
    svr.set_payload_max_length(kMaxBody);
    // One HTTP worker thread per connection being served: httplib's default pool of 8 would cap the
    // requests in flight, and so the batch, at 8, and idle keep-alive connections hold workers too. The
    // admitted and waiting requests (--parallel, --max-queue) plus 8 leave room for those and /health.
    svr.new_task_queue = [n = static_cast<size_t>(admission_.parallel() + args_.max_queue + 8)] {
      return new httplib::ThreadPool(n);
    };
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const BatchStats b = batcher_.stats();
      const json j = {{"status", "ok"},
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
      res.set_content(j.dump(), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
    // Token counting for clients, as llama.cpp's server offers it (text <-> ids of this model).
    svr.Post("/tokenize",
             [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& reader) {
               std::string body;
               if (!read_body(reader, body, res)) return;
               try {
                 const TokenizeRequest t = parse_tokenize(body, session_);
                 json ids = json::array();
                 for (const int32_t id : t.tokens) {
                   if (t.with_pieces)
                     ids.push_back({{"id", id}, {"piece", piece_json(session_.tokenizer().token_text(id))}});
                   else
                     ids.push_back(id);
                 }
                 res.set_content(json{{"tokens", ids}}.dump(-1, ' ', false, json::error_handler_t::replace),
                                 "application/json");
               } catch (const BadRequest& b) {
                 reply_error(res, b);
               }
             });
    svr.Post("/detokenize",
             [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& reader) {
               std::string body;
               if (!read_body(reader, body, res)) return;
               try {
                 const std::string text = parse_detokenize(body, session_);
                 res.set_content(json{{"content", text}}.dump(-1, ' ', false, json::error_handler_t::replace),
                                 "application/json");
               } catch (const BadRequest& b) {
                 reply_error(res, b);
               }
             });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json j = {{"object", "list"}, {"data", json::array({model_json()})}};
      res.set_content(j.dump(), "application/json");
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        check_model(req.matches[1], model_id_);
      } catch (const BadRequest& b) {
        return reply_error(res, b);
      }
      res.set_content(model_json().dump(), "application/json");
    });
    for (const bool chat : {false, true}) {
      svr.Post(chat ? "/v1/chat/completions" : "/v1/completions",
               [this, chat](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
                 std::string body;
                 if (read_body(reader, body, res)) handle(req, body, res, chat);
               });
    }
    // A known route asked with another method: 405 with the methods it takes (Allow), not a 404.
    for (const char* path : {"/health", "/metrics", "/v1/models", R"(/v1/models/(.+))"}) {
      svr.Post(path, method_not_allowed("GET"));
      svr.Put(path, method_not_allowed("GET"));
      svr.Patch(path, method_not_allowed("GET"));
      svr.Delete(path, method_not_allowed("GET"));
    }
    for (const char* path : {"/tokenize", "/detokenize", "/v1/completions", "/v1/chat/completions"}) {
      svr.Get(path, method_not_allowed("POST"));
      svr.Put(path, method_not_allowed("POST"));
      svr.Patch(path, method_not_allowed("POST"));
      svr.Delete(path, method_not_allowed("POST"));
    }
    // CORS, for browser pages of the --cors origins only: a preflight (OPTIONS) is answered, and every
    // response to such a page names its origin as allowed. Without --cors a browser page of another
    // origin can send no request whose answer it may read.
    if (!args_.cors.empty()) {
      svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (req.method != "OPTIONS" || !cors_allowed(req)) return httplib::Server::HandlerResponse::Unhandled;
        res.status = 204;
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Content-Type, Authorization" : asked);
        res.set_header("Access-Control-Max-Age", "600");
        return httplib::Server::HandlerResponse::Handled;
      });
      const bool any = std::find(args_.cors.begin(), args_.cors.end(), "*") != args_.cors.end();
      svr.set_post_routing_handler([this, any](const httplib::Request& req, httplib::Response& res) {
        if (!cors_allowed(req)) return;
        res.set_header("Access-Control-Allow-Origin", any ? "*" : req.get_header_value("Origin"));
        if (!any) res.set_header("Vary", "Origin");
      });
    }
    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error body
      const BadRequest b{res.status, res.status == 404 ? "not_found_error" : "invalid_request_error",
                         res.status == 404   ? "no route " + req.method + " " + req.path
                         : res.status == 413 ? "the request body exceeds 16 MiB"
                                             : "HTTP " + std::to_string(res.status)};
      res.set_content(error_body(b), "application/json");
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
      res.set_content(error_body({500, "server_error", msg}), "application/json");
    });
    const int port = args_.port == 0 ? svr.bind_to_any_port(args_.host)
                                     : (svr.bind_to_port(args_.host, args_.port) ? args_.port : -1);
    if (port < 0) {
      fail("cannot listen on " + args_.host + ":" + std::to_string(args_.port) +
           " (address in use, not a local address, or a privileged port)");
    }
    // Debian's compiled libcpp-httplib listens with a backlog of 5: a burst of more connections than
    // that had its extra SYNs dropped and retried a second later, so concurrent requests arrived a
    // second apart and were not batched together. listen() again on the bound socket raises it.
    if (listen_sock != INVALID_SOCKET) ::listen(listen_sock, SOMAXCONN);
    std::fprintf(stderr, "tessera serve: %s (%s) on http://%s:%d\n", model_id_.c_str(),
                 session_.model_dir().c_str(), args_.host.c_str(), port);
    std::fflush(stderr);
    // Graceful stop: the first SIGTERM or SIGINT closes the listening socket (new connections are
    // refused) and lets the requests in flight finish; a second one exits at once.
    if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) fail("cannot create the stop pipe");
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    std::thread watcher([&svr] {
      char c = 0;
      if (::read(g_stop_pipe[0], &c, 1) != 1 || c == 0) return;  // 0: the server ended by itself
      std::fprintf(stderr,
                   "tessera serve: stopping: new connections are refused, requests in flight finish\n");
      std::fflush(stderr);
      svr.stop();
      if (::read(g_stop_pipe[0], &c, 1) != 1 || c == 0) return;
      std::fprintf(stderr, "tessera serve: stopped at once (second signal)\n");
      std::_Exit(130);
    });
    const bool ok = svr.listen_after_bind();
    const char done = 0;
    [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &done, 1);
    watcher.join();
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (!ok) fail("the server stopped unexpectedly");
    std::fprintf(stderr, "tessera serve: stopped\n");
    return 0;
  }

 private:
  json model_json() const {
    return {{"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "tessera"}};
  }

  // Whether the request comes from a browser page of a --cors origin.
  bool cors_allowed(const httplib::Request& req) const {
    if (!req.has_header("Origin")) return false;
    const std::string origin = req.get_header_value("Origin");
    for (const std::string& o : args_.cors)
      if (o == "*" || o == origin) return true;
    return false;
  }

  // system_fingerprint: the engine's version (OpenAI's field for the backend configuration).
  json envelope(const Tag& t, bool chat, bool chunk) const {
    return {{"id", t.id},
            {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", t.created},
            {"model", model_id_},
            {"system_fingerprint", std::string("tessera-") + tessera_version()}};
  }

  void handle(const httplib::Request& req, const std::string& body, httplib::Response& res, bool chat) {
    ParsedRequest r;
    try {
      r = parse_request(body, chat, session_, model_id_);
    } catch (const BadRequest& b) {
      ++failed_;
      return reply_error(res, b);
    }
    const GenerateOptions& o = r.options;
    const std::vector<std::vector<int32_t>>& prompts = r.prompts;
    const int n = r.n;
    const int total = static_cast<int>(prompts.size()) * n;  // choices in all: prompt c / n, choice c % n
    size_t prompt_tokens = 0;
    for (const auto& p : prompts) prompt_tokens += p.size() + o.suffix.size();  // the suffix is input too
    const int top = r.logprobs;
    std::shared_ptr<Admission::Ticket> ticket = admission_.enter(total, res);  // may wait for its turn
    if (!ticket) {
      ++failed_;
      return;
    }
    if (!r.stream) {
      std::vector<Session::Output> outs(static_cast<size_t>(total));
      const Tag tag = next_tag(chat);
      const ClientWatch watch(req);
      const InFlight flight(in_flight_);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        run_choices(total, [&](int i) {
          outs[static_cast<size_t>(i)] =
              session_.run(batcher_, prompt_of(r, i), choice(o, i % n), [&watch](const StepEvent&) {
                if (watch.gone()) throw ClientGone{};
              });
        });
      } catch (const ClientGone&) {
        ++abandoned_;
        res.status = 499;  // nginx's "client closed request": nobody reads it
        return;
      } catch (const Error& e) {
        ++failed_;
        return reply_error(res, {400, "invalid_request_error", e.what()});
      }
      json j = envelope(tag, chat, false);
      j["choices"] = json::array();
      size_t completion = 0;
      int steps = 0;
      double seconds = 0;
      for (int i = 0; i < total; ++i) {
        const Session::Output& out = outs[static_cast<size_t>(i)];
        const std::string reason = finish_reason(out, o);
        const json lp = top < 0 ? json(nullptr)
                                : logprobs_json(chat, out.result.tokens, out.result.logprobs, 0,
                                                out.result.tokens.size(), top);
        if (chat) {
          j["choices"].push_back({{"index", i},
                                  {"message", {{"role", "assistant"}, {"content", out.text}}},
                                  {"logprobs", lp},
                                  {"finish_reason", reason}});
        } else {
          j["choices"].push_back(
              {{"index", i}, {"text", out.text}, {"logprobs", lp}, {"finish_reason", reason}});
        }
        completion += out.result.tokens.size();
        steps = std::max(steps, out.result.steps_run);
        seconds = std::max(seconds, out.seconds);
      }
      j["usage"] = usage(prompt_tokens, completion);
      count_done(prompt_tokens, completion, t0);
      j["tessera"] = {{"steps", steps},  // of the longest choice
                      {"seconds", seconds}, {"cache", name(o.cache)}, {"sparse", o.sparse},
                      {"des", name(o.des)}, {"window", o.window}};
      res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream",
                                     [this, chat, r, prompt_tokens, ticket](size_t, httplib::DataSink& sink) {
                                       return stream_events(chat, r, prompt_tokens, sink);
                                     });
  }

  // OpenAI's logprobs of the tokens [a, b) of a choice's generated `tokens` (decided; lps beside them).
  // Completions: {tokens, token_logprobs, top_logprobs (a {text: logprob} object per token),
  // text_offset (bytes into the choice's text)}; chat: {content: [{token, logprob, bytes, top_logprobs:
  // [{token, logprob, bytes}]}]}. Token texts are their bytes (invalid UTF-8 shows as U+FFFD; chat's
  // bytes are exact).
  json logprobs_json(bool chat, std::span<const int32_t> tokens, std::span<const TokenLogprob> lps, size_t a,
                     size_t b, int top) const {
    const Tokenizer& tk = session_.tokenizer();
    json content = json::array(), texts = json::array(), values = json::array(), tops = json::array(),
         offsets = json::array();
    a = std::min(a, tokens.size());
    size_t offset = tk.decode(tokens.first(a), true).size();
    for (size_t i = a; i < b && i < lps.size(); ++i) {
      const TokenLogprob& t = lps[i];
      const std::string text = tk.token_text(tokens[i]);
      const size_t k = std::min(static_cast<size_t>(top), t.top.size());
      if (chat) {
        json alts = json::array();
        for (size_t j = 0; j < k; ++j) {
          const std::string at = tk.token_text(t.top[j].first);
          alts.push_back({{"token", at}, {"logprob", t.top[j].second}, {"bytes", byte_array(at)}});
        }
        content.push_back(
            {{"token", text}, {"logprob", t.logprob}, {"bytes", byte_array(text)}, {"top_logprobs", alts}});
        continue;
      }
      json alts = json::object();
      for (size_t j = 0; j < k; ++j) alts[tk.token_text(t.top[j].first)] = t.top[j].second;
      texts.push_back(text);
      values.push_back(t.logprob);
      tops.push_back(alts);
      offsets.push_back(offset);
      offset = tk.decode(tokens.first(i + 1), true).size();
    }
    if (chat) return {{"content", content}};
    return {{"tokens", texts}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // The prompt of choice c of a request (choice c % n of prompt c / n).
  static const std::vector<int32_t>& prompt_of(const ParsedRequest& r, int c) {
    return r.prompts[static_cast<size_t>(c / r.n)];
  }

  // The options of choice i of a prompt: its seed + i.
  static GenerateOptions choice(const GenerateOptions& o, int i) {
    GenerateOptions c = o;
    c.seed += static_cast<uint64_t>(i);
    return c;
  }

  // Runs fn(0), ..., fn(n - 1) at once (choice 0 on this thread, the others on their own) so that the
  // batcher packs their forwards; once all have ended, rethrows the first failure.
  static void run_choices(int n, const std::function<void(int)>& fn) {
    std::vector<std::exception_ptr> err(static_cast<size_t>(n));
    auto one = [&](int i) {
      try {
        fn(i);
      } catch (...) {
        err[static_cast<size_t>(i)] = std::current_exception();
      }
    };
    std::vector<std::thread> others;
    for (int i = 1; i < n; ++i) others.emplace_back(one, i);
    one(0);
    for (std::thread& t : others) t.join();
    for (const std::exception_ptr& e : err)
      if (e) std::rethrow_exception(e);
  }

  // One streamed request (its events are written from the thread that runs its unmasking loop); false
  // when the client went away.
  bool stream_events(bool chat, const ParsedRequest& r, size_t prompt_tokens, httplib::DataSink& sink) {
    const GenerateOptions& o = r.options;
    const int total = static_cast<int>(r.prompts.size()) * r.n, top = r.logprobs;
    const Tag tag = next_tag(chat);
    // Ended before the last bytes go out: a client that reads /metrics once its stream is over must not
    // find this request still in flight.
    InFlight flight(in_flight_);
    const auto t0 = std::chrono::steady_clock::now();
    std::mutex sink_mutex;  // the choices' threads write events
    auto send = [&](const json& j) {
      const std::string ev = "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      std::lock_guard<std::mutex> l(sink_mutex);
      if (!sink.write(ev.data(), ev.size())) throw ClientGone{};
    };
    auto delta_event = [&](int index, const std::string& text, const json& reason, const json& lp) {
      json j = envelope(tag, chat, true);
      json c;
      if (chat) {
        json d = json::object();
        if (!text.empty()) d["content"] = text;
        c = {{"index", index}, {"delta", d}};
      } else {
        c = {{"index", index}, {"text", text}};
      }
      if (top >= 0) c["logprobs"] = lp;
      c["finish_reason"] = reason;
      j["choices"] = json::array({c});
      return j;
    };
    try {
      for (int i = 0; chat && i < total; ++i) {
        json first = envelope(tag, true, true);
        first["choices"] = json::array({{{"index", i},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"finish_reason", nullptr}}});
        send(first);
      }
      // Text that could begin a stop sequence is held back until the sequence is ruled in or out.
      size_t hold = 0;
      for (const std::string& t : o.stop) hold = std::max(hold, t.size() - 1);
      std::vector<size_t> completion(static_cast<size_t>(total));
      // "canvas": true: a named event per step (OpenAI clients read only the unnamed data events).
      std::function<void(int, json)> send_canvas = [&](int c, json j) {
        j["index"] = c;
        const std::string ev =
            "event: tessera.canvas\ndata: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        std::lock_guard<std::mutex> l(sink_mutex);
        if (!sink.write(ev.data(), ev.size())) throw ClientGone{};
      };
      run_choices(total, [&](int c) {
        completion[static_cast<size_t>(c)] =
            stream_choice(c, prompt_of(r, c), choice(o, c % r.n), hold, top, chat, send, delta_event,
                          r.canvas ? send_canvas : nullptr);
      });
      size_t sum = 0;
      for (size_t t : completion) sum += t;
      if (r.include_usage) {  // as OpenAI: one more chunk, no choices, the usage of the whole request
        json u = envelope(tag, chat, true);
        u["choices"] = json::array();
        u["usage"] = usage(prompt_tokens, sum);
        send(u);
      }
      count_done(prompt_tokens, sum, t0);
      flight.end();
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
    } catch (const ClientGone&) {
      ++abandoned_;
      return false;  // the client went away: generation stopped at that step
    } catch (const Error& e) {
      ++failed_;
      flight.end();
      const std::string ev =
          "data: " + error_body({400, "invalid_request_error", e.what()}) + "\n\ndata: [DONE]\n\n";
      sink.write(ev.data(), ev.size());
    }
    sink.done();
    return true;
  }

  // One choice of a streamed request: its deltas, then its finish reason; returns its tokens.
  template <typename Send, typename Delta>
  // c: the choice's index; o: its options (its seed).
  size_t stream_choice(int c, const std::vector<int32_t>& ids, const GenerateOptions& o, size_t hold, int top,
                       bool chat, const Send& send, const Delta& delta_event,
                       const std::function<void(int, json)>& send_canvas) {
    std::string sent;
    size_t sent_tokens = 0;  // logprobs: the tokens of the prefix whose text was sent with theirs
    const size_t P = ids.size();
    std::vector<int32_t> prefix;
    const int32_t mask = session_.engine().mask_token();
    const Session::Output out = session_.run(batcher_, ids, o, [&](const StepEvent& ev) {
      if (send_canvas) send_canvas(c, canvas_event_json(ev, session_.tokenizer(), P, mask, o.eos_ids));
      prefix.clear();  // the generation's committed prefix, up to the first mask or EOS
      for (size_t i = P; i < static_cast<size_t>(ev.committed) && ev.canvas[i] != mask; ++i) {
        if (std::find(o.eos_ids.begin(), o.eos_ids.end(), ev.canvas[i]) != o.eos_ids.end()) break;
        prefix.push_back(ev.canvas[i]);
      }
      std::string text = session_.tokenizer().decode(prefix, true);
      if (const size_t cut = find_stop(text, o.stop); cut != std::string::npos)
        text.resize(cut);
      else
        text.resize(text.size() - std::min(text.size(), hold));
      text = complete_utf8(std::move(text));
      if (text.size() > sent.size() && text.compare(0, sent.size(), sent) == 0) {
        json lp;
        if (top >= 0) {  // the tokens whose text now lies wholly in what was sent
          size_t k = sent_tokens;
          while (k < prefix.size() &&
                 session_.tokenizer().decode(std::span<const int32_t>(prefix).first(k + 1), true).size() <=
                     text.size())
            ++k;
          lp = logprobs_json(chat, prefix, ev.logprobs, sent_tokens, k, top);
          sent_tokens = k;
        }
        send(delta_event(c, text.substr(sent.size()), nullptr, lp));
        sent = text;
      }
    });
    const std::string rest = out.text.size() > sent.size() && out.text.compare(0, sent.size(), sent) == 0
                                 ? out.text.substr(sent.size())
                                 : std::string();
    const json lp = top < 0 ? json(nullptr)
                            : logprobs_json(chat, out.result.tokens, out.result.logprobs, sent_tokens,
                                            out.result.tokens.size(), top);
    send(delta_event(c, rest, finish_reason(out, o), lp));
    return out.result.tokens.size();
  }

  // The bytes of a text as a JSON array of numbers.
  static json byte_array(const std::string& t) {
    json v = json::array();
    for (const char ch : t) v.push_back(static_cast<unsigned char>(ch));
    return v;
  }

  // A token's text for /tokenize: a string when it is valid UTF-8, else its bytes (part of a character),
  // as llama.cpp's server gives it.
  static json piece_json(const std::string& t) {
    for (size_t i = 0; i < t.size();) {
      const size_t n = utf8_char_length(t, i);
      if (n == 0) return byte_array(t);
      i += n;
    }
    return t;
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
    return out.stopped || static_cast<int>(out.result.tokens.size()) < o.gen_length ? "stop" : "length";
  }

  static json usage(size_t prompt_tokens, size_t completion_tokens) {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  }

  // Counts one generation request that answered: its tokens and its seconds since t0 (when its
  // generation began, streamed or not).
  void count_done(size_t prompt_tokens, size_t completion_tokens, std::chrono::steady_clock::time_point t0) {
    ++ok_;
    prompt_tokens_ += static_cast<int64_t>(prompt_tokens);
    completion_tokens_ += static_cast<int64_t>(completion_tokens);
    micros_ +=
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  }

  // A generation request in flight (the gauge of /metrics) until end() or this object's destruction.
  struct InFlight {
    explicit InFlight(std::atomic<int64_t>& n) : n_(n) { ++n_; }
    ~InFlight() { end(); }
    void end() {  // the request is no longer in flight (once)
      if (!ended_) --n_;
      ended_ = true;
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    std::atomic<int64_t>& n_;
    bool ended_ = false;
  };

  // /metrics in Prometheus' text format (0.0.4).
  std::string metrics_text() {
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
           "Completion and chat completion requests by result (error: refused or failed; abandoned: the "
           "client went away)",
           {{"{result=\"ok\"}", d(ok_)},
            {"{result=\"error\"}", d(failed_)},
            {"{result=\"abandoned\"}", d(abandoned_)}});
    metric("tessera_requests_in_flight", "gauge", "Generation requests being answered",
           {{"", d(in_flight_)}});
    metric("tessera_requests_waiting", "gauge", "Generation requests waiting for admission (--max-queue)",
           {{"", d(admission_.waiting())}});
    metric("tessera_sequences_running", "gauge", "Sequences admitted to generate (--parallel)",
           {{"", d(admission_.running())}});
    metric("tessera_requests_refused_total", "counter", "Requests refused with 503: the queue was full",
           {{"", d(admission_.refused())}});
    metric("tessera_prompt_tokens_total", "counter", "Prompt (and suffix) tokens of the answered requests",
           {{"", d(prompt_tokens_)}});
    metric("tessera_completion_tokens_total", "counter", "Tokens generated for the answered requests",
           {{"", d(completion_tokens_)}});
    metric("tessera_request_seconds_total", "counter", "Generation seconds of the answered requests",
           {{"", d(micros_) / 1e6}});
    metric("tessera_forwards_total", "counter",
           "Forward passes run by the engine (packed batches count once)", {{"", d(b.forwards)}});
    metric("tessera_forward_sequences_total", "counter", "Sequences in those forwards",
           {{"", d(b.sequences)}});
    metric("tessera_peak_rss_bytes", "gauge", "Peak resident memory of the process",
           {{"", d(static_cast<int64_t>(peak_rss_bytes()))}});
    const int64_t device = device_bytes_in_use(session_.engine());
    if (device >= 0)
      metric("tessera_device_bytes_in_use", "gauge", "GPU memory in use (total minus free)",
             {{"", d(device)}});
    return out;
  }

  // OpenAI's id prefixes: chatcmpl- for chat completions, cmpl- for completions.
  Tag next_tag(bool chat) {
    return {std::string(chat ? "chatcmpl-" : "cmpl-") + "tessera-" + std::to_string(++count_),
            static_cast<int64_t>(std::time(nullptr))};
  }

  static void reply_error(httplib::Response& res, const BadRequest& b) {
    res.status = b.status;
    res.set_content(error_body(b), "application/json");
  }

  ServeArgs args_;
  Session session_;
  Admission admission_;
  std::string model_id_;
  int64_t created_ = static_cast<int64_t>(std::time(nullptr));
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> abandoned_{0};  // requests whose client went away before the end
  std::atomic<int64_t> ok_{0}, failed_{0}, in_flight_{0}, prompt_tokens_{0}, completion_tokens_{0},
      micros_{0};    // /metrics
  Batcher batcher_;  // last member: its engine thread stops first
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
  sub->add_option("--batch", a->batch,
                  "most concurrent requests packed into one forward (default 8; 1: one request at a time)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--parallel", a->parallel,
                  "most sequences (prompts x n of the requests) generating at once; more wait (default: four "
                  "times --batch)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-queue", a->max_queue,
                  "most requests waiting for --parallel; more get 503 with Retry-After (default 32)")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--batch-wait", a->batch_wait_ms,
                  "milliseconds a request's forward waits for the other requests' calls to join it (default "
                  "2; 0: never waits for a request whose host code is slow)")
      ->check(CLI::Range(0.0, 1000.0));
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
  reg.handlers.emplace_back(sub, [a] {
    Server s(*a);
    return s.run();
  });
}

}  // namespace tessera::cli
