// The live canvas view of generate and chat on a terminal.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "decode/generate.h"
#include "io/tokenizer.h"

namespace tessera::cli {

// Redraws the canvas in place below the cursor: the cursor goes back over the previous frame's rows,
// then the new frame is written in one call (no flicker). A frame is never taller than the terminal
// less one row (the size is read again every frame), so the cursor can always get back to its top and
// nothing reaches the scrollback: a canvas taller than that shows the rows around the first mask (the
// text being decided) under a "… N lines above" line. The generated part only: the committed text
// plain; after it, the provisional tokens dimmed (with token editing they may still change) and the
// masks as shaded blocks; the tokens this step rewrote in reverse video; EOS as a dim "·" and other
// special tokens as a dim ⟨name⟩. The text is laid out here, cell by cell (utf8proc's widths; invalid
// UTF-8 as U+FFFD, control characters dropped, newlines kept), so the row count is exact. The last row:
// `step 27/64 · block 2/4 · 35 tok/s · ETA 1.2 s`; with threshold decoding or token editing the steps
// are not known in advance: `step 27 · ... · ETA ~1.2 s`, estimated from the masks left.
class LiveView {
 public:
  LiveView(FILE* f, const Tokenizer& t, const GenerateOptions& o, size_t prompt_len, int32_t mask,
           bool block_causal);
  void draw(const StepEvent& ev);
  // Erases the last frame (the cursor ends where the first frame began).
  void clear();
  // The frame for a terminal of cols x rows, `seconds` after the generation began (what draw writes
  // after its cursor movement), and its height in rows.
  struct Frame {
    std::string text;
    int rows = 0;
  };
  Frame frame(const StepEvent& ev, int cols, int rows, double seconds) const;

 private:
  std::string status(const StepEvent& ev, double seconds) const;
  int block_of(int64_t pos) const;
  FILE* f_;
  const Tokenizer& t_;
  GenerateOptions o_;
  size_t plen_;
  int32_t mask_;
  bool block_causal_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  int rows_ = 0;      // height of the frame on screen
  size_t edits_ = 0;  // tokens rewritten so far
};

}  // namespace tessera::cli
