// SVG pictures of the CLI: a small document writer (XML-escaped text, a viewBox, labels in boxes that
// a collision rule keeps apart), axis ticks, the horizontal bar charts of bench / eval --svg and the
// decoding-order grid of generate --order-svg. Every picture is one self-contained file: no script, no
// external font or stylesheet; a <title> on a shape is its hover text.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "decode/generate.h"

namespace tessera::cli::svg {

// Text for XML character data and attribute values: & < > " ' escaped, invalid UTF-8 and the control
// characters XML 1.0 forbids replaced by U+FFFD.
std::string escape(std::string_view s);
// Text shown in a tooltip or label: newlines, tabs and other control characters as \n, \t, \xNN.
std::string visible(std::string_view s);
// printf("%.*f").
std::string fixed(double v, int decimals);
// A tick step of 1, 2 or 5 times a power of ten giving about n ticks over [0, range].
double nice_step(double range, int n);
// A power-of-two tick step giving about n ticks over [0, range] (bytes).
double byte_step(double range, int n);
// The width of `s` in a sans-serif font of `font_size` px, estimated generously (0.62 em per character).
double text_width(std::string_view s, double font_size);
// Centres, in the order of `want`, as close to `want` as the collision rule allows: `want` is sorted by
// the caller's order of drawing, labels of height h keep at least h + gap apart and stay within [lo, hi].
std::vector<double> spread(const std::vector<double>& want, double h, double gap, double lo, double hi);

// An SVG document built in memory: fixed-size canvas, viewBox, white background, sans-serif.
class Doc {
 public:
  Doc(double width, double height);
  double width() const { return w_; }
  double height() const { return h_; }
  // `attrs` is raw attribute text (trusted, written by the caller); `s` and `title` are escaped.
  void text(double x, double y, std::string_view s, std::string_view attrs = "");
  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view attrs = "",
            std::string_view title = "");
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, std::string_view attrs = "");
  // A label: text in a white box (class "label"; the box is what the collision rule keeps apart),
  // vertically centred on y, starting at x; returns the box's width.
  double label(double x, double y, std::string_view s, std::string_view colour, double font_size = 12);
  // Raw markup (trusted).
  Doc& operator<<(std::string_view raw);
  std::string str() const;  // the document, closed
  // Writes the document to `path` (`flag` names the option in the error when it cannot be written).
  void save(const std::string& path, const std::string& flag) const;

 private:
  double w_, h_;
  std::ostringstream o_;
};

// Writes `text` to `path` (`flag` names the option in the error when it cannot be written).
void save(const std::string& path, const std::string& flag, const std::string& text);
// A CLI check of an output file (--svg, --json-out): its directory exists and can be written, and it is
// not a directory; at parse time, so a long run does not end on a path that cannot be written.
CLI::Validator writable_file();

// One metric of a bar chart: a value per row (NaN: no value).
struct Metric {
  std::string name;  // panel heading, e.g. "tokens/s"
  std::vector<double> values;
  int decimals = 2;
  bool higher_is_better = true;  // said under the heading ("higher is better")
};
// Horizontal bars, one panel per metric side by side, one row per option (the first row is the
// reference and drawn grey); `notes` are lines under the chart (what the metrics mean).
std::string bar_chart(const std::string& title, const std::string& subtitle,
                      const std::vector<std::string>& rows, const std::vector<Metric>& metrics,
                      const std::vector<std::string>& notes);

// The decoding order of one generation: a position x step grid (columns: the gen_length generated
// positions; rows: the steps run), a cell coloured when its position was decided at that step, edits
// (token editing rewrites) marked apart, the prompt and the block boundaries marked; each decided or
// edited cell's hover title names its token (`text` decodes one token id).
std::string order_chart(const std::string& title, const GenerateResult& r, int64_t prompt_len, int gen_length,
                        int block_length, const std::function<std::string(int32_t)>& text);

}  // namespace tessera::cli::svg
