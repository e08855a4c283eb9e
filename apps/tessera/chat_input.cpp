#include "apps/tessera/chat_input.h"

#include <histedit.h>
#include <langinfo.h>
#include <unistd.h>

#include <clocale>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace tessera::cli {

namespace {

volatile std::sig_atomic_t g_sigint = 0;

extern "C" void on_sigint(int) {
  g_sigint = 1;
}

char* prompt(EditLine*) {
  static char p[] = "you> ";
  return p;
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

}  // namespace

std::string ChatInput::history_path() {
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && *state != '\0') return std::string(state) + "/tessera/chat_history";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.tessera_chat_history";
  return "";
}

ChatInput::ChatInput(std::istream& in) : in_(in) {
  if (isatty(STDIN_FILENO) == 0) return;
  // libedit reads and shows characters in the locale's encoding: the environment's if it is UTF-8,
  // else C.UTF-8 (the tokenizers read UTF-8).
  if (const char* l = std::setlocale(LC_CTYPE, nullptr)) old_locale_ = l;
  if (std::setlocale(LC_CTYPE, "") == nullptr || std::strcmp(nl_langinfo(CODESET), "UTF-8") != 0)
    std::setlocale(LC_CTYPE, "C.UTF-8");
  el_ = el_init("tessera", stdin, stderr, stderr);
  if (el_ == nullptr) return;
  catch_sigint(false);
  hist_ = history_init();
  HistEvent ev;
  history(hist_, &ev, H_SETSIZE, 1000);
  history(hist_, &ev, H_SETUNIQUE, 1);
  el_set(el_, EL_EDITOR, "emacs");
  el_set(el_, EL_PROMPT, &prompt);
  el_set(el_, EL_HIST, history, hist_);
  el_set(el_, EL_SIGNAL, 1);  // the terminal restored around Ctrl-Z and resized with the window
  el_source(el_, nullptr);    // the user's ~/.editrc
  hist_path_ = history_path();
  if (!hist_path_.empty()) history(hist_, &ev, H_LOAD, hist_path_.c_str());  // none yet: fine
}

ChatInput::~ChatInput() {
  if (el_ != nullptr) el_end(el_);
  if (hist_ != nullptr) history_end(hist_);
  if (caught_) sigaction(SIGINT, &old_sigint_, nullptr);
  if (!old_locale_.empty()) std::setlocale(LC_CTYPE, old_locale_.c_str());
}

// restart: system calls interrupted by Ctrl-C go on (while an answer is generated); without it a
// read of the terminal returns (el_gets gives up its line).
void ChatInput::catch_sigint(bool restart) {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = restart ? SA_RESTART : 0;
  sigaction(SIGINT, &sa, caught_ ? nullptr : &old_sigint_);
  caught_ = true;
}

std::optional<std::string> ChatInput::next() {
  if (el_ == nullptr) {
    std::string line;
    while (std::getline(in_, line))
      if (!blank(line)) return line;
    return std::nullopt;
  }
  while (true) {
    g_sigint = 0;
    catch_sigint(false);
    int count = 0;
    const char* got = el_gets(el_, &count);
    if (got != nullptr && count > 0) {
      std::string line(got);
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      exit_armed_ = false;
      if (blank(line)) continue;
      HistEvent ev;
      history(hist_, &ev, H_ENTER, line.c_str());
      if (!hist_path_.empty()) {
        std::error_code ec;  // $XDG_STATE_HOME/tessera; a failure shows as H_SAVE's, ignored
        std::filesystem::create_directories(std::filesystem::path(hist_path_).parent_path(), ec);
        history(hist_, &ev, H_SAVE, hist_path_.c_str());
      }
      return line;
    }
    if (g_sigint == 0) {  // EOF: Ctrl-D on an empty line
      std::fputc('\n', stderr);
      return std::nullopt;
    }
    const LineInfo* li = el_line(el_);
    const bool empty = li == nullptr || li->lastchar == li->buffer;
    std::fputs("^C\n", stderr);
    if (!empty) {
      exit_armed_ = false;  // the line is dropped
    } else if (exit_armed_) {
      return std::nullopt;
    } else {
      std::fputs("(to quit, press Ctrl-C again or Ctrl-D, or type /quit)\n", stderr);
      exit_armed_ = true;
    }
  }
}

void ChatInput::begin_answer() {
  if (el_ == nullptr) return;
  g_sigint = 0;
  catch_sigint(true);
}

void ChatInput::check_stop() const {
  if (el_ != nullptr && g_sigint != 0) throw AnswerStopped{};
}

}  // namespace tessera::cli
