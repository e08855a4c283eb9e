#include "apps/tessera/live_view.h"

#include <sys/ioctl.h>
#include <unistd.h>
#include <utf8proc.h>

#include <algorithm>
#include <string_view>
#include <vector>

namespace tessera::cli {

namespace {

enum class Style { Plain, Dim, Reverse };

const char* sgr(Style s) {
  switch (s) {
    case Style::Dim:
      return "\x1b[2m";
    case Style::Reverse:
      return "\x1b[7m";
    case Style::Plain:
      break;
  }
  return "\x1b[0m";
}

// Text laid out in rows of at most `cols` cells, each row self-contained: its style set where its
// glyphs need one and reset at its end, so any run of rows can be shown alone.
class Layout {
 public:
  explicit Layout(int cols) : cols_(std::max(cols, 1)) {}
  // One glyph `width` cells wide (0: a combining mark, drawn over the cell before); a glyph that does
  // not fit goes to the next row, as the terminal would put it.
  void put(std::string_view glyph, int width, Style s) {
    if (width > 0 && col_ > 0 && col_ + width > cols_) newline();
    if (s != style_) {
      rows_.back() += sgr(s);
      style_ = s;
    }
    rows_.back() += glyph;
    col_ += width;
  }
  void newline() {
    if (style_ != Style::Plain) rows_.back() += sgr(Style::Plain);
    rows_.emplace_back();
    col_ = 0;
    style_ = Style::Plain;
  }
  // UTF-8 text: invalid bytes as U+FFFD, '\n' ends the row, a tab is a space, other control characters
  // (which would move the cursor) and line / paragraph separators are dropped.
  void text(std::string_view s, Style st) {
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
    auto n = static_cast<utf8proc_ssize_t>(s.size());
    while (n > 0) {
      utf8proc_int32_t cp = 0;
      utf8proc_ssize_t k = utf8proc_iterate(p, n, &cp);
      std::string_view glyph(reinterpret_cast<const char*>(p),
                             static_cast<size_t>(std::max<utf8proc_ssize_t>(k, 0)));
      if (k <= 0) {
        k = 1;
        cp = 0xFFFD;
        glyph = "\xef\xbf\xbd";
      }
      p += k;
      n -= k;
      const utf8proc_category_t cat = utf8proc_category(cp);
      if (cp == '\n') {
        newline();
      } else if (cp == '\t') {
        put(" ", 1, st);
      } else if (cat != UTF8PROC_CATEGORY_CC && cat != UTF8PROC_CATEGORY_ZL && cat != UTF8PROC_CATEGORY_ZP) {
        put(glyph, utf8proc_charwidth(cp), st);
      }
    }
  }
  int row() const { return static_cast<int>(rows_.size()) - 1; }
  std::vector<std::string> take() {
    if (style_ != Style::Plain) rows_.back() += sgr(Style::Plain);
    style_ = Style::Plain;
    return std::move(rows_);
  }

 private:
  int cols_;
  int col_ = 0;
  Style style_ = Style::Plain;
  std::vector<std::string> rows_{std::string()};
};

// Plain one-line text cut to `cols` cells.
std::string fit(const std::string& s, int cols) {
  std::string out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  auto n = static_cast<utf8proc_ssize_t>(s.size());
  int used = 0;
  while (n > 0) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t k = utf8proc_iterate(p, n, &cp);
    if (k <= 0) break;
    const int w = utf8proc_charwidth(cp);
    if (used + w > cols) break;
    out.append(reinterpret_cast<const char*>(p), static_cast<size_t>(k));
    used += w;
    p += k;
    n -= k;
  }
  return out;
}

std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v >= 100 ? "%.0f" : "%.1f", v);
  return b;
}

std::string duration(double s) {
  char b[48];
  if (s < 10)
    std::snprintf(b, sizeof b, "%.1f s", s);
  else if (s < 60)
    std::snprintf(b, sizeof b, "%.0f s", s);
  else
    std::snprintf(b, sizeof b, "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return b;
}

std::string lines(int n) {
  return std::to_string(n) + (n == 1 ? " line" : " lines");
}

// A special token's placeholder: its content without the usual brackets, cut short.
std::string placeholder(std::string text) {
  for (std::string_view open : {"<|", "<", "["})
    if (text.rfind(open, 0) == 0) {
      text.erase(0, open.size());
      break;
    }
  for (std::string_view close : {"|>", ">", "]"})
    if (text.size() >= close.size() && text.compare(text.size() - close.size(), close.size(), close) == 0) {
      text.erase(text.size() - close.size());
      break;
    }
  if (text.size() > 16) text = text.substr(0, 15) + "…";
  return "\xe2\x9f\xa8" + text + "\xe2\x9f\xa9";  // ⟨text⟩
}

}  // namespace

LiveView::LiveView(FILE* f, const Tokenizer& t, const GenerateOptions& o, size_t prompt_len, int32_t mask,
                   bool block_causal)
    : f_(f), t_(t), o_(o), plen_(prompt_len), mask_(mask), block_causal_(block_causal) {}

int LiveView::block_of(int64_t pos) const {
  const int64_t b = std::max(1, std::min(o_.block_length, o_.gen_length));
  const auto p = static_cast<int64_t>(plen_);
  return static_cast<int>(block_causal_ ? pos / b - p / b : (pos - p) / b);
}

std::string LiveView::status(const StepEvent& ev, double seconds) const {
  const int done = ev.step + 1;
  // Threshold decoding and token editing decide as many tokens per step as the confidences allow: the
  // steps are not known in advance.
  const bool known = o_.threshold <= 0.0f && !o_.edit && done <= o_.steps;
  std::string s = "step " + std::to_string(done) + (known ? "/" + std::to_string(o_.steps) : "");
  const auto end =
      std::min<int64_t>(static_cast<int64_t>(ev.canvas.size()), static_cast<int64_t>(plen_) + o_.gen_length);
  int64_t decided = 0, masks = 0, first_mask = -1;
  for (auto i = static_cast<int64_t>(plen_); i < end; ++i) {
    if (ev.canvas[static_cast<size_t>(i)] != mask_) {
      ++decided;
    } else {
      if (first_mask < 0) first_mask = i;
      ++masks;
    }
  }
  const int blocks = end > static_cast<int64_t>(plen_) ? block_of(end - 1) + 1 : 0;
  if (blocks > 1) {
    const int64_t at = first_mask >= 0 ? first_mask : std::clamp<int64_t>(ev.committed, plen_, end - 1);
    s += " · block " + std::to_string(block_of(at) + 1) + "/" + std::to_string(blocks);
  }
  if (seconds > 0) s += " · " + number(static_cast<double>(decided) / seconds) + " tok/s";
  const double per_step = seconds / done;
  if (known)
    s += " · ETA " + duration(per_step * (o_.steps - done));
  else if (masks > 0 && decided > 0)
    s += " · ETA ~" + duration(per_step * static_cast<double>(masks) * done / static_cast<double>(decided));
  if (edits_ > 0) s += " · " + std::to_string(edits_) + " edits";
  return s;
}

LiveView::Frame LiveView::frame(const StepEvent& ev, int cols, int rows, double seconds) const {
  const int height = rows - 1;  // the cursor's row stays on screen below the frame
  if (height < 1) return {};
  const auto gen_end = static_cast<int64_t>(plen_) + o_.gen_length;
  const auto is_eos = [&](int32_t id) {
    return std::find(o_.eos_ids.begin(), o_.eos_ids.end(), id) != o_.eos_ids.end();
  };
  const auto style = [&](size_t i) {
    const bool edited = std::any_of(ev.edits.begin(), ev.edits.end(),
                                    [&](const TokenEdit& e) { return static_cast<size_t>(e.position) == i; });
    if (edited) return Style::Reverse;
    const auto at = static_cast<int64_t>(i);
    return at >= ev.committed && at < gen_end ? Style::Dim : Style::Plain;
  };
  const auto plain = [&](int32_t id) { return id != mask_ && !is_eos(id) && !t_.is_special(id); };
  Layout lay(cols);
  int focus = -1;  // the row of the first mask: where the text is being decided
  for (size_t i = plen_; i < ev.canvas.size();) {
    const int32_t id = ev.canvas[i];
    if (id == mask_) {
      if (focus < 0) focus = lay.row();
      lay.put("\xe2\x96\x91", 1, Style::Plain);  // ░
      ++i;
    } else if (!plain(id)) {
      lay.text(is_eos(id) ? "\xc2\xb7" : placeholder(t_.token_text(id)), Style::Dim);  // ·
      ++i;
    } else {
      // A run of ordinary tokens in one style, as one text: a character split over tokens stays whole.
      const Style st = style(i);
      std::string text;
      for (; i < ev.canvas.size() && plain(ev.canvas[i]) && style(i) == st; ++i)
        text += t_.token_text(ev.canvas[i]);
      lay.text(text, st);
    }
  }
  std::vector<std::string> body = lay.take();
  std::vector<std::string> shown;
  const int total = static_cast<int>(body.size()), room = height - 1;
  if (total <= room) {
    shown = std::move(body);
  } else if (room > 0) {
    const bool marker = room >= 2;
    const int n = marker ? room - 1 : room;
    if (focus < 0) focus = total - 1;
    const int start = std::clamp(focus - (n - 1) + n / 3, 0, total - n), below = total - start - n;
    if (marker) {
      const std::string m = start > 0 && below > 0
                                ? "… " + lines(start) + " above · " + std::to_string(below) + " below"
                            : start > 0 ? "… " + lines(start) + " above"
                                        : "… " + lines(below) + " below";
      shown.push_back(std::string(sgr(Style::Dim)) + fit(m, cols) + sgr(Style::Plain));
    }
    shown.insert(shown.end(), body.begin() + start, body.begin() + start + n);
  }
  Frame f;
  for (const std::string& r : shown) f.text += r + "\n";
  f.text += std::string(sgr(Style::Dim)) + fit(status(ev, seconds), cols) + sgr(Style::Plain) + "\n";
  f.rows = static_cast<int>(shown.size()) + 1;
  return f;
}

// Each row is erased where it is written, and the screen below the frame only from a row under it: an
// erase of the whole screen from its top-left corner would push the screen into the scrollback in
// terminals that keep cleared screens there (tmux's scroll-on-clear, VTE).
void LiveView::draw(const StepEvent& ev) {
  edits_ += ev.edits.size();
  int cols = 80, rows = 24;
  winsize w{};
  if (ioctl(fileno(f_), TIOCGWINSZ, &w) == 0 && w.ws_col > 0 && w.ws_row > 0) {
    cols = w.ws_col;
    rows = w.ws_row;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const Frame fr = frame(ev, cols, rows, seconds);
  if (fr.rows == 0) return clear();
  std::string out;
  if (rows_ > 0) out += "\x1b[" + std::to_string(rows_) + "F";
  for (size_t at = 0; at < fr.text.size();) {
    const size_t end = fr.text.find('\n', at);
    out += "\x1b[2K" + fr.text.substr(at, end + 1 - at);
    at = end + 1;
  }
  out += "\x1b[J";
  std::fwrite(out.data(), 1, out.size(), f_);
  std::fflush(f_);
  rows_ = fr.rows;
}

// Erases the frame's rows and the cursor's row under them (where the terminal echoed a ^C), line by
// line, and leaves the cursor at the frame's first row.
void LiveView::clear() {
  if (rows_ > 0) {
    std::string out = "\x1b[" + std::to_string(rows_) + "F";
    for (int i = 0; i < rows_; ++i) out += "\x1b[2K\x1b[1B";
    out += "\x1b[2K\x1b[" + std::to_string(rows_) + "A";
    std::fwrite(out.data(), 1, out.size(), f_);
    std::fflush(f_);
  }
  rows_ = 0;
}

}  // namespace tessera::cli
