#include "apps/tessera/canvas_event.h"

#include <algorithm>
#include <vector>

namespace tessera::cli {

nlohmann::json canvas_event_json(const StepEvent& ev, const Tokenizer& t, size_t prompt_len, int32_t mask,
                                 std::span<const int32_t> eos_ids) {
  using json = nlohmann::json;
  const auto P = static_cast<int>(prompt_len);
  std::vector<int32_t> committed;
  bool ended = false;  // the committed run holds an EOS: the answer ends there
  for (int i = P; i < ev.committed; ++i) {
    const int32_t tok = ev.canvas[static_cast<size_t>(i)];
    if (std::find(eos_ids.begin(), eos_ids.end(), tok) != eos_ids.end()) {
      ended = true;
      break;
    }
    committed.push_back(tok);
  }
  json provisional = json::array();
  for (size_t i = static_cast<size_t>(std::max(P, ev.committed)); i < ev.canvas.size(); ++i) {
    const int32_t tok = ev.canvas[i];
    provisional.push_back(
        tok == mask
            ? json{{"position", static_cast<int>(i) - P}, {"token", nullptr}}
            : json{{"position", static_cast<int>(i) - P}, {"token", tok}, {"text", t.token_text(tok)}});
  }
  json changed = json::array();
  for (int32_t p : ev.newly_decided_positions) changed.push_back(p - P);
  json edits = json::array();
  for (const TokenEdit& e : ev.edits)
    edits.push_back({{"position", e.position - P},
                     {"step", e.step},
                     {"old", e.from},
                     {"new", e.to},
                     {"old_text", t.token_text(e.from)},
                     {"new_text", t.token_text(e.to)}});
  return {{"step", ev.step},
          {"committed", t.decode(committed, true)},
          {"committed_tokens", committed.size()},
          {"ended", ended},
          {"provisional", provisional},
          {"changed", changed},
          {"edits", edits}};
}

}  // namespace tessera::cli
