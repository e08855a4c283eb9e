// tessera serve: the application over the HTTP layer (http_server.h). cmd_serve.cpp has the flags, the
// routes, authentication, CORS, the access log, /health, /metrics, /slots and the graceful drain;
// serve_completion.cpp answers /v1/completions and /v1/chat/completions (whole or streamed).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "apps/tessera/cli_session.h"
#include "apps/tessera/http_server.h"
#include "apps/tessera/serve_http.h"
#include "apps/tessera/serve_request.h"
#include "engine/batcher.h"

namespace tessera::cli {

struct ServeArgs {
  SessionArgs session;
  std::string host = "127.0.0.1";  // or unix:PATH
  int port = 8080;
  std::string model_id;           // default: the model directory's name
  int batch = 8;                  // sequences per packed forward (1: requests one at a time)
  double batch_wait_ms = 2.0;     // how long a waiting forward waits for the other requests' calls
  int parallel = 0;               // sequences generating at once (0: four times the batch)
  int max_queue = 32;             // requests waiting for them; beyond: 503
  std::vector<std::string> cors;  // origins whose browser pages may call the API ("*": any)
  double timeout = 0;             // seconds a request may take, admission wait included (0: no limit)
  double drain_timeout = 30;      // seconds the requests in flight get after SIGTERM
  double header_timeout = 10, idle_timeout = 30;
  std::string max_body = "16M";
  RequestLimits limits;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string ssl_cert, ssl_key;
  std::string access_log = "-";  // a file, "-" (stderr) or "off"
  std::string web_dir;           // the web page's files from here (default: those compiled in)
  bool no_web = false;           // no web page at /
};

class ServeApp {
 public:
  explicit ServeApp(const ServeArgs& a);
  // Rank 0 (or one process): serves HTTP until stopped. Over ranks (--tp / --ep), the other ranks call
  // follow() instead: they run rank 0's generations until it ends. Every choice of a request is introduced
  // to them (Batcher::Introduction: the body, chat or not, the choice), they parse it with the same code into
  // the same prompt and options, and the batcher runs it on every rank in rank 0's order, batched with the
  // others as in one process.
  int run();
  int follow();
  int rank() const;

 private:
  using json = nlohmann::json;
  using Clock = std::chrono::steady_clock;

  // A generation request the server knows of (/slots).
  struct Slot {
    std::string id, route;
    Clock::time_point start;
    std::atomic<int> sequences{0};  // known once the request is parsed (after /slots may list it)
    std::atomic<bool> running{false};
    std::atomic<int64_t> steps{0};
  };
  // Registers a slot for its lifetime.
  class SlotScope {
   public:
    SlotScope(ServeApp& app, std::shared_ptr<Slot> s);
    ~SlotScope();
    Slot& operator*() { return *slot_; }
    Slot* operator->() { return slot_.get(); }

   private:
    ServeApp& app_;
    std::shared_ptr<Slot> slot_;
  };
  // How a generation ended early: thrown from its step callback.
  struct Ended {
    int status;  // 499: the client went away
    std::string type, message;
  };
  // A response's id and creation time.
  struct Tag {
    std::string id;
    int64_t created = 0;
  };
  // A generation request in flight (the gauge of /metrics) until end() or this object's destruction.
  struct InFlight {
    explicit InFlight(std::atomic<int64_t>& n) : n_(n) { ++n_; }
    ~InFlight() { end(); }
    void end() {
      if (!ended_) --n_;
      ended_ = true;
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    std::atomic<int64_t>& n_;
    bool ended_ = false;
  };
  // What a generation holds until its answer is ready: its admission slots and its place in flight.
  // Given back before the last bytes are queued, so that a client that reads /health or /metrics once it
  // has its answer finds them free.
  struct Held {
    Held(std::atomic<int64_t>& in_flight, std::unique_ptr<Admission::Ticket> t)
        : flight(in_flight), ticket(std::move(t)) {}
    void release() {
      flight.end();
      ticket.reset();
    }
    InFlight flight;
    std::unique_ptr<Admission::Ticket> ticket;
  };

  // cmd_serve.cpp
  void add_routes(http::Server& svr);
  bool before(const http::Request& req, http::Response& res) const;
  bool authorized(const http::Request& req) const;
  bool cors_allowed(const http::Request& req) const;
  void log_access(const http::Access& a);
  json model_json() const;
  json health_json() const;
  json slots_json() const;
  std::string metrics_text();
  static http::Response json_response(const json& j, int status = 200);
  static http::Response error_response(const BadRequest& b);

  // serve_completion.cpp
  void completion(http::Exchange& ex, bool chat);
  void answer_whole(http::Exchange& ex, bool chat, const ParsedRequest& r, size_t prompt_tokens, Slot& slot,
                    Held& held, Clock::time_point deadline);
  void answer_stream(http::Exchange& ex, bool chat, const ParsedRequest& r, size_t prompt_tokens, Slot& slot,
                     Held& held, Clock::time_point deadline);
  // Choice c of request r (body: its POST body, for the other ranks), through the batcher (over ranks: on
  // every rank at once).
  Session::Output generate(const ParsedRequest& r, const std::string& body, bool chat, int c,
                           const std::function<void(const StepEvent&)>& on_step);
  // The step check of a generation: throws Ended when it must stop.
  void check_step(const http::Exchange& ex, Slot& slot, Clock::time_point deadline) const;
  json envelope(const Tag& t, bool chat, bool chunk) const;
  json logprobs_json(bool chat, std::span<const int32_t> tokens, std::span<const TokenLogprob> lps, size_t a,
                     size_t b, int top) const;
  template <typename Send, typename Delta>
  size_t stream_choice(int c, const ParsedRequest& r, const std::string& body, const std::string& tag,
                       size_t hold, bool chat, const Send& send, const Delta& delta_event,
                       const std::function<void(int, json)>& send_canvas, const std::function<void()>& step);
  std::string finish_reason(const Session::Output& out, const GenerateOptions& o) const;
  void count_done(size_t prompt_tokens, size_t completion_tokens, Clock::time_point t0);
  // A rank other than 0: rank 0 introduced choice c of a request; runs it on a thread of its own.
  void start_follower(uint64_t key, const std::string& words);
  Tag next_tag(bool chat);

  ServeArgs args_;
  Session session_;
  Admission admission_;
  std::string model_id_;
  std::vector<std::string> key_digests_;  // SHA-256 of each API key
  int64_t created_ = 0;
  std::atomic<bool> stopping_{false};  // the drain deadline passed: generations end
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> abandoned_{0};  // requests whose client went away before the end
  std::atomic<int64_t> ok_{0}, failed_{0}, timed_out_{0}, in_flight_{0}, prompt_tokens_{0},
      completion_tokens_{0}, micros_{0};  // /metrics
  mutable std::mutex slots_m_;
  std::map<std::string, std::shared_ptr<Slot>> slots_;
  std::mutex log_m_;
  std::FILE* log_ = nullptr;
  http::Server* http_ = nullptr;       // while run() serves
  std::atomic<uint64_t> next_key_{1};  // over ranks: rank 0 names each choice it introduces
  std::mutex followers_m_;             // a rank other than 0: its threads running rank 0's requests
  std::condition_variable followers_cv_;
  int followers_ = 0;
  Batcher batcher_;  // last member: its engine thread stops first
};

}  // namespace tessera::cli
