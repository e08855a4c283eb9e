// The live canvas view of generate and chat on a terminal.
#pragma once
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "decode/generate.h"
#include "io/tokenizer.h"

namespace tessera::cli {

// Redraws the canvas in place: the cursor goes back over the previous frame's rows, then the new
// frame is written in one call (no flicker).
class LiveView {
 public:
  LiveView(FILE* f, const Tokenizer& t, size_t prompt_len, int32_t mask)
      : f_(f), t_(t), plen_(prompt_len), mask_(mask) {
    winsize w{};
    if (ioctl(fileno(f), TIOCGWINSZ, &w) == 0 && w.ws_col > 0) cols_ = w.ws_col;
  }
  // The committed text plain; after it, the provisional tokens dimmed (with token editing they may
  // still change) and the masks as shaded blocks; the tokens this step rewrote in reverse video.
  void draw(const StepEvent& ev, int total_steps) {
    std::string body;
    edits_ += ev.edits.size();
    for (size_t i = plen_; i < ev.canvas.size(); ++i) {
      if (ev.canvas[i] == mask_) {
        body += "\xe2\x96\x91";
        continue;
      }
      const bool edited = std::any_of(ev.edits.begin(), ev.edits.end(), [&](const TokenEdit& e) {
        return static_cast<size_t>(e.position) == i;
      });
      const bool provisional = static_cast<int>(i) >= ev.committed;
      body += (edited        ? "\x1b[7m"
               : provisional ? "\x1b[2m"
                             : "") +
              t_.token_text(ev.canvas[i]) + (edited || provisional ? "\x1b[0m" : "");
    }
    std::string frame = body + "\n\x1b[2m[step " + std::to_string(ev.step + 1) + "/" +
                        std::to_string(total_steps) + "]" +
                        (edits_ > 0 ? " " + std::to_string(edits_) + " edits" : std::string()) + "\x1b[0m\n";
    std::string out;
    if (rows_ > 0) out += "\x1b[" + std::to_string(rows_) + "F";
    out += "\x1b[J" + frame;
    std::fwrite(out.data(), 1, out.size(), f_);
    std::fflush(f_);
    rows_ = count_rows(frame);
  }
  void clear() {
    if (rows_ > 0) {
      const std::string out = "\x1b[" + std::to_string(rows_) + "F\x1b[J";
      std::fwrite(out.data(), 1, out.size(), f_);
    }
    rows_ = 0;
  }

 private:
  int count_rows(const std::string& s) const {
    int rows = 0, col = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '\n') {
        ++rows;
        col = 0;
      } else if (c == 0x1b) {
        while (i < s.size() && s[i] != 'm') ++i;
      } else if ((c & 0xC0) != 0x80) {
        if (++col > cols_) {
          ++rows;
          col = 1;
        }
      }
    }
    return rows;
  }
  FILE* f_;
  const Tokenizer& t_;
  size_t plen_;
  int32_t mask_;
  int cols_ = 80;
  int rows_ = 0;
  size_t edits_ = 0;  // tokens rewritten so far
};

}  // namespace tessera::cli
