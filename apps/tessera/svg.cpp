#include "apps/tessera/svg.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "core/error.h"

namespace tessera::cli::svg {
namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// "%.1f": coordinates.
std::string c1(double v) {
  return fixed(v, 1);
}

// The byte length of the valid UTF-8 character at s[i], or 0.
size_t utf8_char(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t cp = c & (0x7Fu >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (b & 0x3Fu);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF) return 0;
  return n;
}

}  // namespace

std::string escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '&':
          o += "&amp;";
          break;
        case '<':
          o += "&lt;";
          break;
        case '>':
          o += "&gt;";
          break;
        case '"':
          o += "&quot;";
          break;
        case '\'':
          o += "&apos;";
          break;
        default:
          o += c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? kReplacement : std::string(1, s[i]);
      }
      ++i;
      continue;
    }
    const size_t n = utf8_char(s, i);
    if (n == 0) {
      o += kReplacement;
      ++i;
    } else {
      o.append(s.substr(i, n));
      i += n;
    }
  }
  return o;
}

std::string visible(std::string_view s) {
  std::string o;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      o += "\\n";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c == '\r') {
      o += "\\r";
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else {
      o += ch;
    }
  }
  return o;
}

std::string fixed(double v, int decimals) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

double nice_step(double range, int n) {
  if (!(range > 0)) return 1;
  double unit = 1;
  while (unit * 10 <= range / n) unit *= 10;
  while (unit > range / n * 10 && unit > 1e-9) unit /= 10;
  for (double m : {1.0, 2.0, 5.0}) {
    if (unit * m >= range / n) return unit * m;
  }
  return unit * 10;
}

double byte_step(double range, int n) {
  double step = 1;
  while (step < range / n) step *= 2;
  return step;
}

double text_width(std::string_view s, double font_size) {
  double chars = 0;
  for (char c : s) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return chars * 0.62 * font_size;
}

std::vector<double> spread(const std::vector<double>& want, double h, double gap, double lo, double hi) {
  std::vector<size_t> idx(want.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return want[a] < want[b]; });
  std::vector<double> y(want.size());
  double prev = -1e300;
  for (size_t i : idx) {  // downwards: each at least h + gap below the one above
    y[i] = std::max({want[i], prev + h + gap, lo});
    prev = y[i];
  }
  double next = 1e300;
  for (auto it = idx.rbegin(); it != idx.rend(); ++it) {  // upwards: the last ones back inside [lo, hi]
    y[*it] = std::min({y[*it], next - h - gap, hi});
    next = y[*it];
  }
  return y;
}

// ---- Doc ------------------------------------------------------------------------------------------------

Doc::Doc(double width, double height) : w_(std::ceil(width)), h_(std::ceil(height)) {  // whole pixels
  o_ << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fixed(w_, 0) << "\" height=\"" << fixed(h_, 0)
     << "\" viewBox=\"0 0 " << fixed(w_, 0) << " " << fixed(h_, 0)
     << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}

void Doc::text(double x, double y, std::string_view s, std::string_view attrs) {
  o_ << "<text x=\"" << c1(x) << "\" y=\"" << c1(y) << "\"" << (attrs.empty() ? "" : " ") << attrs << ">"
     << escape(s) << "</text>\n";
}

void Doc::rect(double x, double y, double w, double h, std::string_view fill, std::string_view attrs,
               std::string_view title) {
  o_ << "<rect x=\"" << c1(x) << "\" y=\"" << c1(y) << "\" width=\"" << fixed(std::max(w, 0.0), 2)
     << "\" height=\"" << fixed(std::max(h, 0.0), 2) << "\" fill=\"" << fill << "\""
     << (attrs.empty() ? "" : " ") << attrs;
  if (title.empty()) {
    o_ << "/>\n";
  } else {
    o_ << "><title>" << escape(title) << "</title></rect>\n";
  }
}

void Doc::line(double x1, double y1, double x2, double y2, std::string_view stroke, std::string_view attrs) {
  o_ << "<line x1=\"" << c1(x1) << "\" y1=\"" << c1(y1) << "\" x2=\"" << c1(x2) << "\" y2=\"" << c1(y2)
     << "\" stroke=\"" << stroke << "\"" << (attrs.empty() ? "" : " ") << attrs << "/>\n";
}

double Doc::label(double x, double y, std::string_view s, std::string_view colour, double font_size) {
  const double w = text_width(s, font_size) + 8, h = font_size + 6;
  o_ << "<g class=\"label\"><rect x=\"" << c1(x) << "\" y=\"" << c1(y - h / 2) << "\" width=\"" << c1(w)
     << "\" height=\"" << c1(h) << "\" fill=\"white\" fill-opacity=\"0.92\" stroke=\"" << colour
     << "\" stroke-width=\"0.6\" rx=\"2\"/><text x=\"" << c1(x + 4) << "\" y=\"" << c1(y + font_size * 0.36)
     << "\" font-size=\"" << c1(font_size) << "\" fill=\"" << colour << "\">" << escape(s) << "</text></g>\n";
  return w;
}

Doc& Doc::operator<<(std::string_view raw) {
  o_ << raw;
  return *this;
}

std::string Doc::str() const {
  return o_.str() + "</svg>\n";
}

void Doc::save(const std::string& path, const std::string& flag) const {
  svg::save(path, flag, str());
}

void save(const std::string& path, const std::string& flag, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f || !(f << text) || !f.flush()) fail(flag + ": cannot write " + path);
}

CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        namespace fs = std::filesystem;
        if (v.empty()) return "an empty file name";
        std::error_code ec;
        const fs::path p(v);
        if (fs::is_directory(p, ec)) return v + " is a directory";
        const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
        if (!fs::is_directory(dir, ec))
          return "cannot write " + v + ": the directory " + dir.string() + " does not exist";
        if (access(dir.c_str(), W_OK) != 0 || (fs::exists(p, ec) && access(p.c_str(), W_OK) != 0))
          return "cannot write " + v + ": permission denied";
        return std::string();
      },
      "FILE", "writable file");
}

// ---- bar chart ---------------------------------------------------------------------------------------

std::string bar_chart(const std::string& title, const std::string& subtitle,
                      const std::vector<std::string>& rows, const std::vector<Metric>& metrics,
                      const std::vector<std::string>& notes) {
  const double fs = 12, row_h = 24, bar_h = 14, pw = 250, gap = 40, top = 112;
  double lw = 60;
  for (const auto& r : rows) lw = std::max(lw, text_width(r, fs) + 12);
  lw = std::min(lw, 300.0);
  const double left = 20 + lw;
  const double axis_y = top + static_cast<double>(rows.size()) * row_h + 6;
  const double notes_y = axis_y + 46;
  double width = left + static_cast<double>(metrics.size()) * (pw + gap) + 10;
  for (const auto& n : notes) width = std::max(width, 40 + text_width(n, 11));
  width = std::max(width, 40 + text_width(title, 16));
  const double height = notes_y + static_cast<double>(notes.size()) * 16 + 12;
  Doc d(width, height);
  d.text(20, 30, title, "font-size=\"16\" font-weight=\"bold\"");
  d.text(20, 52, subtitle, "fill=\"#404040\"");
  // Row labels (cut to the column, the whole label as the hover title).
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string shown = rows[i];
    while (text_width(shown, fs) + 12 > lw && shown.size() > 4) {
      shown.pop_back();
      while (!shown.empty() && (static_cast<unsigned char>(shown.back()) & 0xC0) == 0x80) shown.pop_back();
      if (!shown.empty() && static_cast<unsigned char>(shown.back()) >= 0xC0) shown.pop_back();
    }
    if (shown != rows[i]) shown += "\xE2\x80\xA6";  // ...
    const double y = top + static_cast<double>(i) * row_h + row_h / 2;
    d << "<text x=\"" << c1(left - 8) << "\" y=\"" << c1(y + 4) << "\" text-anchor=\"end\"><title>"
      << escape(rows[i]) << "</title>" << escape(shown) << "</text>\n";
  }
  for (size_t k = 0; k < metrics.size(); ++k) {
    const Metric& m = metrics[k];
    const double x0 = left + static_cast<double>(k) * (pw + gap), bar_w = pw - 70;
    double vmax = 0;
    for (double v : m.values)
      if (std::isfinite(v)) vmax = std::max(vmax, v);
    if (vmax <= 0) vmax = 1;
    const double step = nice_step(vmax, 4), amax = std::ceil(vmax / step - 1e-9) * step;
    const auto X = [&](double v) { return x0 + std::clamp(v, 0.0, amax) / amax * bar_w; };
    d.text(x0, 82, m.name, "font-size=\"13\" font-weight=\"bold\"");
    d.text(x0, 98, m.higher_is_better ? "higher is better" : "lower is better",
           "font-size=\"11\" fill=\"#707070\"");
    for (double t = 0; t <= amax + step / 2; t += step) {
      d.line(X(t), top, X(t), axis_y, "#e4e4e4");
      d.line(X(t), axis_y, X(t), axis_y + 4, "black");
      d.text(X(t), axis_y + 17, fixed(t, step < 1 ? (step < 0.1 ? 2 : 1) : 0),
             "text-anchor=\"middle\" font-size=\"11\"");
    }
    d.line(x0, axis_y, x0 + bar_w, axis_y, "black");
    for (size_t i = 0; i < rows.size(); ++i) {
      const double v = i < m.values.size() ? m.values[i] : NAN;
      const double y = top + static_cast<double>(i) * row_h + (row_h - bar_h) / 2;
      const std::string value = std::isfinite(v) ? fixed(v, m.decimals) : "n/a";
      d.rect(x0, y, std::isfinite(v) ? X(v) - x0 : 0, bar_h, i == 0 ? "#9aa5b1" : "#4e79a7", "class=\"bar\"",
             rows[i] + ": " + m.name + " " + value);
      d.text((std::isfinite(v) ? X(v) : x0) + 4, y + bar_h - 3, value, "font-size=\"11\"");
    }
  }
  for (size_t i = 0; i < notes.size(); ++i)
    d.text(20, notes_y + static_cast<double>(i) * 16, notes[i], "font-size=\"11\" fill=\"#404040\"");
  return d.str();
}

// ---- decoding order ----------------------------------------------------------------------------------

std::string order_chart(const std::string& title, const GenerateResult& r, int64_t prompt_len, int gen_length,
                        int block_length, const std::function<std::string(int32_t)>& text) {
  const int G = std::max(gen_length, 1), S = r.steps_run;
  const double cw = std::clamp(1100.0 / G, 2.0, 22.0), ch = std::clamp(620.0 / std::max(S, 1), 2.0, 16.0);
  const double left = 110, top = 104, gw = cw * G, gh = ch * S;
  const std::vector<std::pair<const char*, std::string>> legend = {
      {"#1f5fa8", "decided at this step"},
      {"#f08c00", "edited (token editing rewrote it)"},
      {"#c9dbef", "decided earlier"},
      {"#f0f0f0", "still masked"}};
  const std::string block_text = "block boundary (block " + std::to_string(block_length) + ")";
  double legend_w = 20 + 8 + text_width(block_text, 12) + 20;
  for (const auto& l : legend) legend_w += 34 + text_width(l.second, 12);
  const double width = std::max({left + gw + 40, legend_w, 40 + text_width(title, 16)});
  const double height = top + gh + 110;
  // Per step and position: 1 decided, 2 rewritten (an edit); the step each position was first decided.
  std::vector<int> first(static_cast<size_t>(G), -1);
  std::vector<std::map<int, int>> event(static_cast<size_t>(std::max(S, 0)));
  for (int t = 0; t < S && t < static_cast<int>(r.order.size()); ++t) {
    for (int32_t pos : r.order[static_cast<size_t>(t)]) {
      const int64_t p = pos - prompt_len;
      if (p < 0 || p >= G) continue;
      auto& f = first[static_cast<size_t>(p)];
      event[static_cast<size_t>(t)][static_cast<int>(p)] = f < 0 ? 1 : 2;
      if (f < 0) f = t;
    }
  }
  // The token each decision wrote: the first rewrite's "from", else the final token.
  std::map<std::pair<int, int>, const TokenEdit*> edit_at;
  std::vector<int32_t> decided_token(static_cast<size_t>(G), -1);
  for (const TokenEdit& e : r.edits) {
    const int64_t p = e.position - prompt_len;
    if (p < 0 || p >= G) continue;
    edit_at[{e.step, static_cast<int>(p)}] = &e;
    if (decided_token[static_cast<size_t>(p)] < 0) decided_token[static_cast<size_t>(p)] = e.from;
  }
  for (int p = 0; p < G; ++p) {
    if (decided_token[static_cast<size_t>(p)] < 0 && p < static_cast<int>(r.tokens.size()))
      decided_token[static_cast<size_t>(p)] = r.tokens[static_cast<size_t>(p)];
  }
  const auto tok = [&](int32_t id) {
    return id < 0 ? std::string("(after the answer's end)") : visible(text(id));
  };

  Doc d(width, height);
  d.text(20, 28, title, "font-size=\"16\" font-weight=\"bold\"");
  int decided = 0;
  for (int p = 0; p < G; ++p) decided += first[static_cast<size_t>(p)] >= 0 ? 1 : 0;
  d.text(20, 50,
         std::to_string(decided) + " of " + std::to_string(gen_length) + " positions decided in " +
             std::to_string(S) + " steps, " + std::to_string(r.edits.size()) + " edits; the answer: " +
             std::to_string(r.tokens.size()) + " tokens. A column is a generated position, a row a step",
         "fill=\"#404040\"");
  // Cells.
  d << "<g stroke=\"white\" stroke-width=\"" << (cw >= 6 && ch >= 6 ? "0.5" : "0") << "\">\n";
  for (int t = 0; t < S; ++t) {
    for (int p = 0; p < G; ++p) {
      const double x = left + p * cw, y = top + t * ch;
      const auto it = event[static_cast<size_t>(t)].find(p);
      const int f = first[static_cast<size_t>(p)];
      const std::string where = "position " + std::to_string(p) + " (canvas " +
                                std::to_string(prompt_len + p) + "), step " + std::to_string(t) + ": ";
      if (it != event[static_cast<size_t>(t)].end() && it->second == 1) {
        d.rect(x, y, cw, ch, "#1f5fa8", "class=\"cell decided\"",
               where + "decided \"" + tok(decided_token[static_cast<size_t>(p)]) + "\"");
      } else if (it != event[static_cast<size_t>(t)].end()) {
        const auto e = edit_at.find({t, p});
        d.rect(x, y, cw, ch, "#f08c00", "class=\"cell edit\" stroke=\"#7a3b00\" stroke-width=\"0.8\"",
               where + (e != edit_at.end()
                            ? "edited \"" + tok(e->second->from) + "\" -> \"" + tok(e->second->to) + "\""
                            : std::string("rewritten")));
      } else if (f >= 0 && f < t) {
        d.rect(x, y, cw, ch, "#c9dbef", "class=\"cell kept\"");
      } else {
        d.rect(x, y, cw, ch, "#f0f0f0", "class=\"cell masked\"");
      }
    }
  }
  d << "</g>\n";
  // The prompt before column 0, block boundaries, axes.
  d.rect(left - 30, top, 24, gh, "#d9d9d9", "class=\"prompt\"",
         "the prompt: " + std::to_string(prompt_len) + " tokens before the generated positions");
  d << "<text transform=\"translate(" << c1(left - 13) << " " << c1(top + gh / 2)
    << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"11\">"
    << escape("prompt: " + std::to_string(prompt_len) + " tokens") << "</text>\n";
  if (block_length > 0 && block_length < G) {
    for (int b = block_length; b < G; b += block_length)
      d.line(left + b * cw, top - 6, left + b * cw, top + gh, "#202020",
             "class=\"block\" stroke-width=\"1.2\" stroke-dasharray=\"5 3\"");
  }
  if (block_length > 0) {
    for (int b = 0, i = 1; b < G; b += block_length, ++i) {
      const double bw = std::min(block_length, G - b) * cw;
      const std::string name = "block " + std::to_string(i);
      if (text_width(name, 11) + 4 < bw)
        d.text(left + b * cw + bw / 2, top - 10, name, "text-anchor=\"middle\" font-size=\"11\"");
    }
  }
  const double xs = nice_step(G, 10);
  for (double p = 0; p < G; p += xs) {
    d.line(left + (p + 0.5) * cw, top + gh, left + (p + 0.5) * cw, top + gh + 4, "black");
    d.text(left + (p + 0.5) * cw, top + gh + 17, fixed(p, 0), "text-anchor=\"middle\" font-size=\"11\"");
  }
  d.text(left + gw / 2, top + gh + 36,
         "generated position (canvas position - " + std::to_string(prompt_len) + ")",
         "text-anchor=\"middle\"");
  const double ys = nice_step(std::max(S, 1), 8);
  for (double t = 0; t < S; t += ys) {
    d.line(left - 36, top + (t + 0.5) * ch, left - 32, top + (t + 0.5) * ch, "black");
    d.text(left - 40, top + (t + 0.5) * ch + 4, fixed(t, 0), "text-anchor=\"end\" font-size=\"11\"");
  }
  d << "<text transform=\"translate(28 " << c1(top + gh / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">step</text>\n";
  // Legend.
  double lx = 20;
  const double ly = top + gh + 62;
  for (const auto& [fill, name] : legend) {
    d.rect(lx, ly - 10, 14, 12, fill);
    d.text(lx + 20, ly, name);
    lx += 34 + text_width(name, 12);
  }
  d.line(lx, ly - 12, lx, ly + 2, "#202020", "stroke-width=\"1.2\" stroke-dasharray=\"5 3\"");
  d.text(lx + 8, ly, block_text);
  d.text(20, ly + 24, "hover a cell for its token", "font-size=\"11\" fill=\"#707070\"");
  return d.str();
}

}  // namespace tessera::cli::svg
