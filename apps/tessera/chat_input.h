// The lines of tessera chat: from a terminal through libedit (line editing, a history kept across
// sessions, Ctrl-C to clear the line or stop an answer), else plain lines from the stream.
#pragma once
#include <signal.h>

#include <istream>
#include <optional>
#include <string>

struct editline;
struct history;

namespace tessera::cli {

// Thrown from a step of an answer the user stopped with Ctrl-C.
struct AnswerStopped {};

class ChatInput {
 public:
  // Interactive when standard input is a terminal: then SIGINT is caught until destruction (the
  // previous handler, the terminal's settings and the locale are restored however the chat ends).
  explicit ChatInput(std::istream& in);
  ~ChatInput();
  ChatInput(const ChatInput&) = delete;
  ChatInput& operator=(const ChatInput&) = delete;
  bool interactive() const { return el_ != nullptr; }
  // The next message or command, without its line end; lines of only white space are skipped.
  // nullopt: the chat ends (EOF, Ctrl-D, or Ctrl-C twice on an empty line).
  std::optional<std::string> next();
  // Around an answer: Ctrl-C from begin_answer on makes check_stop throw AnswerStopped.
  void begin_answer();
  void check_stop() const;
  // Where the history is kept: $XDG_STATE_HOME/tessera/chat_history, else ~/.tessera_chat_history
  // (empty: neither is set).
  static std::string history_path();

 private:
  void catch_sigint(bool restart);
  std::istream& in_;
  editline* el_ = nullptr;
  history* hist_ = nullptr;
  std::string hist_path_;
  std::string old_locale_;
  struct sigaction old_sigint_ {};
  bool caught_ = false;      // SIGINT is ours (old_sigint_ holds the previous action)
  bool exit_armed_ = false;  // the last Ctrl-C came on an empty line
};

}  // namespace tessera::cli
