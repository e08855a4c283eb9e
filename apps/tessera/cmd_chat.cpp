// tessera chat
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>

#include "apps/tessera/chat_input.h"
#include "apps/tessera/chat_ranks.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/generate_output.h"

namespace tessera::cli {

namespace {

// tessera chat: one user turn per line, answered with the whole conversation as the prompt. Lines that
// start with '/' are commands (a message that starts with '/' is written "//..."); empty lines are
// skipped; messages and command replies go to stderr, answers to stdout. When the conversation outgrows
// the model's context, its oldest exchanges are dropped (the system message stays); a turn that fails
// (too long alone, say) or that the user stops (Ctrl-C on a terminal) leaves the conversation as it was,
// and the chat goes on.
// Over ranks (link): rank 0 reads the lines and broadcasts each (kLine; kQuit at the end), holding the link
// until the line's answer is done; every rank runs the same turn on it, and after each step rank 0 says
// whether the answer goes on (Ctrl-C). The other ranks print nothing (their output goes to /dev/null).
int run_chat(Session& s, const SessionArgs& a, std::istream& in, RankLink* link) {
  const bool follower = link != nullptr && link->rank() != 0;
  const bool templ = s.has_chat_template();
  if (!templ)
    std::fprintf(stderr, "note: %s has no chat template; turns are concatenated\n", s.model_dir().c_str());
  else if (s.chat_template().builtin())
    std::fprintf(stderr, "note: %s ships no chat template; using %s\n", s.model_dir().c_str(),
                 s.chat_template().origin().c_str());
  std::vector<ChatMessage> history;  // a system message first, if set
  std::optional<ChatInput> input;
  if (!follower) input.emplace(in);
  std::unique_lock<std::mutex> held;  // rank 0 over ranks: from a line's broadcast through its answer
  const auto next_line = [&]() -> std::optional<std::string> {
    if (held.owns_lock()) held.unlock();
    if (follower) {
      RankLink::Message m = link->receive();
      if (m.kind != RankLink::kLine) return std::nullopt;
      return std::move(m.body);
    }
    std::optional<std::string> line = input->next();
    if (link != nullptr) {
      held = link->hold();
      link->send(held, line ? RankLink::kLine : RankLink::kQuit, 0, 0, line.value_or(""));
    }
    return line;
  };
  const auto after_step = [&] {
    bool stop = false;
    if (!follower) {
      try {
        input->check_stop();
      } catch (const AnswerStopped&) {
        stop = true;
      }
    }
    if (link != nullptr) stop = link->stop_here(stop);
    if (stop) throw AnswerStopped{};
  };
  const auto first_turn = [&] { return !history.empty() && history[0].role == "system" ? size_t{1} : 0; };
  while (true) {
    const std::optional<std::string> next = next_line();
    if (!next) break;
    std::string line = *next;
    if (line[0] == '/' && line.rfind("//", 0) != 0) {
      const size_t sp = line.find(' ');
      const std::string cmd = line.substr(0, sp), arg = sp == std::string::npos ? "" : line.substr(sp + 1);
      if (cmd == "/quit" || cmd == "/exit" || cmd == "/bye") break;
      if (cmd == "/help") {
        std::fprintf(stderr,
                     "/clear        forget the conversation (the system message stays)\n"
                     "/undo         forget the last exchange\n"
                     "/system TEXT  set the system message (/system alone removes it)\n"
                     "/quit         end (also /exit, /bye, Ctrl-D or the end of the input)\n"
                     "//text        send a message that starts with '/'\n");
        if (input && input->interactive()) {
          const std::string h = ChatInput::history_path();
          std::fprintf(stderr,
                       "Ctrl-C        stop the answer being written; at the prompt, clear the line\n"
                       "              (twice on an empty line: end the chat)\n"
                       "Up / Down     earlier lines (the usual Emacs keys edit the line), kept in\n"
                       "              %s\n",
                       h.empty() ? "this session only" : h.c_str());
        }
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
      if (input) input->begin_answer();
      o = s.run(ids, tty, after_step);
    } catch (const AnswerStopped&) {
      std::fprintf(stderr, "(answer stopped)\n");
      history = before;
      continue;
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s (the message was not kept; the conversation is as it was)\n", e.what());
      history = before;
      continue;
    }
    if (a.json) {
      std::printf("%s\n", json_line(result_json(o, s, ids.size())).c_str());
    } else {
      const bool empty = o.text.find_first_not_of(" \t\r\n") == std::string::npos;
      if (empty) std::fprintf(stderr, "(empty answer)\n");
      if (!empty || isatty(fileno(stdout)) == 0) std::printf("%s\n", o.text.c_str());
      if (s.options().logprobs) print_logprobs(o, s, stdout);
      print_stats(o, s, stderr);
    }
    std::fflush(stdout);
    history.push_back({"assistant", o.text});
  }
  if (held.owns_lock()) link->followers_left(held);  // they ended on the same line (/quit, or the end)
  return 0;
}

}  // namespace

void add_chat(CLI::App& app, Registry& reg) {
  auto* chat = app.add_subcommand(
      "chat",
      "Multi-turn chat on standard input (/quit, Ctrl-D or EOF ends; /help lists the commands). On a "
      "terminal: line editing and history (Up / Down), Ctrl-C stops an answer");
  auto c = std::make_shared<SessionArgs>();
  add_session_options(chat, *c);
  chat->footer(
      "Examples:\n  tessera chat\n  tessera chat -m /models/LLaDA-8B-Instruct -n 128 --temperature 0.7\n"
      "  printf 'Hello\\nTell me more\\n' | tessera chat --json");
  reg.handlers.emplace_back(chat, [c] {
    Session s(*c);
    // Over ranks rank 0 reads standard input and the others follow its turns.
    std::unique_ptr<RankLink> link;
    if (auto comm = s.engine().options().comm; comm && comm->size() > 1) {
      link = std::make_unique<RankLink>(comm, c->dist_timeout);
      if (link->rank() != 0) {
        [[maybe_unused]] FILE* out = std::freopen("/dev/null", "w", stdout);
        [[maybe_unused]] FILE* err = std::freopen("/dev/null", "w", stderr);
      }
    }
    if (!c->json) s.print_notes();
    return run_chat(s, *c, std::cin, link.get());
  });
}

}  // namespace tessera::cli
