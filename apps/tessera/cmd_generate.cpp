// tessera generate / tessera chat
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/tessera/canvas_event.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"

namespace tessera::cli {

namespace {

void print_stats(const Session::Output& o, Session& s, FILE* f) {
  const double tps = o.seconds > 0 ? static_cast<double>(o.result.tokens.size()) / o.seconds : 0.0;
  const std::string kv = s.engine().kv_cache_bytes() > 0
                             ? ", KV cache " + human_bytes(static_cast<double>(s.engine().kv_cache_bytes()))
                             : "";
  const MoeStats& m = s.engine().moe_stats();
  char moe[96] = "";
  if (m.layer_forwards > 0)
    std::snprintf(
        moe, sizeof moe, " · %.1f of %lld experts per MoE layer%s", m.mean(m.unique),
        static_cast<long long>(s.config().moe.n_experts),
        s.options().des != DesMode::Off ? (" (DES-" + std::string(name(s.options().des)) + ")").c_str() : "");
  // On a GPU the memory that matters is the device's: what this process holds there (weights, workspace,
  // caches, the CUDA runtime; nothing is allocated during a step, so this is the peak).
  const int64_t device_used = device_bytes_in_use(s.engine());
  const std::string memory = device_used >= 0
                                 ? "GPU memory " + human_bytes(static_cast<double>(device_used))
                                 : "peak memory " + human_bytes(static_cast<double>(peak_rss_bytes()));
  std::fprintf(f, "[%d steps · %zu tokens in %.2f s · %.1f tokens/s · %s (activations %s%s)%s]\n",
               o.result.steps_run, o.result.tokens.size(), o.seconds, tps, memory.c_str(),
               human_bytes(static_cast<double>(s.engine().max_planned_peak())).c_str(), kv.c_str(), moe);
}

// One line of JSON. Generated text need not be valid UTF-8 (a byte-level model may stop inside a
// character): invalid bytes are written as U+FFFD, the token ids stay exact.
std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// --logprobs N: per generated token its id, text, log-probability, the step that decided it and the N
// most likely tokens at that step.
nlohmann::json logprobs_json(const Session::Output& o, const Session& s) {
  const auto n_top = static_cast<size_t>(s.logprobs_top());
  const Tokenizer& tok = s.tokenizer();
  nlohmann::json arr = nlohmann::json::array();
  for (size_t i = 0; i < o.result.tokens.size() && i < o.result.logprobs.size(); ++i) {
    const TokenLogprob& t = o.result.logprobs[i];
    nlohmann::json top = nlohmann::json::array();
    for (size_t k = 0; k < std::min(n_top, t.top.size()); ++k)
      top.push_back({{"token", t.top[k].first},
                     {"text", tok.token_text(t.top[k].first)},
                     {"logprob", t.top[k].second}});
    arr.push_back({{"token", o.result.tokens[i]},
                   {"text", tok.token_text(o.result.tokens[i])},
                   {"logprob", t.logprob},
                   {"step", t.step},
                   {"top", top}});
  }
  return arr;
}

// --logprobs without --json: one line per generated token after the text.
void print_logprobs(const Session::Output& o, const Session& s, FILE* f) {
  const auto n_top = static_cast<size_t>(s.logprobs_top());
  const Tokenizer& tok = s.tokenizer();
  auto quoted = [](const std::string& t) {
    return nlohmann::json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::fprintf(f, "%5s %5s %9s  %s\n", "index", "step", "logprob", "token (most likely at that step)");
  for (size_t i = 0; i < o.result.tokens.size() && i < o.result.logprobs.size(); ++i) {
    const TokenLogprob& t = o.result.logprobs[i];
    std::string line = quoted(tok.token_text(o.result.tokens[i]));
    for (size_t k = 0; k < std::min(n_top, t.top.size()); ++k) {
      char lp[32];
      std::snprintf(lp, sizeof lp, " %.3f", static_cast<double>(t.top[k].second));
      line += (k == 0 ? "  (" : ", ") + quoted(tok.token_text(t.top[k].first)) + lp;
      if (k + 1 == std::min(n_top, t.top.size())) line += ")";
    }
    std::fprintf(f, "%5zu %5d %9.4f  %s\n", i, t.step, static_cast<double>(t.logprob), line.c_str());
  }
}

// Whether a raw prompt gets the chat template: --chat, or a model that has one unless --raw, an empty
// prompt or an infilling --suffix.
bool uses_chat(const SessionArgs& a, const Session& s, const std::string& prompt) {
  return a.chat || (!a.raw && !a.suffix && s.has_chat_template() && !prompt.empty());
}

nlohmann::json result_json(const Session::Output& o, Session& s, size_t prompt_tokens) {
  nlohmann::json j = {
      {"model", s.model_dir()},
      {"text", o.text},
      {"tokens", o.result.tokens},
      {"stopped", o.stopped},  // the text was cut before a --stop sequence
      {"prompt_tokens", prompt_tokens},
      {"suffix_tokens", s.options().suffix.size()},  // --suffix (infilling)
      {"steps", o.result.steps_run},
      {"forwards", o.result.forwards},
      {"seconds", o.seconds},
      {"tokens_per_second", o.seconds > 0 ? static_cast<double>(o.result.tokens.size()) / o.seconds : 0.0},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"device_bytes_in_use", device_bytes_in_use(s.engine())},  // -1 on the CPU
      {"activation_peak_bytes", s.engine().max_planned_peak()},
      {"kv_cache_bytes", s.engine().kv_cache_bytes()},
      {"gen_length", s.options().gen_length},
      {"block_length", s.options().block_length},
      {"alg", name(s.options().alg)},
      {"cache", name(s.options().cache)},
      {"sparse", s.options().sparse},
      {"sparse_pattern_bytes", s.engine().sparse_bytes()},
      {"des", name(s.options().des)}};
  const GenerateOptions& g = s.options();
  if (g.logprobs) j["logprobs"] = logprobs_json(o, s);
  if (g.window) {
    j["window"] = {{"external", window_external(g)},
                   {"internal", g.window_in},
                   {"refresh", g.window_refresh},
                   {"early_stop", g.window_early_stop}};
  }
  if (g.edit) {  // token editing: its settings and every rewrite
    nlohmann::json edits = nlohmann::json::array();
    for (const TokenEdit& e : o.result.edits)
      edits.push_back({{"step", e.step},
                       {"position", e.position - static_cast<int32_t>(prompt_tokens)},
                       {"old", e.from},
                       {"new", e.to}});
    j["edit"] = {{"threshold", g.threshold},
                 {"edit_threshold", g.edit_threshold},
                 {"max_post_steps", g.max_post_steps},
                 {"penalty", g.edit_penalty},
                 {"edits", edits}};
  }
  const MoeStats& m = s.engine().moe_stats();
  if (m.layer_forwards > 0) {  // means over every (MoE layer, forward)
    j["moe"] = {{"n_experts", s.config().moe.n_experts}, {"top_k", s.config().moe.top_k},
                {"unique_experts", m.mean(m.unique)},    {"unique_experts_block", m.mean(m.unique_voting)},
                {"coreset", m.mean(m.coreset)},          {"des_scope", name(s.options().des_scope)}};
  }
  return j;
}

// The prompts of --prompts-file: one per line ('-': standard input); a line that starts with '"' is a
// JSON string (for prompts with newlines or other escapes); empty lines are skipped.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) fail("cannot read the prompts file " + path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<std::string> prompts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = path + " line " + std::to_string(n);
    if (line[0] == '"') {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_string()) fail(where + ": a line that starts with '\"' must be one JSON string");
      line = j.get<std::string>();
    }
    check_utf8(line, where.c_str());
    prompts.push_back(line);
  }
  if (prompts.empty()) fail("the prompts file " + path + " holds no prompt");
  return prompts;
}

// Every prompt of the file, --batch of them at a time sharing forwards (engine/batcher.h); results are
// written in the file's order as soon as they and every earlier one are done. A prompt that fails
// (too long for the context, say) gets its error and the others go on; the exit status is then 1.
int generate_many(Session& s, const SessionArgs& a, const std::vector<std::string>& prompts, int batch) {
  Batcher b(s.engine(), batch);
  const size_t n = prompts.size();
  std::vector<Session::Output> out(n);
  std::vector<std::string> err(n);
  std::vector<size_t> prompt_tokens(n);
  std::vector<char> done(n, 0);
  std::atomic<size_t> next{0};
  std::mutex m;
  size_t written = 0, tokens = 0, failed = 0;
  const bool progress = !a.json && !a.no_progress && isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  auto write_ready = [&] {  // under m
    for (; written < n && done[written]; ++written) {
      const size_t i = written;
      if (!err[i].empty()) {
        ++failed;
        if (a.json)
          std::printf("%s\n", json_line({{"index", i}, {"error", err[i]}}).c_str());
        else
          std::fprintf(stderr, "tessera: prompt %zu: %s\n", i + 1, err[i].c_str());
        continue;
      }
      tokens += out[i].result.tokens.size();
      if (a.json) {
        nlohmann::json j;  // read the engine's counters on its own thread, between two forwards
        b.run([&] { j = result_json(out[i], s, prompt_tokens[i]); }, false);
        j["index"] = i;
        std::printf("%s\n", json_line(j).c_str());
      } else {
        std::printf("%s\n", out[i].text.c_str());
      }
    }
    std::fflush(stdout);
    if (progress) std::fprintf(stderr, "\r[%zu / %zu prompts]", written, n);
  };
  auto worker = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        const auto ids = s.prompt_ids({{"user", prompts[i]}}, uses_chat(a, s, prompts[i]));
        prompt_tokens[i] = ids.size();
        out[i] = s.run(b, ids, s.options(), {});
      } catch (const Error& e) {
        err[i] = e.what();
      }
      std::lock_guard<std::mutex> l(m);
      done[i] = 1;
      write_ready();
    }
  };
  std::vector<std::thread> th;
  for (size_t t = 0; t < std::min(n, static_cast<size_t>(batch)); ++t) th.emplace_back(worker);
  for (auto& t : th) t.join();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const BatchStats st = b.stats();
  if (progress) std::fprintf(stderr, "\r");
  if (!a.json) {
    char per[64] = "";
    if (st.forwards > 0)
      std::snprintf(per, sizeof per, " · %.2f sequences per forward",
                    static_cast<double>(st.sequences) / static_cast<double>(st.forwards));
    std::fprintf(stderr, "[%zu prompts%s · %zu tokens in %.2f s · %.1f tokens/s%s]\n", n,
                 failed > 0 ? (", " + std::to_string(failed) + " failed").c_str() : "", tokens, sec,
                 sec > 0 ? static_cast<double>(tokens) / sec : 0.0, per);
  }
  return failed > 0 ? 1 : 0;
}

// tessera chat: one user turn per line, answered with the whole conversation as the prompt. Lines that
// start with '/' are commands (a message that starts with '/' is written "//..."); messages and command
// replies go to stderr, answers to stdout. When the conversation outgrows the model's context, its
// oldest exchanges are dropped (the system message stays); a turn that fails (too long alone, say) is
// reported and leaves the conversation as it was, and the chat goes on.
int run_chat(Session& s, const SessionArgs& a, std::istream& in) {
  const bool templ = s.has_chat_template();
  if (!templ)
    std::fprintf(stderr, "note: %s has no chat template; turns are concatenated\n", s.model_dir().c_str());
  else if (s.chat_template().builtin())
    std::fprintf(stderr, "note: %s ships no chat template; using %s\n", s.model_dir().c_str(),
                 s.chat_template().origin().c_str());
  std::vector<ChatMessage> history;  // a system message first, if set
  const bool interactive = isatty(fileno(stdin)) != 0;
  const auto first_turn = [&] { return !history.empty() && history[0].role == "system" ? size_t{1} : 0; };
  std::string line;
  while (true) {
    if (interactive) std::fprintf(stderr, "you> ");
    if (!std::getline(in, line) || line.empty()) break;
    if (line[0] == '/' && line.rfind("//", 0) != 0) {
      const size_t sp = line.find(' ');
      const std::string cmd = line.substr(0, sp), arg = sp == std::string::npos ? "" : line.substr(sp + 1);
      if (cmd == "/quit" || cmd == "/exit" || cmd == "/bye") break;
      if (cmd == "/help") {
        std::fprintf(stderr,
                     "/clear        forget the conversation (the system message stays)\n"
                     "/undo         forget the last exchange\n"
                     "/system TEXT  set the system message (/system alone removes it)\n"
                     "/quit         end (also /exit, /bye, an empty line or EOF)\n"
                     "//text        send a message that starts with '/'\n");
      } else if (cmd == "/clear") {
        history.resize(first_turn());
        std::fprintf(stderr, "(conversation cleared)\n");
      } else if (cmd == "/undo") {
        if (history.size() >= first_turn() + 2) {
          history.resize(history.size() - 2);
          std::fprintf(stderr, "(last exchange forgotten)\n");
        } else {
          std::fprintf(stderr, "(nothing to undo)\n");
        }
      } else if (cmd == "/system") {
        if (first_turn() == 1) history.erase(history.begin());
        if (!arg.empty()) history.insert(history.begin(), ChatMessage{"system", arg});
        std::fprintf(stderr, arg.empty() ? "(system message removed)\n" : "(system message set)\n");
      } else {
        std::fprintf(stderr, "unknown command %s: /help lists the commands\n", cmd.c_str());
      }
      continue;
    }
    if (line[0] == '/') line.erase(0, 1);             // "//text" sends "/text"
    const std::vector<ChatMessage> before = history;  // what a failed turn leaves
    history.push_back({"user", line});
    Session::Output o;
    std::vector<int32_t> ids;
    try {
      ids = s.encode_messages(history, templ);
      size_t dropped = 0;
      while (!s.fits_context(ids.size()) && history.size() >= first_turn() + 3) {
        const auto at = history.begin() + static_cast<std::ptrdiff_t>(first_turn());
        history.erase(at, at + 2);  // the oldest exchange: a user turn and its answer
        dropped += 2;
        ids = s.encode_messages(history, templ);
      }
      s.check_prompt(ids, s.options(), true);
      if (dropped > 0) {
        std::fprintf(stderr,
                     "(the %zu oldest messages were dropped to fit the model's context of %lld tokens)\n",
                     dropped, static_cast<long long>(s.config().max_positions));
      }
      FILE* tty = (!a.no_progress && isatty(fileno(stderr))) ? stderr : nullptr;
      o = s.run(ids, tty);
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s (the message was not kept; the conversation is as it was)\n", e.what());
      history = before;
      continue;
    }
    if (a.json) {
      std::printf("%s\n", json_line(result_json(o, s, ids.size())).c_str());
    } else {
      std::printf("%s\n", o.text.c_str());
      if (s.options().logprobs) print_logprobs(o, s, stdout);
      print_stats(o, s, stderr);
    }
    std::fflush(stdout);
    history.push_back({"assistant", o.text});
  }
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt");
  auto a = std::make_shared<SessionArgs>();
  auto prompt = std::make_shared<std::string>();
  auto prompts_file = std::make_shared<std::string>();
  auto batch = std::make_shared<int>(8);
  auto* p_opt = sub->add_option("-p,--prompt", *prompt, "prompt text");
  auto* f_opt =
      sub->add_option("--prompts-file", *prompts_file,
                      "generate for every prompt of a file, one per line ('-': standard input; a line "
                      "starting with '\"' is a JSON string), in batches; results in the file's order");
  p_opt->excludes(f_opt);
  sub->add_option(
         "--batch", *batch,
         "with --prompts-file: prompts generated at the same time, sharing packed forwards (default 8)")
      ->check(CLI::Range(1, 256));
  add_session_options(sub, *a);
  sub->add_option("--suffix", a->suffix,
                  "infilling: the text after the generated span (every forward sees it; the answer is the "
                  "gen-length tokens between the prompt and it); raw text, no chat template");
  auto canvas = std::make_shared<bool>(false);
  sub->add_flag("--canvas", *canvas,
                "with --json: one line per step before the result, {\"canvas\": {...}}: the committed text, "
                "the provisional tokens and masks, the positions changed and the tokens rewritten");
  reg.handlers.emplace_back(sub, [a, prompt, prompts_file, batch, p_opt, f_opt, canvas] {
    if (p_opt->count() == 0 && f_opt->count() == 0)
      fail("give a prompt (-p TEXT) or a prompts file (--prompts-file)");
    if (a->suffix && a->chat)
      fail("--suffix infills raw text between the prompt and the suffix; drop --chat");
    if (f_opt->count() > 0) {
      if (*canvas) fail("--canvas streams the steps of one prompt (-p), not of a prompts file");
      const auto prompts = read_prompts(*prompts_file);
      Session s(*a);
      return generate_many(s, *a, prompts, *batch);
    }
    check_utf8(*prompt, "the prompt");
    Session s(*a);
    const bool chat = uses_chat(*a, s, *prompt);
    const auto ids = s.prompt_ids({{"user", *prompt}}, chat);
    if (chat && s.chat_template().builtin() && !a->json)
      std::fprintf(stderr, "note: %s ships no chat template; using %s (--raw: none)\n", s.model_dir().c_str(),
                   s.chat_template().origin().c_str());
    FILE* tty = (!a->json && !a->no_progress && isatty(fileno(stderr))) ? stderr : nullptr;
    if (*canvas && !a->json) fail("--canvas streams JSON step events; give --json too");
    const auto o =
        *canvas ? s.run(ids, s.options(),
                        [&](const StepEvent& ev) {
                          std::printf("%s\n",
                                      json_line({{"canvas", canvas_event_json(ev, s.tokenizer(), ids.size(),
                                                                              s.engine().mask_token(),
                                                                              s.options().eos_ids)}})
                                          .c_str());
                          std::fflush(stdout);
                        })
                : s.run(ids, tty);
    if (a->json) {
      std::printf("%s\n", json_line(result_json(o, s, ids.size())).c_str());
    } else {
      std::printf("%s\n", o.text.c_str());
      if (s.options().logprobs) print_logprobs(o, s, stdout);
      std::fflush(stdout);
      print_stats(o, s, stderr);
    }
    return 0;
  });

  auto* chat = app.add_subcommand(
      "chat", "Multi-turn chat on standard input (an empty line or EOF ends; /help lists the commands)");
  auto c = std::make_shared<SessionArgs>();
  add_session_options(chat, *c);
  reg.handlers.emplace_back(chat, [c] {
    Session s(*c);
    return run_chat(s, *c, std::cin);
  });
}

}  // namespace tessera::cli
