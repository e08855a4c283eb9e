// tessera serve: /v1/completions and /v1/chat/completions. A request is parsed and checked (limits
// first, serve_request.cpp), admitted (serve_http.h: --parallel, --max-queue), then its choices run at
// once through the batcher. Each step checks the request's client (gone: it ends; 499 in the log), its
// --timeout (504, or an error event when streamed) and the drain deadline (503). Streaming (SSE): a
// diffusion model decides positions out of order, so each event carries the text of the generation's
// decided prefix that was not sent yet (up to the first undecided position); the events concatenate to
// the final text, then a last event with the finish_reason, and "data: [DONE]". With stop sequences, the
// text that could begin one is held back until it is ruled out.
#include <algorithm>
#include <csignal>
#include <ctime>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "apps/tessera/canvas_event.h"
#include "apps/tessera/serve_app.h"
#include "core/error.h"
#include "core/utf8.h"
#include "tessera/tessera.h"

namespace tessera::cli {
using json = nlohmann::json;

namespace {

// The bytes of a text as a JSON array of numbers.
json byte_array(const std::string& t) {
  json v = json::array();
  for (const char ch : t) v.push_back(static_cast<unsigned char>(ch));
  return v;
}

// The text up to its last complete UTF-8 character (a byte-level model may stop inside one).
std::string complete_utf8(std::string s) {
  size_t i = s.size(), back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i == 0) return s;
  const auto lead = static_cast<unsigned char>(s[i - 1]);
  const size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
  if (need > back) s.resize(i - 1);
  return s;
}

// The id of tool call k of choice c of request `tag`: OpenAI's "call_" and 24 characters; Mistral's
// templates take only 9 alphanumerics. Derived from the three (splitmix64), so the same on every read.
std::string call_id(const std::string& tag, int c, size_t k, ToolCallFormat f) {
  static const char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  uint64_t x = std::hash<std::string>{}(tag + "/" + std::to_string(c) + "/" + std::to_string(k));
  std::string id = f == ToolCallFormat::Mistral ? "" : "call_";
  for (int i = 0; i < (f == ToolCallFormat::Mistral ? 9 : 24); ++i) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    id += kDigits[(z ^ (z >> 31)) % 62];
  }
  return id;
}

// A choice's reply read into content, reasoning and tool calls (ids given here; with
// parallel_tool_calls false, the first call only).
ParsedReply read_reply(const ReplyFormat& f, const std::string& text, const std::string& tag, int c) {
  ParsedReply p = parse_reply(text, f.tools, f.reasoning, tag);
  if (!f.parallel && p.tool_calls.size() > 1) p.tool_calls.resize(1);
  for (size_t k = 0; k < p.tool_calls.size(); ++k) p.tool_calls[k].id = call_id(tag, c, k, f.tools);
  return p;
}

// OpenAI's tool_calls; streamed deltas carry each call's index.
json tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index, bool delta) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json call = {{"id", calls[k].id},
                 {"type", "function"},
                 {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (delta) call["index"] = first_index + k;
    out.push_back(std::move(call));
  }
  return out;
}

// The assistant message of a read reply: content (null when the reply is only tool calls), the
// thinking text as reasoning_content, the tool calls.
json reply_message(const ParsedReply& p) {
  json m = {{"role", "assistant"}};
  m["content"] = p.content.empty() && !p.tool_calls.empty() ? json(nullptr) : json(p.content);
  if (!p.reasoning.empty()) m["reasoning_content"] = p.reasoning;
  if (!p.tool_calls.empty()) m["tool_calls"] = tool_calls_json(p.tool_calls, 0, false);
  return m;
}

json usage(size_t prompt_tokens, size_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

// The prompt of choice c of a request (choice c % n of prompt c / n).
const std::vector<int32_t>& prompt_of(const ParsedRequest& r, int c) {
  return r.prompts[static_cast<size_t>(c / r.n)];
}

// The options of choice i of a prompt: its seed + i.
GenerateOptions choice(const GenerateOptions& o, int i) {
  GenerateOptions c = o;
  c.seed += static_cast<uint64_t>(i);
  return c;
}

// Runs fn(0), ..., fn(n - 1) at once (choice 0 on this thread, the others on their own) so that the
// batcher packs their forwards; once all have ended, rethrows the first failure.
void run_choices(int n, const std::function<void(int)>& fn) {
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

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

void ServeApp::completion(http::Exchange& ex, bool chat) {
  const auto start = Clock::now();
  const Clock::time_point deadline =
      args_.timeout > 0
          ? start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(args_.timeout))
          : Clock::time_point::max();
  ParsedRequest r;
  std::unique_ptr<Admission::Ticket> ticket;
  auto slot = std::make_shared<Slot>();
  slot->id = ex.request().id;
  slot->route = ex.request().path;
  slot->start = start;
  SlotScope scope(*this, slot);
  try {
    r = parse_request(ex.request().body, chat, session_, model_id_, args_.limits);
    slot->sequences = static_cast<int>(r.prompts.size()) * r.n;
    ticket = admission_.enter(slot->sequences, deadline);  // may wait for its turn
  } catch (const BadRequest& b) {
    ++failed_;
    return ex.reply(error_response(b));
  }
  Held held(in_flight_, std::move(ticket));
  slot->running = true;
  size_t prompt_tokens = 0;
  for (const auto& p : r.prompts)
    prompt_tokens += p.size() + r.options.suffix.size();  // the suffix is input too
  if (r.stream)
    answer_stream(ex, chat, r, prompt_tokens, *slot, held, deadline);
  else
    answer_whole(ex, chat, r, prompt_tokens, *slot, held, deadline);
}

Session::Output ServeApp::generate(const ParsedRequest& r, const std::string& body, bool chat, int c,
                                   const std::function<void(const StepEvent&)>& on_step) {
  const GenerateOptions o = choice(r.options, c % r.n);
  if (!batcher_.over_ranks()) return session_.run(batcher_, prompt_of(r, c), o, on_step);
  const uint64_t key = next_key_++;
  const Batcher::Introduction intro(batcher_, key,
                                    std::string(chat ? "c" : "t") + std::to_string(c) + "\n" + body);
  return session_.run(batcher_, prompt_of(r, c), o, on_step, key);
}

int ServeApp::rank() const {
  const auto& comm = session_.engine().options().comm;
  return comm ? comm->rank() : 0;
}

int ServeApp::follow() {
  // mpirun passes SIGTERM / SIGINT to every rank: rank 0 drains and ends, then its batcher ends this one.
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  std::fprintf(stderr, "tessera serve: rank %d follows rank 0\n", rank());
  std::fflush(stderr);
  batcher_.wait_for_rank0();
  std::unique_lock<std::mutex> l(followers_m_);
  followers_cv_.wait(l, [&] { return followers_ == 0; });
  if (const int64_t n = batcher_.stats().orphaned; n > 0)
    std::fprintf(stderr,
                 "tessera serve: rank %d: %lld requests still waited for a forward when rank 0 stopped\n",
                 rank(), static_cast<long long>(n));
  return 0;
}

void ServeApp::start_follower(uint64_t key, const std::string& words) {
  {
    std::lock_guard<std::mutex> l(followers_m_);
    ++followers_;
  }
  std::thread([this, key, words] {
    try {
      // words: "c" (chat) or "t", the choice, a newline, the request's body (generate above)
      const size_t nl = words.find('\n');
      if (words.size() < 3 || nl == std::string::npos) fail("malformed introduction from rank 0");
      const bool chat = words[0] == 'c';
      const int c = std::stoi(words.substr(1, nl - 1));
      const ParsedRequest r = parse_request(words.substr(nl + 1), chat, session_, model_id_, args_.limits);
      session_.run(batcher_, prompt_of(r, c), choice(r.options, c % r.n), {}, key);
    } catch (const std::exception&) {  // rank 0 met the same error and answered it, or ended the request
    }
    std::lock_guard<std::mutex> l(followers_m_);  // (notified under the lock: follow() returns after it)
    --followers_;
    followers_cv_.notify_all();
  }).detach();
}

void ServeApp::check_step(const http::Exchange& ex, Slot& slot, Clock::time_point deadline) const {
  ++slot.steps;
  if (stopping_)
    throw Ended{503, "server_shutting_down", "the server is shutting down (its drain deadline passed)"};
  if (Clock::now() > deadline) {
    char s[32];
    std::snprintf(s, sizeof s, "%g", args_.timeout);
    throw Ended{504, "timeout",
                std::string("the request took longer than the server's --timeout of ") + s + " s"};
  }
  if (ex.client_gone()) throw Ended{499, "client_gone", "the client went away"};
}

void ServeApp::answer_whole(http::Exchange& ex, bool chat, const ParsedRequest& r, size_t prompt_tokens,
                            Slot& slot, Held& held, Clock::time_point deadline) {
  const GenerateOptions& o = r.options;
  const int n = r.n, total = static_cast<int>(r.prompts.size()) * n, top = r.logprobs;
  std::vector<Session::Output> outs(static_cast<size_t>(total));
  const Tag tag = next_tag(chat);
  const auto t0 = Clock::now();
  try {
    run_choices(total, [&](int i) {
      outs[static_cast<size_t>(i)] =
          generate(r, ex.request().body, chat, i, [&](const StepEvent&) { check_step(ex, slot, deadline); });
    });
  } catch (const Ended& e) {
    ++(e.status == 499 ? abandoned_ : e.status == 504 ? timed_out_ : failed_);
    held.release();
    return ex.reply(error_response({e.status, e.type, e.message}));  // a 499 is read by nobody
  } catch (const Error& e) {
    ++failed_;
    held.release();
    return ex.reply(error_response({400, "invalid_request_error", e.what()}));
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
      json message = {{"role", "assistant"}, {"content", out.text}};
      std::string why = reason;
      if (r.reply.parses()) {
        const ParsedReply p = read_reply(
            r.reply, r.reply.start + session_.tokenizer().decode(out.result.tokens, false), tag.id, i);
        message = reply_message(p);
        if (!p.tool_calls.empty()) why = "tool_calls";
      }
      j["choices"].push_back({{"index", i}, {"message", message}, {"logprobs", lp}, {"finish_reason", why}});
    } else {
      j["choices"].push_back({{"index", i}, {"text", out.text}, {"logprobs", lp}, {"finish_reason", reason}});
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
  ex.note_tokens(static_cast<int64_t>(prompt_tokens), static_cast<int64_t>(completion));
  http::Response res;
  res.set(dump(j), "application/json");
  held.release();
  ex.reply(std::move(res));
}

void ServeApp::answer_stream(http::Exchange& ex, bool chat, const ParsedRequest& r, size_t prompt_tokens,
                             Slot& slot, Held& held, Clock::time_point deadline) {
  const GenerateOptions& o = r.options;
  const int total = static_cast<int>(r.prompts.size()) * r.n, top = r.logprobs;
  const Tag tag = next_tag(chat);
  const auto t0 = Clock::now();
  http::Response head;
  head.content_type = "text/event-stream";
  head.headers.push_back({"Cache-Control", "no-cache"});
  ex.begin_stream(std::move(head));
  std::mutex sink_mutex;  // the choices' threads write events
  auto write = [&](const std::string& ev) {
    std::lock_guard<std::mutex> l(sink_mutex);
    if (!ex.write(ev)) throw Ended{499, "client_gone", "the client went away"};
  };
  auto send = [&](const json& j) { write("data: " + dump(j) + "\n\n"); };
  auto delta_event = [&](int index, const ReplyDelta& piece, const json& reason, const json& lp) {
    json j = envelope(tag, chat, true);
    json c;
    if (chat) {
      json d = json::object();
      if (!piece.content.empty()) d["content"] = piece.content;
      if (!piece.reasoning.empty()) d["reasoning_content"] = piece.reasoning;
      if (!piece.tool_calls.empty())
        d["tool_calls"] = tool_calls_json(piece.tool_calls, piece.first_tool_index, true);
      c = {{"index", index}, {"delta", d}};
    } else {
      c = {{"index", index}, {"text", piece.content}};
    }
    if (top >= 0) c["logprobs"] = lp;
    c["finish_reason"] = reason;
    j["choices"] = json::array({c});
    return j;
  };
  size_t sum = 0;
  try {
    for (int i = 0; chat && i < total; ++i) {
      json first = envelope(tag, true, true);
      first["choices"] = json::array(
          {{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}});
      send(first);
    }
    size_t hold = 0;
    for (const std::string& t : o.stop) hold = std::max(hold, t.size() - 1);
    std::vector<size_t> completion(static_cast<size_t>(total));
    // "canvas": true: a named event per step (OpenAI clients read only the unnamed data events).
    std::function<void(int, json)> send_canvas = [&](int c, json j) {
      j["index"] = c;
      write("event: tessera.canvas\ndata: " + dump(j) + "\n\n");
    };
    const std::function<void()> step = [&] { check_step(ex, slot, deadline); };
    run_choices(total, [&](int c) {
      completion[static_cast<size_t>(c)] = stream_choice(c, r, ex.request().body, tag.id, hold, chat, send,
                                                         delta_event, r.canvas ? send_canvas : nullptr, step);
    });
    for (size_t t : completion) sum += t;
    if (r.include_usage) {  // as OpenAI: one more chunk, no choices, the usage of the whole request
      json u = envelope(tag, chat, true);
      u["choices"] = json::array();
      u["usage"] = usage(prompt_tokens, sum);
      send(u);
    }
    count_done(prompt_tokens, sum, t0);
  } catch (const Ended& e) {
    ++(e.status == 499 ? abandoned_ : e.status == 504 ? timed_out_ : failed_);
    if (e.status == 499) return;  // nobody reads: the connection closes
    held.release();
    ex.write("data: " + error_body({e.status, e.type, e.message}) + "\n\n");
  } catch (const Error& e) {
    ++failed_;
    held.release();
    ex.write("data: " + error_body({400, "invalid_request_error", e.what()}) + "\n\n");
  }
  held.release();
  ex.note_tokens(static_cast<int64_t>(prompt_tokens), static_cast<int64_t>(sum));
  ex.write("data: [DONE]\n\n");
  ex.end_stream();
}

// One choice of a streamed request: its deltas, then its finish reason; returns its tokens.
// c: the choice's index; o: its options (its seed). A chat reply that is read (r.reply.parses()) goes
// through a ReplyStream: its text with special tokens (tool-call markers often are), split into content,
// reasoning and whole tool calls as it grows.
template <typename Send, typename Delta>
size_t ServeApp::stream_choice(int c, const ParsedRequest& r, const std::string& body, const std::string& tag,
                               size_t hold, bool chat, const Send& send, const Delta& delta_event,
                               const std::function<void(int, json)>& send_canvas,
                               const std::function<void()>& step) {
  const GenerateOptions o = choice(r.options, c % r.n);
  const std::vector<int32_t>& ids = prompt_of(r, c);
  const int top = r.logprobs;
  const bool read = chat && r.reply.parses();
  std::optional<ReplyStream> reader;
  if (read) reader.emplace(r.reply.tools, r.reply.reasoning, tag);
  size_t calls_sent = 0;
  // What the text fed so far gives that can be sent; ids and parallel_tool_calls applied.
  const auto next = [&](const std::string& text, bool final) {
    ReplyDelta d = reader->update(r.reply.start + text, final);
    std::vector<ToolCall> calls;
    for (size_t k = 0; k < d.tool_calls.size(); ++k) {
      const size_t index = d.first_tool_index + k;
      if (!r.reply.parallel && index > 0) continue;
      ToolCall call = std::move(d.tool_calls[k]);
      call.id = call_id(tag, c, index, r.reply.tools);
      calls.push_back(std::move(call));
    }
    d.tool_calls = std::move(calls);
    d.first_tool_index = calls_sent;
    calls_sent += d.tool_calls.size();
    return d;
  };
  std::string sent;
  size_t sent_tokens = 0;  // logprobs: the tokens of the prefix whose text was sent with theirs
  const size_t P = ids.size();
  std::vector<int32_t> prefix;
  const int32_t mask = session_.engine().mask_token();
  const Tokenizer& tk = session_.tokenizer();
  const Session::Output out = generate(r, body, chat, c, [&](const StepEvent& ev) {
    step();
    if (send_canvas) send_canvas(c, canvas_event_json(ev, tk, P, mask, o.eos_ids));
    prefix.clear();  // the generation's committed prefix, up to the first mask or EOS
    for (size_t i = P; i < static_cast<size_t>(ev.committed) && ev.canvas[i] != mask; ++i) {
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), ev.canvas[i]) != o.eos_ids.end()) break;
      prefix.push_back(ev.canvas[i]);
    }
    std::string text = tk.decode(prefix, !read);
    if (const size_t cut = find_stop(text, o.stop); cut != std::string::npos)
      text.resize(cut);
    else
      text.resize(text.size() - std::min(text.size(), hold));
    text = complete_utf8(std::move(text));
    if (text.size() > sent.size() && text.compare(0, sent.size(), sent) == 0) {
      ReplyDelta d;
      if (read)
        d = next(text, false);
      else
        d.content = text.substr(sent.size());
      sent = text;
      if (d.content.empty() && d.reasoning.empty() && d.tool_calls.empty()) return;  // all held back
      json lp;
      if (top >= 0) {  // the tokens whose text now lies wholly in what was sent
        size_t k = sent_tokens;
        while (k < prefix.size() &&
               tk.decode(std::span<const int32_t>(prefix).first(k + 1), !read).size() <= text.size())
          ++k;
        lp = logprobs_json(chat, prefix, ev.logprobs, sent_tokens, k, top);
        sent_tokens = k;
      }
      send(delta_event(c, d, nullptr, lp));
    }
  });
  const std::string whole = read ? tk.decode(out.result.tokens, false) : out.text;
  const bool extends = whole.size() >= sent.size() && whole.compare(0, sent.size(), sent) == 0;
  ReplyDelta rest;
  if (read)
    rest = next(extends ? whole : sent, true);
  else if (extends)
    rest.content = whole.substr(sent.size());
  const json lp = top < 0 ? json(nullptr)
                          : logprobs_json(chat, out.result.tokens, out.result.logprobs, sent_tokens,
                                          out.result.tokens.size(), top);
  send(delta_event(c, rest, calls_sent > 0 ? std::string("tool_calls") : finish_reason(out, o), lp));
  return out.result.tokens.size();
}

// OpenAI's logprobs of the tokens [a, b) of a choice's generated `tokens` (decided; lps beside them).
// Completions: {tokens, token_logprobs, top_logprobs (a {text: logprob} object per token), text_offset
// (bytes into the choice's text)}; chat: {content: [{token, logprob, bytes, top_logprobs: [{token,
// logprob, bytes}]}]}. Token texts are their bytes (invalid UTF-8 shows as U+FFFD; chat's bytes are exact).
json ServeApp::logprobs_json(bool chat, std::span<const int32_t> tokens, std::span<const TokenLogprob> lps,
                             size_t a, size_t b, int top) const {
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

// system_fingerprint: the engine's version (OpenAI's field for the backend configuration).
json ServeApp::envelope(const Tag& t, bool chat, bool chunk) const {
  return {{"id", t.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", t.created},
          {"model", model_id_},
          {"system_fingerprint", std::string("tessera-") + tessera_version()}};
}

std::string ServeApp::finish_reason(const Session::Output& out, const GenerateOptions& o) const {
  return out.stopped || static_cast<int>(out.result.tokens.size()) < o.gen_length ? "stop" : "length";
}

// Counts one generation request that answered: its tokens and its seconds since t0 (when its generation
// began, streamed or not).
void ServeApp::count_done(size_t prompt_tokens, size_t completion_tokens, Clock::time_point t0) {
  ++ok_;
  prompt_tokens_ += static_cast<int64_t>(prompt_tokens);
  completion_tokens_ += static_cast<int64_t>(completion_tokens);
  micros_ += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

// OpenAI's id prefixes: chatcmpl- for chat completions, cmpl- for completions.
ServeApp::Tag ServeApp::next_tag(bool chat) {
  return {std::string(chat ? "chatcmpl-" : "cmpl-") + "tessera-" + std::to_string(++count_),
          static_cast<int64_t>(std::time(nullptr))};
}

}  // namespace tessera::cli
